//! The spatial index of the integer codec (§6.3): per frame, exact sums of
//! valid counts over 8×8 tiles then 32×32 tiles, bit-packed per block and
//! field. Read without decoding any count stream; recomputed from decoded
//! counts to verify it.

use super::header::ValidMask;
use super::lanes::{self, Width};

/// Tile families of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tile {
    /// 8×8 detector tiles (fields `0..tiles8`).
    Px8,
    /// 32×32 detector tiles (the fields after the 8×8 ones).
    Px32,
}

impl Tile {
    pub fn edge(self) -> usize {
        match self {
            Tile::Px8 => 8,
            Tile::Px32 => 32,
        }
    }

    /// `(tile rows, tile columns)` for an `r × c` detector.
    pub fn grid(self, r: usize, c: usize) -> (usize, usize) {
        (r.div_ceil(self.edge()), c.div_ceil(self.edge()))
    }

    /// Index of this family's first field within a frame's fields.
    pub fn first_field(self, r: usize, c: usize) -> usize {
        match self {
            Tile::Px8 => 0,
            Tile::Px32 => {
                let (a, b) = Tile::Px8.grid(r, c);
                a * b
            }
        }
    }
}

/// Field index of every pixel for both families: `(8×8 field, 32×32 field)`.
pub(crate) fn pixel_fields(r: usize, c: usize) -> Vec<(u32, u32)> {
    let (_, c8) = Tile::Px8.grid(r, c);
    let (_, c32) = Tile::Px32.grid(r, c);
    let base32 = Tile::Px32.first_field(r, c);
    let mut out = Vec::with_capacity(r * c);
    for row in 0..r {
        for col in 0..c {
            let f8 = (row / 8) * c8 + col / 8;
            let f32_ = base32 + (row / 32) * c32 + col / 32;
            out.push((f8 as u32, f32_ as u32));
        }
    }
    out
}

/// Sums of valid counts per field from pixel-major counts (`m` per pixel):
/// `out[t * m + k]` is field `t` of block frame `k`. The tests' reference
/// for the slab-wise sums.
#[cfg(test)]
pub(crate) fn sums_from_columns(
    columns: &[u16],
    m: usize,
    fields: usize,
    pixel_fields: &[(u32, u32)],
    valid: &ValidMask,
) -> Vec<u64> {
    let mut out = vec![0u64; fields * m];
    for (p, col) in columns.chunks_exact(m).enumerate() {
        if !valid.is_valid(p) {
            continue;
        }
        let (f8, f32_) = pixel_fields[p];
        for t in [f8 as usize, f32_ as usize] {
            for (acc, &v) in out[t * m..(t + 1) * m].iter_mut().zip(col) {
                *acc += u64::from(v);
            }
        }
    }
    out
}

/// 8×8-tile sums of valid counts from frame-major frames, for checking a
/// block's index slab by slab while the slab is in cache. Covers the
/// detector rows `rows` (whole 8-row bands, so that several summers can
/// split a detector between threads). The 32×32 tiles are filled in
/// afterwards from the 8×8 ones ([`fill_large_tiles`]).
pub(crate) struct FrameSums {
    cols: usize,
    /// Pixels of the covered rows: 1 when valid, else 0.
    weights: Vec<i16>,
    /// Per 8×8 tile of the covered rows: 32768 × its valid pixels (what
    /// the vector paths' signed sums lack, see [`band_avx512`]).
    bias: Vec<u32>,
    /// Column sums of one band (the portable path's scratch).
    band: Vec<u32>,
    path: SumPath,
    /// Every covered pixel is valid: the vector paths multiply by a
    /// register of ones instead of loading the weights (half the bytes
    /// read per count).
    uniform: bool,
}

/// How a band's tiles are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SumPath {
    Portable,
    Avx2,
    Avx512,
}

impl SumPath {
    #[cfg(test)]
    pub(crate) const ALL: [SumPath; 3] = [SumPath::Avx512, SumPath::Avx2, SumPath::Portable];

