//! `qemfs`: mount a folder so that every `.qem` and `.semq` file appears as
//! a directory of ordinary, lazily decoded files.
//!
//! `qemfs mount SRC MNT` returns once the mount is ready (exit 0) or with
//! the reason it is not (exit 2). Without `--foreground` it starts itself
//! again as a detached daemon, handing it the parsed options as one JSON
//! value, and waits for that daemon's word on a pipe. `qemfs unmount MNT`
//! returns once that daemon has exited.

mod filesystem;
mod mountpoint;

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
use qemfs_args::completions::CompletionsArgs;
use qemfs_args::detector::DetectorArgs;
use qemfs_args::gpu::GpuArgs;

/// Readahead for the mount: whole decoded arrays are read sequentially.
const READAHEAD_KIB: u32 = 8192;

const EXAMPLES: &str = "\
Examples:
  qemfs mount data/ /mnt/qem
  python3 -c 'import numpy; print(numpy.load(\"/mnt/qem/scan.qem/data.npy\", mmap_mode=\"r\").shape)'
  qemfs unmount /mnt/qem
  qemfs mount scan.qem /mnt/scan            # one file: its folder at /mnt/scan
  qemfs mount s3://lab/2026/scan.qem /mnt/scan   # one remote object (also https://)
  qemfs mount s3://lab/2026/ /mnt/lab       # a prefix: its keys as folders
  qemfs mount --allow-other -o noatime data/ /mnt/qem

Memory: decoded blocks, the windows of blocks too large to decode at once,
and derived files (virtual images, digests, JSON) share the one
--cache-size budget and are evicted least recently used first, so memory
does not follow the sizes a file declares.

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
    #[command(after_help = "Examples:
  qemfs mount data/ /mnt/qem
  qemfs mount scan.qem /mnt/scan                 # one file: its folder at /mnt/scan
  qemfs mount s3://lab/2026/scan.qem /mnt/scan   # one remote object (also https://)
  qemfs mount s3://lab/2026/ /mnt/lab            # a prefix: its keys as folders
  qemfs mount --endpoint-url http://127.0.0.1:9000 --no-sign-request s3://open/ /mnt/open
  qemfs mount --cache-size 4096 --workers 8 data/ /mnt/qem
  qemfs mount --allow-other -o noatime data/ /mnt/qem
  qemfs mount --foreground --log-file qemfs.log data/ /mnt/qem

Exit status: 0 once the mount is ready, 2 with the reason it is not.")]
    Mount(Box<MountArgs>),
    /// Unmount MNT (also a stale mount left by a killed daemon); returns
    /// once the daemon has exited
    #[command(after_help = "Examples:
  qemfs unmount /mnt/qem
  qemfs unmount /mnt/qem && rmdir /mnt/qem

Exit status: 0 once the daemon has exited, 2 if MNT is not a qemfs mount or cannot be unmounted.")]
    Unmount {
        /// The mount point
        mountpoint: PathBuf,
    },
    /// Print a shell completion script
    #[command(after_help = "Examples:
  qemfs completions bash > /etc/bash_completion.d/qemfs
  qemfs completions zsh > ~/.zfunc/_qemfs")]
    Completions(CompletionsArgs),
    /// Internal: the detached daemon, given the parsed options as JSON
    #[command(hide = true)]
    Daemon {
        /// `DaemonSpec` as JSON
        spec: String,
    },
}

/// What the parent hands the detached daemon: its own parsed options, as
/// one value, so that no flag is lost on the way.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct DaemonSpec {
    mount: MountArgs,
    /// The daemon reports readiness on this descriptor.
    ready_fd: RawFd,
}

