//! The directory a `.qem` file appears as: the original bytes, its header
//! and summary, digests, the whole decoded array, every frame, and the
//! virtual images that need no decoding.
//!
//! Every size comes from the header. Decoded bytes come from the shared
//! block cache, one 512-scan block (a chunk, for floats) at a time.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::export::tiff::{Sample, Sampling, TiffLayout};
use crate::mapguard;
use crate::npy::{self, DType};
use crate::qem::{BlockCursor, BlockInfo, Codec, Dtype, LogicalDigest, QemFile, WINDOW_BYTES};
use crate::reduce::geometry::DetectorOptions;
use crate::reduce::Accelerator;

use super::block_buf::BlockBuf;
use super::budget::{CacheKey, Charged};
use super::content::{copy_range, Content, Held, Lazy, Passthrough};
use super::{prefetch, BlockKey, Budget, Directory, Entry, StaticDir, TreeError};
use super::{virtual_dir, zarr_view};

/// An opened `.qem` file shared by all of its nodes.
pub struct QemView {
    /// Distinguishes this opening in the shared cache: a changed source
    /// file gets a new id, so stale blocks are never served.
    id: u64,
    name: String,
    file: QemFile,
    cache: Arc<Budget>,
    /// Where the last window a dense read touched ends (a frame of the
    /// whole array), to spot sequential reading.
    last_block: AtomicUsize,
    /// The window last served by decoding only the frames a small read
    /// asked for (see `read_few`): a second small read there loads it.
    few: Mutex<Option<BlockKey>>,
    /// The windows most recently read whole and evicted (see `served`),
    /// newest last, until they are loaded again: the prefetcher leaves
    /// them alone.
    consumed: Mutex<VecDeque<BlockKey>>,
    /// Float files: the whole-array checksum, fed by sequential readers of
    /// the decoded array (see `check_logical`).
    logical: Option<Mutex<LogicalDigest>>,
}

fn npy_dtype(d: Dtype) -> DType {
    match d {
        Dtype::U8 => DType::U8,
        Dtype::U16 => DType::U16,
        Dtype::F32 => DType::F32,
    }
}

impl QemView {
    pub(super) fn file(&self) -> &QemFile {
        &self.file
    }

    /// The budget this opening's blocks and products are held in, and
    /// the opening's number there.
    pub(super) fn budget(&self) -> (&Arc<Budget>, u64) {
        (&self.cache, self.id)
    }

    pub(super) fn decode_error(&self, e: impl std::fmt::Display) -> TreeError {
        TreeError::Decode {
            file: self.name.clone(),
            reason: e.to_string(),
        }
    }

    /// Frames per cached window of block `info`: the whole block when it
    /// fits [`WINDOW_BYTES`], a quarter of the cache budget, and half of
    /// what the block's cursor leaves of it (an ordinary block is one
    /// window; so is any block of at most [`MIN_WINDOW_BYTES`], whatever
    /// the budget), else as many frames as fit.
    ///
    /// A block decoded in windows works in one cursor (its lane states,
    /// see [`QemFile::cursor_bytes`]) and two windows: the one a reader is
    /// copying from and the next, decoded by the reader or the prefetcher.
    /// Sized so, the three fit the budget together and the cursor is kept
    /// between windows. The least a block needs is one cursor and one
    /// window of [`MIN_WINDOW_BYTES`] (or one frame); below that a reader
    /// is still answered, beyond the budget, and the cursor is not kept, so
    /// every window is decoded from the block's first frame.
    fn window_frames(&self, info: &BlockInfo) -> usize {
        let budget = self.cache.limit();
        let beside_cursor = budget.saturating_sub(self.file.cursor_bytes(info)) / 2;
        let bytes = WINDOW_BYTES
            .min(budget / 4)
            .min(beside_cursor)
            .max(MIN_WINDOW_BYTES);
        self.file.window_frames_of(info, bytes)
    }

    /// Decoded bytes of the window of block `index` that starts at its
    /// frame `window` (codes of the scaled codec when `codes`). Must not be
    /// called from a rayon worker (see `prefetch`).
    fn window(
        self: &Arc<Self>,
        index: usize,
        window: usize,
        codes: bool,
    ) -> Result<Arc<BlockBuf>, TreeError> {
        self.load_window(index, window, codes, true)
    }

