//! Detector geometry: masks, the default detectors, and finding the
//! bright-field disk in the data.
//!
//! Pixel centres sit at integer `(row, column)`; a disk of radius `r` about
//! `(cy, cx)` holds the pixels at distance `d ≤ r`, an annulus those with
//! `ri ≤ d ≤ ro` (compared as squares, exactly in binary64).
//!
//! **Finding the disk** ([`find_disk`]), from a mean pattern:
//! 1. smooth with a 3×3 median over valid neighbours (a hot pixel cannot win);
//! 2. `low` = median, `high` = maximum of the smoothed pattern; a disk needs
//!    `high ≥ 2 · low` and `high > 0`;
//! 3. threshold half-way, `t = (low + high) / 2`, and keep the 4-connected
//!    region at or above `t` that holds the maximum;
//! 4. centre = the region's centroid, radius = `√(area / π)`; the region
//!    must cover at least 3 pixels and at most half the valid detector.
//!
//! When no disk qualifies, the fallback is the detector centre
//! `((rows − 1) / 2, (columns − 1) / 2)` with radius `min(rows, columns) / 8`
//! (at least 1), and `detectors.json` says why.
//!
//! **Default detectors** from the bright-field radius `R` and `D`, the
//! distance from the centre to the farthest pixel centre:
//! BF = disk `R`; ABF = annulus `[R/2, R]` (the outer half of the disk);
//! ADF = annulus `[1.2 R, a]` and HAADF = annulus `[a, D]` with
//! `a = min(3 R, (1.2 R + D) / 2)`. Radii are in detector pixels.

use super::accelerator::PixelSet;

/// A disk or an annulus about a centre, in detector pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    Disk { radius: f64 },
    Annulus { inner: f64, outer: f64 },
}

/// The pixels of `shape` about `center` on a `rows × columns` detector.
pub fn mask(detector: [usize; 2], center: [f64; 2], shape: Shape) -> PixelSet {
    let (lo, hi) = match shape {
        Shape::Disk { radius } => (f64::NEG_INFINITY, radius * radius),
        Shape::Annulus { inner, outer } => (inner * inner, outer * outer),
    };
    let [rows, columns] = detector;
    let mut pixels = Vec::new();
    for r in 0..rows {
        let dy = r as f64 - center[0];
        for c in 0..columns {
            let dx = c as f64 - center[1];
            let d2 = dy * dy + dx * dx;
            if lo <= d2 && d2 <= hi {
                pixels.push((r * columns + c) as u32);
            }
        }
    }
    PixelSet::new(pixels)
}

/// The bright-field disk found in a pattern.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Disk {
    pub center: [f64; 2],
    pub radius: f64,
    /// The half-way threshold and the levels it lies between.
    pub threshold: f64,
    pub low: f64,
    pub high: f64,
    pub area: usize,
}

/// Finds the bright-field disk in a detector-shaped `pattern` (row-major);
/// `valid(p)` says which pixels to trust. `Err` says why none qualifies.
pub fn find_disk(
    pattern: &[f64],
    detector: [usize; 2],
    valid: impl Fn(usize) -> bool,
) -> Result<Disk, String> {
    let [rows, columns] = detector;
    if pattern.len() != rows * columns || pattern.is_empty() {
        return Err("the pattern does not match the detector".into());
    }
    let valid_count = (0..pattern.len()).filter(|&p| valid(p)).count();
    if valid_count == 0 {
        return Err("no valid detector pixel".into());
    }
    let mut smooth = vec![f64::NAN; pattern.len()];
    for r in 0..rows {
        for c in 0..columns {
            let mut near = [0f64; 9];
            let mut n = 0;
            for rr in r.saturating_sub(1)..(r + 2).min(rows) {
                for cc in c.saturating_sub(1)..(c + 2).min(columns) {
                    let q = rr * columns + cc;
                    if valid(q) && pattern[q].is_finite() {
                        near[n] = pattern[q];
                        n += 1;
                    }
                }
            }
            if n > 0 {
                let near = &mut near[..n];
                near.sort_by(f64::total_cmp);
                smooth[r * columns + c] = near[n / 2];
            }
        }
    }
    let mut levels: Vec<f64> = smooth.iter().copied().filter(|v| v.is_finite()).collect();
    if levels.is_empty() {
        return Err("the pattern has no finite value".into());
    }
    levels.sort_by(f64::total_cmp);
    let low = levels[levels.len() / 2];
    let high = levels[levels.len() - 1];
    if high <= 0.0 || high < 2.0 * low {
        return Err(format!(
            "no bright region: the brightest level {high:.6} is less than twice the median {low:.6}"
        ));
    }
    let threshold = (low + high) / 2.0;
    let start = (0..smooth.len())
        .filter(|&p| smooth[p].is_finite())
        .max_by(|&a, &b| smooth[a].total_cmp(&smooth[b]))
        .unwrap_or(0);
    let mut inside = vec![false; smooth.len()];
    let mut stack = vec![start];
    inside[start] = true;
    let (mut area, mut sum_r, mut sum_c) = (0usize, 0.0, 0.0);
    while let Some(p) = stack.pop() {
        let (r, c) = (p / columns, p % columns);
        area += 1;
        sum_r += r as f64;
        sum_c += c as f64;
        let mut visit = |q: usize| {
            if !inside[q] && smooth[q] >= threshold {
                inside[q] = true;
                stack.push(q);
            }
        };
        if r > 0 {
            visit(p - columns);
        }
        if r + 1 < rows {
            visit(p + columns);
        }
        if c > 0 {
            visit(p - 1);
        }
        if c + 1 < columns {
            visit(p + 1);
        }
    }
    if area < 3 {
        return Err(format!(
            "the bright region covers only {area} pixel(s), too few for a disk"
        ));
    }
    if 2 * area > valid_count {
        return Err(format!(
            "the bright region covers {area} of {valid_count} valid pixels, more than half the detector"
        ));
    }
    Ok(Disk {
        center: [sum_r / area as f64, sum_c / area as f64],
        radius: (area as f64 / std::f64::consts::PI).sqrt(),
        threshold,
        low,
        high,
        area,
    })
}

