//! The one summation rule for float32 measurements (spec §13's compensated
//! float32 sums), shared by the CPU reference and, step for step, by the
//! GPU kernels (`gpu/shaders/reduce.wgsl`, `gpu/kernels/qem.cu`), whose
//! states come back as [`Neumaier::from_words`] and end in
//! [`Neumaier::value`] here.
//!
//! * Finite terms are added with Neumaier's compensation (Kahan's variant
//!   that also keeps the small term when the running sum is the smaller
//!   one, so a −6 beside ±FLT_MAX is not lost).
//! * No partial sum overflows: whole multiples of 2^126 are moved out of
//!   every term and of the running sum into an integer count (`units`),
//!   exactly, so the running sum stays below 2^126 in magnitude.
//!   `+FLT_MAX + FLT_MAX − FLT_MAX` is FLT_MAX in every order, and the
//!   value is ±inf only where the compensated total is beyond float32.
//! * Non-finite terms are only recorded (+inf, −inf, NaN seen), never
//!   added: the value is NaN when a NaN or both infinities were summed,
//!   else the infinity seen. NaN never comes from finite terms.
//!
//! Merging partial sums (of terms that came after this one's) adds the
//! other state's parts, so the result depends only on the merge order,
//! which every backend fixes.

/// 2^126: the unit moved out of terms and sums.
const UNIT: f32 = f32::from_bits(0x7e80_0000);
/// 2^-126.
const INV_UNIT: f32 = f32::from_bits(0x0080_0000);
/// Bits of [`Neumaier::special`].
const POS_INF: u32 = 1;
const NEG_INF: u32 = 2;
const NAN: u32 = 4;
/// `units` saturates here: any larger count is infinite anyway.
const UNITS_LIMIT: i32 = 1 << 30;

/// A compensated float32 sum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Neumaier {
    sum: f32,
    compensation: f32,
    /// Multiples of 2^126 moved out of the terms and the sum.
    units: i32,
    /// Which non-finite terms were seen ([`POS_INF`], [`NEG_INF`], [`NAN`]).
    special: u32,
}

/// The whole multiples of 2^126 in `x` (finite): `(q, x − q·2^126)`, both
/// exact, `|x − q·2^126| < 2^126`.
#[inline]
fn split(x: f32) -> (i32, f32) {
    if x.abs() < UNIT {
        return (0, x);
    }
    let q = (x * INV_UNIT).trunc();
    (q as i32, x - q * UNIT)
}