    /// As [`window`](Self::window); with `reserve`, a load this call
    /// starts first sets the window's bytes aside in the budget (evicting
    /// to make room) for as long as it decodes, so that readers decoding
    /// at once stay within the budget as prefetches do. A load that the
    /// whole budget cannot hold beside the others still runs: a reader is
    /// always answered. Prefetches hold their own reservation.
    fn load_window(
        self: &Arc<Self>,
        index: usize,
        window: usize,
        codes: bool,
        reserve: bool,
    ) -> Result<Arc<BlockBuf>, TreeError> {
        let key = BlockKey {
            view: self.id,
            block: index,
            window,
            codes,
        };
        self.cache.get_or_load(key, || {
            self.consumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&k| k != key);
            let faults = self.file.faults();
            let info = *self
                .file
                .blocks()
                .get(index)
                .ok_or_else(|| self.decode_error(format!("no block {index}")))?;
            let n = self
                .window_frames(&info)
                .min(info.frames.saturating_sub(window));
            let bytes = n * if codes {
                2 * self.file.pixels()
            } else {
                self.file.frame_bytes()
            };
            let _reserved = reserve
                .then(|| self.cache.reserve_while(bytes, 1024))
                .flatten();
            let mut out = RECYCLED.take(bytes).ok_or_else(|| TreeError::OutOfMemory {
                file: self.name.clone(),
                bytes,
            })?;
            let decoded = if n == info.frames {
                // A chunk's first decode runs beside its body checksums.
                self.file
                    .beside_chunk_checks(info.chunk, |f| {
                        if codes {
                            f.decode_block_codes_le(index, &mut out)
                        } else {
                            f.decode_block_into(index, &mut out)
                        }
                    })
                    .and_then(|r| r)
                    .map(|()| out)
            } else {
                self.decode_window(&info, window, n, codes, out)
            };
            // What the decode read of the source is in the page cache; the
            // daemon keeps only what it decoded (in the budget) resident.
            self.file.release_mapped_pages();
            let bytes = decoded.map_err(|e| self.decode_error(e))?;
            if self.file.faults() != faults {
                return Err(self.decode_error(mapguard::CHANGED));
            }
            Ok(RECYCLED.hand_out(bytes))
        })
    }

    /// Where an idle cursor over block `block` standing at its frame
    /// `frame` is kept in the budget.
    fn cursor_key(&self, block: usize, codes: bool, frame: usize) -> CacheKey {
        CacheKey::Cursor {
            view: self.id,
            block,
            codes,
            frame,
        }
    }

    /// Frames `window..window + n` of a block decoded in windows, by the
    /// idle cursor that stands nearest before them (a sequential reader's
    /// cursor simply goes on), else by a new one. The cursor is taken out
    /// of the budget and its bytes set aside there while it decodes (for
    /// a reader and for the prefetcher alike), and it is given back to the
    /// budget's LRU, standing after the window, unless it reached the
    /// block's end.
    fn decode_window(
        &self,
        info: &BlockInfo,
        window: usize,
        n: usize,
        codes: bool,
        mut out: BlockBuf,
    ) -> Result<BlockBuf, crate::qem::QemError> {
        // Windows start at multiples of `w`, so a cursor stands at one.
        let w = self.window_frames(info).max(1);
        let take_at = |frame| {
            self.cache
                .take::<IdleCursor>(self.cursor_key(info.index, codes, frame))
        };
        let mut taken = take_at(window);
        if taken.is_none() && window >= w {
            // The cursor that will stand here may be at work on the window
            // before: the prefetcher asked for the window after the one a
            // reader waits for. Waiting for it beats a new cursor, which
            // decodes the block from its start again beside it (a sequential
            // read of a 4 GB block rose 170 MiB at its second window so).
            self.cache.wait_for_load(BlockKey {
                view: self.id,
                block: info.index,
                window: window - w,
                codes,
            });
            taken = take_at(window);
        }
        let taken = taken
            .or_else(|| (0..window / w).rev().find_map(|k| take_at(k * w)))
            .and_then(|idle| Arc::try_unwrap(idle).ok())
            .and_then(IdleCursor::into_parts);
        let (mut cursor, reserved) = match taken {
            Some((cursor, bytes)) => {
                let reserved = self.cache.reserve_while(bytes, 1024);
                (cursor, [reserved, None])
            }
            None => {
                // Set aside before it is made, and what it really holds
                // beyond that once it is.
                let estimate = self.file.cursor_bytes(info);
                let first = self.cache.reserve_while(estimate, 1024);
                let cursor = self.file.block_cursor(info.index)?;
                let beyond = cursor.heap_bytes().saturating_sub(estimate);
                let more = (beyond > 0)
                    .then(|| self.cache.reserve_while(beyond, 1024))
                    .flatten();
                (cursor, [first, more])
            }
        };
        cursor.skip(&self.file, window - cursor.next_frame())?;
        if codes {
            cursor.read_codes_le(&self.file, n, &mut out)?;
        } else {
            cursor.read(&self.file, n, &mut out)?;
        }
        if cursor.next_frame() < info.frames {
            let key = self.cursor_key(info.index, codes, cursor.next_frame());
            let idle = IdleCursor {
                bytes: cursor.heap_bytes(),
                cursor: Mutex::new(Some(cursor)),
            };
            // Given back before it is kept, so that it is not counted twice.
            drop(reserved);
            self.cache.keep(key, Arc::new(idle));
        } else {
            drop(cursor);
        }
        // A window's decode frees its parts' slabs and tile sums in two
        // arenas; a block decoded in windows has a detector large enough
        // that they stayed resident beside the budget (after scattered
        // reads of a 4 GB block, 387-400 MiB against 274-323 with this).
        // Once per window, against a decode of tens of MB.
        super::give_back_freed_memory();
        Ok(out)
    }

    /// The window holding block frame `frame` of `info`: its first frame
    /// and its frame count.
    fn window_of(&self, info: &BlockInfo, frame: usize) -> (usize, usize) {
        let w = self.window_frames(info).max(1);
        let start = frame / w * w;
        (start, w.min(info.frames - start))
    }

    /// Asks the bounded prefetcher to decode the window after `asked_by`
    /// (the next block's first one after a block's last) in the
    /// background unless it is cached or already being decoded. Its memory
    /// is reserved in the budget until the window is in the cache.
    fn prefetch(self: &Arc<Self>, asked_by: BlockKey) {
        let Some(info) = self.file.blocks().get(asked_by.block).copied() else {
            return;
        };
        let (start, n) = self.window_of(&info, asked_by.window);
        let (index, window) = if start + n < info.frames {
            (info.index, start + n)
        } else {
            (info.index + 1, 0)
        };
        let codes = asked_by.codes;
        let Some(target) = self.file.blocks().get(index).copied() else {
            return;
        };
        let key = BlockKey {
            view: self.id,
            block: index,
            window,
            codes,
        };
        if self.cache.is_present_or_loading(key)
            || self
                .consumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&key)
        {
            return;
        }
        let (_, frames) = self.window_of(&target, window);
        let bytes = if codes {
            2 * frames * self.file.pixels()
        } else {
            frames * self.file.frame_bytes()
        };
        let view = Arc::downgrade(self);
        prefetch::submit(&self.cache, bytes, move || {
            // Nothing holds the view any more when its container was
            // closed (its blocks dropped) and its last reader went before
            // this ran: a late prefetch must not load a closed view's
            // block back into the cache. (The window that asked may be
            // gone while its reader goes on: it was read whole.)
            let Some(view) = view.upgrade() else {
                return;
            };
            // A failure surfaces when a reader asks for the window itself.
            let _ = view.load_window(index, window, codes, false);
        });
    }

    pub(super) fn element_size(&self, codes: bool) -> usize {
        if codes {
            2
        } else {
            self.file.decoded_dtype().size()
        }
    }

    /// Bytes of one element frame-major array frame (`pixels` elements).
    fn frame_bytes(&self, codes: bool) -> u64 {
        (self.file.pixels() * self.element_size(codes)) as u64
    }

    /// Where decoded array byte `at` lies: its block and the window of
    /// that block (first frame, frame count) holding it.
    fn span_of(&self, at: u64, codes: bool) -> Result<(BlockInfo, usize, usize), TreeError> {
        let frame = (at / self.frame_bytes(codes)) as usize;
        let info = *self
            .file
            .block_of_frame(frame)
            .map_err(|e| self.decode_error(e))?;
        let (window, n) = self.window_of(&info, frame - info.first_frame);
        Ok((info, window, n))
    }

    /// The decoded window holding array byte `at`, where `at` lies in it,
    /// and its key; notes sequential reading (prefetching the next window)
    /// and feeds a float file's whole-array checksum.
    fn piece(
        self: &Arc<Self>,
        at: u64,
        codes: bool,
    ) -> Result<(Arc<BlockBuf>, usize, BlockKey), TreeError> {
        let (info, window, n) = self.span_of(at, codes)?;
        let block = self.window(info.index, window, codes)?;
        let key = BlockKey {
            view: self.id,
            block: info.index,
            window,
            codes,
        };
        // Sequential reading: this window again, or the one after the
        // last one read (counted in frames of the whole array).
        let (start, end) = (info.first_frame + window, info.first_frame + window + n);
        let previous = self.last_block.swap(end, Ordering::Relaxed);
        if previous == end || previous == start {
            self.prefetch(key);
        }
        if let Some(Ok(mut digest)) = self.logical(codes).map(Mutex::try_lock) {
            digest
                .feed_window(&self.file, info.index, window..window + n, &block)
                .map_err(|e| self.decode_error(e))?;
        }
        let window_start = start as u64 * self.frame_bytes(codes);
        Ok((block, (at - window_start) as usize, key))
    }

    /// `n` more bytes of window `key` (held in `block`) handed to a
    /// reader. Once as many as the window holds have been, in an array
    /// larger than the budget, the window is evicted at once: its reader
    /// has had it all (a Zarr chunk read whole, a stretch of `data.npy`
    /// read through), and an array the budget cannot hold is read through
    /// before any of it could be read again from the cache (least recently
    /// used goes first). Kept, such windows filled the whole budget with
    /// fresh memory that the kernel cleared page by page (a fifth of the
    /// daemon's CPU when a fresh mount's `data.zarr` chunks or `data.npy`
    /// are read through); evicted, its buffer takes the next window's
    /// decode. A window some reader reads again is taken back while its
    /// buffer is unused, else decoded again, and held until that reader
    /// has been through it too (`BlockBuf::serve`); but it is not prefetched
    /// again: of two readers taking alternate chunks, the one ahead has
    /// often read the window after the other's whole before that one's
    /// prefetch asks for it.
    fn served(&self, key: BlockKey, block: &BlockBuf, n: usize) {
        let total = self.frame_bytes(key.codes) * self.file.frames() as u64;
        if block.serve(n) && total > self.cache.limit() as u64 {
            self.cache.evict(key);
            let mut consumed = self.consumed.lock().unwrap_or_else(|e| e.into_inner());
            if !consumed.contains(&key) {
                if consumed.len() == CONSUMED_KEPT {
                    consumed.pop_front();
                }
                consumed.push_back(key);
            }
        }
    }

    /// The whole-array checksum a read of decoded values feeds (float
    /// files).
    fn logical(&self, codes: bool) -> Option<&Mutex<LogicalDigest>> {
        self.logical.as_ref().filter(|_| !codes)
    }

    /// Refuses a read of a float file whose whole-array checksum is known
    /// to disagree.
    fn check_verdict(&self, codes: bool) -> Result<(), TreeError> {
        if let (Some(_), Some(Err(e))) = (self.logical(codes), self.file.logical_verdict()) {
            return Err(self.decode_error(e));
        }
        Ok(())
    }

    /// A read that ends the decoded array: the float checksum must hold.
    fn finish_read(self: &Arc<Self>, end: u64, codes: bool) -> Result<(), TreeError> {
        let total = self.frame_bytes(codes) * self.file.frames() as u64;
        match self.logical(codes) {
            Some(digest) if end == total => self.check_logical(digest),
            _ => Ok(()),
        }
    }

    /// The window holding `[at, at + len)` when that read is small (at
    /// most [`FEW_FRAMES`] frames, in one window), the window is neither
    /// held nor being decoded, and the read does not go on from the one
    /// before (a sequential reader wants the whole window, and the next).
    /// Never in a block decoded in windows: decoding a few frames there
    /// would decode (and check) the whole block, with a cursor of its own,
    /// where a window goes on from a cursor kept in the budget.
    fn few_key(&self, at: u64, len: usize, codes: bool) -> Result<Option<BlockKey>, TreeError> {
        let fb = self.frame_bytes(codes);
        let total = fb * self.file.frames() as u64;
        let end = at.saturating_add(len as u64);
        if len == 0 || end > total || (len as u64) > FEW_FRAMES * fb {
            return Ok(None);
        }
        let (info, window, n) = self.span_of(at, codes)?;
        let (start, stop) = (info.first_frame + window, info.first_frame + window + n);
        if n < info.frames
            || end > stop as u64 * fb
            || self.last_block.load(Ordering::Relaxed) == start
        {
            return Ok(None);
        }
        let key = BlockKey {
            view: self.id,
            block: info.index,
            window,
            codes,
        };
        let again = *self.few.lock().unwrap_or_else(|e| e.into_inner()) == Some(key);
        Ok((!again && !self.cache.is_present_or_loading(key)).then_some(key))
    }

    /// A small read of a window no one holds (one frame of a random
    /// block, through `frames/`): only the frames it covers are decoded,
    /// in a buffer of their size, instead of the whole block into fresh
    /// memory. Faulting in a 16 MiB block for one 32 KiB frame cost more
    /// than decoding it. A second small read of the same window loads the
    /// window (a reader going through the frames of a block), and so does
    /// any read that goes on from the window before.
    fn read_few(
        self: &Arc<Self>,
        offset: u64,
        buf: &mut [u8],
        codes: bool,
    ) -> Result<Option<usize>, TreeError> {
        let Some(key) = self.few_key(offset, buf.len(), codes)? else {
            return Ok(None);
        };
        let fb = self.frame_bytes(codes);
        let (first, last) = (offset / fb, (offset + buf.len() as u64 - 1) / fb);
        let frames = first as usize..last as usize + 1;
        let mut out = vec![0u8; frames.len() * fb as usize];
        let faults = self.file.faults();
        let decoded = if codes {
            self.file.read_frame_codes_le(frames, &mut out)
        } else {
            self.file.read_frames(frames, &mut out)
        };
        decoded.map_err(|e| self.decode_error(e))?;
        if self.file.faults() != faults {
            return Err(self.decode_error(mapguard::CHANGED));
        }
        *self.few.lock().unwrap_or_else(|e| e.into_inner()) = Some(key);
        let n = copy_range(&out, offset - first * fb, buf);
        self.finish_read(offset + n as u64, codes)?;
        Ok(Some(n))
    }

    /// Copies decoded array bytes `[offset, offset + buf.len())` (offsets
    /// into the C-order array) into `buf`.
    pub(super) fn read_dense(
        self: &Arc<Self>,
        offset: u64,
        buf: &mut [u8],
        codes: bool,
    ) -> Result<usize, TreeError> {
        let total = self.frame_bytes(codes) * self.file.frames() as u64;
        self.check_verdict(codes)?;
        if let Some(n) = self.read_few(offset, buf, codes)? {
            return Ok(n);
        }
        let mut done = 0usize;
        while done < buf.len() && offset + (done as u64) < total {
            let (block, from, key) = self.piece(offset + done as u64, codes)?;
            let n = copy_range(&block, from as u64, &mut buf[done..]);
            self.served(key, &block, n);
            done += n;
        }
        if done > 0 {
            self.finish_read(offset + done as u64, codes)?;
        }
        Ok(done)
    }

    /// Decoded array bytes `[offset, offset + len)` lent from the window
    /// that holds them all, when one does (see [`Content::held_at`]); the
    /// same bookkeeping as [`read_dense`](Self::read_dense).
    pub(super) fn held_dense(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        codes: bool,
    ) -> Result<Option<Held>, TreeError> {
        let total = self.frame_bytes(codes) * self.file.frames() as u64;
        let end = offset.saturating_add(len as u64);
        if len == 0 || end > total {
            return Ok(None);
        }
        let (info, window, n) = self.span_of(offset, codes)?;
        let window_end = (info.first_frame + window + n) as u64 * self.frame_bytes(codes);
        if end > window_end {
            return Ok(None);
        }
        if self.few_key(offset, len, codes)?.is_some() {
            return Ok(None);
        }
        self.check_verdict(codes)?;
        let (block, from, key) = self.piece(offset, codes)?;
        self.finish_read(end, codes)?;
        self.served(key, &block, len);
        Ok(Some(Held::new(block, from, len)))
    }

    /// A read reached the end of the decoded float array: the whole array
    /// has now been handed out (to this reader or others), so its
    /// `logical_sha256` must hold before this last piece is. The digest
    /// fed by sequential readers is completed with the blocks it still
    /// lacks (from the cache when they are there), so a sequential read
    /// decodes nothing twice.
    fn check_logical(self: &Arc<Self>, digest: &Mutex<LogicalDigest>) -> Result<(), TreeError> {
        let mut digest = digest
            .lock()
            .map_err(|_| TreeError::Internal("logical digest poisoned".into()))?;
        while self.file.logical_verdict().is_none() {
            let next = digest.next_block();
            if next >= self.file.blocks().len() {
                // (Cannot happen: the last block records the verdict.)
                self.file
                    .verify_logical()
                    .map_err(|e| self.decode_error(e))?;
                break;
            }
            let info = self.file.blocks()[next];
            let (window, n) = self.window_of(&info, digest.next_frame());
            let block = self.window(next, window, false)?;
            digest
                .feed_window(&self.file, next, window..window + n, &block)
                .map_err(|e| self.decode_error(e))?;
        }
        match self.file.logical_verdict() {
            Some(Err(e)) => Err(self.decode_error(e)),
            _ => Ok(()),
        }
    }
}

