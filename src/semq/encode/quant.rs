//! quant (spec 7.1): sign and magnitude bin of each coordinate.

use crate::semq::config::Config;

/// Per-config constants of the quant operator.
#[derive(Debug, Clone, Copy)]
pub struct Quant {
    bins: u32,
    bins_f: f32,
    max_magnitude: f32,
}

impl Quant {
    pub fn new(config: &Config) -> Quant {
        Quant {
            bins: config.param(),
            bins_f: config.param() as f32,
            max_magnitude: config.max_magnitude(),
        }
    }

    /// Symbol of one admitted (flushed, finite) coordinate. Two binary32
    /// operations, each rounded: Rust never contracts `a * b / c`.
    #[inline]
    pub fn symbol(&self, x: f32) -> u8 {
        let sign = u32::from(x >= 0.0);
        let m = x.abs();
        let bin = if m >= self.max_magnitude {
            self.bins - 1
        } else {
            let t = (m * self.bins_f) / self.max_magnitude;
            (t.floor() as u32).min(self.bins - 1)
        };
        (sign * self.bins + bin) as u8
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
