//! Decode speed of the `.qem` reader: plain timing program (`harness = false`).
//!
//! Run: `cargo bench --bench qem_decode` (optionally `-- SCANS_SIDE DET_SIDE`,
//! default 64 and 128; `-- 128` is the issue-18 acquisition). With
//! `QEM_BENCH_FILE=PATH` the generated file is also written to `PATH`, for
//! timing `qem validate PATH`. With `QEM_BENCH_ONLY=rans` (or `whole`) it runs
//! nothing but the 4-lane rANS loop (or whole-array decoding), for profilers.
//!
//! Its input is a synthetic low-dose acquisition — Poisson counts with a
//! bright central disk — written in memory by the library's writer with the
//! reference model choice (spec §7.2), as the reference writer makes them.

use std::time::{Duration, Instant};

use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, Calibration, CountDtype, ModelChoice, WriteSpec,
};
use qemfs::qem::{rans, tables, QemFile, ValidationLevel};

#[path = "../examples/support/rng.rs"]
mod rng;
use rng::Rng;

/// Builds a uint16 integer-codec file of `scan × scan` frames of `r × c`
/// pixels (the writer's default chunks of 512 frames). Returns the file and
/// the dense counts.
fn build_file(scan: usize, r: usize, c: usize) -> (Vec<u8>, Vec<u16>) {
    let n = scan * scan;
    let p = r * c;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (cr, cc, radius) = (r as f64 / 2.0, c as f64 / 2.0, r.min(c) as f64 / 6.0);
    let means: Vec<f64> = (0..p)
        .map(|q| {
            let (y, x) = ((q / c) as f64 - cr, (q % c) as f64 - cc);
            if (y * y + x * x).sqrt() < radius {
                4.0
            } else {
                0.05
            }
        })
        .collect();
    let mut dense = vec![0u16; n * p];
    for t in 0..n {
        for q in 0..p {
            dense[t * p + q] = rng.poisson(means[q]);
        }
    }
    let shape = [scan, scan, r, c].map(|s| s as u64);
    let sm = scientific_metadata(shape, &Calibration::default()).expect("metadata");
    let spec = WriteSpec::counts(shape, CountDtype::U16, sm).with_model(ModelChoice::Reference);
    let bytes: Vec<u8> = dense.iter().flat_map(|v| v.to_le_bytes()).collect();
    (
        encode_to_vec(spec, &bytes).expect("bench file written"),
        dense,
    )
}

/// CPU time of the calling thread in ns (from the scheduler's accounting),
/// so that figures stay meaningful on a machine shared with other work.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Best of `reps` runs: (wall time, CPU time of the calling thread).
fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (Duration, Duration) {
    (0..reps)
        .map(|_| {
            let c = thread_cpu_ns();
            let t = Instant::now();
            std::hint::black_box(f());
            let wall = t.elapsed();
            let cpu = match (c, thread_cpu_ns()) {
                (Some(a), Some(b)) => Duration::from_nanos(b - a),
                _ => wall,
            };
            (wall, cpu)
        })
        .min()
        .unwrap_or_default()
}

/// Wall-clock figures only: for work spread over several threads, or too
/// short for the scheduler's accounting.
fn rate_wall(samples: usize, bytes: usize, (wall, _): (Duration, Duration)) -> String {
    let s = wall.as_secs_f64();
    format!(
        "wall {:8.3} ms {:6.3} G samples/s {:8.1} MB/s",
        s * 1e3,
        samples as f64 / s / 1e9,
        bytes as f64 / s / 1e6
    )
}

