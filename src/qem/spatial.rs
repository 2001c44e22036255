//! The spatial index of the integer codec (§6.3): per frame, exact sums of
//! valid counts over 8×8 tiles then 32×32 tiles, bit-packed per block and
//! field. Read without decoding any count stream; recomputed from decoded
//! counts to verify it.

use super::header::ValidMask;

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
/// split a detector between threads): sums the 8 rows of each band
/// column-wise first (u32 lanes, vectorised) and then 8 columns at a time.
/// The 32×32 tiles are filled in afterwards from the 8×8 ones
/// ([`fill_large_tiles`]).
pub(crate) struct FrameSums {
    cols: usize,
    /// Pixels of the covered rows: 0xffff when valid, else 0.
    mask: Vec<u16>,
    band: Vec<u32>,
}

impl FrameSums {
    /// Sums over detector rows `rows` of an `r × c` detector (`rows.start`
    /// a multiple of 8).
    pub(crate) fn new(c: usize, rows: std::ops::Range<usize>, valid: &ValidMask) -> Self {
        debug_assert!(rows.start.is_multiple_of(8));
        FrameSums {
            cols: c,
            mask: (rows.start * c..rows.end * c)
                .map(|p| if valid.is_valid(p) { u16::MAX } else { 0 })
                .collect(),
            band: vec![0; c],
        }
    }

    /// Heap bytes held (the rows' mask and one band of sums).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.mask.capacity() * 2 + self.band.capacity() * 4
    }

    /// 8×8 tiles of the covered rows: per frame, `bands * ceil(c / 8)`.
    pub(crate) fn tiles(&self) -> usize {
        (self.mask.len() / self.cols.max(1)).div_ceil(8) * self.cols.div_ceil(8)
    }

    /// Adds the 8×8 sums of `frames` (`k` frames of the covered rows,
    /// little-endian u16 counts) as frames `t0..t0 + k`: `out[frame *
    /// tiles() + i]` is tile `i` of the covered rows, in tile-row order (so
    /// that each frame's sums are one run). An 8×8 tile sums at most 64
    /// u16 counts, so u32 holds it exactly.
    pub(crate) fn add(&mut self, frames: &[u16], t0: usize, out: &mut [u32]) {
        let c = self.cols;
        let tiles = self.tiles();
        if self.mask.is_empty() || tiles == 0 {
            return;
        }
        for (k, frame) in frames.chunks_exact(self.mask.len()).enumerate() {
            let sums = &mut out[(t0 + k) * tiles..(t0 + k + 1) * tiles];
            for (by, band_rows) in frame.chunks(8 * c).enumerate() {
                add_band(&mut self.band, band_rows, &self.mask[by * 8 * c..]);
                let g8c = c.div_ceil(8);
                for (tile, cols) in sums[by * g8c..(by + 1) * g8c]
                    .iter_mut()
                    .zip(self.band.chunks(8))
                {
                    *tile = cols.iter().sum();
                }
            }
        }
    }
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
    for by in 0..g8r {
        for (tx, &s) in small[by * g8c..(by + 1) * g8c].iter().enumerate() {
            large[(by / 4) * g32c + tx / 4] += s;
        }
    }
}

/// Sets `band` to the sums of the valid counts of each column of `rows`
/// (whole rows of `band.len()` pixels), 64 columns at a time so that the
/// sums stay in registers: AVX2 registers where present (the library is
/// built for baseline x86-64), else as the compiler vectorises.
fn add_band(band: &mut [u32], rows: &[u16], mask: &[u16]) {
    const W: usize = 64;
    #[inline(always)]
    fn columns<const N: usize>(x0: usize, c: usize, rows: &[u16], mask: &[u16], out: &mut [u32]) {
        let mut acc = [0u32; N];
        for (row, mask) in rows.chunks_exact(c).zip(mask.chunks_exact(c)) {
            let (row, mask) = (&row[x0..x0 + N], &mask[x0..x0 + N]);
            for i in 0..N {
                acc[i] += u32::from(u16::from_le(row[i]) & mask[i]);
            }
        }
        out[..N].copy_from_slice(&acc);
    }
    #[inline(always)]
    fn add(band: &mut [u32], rows: &[u16], mask: &[u16]) {
        let c = band.len();
        let full = c - c % W;
        for x0 in (0..full).step_by(W) {
            columns::<W>(x0, c, rows, mask, &mut band[x0..]);
        }
        for x in full..c {
            band[x] = rows
                .chunks_exact(c)
                .zip(mask.chunks_exact(c))
                .map(|(row, mask)| u32::from(u16::from_le(row[x]) & mask[x]))
                .sum();
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn add_avx2(band: &mut [u32], rows: &[u16], mask: &[u16]) {
            add(band, rows, mask)
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; the function is safe code.
            return unsafe { add_avx2(band, rows, mask) };
        }
    }
    add(band, rows, mask)
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
    for (k, o) in (k0..).zip(out.iter_mut()) {
        let bit = k * width as usize;
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

    /// The slab-wise sums from frame-major frames equal the column-wise
    /// sums, with invalid pixels and detectors that are not multiples of 8
    /// or 32.
    #[test]
    fn frame_sums_equal_column_sums() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        for (r, c) in [(13usize, 7usize), (40, 33), (64, 64), (8, 200)] {
            let m = 37;
            let p = r * c;
            let flags: String = (0..p.div_ceil(8))
                .map(|i| format!("{:02x}", if i % 3 == 0 { 0xb7u8 } else { 0xff }))
                .collect();
            let valid = ValidMask::parse(&flags, p).unwrap();
            let mut cols = vec![0u16; p * m];
            for v in cols.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *v = if seed.is_multiple_of(97) {
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
                let mut sums = FrameSums::new(c, rows.clone(), &valid);
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
            assert_eq!(got, want, "{r}x{c}");
        }
    }

    #[test]
    fn fields_of_pixels() {
        let f = pixel_fields(13, 7);
        assert_eq!(f[0], (0, 2));
        assert_eq!(f[8 * 7], (1, 2));
    }
}
