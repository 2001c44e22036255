//! The mount's life and its edges, through the real `qemfs` binary:
//! refusals before mounting (a mount point inside its source, one that is
//! busy or not empty), unmounting only our mounts and only when the daemon
//! has gone, options that survive the daemon's detaching, single-file
//! mounts, links and FIFOs in the source, and a user other than root.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    alive, can_mount, daemon_pid, fixtures, is_mounted, mount, qem, qemfs, run, text, unmount,
};

/// A folder with `src/` (one container, one text file) and an empty `mnt/`.
struct Place {
    dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
}

impl Place {
    fn new() -> Place {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        fs::create_dir_all(&src).unwrap();
        fs::create_dir_all(&mnt).unwrap();
        fs::copy(
            fixtures().join("qem/u8-two-block-chunks.qem"),
            src.join("scan.qem"),
        )
        .unwrap();
        fs::write(src.join("notes.txt"), b"plain\n").unwrap();
        Place { dir, src, mnt }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        for m in [&self.mnt, &self.src.join("mnt")] {
            if is_mounted(m) {
                let _ = unmount(m);
            }
            if is_mounted(m) {
                let c = CString::new(m.as_os_str().as_bytes()).unwrap();
                // SAFETY: valid C string; detaching is always safe to try.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

#[test]
fn a_mount_point_inside_its_source_or_holding_it_is_refused() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    let inner = p.src.join("mnt");
    fs::create_dir(&inner).unwrap();
    let out = mount(&p.src, &inner, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("inside the source"), "{}", text(&out));
    assert!(!is_mounted(&inner));
    // The other way round: the source inside the mount point.
    let out = mount(&p.src, p.dir.path(), &["--nonempty"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("holds the source"), "{}", text(&out));
    // A single file inside the mount point, too.
    let out = mount(&p.src.join("scan.qem"), p.dir.path(), &["--nonempty"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn busy_and_non_empty_mount_points_are_refused_clearly() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    fs::write(p.mnt.join("keep.txt"), b"mine\n").unwrap();
    let out = mount(&p.src, &p.mnt, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("not empty"), "{}", text(&out));
    let out = mount(&p.src, &p.mnt, &["--nonempty"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(fs::read(p.mnt.join("notes.txt")).unwrap(), b"plain\n");
    let out = mount(&p.src, &p.mnt, &["--nonempty"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("busy"), "{}", text(&out));
    assert!(unmount(&p.mnt).status.success());
    assert_eq!(fs::read(p.mnt.join("keep.txt")).unwrap(), b"mine\n");
}

#[test]
fn unmount_waits_for_the_daemon_so_a_remount_is_never_touched_by_it() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    let log = p.dir.path().join("log");
    let log_arg = log.to_str().unwrap();
    assert!(mount(&p.src, &p.mnt, &["--log-file", log_arg])
        .status
        .success());
    let first = daemon_pid(&p.mnt);
    let out = unmount(&p.mnt);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !alive(first),
        "unmount returns only once the daemon has exited"
    );
    assert!(mount(&p.src, &p.mnt, &["--log-file", log_arg])
        .status
        .success());
    let second = daemon_pid(&p.mnt);
    assert_ne!(first, second);
    // The new mount outlives the old daemon's once-a-second check.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(is_mounted(&p.mnt) && alive(second));
    assert_eq!(fs::read(p.mnt.join("notes.txt")).unwrap(), b"plain\n");
    assert!(unmount(&p.mnt).status.success());
    assert!(!alive(second));
    // Log lines carry RFC 3339 times.
    let lines = fs::read_to_string(&log).unwrap();
    let first_line = lines.lines().next().unwrap();
    let stamp = first_line.split(' ').next().unwrap();
    assert!(
        stamp.len() == 24 && stamp.as_bytes()[10] == b'T' && stamp.ends_with('Z'),
        "{first_line}"
    );
}

#[test]
fn unmount_refuses_a_mount_that_is_not_ours() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    let c = CString::new(p.mnt.as_os_str().as_bytes()).unwrap();
    let tmpfs = CString::new("tmpfs").unwrap();
    // SAFETY: valid C strings; a tmpfs of our own on our own folder.
    let rc = unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            c.as_ptr(),
            tmpfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let out = unmount(&p.mnt);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("not a qemfs mount"), "{}", text(&out));
    assert!(is_mounted(&p.mnt), "somebody else's mount is left alone");
    // SAFETY: our own tmpfs.
    unsafe { libc::umount2(c.as_ptr(), 0) };
}

#[test]
fn every_flag_reaches_the_detached_daemon_and_o_options_pass_through() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    let out = mount(
        &p.src,
        &p.mnt,
        &[
            "--bf-radius",
            "2.5",
            "--center",
            "3,4",
            "-o",
            "noatime,noexec",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let detectors: serde_json::Value =
        serde_json::from_slice(&fs::read(p.mnt.join("scan.qem/virtual/detectors.json")).unwrap())
            .unwrap();
    let shown = detectors.to_string();
    assert!(shown.contains("2.5"), "the radius given: {shown}");
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(p.mnt.to_str().unwrap()))
        .unwrap();
    assert!(
        line.contains("noatime") && line.contains("noexec"),
        "{line}"
    );
    assert!(line.contains("qemfs:"), "our mounts say so: {line}");
    assert!(unmount(&p.mnt).status.success());
    let out = mount(&p.src, &p.mnt, &["-o", "rw"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for bad in [["--cache-size", "0"], ["--workers", "0"]] {
        let out = mount(&p.src, &p.mnt, &bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out));
    }
}

/// Options that cannot be honoured are refused before anything is
/// mounted or started, at once, with exit 2 naming the option and why:
/// a thread count that would fill the user's process slots, a budget
/// larger than the machine, a read size of nothing, and log files that
/// would hang the mount (a FIFO) or lose every line (a device).
#[test]
fn options_that_cannot_be_honoured_are_refused_at_once() {
    let p = Place::new();
    let fifo = p.dir.path().join("log.fifo");
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string naming a path in our temporary folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = fifo.to_str().unwrap().to_string();
    let cases: [(&[&str], &str); 7] = [
        (&["--workers", "100000"], "--workers"),
        (&["--cache-size", "18446744073709551615"], "--cache-size"),
        (&["--cache-size", "0"], "--cache-size"),
        (&["-o", "max_read=0"], "max_read=0"),
        (&["-o", "ro,max_read=x"], "max_read=x"),
        (
            &["--log-file", "/dev/full"],
            "--log-file /dev/full: a device",
        ),
        (&["--log-file", &fifo], "a FIFO"),
    ];
    for (extra, named) in cases {
        let (src, mnt) = (p.src.clone(), p.mnt.clone());
        let argv: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let out = within(Duration::from_secs(20), move || {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            mount(&src, &mnt, &argv)
        });
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert!(text(&out).contains(named), "{extra:?}: {}", text(&out));
        assert!(!is_mounted(&p.mnt), "{extra:?} mounted");
    }
    // The refusal is the option's, not the mount's: in range they mount.
    // Without root and /dev/fuse this half cannot run: a failure under CI.
    if !can_mount() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI=true: the in-range half needs root and /dev/fuse"
        );
        return;
    }
    let out = mount(
        &p.src,
        &p.mnt,
        &["--workers", "256", "-o", "max_read=131072"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(unmount(&p.mnt).status.success());
}

#[test]
fn one_file_mounts_as_its_folder() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    let file = p.src.join("scan.qem");
    let out = mount(&file, &p.mnt, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let via_cat = run(Command::new(qem()).arg("cat").arg(&file).arg("data.npy"));
    assert!(via_cat.status.success());
    assert_eq!(fs::read(p.mnt.join("data.npy")).unwrap(), via_cat.stdout);
    assert!(unmount(&p.mnt).status.success());
    let out = mount(&p.src.join("notes.txt"), &p.mnt, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Runs `f` on a thread; fails the test if it has not finished in `limit`
/// (a hang through the mount must not hang the suite).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still blocked after {limit:?}"))
}

#[test]
fn links_out_of_the_source_loops_and_fifos_never_block_or_leak() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    symlink("/etc/passwd", p.src.join("passwd")).unwrap();
    symlink("..", p.src.join("up")).unwrap();
    symlink(".", p.src.join("here")).unwrap();
    symlink("notes.txt", p.src.join("alias.txt")).unwrap();
    fs::write(p.src.join("swap.txt"), b"regular\n").unwrap();
    let out = mount(&p.src, &p.mnt, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let mnt = p.mnt.clone();
    let listed = within(Duration::from_secs(20), move || {
        let mut names: Vec<String> = fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    });
    assert_eq!(listed, ["alias.txt", "notes.txt", "scan.qem", "swap.txt"]);
    for gone in ["passwd", "up", "here", "up/mnt/up/mnt"] {
        let path = p.mnt.join(gone);
        let found = within(Duration::from_secs(20), move || fs::metadata(path).is_ok());
        assert!(!found, "{gone} must not be reachable");
    }
    assert_eq!(fs::read(p.mnt.join("alias.txt")).unwrap(), b"plain\n");

    // A FIFO put in place of a file after its lookup: the read fails at
    // once instead of waiting for a writer, and other reads go on.
    let swap = p.mnt.join("swap.txt");
    assert!(fs::metadata(&swap).is_ok());
    fs::remove_file(p.src.join("swap.txt")).unwrap();
    let c = CString::new(p.src.join("swap.txt").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let results = within(Duration::from_secs(20), move || {
        (0..8).map(|_| fs::read(&swap).is_err()).collect::<Vec<_>>()
    });
    assert!(results.iter().all(|&failed| failed), "{results:?}");
    assert_eq!(fs::read(p.mnt.join("notes.txt")).unwrap(), b"plain\n");
    assert!(unmount(&p.mnt).status.success());
}

/// A user made for the test: `qemfs mount` and `qemfs unmount` as that
/// user go through fusermount3, as on a desktop; the mount shows the
/// source's permission bits to other users only with --allow-other.
#[test]
fn a_user_other_than_root_mounts_and_unmounts() {
    if !can_mount() {
        return;
    }
    let have = |tool: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !(have("fusermount3") && have("useradd") && have("setpriv")) {
        eprintln!("skipping: needs fusermount3 (package fuse3), useradd and setpriv");
        return;
    }
    let user = "qemfs-test-user";
    let _ = run(Command::new("useradd").args(["--no-create-home", user]));
    let id = |flag: &str| -> u32 {
        String::from_utf8(run(Command::new("id").args([flag, user])).stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (uid, gid) = (id("-u"), id("-g"));
    // /dev/fuse is 0600 on this machine kind; a desktop has 0666.
    let fuse_mode = fs::metadata("/dev/fuse").unwrap().permissions().mode();
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
    struct Restore(u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
        }
    }
    let _restore = Restore(fuse_mode);

    let p = Place::new();
    for path in [
        p.dir.path(),
        &p.src,
        &p.mnt,
        &p.src.join("scan.qem"),
        &p.src.join("notes.txt"),
    ] {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    }
    fs::set_permissions(p.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let as_user = |program: &std::ffi::OsStr, args: &[&std::ffi::OsStr]| {
        run(Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(program)
            .args(args))
    };
    let qemfs = qemfs();
    let out = as_user(
        qemfs.as_ref(),
        &["mount".as_ref(), p.src.as_os_str(), p.mnt.as_os_str()],
    );
    assert!(out.status.success(), "mount as {user}: {}", text(&out));
    assert!(is_mounted(&p.mnt), "ready means mounted");
    let out = as_user("cat".as_ref(), &[p.mnt.join("notes.txt").as_os_str()]);
    assert_eq!(out.stdout, b"plain\n", "{}", text(&out));
    // Root cannot look into another user's mount (no allow_other): the
    // daemon is found as that user's qemfs process.
    let out = run(Command::new("pgrep").args(["-u", &uid.to_string(), "-x", "qemfs"]));
    let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let out = as_user(qemfs.as_ref(), &["unmount".as_ref(), p.mnt.as_os_str()]);
    assert!(out.status.success(), "unmount as {user}: {}", text(&out));
    assert!(!is_mounted(&p.mnt));
    assert!(!alive(pid), "the user's daemon has exited");
}

/// More containers than the SIGBUS guard has slots: opened containers are
/// closed when idle, so one truncated under an open file still gives EIO,
/// not a dead daemon.
#[test]
fn thousands_of_containers_and_one_truncated_under_a_reader() {
    if !can_mount() {
        return;
    }
    let p = Place::new();
    let small = fs::read(fixtures().join("qem/u8-constant-16x16.qem")).unwrap();
    const N: usize = 5000;
    for i in 0..N {
        fs::write(p.src.join(format!("c{i:05}.qem")), &small).unwrap();
    }
    let big = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/scan-u16.qem");
    fs::copy(&big, p.src.join("victim.qem")).unwrap();
    let out = mount(&p.src, &p.mnt, &["--open-containers", "256"]);
    assert!(out.status.success(), "{}", text(&out));
    let mnt = p.mnt.clone();
    let opened = within(Duration::from_secs(300), move || {
        (0..N)
            .filter(|i| fs::read(mnt.join(format!("c{i:05}.qem/info.json"))).is_ok())
            .count()
    });
    assert_eq!(opened, N);
    // Hold a frame of the victim's second chunk open (nothing decoded
    // yet), then truncate the source under it.
    use std::os::unix::fs::FileExt;
    let reader = fs::File::open(p.mnt.join("victim.qem/frames/23/31.npy")).unwrap();
    let victim = fs::OpenOptions::new()
        .write(true)
        .open(p.src.join("victim.qem"))
        .unwrap();
    victim.set_len(4096).unwrap();
    let mut frame = vec![0u8; 1 << 14];
    let result = reader.read_at(&mut frame, 0);
    assert!(
        result.is_err(),
        "reading a truncated source must fail: {result:?}"
    );
    // The daemon lives, and the others still read.
    assert_eq!(
        fs::read(p.mnt.join("c00042.qem/info.json")).unwrap(),
        fs::read(p.mnt.join("c04242.qem/info.json")).unwrap()
    );
    assert_eq!(fs::read(p.mnt.join("notes.txt")).unwrap(), b"plain\n");
    drop(reader);
    assert!(unmount(&p.mnt).status.success());
}

fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A scan of 500,000 rows: `frames/` is listed page by page, so listing it
/// costs the daemon no memory per entry (it used to make the whole listing
/// and a number per entry: 1.6 GB for 16.7 M rows).
#[test]
fn a_huge_frames_folder_is_listed_without_memory_per_entry() {
    if !can_mount() {
        return;
    }
    use qemfs::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec,
    };
    const ROWS: usize = 500_000;
    let shape = [ROWS as u64, 1, 1, 2];
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U8,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let p = Place::new();
    fs::write(
        p.src.join("tall.qem"),
        encode_to_vec(spec, &vec![0u8; ROWS * 2]).unwrap(),
    )
    .unwrap();
    assert!(mount(&p.src, &p.mnt, &[]).status.success());
    let pid = daemon_pid(&p.mnt);
    let frames = p.mnt.join("tall.qem/frames");
    let before = rss_kib(pid);
    let listed = fs::read_dir(&frames).unwrap().count();
    let grown = rss_kib(pid).saturating_sub(before);
    assert_eq!(listed, ROWS);
    assert!(grown < 64 * 1024, "listing grew the daemon by {grown} KiB");
    assert_eq!(
        fs::read_dir(frames.join("499999")).unwrap().count(),
        2,
        "C.npy and C.tiff"
    );
    assert!(unmount(&p.mnt).status.success());
}
