//! One block decoded: the single entry point of every reader of decoded
//! values (a frame, a block, the whole array, the stored codes, full
//! validation), for every codec and dtype.
//!
//! The block's streams are decoded frame-major by lane groups (see
//! [`frame_major`]) in *parts*: whole 8-row bands of the detector, about
//! [`PART_PIXELS`] pixels each, decoded in parallel a slab of frames at a
//! time. Values that need no conversion (u16 counts, codes, float lanes,
//! which are already the little-endian float32 bits) are written straight
//! into the output: each part into its columns of every output frame.
//! Others go through a slab that, while in cache, is converted into the
//! output rows (u8 narrowing, the scaled codec's calibration). Either way,
//! for the integer codec, the decoded rows are summed into 8×8 tiles for
//! the block's spatial index check, once per block (see
//! `QemFile::block_index`). A caller that decodes many blocks at once asks
//! for one part per block instead.
//!
//! The kernels prove valid streams valid and nothing else: when a part
//! refuses (some stream does not decode cleanly, or a uint8 count exceeds
//! 255), the block is decoded again stream by stream by the reference
//! path, which names the fault.

use std::ops::Range;

use rayon::prelude::*;

use super::error::{QemError, Result, StreamSite};
use super::file::{block_streams, QemFile};
use super::frame_major::{Cursor, Refused, Rows, SLAB};
use super::header::{Codec, Dtype};
use super::lanes::{Group, Kernel, LANES};
use super::layout::BlockInfo;
use super::spatial::{self, FrameSums};
use super::stream::StreamTable;