    pub(crate) fn available(self) -> bool {
        match self {
            SumPath::Portable => true,
            #[cfg(target_arch = "x86_64")]
            SumPath::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            SumPath::Avx512 => {
                is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The path of the library's vector width ([`lanes::width`]).
    fn best() -> SumPath {
        match lanes::width() {
            Width::Avx512 => SumPath::Avx512,
            Width::Avx2 => SumPath::Avx2,
            Width::Portable => SumPath::Portable,
        }
    }
}

impl FrameSums {
    /// Sums over detector rows `rows` of an `r × c` detector (`rows.start`
    /// a multiple of 8).
    pub(crate) fn new(c: usize, rows: std::ops::Range<usize>, valid: &ValidMask) -> Self {
        Self::with_path(c, rows, valid, SumPath::best())
    }

    pub(crate) fn with_path(
        c: usize,
        rows: std::ops::Range<usize>,
        valid: &ValidMask,
        path: SumPath,
    ) -> Self {
        debug_assert!(rows.start.is_multiple_of(8));
        assert!(path.available(), "{path:?} sums not available");
        let base = rows.start * c;
        let weights: Vec<i16> = (base..rows.end * c)
            .map(|p| i16::from(valid.is_valid(p)))
            .collect();
        let g8c = c.div_ceil(8);
        let mut bias = vec![0u32; rows.len().div_ceil(8) * g8c];
        // Row by row: no division per pixel (one is made for every block a
        // thread decodes).
        for (y, row) in weights.chunks(c.max(1)).enumerate() {
            for (x, &w) in row.iter().enumerate() {
                bias[y / 8 * g8c + x / 8] += 32768 * w as u32;
            }
        }
        let uniform = weights.iter().all(|&w| w == 1);
        FrameSums {
            cols: c,
            weights,
            bias,
            band: vec![0; c],
            path,
            uniform,
        }
    }

    /// Heap bytes held (the rows' weights, the tiles' biases and one band
    /// of sums).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.weights.capacity() * 2 + (self.bias.capacity() + self.band.capacity()) * 4
    }

    /// 8×8 tiles of the covered rows: per frame, `bands * ceil(c / 8)`.
    pub(crate) fn tiles(&self) -> usize {
        (self.weights.len() / self.cols.max(1)).div_ceil(8) * self.cols.div_ceil(8)
    }

    /// Adds the 8×8 sums of `frames` (`k` frames of the covered rows,
    /// little-endian u16 counts) as frames `t0..t0 + k`: `out[frame *
    /// tiles() + i]` is tile `i` of the covered rows, in tile-row order (so
    /// that each frame's sums are one run). An 8×8 tile sums at most 64
    /// u16 counts, so u32 holds it exactly.
    pub(crate) fn add(&mut self, frames: &[u16], t0: usize, out: &mut [u32]) {
        let tiles = self.tiles();
        if self.weights.is_empty() || tiles == 0 {
            return;
        }
        let k = frames.len() / self.weights.len();
        let out = &mut out[t0 * tiles..(t0 + k) * tiles];
        let frames = &frames[..k * self.weights.len()];
        match self.path {
            // SAFETY: the features are present (asserted at `with_path`);
            // the band functions read and write only within the slices.
            #[cfg(target_arch = "x86_64")]
            SumPath::Avx512 => unsafe { add_avx512(self, frames, out) },
            #[cfg(target_arch = "x86_64")]
            SumPath::Avx2 => unsafe { add_avx2(self, frames, out) },
            _ => {
                let c = self.cols;
                let mut band = std::mem::take(&mut self.band);
                self.each_band(frames, out, |rows, weights, _, sums| {
                    band_portable(&mut band, rows, weights, c, sums)
                });
                self.band = band;
            }
        }
    }

    /// Calls `f(band rows, their weights, their tiles' bias, their tile
    /// sums)` for every band of every frame of `frames`.
    #[inline(always)]
    fn each_band(
        &self,
        frames: &[u16],
        out: &mut [u32],
        mut f: impl FnMut(&[u16], &[i16], &[u32], &mut [u32]),
    ) {
        let (c, tiles) = (self.cols, self.tiles());
        let g8c = c.div_ceil(8);
        for (frame, sums) in frames
            .chunks_exact(self.weights.len())
            .zip(out.chunks_exact_mut(tiles))
        {
            let bands = frame.chunks(8 * c).zip(self.weights.chunks(8 * c));
            for (by, (rows, weights)) in bands.enumerate() {
                let at = by * g8c..(by + 1) * g8c;
                f(rows, weights, &self.bias[at.clone()], &mut sums[at]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn add_avx512(s: &FrameSums, frames: &[u16], out: &mut [u32]) {
    let c = s.cols;
    if s.uniform {
        s.each_band(frames, out, |rows, weights, bias, sums| unsafe {
            band_avx512::<true>(rows, weights, c, bias, sums)
        });
    } else {
        s.each_band(frames, out, |rows, weights, bias, sums| unsafe {
            band_avx512::<false>(rows, weights, c, bias, sums)
        });
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_avx2(s: &FrameSums, frames: &[u16], out: &mut [u32]) {
    let c = s.cols;
    if s.uniform {
        s.each_band(frames, out, |rows, weights, bias, sums| unsafe {
            band_avx2::<true>(rows, weights, c, bias, sums)
        });
    } else {
        s.each_band(frames, out, |rows, weights, bias, sums| unsafe {
            band_avx2::<false>(rows, weights, c, bias, sums)
        });
    }
}

/// Tile sums of one band (`rows`: at most 8 rows of `c` counts) into
/// `sums` (one per 8 columns), 128 then 32 columns at a time. `vpmaddwd` multiplies
/// signed words, so each count is offset by -32768 (its top bit flipped),
/// multiplied by its weight and summed in pairs; `bias` gives each tile
/// back 32768 per valid pixel. Every partial sum lies within ±2^22: exact.
/// `UNIFORM`: every weight is 1 (a register, not loaded).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn band_avx512<const UNIFORM: bool>(
    rows: &[u16],
    weights: &[i16],
    c: usize,
    bias: &[u32],
    sums: &mut [u32],
) {
    use std::arch::x86_64::*;
    let h = rows.len() / c;
    assert!(weights.len() >= h * c && sums.len() == c.div_ceil(8) && bias.len() == sums.len());
    let flip = _mm512_set1_epi16(i16::MIN);
    let ones = _mm512_set1_epi16(1);
    // 128 columns (16 tiles) at a time: four accumulators, reduced together
    // and stored with their biases as one register.
    let wide = c - c % 128;
    for x0 in (0..wide).step_by(128) {
        let mut acc = [_mm512_setzero_si512(); 4];
        for y in 0..h {
            let at = y * c + x0;
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 32 values from `at + 32 j` lie within row `y` of
                // both slices (`x0 + 128 <= c`).
                let v = _mm512_loadu_si512(rows.as_ptr().add(at + 32 * j) as *const __m512i);
                let m = if UNIFORM {
                    ones
                } else {
                    _mm512_loadu_si512(weights.as_ptr().add(at + 32 * j) as *const __m512i)
                };
                *acc = _mm512_add_epi32(*acc, _mm512_madd_epi16(_mm512_xor_si512(v, flip), m));
            }
        }
        let t0 = x0 / 8;
        // SAFETY: tiles `t0..t0 + 16` lie within `bias` and `sums` (one per
        // 8 columns, `x0 + 128 <= c`).
        let b = _mm512_loadu_si512(bias.as_ptr().add(t0) as *const __m512i);
        let s = _mm512_add_epi32(tiles_of_four(acc), b);
        _mm512_storeu_si512(sums.as_mut_ptr().add(t0) as *mut __m512i, s);
    }
    for x0 in (wide..c).step_by(32) {
        let w = (c - x0).min(32);
        let lanes: __mmask32 = if w == 32 { !0 } else { (1 << w) - 1 };
        let mut acc = _mm512_setzero_si512();
        for y in 0..h {
            let at = y * c + x0;
            // SAFETY: the masked loads read `w` values from `at`, within
            // both slices (row `y < h` of `c`).
            let v = _mm512_maskz_loadu_epi16(lanes, rows.as_ptr().add(at) as *const i16);
            // Lanes past the row's end take weight 0, as the masked
            // load of the weights gives them (their flipped 0 would add
            // -32768 that no bias gives back).
            let m = if UNIFORM {
                _mm512_maskz_mov_epi16(lanes, ones)
            } else {
                _mm512_maskz_loadu_epi16(lanes, weights.as_ptr().add(at))
            };
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_xor_si512(v, flip), m));
        }
        // Each tile is 4 lanes (pairs of columns): add them up in every
        // lane of the tile, then take one lane per tile.
        let s1 = _mm512_add_epi32(acc, _mm512_shuffle_epi32::<0xB1>(acc));
        let s2 = _mm512_add_epi32(s1, _mm512_shuffle_epi32::<0x4E>(s1));
        let mut four = [0i32; 16];
        _mm512_storeu_si512(
            four.as_mut_ptr() as *mut __m512i,
            _mm512_maskz_compress_epi32(0x1111, s2),
        );
        let t0 = x0 / 8;
        for (i, &v) in four.iter().take(w.div_ceil(8)).enumerate() {
            sums[t0 + i] = (v as u32).wrapping_add(bias[t0 + i]);
        }
    }
}

/// The 16 tile sums of four accumulators of [`band_avx512`] (lanes
/// `4t..4t + 4` of each: tile `t` of its 32 columns), in column order:
/// adjacent lanes added twice, each time gathering the pair sums of two
/// registers into one.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tiles_of_four(
    [a0, a1, a2, a3]: [std::arch::x86_64::__m512i; 4],
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    let a01 = _mm512_add_epi32(
        _mm512_permutex2var_epi32(a0, even, a1),
        _mm512_permutex2var_epi32(a0, odd, a1),
    );
    let a23 = _mm512_add_epi32(
        _mm512_permutex2var_epi32(a2, even, a3),
        _mm512_permutex2var_epi32(a2, odd, a3),
    );
    _mm512_add_epi32(
        _mm512_permutex2var_epi32(a01, even, a23),
        _mm512_permutex2var_epi32(a01, odd, a23),
    )
}

/// [`band_avx512`] 64 then 16 columns at a time with AVX2 (no masked word loads:
/// the last `c % 16` columns are summed by [`band_portable`]'s rule).
/// `UNIFORM`: every weight is 1 (a register, not loaded).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn band_avx2<const UNIFORM: bool>(
    rows: &[u16],
    weights: &[i16],
    c: usize,
    bias: &[u32],
    sums: &mut [u32],
) {
    use std::arch::x86_64::*;
    let h = rows.len() / c;
    assert!(weights.len() >= h * c && sums.len() == c.div_ceil(8) && bias.len() == sums.len());
    let flip = _mm256_set1_epi16(i16::MIN);
    let ones = _mm256_set1_epi16(1);
    // 64 columns (8 tiles) at a time: four accumulators, reduced together
    // and stored with their biases as one register.
    let wide = c - c % 64;
    for x0 in (0..wide).step_by(64) {
        let mut acc = [_mm256_setzero_si256(); 4];
        for y in 0..h {
            let at = y * c + x0;
            for (j, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 16 values from `at + 16 j` lie within row `y` of
                // both slices (`x0 + 64 <= c`).
                let v = _mm256_loadu_si256(rows.as_ptr().add(at + 16 * j) as *const __m256i);
                let m = if UNIFORM {
                    ones
                } else {
                    _mm256_loadu_si256(weights.as_ptr().add(at + 16 * j) as *const __m256i)
                };
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(_mm256_xor_si256(v, flip), m));
            }
        }
        // Lanes `4t..4t + 4` of each hold tile `t` of its 16 columns;
        // two rounds of pairwise adds leave, per 128-bit half, tile 0 (low
        // half) or 1 (high) of the four, which a permute puts in order.
        let [a0, a1, a2, a3] = acc;
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
        let t = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let t0 = x0 / 8;
        // SAFETY: tiles `t0..t0 + 8` lie within `bias` and `sums`.
        let b = _mm256_loadu_si256(bias.as_ptr().add(t0) as *const __m256i);
        _mm256_storeu_si256(
            sums.as_mut_ptr().add(t0) as *mut __m256i,
            _mm256_add_epi32(t, b),
        );
    }
    let full = c - c % 16;
    for x0 in (wide..full).step_by(16) {
        let mut acc = _mm256_setzero_si256();
        for y in 0..h {
            let at = y * c + x0;
            // SAFETY: 16 values from `at` lie within row `y` of both.
            let v = _mm256_loadu_si256(rows.as_ptr().add(at) as *const __m256i);
            let m = if UNIFORM {
                ones
            } else {
                _mm256_loadu_si256(weights.as_ptr().add(at) as *const __m256i)
            };
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_xor_si256(v, flip), m));
        }
        let s1 = _mm256_add_epi32(acc, _mm256_shuffle_epi32::<0xB1>(acc));
        let s2 = _mm256_add_epi32(s1, _mm256_shuffle_epi32::<0x4E>(s1));
        let t0 = x0 / 8;
        sums[t0] = (_mm256_extract_epi32::<0>(s2) as u32).wrapping_add(bias[t0]);
        sums[t0 + 1] = (_mm256_extract_epi32::<4>(s2) as u32).wrapping_add(bias[t0 + 1]);
    }
    for (i, sum) in sums.iter_mut().enumerate().skip(full / 8) {
        let cols = 8 * i..(8 * i + 8).min(c);
        *sum = tile_sum(rows, weights, c, cols);
    }
}

