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

/// The two slab loops, [`frame_moments`] and [`add_pattern`], compiled for
/// the library's vector width (`qem::lanes::width`; the crate's baseline,
/// SSE2, held the loops to 4 values at a time), chosen once.
struct SlabFns {
    moments: MomentsFn,
    pattern: PatternFn,
}

type MomentsFn = fn(&[u16], &[u16], usize, usize) -> (u64, u64, u64);
type PatternFn = fn(&[u16], &[u16], &mut [u32], &mut [u16]);

fn slab_fns() -> SlabFns {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        fn moments512(v: &[u16], m: &[u16], c: usize, r0: usize) -> (u64, u64, u64) {
            frame_moments::<64>(v, m, c, r0)
        }
        #[target_feature(enable = "avx512f,avx512bw")]
        fn pattern512(v: &[u16], m: &[u16], s: &mut [u32], x: &mut [u16]) {
            add_pattern(v, m, s, x)
        }
        #[target_feature(enable = "avx2")]
        fn moments256(v: &[u16], m: &[u16], c: usize, r0: usize) -> (u64, u64, u64) {
            frame_moments::<32>(v, m, c, r0)
        }
        #[target_feature(enable = "avx2")]
        fn pattern256(v: &[u16], m: &[u16], s: &mut [u32], x: &mut [u16]) {
            add_pattern(v, m, s, x)
        }
        use crate::qem::lanes::{width, Width};
        if width() == Width::Avx512 {
            // SAFETY: the library's width is AVX-512 only where the CPU
            // has these features (`lanes::width`).
            return SlabFns {
                moments: |v, m, c, r0| unsafe { moments512(v, m, c, r0) },
                pattern: |v, m, s, x| unsafe { pattern512(v, m, s, x) },
            };
        }
        if width() == Width::Avx2 {
            // SAFETY: the library's width is AVX2 only where the CPU has
            // it (`lanes::width`).
            return SlabFns {
                moments: |v, m, c, r0| unsafe { moments256(v, m, c, r0) },
                pattern: |v, m, s, x| unsafe { pattern256(v, m, s, x) },
            };
        }
    }
    SlabFns {
        moments: frame_moments::<16>,
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

/// `(Σ v, Σ row·v, Σ column·v)` of one frame's rows `values & mask` (rows
/// of `c` pixels, the first numbered `r0`), `RUN` columns at a time held
/// in registers down the rows: per column, `acc` sums the rows so far and
/// `below` adds `acc` before each row, ending as Σ v_j·(rows after j), so
/// that Σ row·v = (last row)·Σ v − Σ below without a horizontal sum per
/// row (the loop this replaced added each row's columns into memory and
/// summed the row). Bands of 256 rows keep `below` within u32 (at most
/// 65535 · 255 · 256 / 2 < 2^32).
#[inline(always)]
fn frame_moments<const RUN: usize>(
    values: &[u16],
    mask: &[u16],
    c: usize,
    r0: usize,
) -> (u64, u64, u64) {
    const BAND: usize = 256;
    let h = values.len() / c.max(1);
    let (mut total, mut by_row, mut by_column) = (0u64, 0u64, 0u64);
    for b0 in (0..h).step_by(BAND) {
        let b1 = (b0 + BAND).min(h);
        let last = (r0 + b1 - 1) as u64;
        for x0 in (0..c).step_by(RUN) {
            let n = RUN.min(c - x0);
            let (mut acc, mut below) = ([0u32; RUN], [0u32; RUN]);
            if n == RUN {
                // A run of constant length: the compiler keeps it in registers.
                for r in b0..b1 {
                    let v = &values[r * c + x0..][..RUN];
                    let m = &mask[r * c + x0..][..RUN];
                    for i in 0..RUN {
                        below[i] += acc[i];
                        acc[i] += u32::from(v[i] & m[i]);
                    }
                }
            } else {
                for r in b0..b1 {
                    let v = &values[r * c + x0..][..n];
                    let m = &mask[r * c + x0..][..n];
                    for i in 0..n {
                        below[i] += acc[i];
                        acc[i] += u32::from(v[i] & m[i]);
                    }
                }
            }
            for (i, (&a, &b)) in acc[..n].iter().zip(&below[..n]).enumerate() {
                let (a, b) = (u64::from(a), u64::from(b));
                total += a;
                by_row += last * a - b;
                by_column += (x0 + i) as u64 * a;
            }
        }
    }
    (total, by_row, by_column)
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
        moments: frame_moments,
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
        let frames: Vec<(u64, u64, u64)> = values
            .chunks_exact(w)
            .map(|frame| frame_moments(frame, mask, c, rows.start))
            .collect();
        let Ok(mut acc) = acc.lock() else { return };
        for (t, (total, by_row, by_column)) in (t0..).zip(frames) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The moments of every run width the slab functions use equal a plain
    /// sum over the pixels: detectors narrower than a run, with a tail,
    /// and taller than a band of rows; invalid pixels; every count 65535
    /// (the largest the running sums of a band must hold).
    #[test]
    fn frame_moments_equal_the_sums_over_pixels() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (h, c, r0) in [
            (7, 13, 0),
            (9, 64, 5),
            (300, 70, 16),
            (513, 33, 0),
            (260, 128, 3),
        ] {
            for saturated in [false, true] {
                let values: Vec<u16> = (0..h * c)
                    .map(|_| {
                        if saturated {
                            u16::MAX
                        } else {
                            (next() % 70_000).min(65_535) as u16
                        }
                    })
                    .collect();
                let mask: Vec<u16> = (0..h * c)
                    .map(|p| if p % 11 == 4 { 0 } else { u16::MAX })
                    .collect();
                let mut want = (0u64, 0u64, 0u64);
                for (p, (&v, &m)) in values.iter().zip(&mask).enumerate() {
                    let v = u64::from(v & m);
                    want.0 += v;
                    want.1 += (r0 + p / c) as u64 * v;
                    want.2 += (p % c) as u64 * v;
                }
                let what = format!("{h}x{c} from row {r0}, saturated {saturated}");
                assert_eq!(
                    frame_moments::<16>(&values, &mask, c, r0),
                    want,
                    "{what}, run 16"
                );
                assert_eq!(
                    frame_moments::<32>(&values, &mask, c, r0),
                    want,
                    "{what}, run 32"
                );
                assert_eq!(
                    frame_moments::<64>(&values, &mask, c, r0),
                    want,
                    "{what}, run 64"
                );
            }
        }
    }
}