/// Decoded-block buffers, reused once the cache has let them go. A fresh
/// block-sized buffer costs the kernel a page fault and a cleared page per
/// 4 KiB when it is first written (in a sequential read of `data.npy`,
/// about as much CPU as decoding the block); a reused one costs nothing.
/// The cache holds `Arc`s; this list holds a second reference to the
/// buffers most recently handed out, and one that only the list still holds
/// (evicted, no reader left) is free for the next block. Every byte of a
/// reused buffer is overwritten by the decode. At most [`SPARE_BYTES`] of
/// free buffers are kept, so memory stays within the cache's budget plus
/// that.
struct Recycler {
    handed: Mutex<VecDeque<Arc<BlockBuf>>>,
}

/// Windows read whole that a view remembers not to prefetch (see
/// `QemView::served`): a few more than readers take turns.
const CONSUMED_KEPT: usize = 8;

/// Reads of at most this many frames of a window no one holds decode just
/// those frames (see `QemView::read_few`).
const FEW_FRAMES: u64 = 2;

/// A cursor over a block decoded in windows, between windows: held in the
/// budget by its heap bytes, taken out while it decodes (leaving `None`).
struct IdleCursor {
    cursor: Mutex<Option<BlockCursor>>,
    bytes: usize,
}

/// A cursor's heap (tens of MB for a large detector, in pieces below
/// malloc's mmap threshold) freed by one thread's arena and made again by
/// another's stayed resident in both: a 4 GB block read through a mount
/// with a 256 MiB budget held 150-350 MiB more than the budget after its
/// reads (fs/tests/huge_block.rs). So an evicted cursor's memory is given
/// back to the system as it goes; cursors go at most once per window.
impl IdleCursor {
    /// The cursor and the bytes it is charged, taken out (its drop then
    /// has nothing to give back).
    fn into_parts(mut self) -> Option<(BlockCursor, usize)> {
        let cursor = self
            .cursor
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        cursor.map(|c| (c, self.bytes))
    }
}

