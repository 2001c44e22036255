//! One block decoded: the single entry point of every reader of decoded
//! values (a frame, a block, the whole array, the stored codes, full
//! validation), for every codec and dtype.
//!
//! The block's streams are decoded frame-major by lane groups (see
//! [`frame_major`]) in *parts*: whole 8-row bands of the detector, about
//! [`PART_PIXELS`] pixels each, decoded in parallel a slab of frames at a
//! time. While a slab is in cache it is converted into the output rows
//! (u8 narrowing, the scaled codec's calibration, float lanes, which are
//! already the little-endian float32 bits) and, for the integer codec,
//! summed into 8×8 tiles for the block's spatial index check, once per
//! block (see `QemFile::block_index`). A caller that decodes many blocks
//! at once asks for one part per block instead, which writes u16 rows
//! straight into its output.
//!
//! The kernels prove valid streams valid and nothing else: when a part
//! refuses (some stream does not decode cleanly, or a uint8 count exceeds
//! 255), the block is decoded again stream by stream by the reference
//! path, which names the fault.

use std::ops::Range;

use rayon::prelude::*;

use super::error::{QemError, Result};
use super::file::{block_streams, QemFile};
use super::frame_major::{self, Rows, SLAB};
use super::header::{Codec, Dtype};
use super::lanes::Kernel;
use super::layout::BlockInfo;
use super::spatial::{self, FrameSums};

