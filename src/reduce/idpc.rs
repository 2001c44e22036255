//! Integrated DPC: the scalar field whose gradient is the centre-of-mass
//! field, by Fourier integration (the least-squares solution on the
//! periodic scan grid).
//!
//! With `G_r`, `G_c` the transforms of the row and column components and
//! `k_r`, `k_c` the frequencies in cycles per scan step, the field's
//! transform is `(k_r G_r + k_c G_c) / (2πi (k_r² + k_c²))`, and 0 at
//! `k = 0` (the field is defined up to a constant; its mean is 0).
//! Non-finite components (frames with no counts) count as 0.

use rustfft::num_complex::Complex64;
use rustfft::FftPlanner;

/// The integrated field of `(row, column)` gradients on a `rows × columns`
/// scan (row-major), in gradient units times scan steps.
pub fn integrate(row: &[f64], column: &[f64], scan: [usize; 2]) -> Vec<f64> {
    let [rows, columns] = scan;
    let n = rows * columns;
    if n == 0 || row.len() != n || column.len() != n {
        return vec![f64::NAN; n];
    }
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let mut gr: Vec<Complex64> = row
        .iter()
        .map(|&v| Complex64::new(finite(v), 0.0))
        .collect();
    let mut gc: Vec<Complex64> = column
        .iter()
        .map(|&v| Complex64::new(finite(v), 0.0))
        .collect();
    let mut planner = FftPlanner::<f64>::new();
    fft2(&mut planner, &mut gr, scan, false);
    fft2(&mut planner, &mut gc, scan, false);
    // Frequencies as numpy's fftfreq: 0, 1, ..., then negative.
    let freq = |i: usize, len: usize| {
        let k = if i < len.div_ceil(2) {
            i as f64
        } else {
            i as f64 - len as f64
        };
        k / len as f64
    };
    let two_pi_i = Complex64::new(0.0, 2.0 * std::f64::consts::PI);
    let mut field: Vec<Complex64> = (0..n)
        .map(|p| {
            let (kr, kc) = (freq(p / columns, rows), freq(p % columns, columns));
            let k2 = kr * kr + kc * kc;
            if k2 == 0.0 {
                Complex64::new(0.0, 0.0)
            } else {
                (gr[p] * kr + gc[p] * kc) / (two_pi_i * k2)
            }
        })
        .collect();
    fft2(&mut planner, &mut field, scan, true);
    field.iter().map(|z| z.re / n as f64).collect()
}

/// An unnormalised 2-D transform in place: rows, then columns.
fn fft2(planner: &mut FftPlanner<f64>, data: &mut [Complex64], shape: [usize; 2], inverse: bool) {
    let [rows, columns] = shape;
    let plan = |p: &mut FftPlanner<f64>, len| {
        if inverse {
            p.plan_fft_inverse(len)
        } else {
            p.plan_fft_forward(len)
        }
    };
    let along = plan(planner, columns);
    data.chunks_exact_mut(columns)
        .for_each(|line| along.process(line));
    let down = plan(planner, rows);
    let mut line = vec![Complex64::new(0.0, 0.0); rows];
    for c in 0..columns {
        for r in 0..rows {
            line[r] = data[r * columns + c];
        }
        down.process(&mut line);
        for r in 0..rows {
            data[r * columns + c] = line[r];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::integrate;
    use std::f64::consts::PI;

    /// A synthetic phase object whose gradient is known in closed form:
    /// integrating the gradient gives the object back, less its mean.
    #[test]
    fn recovers_a_phase_object_from_its_gradient() {
        for [rows, columns] in [[16usize, 24usize], [15, 20], [9, 7]] {
            let (a, b) = (2.0 * PI / rows as f64, 2.0 * PI / columns as f64);
            let phase =
                |r: f64, c: f64| (2.0 * a * r).sin() * (3.0 * b * c).cos() + 0.5 * (b * c).cos();
            let d_row = |r: f64, c: f64| 2.0 * a * (2.0 * a * r).cos() * (3.0 * b * c).cos();
            let d_col = |r: f64, c: f64| {
                -3.0 * b * (2.0 * a * r).sin() * (3.0 * b * c).sin() - 0.5 * b * (b * c).sin()
            };
            let at = |f: &dyn Fn(f64, f64) -> f64| -> Vec<f64> {
                (0..rows * columns)
                    .map(|p| f((p / columns) as f64, (p % columns) as f64))
                    .collect()
            };
            let want = at(&phase);
            let mean = want.iter().sum::<f64>() / want.len() as f64;
            let got = integrate(&at(&d_row), &at(&d_col), [rows, columns]);
            for (p, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - (w - mean)).abs() < 1e-9,
                    "{rows}x{columns} at {p}: {g} vs {}",
                    w - mean
                );
            }
        }
    }
}