/// What a block decode produces.
pub(crate) enum Output<'a> {
    /// The requested frames as dense bytes of the decoded dtype.
    Values(&'a mut [u8]),
    /// The requested frames' stored u16 values, little-endian (integer
    /// and scaled codecs).
    Codes(&'a mut [u8]),
    /// Nothing: every stream decoded (and the index checked) only.
    Check,
    /// Every slab of decoded frames handed, while in cache, to a visitor:
    /// the detector rows of its part, its first block frame and its stored
    /// u16 values (frame-major, the part's pixels of each frame in order).
    /// Parts call it from several threads at once.
    Visit(&'a Visitor<'a>),
}

/// What [`Output::Visit`] calls.
pub(crate) type Visitor<'a> = dyn Fn(Range<usize>, usize, &[u16]) + Sync + 'a;

/// Pixels per part, about: 32 frames of 4096 u16 values are a 256 KiB
/// slab, which stays in a core's L2 cache while it is converted and summed,
/// and a 128×128 detector is 4 parts. (Parts of 1024 pixels spread better
/// but cost more: a sequential `data.npy` read through the mount took
/// 0.64 s of daemon CPU with them, 0.59–0.61 s with these, when parts
/// still went through a slab.)
const PART_PIXELS: usize = 4096;

/// How the decoded u16 stream values of one frame become output bytes.
#[derive(Clone, Copy)]
enum Convert {
    /// The values' little-endian bytes as they are: uint16 counts, codes,
    /// and float lanes `2p, 2p + 1` (the low and high halves of pixel
    /// `p`'s bits, so the pair is its little-endian float32).
    Copy,
    /// uint8 counts (checked to be at most 255).
    Narrow,
    /// Scaled codes to calibrated float32: `code * scale + offset`.
    Calibrate { scale: f64, offset: f64 },
    /// No output.
    Skip,
}

impl Convert {
    fn row(self, values: &[u16], out: &mut [u8]) {
        match self {
            Convert::Copy => out.copy_from_slice(bytemuck::cast_slice(values)),
            Convert::Narrow => {
                for (d, &v) in out.iter_mut().zip(values) {
                    *d = u16::from_le(v) as u8;
                }
            }
            Convert::Calibrate { scale, offset } => {
                for (d, &v) in out.chunks_exact_mut(4).zip(values) {
                    let v = (f64::from(u16::from_le(v)) * scale + offset) as f32;
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
            Convert::Skip => {}
        }
    }
}

/// The u16 values of decoded little-endian rows (the slabs are u16
/// buffers, so the cast does not copy).
fn values(rows: &[u8]) -> std::borrow::Cow<'_, [u16]> {
    match bytemuck::try_cast_slice(rows) {
        Ok(v) => std::borrow::Cow::Borrowed(v),
        Err(_) => rows
            .chunks_exact(2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            .collect(),
    }
}

/// Decoded bytes of one window: a block that decodes to more is decoded
/// (by every reader: validation, hashes, conversion, the mount) a window
/// of frames at a time, so that memory follows this constant and not the
/// detector size a file declares. An ordinary block is one window.
pub const WINDOW_BYTES: usize = 64 << 20;

impl Output<'_> {
    /// The part of a dense output holding rows `rows` (`row_bytes` each).
    fn rows(&mut self, rows: Range<usize>, row_bytes: usize) -> Output<'_> {
        let span = rows.start * row_bytes..rows.end * row_bytes;
        match self {
            Output::Values(out) => Output::Values(&mut out[span]),
            Output::Codes(out) => Output::Codes(&mut out[span]),
            Output::Check => Output::Check,
            Output::Visit(visit) => Output::Visit(*visit),
        }
    }

    fn len(&self) -> Option<usize> {
        match self {
            Output::Values(out) | Output::Codes(out) => Some(out.len()),
            Output::Check | Output::Visit(_) => None,
        }
    }
}

/// Frames a [`BlockCursor::skip`] decodes at a time. The index check keeps
/// the 8×8 tile sums of every frame a step decodes until the step ends, 4
/// bytes a tile: skipping 448 frames of a 2048×2040 detector in one step
/// held 117 MiB of them, where a reader of one window wanted 64 MiB.
const SKIP_STEP: usize = 32;

/// A block being decoded window by window: each part's lane states and
/// byte positions where the last window ended, and the spatial index
/// compared window by window. Its verdict is remembered as soon as it is
/// known: at the first window that disagrees (windows come in frame order,
/// and the error named is the earliest frame's, so no later window can
/// change it), else when the last frame is reached. Made by
/// [`QemFile::block_cursor`]; every call is handed the file the cursor was
/// made from.
pub struct BlockCursor {
    info: BlockInfo,
    /// Detector rows of each part (whole 8-row bands).
    parts: Vec<Range<usize>>,
    /// Per part: its streams' cursor (`None` once served by the reference
    /// decoder).
    cursors: Vec<Option<Cursor>>,
    /// Per part: its 8×8 tile summer, while the index is being checked
    /// (dropped once its verdict is remembered).
    sums: Vec<Option<FrameSums>>,
    kernel: Kernel,
    next: usize,
    /// The kernels refused streams that the reference decoder accepts:
    /// every later window comes from the reference decoder.
    reference: bool,
}

impl BlockCursor {
    /// The block's global index.
    pub fn block(&self) -> usize {
        self.info.index
    }

    /// The next block frame to decode.
    pub fn next_frame(&self) -> usize {
        self.next
    }

    /// Frames of the block.
    pub fn frames(&self) -> usize {
        self.info.frames
    }

    /// Heap bytes this cursor holds: its streams' lane states and the
    /// index summers' masks, about 18 bytes a detector pixel (84 MB for a
    /// 2048×2040 detector). A budget that keeps cursors is charged this.
    pub fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let cursors: usize = self.cursors.iter().flatten().map(Cursor::heap_bytes).sum();
        let sums: usize = self.sums.iter().flatten().map(FrameSums::heap_bytes).sum();
        self.parts.capacity() * size_of::<Range<usize>>()
            + self.cursors.capacity() * size_of::<Option<Cursor>>()
            + self.sums.capacity() * size_of::<Option<FrameSums>>()
            + cursors
            + sums
    }

    /// Decodes the next `n` frames into `out` (dense bytes of the decoded
    /// dtype, `n * frame_bytes()` long).
    pub fn read(&mut self, file: &QemFile, n: usize, out: &mut [u8]) -> Result<()> {
        let t = self.next;
        self.advance(file, n, t..t + n, Output::Values(out))
    }

    /// Decodes the next `n` frames as stored u16 values, little-endian
    /// (integer and scaled codecs; `2 * n * pixels()` bytes).
    pub fn read_codes_le(&mut self, file: &QemFile, n: usize, out: &mut [u8]) -> Result<()> {
        let t = self.next;
        self.advance(file, n, t..t + n, Output::Codes(out))
    }

    /// Decodes the next `n` frames without output (the index check and
    /// the streams' checks still run), a few frames at a time (`SKIP_STEP`).
    pub fn skip(&mut self, file: &QemFile, n: usize) -> Result<()> {
        let mut left = n;
        loop {
            let (t, k) = (self.next, left.min(SKIP_STEP));
            self.advance(file, k, t..t, Output::Check)?;
            left -= k;
            if left == 0 {
                return Ok(());
            }
        }
    }

    /// Decodes the next `n` frames, writing frames `out_frames` (within
    /// them) to `output`. Reaching the block's last frame checks that
    /// every stream ended exactly and remembers the index verdict.
    pub(crate) fn advance(
        &mut self,
        file: &QemFile,
        n: usize,
        out_frames: Range<usize>,
        mut output: Output<'_>,
    ) -> Result<()> {
        let m = self.info.frames;
        let end = self.next.checked_add(n).filter(|&e| e <= m);
        let Some(end) = end else {
            return Err(QemError::OutOfRange {
                what: "block frame",
                index: self.next.saturating_add(n),
                limit: m,
            });
        };
        if out_frames.start < self.next || out_frames.end > end || out_frames.start > out_frames.end
        {
            return Err(QemError::OutOfRange {
                what: "window frame",
                index: out_frames.end,
                limit: end,
            });
        }
        let (_, e) = file.convert_of(&self.info, &output)?;
        let want = out_frames.len() * file.pixels() * e;
        if output.len().is_some_and(|len| len != want) {
            return Err(QemError::OutOfRange {
                what: "block output",
                index: output.len().unwrap_or(0),
                limit: want,
            });
        }
        if self.parts.is_empty() || n == 0 {
            self.next = end;
            return Ok(());
        }
        let table = file.stream_table(self.info.chunk)?;
        if !self.run(file, &table, end, &out_frames, &mut output)? {
            // Some stream does not decode cleanly, or a uint8 count
            // exceeds 255: the reference path names the first fault.
            if let Some(fault) = file.reference_fault(&self.info, &self.parts, &table) {
                return Err(fault);
            }
            // Reached only where the kernels refuse what the reference
            // accepts (a payload beyond their 2 GiB reach): served from the
            // reference's values from now on.
            self.reference = true;
            self.cursors.iter_mut().for_each(|c| *c = None);
            if !self.run(file, &table, end, &out_frames, &mut output)? {
                return Err(QemError::layout(
                    Some(self.info.chunk),
                    "a block the reference decoder accepts could not be decoded",
                ));
            }
        }
        Ok(())
    }

    /// One attempt at frames `next..end`: `false` when some part refused.
    fn run(
        &mut self,
        file: &QemFile,
        table: &StreamTable<'_>,
        end: usize,
        out_frames: &Range<usize>,
        output: &mut Output<'_>,
    ) -> Result<bool> {
        let info = self.info;
        let (t_start, n) = (self.next, end - self.next);
        let p = file.pixels();
        let [_, _, _, c] = file.shape();
        let stored_u8 = file.stored_dtype() == Dtype::U8;
        let (convert, e) = file.convert_of(&info, output)?;
        let (first, count) = block_streams(file.codec(), p, info.block_in_chunk);
        let spp = count / p;
        let row_bytes = p * e;
        let kernel = self.kernel;
        let reference = self.reference;
        let m = info.frames;
        // Whole u16 rows with nothing to convert go straight to the output:
        // one part into whole rows, several each into its columns of them.
        let direct =
            !reference && matches!(convert, Convert::Copy) && *out_frames == (t_start..end);
        let visit = match output {
            Output::Visit(visit) => Some(*visit),
            _ => None,
        };
        let mut segments: Vec<Vec<&mut [u8]>> = self.parts.iter().map(|_| Vec::new()).collect();
        let mut whole: Option<&mut [u8]> = None;
        if let Output::Values(out) | Output::Codes(out) = output {
            if direct && self.parts.len() == 1 {
                whole = Some(&mut **out);
            } else {
                for row in out.chunks_exact_mut(row_bytes) {
                    let mut rest = row;
                    for (part, segs) in self.parts.iter().zip(&mut segments) {
                        let (head, tail) = rest.split_at_mut(part.len() * c * e);
                        segs.push(head);
                        rest = tail;
                    }
                }
            }
        }
        // One part: its 8×8 tile sums of frames `next..end` (frame-major)
        // when it decoded cleanly, else `None`. Into `whole` (every row of
        // the window) or into `segs` (its columns of each output row),
        // straight when `direct`, else through a slab.
        let decode_part = |rows: &Range<usize>,
                           cursor: &mut Option<Cursor>,
                           sums: &mut Option<FrameSums>,
                           whole: Option<&mut [u8]>,
                           segs: Vec<&mut [u8]>|
         -> Option<Vec<u32>> {
            // Written in place, or filled by `on_slab` from the slab.
            let (frames, mut segs) = if direct && whole.is_none() && !segs.is_empty() {
                (Some(segs), Vec::new())
            } else {
                (None, segs)
            };
            let (p0, w) = (rows.start * c, rows.len() * c);
            let part = rows.clone();
            let ws = spp * w;
            let tiles = sums.as_ref().map_or(0, FrameSums::tiles);
            let mut tile_sums = vec![0u32; tiles * n];
            let mut in_range = true;
            let mut on_slab = |t0: usize, rows: &[u8]| {
                let vals = values(rows);
                if stored_u8 {
                    in_range &= vals.iter().all(|&v| u16::from_le(v) <= 255);
                }
                if let Some(sums) = sums.as_mut() {
                    sums.add(&vals, t0 - t_start, &mut tile_sums);
                }
                if let Some(visit) = visit {
                    visit(part.clone(), t0, &vals);
                }
                for (k, src) in vals.chunks_exact(ws).enumerate() {
                    let seg = (t0 + k)
                        .checked_sub(out_frames.start)
                        .and_then(|i| segs.get_mut(i));
                    if let Some(seg) = seg {
                        convert.row(src, seg);
                    }
                }
            };
            let s0 = first + spp * p0;
            let done = match (cursor.as_mut(), whole, frames) {
                (Some(cursor), Some(out), _) => {
                    cursor.advance(table, kernel, n, Rows::Whole(out), on_slab)
                }
                (Some(cursor), None, Some(frames)) => {
                    cursor.advance(table, kernel, n, Rows::Frames(frames), on_slab)
                }
                (Some(cursor), None, None) => {
                    let mut slab = vec![0u16; ws * SLAB.min(n)];
                    let rows = Rows::Slab(bytemuck::cast_slice_mut(&mut slab));
                    cursor.advance(table, kernel, n, rows, on_slab)
                }
                // The reference decoder: the part's whole columns, handed
                // on a slab at a time.
                (None, ..) => {
                    let mut cols = vec![0u16; ws * m];
                    let decoded = table.decode_range(s0, m, &mut cols);
                    let mut slab = vec![0u16; ws * SLAB.min(n)];
                    for t0 in (t_start..end).step_by(SLAB) {
                        let k = SLAB.min(end - t0);
                        for (i, row) in slab.chunks_exact_mut(ws).take(k).enumerate() {
                            for (j, v) in row.iter_mut().enumerate() {
                                *v = cols[j * m + t0 + i].to_le();
                            }
                        }
                        on_slab(t0, bytemuck::cast_slice(&slab[..k * ws]));
                    }
                    decoded.map_err(|_| Refused)
                }
            };
            let clean = end < m || cursor.as_ref().is_none_or(|c| c.finish().is_ok());
            (done.is_ok() && in_range && clean).then_some(tile_sums)
        };
        let decoded: Vec<Option<Vec<u32>>> = if self.parts.len() == 1 {
            let segs = segments.pop().unwrap_or_default();
            vec![decode_part(
                &self.parts[0],
                &mut self.cursors[0],
                &mut self.sums[0],
                whole,
                segs,
            )]
        } else {
            self.parts
                .par_iter()
                .zip(self.cursors.par_iter_mut())
                .zip(self.sums.par_iter_mut())
                .zip(segments.into_par_iter())
                .map(|(((rows, cursor), sums), segs)| decode_part(rows, cursor, sums, None, segs))
                .collect()
        };
        if !decoded.iter().all(Option::is_some) {
            return Ok(false);
        }
        if self.sums.iter().any(Option::is_some) {
            let tiles: Vec<Vec<u32>> = decoded.into_iter().flatten().collect();
            let verdict = match self.compare_index(file, &tiles, t_start, end) {
                Some(e) => Some(Err(e)),
                None => (end == m).then_some(Ok(())),
            };
            if let Some(verdict) = verdict {
                file.remember_index(&info, verdict);
                self.sums.iter_mut().for_each(|s| *s = None);
            }
        }
        self.next = end;
        Ok(true)
    }

    /// Compares the index of frames `t0..t1` with the 8×8 tile sums of the
    /// parts (frame-major per part): the disagreement of the earliest
    /// frame, at its lowest field (`spatial::first_disagreement_frame_major`),
    /// or the index's own fault.
    fn compare_index(
        &self,
        file: &QemFile,
        tiles: &[Vec<u32>],
        t0: usize,
        t1: usize,
    ) -> Option<QemError> {
        let (n, fields) = (t1 - t0, file.spatial_fields());
        let [_, _, r, c] = file.shape();
        let g8c = c.div_ceil(8);
        // Frame by frame, each part's tiles after the parts above it (the
        // parts are consecutive bands, so they follow each other): written
        // once, not zeroed first.
        let mut computed = Vec::with_capacity(n * fields);
        for t in 0..n {
            for (rows, sums) in self.parts.iter().zip(tiles) {
                let k = sums.len() / n;
                computed.resize(t * fields + rows.start / 8 * g8c, 0);
                computed.extend_from_slice(&sums[t * k..(t + 1) * k]);
            }
            computed.resize((t + 1) * fields, 0);
        }
        for frame in computed.chunks_exact_mut(fields) {
            spatial::fill_large_tiles(r, c, frame);
        }
        let arrays = match file.spatial_arrays(self.info.chunk) {
            Ok(a) => a,
            Err(e) => return Some(e),
        };
        spatial::first_disagreement_frame_major(
            fields,
            |t, out| file.block_field_frames(arrays, &self.info, t, t0, out),
            &computed,
        )
        .map(|(k, field, stored, computed)| {
            self.info
                .index_disagreement((t0 + k, field, stored, computed))
        })
    }
}