/// The sum of weighted counts of columns `cols` of `rows` (rows of `c`).
fn tile_sum(rows: &[u16], weights: &[i16], c: usize, cols: std::ops::Range<usize>) -> u32 {
    rows.chunks_exact(c)
        .zip(weights.chunks_exact(c))
        .flat_map(|(r, w)| r[cols.clone()].iter().zip(&w[cols.clone()]))
        .map(|(&v, &w)| u32::from(u16::from_le(v)) * w as u32)
        .sum()
}

/// Tile sums of one band by column sums first, 64 columns at a time in
/// u32 lanes (so that they stay in registers as the compiler vectorises),
/// then 8 columns at a time.
fn band_portable(band: &mut [u32], rows: &[u16], weights: &[i16], c: usize, sums: &mut [u32]) {
    const W: usize = 64;
    let full = c - c % W;
    for x0 in (0..full).step_by(W) {
        let mut acc = [0u32; W];
        for (row, w) in rows.chunks_exact(c).zip(weights.chunks_exact(c)) {
            let (row, w) = (&row[x0..x0 + W], &w[x0..x0 + W]);
            for i in 0..W {
                acc[i] += u32::from(u16::from_le(row[i])) * w[i] as u32;
            }
        }
        band[x0..x0 + W].copy_from_slice(&acc);
    }
    for (x, b) in band.iter_mut().enumerate().skip(full) {
        *b = tile_sum(rows, weights, c, x..x + 1);
    }
    for (sum, cols) in sums.iter_mut().zip(band.chunks(8)) {
        *sum = cols.iter().sum();
    }
}

