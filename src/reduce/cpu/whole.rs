//! Patterns and moments of the exact codecs (counts, scaled codes): every
//! valid pixel of every frame is needed, so each block is decoded whole by
//! the cursor every other reader uses (the frame-major kernels, the
//! spatial index checked on the way) and each slab of frames is reduced
//! while it is in cache ([`Output::Visit`]). Integer sums do not depend on
//! the order they are added in, so parts and blocks reduce in parallel.
//!
//! Before, these requests decoded each group of pixels stream by stream and
//! checked the index from the columns: the centre of mass, mean and
//! maximum patterns of a 128×128 × 128² acquisition took 0.39 s of which
//! the decode was a third.

use std::ops::Range;
use std::sync::Mutex;

use rayon::prelude::*;

use super::super::accelerator::{Partial, ReduceError, Request, Values};
use super::Plan;
use crate::qem::block::Output;
use crate::qem::QemFile;

/// The moments of one block: per frame (block-relative) the total, row
/// and column moments.
struct BlockSums {
    total: Vec<u64>,
    row: Vec<u64>,
    column: Vec<u64>,
}

/// The pattern's sum and maximum over every detector pixel, in u32 while
/// at most [`Patterns::FRAMES`] frames have been added (a u16 count times
/// that fits).
struct Pattern {
    sum: Vec<u32>,
    max: Vec<u16>,
    frames: usize,
}

/// The pattern of a whole request, gathered in a few [`Pattern`]s that
/// the slabs take in turn (one per thread at work, however many slabs and
/// blocks), and in u64 totals they are emptied into when full and at the
/// end. Before, each slab (32 frames) zeroed a pattern of its own and
/// added it to its block's u64 sums under a lock, and each block's sums
/// were added again to the request's: 16 merges of the whole detector per
/// block where there is now about one per 65,536 frames per thread.
struct Patterns {
    pixels: usize,
    idle: Mutex<Vec<Pattern>>,
    totals: Mutex<(Vec<u64>, Vec<u16>)>,
}

impl Patterns {
    /// Frames a u32 pattern sum holds whatever the counts.
    const FRAMES: usize = 1 << 16;

    fn new(pixels: usize) -> Self {
        Patterns {
            pixels,
            idle: Mutex::new(Vec::new()),
            totals: Mutex::new((vec![0; pixels], vec![0; pixels])),
        }
    }

    /// A pattern that `k` more frames can be added to: an idle one, else a
    /// new one.
    fn take(&self, k: usize) -> Pattern {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut pattern = idle.unwrap_or_else(|| Pattern {
            sum: vec![0; self.pixels],
            max: vec![0; self.pixels],
            frames: 0,
        });
        if pattern.frames + k > Self::FRAMES {
            self.empty(&mut pattern);
        }
        pattern
    }

    fn put(&self, pattern: Pattern) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(pattern);
        }
    }

    /// Adds `pattern` to the totals and zeroes it.
    fn empty(&self, pattern: &mut Pattern) {
        if let Ok(mut totals) = self.totals.lock() {
            let (sums, maxima) = &mut *totals;
            for (((a, top), s), v) in sums
                .iter_mut()
                .zip(maxima.iter_mut())
                .zip(&mut pattern.sum)
                .zip(&mut pattern.max)
            {
                *a += u64::from(*s);
                *top = (*top).max(*v);
                (*s, *v) = (0, 0);
            }
        }
        pattern.frames = 0;
    }

    /// Every pattern's sum and maximum added up. A lock poisoned by a
    /// thread that panicked holding it may have lost a pattern (`put` and
    /// `empty` skip a poisoned lock): an error, never a partial sum.
    fn finish(self) -> Result<(Vec<u64>, Vec<u64>), ReduceError> {
        let panicked = || ReduceError::Unsupported("a reduction thread panicked".into());
        let idle = std::mem::take(&mut *self.idle.lock().map_err(|_| panicked())?);
        for mut pattern in idle {
            self.empty(&mut pattern);
        }
        let (sum, max) = self.totals.into_inner().map_err(|_| panicked())?;
        Ok((sum, max.into_iter().map(u64::from).collect()))
    }
}

/// The two slab loops, [`reduce_line`] and [`add_pattern`], compiled for
/// the widest vectors the CPU has (the crate's baseline, SSE2, held the
/// loops to 4 values at a time), chosen once.
struct SlabFns {
    line: fn(&[u16], &[u16], &mut [u32]) -> u64,
    pattern: PatternFn,
}

type PatternFn = fn(&[u16], &[u16], &mut [u32], &mut [u16]);