fn rate(samples: usize, bytes: usize, (wall, cpu): (Duration, Duration)) -> String {
    let (s, c) = (wall.as_secs_f64(), cpu.as_secs_f64());
    format!(
        "wall {:8.3} ms {:6.3} G samples/s {:8.1} MB/s | thread CPU {:8.3} ms {:6.3} G samples/s {:8.1} MB/s",
        s * 1e3,
        samples as f64 / s / 1e9,
        bytes as f64 / s / 1e6,
        c * 1e3,
        samples as f64 / c / 1e9,
        bytes as f64 / c / 1e6,
    )
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let scan = args.first().copied().unwrap_or(64);
    let det = args.get(1).copied().unwrap_or(128);
    let threads = rayon::current_num_threads();
    println!("qem decode benchmark: {scan}x{scan} scans, {det}x{det} detector, uint16, {threads} threads");

    let t = Instant::now();
    let (file, dense) = build_file(scan, det, det);
    let samples = dense.len();
    let dense_bytes: Vec<u8> = dense.iter().flat_map(|v| v.to_le_bytes()).collect();
    println!(
        "built in {:.1} s: {} bytes for {} dense bytes (ratio {:.2})",
        t.elapsed().as_secs_f64(),
        file.len(),
        dense_bytes.len(),
        dense_bytes.len() as f64 / file.len() as f64
    );

    if let Ok(path) = std::env::var("QEM_BENCH_FILE") {
        // The same acquisition on disk, for `qem validate` (whole process).
        std::fs::write(&path, &file).expect("bench file written");
        println!("written to {path}");
    }
    println!(
        "decode kernel: {} (QEMFS_KERNEL=avx512vbmi2|avx512|avx2|portable picks another)",
        qemfs::qem::lanes::Kernel::best().name()
    );
    let qem = QemFile::from_bytes(file.clone()).expect("bench file opens");
    let report = qem
        .validate(ValidationLevel::Quick)
        .expect("bench file is valid");
    println!("model selectors present: {:?}", report.model_selectors);

    // Raw rANS: the entropy-coded streams of the first block (nearly every
    // pixel's at this dose; the few stored in another form are left out),
    // one core.
    let info = qem.blocks()[0];
    let m = info.frames;
    let raw = qem.raw_block_streams(0).expect("block 0's streams");
    let offset =
        |j: usize| u32::from_le_bytes(raw.offsets[4 * j..4 * j + 4].try_into().unwrap()) as usize;
    let streams: Vec<(usize, Vec<u8>)> = (0..raw.streams)
        .filter(|&j| usize::from(raw.selectors[j]) < tables::TABLES)
        .map(|j| {
            let bytes = raw.payload[offset(j)..offset(j + 1)].to_vec();
            (usize::from(raw.selectors[j]), bytes)
        })
        .collect();
    let p = qem.pixels();
    // rANS streams of the block (`p` where every stream is one).
    let coded = streams.len();
    let mut out = vec![0u16; coded * m];
    let only = std::env::var("QEM_BENCH_ONLY").unwrap_or_default();
    if only == "rans" {
        // For profilers: nothing but the 16-lane lockstep loop (the
        // library's group size), repeated.
        for _ in 0..200 {
            for (group, o) in streams.chunks_exact(16).zip(out.chunks_exact_mut(16 * m)) {
                let outs: Vec<&mut [u16]> = o.chunks_exact_mut(m).collect();
                let outs: [&mut [u16]; 16] = outs.try_into().unwrap();
                let ins: [(usize, &[u8]); 16] =
                    std::array::from_fn(|j| (group[j].0, &group[j].1[..]));
                rans::decode_many(ins, outs).unwrap();
            }
        }
        return;
    }
    let one = best(5, || {
        for ((k, s), o) in streams.iter().zip(out.chunks_exact_mut(m)) {
            rans::decode(*k, s, o).unwrap();
        }
    });
    let four = best(5, || {
        for (group, o) in streams.chunks_exact(4).zip(out.chunks_exact_mut(4 * m)) {
            let outs: Vec<&mut [u16]> = o.chunks_exact_mut(m).collect();
            let outs: [&mut [u16]; 4] = outs.try_into().unwrap();
            let ins: [(usize, &[u8]); 4] = std::array::from_fn(|j| (group[j].0, &group[j].1[..]));
            rans::decode_many(ins, outs).unwrap();
        }
    });
    let eight = best(5, || {
        for (group, o) in streams.chunks_exact(8).zip(out.chunks_exact_mut(8 * m)) {
            let outs: Vec<&mut [u16]> = o.chunks_exact_mut(m).collect();
            let outs: [&mut [u16]; 8] = outs.try_into().unwrap();
            let ins: [(usize, &[u8]); 8] = std::array::from_fn(|j| (group[j].0, &group[j].1[..]));
            rans::decode_many(ins, outs).unwrap();
        }
    });
    let sixteen = best(5, || {
        for (group, o) in streams.chunks_exact(16).zip(out.chunks_exact_mut(16 * m)) {
            let outs: Vec<&mut [u16]> = o.chunks_exact_mut(m).collect();
            let outs: [&mut [u16]; 16] = outs.try_into().unwrap();
            let ins: [(usize, &[u8]); 16] = std::array::from_fn(|j| (group[j].0, &group[j].1[..]));
            rans::decode_many(ins, outs).unwrap();
        }
    });
    if only == "whole" {
        // For profilers: nothing but whole-array decoding, repeated.
        let mut out = vec![0u8; qem.dense_bytes().unwrap()];
        for _ in 0..5 {
            qem.read_all(&mut out).unwrap();
        }
        return;
    }
    let rows = best(5, || {
        for (group, o) in streams.chunks_exact(16).zip(out.chunks_exact_mut(16 * m)) {
            let ins: [(usize, &[u8]); 16] = std::array::from_fn(|j| (group[j].0, &group[j].1[..]));
            rans::decode_many_rows(ins, m, o, 16).unwrap();
        }
    });
    let rans_bytes: usize = streams.iter().map(|s| s.1.len()).sum();
    println!(
        "rANS only ({} streams x {m}, {rans_bytes} coded bytes), 1 core:",
        streams.len()
    );
    for (what, took) in [
        ("one stream at a time  ", one),
        ("4 streams in lockstep ", four),
        ("8 streams in lockstep ", eight),
        ("16 streams in lockstep", sixteen),
        ("16, frame-major output", rows),
    ] {
        println!("  {what} {}", rate(coded * m, coded * m * 2, took));
    }

    let block_bytes = info.decoded_bytes;
    for n_threads in [1, threads] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut out = vec![0u8; qem.dense_bytes().unwrap()];
            let whole = best(3, || qem.read_all(&mut out).unwrap());
            assert!(out == dense_bytes, "decoded array differs from the source");
            let block = best(5, || drop(qem.decode_block(0).unwrap()));
            // Into a buffer decoded into before: the decode alone, without
            // the fresh buffer's page faults (its parts write straight
            // into their columns of each frame).
            let mut reused = vec![0u8; block_bytes];
            qem.decode_block_into(0, &mut reused).unwrap();
            let into = best(5, || qem.decode_block_into(0, &mut reused).unwrap());
            let mut frame = vec![0u8; qem.frame_bytes()];
            let cold = best(5, || qem.read_frame(7, &mut frame).unwrap());
            // Thread CPU time covers only the calling thread: shown for one.
            let show = |n, b, d| {
                if n_threads == 1 {
                    rate(n, b, d)
                } else {
                    rate_wall(n, b, d)
                }
            };
            println!("{n_threads} thread(s):");
            println!(
                "  whole array            {}",
                show(samples, dense_bytes.len(), whole)
            );
            println!(
                "  one block (512 scans)  {}",
                show(m * p, block_bytes, block)
            );
            println!(
                "  one block, reused out  {}",
                show(m * p, block_bytes, into)
            );
            println!(
                "  one frame, cold block  {}",
                show(p, qem.frame_bytes(), cold)
            );
        });
    }
    let decoded = qem.decode_block(0).unwrap();
    let fb = qem.frame_bytes();
    let mut frame = vec![0u8; fb];
    let warm = best(50, || frame.copy_from_slice(&decoded[7 * fb..8 * fb]));
    println!("one frame from a decoded block: {}", rate_wall(p, fb, warm));

    let fresh = QemFile::from_bytes(file.clone()).unwrap();
    let verify = best(1, || fresh.verify_body().unwrap());
    println!(
        "body checksums (first access, all threads): {}",
        rate_wall(0, qem.body_bytes(), verify)
    );
    let full = best(1, || qem.validate(ValidationLevel::Full).unwrap());
    println!(
        "full validation (all threads): {}",
        rate_wall(samples, dense_bytes.len(), full)
    );
}