/// A disagreement of a block's index with its counts: `(block frame,
/// field, stored, computed)`.
pub(crate) type Disagreement = (usize, usize, u64, u64);

/// The first disagreement between a block's stored index and the sums its
/// counts give, in the one order every check names it: the earliest frame,
/// and in that frame the lowest field. A check that sees frames in order
/// (a cursor, window by window) can name it at the first window with one.
/// `fields`: the fields compared, ascending; `stored(t, out)` fills field
/// `t`'s stored sums of the `n` frames; `computed(t, k)`: what the counts
/// give for field `t`, frame `k`.
pub(crate) fn first_disagreement(
    fields: impl IntoIterator<Item = usize>,
    n: usize,
    mut stored: impl FnMut(usize, &mut [u32]),
    computed: impl Fn(usize, usize) -> u64,
) -> Option<Disagreement> {
    let mut column = vec![0u32; n];
    let mut first: Option<Disagreement> = None;
    for t in fields {
        // Only an earlier frame can come before what a lower field found.
        let before = first.map_or(n, |(k, ..)| k);
        if before == 0 {
            break;
        }
        stored(t, &mut column);
        if let Some(k) = (0..before).find(|&k| u64::from(column[k]) != computed(t, k)) {
            first = Some((k, t, u64::from(column[k]), computed(t, k)));
        }
    }
    first
}

