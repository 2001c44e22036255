//! `qemfs`: mount a folder so that every `.qem` and `.semq` file appears as
//! a directory of ordinary, lazily decoded files.
//!
//! `qemfs mount SRC MNT` returns once the mount is ready (exit 0) or with
//! the reason it is not (exit 2). Without `--foreground` it starts itself
//! again as a detached daemon and waits for that daemon's word on a pipe.

mod filesystem;
mod mountpoint;
mod workers;

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, Subcommand};

use qemfs::tree::{Tree, TreeOptions};
use qemfs_cmds::detector_args::DetectorArgs;
use qemfs_cmds::gpu_args::GpuArgs;

/// Readahead for the mount: whole decoded arrays are read sequentially.
const READAHEAD_KIB: u32 = 8192;

const EXAMPLES: &str = "\
Examples:
  qemfs mount data/ /mnt/qem
  python3 -c 'import numpy; print(numpy.load(\"/mnt/qem/scan.qem/data.npy\", mmap_mode=\"r\").shape)'
  qemfs unmount /mnt/qem

Exit status: 0 mounted / unmounted, 2 error.";

#[derive(Debug, Parser)]
#[command(name = "qemfs", version, about = "Mount a folder of .qem and .semq files as ordinary files", after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Mirror SRC at MNT; every .qem and .semq file appears as a directory
    Mount(MountArgs),
    /// Unmount MNT (also a stale mount left by a killed daemon)
    Unmount {
        /// The mount point
        mountpoint: PathBuf,
    },
}

#[derive(Debug, Parser)]
struct MountArgs {
    /// The folder to mirror
    source: PathBuf,
    /// An empty directory to mount on
    mountpoint: PathBuf,
    /// Stay in the foreground (logs on stderr); Ctrl-C unmounts
    #[arg(short, long)]
    foreground: bool,
    /// Append log lines to this file
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Byte budget of the decoded-block cache, in MiB
    #[arg(long, default_value = "1024", value_name = "MiB")]
    cache_size: usize,
    /// Threads answering reads
    #[arg(long, default_value_t = default_workers())]
    workers: usize,
    #[command(flatten)]
    detectors: DetectorArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    /// Internal: the daemon reports readiness on this descriptor
    #[arg(long, hide = true)]
    ready_fd: Option<RawFd>,
}

fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get() * 2)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Cmd::Mount(args) if args.foreground || args.ready_fd.is_some() => run_daemon(&args),
        Cmd::Mount(args) => start_daemon(&args),
        Cmd::Unmount { mountpoint } => unmount(&mountpoint),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn unmount(mountpoint: &Path) -> Result<(), String> {
    let shown = mountpoint.display();
    if !mountpoint::is_mounted(mountpoint) {
        return Err(format!("{shown}: not mounted"));
    }
    match mountpoint::unmount(mountpoint) {
        Ok(mountpoint::Unmounted::Clean) => Ok(()),
        Ok(mountpoint::Unmounted::Lazy) => {
            eprintln!("qemfs: {shown} is busy; detached, it goes when the last open file closes");
            Ok(())
        }
        Err(e) => Err(format!("{shown}: {e}")),
    }
}

/// Checks what can be checked before mounting, cleaning a stale mount.
fn preflight(args: &MountArgs) -> Result<(), String> {
    let src = &args.source;
    match std::fs::metadata(src) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{}: not a directory", src.display())),
        Err(e) => return Err(format!("{}: {e}", src.display())),
    }
    let mnt = &args.mountpoint;
    if mountpoint::is_mounted(mnt) {
        if mountpoint::is_stale(mnt) {
            mountpoint::unmount(mnt).map_err(|e| {
                format!(
                    "{}: a stale mount is in the way and could not be removed ({e}); \
                     run `qemfs unmount {}`",
                    mnt.display(),
                    mnt.display()
                )
            })?;
        } else {
            return Err(format!(
                "{}: already mounted; run `qemfs unmount {}` first",
                mnt.display(),
                mnt.display()
            ));
        }
    }
    match std::fs::metadata(mnt) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{}: not a directory", mnt.display())),
        Err(e) => Err(format!("{}: {e}", mnt.display())),
    }
}