fn slab_fns() -> SlabFns {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        fn line512(v: &[u16], m: &[u16], c: &mut [u32]) -> u64 {
            reduce_line(v, m, c)
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        fn pattern512(v: &[u16], m: &[u16], s: &mut [u32], x: &mut [u16]) {
            add_pattern(v, m, s, x)
        }
        #[target_feature(enable = "avx2")]
        fn line256(v: &[u16], m: &[u16], c: &mut [u32]) -> u64 {
            reduce_line(v, m, c)
        }
        #[target_feature(enable = "avx2")]
        fn pattern256(v: &[u16], m: &[u16], s: &mut [u32], x: &mut [u16]) {
            add_pattern(v, m, s, x)
        }
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            // SAFETY: the features were detected just above.
            return SlabFns {
                line: |v, m, c| unsafe { line512(v, m, c) },
                pattern: |v, m, s, x| unsafe { pattern512(v, m, s, x) },
            };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was detected just above.
            return SlabFns {
                line: |v, m, c| unsafe { line256(v, m, c) },
                pattern: |v, m, s, x| unsafe { pattern256(v, m, s, x) },
            };
        }
    }
    SlabFns {
        line: reduce_line,
        pattern: add_pattern,
    }
}

/// Pixels of the pattern [`add_pattern`] holds in registers while it adds
/// a slab's frames.
const PATTERN_RUN: usize = 64;

/// Every frame of `frames` (each `mask.len()` pixels), `values & mask`,
/// added to `sum` and `max`: a run of pixels at a time, over every frame
/// of the slab, so that the pattern is read and written once per slab
/// rather than once per frame (where its stores, a whole detector's worth
/// per frame, were the reduction's largest cost).
#[inline(always)]
fn add_pattern(frames: &[u16], mask: &[u16], sum: &mut [u32], max: &mut [u16]) {
    let w = mask.len();
    for x0 in (0..w).step_by(PATTERN_RUN) {
        let n = PATTERN_RUN.min(w - x0);
        let (sum, max, mask) = (
            &mut sum[x0..x0 + n],
            &mut max[x0..x0 + n],
            &mask[x0..x0 + n],
        );
        if n == PATTERN_RUN {
            // A run of constant length: the compiler keeps it in registers.
            let (mut s, mut top) = ([0u32; PATTERN_RUN], [0u16; PATTERN_RUN]);
            let mask = &mask[..PATTERN_RUN];
            s.copy_from_slice(sum);
            top.copy_from_slice(max);
            for frame in frames.chunks_exact(w) {
                let v = &frame[x0..x0 + PATTERN_RUN];
                for i in 0..PATTERN_RUN {
                    let v = v[i] & mask[i];
                    s[i] += u32::from(v);
                    top[i] = top[i].max(v);
                }
            }
            sum.copy_from_slice(&s);
            max.copy_from_slice(&top);
        } else {
            for frame in frames.chunks_exact(w) {
                for (((&v, &m), s), top) in frame[x0..x0 + n]
                    .iter()
                    .zip(mask)
                    .zip(&mut *sum)
                    .zip(&mut *max)
                {
                    let v = v & m;
                    *s += u32::from(v);
                    *top = (*top).max(v);
                }
            }
        }
    }
}

/// One detector row of one frame, `values & mask`: added to `columns`
/// (column sums); returns the row's sum. One pass, which the compiler
/// vectorises, in u32 over pieces too short to overflow.
#[inline(always)]
fn reduce_line(values: &[u16], mask: &[u16], columns: &mut [u32]) -> u64 {
    let mut total = 0u64;
    for (i, (values, mask)) in values.chunks(1 << 16).zip(mask.chunks(1 << 16)).enumerate() {
        let span = i << 16..(i << 16) + values.len();
        let mut s = 0u32;
        for ((&v, &m), col) in values.iter().zip(mask).zip(&mut columns[span]) {
            let v = v & m;
            s += u32::from(v);
            *col += u32::from(v);
        }
        total += u64::from(s);
    }
    total
}

/// `Σ x · columns[x]`.
fn weighted(columns: &[u32]) -> u64 {
    columns
        .iter()
        .enumerate()
        .map(|(x, &s)| x as u64 * u64::from(s))
        .sum()
}