impl QemFile {
    /// Frames per window of block `block`: all of them when its decoded
    /// bytes fit [`WINDOW_BYTES`], else as many as fit (at least one).
    pub fn window_frames(&self, block: usize) -> usize {
        self.blocks()
            .get(block)
            .map_or(0, |info| self.window_frames_of(info, WINDOW_BYTES))
    }

    /// Frames per window of `info` within `bytes` of decoded rows.
    pub(crate) fn window_frames_of(&self, info: &BlockInfo, bytes: usize) -> usize {
        if info.decoded_bytes <= bytes {
            return info.frames;
        }
        (bytes / self.frame_bytes().max(1)).clamp(1, info.frames.max(1))
    }

    /// About the heap bytes a [`block_cursor`](Self::block_cursor) over
    /// `info` holds, known before making one (to size windows and set
    /// memory aside): a lane state per stream and, for integer blocks
    /// (whose index may still be checked), a mask entry per pixel. It does
    /// not change as verdicts are learnt, so windows sized by it keep their
    /// frames. Streams stored in other forms than rANS add a little;
    /// [`BlockCursor::heap_bytes`] is exact.
    pub fn cursor_bytes(&self, info: &BlockInfo) -> usize {
        let p = self.pixels();
        let (_, count) = block_streams(self.codec(), p, info.block_in_chunk);
        let lanes = count.div_ceil(LANES) * std::mem::size_of::<Group>();
        let mask = if self.codec() == Codec::Integer {
            2 * p
        } else {
            0
        };
        lanes + mask
    }

