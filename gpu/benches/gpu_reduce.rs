//! Decode throughput and three reductions (bright-field virtual image, mean
//! pattern, centre-of-mass moments) on a generated acquisition, CPU
//! reference against the wgpu backend.
//!
//! `cargo bench -p qemfs-gpu --bench gpu_reduce`; the scan is
//! `QEMFS_BENCH_SCAN` × `QEMFS_BENCH_SCAN` frames (default 32) of a 128 × 128
//! uint16 detector at low dose with a bright disk, as a 4D-STEM acquisition.
//! Each figure is the best of `QEMFS_BENCH_REPEAT` runs (default 3).

use std::time::{Duration, Instant};

use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, Calibration, CountDtype, ModelChoice, WriteSpec,
};
use qemfs::qem::QemFile;
use qemfs::reduce::{Accelerator, Cpu, PixelSet, Request};
use qemfs_gpu::{BlockDecoder, Wgpu};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn acquisition(scan: usize, det: usize) -> QemFile {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let c = (det as f64 - 1.0) / 2.0;
    let radius = det as f64 / 8.0;
    let mut dense = Vec::with_capacity(scan * scan * det * det * 2);
    for _ in 0..scan * scan {
        for p in 0..det * det {
            let (dy, dx) = ((p / det) as f64 - c, (p % det) as f64 - c);
            let r = rnd();
            let v: u16 = if dy * dy + dx * dx <= radius * radius {
                20 + (r % 40) as u16
            } else if r % 16 == 0 {
                1 + (r >> 40) as u16 % 3
            } else {
                0
            };
            dense.extend_from_slice(&v.to_le_bytes());
        }
    }
    let shape = [scan as u64, scan as u64, det as u64, det as u64];
    let sm = scientific_metadata(shape, &Calibration::default()).expect("metadata");
    let spec = WriteSpec::counts(shape, CountDtype::U16, sm).with_model(ModelChoice::Reference);
    QemFile::from_bytes(encode_to_vec(spec, &dense).expect("encode")).expect("open")
}

fn best(repeat: usize, mut f: impl FnMut()) -> Duration {
    (0..repeat)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let scan = env_usize("QEMFS_BENCH_SCAN", 32);
    let det = env_usize("QEMFS_BENCH_DET", 128);
    let repeat = env_usize("QEMFS_BENCH_REPEAT", 3);
    let t = Instant::now();
    let file = acquisition(scan, det);
    let samples = (file.frames() * file.pixels()) as f64;
    eprintln!(
        "acquisition: {scan}x{scan} scan, {det}x{det} uint16 detector, {:.1} M samples, {:.1} MB encoded (made in {:.1} s)",
        samples / 1e6,
        file.file_bytes() as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    let mut gpus: Vec<(&str, Box<dyn BlockDecoder>)> = Vec::new();
    match Wgpu::new(true) {
        Ok(g) => {
            println!("wgpu adapter: {}", g.describe());
            gpus.push(("wgpu", Box::new(g)));
        }
        Err(e) => eprintln!("no wgpu adapter ({e})"),
    }
    #[cfg(feature = "cuda")]
    match qemfs_gpu::Cuda::new() {
        Ok(c) => {
            println!("cuda device: {}", c.describe());
            gpus.push(("cuda", Box::new(c)));
        }
        Err(e) => eprintln!("no CUDA ({e})"),
    }
    run(&file, samples, repeat, &gpus);
}

fn run(file: &QemFile, samples: f64, repeat: usize, gpus: &[(&str, Box<dyn BlockDecoder>)]) {
    let blocks = 0..file.blocks().len();
    let [_, _, rows, cols] = file.shape();
    let (cr, cc) = ((rows as f64 - 1.0) / 2.0, (cols as f64 - 1.0) / 2.0);
    let bf = PixelSet::new(
        (0..rows * cols)
            .filter(|&p| {
                let (y, x) = ((p / cols) as f64 - cr, (p % cols) as f64 - cc);
                (y * y + x * x).sqrt() <= rows as f64 / 8.0
            })
            .map(|p| p as u32)
            .collect(),
    );
    let line = |what: &str, t: Duration| {
        println!(
            "{:<28} {:>10.4} s {:>10.1} M samples/s",
            what,
            t.as_secs_f64(),
            samples / t.as_secs_f64() / 1e6
        )
    };
    // Decoding every stream: the CPU into memory, the GPUs on the device
    // (each stream checked, only fault records read back).
    let mut codes = vec![0u16; file.frames() * file.pixels()];
    line(
        "cpu decode (read_all_codes)",
        best(repeat, || file.read_all_codes(&mut codes).expect("decode")),
    );
    for (name, gpu) in gpus {
        gpu.decode_blocks(file, blocks.clone()).expect("gpu decode");
        let t = best(repeat, || {
            gpu.decode_blocks(file, blocks.clone()).expect("gpu decode")
        });
        line(&format!("{name} decode"), t);
    }
    let requests = [
        (
            "BF virtual image",
            Request {
                masks: vec![bf],
                ..Request::default()
            },
        ),
        (
            "mean pattern",
            Request {
                pattern: true,
                ..Request::default()
            },
        ),
        (
            "CoM moments",
            Request {
                moments: true,
                ..Request::default()
            },
        ),
    ];
    for (what, req) in &requests {
        line(
            &format!("cpu {what}"),
            best(repeat, || {
                Cpu.reduce(file, blocks.clone(), req).expect("cpu reduce");
            }),
        );
        for (name, gpu) in gpus {
            // Warm-up: the first use allocates and uploads.
            gpu.reduce(file, blocks.clone(), req).expect("gpu reduce");
            let t = best(repeat, || {
                gpu.reduce(file, blocks.clone(), req).expect("gpu reduce");
            });
            line(&format!("{name} {what}"), t);
        }
    }
}
