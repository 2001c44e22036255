//! Crash safety of the commands that write files: `qem convert` and
//! `semq encode` are stopped by a signal at points spread over their run
//! (fractions of the time one whole run takes, plus fixed early points).
//! While a run goes on, the final name is watched as a reader would, and
//! after every stop:
//!
//! * the final name holds nothing, the file that was there before
//!   (`--force`), or the complete output, byte-identical to an
//!   uninterrupted run (which is itself fully validated);
//! * killed (SIGKILL), everything else the run left in the output folder
//!   is a temporary named `.NAME.tmp-PID-...` with the killed process's
//!   PID; interrupted (SIGINT, SIGTERM, SIGHUP), it left nothing else at
//!   all, and it ended as that signal ends a process.
//!
//! At the end one more run, not stopped, must succeed and leave only the
//! output behind: the temporaries of the killed runs are cleaned.

use std::ffi::OsString;
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
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

    /// What the final name holds, as bytes: a file's own; a store's files,
    /// each as its path, its length and its bytes, in path order.
    fn read_out(&self) -> Option<Vec<u8>> {
        fn tree(dir: &Path, into: &mut Vec<u8>) -> std::io::Result<()> {
            let mut names: Vec<PathBuf> = fs::read_dir(dir)?
                .map(|e| e.map(|e| e.path()))
                .collect::<Result<_, _>>()?;
            names.sort();
            for path in names {
                if path.is_dir() {
                    tree(&path, into)?;
                } else {
                    let bytes = fs::read(&path)?;
                    into.extend_from_slice(path.as_os_str().as_encoded_bytes());
                    into.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                    into.extend_from_slice(&bytes);
                }
            }
            Ok(())
        }
        let out = self.out();
        if out.is_dir() {
            let mut bytes = Vec::new();
            tree(&out, &mut bytes).ok().map(|()| bytes)
        } else {
            fs::read(out).ok()
        }
    }

    /// Makes the final name hold `before` again (`None`: nothing).
    fn restore(&self, before: Option<&[u8]>) {
        let out = self.out();
        if out.is_dir() {
            fs::remove_dir_all(&out).unwrap();
        }
        match before {
            Some(bytes) => fs::write(out, bytes).unwrap(),
            None => {
                let _ = fs::remove_file(out);
            }
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The signals sent here act as in a terminal, even where the test
        // runs with some of them ignored (a background job of a script).
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(signal, libc::SIG_DFL);
                }
                Ok(())
            });
        }
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

    /// Starts a run and sends it `signal` after `delay`; the PID and, when
    /// the signal found it still running, how it ended. Until then the
    /// final name is watched like a reader would (every millisecond or
    /// so): `look` is called with what it holds whenever that changes.
    fn stop_after(
        &self,
        delay: Duration,
        signal: libc::c_int,
        mut look: impl FnMut(Option<&[u8]>),
    ) -> (u32, Option<std::process::ExitStatus>) {
        let mut child = self.command().stderr(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        let start = Instant::now();
        let mut seen: Option<(u64, std::time::SystemTime)> = None;
        while start.elapsed() < delay {
            if let Ok(meta) = fs::metadata(self.out()) {
                let stamp = (meta.len(), meta.modified().unwrap());
                if seen != Some(stamp) {
                    seen = Some(stamp);
                    look(self.read_out().as_deref());
                }
            }
            sleep(Duration::from_micros(500).min(delay.saturating_sub(start.elapsed())));
        }
        if child.try_wait().unwrap().is_some() {
            return (pid, None);
        }
        // The child is not reaped yet, so its PID is still its own.
        // SAFETY: a plain syscall.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
        (pid, Some(child.wait().unwrap()))
    }
}

