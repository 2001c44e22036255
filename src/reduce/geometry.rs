//! Detector geometry: masks, the default detectors, and finding the
//! bright-field disk in the data.
//!
//! Pixel centres sit at integer `(row, column)`; a disk of radius `r` about
//! `(cy, cx)` holds the pixels at distance `d ≤ r`, an annulus those with
//! `ri ≤ d ≤ ro`. A centre within `EDGE_TOLERANCE` (1e-9 pixels) of an
//! edge is *on* it, so radii computed in floating point (the distance to
//! the farthest pixel) do not drop the pixels that define them. Which edges
//! belong to a mask is the [`Edges`] convention: both (ours, the default),
//! the outer only (LiberTEM: the inner edge excluded), or neither
//! (py4DSTEM); a disk follows its outer edge.
//!
//! **Finding the disk** (`find_disk`), from a mean pattern:
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

use serde_json::{json, Value};

use super::accelerator::{PixelSet, ReduceError};
use super::products::Reducer;

/// A disk or an annulus about a centre, in detector pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    Disk { radius: f64 },
    Annulus { inner: f64, outer: f64 },
}

/// A pixel centre this close to an edge (in pixels) is on it.
pub(crate) const EDGE_TOLERANCE: f64 = 1e-9;

/// Which edges of a disk or annulus belong to it, so results can be
/// reproduced across tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Edges {
    /// Both edges included: `ri ≤ d ≤ ro`, disk `d ≤ r` (qemfs).
    #[default]
    Inclusive,
    /// The inner edge excluded: `ri < d ≤ ro`, disk `d ≤ r` (LiberTEM's
    /// ring and disk masks).
    Libertem,
    /// Both excluded: `ri < d < ro`, disk `d < r` (py4DSTEM's virtual
    /// detectors).
    Py4dstem,
}

impl Edges {
    /// The name used by `--mask-edges` and `detectors.json`.
    pub fn name(self) -> &'static str {
        match self {
            Edges::Inclusive => "inclusive",
            Edges::Libertem => "libertem",
            Edges::Py4dstem => "py4dstem",
        }
    }

    /// The rule in words, for `detectors.json`.
    pub fn rule(self) -> &'static str {
        match self {
            Edges::Inclusive => "disk: d <= r; annulus: inner <= d <= outer",
            Edges::Libertem => "disk: d <= r; annulus: inner < d <= outer (LiberTEM)",
            Edges::Py4dstem => "disk: d < r; annulus: inner < d < outer (py4DSTEM)",
        }
    }

    /// Whether distance `d` lies inside `[inner, outer]` under this rule,
    /// a distance within [`EDGE_TOLERANCE`] of an edge being on it.
    fn holds(self, d: f64, inner: Option<f64>, outer: f64) -> bool {
        let (keep_inner, keep_outer) = match self {
            Edges::Inclusive => (true, true),
            Edges::Libertem => (false, true),
            Edges::Py4dstem => (false, false),
        };
        let above_inner = inner.is_none_or(|ri| {
            if keep_inner {
                d >= ri - EDGE_TOLERANCE
            } else {
                d > ri + EDGE_TOLERANCE
            }
        });
        let below_outer = if keep_outer {
            d <= outer + EDGE_TOLERANCE
        } else {
            d < outer - EDGE_TOLERANCE
        };
        above_inner && below_outer
    }
}

impl std::str::FromStr for Edges {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Edges::Inclusive, Edges::Libertem, Edges::Py4dstem]
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown mask-edge convention {s:?}; expected inclusive, libertem or py4dstem"
                )
            })
    }
}

/// The pixels of `shape` about `center` on a `rows × columns` detector,
/// both edges included.
pub fn mask(detector: [usize; 2], center: [f64; 2], shape: Shape) -> PixelSet {
    mask_with(detector, center, shape, Edges::Inclusive)
}

/// The pixels of `shape` about `center` under the `edges` convention.
pub(crate) fn mask_with(
    detector: [usize; 2],
    center: [f64; 2],
    shape: Shape,
    edges: Edges,
) -> PixelSet {
    let (inner, outer) = match shape {
        Shape::Disk { radius } => (None, radius),
        Shape::Annulus { inner, outer } => (Some(inner), outer),
    };
    let [rows, columns] = detector;
    let mut pixels = Vec::new();
    for r in 0..rows {
        let dy = r as f64 - center[0];
        for c in 0..columns {
            let dx = c as f64 - center[1];
            // The distance itself (correctly rounded), not its square:
            // the tolerance is in pixels at every radius.
            let d = (dy * dy + dx * dx).sqrt();
            if edges.holds(d, inner, outer) {
                pixels.push((r * columns + c) as u32);
            }
        }
    }
    PixelSet::new(pixels)
}

/// Bins of a radial profile on `detector`: one per whole pixel of
/// distance up to the longest distance between two pixel centres, so any
/// centre on the detector fits.
pub(crate) fn radial_bins(detector: [usize; 2]) -> usize {
    let [rows, columns] = detector;
    let far = ((rows.max(1) - 1) as f64).hypot((columns.max(1) - 1) as f64);
    far.ceil() as usize + 1
}