/// What a block decode produces.
pub(crate) enum Output<'a> {
    /// The requested frames as dense bytes of the decoded dtype.
    Values(&'a mut [u8]),
    /// The requested frames' stored u16 values, little-endian (integer
    /// and scaled codecs).
    Codes(&'a mut [u8]),
    /// Nothing: every stream decoded (and the index checked) only.
    Check,
}

/// Pixels per part, about: 32 frames of 4096 u16 values are a 256 KiB
/// slab, which stays in a core's L2 cache while it is converted and summed,
/// and a 128×128 detector is 4 parts. (Parts of 1024 pixels spread better
/// but cost more: a sequential `data.npy` read through the mount took
/// 0.64 s of daemon CPU with them, 0.59–0.61 s with these, about as much
/// as with one part per block written straight into the output.)
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

impl QemFile {
    /// Decodes block `info` and writes its frames `frames` (block-relative)
    /// to `output`. Every whole-block decode of an integer block whose
    /// index verdict is unknown checks the index and remembers the verdict
    /// (a disagreement is only remembered: the counts themselves are
    /// verified and served; index products refuse the block). `spread`:
    /// the block's pixels are decoded by several threads (a caller with
    /// enough blocks to keep every thread busy passes `false`).
    pub(crate) fn decode_block_frames(
        &self,
        info: &BlockInfo,
        frames: Range<usize>,
        output: Output<'_>,
        spread: bool,
    ) -> Result<()> {
        let part = spread.then_some(PART_PIXELS);
        self.decode_block_with(info, frames, output, part, Kernel::best())
    }

    /// [`decode_block_frames`](Self::decode_block_frames) with `kernel`,
    /// in parts of about `part_pixels` pixels (`None`: one part).
    fn decode_block_with(
        &self,
        info: &BlockInfo,
        frames: Range<usize>,
        mut output: Output<'_>,
        part_pixels: Option<usize>,
        kernel: Kernel,
    ) -> Result<()> {
        let m = info.frames;
        let p = self.pixels();
        let [_, _, r, c] = self.shape();
        let stored_u8 = self.stored_dtype() == Dtype::U8;
        let (convert, e) = match &output {
            Output::Check => (Convert::Skip, 0),
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
            Output::Values(_) if stored_u8 => (Convert::Narrow, 1),
            Output::Values(_) => (Convert::Copy, self.decoded_dtype().size()),
            Output::Codes(_) => (Convert::Copy, 2),
        };
        if frames.start > frames.end || frames.end > m {
            return Err(QemError::OutOfRange {
                what: "block frame",
                index: frames.end,
                limit: m,
            });
        }
        let row_bytes = p * e;
        if let Output::Values(out) | Output::Codes(out) = &output {
            if out.len() != frames.len() * row_bytes {
                return Err(QemError::OutOfRange {
                    what: "block output",
                    index: out.len(),
                    limit: frames.len() * row_bytes,
                });
            }
        }
        let chunk = &self.chunks()[info.chunk];
        let table = self.stream_table(info.chunk)?;
        let (first, count) = block_streams(self.codec(), p, info.block_in_chunk);
        self.checked(self.payload_span(chunk, &table, first, count))?;
        if m == 0 || p == 0 {
            return Ok(());
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
        let parts: Vec<Range<usize>> = (0..r)
            .step_by(band)
            .map(|r0| r0..(r0 + band).min(r))
            .collect();
        // Whole u16 rows with nothing to convert go straight to the output.
        let direct = parts.len() == 1 && matches!(convert, Convert::Copy) && frames == (0..m);
        let mut segments: Vec<Vec<&mut [u8]>> = parts.iter().map(|_| Vec::new()).collect();
        let mut whole: Option<&mut [u8]> = None;
        if let Output::Values(out) | Output::Codes(out) = &mut output {
            if direct {
                whole = Some(&mut **out);
            } else {
                for row in out.chunks_exact_mut(row_bytes) {
                    let mut rest = row;
                    for (part, segs) in parts.iter().zip(&mut segments) {
                        let (head, tail) = rest.split_at_mut(part.len() * c * e);
                        segs.push(head);
                        rest = tail;
                    }
                }
            }
        }
        // One part: its 8×8 tile sums (frame-major) when it decoded
        // cleanly, else `None`. Into `whole` (the block's every row) or
        // into `segs` (its columns of each output row) through a slab.
        let decode_part = |rows: &Range<usize>,
                           whole: Option<&mut [u8]>,
                           mut segs: Vec<&mut [u8]>|
         -> Option<Vec<u32>> {
            let (p0, w) = (rows.start * c, rows.len() * c);
            let ws = spp * w;
            let mut sums = index.then(|| FrameSums::new(c, rows.clone(), &valid));
            let tiles = sums.as_ref().map_or(0, FrameSums::tiles);
            let mut tile_sums = vec![0u32; tiles * m];
            let mut in_range = true;
            let on_slab = |t0: usize, rows: &[u8]| {
                let vals = values(rows);
                if stored_u8 {
                    in_range &= vals.iter().all(|&v| u16::from_le(v) <= 255);
                }
                if let Some(sums) = sums.as_mut() {
                    sums.add(&vals, t0, &mut tile_sums);
                }
                for (k, src) in vals.chunks_exact(ws).enumerate() {
                    let seg = (t0 + k)
                        .checked_sub(frames.start)
                        .and_then(|i| segs.get_mut(i));
                    if let Some(seg) = seg {
                        convert.row(src, seg);
                    }
                }
            };
            let s0 = first + spp * p0;
            let done = match whole {
                Some(out) => {
                    frame_major::decode(&table, s0, ws, m, kernel, Rows::Whole(out), on_slab)
                }
                None => {
                    let mut slab = vec![0u16; ws * SLAB.min(m)];
                    let rows = Rows::Slab(bytemuck::cast_slice_mut(&mut slab));
                    frame_major::decode(&table, s0, ws, m, kernel, rows, on_slab)
                }
            };
            (done.is_ok() && in_range).then_some(tile_sums)
        };
        let decoded: Vec<Option<Vec<u32>>> = if parts.len() == 1 {
            let segs = segments.pop().unwrap_or_default();
            vec![decode_part(&parts[0], whole, segs)]
        } else {
            parts
                .par_iter()
                .zip(segments.into_par_iter())
                .map(|(rows, segs)| decode_part(rows, None, segs))
                .collect()
        };
        if decoded.iter().all(Option::is_some) {
            if index {
                let tiles: Vec<Vec<u32>> = decoded.into_iter().flatten().collect();
                self.check_tiles(info, &parts, &tiles);
            }
            return Ok(());
        }
        // Some stream does not decode cleanly, or a uint8 count exceeds
        // 255: the reference path names the first fault.
        let columns = self.block_columns(info)?;
        // Reached only where the kernels refuse what the reference
        // accepts (a payload beyond their 2 GiB reach): served from the
        // reference's values.
        if self.codec() == Codec::Integer {
            let _ = self.check_spatial(info, &columns);
        }
        if let Output::Values(out) | Output::Codes(out) = output {
            let mut row = vec![0u16; count];
            for (t, dst) in frames.clone().zip(out.chunks_exact_mut(row_bytes)) {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = columns[j * m + t].to_le();
                }
                convert.row(&row, dst);
            }
        }
        Ok(())
    }

    /// Completes the index check of block `info` from the 8×8 tile sums of
    /// its `parts` (frame-major per part) and remembers the verdict.
    fn check_tiles(&self, info: &BlockInfo, parts: &[Range<usize>], tiles: &[Vec<u32>]) {
        let (m, fields) = (info.frames, self.spatial_fields());
        let [_, _, r, c] = self.shape();
        let g8c = c.div_ceil(8);
        let mut computed = vec![0u32; m * fields];
        for (rows, sums) in parts.iter().zip(tiles) {
            let n = sums.len() / m;
            let at = rows.start / 8 * g8c;
            for (t, frame) in computed.chunks_exact_mut(fields).enumerate() {
                frame[at..at + n].copy_from_slice(&sums[t * n..(t + 1) * n]);
            }
        }
        for frame in computed.chunks_exact_mut(fields) {
            spatial::fill_large_tiles(r, c, frame);
        }
        match self.spatial_agrees(info, &computed) {
            Ok(true) => self.remember_index(info, Ok(())),
            // Field-major, as the verdict names the first field found.
            Ok(false) => {
                let by_field: Vec<u64> = (0..fields * m)
                    .map(|i| u64::from(computed[(i % m) * fields + i / m]))
                    .collect();
                let _ = self.record_index(info, &by_field);
            }
            Err(e) => self.remember_index(info, Err(e)),
        }
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
                    // One part, the default parts, and one 8-row band each.
                    for spread in [None, Some(PART_PIXELS), Some(1)] {
                        for frames in [0..m, 0..m / 2, m / 3..m, m / 2..(m / 2 + 1).min(m)] {
                            let mut out = vec![0xa5u8; frames.len() * p * e];
                            let got = file.decode_block_with(
                                &info,
                                frames.clone(),
                                Output::Values(&mut out),
                                spread,
                                kernel,
                            );
                            let what = format!(
                                "{name} block {} {frames:?} {kernel:?} {spread:?}",
                                info.index
                            );
                            match &reference {
                                Ok(_) => {
                                    got.unwrap();
                                    let want = &values[frames.start * p * e..frames.end * p * e];
                                    assert!(out == want, "{what}: values differ");
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
                        let checked =
                            file.decode_block_with(&info, 0..m, Output::Check, spread, kernel);
                        // The index verdict, made by these parts on a fresh
                        // opening, equals the reference path's.
                        if file.codec() == Codec::Integer && reference.is_ok() {
                            let fresh = QemFile::from_bytes(bytes.clone()).unwrap();
                            fresh
                                .decode_block_with(&info, 0..m, Output::Check, spread, kernel)
                                .unwrap();
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