impl Drop for IdleCursor {
    fn drop(&mut self) {
        let cursor = self
            .cursor
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(cursor) = cursor {
            drop(cursor);
            super::give_back_freed_memory();
        }
    }
}

impl Charged for IdleCursor {
    fn charge(&self) -> usize {
        self.bytes
    }
}

/// Windows are never smaller than this: tiny budgets (tests of eviction)
/// keep ordinary blocks whole rather than decoding them a few frames at a
/// time.
const MIN_WINDOW_BYTES: usize = 4 << 20;

/// Buffers tracked (older ones are left to the cache alone).
const TRACKED: usize = 256;
/// Free buffers kept beyond those the cache holds.
const SPARE_BYTES: usize = 64 << 20;

/// One list for the process: the cache of a mount is shared by its files.
static RECYCLED: Recycler = Recycler {
    handed: Mutex::new(VecDeque::new()),
};

impl Recycler {
    /// A buffer of `len` bytes: a free one of about that size when there is
    /// one, else a new one (`None`: the system refused it). Its contents
    /// are stale.
    fn take(&self, len: usize) -> Option<BlockBuf> {
        let mut reuse = None;
        {
            let mut handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
            let mut spare = 0usize;
            // Only this list holds a buffer whose count is 1. The cache's
            // weak record of it (an evicted window) can still make a new
            // reference, but `try_unwrap` below and that upgrade are both
            // atomic on the count: either the buffer is reused here or the
            // window is taken back there, never both.
            handed.retain(|b| {
                if Arc::strong_count(b) > 1 {
                    return true;
                }
                // Not much larger (see `BlockBuf::fits`).
                if reuse.is_none() && b.fits(len) {
                    reuse = Some(Arc::clone(b));
                    return false;
                }
                spare += b.capacity();
                spare <= SPARE_BYTES
            });
        }
        match reuse.and_then(|b| Arc::try_unwrap(b).ok()) {
            Some(mut v) => {
                v.set_len(len);
                Some(v)
            }
            None => BlockBuf::zeroed(len),
        }
    }