#[derive(Debug, Parser, serde::Serialize, serde::Deserialize)]
struct MountArgs {
    /// The folder to mirror, or one .qem/.semq file to show as a folder: a
    /// local path, an s3://BUCKET/PREFIX (its keys as folders), or one
    /// s3://BUCKET/KEY.qem or http(s):// object
    source: PathBuf,
    /// An empty directory to mount on (outside SRC)
    mountpoint: PathBuf,
    /// Stay in the foreground (logs on stderr); Ctrl-C, `kill` or a closed
    /// terminal unmount (a signal ignored at start, as under nohup, stays
    /// ignored)
    #[arg(short, long)]
    foreground: bool,
    /// Append log lines to this regular file (checked, and opened, before
    /// mounting)
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// The byte budget of all the mount computes and holds (decoded
    /// blocks, virtual images, digests, JSON documents), in MiB. Its
    /// counters: `getfattr -n user.qemfs.cache --only-values MOUNTPOINT`.
    /// At most the machine's memory
    #[arg(long, default_value = "1024", value_name = "MiB", value_parser = cache_size)]
    cache_size: usize,
    /// Threads answering reads, 1 to 256 (default: twice the number of
    /// CPUs)
    #[arg(long, default_value_t = default_workers(), hide_default_value = true, value_parser = workers)]
    workers: usize,
    /// Containers kept open (mapped, headers parsed); the least recently
    /// used beyond this are closed until looked up again
    #[arg(long, default_value = "1024", value_name = "N", value_parser = open_containers)]
    open_containers: usize,
    /// Follow symbolic links that lead out of SRC (links into the mount
    /// point and links that loop are never followed)
    #[arg(long)]
    follow_symlinks: bool,
    /// Let other users reach the mount (root, or `user_allow_other` in
    /// /etc/fuse.conf); the sources' permission bits are enforced for them
    #[arg(long)]
    allow_other: bool,
    /// Mount on a directory that is not empty (its entries are hidden
    /// while mounted)
    #[arg(long)]
    nonempty: bool,
    /// Mount options, comma-separated, as for mount(8): allow_other,
    /// allow_root, noatime, noexec, ... (`rw` is refused: read-only)
    #[arg(short = 'o', value_name = "OPTIONS", value_delimiter = ',')]
    options: Vec<String>,
    #[command(flatten)]
    detectors: DetectorArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    remote: qemfs_args::remote::RemoteArgs,
}

/// At most half the SIGBUS guard's slots, leaving the rest to files held
/// open by readers after their container was closed.
fn open_containers(text: &str) -> Result<usize, String> {
    match at_least_one(text)? {
        n if n <= 2048 => Ok(n),
        _ => Err(format!("{text:?} must be at most 2048")),
    }
}

/// The most threads `--workers` starts: each is a process slot of the
/// user's (a PID cgroup of 1,500 was filled by 100,000 asked for), and
/// past a few per core more threads only queue on the same decoder.
const MAX_WORKERS: usize = 256;

fn workers(text: &str) -> Result<usize, String> {
    match at_least_one(text)? {
        n if n <= MAX_WORKERS => Ok(n),
        _ => Err(format!(
            "{text:?} must be at most {MAX_WORKERS} (one thread each)"
        )),
    }
}

/// A budget is memory held: one larger than the machine's memory cannot
/// be honoured, and one past 2^64 bytes is a typing error.
fn cache_size(text: &str) -> Result<usize, String> {
    let mib = at_least_one(text)?;
    let memory = physical_memory_mib();
    match memory {
        Some(memory) if mib as u64 > memory => Err(format!(
            "{text:?} MiB is more than this machine's memory ({memory} MiB)"
        )),
        _ if mib.checked_mul(1 << 20).is_none() => Err(format!(
            "{text:?} MiB is more bytes than this machine can count"
        )),
        _ => Ok(mib),
    }
}

/// The machine's physical memory in MiB, as sysconf(3) reports it.
fn physical_memory_mib() -> Option<u64> {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| (pages as u64).saturating_mul(page as u64) >> 20)
}

/// The smallest `-o max_read=`: one page. Below it every read of a
/// frame splits into hundreds of requests; 0 is not a size.
const MIN_MAX_READ: u64 = 4096;

fn max_read(value: &str) -> Result<(), String> {
    match value.parse::<u64>() {
        Ok(n) if n >= MIN_MAX_READ => Ok(()),
        _ => Err(format!(
            "-o max_read={value}: must be a whole number of bytes >= {MIN_MAX_READ}"
        )),
    }
}

/// Opens `--log-file` for appending, refusing at once what would hang or
/// lose lines: a FIFO (opening one for writing waits for a reader; with
/// O_NONBLOCK it fails when none is there, and one that is there is
/// refused like any non-regular file), a device such as /dev/full, a
/// folder.
fn open_log(path: &Path) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let refuse = |m: std::fs::Metadata| match not_regular(&m) {
        Some(what) => Err(format!(
            "--log-file {shown}: {what}; log lines go to a regular file"
        )),
        None => Ok(()),
    };
    // Named before opening: a FIFO without a reader fails the open below
    // with ENXIO, which says nothing to the user.
    if let Ok(m) = std::fs::metadata(path) {
        refuse(m)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("--log-file {shown}: {e}"))?;
    // Again on what was opened, which may have been swapped in meanwhile.
    refuse(
        file.metadata()
            .map_err(|e| format!("--log-file {shown}: {e}"))?,
    )?;
    Ok(file)
}

