//! Crash safety of the commands that write files: `qem convert` and
//! `semq encode` are killed with SIGKILL at points spread over their run
//! (fractions of the time one whole run takes, plus fixed early points).
//! While a run goes on, the final name is watched as a reader would, and
//! after every kill:
//!
//! * the final name holds nothing, the file that was there before
//!   (`--force`), or the complete output, byte-identical to an
//!   uninterrupted run (which is itself fully validated);
//! * everything else the killed run left in the output folder is a
//!   temporary named `.NAME.tmp-PID-...` with the killed process's PID.
//!
//! At the end one more run, not killed, must succeed and leave only the
//! output behind: the temporaries of the killed runs are cleaned.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use qemfs::npy::{self, DType};
use qemfs::qem::{QemFile, ValidationLevel};
use qemfs::semq::Encoding;
use rand::{rngs::Xoshiro256PlusPlus, Rng, RngExt, SeedableRng};

fn write_npy(path: &Path, dtype: DType, shape: &[usize], data: &[u8]) {
    let mut bytes = npy::encode_header(dtype, shape);
    bytes.extend_from_slice(data);
    fs::write(path, bytes).unwrap();
}

/// Entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

struct Job {
    program: PathBuf,
    args: Vec<OsString>,
    out_dir: PathBuf,
    out_name: String,
}

