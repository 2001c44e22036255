//! Writes the bundled example files into `examples/data/` with our own
//! writers: a 4D-STEM acquisition of counts (with calibration and a few
//! invalid pixels), a float32 acquisition, a scaled-code result and an
//! embedding state. Deterministic: the same bytes on every run, which a
//! test checks.
//!
//! `cargo run --release --example make_examples [OUT_DIR]`
//! `cargo run --release --example make_examples -- --acquisition OUT.qem ROWS COLS DET`
//! writes one larger uint16 acquisition of the same kind (for benchmarks).

use std::path::{Path, PathBuf};

use qemfs::qem::write::{
    scientific_metadata, Calibration, Content, CountDtype, DetectorUnit, ScaledRegion, WriteSpec,
    Writer,
};
use qemfs::semq::{Config, IdList};
use serde_json::Map;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

/// Counts of a convergent-beam pattern: a bright disk whose centre moves a
/// little with the scan position (a deflection a CoM image shows), and a
/// weak diffuse background.
fn counts_frame(rng: &mut Rng, row: usize, col: usize, det: usize) -> Vec<u16> {
    let c = det as f64 / 2.0 - 0.5;
    let (dy, dx) = (
        1.5 * (row as f64 * 0.4).sin(),
        1.5 * (col as f64 * 0.3).cos(),
    );
    let radius = det as f64 * 0.16;
    let mut out = Vec::with_capacity(det * det);
    for r in 0..det {
        for q in 0..det {
            let d = ((r as f64 - c - dy).powi(2) + (q as f64 - c - dx).powi(2)).sqrt();
            let mean = if d <= radius {
                30.0 + 8.0 * ((row + col) % 5) as f64
            } else {
                0.05 + 2.0 / (1.0 + (d - radius).powi(2))
            };
            out.push(rng.poisson(mean));
        }
    }
    out
}

fn write_counts(dir: &Path) {
    write_acquisition(&dir.join("scan-u16.qem"), 24, 32, 64);
}

fn write_acquisition(path: &Path, rows: usize, cols: usize, det: usize) {
    let shape = [rows as u64, cols as u64, det as u64, det as u64];
    let calibration = Calibration {
        scan_sampling_angstrom: Some([0.5, 0.5]),
        detector_sampling: Some(([0.8, 0.8], DetectorUnit::Mrad)),
        voltage_kv: Some(300.0),
        provenance: "example generator".into(),
        ..Calibration::default()
    };
    let sm = scientific_metadata(shape, &calibration).expect("valid calibration");
    // Two hot pixels are marked invalid: they stay stored, but sums skip them.
    let pixels = det * det;
    let hot = [(3 * det + 60) % pixels, (50 * det + 7) % pixels];
    let mut valid = vec![true; pixels];
    valid[hot[0]] = false;
    valid[hot[1]] = false;
    let mut spec = WriteSpec::counts(shape, CountDtype::U16, sm);
    spec.content = Content::Counts {
        dtype: CountDtype::U16,
        valid: Some(valid),
        metadata: Map::new(),
    };
    let mut writer = Writer::create(path, spec).expect("new file");
    let mut rng = Rng(0x5EED_0001);
    for row in 0..rows {
        for col in 0..cols {
            let mut frame = counts_frame(&mut rng, row, col, det);
            frame[hot[0]] = 60_000;
            frame[hot[1]] = 4_000;
            writer.push_u16(&frame).expect("frame");
        }
    }
    writer.finish().expect("publish");
}

fn write_float(dir: &Path) {
    let (rows, cols, det) = (8usize, 8usize, 32usize);
    let shape = [rows as u64, cols as u64, det as u64, det as u64];
    let sm = scientific_metadata(shape, &Calibration::default()).expect("metadata");
    let mut writer =
        Writer::create(dir.join("empad-f32.qem"), WriteSpec::float32(shape, sm)).expect("new file");
    let mut rng = Rng(0x5EED_0002);
    for row in 0..rows {
        for col in 0..cols {
            let frame: Vec<f32> = counts_frame(&mut rng, row, col, det)
                .iter()
                .map(|&c| (f64::from(c) * 11.3 + rng.normal() * 2.0) as f32)
                .collect();
            writer.push_f32(&frame).expect("frame");
        }
    }
    writer.finish().expect("publish");
}

fn write_scaled(dir: &Path) {
    let (rows, cols, det) = (6usize, 10usize, 16usize);
    let frames = (rows * cols) as u64;
    let shape = [rows as u64, cols as u64, det as u64, det as u64];
    let calibration = Calibration {
        processing: vec![Calibration::scaled_quantization_record()],
        ..Calibration::default()
    };
    let sm = scientific_metadata(shape, &calibration).expect("metadata");
    let regions = vec![
        ScaledRegion {
            first_frame: 0,
            stop_frame: frames / 2,
            scale: 0.01,
            offset: -1.0,
            intensity_min: -1.0,
            intensity_max: 654.35,
            extra: Map::new(),
        },
        ScaledRegion {
            first_frame: frames / 2,
            stop_frame: frames,
            scale: 0.02,
            offset: 0.5,
            intensity_min: 0.5,
            intensity_max: 1311.2,
            extra: Map::new(),
        },
    ];
    let mut writer = Writer::create(
        dir.join("derived-scaled.qem"),
        WriteSpec::scaled(shape, regions, sm),
    )
    .expect("new file");
    let mut rng = Rng(0x5EED_0003);
    for f in 0..frames as usize {
        let codes: Vec<u16> = counts_frame(&mut rng, f / cols, f % cols, det)
            .iter()
            .map(|&c| c.saturating_mul(100))
            .collect();
        writer.push_u16(&codes).expect("frame");
    }
    writer.finish().expect("publish");
}

fn write_semq(dir: &Path) {
    let (n, dim) = (500usize, 64usize);
    let mut rng = Rng(0x5EED_0004);
    let mut vectors = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let row: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
        let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
        vectors.extend(row.iter().map(|v| (v / norm) as f32));
    }
    let ids = IdList::Utf8((0..n).map(|i| format!("doc-{i:04}").into_bytes()).collect());
    let config = Config::quant(dim as u32, 4).expect("config");
    let manifest = [("model", "example-encoder"), ("revision", "1")];
    let encoding = qemfs::semq::encode(config, &ids, &vectors, &manifest).expect("encode");
    encoding
        .write(dir.join("embeddings.semq"))
        .expect("publish");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--acquisition") {
        let number = |i: usize| -> usize {
            args.get(i)
                .and_then(|a| a.parse().ok())
                .expect("usage: --acquisition OUT.qem ROWS COLS DET")
        };
        let out = PathBuf::from(
            args.get(2)
                .expect("usage: --acquisition OUT.qem ROWS COLS DET"),
        );
        write_acquisition(&out, number(3), number(4), number(5));
        println!("wrote {}", out.display());
        return;
    }
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data"));
    std::fs::create_dir_all(&dir).expect("output folder");
    write_counts(&dir);
    write_float(&dir);
    write_scaled(&dir);
    write_semq(&dir);
    println!("wrote the examples into {}", dir.display());
}