/// The mean of `pattern` over the valid pixels of each ring `k ≤ d < k + 1`
/// about `center` ([`radial_bins`] of them; a distance within
/// [`EDGE_TOLERANCE`] of `k + 1` is in ring `k + 1`); NaN for an empty ring.
/// Pixels beyond the last ring (a centre off the detector) are left out.
pub(crate) fn radial_profile(
    pattern: &[f64],
    detector: [usize; 2],
    center: [f64; 2],
    valid: impl Fn(usize) -> bool,
) -> Vec<f64> {
    let bins = radial_bins(detector);
    let [_, columns] = detector;
    let mut sum = vec![0f64; bins];
    let mut count = vec![0usize; bins];
    for (p, &v) in pattern.iter().enumerate().filter(|&(p, _)| valid(p)) {
        let (dy, dx) = (
            (p / columns) as f64 - center[0],
            (p % columns) as f64 - center[1],
        );
        let k = ((dy * dy + dx * dx).sqrt() + EDGE_TOLERANCE).floor() as usize;
        if k < bins {
            sum[k] += v;
            count[k] += 1;
        }
    }
    sum.iter()
        .zip(&count)
        .map(|(&s, &n)| if n == 0 { f64::NAN } else { s / n as f64 })
        .collect()
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
pub(crate) fn find_disk(
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
pub(crate) fn default_annuli(detector: [usize; 2], center: [f64; 2], r: f64) -> [[f64; 2]; 3] {
    let d = farthest(detector, center);
    let a = (3.0 * r).min((1.2 * r + d) / 2.0);
    [[r / 2.0, r], [1.2 * r, a], [a, d]]
}

/// Geometry given by the user (mount options); what is missing is found
/// in the data or defaulted.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct DetectorOptions {
    pub center: Option<[f64; 2]>,
    pub bf_radius: Option<f64>,
    pub abf: Option<[f64; 2]>,
    pub adf: Option<[f64; 2]>,
    pub haadf: Option<[f64; 2]>,
    /// Which mask edges belong to the masks.
    pub edges: Edges,
    /// Index products (`virtual/sum.npy` and the tile-aligned parts of the
    /// detector images of counts files) decode and check every block they
    /// use against its spatial index before using the index. Off by
    /// default: those products exist to be computed without decoding
    /// (a whole-file `sum.npy` from the index alone), and with it off a
    /// block is still checked whenever anything decodes it, and a block
    /// found to disagree is never used again. On, a forged index whose
    /// file checksums were recomputed (which only `qem validate` or a
    /// decode would catch) is never served.
    pub verify_index: bool,
}

/// How the centre and bright-field radius were chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Both given by the user.
    Given,
    /// Found in the mean pattern of `frames` sampled frames.
    Found { disk: Disk, frames: usize },
    /// No disk qualified; the documented fallback (for what was not given).
    Fallback { reason: String, frames: usize },
}

/// The detectors of the `virtual/` images.
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    pub detector: [usize; 2],
    pub center: [f64; 2],
    pub bf_radius: f64,
    pub abf: [f64; 2],
    pub adf: [f64; 2],
    pub haadf: [f64; 2],
    pub origin: Origin,
    pub edges: Edges,
}

/// Blocks sampled for the mean pattern that locates the disk.
const SAMPLE_BLOCKS: usize = 4;

impl Geometry {
    /// The options completed from the data: the disk is looked for only
    /// when the centre or the radius is missing.
    pub fn resolve(reducer: &Reducer<'_>, options: &DetectorOptions) -> Result<Self, ReduceError> {
        let detector = reducer.detector();
        let (center, radius, origin) = match (options.center, options.bf_radius) {
            (Some(c), Some(r)) => (c, r, Origin::Given),
            _ => {
                let (pattern, frames) = reducer.sample_pattern(SAMPLE_BLOCKS)?;
                match find_disk(&pattern, detector, |p| reducer.is_valid(p)) {
                    Ok(disk) => (
                        options.center.unwrap_or(disk.center),
                        options.bf_radius.unwrap_or(disk.radius),
                        Origin::Found { disk, frames },
                    ),
                    Err(reason) => {
                        let (c, r) = fallback(detector);
                        (
                            options.center.unwrap_or(c),
                            options.bf_radius.unwrap_or(r),
                            Origin::Fallback { reason, frames },
                        )
                    }
                }
            }
        };
        let [abf, adf, haadf] = default_annuli(detector, center, radius);
        Ok(Geometry {
            detector,
            center,
            bf_radius: radius,
            abf: options.abf.unwrap_or(abf),
            adf: options.adf.unwrap_or(adf),
            haadf: options.haadf.unwrap_or(haadf),
            origin,
            edges: options.edges,
        })
    }