/// The fallback when no disk is found: the detector centre, radius
/// `min(rows, columns) / 8`, at least 1.
pub fn fallback(detector: [usize; 2]) -> ([f64; 2], f64) {
    let [rows, columns] = detector;
    (
        [(rows as f64 - 1.0) / 2.0, (columns as f64 - 1.0) / 2.0],
        (rows.min(columns) as f64 / 8.0).max(1.0),
    )
}

/// Distance from `center` to the farthest pixel centre.
pub fn farthest(detector: [usize; 2], center: [f64; 2]) -> f64 {
    let [rows, columns] = detector;
    let dy = center[0].abs().max((rows as f64 - 1.0 - center[0]).abs());
    let dx = center[1]
        .abs()
        .max((columns as f64 - 1.0 - center[1]).abs());
    (dy * dy + dx * dx).sqrt()
}

/// The default annuli `(abf, adf, haadf)` for bright-field radius `r`.
pub fn default_annuli(detector: [usize; 2], center: [f64; 2], r: f64) -> [[f64; 2]; 3] {
    let d = farthest(detector, center);
    let a = (3.0 * r).min((1.2 * r + d) / 2.0);
    [[r / 2.0, r], [1.2 * r, a], [a, d]]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(detector: [usize; 2], center: [f64; 2], radius: f64) -> Vec<f64> {
        let [rows, columns] = detector;
        (0..rows * columns)
            .map(|p| {
                let (dy, dx) = (
                    (p / columns) as f64 - center[0],
                    (p % columns) as f64 - center[1],
                );
                if dy * dy + dx * dx <= radius * radius {
                    100.0
                } else {
                    1.0 + (p % 3) as f64
                }
            })
            .collect()
    }

    #[test]
    fn masks_follow_the_distance_convention() {
        let disk = mask([5, 5], [2.0, 2.0], Shape::Disk { radius: 1.0 });
        assert_eq!(disk.pixels(), &[7, 11, 12, 13, 17]);
        let ring = mask(
            [5, 5],
            [2.0, 2.0],
            Shape::Annulus {
                inner: 1.0,
                outer: 1.0,
            },
        );
        assert_eq!(ring.pixels(), &[7, 11, 13, 17]);
        assert!(mask([4, 4], [1.5, 1.5], Shape::Disk { radius: 0.5 }).is_empty());
    }

    #[test]
    fn finds_an_off_centre_disk() {
        let detector = [64, 80];
        let pattern = synthetic(detector, [30.0, 45.0], 9.0);
        let disk = find_disk(&pattern, detector, |_| true).unwrap();
        assert!((disk.center[0] - 30.0).abs() < 0.01, "{disk:?}");
        assert!((disk.center[1] - 45.0).abs() < 0.01, "{disk:?}");
        assert!((disk.radius - 9.0).abs() < 0.3, "{disk:?}");
    }

    #[test]
    fn a_hot_pixel_or_a_flat_pattern_is_not_a_disk() {
        let detector = [32, 32];
        let mut pattern = vec![5.0; 1024];
        assert!(find_disk(&pattern, detector, |_| true).is_err());
        pattern[100] = 1e6;
        assert!(find_disk(&pattern, detector, |_| true).is_err());
        // Unless the hot pixel is masked invalid and a real disk exists.
        let mut pattern = synthetic(detector, [16.0, 16.0], 4.0);
        pattern[3] = 1e9;
        let disk = find_disk(&pattern, detector, |p| p != 3).unwrap();
        assert!((disk.center[0] - 16.0).abs() < 0.01);
    }

    #[test]
    fn default_annuli_stay_on_the_detector() {
        let [abf, adf, haadf] = default_annuli([128, 128], [63.5, 63.5], 10.0);
        assert_eq!(abf, [5.0, 10.0]);
        assert_eq!(adf, [12.0, 30.0]);
        assert_eq!(haadf[0], 30.0);
        assert!((haadf[1] - 63.5 * 2f64.sqrt()).abs() < 1e-9);
        // A disk that fills the detector leaves a narrower ADF.
        let [_, adf, haadf] = default_annuli([64, 64], [31.5, 31.5], 30.0);
        assert!(adf[1] < 90.0 && adf[1] == haadf[0] && haadf[0] <= haadf[1]);
    }
}
