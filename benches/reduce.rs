//! Speed of the reductions behind `virtual/` (CPU reference): plain timing
//! program (`harness = false`).
//!
//! Run: `cargo bench --bench reduce` (optionally `-- SCANS_SIDE DET_SIDE`,
//! default 64 and 128, or `-- FILE.qem` to time an existing uint16 counts
//! file, such as the one `qem_decode -- 128` writes with
//! `QEM_BENCH_FILE`). Input otherwise: a synthetic low-dose uint16 acquisition
//! (Poisson counts, a bright disk of radius 0.16 × detector that moves
//! slightly with the scan, a weak diffuse halo), written in memory with the
//! library's writer. Each figure is the best of three runs.

use std::time::{Duration, Instant};

use qemfs::qem::write::{encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec};
use qemfs::qem::QemFile;
use qemfs::reduce::geometry::{mask, DetectorOptions, Geometry, Shape};
use qemfs::reduce::{Cpu, PixelSet, Reducer};

#[path = "../examples/support/rng.rs"]
mod rng;
use rng::Rng;

fn acquisition(scan: usize, det: usize) -> Vec<u8> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let c = det as f64 / 2.0 - 0.5;
    let radius = det as f64 * 0.16;
    let mut out = Vec::with_capacity(scan * scan * det * det * 2);
    for row in 0..scan {
        for col in 0..scan {
            let (dy, dx) = (
                1.5 * (row as f64 * 0.4).sin(),
                1.5 * (col as f64 * 0.3).cos(),
            );
            for r in 0..det {
                for q in 0..det {
                    let d = ((r as f64 - c - dy).powi(2) + (q as f64 - c - dx).powi(2)).sqrt();
                    let mean = if d <= radius {
                        3.0
                    } else {
                        0.02 + 0.5 / (1.0 + (d - radius).powi(2))
                    };
                    out.extend_from_slice(&rng.poisson(mean).to_le_bytes());
                }
            }
        }
    }
    out
}

fn best<T>(mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..3 {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        out = Some(v);
    }
    (best, out.expect("ran"))
}

fn main() {
    let given = std::env::args().skip(1).find(|a| a.ends_with(".qem"));
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let file = match &given {
        Some(path) => QemFile::open(path).expect("opens the given file"),
        None => {
            let scan = args.first().copied().unwrap_or(64);
            let det = args.get(1).copied().unwrap_or(128);
            let shape = [scan as u64, scan as u64, det as u64, det as u64];
            let spec = WriteSpec::counts(
                shape,
                CountDtype::U16,
                scientific_metadata(shape, &Calibration::default()).expect("metadata"),
            );
            let dense = acquisition(scan, det);
            QemFile::from_bytes(encode_to_vec(spec, &dense).expect("writes")).expect("opens")
        }
    };
    let [scan_r, scan_c, det, det_c] = file.shape();
    let samples = (scan_r * scan_c * det * det_c) as f64;
    println!(
        "{} {scan_r}x{scan_c} scans x {det}x{det_c} uint16 ({:.0} MB decoded), {} threads",
        given.as_deref().unwrap_or("synthetic"),
        samples * 2.0 / 1e6,
        rayon::current_num_threads()
    );
    let reducer = Reducer::new(&file, &Cpu).expect("reducer");

    let (t, _) = best(|| {
        let mut out = vec![0u8; samples as usize * 2];
        file.read_all(&mut out).expect("decodes");
    });
    println!(
        "whole-array decode (reference)  {:8.1} ms  {:.3} G samples/s",
        t.as_secs_f64() * 1e3,
        samples / t.as_secs_f64() / 1e9
    );
    let (t, geometry) =
        best(|| Geometry::resolve(&reducer, &DetectorOptions::default()).expect("geometry"));
    println!(
        "find the disk (4 sampled blocks) {:8.1} ms  centre ({:.2}, {:.2}) radius {:.2}",
        t.as_secs_f64() * 1e3,
        geometry.center[0],
        geometry.center[1],
        geometry.bf_radius
    );
    let masks = geometry.masks();
    let decoded: usize = masks.iter().map(|m| m.len()).sum();
    let (t, _) = best(|| reducer.images(&masks).expect("images"));
    println!(
        "bf+abf+adf+haadf images          {:8.1} ms  ({decoded} mask pixels; tiles from the index)",
        t.as_secs_f64() * 1e3
    );
    let (t, _) = best(|| reducer.images(&masks[..1]).expect("bf"));
    println!(
        "bf image alone                   {:8.1} ms",
        t.as_secs_f64() * 1e3
    );
    let small = mask(
        [det, det_c],
        [det as f64 * 0.3, det_c as f64 * 0.6],
        Shape::Disk { radius: 4.0 },
    );
    let (t, _) = best(|| reducer.images(std::slice::from_ref(&small)).expect("disk"));
    println!(
        "custom disk r=4 ({} pixels)       {:8.1} ms",
        small.len(),
        t.as_secs_f64() * 1e3
    );
    let bf = &masks[0];
    let (t, _) = best(|| reducer.masked_com(bf, geometry.center).expect("masked com"));
    println!(
        "com inside the bf disk ({} px)  {:8.1} ms  (bit-plane sums of the mask, one pass)",
        bf.len(),
        t.as_secs_f64() * 1e3
    );
    let point = PixelSet::new(vec![(det / 2 * det_c + det_c / 3) as u32]);
    let (t, _) = best(|| reducer.images(std::slice::from_ref(&point)).expect("point"));
    println!(
        "point detector                   {:8.1} ms",
        t.as_secs_f64() * 1e3
    );
    let (t, _) = best(|| reducer.full().expect("full"));
    println!(
        "com + mean_dp + max_dp (one pass) {:7.1} ms  {:.3} G samples/s",
        t.as_secs_f64() * 1e3,
        samples / t.as_secs_f64() / 1e9
    );
}
