//! Decode speed of the `.qem` reader: plain timing program (`harness = false`).
//!
//! Run: `cargo bench --bench qem_decode` (optionally `-- SCANS_SIDE DET_SIDE`,
//! default 64 and 128; `-- 128` is the issue-18 acquisition). With
//! `QEM_BENCH_FILE=PATH` the generated file is also written to `PATH`, for
//! timing `qem validate PATH`. With `QEM_BENCH_ONLY=rans` (or `whole`) it runs
//! nothing but the 4-lane rANS loop (or whole-array decoding), for profilers.
//!
//! The writer lives elsewhere, so this program builds its own input: a
//! minimal integer-codec encoder (the spec's §7.1 rANS encoder via
//! `qem::rans::encode`, the §7.2 model choice, the §6.3 spatial index and
//! the §2 envelope) turns a synthetic low-dose acquisition — Poisson counts
//! with a bright central disk — into an in-memory `.qem` file.

use std::time::{Duration, Instant};

use qemfs::qem::{rans, QemFile, ValidationLevel};
use sha2::{Digest, Sha256};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Knuth's method; fine for the small means used here.
    fn poisson(&mut self, mean: f64) -> u16 {
        let l = (-mean).exp();
        let (mut k, mut p) = (0u16, 1.0);
        loop {
            p *= self.unit();
            if p <= l {
                return k;
            }
            k += 1;
        }
    }
}