/// Stops `job` with `signal` at points spread over a whole run and checks
/// what is left each time (see the module documentation). `before` is what
/// the final name holds before each run (`None`: nothing), `complete` what
/// an uninterrupted run leaves there.
fn stop_at_many_points(
    job: &Job,
    signal: libc::c_int,
    before: Option<&[u8]>,
    complete: &[u8],
    whole: Duration,
) {
    let mut delays: Vec<Duration> = [0.02, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95, 1.05]
        .iter()
        .map(|f| whole.mul_f64(*f))
        .collect();
    delays.extend([Duration::from_millis(20), Duration::from_millis(100)]);
    let prefix = format!(".{}.tmp-", job.out_name);
    let mut left_temporaries = 0;
    let mut interrupted = 0;
    for delay in delays {
        job.restore(before);
        let existing: Vec<String> = entries(&job.out_dir);
        let (pid, ended) = job.stop_after(delay, signal, |now| {
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
        if let Some(status) = ended {
            // Stopped, or done just before the signal came.
            assert!(
                status.signal() == Some(signal) || status.success(),
                "stopped by signal {signal} after {delay:?}: ended with {status:?}"
            );
            interrupted += usize::from(!status.success());
        }
        match job.read_out() {
            Some(bytes) if Some(&bytes[..]) == before => {}
            Some(bytes) => {
                assert!(
                    bytes == complete,
                    "stopped after {delay:?}: {} holds {} bytes that are not the complete output",
                    job.out().display(),
                    bytes.len()
                );
            }
            None => assert!(
                before.is_none() && !job.out().exists(),
                "stopped after {delay:?}: {} is gone",
                job.out().display()
            ),
        }
        let mine = format!("{prefix}{pid}-");
        for name in entries(&job.out_dir) {
            if name == job.out_name || existing.contains(&name) {
                continue;
            }
            assert!(
                signal == libc::SIGKILL,
                "interrupted by signal {signal} after {delay:?}: {name} was left behind"
            );
            assert!(
                name.starts_with(&mine),
                "killed after {delay:?}: {name} is not a temporary of process {pid} ({mine}...)"
            );
            left_temporaries += 1;
        }
    }
    assert!(
        interrupted >= 3 && (left_temporaries > 0 || signal != libc::SIGKILL),
        "the signals did not interrupt the writer often enough to test anything \
         ({interrupted} interrupted runs, {left_temporaries} temporaries left)"
    );
    // The next run cleans the dead runs' temporaries.
    job.restore(before);
    job.run();
    assert!(
        job.read_out().as_deref() == Some(complete),
        "a complete run after the stopped ones left other bytes in {}",
        job.out().display()
    );
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
fn qem_convert_stopped_leaves_no_partial_output() {
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
    for signal in [libc::SIGKILL, libc::SIGINT] {
        stop_at_many_points(&job, signal, None, &complete, whole);
    }
}

#[test]
fn qem_convert_force_stopped_keeps_the_old_file_or_the_new_one() {
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
    for signal in [libc::SIGKILL, libc::SIGTERM] {
        stop_at_many_points(&job, signal, Some(&old), &complete, whole);
    }
}

#[test]
fn semq_encode_stopped_leaves_no_partial_output() {
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
    for signal in [libc::SIGKILL, libc::SIGHUP] {
        stop_at_many_points(&job, signal, None, &complete, whole);
    }
}

/// A Zarr store is a folder of many files, written under a temporary
/// name and renamed into place whole.
#[test]
fn qem_convert_to_zarr_stopped_leaves_no_partial_store() {
    let inputs = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let (npy, dense) = counts_input(inputs.path());
    let qem = inputs.path().join("scan.qem");
    let made = Command::new(env!("CARGO_BIN_EXE_qem"))
        .args(["convert".as_ref(), npy.as_os_str(), qem.as_os_str()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    qem_reference(&qem, &dense);
    let job = Job {
        program: env!("CARGO_BIN_EXE_qem").into(),
        args: vec![
            "convert".into(),
            qem.into(),
            outputs.path().join("scan.zarr").into(),
        ],
        out_dir: outputs.path().to_path_buf(),
        out_name: "scan.zarr".into(),
    };
    let whole = job.run();
    let complete = job.read_out().unwrap();
    for signal in [libc::SIGKILL, libc::SIGINT] {
        stop_at_many_points(&job, signal, None, &complete, whole);
    }
}

/// A run started with SIGINT ignored (`nohup`, a background job of a
/// script) keeps ignoring it, as it did before it took the signal to
/// remove its temporaries.
#[test]
fn an_ignored_interrupt_stays_ignored() {
    let inputs = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let (input, dense) = counts_input(inputs.path());
    let out = outputs.path().join("scan.qem");
    let mut command = Command::new(env!("CARGO_BIN_EXE_qem"));
    command.args(["convert".as_ref(), input.as_os_str(), out.as_os_str()]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    // Until the output's temporary appears: the run has taken its signals.
    let start = Instant::now();
    while entries(outputs.path()).is_empty() && start.elapsed() < Duration::from_secs(60) {
        sleep(Duration::from_millis(1));
    }
    for _ in 0..3 {
        // SAFETY: a plain syscall; the child is not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        sleep(Duration::from_millis(5));
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    qem_reference(&out, &dense);
    assert_eq!(entries(outputs.path()), vec!["scan.qem".to_string()]);
}
