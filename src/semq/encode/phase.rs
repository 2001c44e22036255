//! phase (spec 7.2): the sector of each coordinate pair's angle, from a
//! fixed odd quintic, not from libm's atan2.

use crate::semq::config::Config;

const C1: f64 = f64::from_bits(0x3fef_d51f_9ab0_ca38);
const C3: f64 = f64::from_bits(0xbfd2_448d_cfa4_46af);
const C5: f64 = f64::from_bits(0x3fb3_7915_0b2c_31bc);
const PI: f64 = f64::from_bits(0x4009_21fb_5444_2d18);
const PI_2: f64 = f64::from_bits(0x3ff9_21fb_5444_2d18);
const TWO_PI: f64 = f64::from_bits(0x4019_21fb_5444_2d18);

/// The rule's polynomial: two fused steps, then a rounded product.
#[inline]
fn poly(t: f64) -> f64 {
    let t2 = t * t;
    let r = C5.mul_add(t2, C3);
    let r = r.mul_add(t2, C1);
    r * t
}

#[derive(Debug, Clone)]
pub struct Phase {
    sectors: u32,
    scale: f64,
}

impl Phase {
    pub fn new(config: &Config) -> Phase {
        Phase {
            sectors: config.param(),
            scale: f64::from(config.param()) / TWO_PI,
        }
    }

    /// Sector of the admitted pair (x, y).
    #[inline]
    pub fn symbol(&self, x: f32, y: f32) -> u8 {
        let (x, y) = (f64::from(x), f64::from(y));
        let (ax, ay) = (x.abs(), y.abs());
        let mut theta = if ax == 0.0 && ay == 0.0 {
            0.0
        } else if ax >= ay {
            poly(ay / ax)
        } else {
            PI_2 - poly(ax / ay)
        };
        if x < 0.0 {
            theta = PI - theta;
        }
        if y < 0.0 {
            theta = -theta;
        }
        let mut raw = (theta + PI) * self.scale;
        if raw < 0.0 {
            raw = 0.0;
        }
        // raw ≥ 0, so the conversion truncates exactly like trunc().
        (raw as u32).min(self.sectors - 1) as u8
    }

    pub fn encode_row(&self, row: &[f32], symbols: &mut [u8]) {
        for (s, pair) in symbols.iter_mut().zip(row.chunks_exact(2)) {
            *s = self.symbol(pair[0], pair[1]);
        }
    }

    /// One representative (x, y) per sector, indexed by sector.
    pub fn representatives(&self) -> Vec<(f32, f32)> {
        (0..self.sectors).map(|s| self.representative(s)).collect()
    }

    /// The direction of the sector's midpoint angle under the rule's own
    /// polynomial (outside the byte contract; libm sqrt).
    pub fn representative(&self, sector: u32) -> (f32, f32) {
        let theta = -PI + (f64::from(sector) + 0.5) * (TWO_PI / f64::from(self.sectors));
        let neg_y = theta < 0.0;
        let mut m = theta.abs();
        let neg_x = m > PI_2;
        if neg_x {
            m = PI - m;
        }
        let top = poly(1.0);
        let (ax, ay) = if m <= top {
            (1.0, inverse(m))
        } else {
            (inverse(PI_2 - m), 1.0)
        };
        let norm = (ax * ax + ay * ay).sqrt();
        let (mut x, mut y) = (ax / norm, ay / norm);
        if neg_x {
            x = -x;
        }
        if neg_y {
            y = -y;
        }
        (x as f32, y as f32)
    }
}

/// Bisects P on [0, 1] for `target`, 64 steps.
fn inverse(target: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if poly(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pair_and_axes_follow_the_rounding() {
        for (sectors, zero) in [(2u32, 1u8), (3, 1), (7, 3), (255, 127)] {
            let dim = if sectors <= 16 { 4 } else { 2 };
            let p = Phase::new(&Config::phase(dim, sectors).unwrap());
            assert_eq!(p.symbol(0.0, 0.0), zero, "sectors {sectors}");
        }
        let p = Phase::new(&Config::phase(2, 255).unwrap());
        assert_eq!(p.symbol(-1.0, 0.0), 254);
        let p = Phase::new(&Config::phase(2, 256).unwrap());
        assert_eq!(p.symbol(-1.0, 0.0), 255);
        assert_eq!(poly(1.0), PI / 4.0);
    }
}