/// [`first_disagreement`] over every field when the computed sums are
/// frame-major (`computed[k * fields + t]` for frame `k`, field `t`): the
/// stored sums are unpacked field by field into that order, and the two
/// compared as runs of memory instead of one strided read per value. The
/// first difference in frame-major order is the earliest frame's lowest
/// field: the disagreement [`first_disagreement`] names.
pub(crate) fn first_disagreement_frame_major(
    fields: usize,
    mut stored: impl FnMut(usize, &mut [u32]),
    computed: &[u32],
) -> Option<Disagreement> {
    const RUN: usize = 256;
    // Fields unpacked a group at a time and written frame by frame: each
    // frame's part of the group is one run of memory (a cache line for 16
    // u32), where one field at a time stored every value to a different
    // line (a 128² detector has 272 fields: 1 KiB between frames).
    const GROUP: usize = 16;
    let n = computed.len() / fields.max(1);
    if n == 0 || fields == 0 {
        return None;
    }
    let mut all = vec![0u32; n * fields];
    let mut columns = vec![0u32; n * GROUP];
    for t0 in (0..fields).step_by(GROUP) {
        let g = GROUP.min(fields - t0);
        for (j, column) in columns.chunks_exact_mut(n).take(g).enumerate() {
            stored(t0 + j, column);
        }
        for (k, frame) in all.chunks_exact_mut(fields).enumerate() {
            for (j, v) in frame[t0..t0 + g].iter_mut().enumerate() {
                *v = columns[j * n + k];
            }
        }
    }
    let run = all
        .chunks(RUN)
        .zip(computed.chunks(RUN))
        .position(|(a, b)| a != b)?;
    let i = run * RUN
        + all[run * RUN..]
            .iter()
            .zip(&computed[run * RUN..])
            .position(|(a, b)| a != b)?;
    Some((
        i / fields,
        i % fields,
        u64::from(all[i]),
        u64::from(computed[i]),
    ))
}

