//! Encoding speed of the `.qem` writer on 4D-STEM-like uint16 counts.
//!
//! Run: `cargo bench --bench qem_write` (optional arguments: scan rows,
//! scan columns, detector size; `QEM_BENCH_MODEL=reference|smallest` runs one
//! policy, `QEM_BENCH_REPS` sets the repetitions, the best of which counts). Reports MB/s of dense input with 1 and 2
//! threads for both model policies, and the file sizes.

use std::time::Instant;

use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, Calibration, CountDtype, ModelChoice, WriteSpec,
};

#[path = "../examples/support/rng.rs"]
mod rng;
use rng::Rng;

/// Low-dose frames: a bright-field disk (mean 12 counts, drifting with the
/// scan position) over a dark field of 0.02 counts per pixel.
fn frames(scans: (usize, usize), det: usize) -> Vec<u8> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::with_capacity(scans.0 * scans.1 * det * det * 2);
    let radius = det as f64 / 8.0;
    for sr in 0..scans.0 {
        for sc in 0..scans.1 {
            let cy = det as f64 / 2.0 + (sr as f64 / scans.0 as f64 - 0.5) * 4.0;
            let cx = det as f64 / 2.0 + (sc as f64 / scans.1 as f64 - 0.5) * 4.0;
            for y in 0..det {
                for x in 0..det {
                    let r = ((y as f64 - cy).powi(2) + (x as f64 - cx).powi(2)).sqrt();
                    let mean = if r < radius { 12.0 } else { 0.02 };
                    out.extend_from_slice(&rng.poisson(mean).to_le_bytes());
                }
            }
        }
    }
    out
}

/// CPU seconds this process has used (all threads), from /proc; the
/// per-core figure stays meaningful on a machine shared with other work.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux configuration in practice.
    Some(ticks / 100.0)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols, det) = match args[..] {
        [r, c, d] => (r, c, d),
        _ => (64, 64, 128),
    };
    let shape = [rows as u64, cols as u64, det as u64, det as u64];
    let data = frames((rows, cols), det);
    let mb = data.len() as f64 / 1e6;
    println!("input: {rows}x{cols} scans x {det}x{det} uint16 = {mb:.1} MB");
    let sm = scientific_metadata(shape, &Calibration::default()).expect("metadata");
    let models = match std::env::var("QEM_BENCH_MODEL").as_deref() {
        Ok("reference") => vec![ModelChoice::Reference],
        Ok("smallest") => vec![ModelChoice::Smallest],
        _ => vec![ModelChoice::Reference, ModelChoice::Smallest],
    };
    let reps: usize = std::env::var("QEM_BENCH_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(4);
    for model in models {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            let spec = WriteSpec::counts(shape, CountDtype::U16, sm.clone()).with_model(model);
            // The best of several runs: the least disturbed by other work.
            let mut best = f64::INFINITY;
            let mut best_cpu = f64::INFINITY;
            let mut size = 0;
            for _ in 0..reps {
                let t = Instant::now();
                let c = cpu_seconds();
                let out = pool
                    .install(|| encode_to_vec(spec.clone(), &data))
                    .expect("encode");
                best = best.min(t.elapsed().as_secs_f64());
                if let (Some(a), Some(b)) = (c, cpu_seconds()) {
                    best_cpu = best_cpu.min(b - a);
                }
                size = out.len();
            }
            println!(
                "{model:?}, {threads} thread(s): {:.0} MB/s wall ({best:.3} s), {:.0} MB per CPU-second; \
                 file {size} bytes ({:.2} bits/count)",
                mb / best,
                mb / best_cpu,
                size as f64 * 8.0 / (data.len() / 2) as f64,
            );
        }
    }
}
