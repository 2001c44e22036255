//! Plain timing benchmark of the `.semq` hot paths: encode, load + full
//! verification, and diff (loading included).
//!
//! Input: N rows (default 1,000,000; `SEMQ_BENCH_ROWS` overrides) of quant
//! dim 384 bins 4 with u64 ids, and a candidate with 1% of the rows
//! changed. Files are written to a temporary directory.
//!
//! Run: `cargo bench --bench semq` (or `SEMQ_BENCH_ROWS=200000 cargo
//! bench --bench semq` for a quicker look). Wall and CPU time are both
//! printed: on a shared machine the wall clock includes other processes.

use std::time::{Duration, Instant};

use qemfs::semq::{self, Config, Encoding, IdList};

const DIM: usize = 384;

#[path = "../examples/support/rng.rs"]
mod rng;
use rng::Rng;

fn unit_vector(rng: &mut Rng, out: &mut [f32]) {
    let v: Vec<f64> = (0..out.len()).map(|_| rng.gauss()).collect();
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    for (o, x) in out.iter_mut().zip(&v) {
        *o = (x / norm) as f32;
    }
}

/// CPU time (user + system) of this process so far, from /proc/self/stat:
/// on a shared machine the wall clock also counts other processes' work.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the full line (1-based).
    let total = ticks(11) + ticks(12);
    Duration::from_secs_f64(total as f64 / 100.0)
}

/// Best wall time of `runs` runs, and the CPU time of that run.
fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, Duration, T) {
    let mut best = (Duration::MAX, Duration::ZERO);
    let mut last = None;
    for _ in 0..runs {
        let c = cpu_time();
        let t = Instant::now();
        let r = f();
        let wall = t.elapsed();
        if wall < best.0 {
            best = (wall, cpu_time().saturating_sub(c));
        }
        last = Some(r);
    }
    (best.0, best.1, last.expect("at least one run"))
}

fn line(name: &str, wall: Duration, cpu: Duration, extra: &str) {
    println!(
        "{name:<18} wall {:7.3} s   cpu {:7.3} s   {extra}",
        wall.as_secs_f64(),
        cpu.as_secs_f64()
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench
    // targets too, and should not spend a minute here.
    if !std::env::args().any(|a| a == "--bench") && std::env::var_os("SEMQ_BENCH_ROWS").is_none() {
        println!("semq bench skipped: run it with `cargo bench --bench semq`");
        return;
    }
    let n: usize = std::env::var("SEMQ_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let config = Config::quant(DIM as u32, 4).expect("valid config");
    println!(
        "semq bench: {n} rows, quant dim {DIM} bins 4, u64 ids, {} threads",
        rayon::current_num_threads()
    );

    let t = Instant::now();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut vectors = vec![0f32; n * DIM];
    for row in vectors.chunks_exact_mut(DIM) {
        unit_vector(&mut rng, row);
    }
    // Sparse, shuffled-looking ids so that sorting has work to do.
    let ids: Vec<u64> = (0..n as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8)
        .collect();
    let mut candidate_vectors = vectors.clone();
    for row in candidate_vectors.chunks_exact_mut(DIM).step_by(100) {
        unit_vector(&mut rng, row);
    }
    println!("inputs generated in {:.2} s", t.elapsed().as_secs_f64());

    let pairs = [("encoder", "bench"), ("encoder_revision", "1")];
    let ids = IdList::U64(ids);
    let (enc_time, enc_cpu, reference) = best_of(3, || {
        semq::encode(config, &ids, &vectors, &pairs).expect("encode")
    });
    line(
        "encode",
        enc_time,
        enc_cpu,
        &format!(
            "{:.0} rows/s wall, {:.0} rows/s per 2 CPU-seconds",
            n as f64 / enc_time.as_secs_f64(),
            2.0 * n as f64 / enc_cpu.as_secs_f64().max(1e-9)
        ),
    );
    let candidate =
        semq::encode(config, &ids, &candidate_vectors, &pairs).expect("encode candidate");
    drop(vectors);
    drop(candidate_vectors);

    let dir = tempfile::tempdir().expect("temp dir");
    let ref_path = dir.path().join("reference.semq");
    let cand_path = dir.path().join("candidate.semq");
    let (write_time, write_cpu, ()) = best_of(1, || reference.write(&ref_path).expect("write"));
    candidate.write(&cand_path).expect("write candidate");
    line(
        "write (fsync)",
        write_time,
        write_cpu,
        &format!("{} bytes", reference.image().len()),
    );
    drop(reference);
    drop(candidate);

    let (load_time, load_cpu, loaded) = best_of(5, || Encoding::open(&ref_path).expect("load"));
    line("load + verify", load_time, load_cpu, "");
    drop(loaded);

    let (diff_time, diff_cpu, d) = best_of(5, || {
        let (a, b) = rayon::join(|| Encoding::open(&ref_path), || Encoding::open(&cand_path));
        a.expect("load reference")
            .diff(&b.expect("load candidate"))
            .expect("diff")
    });
    line(
        "diff incl. loads",
        diff_time,
        diff_cpu,
        &format!("{} changed, {} unchanged", d.changed.len(), d.n_unchanged),
    );
}