/// What a file that is not a regular file is, in words.
fn not_regular(m: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let kind = m.file_type();
    Some(if kind.is_file() {
        return None;
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_dir() {
        "a folder"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{text:?} must be a whole number >= 1")),
    }
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
        Cmd::Mount(args) if args.foreground => run_daemon(&args, None),
        Cmd::Mount(args) => start_daemon(*args),
        Cmd::Unmount { mountpoint } => unmount(&mountpoint),
        Cmd::Completions(a) => completions(&a),
        Cmd::Daemon { spec } => match serde_json::from_str::<DaemonSpec>(&spec) {
            Ok(spec) => run_daemon(&spec.mount, Some(spec.ready_fd)),
            Err(e) => Err(format!("daemon options: {e}")),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Prints the completion script; a reader that closes the pipe early
/// ends it quietly.
fn completions(args: &CompletionsArgs) -> Result<(), String> {
    use clap::CommandFactory;
    let mut out = std::io::stdout().lock();
    match qemfs_args::completions::write(Cli::command(), args.shell, &mut out)
        .and_then(|()| out.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

fn unmount(mountpoint: &Path) -> Result<(), String> {
    let shown = mountpoint.display();
    let Some(mount) = mountpoint::find(mountpoint) else {
        return Err(format!("{shown}: not mounted"));
    };
    if !mount.is_qemfs() {
        return Err(format!(
            "{shown}: not a qemfs mount ({}); not unmounted",
            mount.fstype
        ));
    }
    // Asked before unmounting: afterwards the daemon cannot answer.
    let daemon = mountpoint::daemon_pid(mountpoint);
    match mountpoint::unmount(mountpoint) {
        Ok(mountpoint::Unmounted::Clean) => {}
        Ok(mountpoint::Unmounted::Lazy) => {
            eprintln!("qemfs: {shown} is busy; detached, it goes when the last open file closes");
        }
        Err(e) => return Err(format!("{shown}: {e}")),
    }
    if let Some(pid) = daemon {
        if !mountpoint::wait_exit(pid, UNMOUNT_WAIT) {
            return Err(format!(
                "{shown}: unmounted, but its daemon (pid {pid}) is still running after {} s",
                UNMOUNT_WAIT.as_secs()
            ));
        }
    }
    Ok(())
}

/// How long `qemfs unmount` waits for the daemon to exit.
const UNMOUNT_WAIT: Duration = Duration::from_secs(30);

/// The source and the mount point as real paths, checked.
struct Checked {
    source: PathBuf,
    mountpoint: PathBuf,
    /// `--log-file`, opened.
    log: Option<std::fs::File>,
}

/// A local source: a folder, or one `.qem`/`.semq` regular file.
fn check_local_source(src: &Path) -> Result<(), String> {
    let shown = src.display();
    match std::fs::metadata(src) {
        Ok(m) if m.is_dir() => {}
        Ok(m) if m.is_file() => {
            let name = src.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if qemfs::tree::format_of(name).is_none() {
                return Err(format!(
                    "{shown}: neither a folder nor a .qem or .semq file"
                ));
            }
        }
        Ok(_) => return Err(format!("{shown}: not a folder or a regular file")),
        Err(e) => return Err(format!("{shown}: {e}")),
    }
    Ok(())
}

/// A remote source, there and readable now (a missing object or bucket,
/// or refused credentials, fail the mount): one `.qem`/`.semq` object,
/// opened; or an S3 prefix, listed.
fn check_remote(
    args: &MountArgs,
    address: Result<qemfs::remote::Address, qemfs::remote::RemoteError>,
) -> Result<qemfs::remote::Address, String> {
    use qemfs::remote::Address;
    let shown = args.source.display();
    let address = address.map_err(|e| format!("{shown}: {e}"))?;
    args.remote.apply();
    match &address {
        Address::S3 { bucket, key } if qemfs::tree::format_of(key).is_none() => {
            qemfs::remote::listing::list(bucket, key.trim_end_matches('/'))
                .map_err(|e| format!("{shown}: {e}"))?;
        }
        Address::Http { .. } if qemfs::tree::format_of(address.file_name()).is_none() => {
            return Err(format!(
                "{shown}: not a .qem or .semq object (a web server lists no folders: \
                 mount one object, or an s3:// prefix)"
            ));
        }
        _ => {
            qemfs::remote::Object::open(&address).map_err(|e| format!("{shown}: {e}"))?;
        }
    }
    Ok(address)
}

/// Checks what can be checked before mounting, cleaning a stale mount.
fn preflight(args: &MountArgs) -> Result<Checked, String> {
    let log = args.log_file.as_deref().map(open_log).transpose()?;
    let src = &args.source;
    let shown = src.display();
    let remote = match qemfs::remote::Address::of_path(src) {
        Some(address) => Some(check_remote(args, address)?),
        None => None,
    };
    if remote.is_none() {
        check_local_source(src)?;
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
                "{}: busy: already a mount point; run `qemfs unmount {}` first",
                mnt.display(),
                mnt.display()
            ));
        }
    }
    match std::fs::metadata(mnt) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{}: not a directory", mnt.display())),
        Err(e) => return Err(format!("{}: {e}", mnt.display())),
    }
    let real = |p: &Path| std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()));
    let checked = Checked {
        // A URL is the source as given; it can hold no mount point.
        source: match remote {
            Some(_) => src.clone(),
            None => real(src)?,
        },
        mountpoint: real(mnt)?,
        log,
    };
    // A mount inside its own source would serve itself: a read deep
    // through the mirror of the mount waits on the daemon that makes it.
    if remote.is_none() && checked.source.starts_with(&checked.mountpoint) {
        return Err(format!(
            "{}: the mount point holds the source {shown}; mount elsewhere",
            mnt.display()
        ));
    }
    if remote.is_none() && checked.mountpoint.starts_with(&checked.source) {
        return Err(format!(
            "{}: the mount point is inside the source {shown}; mount outside it",
            mnt.display()
        ));
    }
    if !args.nonempty {
        let mut entries = std::fs::read_dir(mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        if entries.next().is_some() {
            return Err(format!(
                "{}: not empty; its files would be hidden (--nonempty mounts anyway)",
                mnt.display()
            ));
        }
    }
    mount_config(args, &checked.source)?;
    Ok(checked)
}

/// The FUSE configuration: read-only, no devices or set-user-ID files,
/// permissions checked by the kernel against the sources' bits, and the
/// user's `-o` options.
fn mount_config(args: &MountArgs, source: &Path) -> Result<fuser::Config, String> {
    use fuser::MountOption as O;
    let mut config = fuser::Config::default();
    let mut options = vec![
        O::RO,
        O::FSName(format!("{}{}", mountpoint::SOURCE_PREFIX, source.display())),
        O::Subtype("qemfs".to_string()),
        O::NoDev,
        O::NoSuid,
        O::DefaultPermissions,
    ];
    let mut acl = if args.allow_other {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    for option in args
        .options
        .iter()
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
    {
        match option {
            "ro" | "nodev" | "nosuid" | "default_permissions" => {}
            "rw" | "dev" | "suid" => {
                return Err(format!(
                    "-o {option}: not offered (the mount is read-only data)"
                ))
            }
            "allow_other" => acl = fuser::SessionACL::All,
            "allow_root" if acl == fuser::SessionACL::Owner => {
                acl = fuser::SessionACL::RootAndOwner
            }
            "allow_root" => {}
            "auto_unmount" => options.push(O::AutoUnmount),
            "exec" => options.push(O::Exec),
            "noexec" => options.push(O::NoExec),
            "atime" => options.push(O::Atime),
            "noatime" => options.push(O::NoAtime),
            "sync" => options.push(O::Sync),
            "async" => options.push(O::Async),
            "dirsync" => options.push(O::DirSync),
            other if other.starts_with("max_read=") => {
                max_read(&other["max_read=".len()..])?;
                options.push(O::CUSTOM(other.to_string()))
            }
            other if other.starts_with("fsname=") || other.starts_with("subtype=") => {
                return Err(format!("-o {other}: set by qemfs"))
            }
            other => options.push(O::CUSTOM(other.to_string())),
        }
    }
    config.mount_options = options;
    config.acl = acl;
    config.n_threads = Some(args.workers.clamp(1, 16));
    config.clone_fd = true;
    Ok(config)
}

/// Starts `qemfs daemon SPEC` detached and waits for its readiness.
fn start_daemon(mut args: MountArgs) -> Result<(), String> {
    let checked = preflight(&args)?;
    // The daemon runs in the same folder, but paths given whole leave no
    // doubt in its log and in `ps`.
    let absolute = |p: &Path| mountpoint::absolute(p).map_err(|e| format!("{}: {e}", p.display()));
    if qemfs::remote::Address::of_path(&args.source).is_none() {
        args.source = absolute(&args.source)?;
    }
    args.mountpoint = absolute(&args.mountpoint)?;
    if let Some(log) = &args.log_file {
        args.log_file = Some(absolute(log)?);
    }
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    let exe = std::env::current_exe().map_err(|e| format!("locating qemfs: {e}"))?;
    let log = checked.log.map_or_else(Stdio::null, Stdio::from);
    let spec = serde_json::to_string(&DaemonSpec {
        mount: args,
        ready_fd: write_fd,
    })
    .map_err(|e| format!("daemon options: {e}"))?;
    let mut command = Command::new(exe);
    command
        .arg("daemon")
        .arg(spec)
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

fn run_daemon(args: &MountArgs, ready_fd: Option<RawFd>) -> Result<(), String> {
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
    let ready = ready_fd.map(|fd| {
        // SAFETY: the descriptor was handed to us by the parent for this.
        unsafe { std::fs::File::from_raw_fd(fd) }
    });
    let report = |ready: Option<std::fs::File>, word: &str| {
        if let Some(mut f) = ready {
            let _ = f.write_all(word.as_bytes());
        }
    };
    let checked = match preflight(args).and_then(|c| Ok((mount_config(args, &c.source)?, c))) {
        Ok(c) => c,
        Err(e) => {
            report(ready, &format!("error: {e}\n"));
            return Err(e);
        }
    };
    let (config, mut checked) = checked;
    // SIGINT, SIGTERM and SIGHUP unmount: taken by `sigtimedwait` below,
    // not by the default action, which would end the process with the
    // mount in place.
    let Some(signals) = qemfs::signals::block_ending() else {
        let message = "the ending signals could not be blocked".to_string();
        report(ready, &format!("error: {message}\n"));
        return Err(message);
    };
    let log_file = Arc::new(Mutex::new(checked.log.take()));
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
    let source = checked.source;
    args.remote.apply();
    let mut options = TreeOptions::default();
    options.cache_bytes = args.cache_size.saturating_mul(1 << 20);
    options.detectors = args.detectors.options();
    options.accelerator = args.gpu.accelerator(|line| log(line));
    options.mountpoint = Some(checked.mountpoint.clone());
    options.follow_symlinks = args.follow_symlinks;
    options.log = Arc::clone(&log);
    options.open_containers = args.open_containers;
    let tree = Arc::new(Tree::new(&source, &options));
    let fs =
        filesystem::QemFs::new(tree, args.workers, Arc::clone(&log)).map_err(|e| e.to_string())?;
    let session = match fuser::spawn_mount(fs, &args.mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            let message = format!("{}: mounting failed: {e}", args.mountpoint.display());
            report(ready, &format!("error: {message}\n"));
            return Err(message);
        }
    };
    // Our mount, by its ID: after an unmount, a later mount at the same
    // path is somebody else's and must be left alone.
    let ours = mountpoint::find(&args.mountpoint).map(|m| m.id);
    log(&format!(
        "mounted {} at {} (pid {})",
        source.display(),
        args.mountpoint.display(),
        std::process::id()
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
    let still_ours = || ours.is_some_and(mountpoint::id_present);
    loop {
        // SAFETY: waits on the blocked set; no memory is shared.
        let signal = unsafe { libc::sigtimedwait(&signals, std::ptr::null_mut(), &timeout) };
        if signal > 0 {
            log(&format!("signal {signal}: unmounting"));
            break;
        }
        if !still_ours() {
            log("unmounted from outside");
            drop(session);
            log("stopped");
            return Ok(());
        }
    }
    let mountpoint = args.mountpoint.clone();
    match session.umount_and_join() {
        Ok(()) => {}
        Err(e) => log(&format!("unmount: {e}")),
    }
    if still_ours() {
        // Still held open by a reader: detach so nothing is left behind.
        let _ = mountpoint::unmount(&mountpoint);
        std::thread::sleep(Duration::from_millis(50));
    }
    log("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand's help ends with examples the parser accepts.
    #[test]
    fn every_subcommand_has_examples_that_parse() {
        use clap::CommandFactory;
        let parse = |argv: &[String]| {
            Cli::try_parse_from(argv)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        if let Err(e) = qemfs_args::man::check_examples(Cli::command(), parse) {
            panic!("{e}");
        }
    }

    /// `qemfs`'s man pages in man/ are generated from its clap
    /// definitions; this fails when they are stale. Regenerate with
    /// `QEMFS_UPDATE_MAN=1 cargo test -p qemfs-fuse --bin qemfs man_pages`.
    #[test]
    fn man_pages_are_current() {
        use clap::CommandFactory;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../man");
        let pages = qemfs_args::man::render_tool(Cli::command());
        let ours = |name: &str| name == "qemfs.1" || name.starts_with("qemfs-");
        if let Err(e) = qemfs_args::man::check_pages(&dir, &pages, ours) {
            panic!("{e}");
        }
    }
}