    /// `block`, shared, and remembered for reuse.
    fn hand_out(&self, block: BlockBuf) -> Arc<BlockBuf> {
        let block = Arc::new(block);
        let mut handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
        handed.push_back(Arc::clone(&block));
        if handed.len() > TRACKED {
            handed.pop_front();
        }
        block
    }
}

/// `data.npy` / `codes.npy`: the npy header, then the decoded array.
struct DenseArray {
    view: Arc<QemView>,
    header: Vec<u8>,
    codes: bool,
}

impl Content for DenseArray {
    fn size(&self) -> u64 {
        let fb = (self.view.file.pixels() * self.view.element_size(self.codes)) as u64;
        self.header.len() as u64 + fb * self.view.file.frames() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let h = self.header.len() as u64;
        let mut done = 0;
        if offset < h {
            done = copy_range(&self.header, offset, buf);
        }
        if done < buf.len() {
            let data_offset = (offset + done as u64).saturating_sub(h);
            done += self
                .view
                .read_dense(data_offset, &mut buf[done..], self.codes)?;
        }
        Ok(done)
    }

    fn held_at(&self, offset: u64, len: usize) -> Result<Option<Held>, TreeError> {
        let h = self.header.len() as u64;
        match offset.checked_sub(h) {
            Some(at) => self.view.held_dense(at, len, self.codes),
            None => Ok(None),
        }
    }
}