    /// A cursor at the first frame of block `block`, for decoding it in
    /// windows ([`BlockCursor::read`]) with its pixels spread over threads.
    pub fn block_cursor(&self, block: usize) -> Result<BlockCursor> {
        let info = *self.blocks().get(block).ok_or(QemError::OutOfRange {
            what: "block",
            index: block,
            limit: self.blocks().len(),
        })?;
        self.cursor_with(&info, Some(PART_PIXELS), Kernel::best())
    }

    /// A cursor over `info` in parts of about `part_pixels` pixels
    /// (`None`: one part).
    fn cursor_with(
        &self,
        info: &BlockInfo,
        part_pixels: Option<usize>,
        kernel: Kernel,
    ) -> Result<BlockCursor> {
        let m = info.frames;
        let p = self.pixels();
        let [_, _, r, c] = self.shape();
        let (table, first, count) = self.block_table(info)?;
        let mut cursor = BlockCursor {
            info: *info,
            parts: Vec::new(),
            cursors: Vec::new(),
            sums: Vec::new(),
            kernel,
            next: 0,
            reference: false,
        };
        if m == 0 || p == 0 {
            return Ok(cursor);
        }
        let spp = count / p;
        let index =
            self.codec() == Codec::Integer && self.block_index_verdict(info.index).is_none();
        let (_, valid) = self.index_inputs();
        // Detector rows per part (one part: the whole detector).
        let band = match part_pixels {
            Some(n) => 8 * (n / (8 * c)).max(1),
            None => r,
        };
        cursor.parts = (0..r)
            .step_by(band)
            .map(|r0| r0..(r0 + band).min(r))
            .collect();
        let made: Vec<std::result::Result<Cursor, Refused>> = cursor
            .parts
            .par_iter()
            .map(|rows| {
                Cursor::new(
                    &table,
                    first + spp * rows.start * c,
                    spp * rows.len() * c,
                    m,
                )
            })
            .collect();
        if made.iter().any(|c| c.is_err()) {
            if let Some(fault) = self.reference_fault(info, &cursor.parts, &table) {
                return Err(fault);
            }
            cursor.reference = true;
        }
        cursor.cursors = made
            .into_iter()
            .map(|c| c.ok().filter(|_| !cursor.reference))
            .collect();
        cursor.sums = cursor
            .parts
            .iter()
            .map(|rows| index.then(|| FrameSums::new(c, rows.clone(), &valid)))
            .collect();
        Ok(cursor)
    }

