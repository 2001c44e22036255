//! Compensated float32 summation (Neumaier's variant of Kahan's), as the
//! format's reductions of float32 measurements require (spec §13).
//!
//! Non-finite terms are kept apart: compensation arithmetic on infinities
//! yields NaN, while a plain sum of them yields the infinity (or NaN) that a
//! selected non-finite value must propagate as.

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Kahan {
    sum: f32,
    compensation: f32,
    /// Plain sum of the non-finite terms (0 when there are none).
    special: f32,
}

impl Kahan {
    #[inline]
    pub fn add(&mut self, v: f32) {
        if !v.is_finite() {
            self.special += v;
            return;
        }
        let t = self.sum + v;
        if self.sum.abs() >= v.abs() {
            self.compensation += (self.sum - t) + v;
        } else {
            self.compensation += (v - t) + self.sum;
        }
        self.sum = t;
    }

    /// Adds another partial sum (of terms that came after this one's).
    pub fn merge(&mut self, other: Kahan) {
        self.add(other.sum);
        self.add(other.compensation);
        self.special += other.special;
    }

    pub fn value(&self) -> f32 {
        if self.special != 0.0 || self.special.is_nan() {
            return self.sum + self.special;
        }
        if !self.sum.is_finite() {
            // The finite terms overflowed float32.
            return self.sum;
        }
        self.sum + self.compensation
    }
}

#[cfg(test)]
mod tests {
    use super::Kahan;

    fn sum(values: &[f32]) -> f32 {
        let mut k = Kahan::default();
        values.iter().for_each(|&v| k.add(v));
        k.value()
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
    fn non_finite_terms_propagate() {
        assert_eq!(sum(&[1.0, f32::INFINITY, 2.0]), f32::INFINITY);
        assert_eq!(sum(&[f32::NEG_INFINITY, 1.0]), f32::NEG_INFINITY);
        assert!(sum(&[f32::INFINITY, f32::NEG_INFINITY]).is_nan());
        assert!(sum(&[1.0, f32::NAN]).is_nan());
        assert_eq!(sum(&[f32::MAX, f32::MAX]), f32::INFINITY);
    }

    #[test]
    fn merging_partials_equals_one_pass_on_exact_data() {
        let values: Vec<f32> = (0..1000).map(|i| (i % 17) as f32 * 0.25).collect();
        let mut a = Kahan::default();
        let mut b = Kahan::default();
        values[..400].iter().for_each(|&v| a.add(v));
        values[400..].iter().for_each(|&v| b.add(v));
        a.merge(b);
        assert_eq!(a.value(), sum(&values));
    }
}