/// Completes a frame's fields (`fields[..tiles8]` holding its 8×8 sums):
/// each 32×32 tile is the sum of the 8×8 tiles inside it (both families
/// are truncated at the same detector edges). A 32×32 tile sums at most
/// 1024 u16 counts, so u32 holds it exactly.
pub(crate) fn fill_large_tiles(r: usize, c: usize, fields: &mut [u32]) {
    let (g8r, g8c) = Tile::Px8.grid(r, c);
    let (_, g32c) = Tile::Px32.grid(r, c);
    let (small, large) = fields.split_at_mut(Tile::Px32.first_field(r, c));
    large.fill(0);
    for (by, band) in small[..g8r * g8c].chunks_exact(g8c).enumerate() {
        let row = &mut large[(by / 4) * g32c..(by / 4 + 1) * g32c];
        // Four 8×8 tiles across per 32×32 tile: summed before the store,
        // in fixed fours (a loop of unknown length per tile cost more
        // than the additions); a band cut by the detector's edge ends in
        // a shorter tile.
        let whole = band.chunks_exact(4);
        let rest = whole.remainder();
        for (l, s) in row.iter_mut().zip(whole) {
            *l += s[0] + s[1] + s[2] + s[3];
        }
        if !rest.is_empty() {
            row[g8c / 4] += rest.iter().sum::<u32>();
        }
    }
}

/// Unpacks `m` values of `width` bits, least-significant bit first, from
/// little-endian u32 words (`words` holds exactly the stream's words).
#[cfg(test)]
pub(crate) fn unpack(words: &[u8], width: u32, m: usize, out: &mut [u32]) {
    debug_assert!(out.len() == m);
    unpack_from(words, width, 0, out)
}