impl Job {
    fn out(&self) -> PathBuf {
        self.out_dir.join(&self.out_name)
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    /// One whole run; its duration.
    fn run(&self) -> Duration {
        let t = Instant::now();
        let out = self.command().output().unwrap();
        assert!(
            out.status.success(),
            "{} {:?}: {}",
            self.program.display(),
            self.args,
            String::from_utf8_lossy(&out.stderr)
        );
        t.elapsed()
    }

    /// Starts a run and kills it (SIGKILL) after `delay`; the PID and
    /// whether it had already finished. Until the kill, the final name is
    /// watched like a reader would (every millisecond or so): `look` is
    /// called with what it holds whenever that changes.
    fn kill_after(&self, delay: Duration, mut look: impl FnMut(Option<&[u8]>)) -> (u32, bool) {
        let mut child = self.command().stderr(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        let start = Instant::now();
        let mut seen: Option<(u64, std::time::SystemTime)> = None;
        while start.elapsed() < delay {
            if let Ok(meta) = fs::metadata(self.out()) {
                let stamp = (meta.len(), meta.modified().unwrap());
                if seen != Some(stamp) {
                    seen = Some(stamp);
                    look(fs::read(self.out()).ok().as_deref());
                }
            }
            sleep(Duration::from_micros(500).min(delay.saturating_sub(start.elapsed())));
        }
        let finished = child.try_wait().unwrap().is_some();
        // Fails only when the process is already gone.
        let _ = child.kill();
        child.wait().unwrap();
        (pid, finished)
    }
}

/// Kills `job` at points spread over a whole run and checks what is left
/// each time (see the module documentation). `before` is what the final
/// name holds before each run (`None`: nothing), `complete` the bytes of an
/// uninterrupted run.
fn kill_at_many_points(job: &Job, before: Option<&[u8]>, complete: &[u8], whole: Duration) {
    let restore = || match before {
        Some(bytes) => fs::write(job.out(), bytes).unwrap(),
        None => {
            let _ = fs::remove_file(job.out());
        }
    };
    let mut delays: Vec<Duration> = [0.02, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95, 1.05]
        .iter()
        .map(|f| whole.mul_f64(*f))
        .collect();
    delays.extend([Duration::from_millis(20), Duration::from_millis(100)]);
    let prefix = format!(".{}.tmp-", job.out_name);
    let mut left_temporaries = 0;
    let mut interrupted = 0;
    for delay in delays {
        restore();
        let existing: Vec<String> = entries(&job.out_dir);
        let (pid, finished) = job.kill_after(delay, |now| {
            // While the writer runs, the final name holds the old file or
            // the complete output, never anything in between.
            if let Some(bytes) = now {
                assert!(
                    Some(bytes) == before || bytes == complete,
                    "during a run {} held {} bytes that are neither the old file nor the complete output",
                    job.out().display(),
                    bytes.len()
                );
            }
        });
        interrupted += usize::from(!finished);
        match fs::read(job.out()) {
            Ok(bytes) if Some(&bytes[..]) == before => {}
            Ok(bytes) => {
                assert!(
                    bytes == complete,
                    "killed after {delay:?}: {} holds {} bytes that are not the complete output",
                    job.out().display(),
                    bytes.len()
                );
            }
            Err(e) => assert!(
                before.is_none() && e.kind() == std::io::ErrorKind::NotFound,
                "killed after {delay:?}: {} is gone: {e}",
                job.out().display()
            ),
        }
        let mine = format!("{prefix}{pid}-");
        for name in entries(&job.out_dir) {
            if name == job.out_name || existing.contains(&name) {
                continue;
            }
            assert!(
                name.starts_with(&mine),
                "killed after {delay:?}: {name} is not a temporary of process {pid} ({mine}...)"
            );
            left_temporaries += 1;
        }
    }
    assert!(
        interrupted >= 3 && left_temporaries > 0,
        "the kills did not interrupt the writer often enough to test anything \
         ({interrupted} interrupted runs, {left_temporaries} temporaries left)"
    );
    // The next run cleans the dead runs' temporaries.
    restore();
    job.run();
    assert_eq!(fs::read(job.out()).unwrap(), complete);
    assert_eq!(
        entries(&job.out_dir),
        vec![job.out_name.clone()],
        "a complete run leaves only its output"
    );
}

/// A `.npy` of u16 counts, 32 MiB: encoding it takes a few tenths of a
/// second in release builds.
fn counts_input(dir: &Path) -> (PathBuf, Vec<u8>) {
    let shape = [64, 64, 64, 64];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut data = Vec::with_capacity(shape.iter().product::<usize>() * 2);
    for _ in 0..shape.iter().product::<usize>() {
        let r = rng.next_u64();
        // Mostly small counts, some escapes.
        let v: u16 = if r.is_multiple_of(97) {
            (r >> 20) as u16
        } else {
            ((r >> 8) % 6) as u16
        };
        data.extend_from_slice(&v.to_le_bytes());
    }
    let path = dir.join("counts.npy");
    write_npy(&path, DType::U16, &shape, &data);
    (path, data)
}

fn qem_reference(path: &Path, dense: &[u8]) -> Vec<u8> {
    let f = QemFile::open(path).unwrap();
    f.validate(ValidationLevel::Full).unwrap();
    let mut out = vec![0u8; f.dense_bytes().unwrap()];
    f.read_all(&mut out).unwrap();
    assert!(
        out == dense,
        "the converted file does not decode to its input"
    );
    fs::read(path).unwrap()
}

#[test]
fn qem_convert_killed_leaves_no_partial_output() {
    let inputs = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let (input, dense) = counts_input(inputs.path());
    let job = Job {
        program: env!("CARGO_BIN_EXE_qem").into(),
        args: vec![
            "convert".into(),
            input.clone().into(),
            outputs.path().join("scan.qem").into(),
        ],
        out_dir: outputs.path().to_path_buf(),
        out_name: "scan.qem".into(),
    };
    let whole = job.run();
    let complete = qem_reference(&job.out(), &dense);
    kill_at_many_points(&job, None, &complete, whole);
}

#[test]
fn qem_convert_force_killed_keeps_the_old_file_or_the_new_one() {
    let inputs = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let (input, dense) = counts_input(inputs.path());
    let out = outputs.path().join("scan.qem");
    let old = b"an older file that --force replaces".to_vec();
    fs::write(&out, &old).unwrap();
    let job = Job {
        program: env!("CARGO_BIN_EXE_qem").into(),
        args: vec![
            "convert".into(),
            "--force".into(),
            input.clone().into(),
            out.clone().into(),
        ],
        out_dir: outputs.path().to_path_buf(),
        out_name: "scan.qem".into(),
    };
    let whole = job.run();
    let complete = qem_reference(&out, &dense);
    kill_at_many_points(&job, Some(&old), &complete, whole);
}

#[test]
fn semq_encode_killed_leaves_no_partial_output() {
    let inputs = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let (n, dim) = (200_000usize, 64usize);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x2545_f491_4f6c_dd1d);
    let mut vectors = Vec::with_capacity(n * dim * 4);
    let mut row = vec![0f64; dim];
    for _ in 0..n {
        for x in row.iter_mut() {
            *x = rng.random::<f64>() - 0.5;
        }
        let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        for x in &row {
            vectors.extend_from_slice(&((x / norm) as f32).to_le_bytes());
        }
    }
    let ids: Vec<u8> = (0..n as u64).flat_map(|i| (3 * i).to_le_bytes()).collect();
    let vectors_path = inputs.path().join("vectors.npy");
    let ids_path = inputs.path().join("ids.npy");
    write_npy(&vectors_path, DType::F32, &[n, dim], &vectors);
    write_npy(&ids_path, DType::U64, &[n], &ids);
    let out = outputs.path().join("state.semq");
    let job = Job {
        program: env!("CARGO_BIN_EXE_semq").into(),
        args: vec![
            "encode".into(),
            "--op".into(),
            "quant".into(),
            "--dim".into(),
            dim.to_string().into(),
            "--bins".into(),
            "16".into(),
            "--vectors".into(),
            vectors_path.into(),
            "--ids".into(),
            ids_path.into(),
            out.clone().into(),
        ],
        out_dir: outputs.path().to_path_buf(),
        out_name: "state.semq".into(),
    };
    let whole = job.run();
    let e = Encoding::open(&out).unwrap();
    assert_eq!(e.len(), n);
    let complete = fs::read(&out).unwrap();
    kill_at_many_points(&job, None, &complete, whole);
}