    /// Decodes block `info` and writes its frames `frames` (block-relative)
    /// to `output`, a window at a time ([`WINDOW_BYTES`]; an ordinary
    /// block is one window). Every whole-block decode of an integer block
    /// whose index verdict is unknown checks the index and remembers the
    /// verdict (a disagreement is only remembered: the counts themselves
    /// are verified and served; index products refuse the block).
    /// `spread`: the block's pixels are decoded by several threads (a
    /// caller with enough blocks to keep every thread busy passes `false`;
    /// a block larger than a window is spread whatever it passes).
    pub(crate) fn decode_block_frames(
        &self,
        info: &BlockInfo,
        frames: Range<usize>,
        output: Output<'_>,
        spread: bool,
    ) -> Result<()> {
        let part = (spread || info.decoded_bytes > WINDOW_BYTES).then_some(PART_PIXELS);
        let window = self.window_frames_of(info, WINDOW_BYTES);
        self.decode_block_with(info, frames, output, part, Kernel::best(), window)
    }

    /// [`decode_block_frames`](Self::decode_block_frames) with `kernel`,
    /// in parts of about `part_pixels` pixels (`None`: one part) and
    /// windows of `window` frames.
    fn decode_block_with(
        &self,
        info: &BlockInfo,
        frames: Range<usize>,
        mut output: Output<'_>,
        part_pixels: Option<usize>,
        kernel: Kernel,
        window: usize,
    ) -> Result<()> {
        let m = info.frames;
        let (_, e) = self.convert_of(info, &output)?;
        if frames.start > frames.end || frames.end > m {
            return Err(QemError::OutOfRange {
                what: "block frame",
                index: frames.end,
                limit: m,
            });
        }
        let row_bytes = self.pixels() * e;
        if let Some(len) = output.len().filter(|&len| len != frames.len() * row_bytes) {
            return Err(QemError::OutOfRange {
                what: "block output",
                index: len,
                limit: frames.len() * row_bytes,
            });
        }
        let mut cursor = self.cursor_with(info, part_pixels, kernel)?;
        for w0 in (0..m).step_by(window.max(1)) {
            let w1 = (w0 + window.max(1)).min(m);
            let (lo, hi) = (frames.start.max(w0), frames.end.min(w1));
            let (wanted, part) = if lo < hi {
                let rows = lo - frames.start..hi - frames.start;
                (lo..hi, output.rows(rows, row_bytes))
            } else {
                (w0..w0, Output::Check)
            };
            cursor.advance(self, w1 - w0, wanted, part)?;
        }
        Ok(())
    }

