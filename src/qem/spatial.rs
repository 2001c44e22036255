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
/// `out[t * m + k]` is field `t` of block frame `k`.
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

/// Unpacks `m` values of `width` bits, least-significant bit first, from
/// little-endian u32 words (`words` holds exactly the stream's words).
pub(crate) fn unpack(words: &[u8], width: u32, m: usize, out: &mut [u32]) {
    debug_assert!(width <= 32 && out.len() == m);
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
    for (k, o) in out.iter_mut().enumerate() {
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

    #[test]
    fn fields_of_pixels() {
        let f = pixel_fields(13, 7);
        assert_eq!(f[0], (0, 2));
        assert_eq!(f[8 * 7], (1, 2));
    }
}
