//! The float32 extreme-value fixture and its exact reference, shared by the
//! CPU tests (`tests/reduce.rs`) and the GPU parity tests
//! (`gpu/tests/parity.rs`), which include this file with `#[path]`.

use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};

/// A seeded stream of u64 (rand's portable Xoshiro256++): the same values on every run.
fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    move || rng.next_u64()
}

/// The exact sum of float32 terms rounded once to float32 (NaN where a
/// NaN or both infinities are summed, else an infinity summed): Shewchuk's
/// exact partials in binary64, as Python's `math.fsum`; binary64 cannot
/// overflow on float32 terms, so the only overflow is the final rounding.
pub fn exact_f32_sum(terms: impl Iterator<Item = f32>) -> f32 {
    let (mut pos, mut neg, mut nan) = (false, false, false);
    let mut partials: Vec<f64> = Vec::new();
    for v in terms {
        if v.is_nan() {
            nan = true;
            continue;
        }
        if v.is_infinite() {
            (pos, neg) = (pos || v > 0.0, neg || v < 0.0);
            continue;
        }
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
    match (nan || (pos && neg), pos, neg) {
        (true, _, _) => f32::NAN,
        (_, true, _) => f32::INFINITY,
        (_, _, true) => f32::NEG_INFINITY,
        _ => partials.iter().rev().sum::<f64>() as f32,
    }
}

/// Equal as float32 results: both NaN, or within 1e-6 of the magnitude of
/// the terms below 2^126 (±FLT_MAX terms are carried exactly).
pub fn same_sum(got: f32, want: f32, terms: &[f32]) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got == want {
        return true;
    }
    let small: f64 = terms
        .iter()
        .filter(|v| v.abs() < 2f32.powi(126))
        .map(|&v| f64::from(v).abs())
        .sum();
    (f64::from(got) - f64::from(want)).abs() <= 1e-6 * small.max(1.0) + 1e-6 * f64::from(want).abs()
}

/// A float32 acquisition whose frames hold ±FLT_MAX beside ordinary
/// values, infinities and NaN, laid out so that masked sums overflow, cancel
/// back into range, or keep a small term beside the largest floats.
pub fn extreme_floats() -> ([usize; 4], Vec<f32>) {
    let shape = [4, 6, 8, 8];
    let p = 64;
    let mut next = seeded(0xf1f1);
    let mut v: Vec<f32> = (0..24 * p)
        .map(|_| (next() % 2001) as f32 * 0.01 - 10.0)
        .collect();
    let big = f32::MAX;
    for (frame, pixel, value) in [
        (0, 9, big),
        (0, 27, big), // overflows: +inf
        (1, 9, big),
        (1, 27, big),
        (1, 36, -big), // back in range
        (2, 9, big),
        (2, 10, -6.03),
        (2, 54, -big), // cancels, keeps -6.03
        (3, 20, f32::INFINITY),
        (4, 21, f32::NAN),
        (5, 9, f32::INFINITY),
        (5, 10, f32::NEG_INFINITY),
        (6, 9, -big),
        (6, 27, -big), // -inf
        (7, 9, -big),
        (8, 9, big),
        (9, 9, big),
        (10, 9, big),
    ] {
        v[frame * p + pixel] = value;
    }
    (shape, v)
}
