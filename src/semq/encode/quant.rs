//! quant (spec 7.1): sign and magnitude bin of each coordinate.

use crate::semq::config::Config;

/// Per-config constants of the quant operator.
#[derive(Debug, Clone, Copy)]
pub struct Quant {
    bins: u32,
    bins_f: f32,
    /// bins − 1 as binary32 (exact).
    top: f32,
    max_magnitude: f32,
}

impl Quant {
    pub fn new(config: &Config) -> Quant {
        Quant {
            bins: config.param(),
            bins_f: config.param() as f32,
            top: (config.param() - 1) as f32,
            max_magnitude: config.max_magnitude(),
        }
    }

    /// Symbol of one admitted (flushed, finite) coordinate. Two binary32
    /// operations, each rounded: Rust never contracts `a * b / c`.
    ///
    /// The clamp to bins − 1 is taken on t before the conversion: bins − 1
    /// is an integer and t ≥ 0, so min(⌊t⌋, bins−1) = ⌊min(t, bins−1)⌋ and
    /// truncation is the floor. Staying in binary32 until the end lets the
    /// loop vectorize.
    #[inline]
    pub fn symbol(&self, x: f32) -> u8 {
        let top = self.top;
        let m = x.abs();
        let t = (m * self.bins_f) / self.max_magnitude;
        let t = if m >= self.max_magnitude || t >= top {
            top
        } else {
            t
        };
        let bin = t as i32 as u32;
        let sign = u32::from(x >= 0.0);
        (sign * self.bins + bin) as u8
    }

    /// Encodes and packs one admitted row straight into its packed form:
    /// eight b-bit symbols fill exactly b bytes, so each block of eight
    /// coordinates becomes one u64 store without a symbol buffer.
    pub fn encode_packed(&self, row: &[f32], out: &mut [u8], bits: usize) {
        let mut blocks = row.chunks_exact(8);
        let mut outs = out.chunks_exact_mut(bits);
        for (block, dst) in (&mut blocks).zip(&mut outs) {
            let mut s = [0u8; 8];
            for (o, &x) in s.iter_mut().zip(block) {
                *o = self.symbol(x);
            }
            let mut acc = 0u64;
            for (k, &v) in s.iter().enumerate() {
                acc |= u64::from(v) << (k * bits);
            }
            dst.copy_from_slice(&acc.to_le_bytes()[..bits]);
        }
        let tail = blocks.remainder();
        if !tail.is_empty() {
            let mut s = [0u8; 8];
            for (o, &x) in s.iter_mut().zip(tail) {
                *o = self.symbol(x);
            }
            let mut acc = 0u64;
            for (k, &v) in s.iter().take(tail.len()).enumerate() {
                acc |= u64::from(v) << (k * bits);
            }
            let start = (row.len() / 8) * bits;
            let bytes = acc.to_le_bytes();
            for (d, b) in out.iter_mut().skip(start).zip(bytes) {
                *d = b;
            }
        }
    }

    pub fn encode_row(&self, row: &[f32], symbols: &mut [u8]) {
        for (s, &x) in symbols.iter_mut().zip(row) {
            *s = self.symbol(x);
        }
    }

    /// Bin centre, negated for the negative half, rounded to binary32.
    pub fn representative(&self, symbol: u8) -> f32 {
        let s = u32::from(symbol);
        let (b, sign) = (s % self.bins, s / self.bins);
        let c = ((f64::from(b) + 0.5) * f64::from(self.max_magnitude)) / f64::from(self.bins);
        if sign == 0 {
            (-c) as f32
        } else {
            c as f32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        let q = Quant::new(&Config::quant(4, 4).unwrap());
        assert_eq!(q.symbol(1.0), 7);
        assert_eq!(q.symbol(-1.0), 3);
        assert_eq!(q.symbol(0.5), 6);
        assert_eq!(q.symbol(0.0), 4);
    }
}