/// Reduces block `b` (every frame) for `request`: `valid` holds `0xFFFF`
/// at valid pixels and 0 at invalid ones. Returns its moments; its
/// pattern goes to `patterns` (when the request has one). `spread`: its
/// parts are decoded by several threads.
fn block_sums(
    file: &QemFile,
    b: usize,
    request: &Request,
    valid: &[u16],
    patterns: &Patterns,
    spread: bool,
) -> Result<BlockSums, ReduceError> {
    let info = &file.blocks()[b];
    let m = info.frames;
    let [_, _, _, c] = file.shape();
    let (moments, pattern) = (request.moments, request.pattern);
    let per_frame = if moments { m } else { 0 };
    let acc = Mutex::new(BlockSums {
        total: vec![0; per_frame],
        row: vec![0; per_frame],
        column: vec![0; per_frame],
    });
    // One slab of one part: its frames reduced here into a pattern taken
    // from `patterns`, its moments then added to the block's under the
    // lock (a few values per frame).
    let SlabFns {
        line: reduce_line,
        pattern: add_pattern,
    } = slab_fns();
    let visit = |rows: Range<usize>, t0: usize, values: &[u16]| {
        let (p0, w) = (rows.start * c, rows.len() * c);
        if w == 0 {
            return;
        }
        let mask = &valid[p0..p0 + w];
        let k = values.len() / w;
        // Slabs are a few frames (`frame_major::SLAB`): u32 pattern sums.
        debug_assert!(k <= 1 << 16);
        if pattern {
            let mut p = patterns.take(k);
            add_pattern(values, mask, &mut p.sum[p0..p0 + w], &mut p.max[p0..p0 + w]);
            p.frames += k;
            patterns.put(p);
        }
        if !moments {
            return;
        }
        let mut frame_moments = Vec::with_capacity(k);
        let mut columns = vec![0u32; c];
        for frame in values.chunks_exact(w) {
            // Σ I and Σ row·I from each detector row's sum, Σ column·I from
            // column sums, in u32 over bands of at most 65,536 rows.
            let (mut total, mut by_row, mut by_column) = (0u64, 0u64, 0u64);
            columns.fill(0);
            for (line_no, r) in rows.clone().enumerate() {
                if line_no > 0 && line_no % (1 << 16) == 0 {
                    by_column += weighted(&columns);
                    columns.fill(0);
                }
                let at = line_no * c..(line_no + 1) * c;
                let s = reduce_line(&frame[at.clone()], &mask[at], &mut columns);
                total += s;
                by_row += r as u64 * s;
            }
            by_column += weighted(&columns);
            frame_moments.push((total, by_row, by_column));
        }
        let Ok(mut acc) = acc.lock() else { return };
        for (t, (total, by_row, by_column)) in (t0..).zip(frame_moments) {
            acc.total[t] += total;
            acc.row[t] += by_row;
            acc.column[t] += by_column;
        }
    };
    file.decode_block_frames(info, 0..m, Output::Visit(&visit), spread)?;
    acc.into_inner()
        .map_err(|_| ReduceError::Unsupported("a reduction thread panicked".into()))
}

/// [`Request`]s without masks over `blocks` of an integer or scaled file;
/// `plan` holds every valid pixel (as moments or a pattern need).
pub(super) fn reduce(
    file: &QemFile,
    blocks: Range<usize>,
    request: &Request,
    plan: &Plan,
) -> Result<Partial, ReduceError> {
    let p_count = file.pixels();
    let mut valid = vec![0u16; p_count];
    for &p in &plan.pixels {
        valid[p] = u16::MAX;
    }
    let per_frame = if request.moments { plan.frames } else { 0 };
    let [mut total, mut row, mut column] = [(); 3].map(|_| Vec::with_capacity(per_frame));
    let patterns = Patterns::new(if request.pattern { p_count } else { 0 });
    // As many blocks at once as there are threads, each decoded by one
    // (its frames in one part); a run shorter than that spreads each
    // block's parts over the threads instead.
    let threads = rayon::current_num_threads().max(1);
    let all: Vec<usize> = blocks.collect();
    for group in all.chunks(threads) {
        let spread = group.len() < threads;
        let sums: Vec<BlockSums> = if spread {
            group
                .iter()
                .map(|&b| block_sums(file, b, request, &valid, &patterns, true))
                .collect::<Result<_, _>>()?
        } else {
            group
                .par_iter()
                .map(|&b| block_sums(file, b, request, &valid, &patterns, false))
                .collect::<Result<_, _>>()?
        };
        for s in sums {
            total.extend_from_slice(&s.total);
            row.extend_from_slice(&s.row);
            column.extend_from_slice(&s.column);
        }
    }
    let (sum, max) = patterns.finish()?;
    Ok(super::partial(
        request,
        Vec::new(),
        [total, row, column],
        [sum, max],
        Values::Exact,
    ))
}