/// §7.2 model choice and encoding of one stream.
fn encode_stream(v: &[u16]) -> (u8, Vec<u8>) {
    let m = v.len();
    if v.iter().all(|&x| x == v[0]) {
        return if v[0] == 0 {
            (253, Vec::new())
        } else {
            (255, v[0].to_le_bytes().to_vec())
        };
    }
    let sum: u64 = v.iter().map(|&x| u64::from(x.min(32))).sum();
    let mean = (sum as f64 / m as f64).max(0.002);
    let k = ((mean / 0.002).ln() * 63.0 / 16000f64.ln())
        .round_ties_even()
        .clamp(0.0, 63.0) as usize;
    let mut best = (k as u8, rans::encode(k, v));
    if best.1.len() >= 2 * m {
        best = (254, v.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let nnz = v.iter().filter(|&&x| x != 0).count();
    if v.iter().all(|&x| x <= 128) && 2 * nnz < best.1.len() {
        let mut out = Vec::with_capacity(2 * nnz);
        for (t, &x) in v.iter().enumerate() {
            if x != 0 {
                out.extend_from_slice(&(((t as u16) << 7) | (x - 1)).to_le_bytes());
            }
        }
        best = (252, out);
    }
    best
}

fn pad8(body: &mut Vec<u8>) {
    while !body.len().is_multiple_of(8) {
        body.push(0);
    }
}

/// Builds a uint16 integer-codec file of `frames` frames of `r × c` pixels
/// (one chunk per 512 frames). Returns the file and the dense counts.
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
    let f8 = (r.div_ceil(8), c.div_ceil(8));
    let f32_ = (r.div_ceil(32), c.div_ceil(32));
    let fields = f8.0 * f8.1 + f32_.0 * f32_.1;
    let mut body = Vec::new();
    let mut chunks = Vec::new();
    let mut first = 0;
    while first < n {
        let m = 512.min(n - first);
        let mut payload = Vec::new();
        let mut offsets = vec![0u32];
        let mut selectors = Vec::new();
        let mut col = vec![0u16; m];
        for q in 0..p {
            for (t, v) in col.iter_mut().enumerate() {
                *v = dense[(first + t) * p + q];
            }
            let (sel, bytes) = encode_stream(&col);
            payload.extend_from_slice(&bytes);
            offsets.push(payload.len() as u32);
            selectors.push(sel);
        }
        let mut words = Vec::new();
        let mut word_offsets = vec![0u64];
        let mut widths = Vec::new();
        let mut sums = vec![0u32; fields * m];
        for t in 0..m {
            for q in 0..p {
                let (y, x) = (q / c, q % c);
                let v = u32::from(dense[(first + t) * p + q]);
                sums[((y / 8) * f8.1 + x / 8) * m + t] += v;
                sums[(f8.0 * f8.1 + (y / 32) * f32_.1 + x / 32) * m + t] += v;
            }
        }
        for f in 0..fields {
            let s = &sums[f * m..(f + 1) * m];
            let width = 32 - s.iter().max().copied().unwrap_or(0).leading_zeros();
            let mut bits = vec![0u32; (m * width as usize).div_ceil(32)];
            for (k, &v) in s.iter().enumerate() {
                for b in 0..width as usize {
                    if v >> b & 1 == 1 {
                        let bit = k * width as usize + b;
                        bits[bit / 32] |= 1 << (bit % 32);
                    }
                }
            }
            words.extend_from_slice(&bits);
            word_offsets.push(words.len() as u64);
            widths.push(width as u8);
        }
        let mut arrays = Vec::new();
        let parts: [(Vec<u8>, usize); 6] = [
            (payload.clone(), payload.len()),
            (
                offsets.iter().flat_map(|o| o.to_le_bytes()).collect(),
                offsets.len(),
            ),
            (selectors.clone(), selectors.len()),
            (
                words.iter().flat_map(|o| o.to_le_bytes()).collect(),
                words.len(),
            ),
            (
                word_offsets.iter().flat_map(|o| o.to_le_bytes()).collect(),
                word_offsets.len(),
            ),
            (widths.clone(), widths.len()),
        ];
        for (bytes, count) in parts {
            pad8(&mut body);
            arrays.push(format!("{{\"count\":{count},\"offset\":{}}}", body.len()));
            body.extend_from_slice(&bytes);
        }
        chunks.push(format!(
            "{{\"arrays\":[{}],\"first\":{first},\"scans\":{m}}}",
            arrays.join(",")
        ));
        first += m;
    }
    let sha: Vec<String> = body
        .chunks(64 << 20)
        .map(|b| format!("\"{}\"", qemfs::qem::checksum::sha256_hex(b)))
        .collect();
    let mut valid = "ff".repeat(p / 8);
    if !p.is_multiple_of(8) {
        valid += &format!("{:02x}", 0xffu8 << (8 - p % 8));
    }
    let header = format!(
        concat!(
            "{{\"bytes\":{},\"chunks\":[{}],\"codec\":\"runtime-column-rans-spatial-v2\",",
            "\"container\":\"quantem.qem\",\"container_version\":1,\"dtype\":\"uint16\",\"interval\":512,",
            "\"metadata\":{{}},\"profile\":\"runtime-column-rans-spatial-v2\",\"scientific_metadata\":{{",
            "\"axes\":[{{\"name\":\"scan_row\",\"size\":{}}},{{\"name\":\"scan_column\",\"size\":{}}},",
            "{{\"name\":\"detector_row\",\"size\":{}}},{{\"name\":\"detector_column\",\"size\":{}}}],",
            "\"processing\":[{{\"changes_measurements\":false,\"operation\":\"lossless_storage\"}}],",
            "\"schema\":\"quantem.scientific-metadata/2\",\"source_metadata\":{{}},",
            "\"source_metadata_coverage\":\"unknown\"}},\"sha256\":[{}],\"shape\":[{},{},{},{}],",
            "\"valid\":\"{}\",\"version\":1}}"
        ),
        body.len(),
        chunks.join(","),
        scan,
        scan,
        r,
        c,
        sha.join(","),
        scan,
        scan,
        r,
        c,
        valid
    );
    let mut file = Vec::with_capacity(56 + header.len() + body.len());
    file.extend_from_slice(b"QEMDATA1");
    file.extend_from_slice(&(header.len() as u64).to_le_bytes());
    file.extend_from_slice(&(56 + header.len() as u64).to_le_bytes());
    file.extend_from_slice(&Sha256::digest(header.as_bytes()));
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&body);
    (file, dense)
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
        "decode kernel: {} (QEMFS_KERNEL=avx512|avx2|portable picks another)",
        qemfs::qem::lanes::Kernel::best().name()
    );
    let qem = QemFile::from_bytes(file.clone()).expect("bench file opens");
    let report = qem
        .validate(ValidationLevel::Quick)
        .expect("bench file is valid");
    println!("model selectors present: {:?}", report.model_selectors);

    // Raw rANS: the entropy-coded streams of the first block, one core.
    let info = qem.blocks()[0];
    let m = info.frames;
    let p = qem.pixels();
    let mut streams: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut col = vec![0u16; m];
    for q in 0..p {
        for (t, v) in col.iter_mut().enumerate() {
            *v = dense[t * p + q];
        }
        // Force rANS with the §7.2 table so every stream is entropy coded.
        let sum: u64 = col.iter().map(|&x| u64::from(x.min(32))).sum();
        let mean = (sum as f64 / m as f64).max(0.002);
        let k = ((mean / 0.002).ln() * 63.0 / 16000f64.ln())
            .round_ties_even()
            .clamp(0.0, 63.0) as usize;
        streams.push((k, rans::encode(k, &col)));
    }
    let mut out = vec![0u16; p * m];
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
    println!("  one stream at a time   {}", rate(p * m, p * m * 2, one));
    println!("  4 streams in lockstep  {}", rate(p * m, p * m * 2, four));
    println!("  8 streams in lockstep  {}", rate(p * m, p * m * 2, eight));
    println!(
        "  16 streams in lockstep {}",
        rate(p * m, p * m * 2, sixteen)
    );
    println!("  16, frame-major output {}", rate(p * m, p * m * 2, rows));

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
