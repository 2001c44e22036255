//! The spatial index of the integer codec (spec §6.3): per frame, the sums
//! of valid counts over every 8×8 and then every 32×32 detector tile, packed
//! per (block, field) at the bit width of the block's largest sum.

/// Tile geometry of one detector.
#[derive(Clone, Debug)]
pub(crate) struct Tiles {
    rows: usize,
    cols: usize,
    cols8: usize,
    rows32: usize,
    cols32: usize,
    fields8: usize,
}

impl Tiles {
    pub fn new(rows: usize, cols: usize) -> Tiles {
        let cols8 = cols.div_ceil(8);
        Tiles {
            rows,
            cols,
            cols8,
            rows32: rows.div_ceil(32),
            cols32: cols.div_ceil(32),
            fields8: rows.div_ceil(8) * cols8,
        }
    }

    /// `F`: fields per frame.
    pub fn fields(&self) -> usize {
        self.fields8 + self.rows32 * self.cols32
    }

    /// Writes the `F` field sums of one frame into `sums`. `frame` holds its
    /// dense little-endian elements (two bytes each when `wide`); `valid[p]`
    /// is `u16::MAX` for a valid pixel and 0 for an invalid one.
    pub fn frame_sums(&self, frame: &[u8], wide: bool, valid: &[u16], sums: &mut [u32]) {
        let (small, large) = sums.split_at_mut(self.fields8);
        small.fill(0);
        for r in 0..self.rows {
            let row = &mut small[(r / 8) * self.cols8..][..self.cols8];
            let base = r * self.cols;
            let masks = valid[base..base + self.cols].chunks(8);
            if wide {
                let bytes = frame[2 * base..2 * (base + self.cols)].chunks(16);
                for (slot, (b, m)) in row.iter_mut().zip(bytes.zip(masks)) {
                    *slot += b
                        .chunks_exact(2)
                        .zip(m)
                        .map(|(v, &keep)| u32::from(u16::from_le_bytes([v[0], v[1]]) & keep))
                        .sum::<u32>();
                }
            } else {
                let bytes = frame[base..base + self.cols].chunks(8);
                for (slot, (b, m)) in row.iter_mut().zip(bytes.zip(masks)) {
                    *slot += b
                        .iter()
                        .zip(m)
                        .map(|(&v, &keep)| u32::from(u16::from(v) & keep))
                        .sum::<u32>();
                }
            }
        }
        // A 32×32 tile is exactly the union of up to 4×4 whole (possibly
        // truncated) 8×8 tiles, so it is summed from them.
        large.fill(0);
        for (i, &s) in small.iter().enumerate() {
            let (tr, tc) = (i / self.cols8, i % self.cols8);
            large[(tr / 4) * self.cols32 + tc / 4] += s;
        }
    }
}

/// Bit width of the largest sum (0 when all are zero).
pub(crate) fn width(sums: impl Iterator<Item = u32>) -> u8 {
    let max = sums.max().unwrap_or(0);
    (32 - max.leading_zeros()) as u8
}

/// Appends `values` packed least-significant bit first at `width` bits each,
/// as little-endian u32 words with the last one zero-padded.
pub(crate) fn pack(values: impl Iterator<Item = u32>, width: u8, words: &mut Vec<u32>) {
    if width == 0 {
        return;
    }
    let width = u32::from(width);
    let mut acc: u64 = 0;
    let mut filled = 0u32;
    for v in values {
        acc |= u64::from(v) << filled;
        filled += width;
        if filled >= 32 {
            words.push(acc as u32);
            acc >>= 32;
            filled -= 32;
        }
    }
    if filled > 0 {
        words.push(acc as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_counts() {
        assert_eq!(Tiles::new(13, 7).fields(), 3);
        assert_eq!(Tiles::new(33, 40).fields(), 29);
        assert_eq!(Tiles::new(2, 3).fields(), 2);
    }

    #[test]
    fn worked_example_frame() {
        // Spec §16: frames [[0,1,7],[0,200,3]] and [[0,2,7],[0,0,3]], pixel (1,0) invalid.
        let t = Tiles::new(2, 3);
        let valid = [u16::MAX, u16::MAX, u16::MAX, 0, u16::MAX, u16::MAX];
        let frames = [[0u8, 1, 7, 0, 200, 3], [0, 2, 7, 0, 0, 3]];
        let mut sums = [[0u32; 2]; 2];
        for (f, s) in frames.iter().zip(sums.iter_mut()) {
            t.frame_sums(f, false, &valid, s);
        }
        assert_eq!(sums, [[211, 211], [12, 12]]);
        let mut words = Vec::new();
        let w = width(sums.iter().map(|s| s[0]));
        pack(sums.iter().map(|s| s[0]), w, &mut words);
        assert_eq!((w, words), (8, vec![0x0cd3]));
    }

    #[test]
    fn packing_crosses_words() {
        let mut words = Vec::new();
        pack([0x1ffffu32, 1, 0x10001].into_iter(), 17, &mut words);
        // bits: 0x1ffff | 1<<17 | 0x10001<<34
        let all: u128 = 0x1ffff | (1 << 17) | (0x10001u128 << 34);
        assert_eq!(words, vec![all as u32, (all >> 32) as u32]);
        let mut full = Vec::new();
        pack([u32::MAX, 5].into_iter(), 32, &mut full);
        assert_eq!(full, vec![u32::MAX, 5]);
    }

    #[test]
    fn large_tiles_sum_small_ones() {
        let (r, c) = (70, 45);
        let t = Tiles::new(r, c);
        let valid: Vec<bool> = (0..r * c).map(|p| p % 11 != 3).collect();
        let masks: Vec<u16> = valid
            .iter()
            .map(|&v| if v { u16::MAX } else { 0 })
            .collect();
        let frame: Vec<u8> = (0..r * c)
            .flat_map(|p| (((p as u32 * 7919) % 65536) as u16).to_le_bytes())
            .collect();
        let mut sums = vec![0; t.fields()];
        t.frame_sums(&frame, true, &masks, &mut sums);
        // Brute force over the definition for the 32×32 family.
        let mut i = t.fields8;
        for tr in 0..r.div_ceil(32) {
            for tc in 0..c.div_ceil(32) {
                let mut s = 0u32;
                for y in tr * 32..(tr * 32 + 32).min(r) {
                    for x in tc * 32..(tc * 32 + 32).min(c) {
                        if valid[y * c + x] {
                            s += ((y * c + x) as u32 * 7919) % 65536;
                        }
                    }
                }
                assert_eq!(sums[i], s);
                i += 1;
            }
        }
    }
}
