//! quant (spec 7.1): sign and magnitude bin of each coordinate.

use crate::semq::config::Config;

/// Up to this many bins, symbols are found by comparing with thresholds
/// instead of dividing (bins − 1 comparisons against one division).
const THRESHOLD_BINS: u32 = 8;

/// Per-config constants of the quant operator.
#[derive(Debug, Clone)]
pub struct Quant {
    bins: u32,
    bins_f: f32,
    /// bins − 1 as binary32 (exact).
    top: f32,
    max_magnitude: f32,
    /// Bits per packed symbol (2..=7).
    bits: usize,
    /// `thresholds[k − 1]` is the smallest binary32 m ≥ 0 whose bin is at
    /// least k (k = 1..bins−1), when bins ≤ THRESHOLD_BINS.
    thresholds: Vec<f32>,
}

impl Quant {
    pub fn new(config: &Config) -> Quant {
        let mut q = Quant {
            bins: config.param(),
            bins_f: config.param() as f32,
            top: (config.param() - 1) as f32,
            max_magnitude: config.max_magnitude(),
            bits: config.bits_per_unit() as usize,
            thresholds: Vec::new(),
        };
        if q.bins <= THRESHOLD_BINS {
            q.thresholds = (1..q.bins).map(|k| q.threshold(k)).collect();
        }
        q
    }

    /// The bin of a magnitude by the rule's own arithmetic.
    fn bin(&self, m: f32) -> u32 {
        u32::from(self.symbol(m)) - self.bins
    }

    /// The smallest non-negative binary32 whose bin is ≥ k. The bin is a
    /// non-decreasing function of m (a rounded product, a rounded division
    /// by M > 0, floor, clamp, and saturation to the top bin above M), and
    /// non-negative floats order like their bit patterns, so a binary
    /// search over the bits finds the exact boundary.
    fn threshold(&self, k: u32) -> f32 {
        let (mut lo, mut hi) = (0u32, f32::INFINITY.to_bits());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.bin(f32::from_bits(mid)) >= k {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        f32::from_bits(lo)
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
    pub(crate) fn encode_packed(&self, row: &[f32], out: &mut [u8]) {
        let bits = self.bits;
        let mut blocks = row.chunks_exact(8);
        let mut outs = out.chunks_exact_mut(bits);
        for (block, dst) in (&mut blocks).zip(&mut outs) {
            let mut x = [0f32; 8];
            x.copy_from_slice(block);
            let s = self.symbols8(&x);
            let mut acc = 0u64;
            for (k, &v) in s.iter().enumerate() {
                acc |= u64::from(v) << (k * bits);
            }
            dst.copy_from_slice(&acc.to_le_bytes()[..bits]);
        }
        let tail = blocks.remainder();
        if !tail.is_empty() {
            let mut acc = 0u64;
            for (k, &x) in tail.iter().enumerate() {
                acc |= u64::from(self.symbol(x)) << (k * bits);
            }
            let start = (row.len() / 8) * bits;
            let bytes = acc.to_le_bytes();
            for (d, b) in out.iter_mut().skip(start).zip(bytes) {
                *d = b;
            }
        }
    }

    /// Symbols of eight coordinates; with few bins the bin is the number
    /// of thresholds at or below |x| (exactly the rule's bin, see
    /// `threshold`), which vectorizes without a division.
    #[inline]
    fn symbols8(&self, x: &[f32; 8]) -> [u8; 8] {
        let mut s = [0u8; 8];
        if self.thresholds.len() + 1 == self.bins as usize {
            for (o, &v) in s.iter_mut().zip(x) {
                *o = if v >= 0.0 { self.bins as u8 } else { 0 };
            }
            for &th in &self.thresholds {
                for (o, &v) in s.iter_mut().zip(x) {
                    *o += u8::from(v.abs() >= th);
                }
            }
        } else {
            for (o, &v) in s.iter_mut().zip(x) {
                *o = self.symbol(v);
            }
        }
        s
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
    use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};

    #[test]
    fn thresholds_reproduce_the_division() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x1234_5678_9abc_def0);
        for (dim, bins) in [
            (1, 2),
            (4, 3),
            (4, 4),
            (6, 5),
            (384, 4),
            (768, 7),
            (4096, 8),
            (65536, 6),
        ] {
            let q = Quant::new(&Config::quant(dim, bins).unwrap());
            assert_eq!(q.thresholds.len() as u32, bins - 1);
            let mut values: Vec<f32> =
                vec![0.0, -0.0, q.max_magnitude, -q.max_magnitude, 1.0, -1.0];
            for &t in &q.thresholds {
                for d in [-2i32, -1, 0, 1, 2] {
                    let b = (t.to_bits() as i32 + d).max(0) as u32;
                    values.push(f32::from_bits(b));
                    values.push(-f32::from_bits(b));
                }
            }
            for _ in 0..20000 {
                let x = rng.next_u64();
                let v = f32::from_bits(x as u32);
                if v.is_finite() && v.abs() >= f32::MIN_POSITIVE {
                    values.push(v);
                }
                // Magnitudes in the interesting range.
                values.push(((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0 * q.max_magnitude);
            }
            for chunk in values.chunks_exact(8) {
                let mut b = [0f32; 8];
                b.copy_from_slice(chunk);
                let fast = q.symbols8(&b);
                for (k, &v) in b.iter().enumerate() {
                    assert_eq!(fast[k], q.symbol(v), "dim {dim} bins {bins} x {v:e}");
                }
            }
        }
    }

    #[test]
    fn spec_examples() {
        let q = Quant::new(&Config::quant(4, 4).unwrap());
        assert_eq!(q.symbol(1.0), 7);
        assert_eq!(q.symbol(-1.0), 3);
        assert_eq!(q.symbol(0.5), 6);
        assert_eq!(q.symbol(0.0), 4);
    }
}