    /// The masks of `bf`, `abf`, `adf`, `haadf`, in that order.
    pub fn masks(&self) -> [PixelSet; 4] {
        let annulus = |[inner, outer]: [f64; 2]| Shape::Annulus { inner, outer };
        let m = |shape| self.mask(shape);
        [
            m(Shape::Disk {
                radius: self.bf_radius,
            }),
            m(annulus(self.abf)),
            m(annulus(self.adf)),
            m(annulus(self.haadf)),
        ]
    }

    /// Any detector's pixels under this geometry's edge convention.
    pub fn mask(&self, shape: Shape) -> PixelSet {
        mask_with(self.detector, self.center, shape, self.edges)
    }

    /// The `detectors.json` document.
    pub fn to_json(&self) -> Value {
        let masks = self.masks();
        let annulus = |[inner, outer]: [f64; 2], m: &PixelSet| json!({"shape": "annulus", "inner_radius": inner, "outer_radius": outer, "pixels": m.len()});
        let found = match &self.origin {
            Origin::Given => json!({"method": "given"}),
            Origin::Found { disk, frames } => json!({
                "method": "found",
                "algorithm": "mean pattern of sampled frames, 3x3 median, threshold half-way between median and maximum, 4-connected region holding the maximum; centre = centroid, radius = sqrt(area / pi)",
                "frames_sampled": frames,
                "center": disk.center,
                "radius": disk.radius,
                "threshold": disk.threshold,
                "median_level": disk.low,
                "maximum_level": disk.high,
                "area_pixels": disk.area,
            }),
            Origin::Fallback { reason, frames } => json!({
                "method": "fallback",
                "reason": reason,
                "frames_sampled": frames,
                "rule": "centre of the detector, radius min(rows, columns) / 8",
            }),
        };
        json!({
            "units": "detector pixels",
            "convention": "pixel centres at integer (row, column); a centre within 1e-9 pixels of an edge is on it",
            "mask_edges": self.edges.name(),
            "mask_edge_rule": self.edges.rule(),
            "detector_shape": self.detector,
            "center": self.center,
            "bright_field_radius": self.bf_radius,
            "bright_field_disk": found,
            "detectors": {
                "bf": {"shape": "disk", "radius": self.bf_radius, "pixels": masks[0].len()},
                "abf": annulus(self.abf, &masks[1]),
                "adf": annulus(self.adf, &masks[2]),
                "haadf": annulus(self.haadf, &masks[3]),
            },
            "defaults": "abf = [R/2, R]; adf = [1.2 R, a]; haadf = [a, D]; a = min(3 R, (1.2 R + D) / 2); D = distance to the farthest pixel centre",
        })
    }
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
    fn the_default_haadf_of_a_7x7_detector_gets_its_28_pixels() {
        // The fallback geometry of a flat 7×7 pattern: centre (3, 3), R = 1.
        let detector = [7, 7];
        let (center, radius) = fallback(detector);
        let [_, _, haadf] = default_annuli(detector, center, radius);
        // The outer radius is √18 in floating point; its square is
        // 17.999999999999996 < 18, the corners' squared distance.
        assert!(haadf[1] * haadf[1] < 18.0);
        let ring = mask(
            detector,
            center,
            Shape::Annulus {
                inner: haadf[0],
                outer: haadf[1],
            },
        );
        // Independent count: integer offsets with d >= a, all of them
        // within the farthest corner.
        let want = (-3i32..=3)
            .flat_map(|y| (-3i32..=3).map(move |x| f64::from(y * y + x * x)))
            .filter(|&d2| d2.sqrt() >= haadf[0])
            .count();
        assert_eq!((ring.len(), want), (28, 28));
        assert!(ring.pixels().contains(&0) && ring.pixels().contains(&48));
    }

    #[test]
    fn edge_conventions_of_other_tools() {
        // Centre (2, 2) of 5×5: distances 0, 1, √2, 2, √5, √8; the radii
        // fall on the pixel centres at d = 1 and d = 2, off by rounding.
        let (inner, outer) = (1.0 + 1e-12, 2.0 - 1e-12);
        let count = |edges, shape| mask_with([5, 5], [2.0, 2.0], shape, edges).len();
        let ring = Shape::Annulus { inner, outer };
        let disk = Shape::Disk { radius: outer };
        // Independent counts by distance: d=1 has 4 pixels, √2 4, d=2 4.
        assert_eq!(count(Edges::Inclusive, ring), 4 + 4 + 4);
        assert_eq!(count(Edges::Libertem, ring), 4 + 4);
        assert_eq!(count(Edges::Py4dstem, ring), 4);
        assert_eq!(count(Edges::Inclusive, disk), 1 + 4 + 4 + 4);
        assert_eq!(count(Edges::Libertem, disk), 1 + 4 + 4 + 4);
        assert_eq!(count(Edges::Py4dstem, disk), 1 + 4 + 4);
        for e in [Edges::Inclusive, Edges::Libertem, Edges::Py4dstem] {
            assert_eq!(e.name().parse::<Edges>(), Ok(e));
        }
        assert!("both".parse::<Edges>().is_err());
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