    /// How the decoded u16 values become `output`'s bytes, and the bytes
    /// per pixel.
    fn convert_of(&self, info: &BlockInfo, output: &Output<'_>) -> Result<(Convert, usize)> {
        Ok(match output {
            Output::Check | Output::Visit(_) => (Convert::Skip, 0),
            Output::Codes(_) if self.codec() == Codec::Float => {
                return Err(QemError::header(
                    "codec",
                    "float32 files have no integer codes",
                ))
            }
            Output::Values(_) if self.codec() == Codec::Scaled => {
                let (scale, offset) = self.chunks()[info.chunk]
                    .region
                    .and_then(|i| self.calibration().and_then(|cal| cal.regions.get(i)))
                    .map_or((1.0, 0.0), |region| (region.scale, region.offset));
                (Convert::Calibrate { scale, offset }, 4)
            }
            Output::Values(_) if self.stored_dtype() == Dtype::U8 => (Convert::Narrow, 1),
            Output::Values(_) => (Convert::Copy, self.decoded_dtype().size()),
            Output::Codes(_) => (Convert::Copy, 2),
        })
    }

    /// The first fault of block `info` as the reference decoder names it,
    /// stream by stream, a part (`parts`: detector rows) at a time so that
    /// memory stays at a part's columns: the first stream that does not
    /// decode, else the first uint8 count above 255; `None` when every
    /// stream is valid.
    fn reference_fault(
        &self,
        info: &BlockInfo,
        parts: &[Range<usize>],
        table: &StreamTable<'_>,
    ) -> Option<QemError> {
        let p = self.pixels();
        let [_, _, _, c] = self.shape();
        let m = info.frames;
        let (first, count) = block_streams(self.codec(), p, info.block_in_chunk);
        let spp = count / p;
        let u8_counts = self.stored_dtype() == Dtype::U8;
        let site = |stream| StreamSite {
            chunk: info.chunk,
            stream,
        };
        let faults: Vec<(Option<QemError>, Option<QemError>)> = parts
            .par_iter()
            .map(|rows| {
                let s0 = first + spp * rows.start * c;
                let mut cols = vec![0u16; spp * rows.len() * c * m];
                if let Err((s, fault)) = table.decode_range(s0, m, &mut cols) {
                    return (
                        Some(QemError::Stream {
                            site: site(s),
                            fault,
                        }),
                        None,
                    );
                }
                let high = u8_counts
                    .then(|| cols.iter().position(|&v| v > 255))
                    .flatten()
                    .map(|i| QemError::ValueRange {
                        site: site(s0 + i / m),
                        value: cols[i],
                        dtype: "uint8",
                    });
                (None, high)
            })
            .collect();
        let (streams, ranges): (Vec<_>, Vec<_>) = faults.into_iter().unzip();
        streams
            .into_iter()
            .flatten()
            .next()
            .or_else(|| ranges.into_iter().flatten().next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qem::PixelValues;

    /// Every block of every conformance fixture that opens, through every
    /// kernel this CPU runs, in one part and in bands, whole and in frame
    /// ranges, as values, codes and a check only: the bytes equal those
    /// made from the stream-by-stream reference path (`decode_pixels`),
    /// and a block the reference refuses is refused with the reference's
    /// own error.
    #[test]
    fn every_block_equals_the_reference_path() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/conformance/qem"
        );
        let mut blocks_checked = 0;
        // Blocks decoded in several parts (detectors of more than 8 rows).
        let mut multi_part = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let Ok(file) = QemFile::from_bytes(bytes.clone()) else {
                continue;
            };
            let name = path.display().to_string();
            let p = file.pixels();
            let all: Vec<usize> = (0..p).collect();
            let [_, _, r, _] = file.shape();
            for info in file.blocks().to_vec() {
                let m = info.frames;
                multi_part += usize::from(r > 8);
                let reference = file.decode_block_pixels(info.index, &all);
                // Frame-major dense bytes of the reference: values, codes.
                let (values, codes) = match &reference {
                    Ok(r) => {
                        let mut codes = Vec::new();
                        let mut values = Vec::new();
                        for t in 0..m {
                            for q in 0..p {
                                match &r.values {
                                    PixelValues::U16(v) => {
                                        let v = v[q * m + t];
                                        codes.extend_from_slice(&v.to_le_bytes());
                                    }
                                    PixelValues::F32Bits(v) => {
                                        values.extend_from_slice(&v[q * m + t].to_le_bytes());
                                    }
                                }
                            }
                        }
                        if values.is_empty() {
                            let mut whole = vec![0u8; info.decoded_bytes];
                            values = match file.codec() {
                                // Calibrated by the same rule as the reader.
                                Codec::Scaled => {
                                    file.decode_block_frames(
                                        &info,
                                        0..m,
                                        Output::Values(&mut whole),
                                        false,
                                    )
                                    .unwrap();
                                    whole
                                }
                                _ if file.stored_dtype() == Dtype::U8 => {
                                    codes.chunks_exact(2).map(|b| b[0]).collect()
                                }
                                _ => codes.clone(),
                            };
                        }
                        (values, codes)
                    }
                    Err(_) => (Vec::new(), Vec::new()),
                };
                let e = file.decoded_dtype().size();
                for kernel in Kernel::ALL.into_iter().filter(|k| k.available()) {
                    // One part, the default parts, and one 8-row band
                    // each; in one window and in windows of a few frames.
                    let windows = [
                        (None, m),
                        (Some(PART_PIXELS), m),
                        (Some(1), m),
                        (None, 5),
                        (Some(PART_PIXELS), 3),
                        (Some(1), 1),
                    ];
                    for (spread, window) in windows {
                        for frames in [0..m, 0..m / 2, m / 3..m, m / 2..(m / 2 + 1).min(m)] {
                            let mut out = vec![0xa5u8; frames.len() * p * e];
                            let got = file.decode_block_with(
                                &info,
                                frames.clone(),
                                Output::Values(&mut out),
                                spread,
                                kernel,
                                window,
                            );
                            let what = format!(
                                "{name} block {} {frames:?} {kernel:?} {spread:?}",
                                info.index
                            );
                            match &reference {
                                Ok(_) => {
                                    got.unwrap();
                                    let want = &values[frames.start * p * e..frames.end * p * e];
                                    assert!(out == want, "{what} window {window}: values differ");
                                }
                                Err(want) => {
                                    assert_eq!(
                                        got.unwrap_err().to_string(),
                                        want.to_string(),
                                        "{what}"
                                    );
                                }
                            }
                        }
                        let check = |f: &QemFile| {
                            f.decode_block_with(&info, 0..m, Output::Check, spread, kernel, window)
                        };
                        let checked = check(&file);
                        // The index verdict, made by these parts on a fresh
                        // opening, equals the reference path's.
                        if file.codec() == Codec::Integer && reference.is_ok() {
                            let fresh = QemFile::from_bytes(bytes.clone()).unwrap();
                            check(&fresh).unwrap();
                            let got = fresh
                                .block_index_verdict(info.index)
                                .map(|v| v.map_err(|e| e.to_string()));
                            let plain = QemFile::from_bytes(bytes.clone()).unwrap();
                            let columns = plain.block_columns(&info).unwrap();
                            let want = plain
                                .check_spatial(&info, &columns)
                                .map_err(|e| e.to_string());
                            assert_eq!(
                                got,
                                Some(want),
                                "{name} block {} index verdict {spread:?}",
                                info.index
                            );
                        }
                        assert_eq!(checked.is_ok(), reference.is_ok(), "{name} check");
                        if file.codec() != Codec::Float {
                            let mut out = vec![0x5au8; 2 * m * p];
                            let got = file.decode_block_with(
                                &info,
                                0..m,
                                Output::Codes(&mut out),
                                spread,
                                kernel,
                                window,
                            );
                            if reference.is_ok() {
                                got.unwrap();
                                assert!(out == codes, "{name} block {} codes differ", info.index);
                            } else {
                                assert!(got.is_err(), "{name} codes");
                            }
                        }
                    }
                }
                blocks_checked += 1;
            }
        }
        assert!(blocks_checked > 20, "only {blocks_checked} blocks checked");
        assert!(multi_part > 10, "only {multi_part} blocks in several parts");
    }
}