/// Starts `qemfs mount --ready-fd` detached and waits for its readiness.
fn start_daemon(args: &MountArgs) -> Result<(), String> {
    preflight(args)?;
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    let exe = std::env::current_exe().map_err(|e| format!("locating qemfs: {e}"))?;
    let log = match &args.log_file {
        Some(path) => Stdio::from(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("{}: {e}", path.display()))?,
        ),
        None => Stdio::null(),
    };
    let mut command = Command::new(exe);
    command
        .arg("mount")
        .arg(&args.source)
        .arg(&args.mountpoint)
        .arg("--cache-size")
        .arg(args.cache_size.to_string())
        .arg("--workers")
        .arg(args.workers.to_string())
        .args(args.detectors.to_args())
        .args(args.gpu.to_args())
        .arg("--ready-fd")
        .arg(write_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            libc::setsid();
            libc::close(read_fd);
            // Keep the readiness pipe open across exec.
            let flags = libc::fcntl(write_fd, libc::F_GETFD);
            libc::fcntl(write_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting the daemon: {e}"))?;
    // SAFETY: closing our copy of the write end, which we own.
    unsafe { libc::close(write_fd) };
    // SAFETY: `read_fd` is ours and open; the File takes ownership.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(read_fd) };
    let mut word = String::new();
    let _ = pipe.read_to_string(&mut word);
    if word.starts_with("ready") {
        return Ok(());
    }
    let _ = child.kill();
    let _ = child.wait();
    match word.trim().strip_prefix("error: ") {
        Some(reason) => Err(reason.to_string()),
        None => Err("the daemon exited before the mount was ready".to_string()),
    }
}

/// Blocks SIGINT and SIGTERM in every thread (so that they are taken by
/// `sigtimedwait` below, not by the default handler that would kill the
/// process with the mount in place).
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn run_daemon(args: &MountArgs) -> Result<(), String> {
    // A source truncated while mounted must give EIO, not end the daemon.
    qemfs::mapguard::install();
    // Decoded blocks are large buffers made and freed by many threads; with
    // one malloc arena per thread, freed blocks stay mapped in each of them
    // and the daemon grew 300 MiB past a 256 MiB cache budget while two
    // readers went through a 537 MB array (benches/zarr_view.py). Two
    // arenas keep it within 200 MiB at the same speed.
    // SAFETY: mallopt only tunes the allocator; called before any thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let ready = args.ready_fd.map(|fd| {
        // SAFETY: the descriptor was handed to us by the parent for this.
        unsafe { std::fs::File::from_raw_fd(fd) }
    });
    let report = |ready: Option<std::fs::File>, word: &str| {
        if let Some(mut f) = ready {
            let _ = f.write_all(word.as_bytes());
        }
    };
    if let Err(e) = preflight(args) {
        report(ready, &format!("error: {e}\n"));
        return Err(e);
    }
    let signals = block_signals();
    let log_file = args
        .log_file
        .as_ref()
        .and_then(|p| OpenOptions::new().create(true).append(true).open(p).ok());
    let log_file = Arc::new(Mutex::new(log_file));
    let log: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(move |line: &str| {
        let line = format!("{} qemfs: {line}\n", filesystem::timestamp());
        match &mut *log_file.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(f) => {
                let _ = f.write_all(line.as_bytes());
            }
            None => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    });
    let source = mountpoint::absolute(&args.source).map_err(|e| e.to_string())?;
    let options = TreeOptions {
        cache_bytes: args.cache_size.saturating_mul(1 << 20),
        detectors: args.detectors.options(),
        accelerator: args.gpu.accelerator(|line| log(line)),
    };
    let tree = Arc::new(Tree::new(&source, &options));
    let fs =
        filesystem::QemFs::new(tree, args.workers, Arc::clone(&log)).map_err(|e| e.to_string())?;
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::FSName(source.display().to_string()),
        fuser::MountOption::Subtype("qemfs".to_string()),
        fuser::MountOption::NoDev,
        fuser::MountOption::NoSuid,
    ];
    config.n_threads = Some(args.workers.clamp(1, 16));
    config.clone_fd = true;
    let session = match fuser::spawn_mount(fs, &args.mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            let message = format!("{}: mounting failed: {e}", args.mountpoint.display());
            report(ready, &format!("error: {message}\n"));
            return Err(message);
        }
    };
    log(&format!(
        "mounted {} at {}",
        source.display(),
        args.mountpoint.display()
    ));
    match mountpoint::raise_readahead(&args.mountpoint, READAHEAD_KIB) {
        Ok(device) => log(&format!("readahead of {device} set to {READAHEAD_KIB} KiB")),
        Err(e) => log(&format!("readahead left at the default ({e})")),
    }
    report(ready, "ready\n");

    // Wait for a signal, or for the mount to go away (`qemfs unmount`,
    // `umount`), checking once a second.
    let timeout = libc::timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    loop {
        // SAFETY: waits on the blocked set; no memory is shared.
        let signal = unsafe { libc::sigtimedwait(&signals, std::ptr::null_mut(), &timeout) };
        if signal > 0 {
            log(&format!("signal {signal}: unmounting"));
            break;
        }
        if !mountpoint::is_mounted(&args.mountpoint) {
            log("unmounted from outside");
            drop(session);
            return Ok(());
        }
    }
    let mountpoint = args.mountpoint.clone();
    match session.umount_and_join() {
        Ok(()) => {}
        Err(e) => log(&format!("unmount: {e}")),
    }
    if mountpoint::is_mounted(&mountpoint) {
        // Still held open by a reader: detach so nothing is left behind.
        let _ = mountpoint::unmount(&mountpoint);
        std::thread::sleep(Duration::from_millis(50));
    }
    log("stopped");
    Ok(())
}