/// Values `k0..k0 + out.len()` of a stream packed as [`unpack`] reads it
/// (a window of a block's frames).
pub(crate) fn unpack_from(words: &[u8], width: u32, k0: usize, out: &mut [u32]) {
    debug_assert!(width <= 32);
    if width == 0 {
        out.fill(0);
        return;
    }
    let word = |i: usize| -> u64 {
        words.get(4 * i..4 * i + 4).map_or(0, |b| {
            u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        })
    };
    let mask = if width == 32 {
        u64::from(u32::MAX)
    } else {
        (1u64 << width) - 1
    };
    let w = width as usize;
    // While 8 bytes lie from a value's first byte on: one unaligned load
    // holds it (at most 7 + 32 bits from that byte).
    let fast = match words.len().checked_sub(8) {
        // Value k starts at byte k·w / 8 ≤ len − 8.
        Some(room) => ((8 * room + 7) / w + 1).saturating_sub(k0),
        None => 0,
    };
    let (head, tail) = out.split_at_mut(fast.min(out.len()));
    for (k, o) in (k0..).zip(head.iter_mut()) {
        let bit = k * w;
        let at = bit / 8;
        let eight = u64::from_le_bytes(words[at..at + 8].try_into().unwrap_or_default());
        *o = ((eight >> (bit % 8)) & mask) as u32;
    }
    for (k, o) in (k0 + head.len()..).zip(tail.iter_mut()) {
        let bit = k * w;
        let (w, shift) = (bit / 32, bit % 32);
        let pair = word(w) | (word(w + 1) << 32);
        *o = ((pair >> shift) & mask) as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_lsb_first() {
        // Values 5, 3, 7 at width 3: bits 101 011 111 -> 0b111_011_101.
        let words = 0b111_011_101u32.to_le_bytes();
        let mut out = [0u32; 3];
        unpack(&words, 3, 3, &mut out);
        assert_eq!(out, [5, 3, 7]);
        let words: Vec<u8> = [0xd3u32, 0x0c]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let mut one = [0u32; 1];
        unpack(&words[..4], 8, 1, &mut one);
        assert_eq!(one, [211]);
        let w32: Vec<u8> = [u32::MAX, 7].iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut two = [0u32; 2];
        unpack(&w32, 32, 2, &mut two);
        assert_eq!(two, [u32::MAX, 7]);
    }

    /// Every width, values packed bit by bit as the spec lays them out,
    /// read back from several first values (the window reads of a block's
    /// frames), up to the stream's last word.
    #[test]
    fn unpack_reads_what_was_packed() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for width in 1..=32u32 {
            let values: Vec<u32> = (0..101)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed & ((1u64 << width) - 1)) as u32
                })
                .collect();
            let mut words = vec![0u32; (values.len() * width as usize).div_ceil(32)];
            for (k, &v) in values.iter().enumerate() {
                for b in 0..width as usize {
                    let bit = k * width as usize + b;
                    words[bit / 32] |= ((v >> b) & 1) << (bit % 32);
                }
            }
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            for k0 in [0, 1, 37, 95, 100] {
                let mut out = vec![u32::MAX; values.len() - k0];
                unpack_from(&bytes, width, k0, &mut out);
                assert_eq!(out, values[k0..], "width {width}, from {k0}");
            }
        }
    }

    /// The slab-wise sums from frame-major frames equal the column-wise
    /// sums, through every path this CPU runs, with invalid pixels,
    /// detectors that are not multiples of 8, 16 or 32, and counts at the
    /// top of the u16 range (the last detector: every count 65535).
    #[test]
    fn frame_sums_equal_column_sums() {
        use std::io::Write;
        for path in SumPath::ALL {
            // Not captured by the harness: CI output names what ran.
            let ran = if path.available() {
                "exercised"
            } else {
                "SKIPPED (this CPU lacks it)"
            };
            writeln!(std::io::stderr(), "spatial: {path:?} tile sums {ran}").unwrap();
        }
        let sizes = [
            (13usize, 7usize),
            (40, 33),
            (64, 64),
            (8, 200),
            (17, 47),
            (16, 128),
            (10, 256),
            (9, 168),
        ];
        for path in SumPath::ALL.into_iter().filter(|p| p.available()) {
            // Some pixels invalid in every band, then every pixel valid
            // (the vector paths' weights of ones in a register).
            frame_sums_with(path, &sizes, 0xb7);
            frame_sums_with(path, &sizes, 0xff);
        }
    }

    /// `holes`: every third byte of the valid mask's flags.
    fn frame_sums_with(path: SumPath, sizes: &[(usize, usize)], holes: u8) {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for (n, &(r, c)) in sizes.iter().enumerate() {
            let saturated = n + 1 == sizes.len();
            let m = 37;
            let p = r * c;
            let flags: String = (0..p.div_ceil(8))
                .map(|i| format!("{:02x}", if i % 3 == 0 { holes } else { 0xff }))
                .collect();
            let valid = ValidMask::parse(&flags, p).unwrap();
            let mut cols = vec![0u16; p * m];
            for v in cols.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *v = if saturated || seed.is_multiple_of(97) {
                    u16::MAX
                } else {
                    (seed % 5) as u16
                };
            }
            let frames: Vec<u16> = (0..m * p)
                .map(|i| cols[(i % p) * m + i / p].to_le())
                .collect();
            let fields = Tile::Px32.first_field(r, c) + {
                let (a, b) = Tile::Px32.grid(r, c);
                a * b
            };
            let want = sums_from_columns(&cols, m, fields, &pixel_fields(r, c), &valid);
            // Split into summers of 8-row bands, as decoding threads do.
            let mut got = vec![u32::MAX; fields * m];
            for r0 in (0..r).step_by(8) {
                let rows = r0..(r0 + 8).min(r);
                let mut sums = FrameSums::with_path(c, rows.clone(), &valid, path);
                let tiles = sums.tiles();
                let mut part = vec![u32::MAX; tiles * m];
                for t0 in (0..m).step_by(10) {
                    let k = 10.min(m - t0);
                    let sub: Vec<u16> = (t0..t0 + k)
                        .flat_map(|t| frames[t * p + r0 * c..t * p + rows.end * c].to_vec())
                        .collect();
                    sums.add(&sub, t0, &mut part);
                }
                let at = (r0 / 8) * c.div_ceil(8);
                for t in 0..m {
                    got[t * fields + at..t * fields + at + tiles]
                        .copy_from_slice(&part[t * tiles..(t + 1) * tiles]);
                }
            }
            for frame in got.chunks_exact_mut(fields) {
                fill_large_tiles(r, c, frame);
            }
            let got: Vec<u64> = (0..fields * m)
                .map(|i| u64::from(got[(i % m) * fields + i / m]))
                .collect();
            assert_eq!(got, want, "{r}x{c} {path:?}");
        }
    }

    /// The frame-major comparison names the disagreement the field-wise
    /// one does (earliest frame, then lowest field), wherever the
    /// differences lie, and none when there is none.
    #[test]
    fn frame_major_comparison_names_the_first_disagreement() {
        let (fields, n) = (37, 300);
        let computed: Vec<u32> = (0..fields * n).map(|i| (i * 7919 % 1013) as u32).collect();
        let cases: [&[(usize, usize)]; 5] = [
            &[],
            &[(0, 0)],
            &[(299, 36)],
            &[(120, 30), (121, 2), (250, 1)],
            &[(40, 9), (40, 3), (7, 36)],
        ];
        for changed in cases {
            // Field-major stored sums, `changed` (frame, field) off by one.
            let mut stored: Vec<u32> = (0..fields * n)
                .map(|i| computed[(i % n) * fields + i / n])
                .collect();
            for &(k, t) in changed {
                stored[t * n + k] += 1;
            }
            let fill = |t: usize, out: &mut [u32]| out.copy_from_slice(&stored[t * n..(t + 1) * n]);
            let want = first_disagreement(0..fields, n, fill, |t, k| {
                u64::from(computed[k * fields + t])
            });
            let got = first_disagreement_frame_major(fields, fill, &computed);
            assert_eq!(got, want, "{changed:?}");
            assert_eq!(got.is_some(), !changed.is_empty());
        }
    }

    #[test]
    fn fields_of_pixels() {
        let f = pixel_fields(13, 7);
        assert_eq!(f[0], (0, 2));
        assert_eq!(f[8 * 7], (1, 2));
    }
}