impl Neumaier {
    /// Adds one term.
    #[inline]
    pub fn add(&mut self, v: f32) {
        if !v.is_finite() {
            self.special |= if v.is_nan() {
                NAN
            } else if v > 0.0 {
                POS_INF
            } else {
                NEG_INF
            };
            return;
        }
        let (q, x) = split(v);
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - t) + x;
        } else {
            self.compensation += (x - t) + self.sum;
        }
        let (r, s) = split(t);
        self.sum = s;
        self.units = (self.units + q + r).clamp(-UNITS_LIMIT, UNITS_LIMIT);
    }

    /// Adds another partial sum (of terms that came after this one's).
    pub fn merge(&mut self, other: Neumaier) {
        self.units = (self.units + other.units).clamp(-UNITS_LIMIT, UNITS_LIMIT);
        self.special |= other.special;
        self.add(other.sum);
        self.add(other.compensation);
    }

    /// The sum, rounded to float32.
    pub fn value(&self) -> f32 {
        if self.special & NAN != 0 || self.special == POS_INF | NEG_INF {
            return f32::NAN;
        }
        if self.special == POS_INF {
            return f32::INFINITY;
        }
        if self.special == NEG_INF {
            return f32::NEG_INFINITY;
        }
        let h = self.units;
        if h.abs() > 4 {
            // Beyond 4·2^126 less one unit: past float32's range.
            return if h > 0 {
                f32::INFINITY
            } else {
                f32::NEG_INFINITY
            };
        }
        // At most two units at a time, so no step overflows before the
        // last one (whose overflow is the value's).
        let (h1, h2) = (h / 2, h - h / 2);
        ((h1 as f32 * UNIT + self.sum) + h2 as f32 * UNIT) + self.compensation
    }

    /// The state as the GPU kernels store it: sum and compensation bits,
    /// units, special flags.
    pub fn to_words(self) -> [u32; 4] {
        [
            self.sum.to_bits(),
            self.compensation.to_bits(),
            self.units as u32,
            self.special,
        ]
    }

    /// A state stored by a GPU kernel (see [`Neumaier::to_words`]).
    pub fn from_words(w: [u32; 4]) -> Neumaier {
        Neumaier {
            sum: f32::from_bits(w[0]),
            compensation: f32::from_bits(w[1]),
            units: w[2] as i32,
            special: w[3],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Neumaier;

    fn sum(values: &[f32]) -> f32 {
        let mut k = Neumaier::default();
        values.iter().for_each(|&v| k.add(v));
        k.value()
    }

    /// The exact sum of float32 terms rounded once to float32: Shewchuk's
    /// exact partials in binary64 (Python's `math.fsum`), which cannot
    /// overflow for float32 terms.
    fn reference(values: &[f32]) -> f32 {
        let mut partials: Vec<f64> = Vec::new();
        for &v in values {
            let mut x = f64::from(v);
            let mut kept = 0;
            for i in 0..partials.len() {
                let mut y = partials[i];
                if x.abs() < y.abs() {
                    std::mem::swap(&mut x, &mut y);
                }
                let hi = x + y;
                let lo = y - (hi - x);
                if lo != 0.0 {
                    partials[kept] = lo;
                    kept += 1;
                }
                x = hi;
            }
            partials.truncate(kept);
            partials.push(x);
        }
        // The partials are non-overlapping: their float64 sum from the
        // largest is within one float64 rounding, far below float32's.
        partials.iter().rev().sum::<f64>() as f32
    }

    #[test]
    fn compensates_what_plain_float32_loses() {
        let mut values = vec![1.0e8f32];
        values.extend(std::iter::repeat_n(1.0f32, 1000));
        values.push(-1.0e8);
        assert_eq!(sum(&values), 1000.0);
        assert_ne!(values.iter().sum::<f32>(), 1000.0);
    }

    #[test]
    fn keeps_small_terms_beside_the_largest_floats() {
        let values = [f32::MAX, -6.03, 1.5, -f32::MAX, 0.25];
        assert_eq!(sum(&values), reference(&values));
        assert_eq!(sum(&values), -6.03f32 + 1.75);
    }

    #[test]
    fn overflow_is_infinite_in_any_order_and_never_nan() {
        let values = [f32::MAX, 3.0, f32::MAX, -1.0];
        assert_eq!(sum(&values), f32::INFINITY);
        let neg: Vec<f32> = values.iter().map(|v| -v).collect();
        assert_eq!(sum(&neg), f32::NEG_INFINITY);
        // Cancelling overflows: the total is back in range, whatever the order.
        for values in [
            [f32::MAX, f32::MAX, -f32::MAX, 2.5],
            [-f32::MAX, f32::MAX, f32::MAX, 2.5],
            [2.5, f32::MAX, -f32::MAX, f32::MAX],
        ] {
            assert_eq!(sum(&values), reference(&values), "{values:?}");
        }
        let many = vec![f32::MAX; 1000];
        assert_eq!(sum(&many), f32::INFINITY);
    }

    #[test]
    fn non_finite_terms_decide_alone() {
        assert_eq!(sum(&[1.0, f32::INFINITY, 2.0]), f32::INFINITY);
        assert_eq!(
            sum(&[f32::NEG_INFINITY, f32::MAX, f32::MAX]),
            f32::NEG_INFINITY
        );
        assert!(sum(&[f32::INFINITY, f32::NEG_INFINITY]).is_nan());
        assert!(sum(&[1.0, f32::NAN]).is_nan());
    }

    #[test]
    fn merging_partials_equals_one_pass() {
        let values: Vec<f32> = (0..1000)
            .map(|i| match i % 97 {
                0 => f32::MAX,
                48 => -f32::MAX,
                k => k as f32 * 0.37 - 11.0,
            })
            .collect();
        let mut a = Neumaier::default();
        let mut b = Neumaier::default();
        values[..400].iter().for_each(|&v| a.add(v));
        values[400..].iter().for_each(|&v| b.add(v));
        a.merge(b);
        assert_eq!(a.value(), reference(&values));
        assert_eq!(sum(&values), reference(&values));
        let back = Neumaier::from_words(a.to_words());
        assert_eq!(back, a);
    }
}