/// `data.tiff`: the whole array as the ImageJ hyperstack `qem convert`
/// writes, served by range (Fiji opens it from the mount as it is).
struct DenseTiff {
    view: Arc<QemView>,
    layout: TiffLayout,
}

impl Content for DenseTiff {
    fn size(&self) -> u64 {
        self.layout.total_len()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        self.layout
            .read_at(offset, buf, |at, out| self.view.read_dense(at, out, false))
    }
}

/// One frame as `.npy` or as a single-page TIFF: a fixed prefix, the
/// frame's bytes, and (TIFF) padding.
struct FrameFile {
    view: Arc<QemView>,
    frame: usize,
    prefix: Arc<[u8]>,
    padding: usize,
}

impl Content for FrameFile {
    fn size(&self) -> u64 {
        (self.prefix.len() + self.view.file.frame_bytes() + self.padding) as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let p = self.prefix.len() as u64;
        let fb = self.view.file.frame_bytes() as u64;
        let mut done = 0;
        if offset < p {
            done = copy_range(&self.prefix, offset, buf);
        }
        let at = offset + done as u64;
        if done < buf.len() && at < p + fb {
            let start = self.frame as u64 * fb + (at - p);
            let want = (buf.len() - done).min((p + fb - at) as usize);
            done += self
                .view
                .read_dense(start, &mut buf[done..done + want], false)?;
        }
        let size = self.size();
        let at = offset + done as u64;
        if done < buf.len() && at < size {
            // Zero padding after the pixels.
            let n = (buf.len() - done).min((size - at) as usize);
            buf[done..done + n].fill(0);
            done += n;
        }
        Ok(done)
    }
}

/// `frames/`: one folder per scan row, zero-padded to the widest index.
struct FramesDir {
    view: Arc<QemView>,
    npy_prefix: Arc<[u8]>,
    tiff_prefix: Arc<[u8]>,
    tiff_padding: usize,
}

fn width(count: usize) -> usize {
    count.saturating_sub(1).to_string().len()
}

/// Parses an index below `limit`: zero-padded to exactly `width` digits,
/// as listed, or plain decimal without leading zeros (`frames/3/17.npy`
/// finds `frames/003/017.npy`, as a user types it).
fn padded_index(text: &str, width: usize, limit: usize) -> Option<usize> {
    if text.is_empty() || text.len() > width || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let plain = text == "0" || !text.starts_with('0');
    if text.len() != width && !plain {
        return None;
    }
    text.parse().ok().filter(|&i| i < limit)
}

impl FramesDir {
    fn row(self: &Arc<Self>, row: usize) -> Entry {
        Entry::Dir(Arc::new(FrameRowDir {
            frames: Arc::clone(self),
            row,
        }))
    }
}

impl Directory for Arc<FramesDir> {
    fn lookup(&self, name: &str) -> Option<Entry> {
        let [rows, ..] = self.view.file.shape();
        padded_index(name, width(rows), rows).map(|r| self.row(r))
    }

    fn list(&self) -> Vec<(String, Entry)> {
        self.list_range(0..usize::MAX)
    }

    fn list_range(&self, range: std::ops::Range<usize>) -> Vec<(String, Entry)> {
        let [rows, ..] = self.view.file.shape();
        let w = width(rows);
        (range.start.min(rows)..range.end.min(rows))
            .map(|r| (format!("{r:0w$}"), self.row(r)))
            .collect()
    }
}

struct FrameRowDir {
    frames: Arc<FramesDir>,
    row: usize,
}

impl FrameRowDir {
    fn file(&self, column: usize, tiff: bool) -> Entry {
        let f = &self.frames;
        let [_, columns, ..] = f.view.file.shape();
        let (prefix, padding) = if tiff {
            (Arc::clone(&f.tiff_prefix), f.tiff_padding)
        } else {
            (Arc::clone(&f.npy_prefix), 0)
        };
        Entry::File(Arc::new(FrameFile {
            view: Arc::clone(&f.view),
            frame: self.row * columns + column,
            prefix,
            padding,
        }))
    }
}

impl Directory for FrameRowDir {
    fn lookup(&self, name: &str) -> Option<Entry> {
        let [_, columns, ..] = self.frames.view.file.shape();
        let (stem, tiff) = match name.rsplit_once('.') {
            Some((stem, "npy")) => (stem, false),
            Some((stem, "tiff")) => (stem, true),
            _ => return None,
        };
        padded_index(stem, width(columns), columns).map(|c| self.file(c, tiff))
    }

    fn list(&self) -> Vec<(String, Entry)> {
        self.list_range(0..usize::MAX)
    }

    /// Two entries per column: `C.npy`, then `C.tiff`.
    fn list_range(&self, range: std::ops::Range<usize>) -> Vec<(String, Entry)> {
        let [_, columns, ..] = self.frames.view.file.shape();
        let w = width(columns);
        let total = columns.saturating_mul(2);
        (range.start.min(total)..range.end.min(total))
            .map(|i| {
                let (c, tiff) = (i / 2, i % 2 == 1);
                let ext = if tiff { "tiff" } else { "npy" };
                (format!("{c:0w$}.{ext}"), self.file(c, tiff))
            })
            .collect()
    }
}

/// Builds the directory of an opened `.qem` file.
pub fn directory(
    id: u64,
    source: &Path,
    file: QemFile,
    cache: Arc<Budget>,
    accelerator: Arc<dyn Accelerator>,
    detectors: DetectorOptions,
) -> Result<Arc<dyn Directory>, TreeError> {
    let name = source.display().to_string();
    let logical = file
        .logical_expected()
        .map(|_| Mutex::new(file.logical_digest()));
    let view = Arc::new(QemView {
        id,
        name: name.clone(),
        file,
        cache,
        last_block: AtomicUsize::new(usize::MAX - 1),
        few: Mutex::new(None),
        consumed: Mutex::new(VecDeque::new()),
        logical,
    });
    let file = &view.file;
    let shape = file.shape();
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    // The file as stored, for a local source only: a remote object is read
    // where it is (`qem hash --file` and `sha256` give its identity).
    if crate::remote::Address::of_path(source).is_none() {
        entries.insert(
            "raw.qem".into(),
            Entry::File(Arc::new(Passthrough::new(source, file.file_bytes() as u64))),
        );
    }
    // The two documents that hold the whole header are written from its
    // text when read, and held in the budget; their sizes are found now by
    // writing them to a counter. The header is never parsed into a tree
    // (see `export::json::Stored`).
    type Write = dyn Fn(&QemView, &mut dyn std::io::Write) -> std::io::Result<()> + Send + Sync;
    let header_json: Arc<Write> = Arc::new(|v, out| {
        let text = v.file.header_text().map_err(std::io::Error::other)?;
        crate::export::json::write_pretty(&crate::export::json::Stored(text), out)
    });
    let info = Arc::clone(&accelerator);
    let info_json: Arc<Write> = Arc::new(move |v, out| {
        let doc = super::info_json(&v.file, &*info).map_err(std::io::Error::other)?;
        crate::export::json::write_pretty(&doc, out)
    });
    for (name, write) in [("header.json", header_json), ("info.json", info_json)] {
        let write = move |v: &QemView, out: &mut dyn std::io::Write| {
            let faults = v.file.faults();
            let written = write(v, out);
            if v.file.faults() != faults {
                return Err(TreeError::SourceChanged);
            }
            written.map_err(|e| v.decode_error(e))
        };
        let mut size = crate::export::json::Counted::default();
        write(&view, &mut size)?;
        let v = Arc::clone(&view);
        let make = move || {
            let mut bytes = Vec::with_capacity(size.0 as usize);
            write(&v, &mut bytes)?;
            Ok(bytes)
        };
        entries.insert(
            name.into(),
            Entry::File(Arc::new(Lazy::new(&view.cache, id, size.0, make))),
        );
    }
    let (v, source_path) = (Arc::clone(&view), source.to_path_buf());
    entries.insert(
        "sha256".into(),
        Entry::File(Arc::new(Lazy::new(&view.cache, id, 65, move || {
            let digest = v
                .file
                .file_sha256_hex(&source_path)
                .ok_or(TreeError::SourceChanged)?;
            Ok(format!("{digest}\n").into_bytes())
        }))),
    );
    let v = Arc::clone(&view);
    entries.insert(
        "logical_sha256".into(),
        Entry::File(Arc::new(Lazy::new(&view.cache, id, 65, move || {
            // Float files: refused when it disagrees with logical_sha256.
            let mut digest = v.file.logical_digest();
            for block in v.file.blocks() {
                let mut window = 0;
                while window < block.frames {
                    let (_, n) = v.window_of(block, window);
                    let bytes = v.window(block.index, window, false)?;
                    digest
                        .feed_window(&v.file, block.index, window..window + n, &bytes)
                        .map_err(|e| v.decode_error(e))?;
                    window += n;
                }
            }
            let actual = digest.finish(&v.file).map_err(|e| v.decode_error(e))?;
            Ok(format!("{actual}\n").into_bytes())
        }))),
    );
    entries.insert(
        "data.npy".into(),
        Entry::File(Arc::new(DenseArray {
            view: Arc::clone(&view),
            header: npy::encode_header(npy_dtype(file.decoded_dtype()), &shape),
            codes: false,
        })),
    );
    if file.codec() == Codec::Scaled {
        entries.insert(
            "codes.npy".into(),
            Entry::File(Arc::new(DenseArray {
                view: Arc::clone(&view),
                header: npy::encode_header(DType::U16, &shape),
                codes: true,
            })),
        );
    }

    // data.npy keeps invalid pixels' stored values; this is how a reader
    // leaves them out (`data.sum(where=mask)`).
    if let Some(mask) = file.valid_mask() {
        let header = npy::encode_header(DType::Bool, &shape[2..]);
        let size = (header.len() + mask.pixels()) as u64;
        let mask = mask.clone();
        entries.insert(
            "mask.npy".into(),
            Entry::File(Arc::new(Lazy::new(&view.cache, id, size, move || {
                let mut out = header.clone();
                out.extend(mask.flags());
                Ok(out)
            }))),
        );
    }

    let source_name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    entries.insert(
        "data.zarr".into(),
        Entry::Dir(zarr_view::directory(&view, &source_name)),
    );

    let sample = match file.decoded_dtype() {
        Dtype::U8 => Sample::U8,
        Dtype::U16 => Sample::U16,
        Dtype::F32 => Sample::F32,
    };
    let tiff = TiffLayout::new(
        shape[2] as u32,
        shape[3] as u32,
        sample,
        &Sampling::frame(file),
    )
    .ok_or_else(|| TreeError::Internal("a frame too large for TIFF".into()))?;
    // Absent only for shapes whose TIFF would not fit 64-bit offsets.
    if let Some(layout) = TiffLayout::new(
        shape[2] as u32,
        shape[3] as u32,
        sample,
        &Sampling::acquisition(file),
    ) {
        entries.insert(
            "data.tiff".into(),
            Entry::File(Arc::new(DenseTiff {
                view: Arc::clone(&view),
                layout,
            })),
        );
    }
    let frames = Arc::new(FramesDir {
        view: Arc::clone(&view),
        npy_prefix: Arc::from(npy::encode_header(
            npy_dtype(file.decoded_dtype()),
            &shape[2..],
        )),
        tiff_prefix: Arc::from(tiff.prefix()),
        tiff_padding: (tiff.total_len() - tiff.page_data_offset(1)) as usize,
    });
    entries.insert("frames".into(), Entry::Dir(Arc::new(frames)));

    entries.insert(
        "virtual".into(),
        Entry::Dir(virtual_dir::directory(
            Arc::clone(&view),
            accelerator,
            detectors,
        )),
    );
    let xattrs = vec![
        (
            "user.qem.codec".to_string(),
            file.codec().id().as_bytes().to_vec(),
        ),
        (
            "user.qem.shape".to_string(),
            format!("{},{},{},{}", shape[0], shape[1], shape[2], shape[3]).into_bytes(),
        ),
        (
            "user.qem.dtype".to_string(),
            file.decoded_dtype().name().as_bytes().to_vec(),
        ),
        (
            "user.qem.stored_dtype".to_string(),
            file.stored_dtype().name().as_bytes().to_vec(),
        ),
    ];
    Ok(Arc::new(StaticDir::new(entries).with_xattrs(xattrs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recycler() -> Recycler {
        Recycler {
            handed: Mutex::new(VecDeque::new()),
        }
    }

    fn filled(len: usize, byte: u8) -> BlockBuf {
        let mut b = BlockBuf::zeroed(len).unwrap();
        b.fill(byte);
        b
    }

    /// A buffer is reused only once nothing but the list holds it: never
    /// while the cache or a reader still does (its bytes are being served).
    #[test]
    fn buffers_are_reused_only_when_let_go() {
        let r = recycler();
        let held = r.hand_out(filled(1000, 7));
        let fresh = r.take(1000).unwrap();
        assert_ne!(fresh.as_ptr(), held.as_ptr(), "a held buffer was reused");
        assert_eq!(held[..], [7u8; 1000]);
        let at = held.as_ptr();
        drop(held);
        let reused = r.take(900).unwrap();
        assert_eq!((reused.as_ptr(), reused.len()), (at, 900));
        // Too small, or much larger than asked (the cache would weigh it
        // by the smaller length): left alone, and a new one made.
        let small = r.hand_out(filled(10, 0));
        let large = r.hand_out(filled(4000, 0));
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        drop((small, large));
        let got = r.take(20).unwrap();
        assert_eq!(got.len(), 20);
        assert!(got.as_ptr() != small_at && got.as_ptr() != large_at);
        let again = r.take(3500).unwrap();
        assert_eq!(again.as_ptr(), large_at);
    }

    /// Free buffers beyond the spare allowance are released, not kept.
    #[test]
    fn spare_buffers_are_bounded() {
        let r = recycler();
        for _ in 0..8 {
            drop(r.hand_out(filled(16 << 20, 0)));
        }
        let _ = r.take(1);
        let kept: usize = r.handed.lock().unwrap().iter().map(|b| b.capacity()).sum();
        assert!(kept <= SPARE_BYTES, "{kept} bytes of free buffers kept");
    }
}
