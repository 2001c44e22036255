//! The mounted filesystem, end to end: the real `qemfs` binary mounts a
//! temporary folder and real clients (std::fs, `qem cat`, numpy) read it.
//!
//! These tests need root and /dev/fuse (CI has both); elsewhere they say so
//! and return.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{can_mount, fixtures, is_mounted, qem, qemfs};

/// A mounted temporary folder; unmounts (lazily if need be) on drop.
struct Mounted {
    _dir: tempfile::TempDir,
    src: PathBuf,
    mnt: PathBuf,
    child: Option<Child>,
}

impl Mounted {
    fn folder() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        fs::create_dir_all(src.join("nested")).unwrap();
        fs::create_dir_all(&mnt).unwrap();
        let q = fixtures().join("qem");
        for name in [
            "u16-invalid-mask-33x40",
            "u8-two-block-chunks",
            "f32-special-128x128",
            "scaled-three-regions-9x9",
        ] {
            fs::copy(
                q.join(format!("{name}.qem")),
                src.join(format!("{name}.qem")),
            )
            .unwrap();
        }
        fs::copy(q.join("bad-rans-final-state.qem"), src.join("corrupt.qem")).unwrap();
        fs::copy(q.join("bad-header-checksum.qem"), src.join("broken.qem")).unwrap();
        fs::copy(
            fixtures().join("semq/files/utf8-escapes-quant.semq"),
            src.join("nested/emb.semq"),
        )
        .unwrap();
        fs::write(src.join("README.txt"), b"not a container\n").unwrap();
        (dir, src, mnt)
    }

    /// `qemfs mount SRC MNT`: returns once the daemon says it is ready.
    fn daemon() -> Mounted {
        let (dir, src, mnt) = Mounted::folder();
        let out = Command::new(qemfs())
            .arg("mount")
            .arg(&src)
            .arg(&mnt)
            .arg("--log-file")
            .arg(dir.path().join("log"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(is_mounted(&mnt), "ready means mounted");
        Mounted {
            _dir: dir,
            src,
            mnt,
            child: None,
        }
    }

    /// `qemfs mount -f`: the daemon is our child (so a test can kill it).
    fn foreground() -> Mounted {
        Mounted::foreground_ignoring(&[])
    }

    /// `qemfs mount -f` started with `ignored` signals ignored, as `nohup`
    /// or a script's background job starts it.
    fn foreground_ignoring(ignored: &'static [libc::c_int]) -> Mounted {
        let (dir, src, mnt) = Mounted::folder();
        let mut command = Command::new(qemfs());
        command
            .arg("mount")
            .arg("-f")
            .arg(&src)
            .arg(&mnt)
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                for &signal in ignored {
                    libc::signal(signal, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap();
        let start = Instant::now();
        while !is_mounted(&mnt) {
            assert!(start.elapsed() < Duration::from_secs(20), "mount timed out");
            std::thread::sleep(Duration::from_millis(20));
        }
        Mounted {
            _dir: dir,
            src,
            mnt,
            child: Some(child),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new(qemfs()).arg("unmount").arg(&self.mnt).status();
        }
        if is_mounted(&self.mnt) {
            let c = CString::new(self.mnt.as_os_str().as_bytes()).unwrap();
            // SAFETY: valid C string; detaching is always safe to try.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn npy_data(bytes: &[u8]) -> &[u8] {
    let h = qemfs::npy::parse_header(bytes).unwrap();
    &bytes[h.data_offset..]
}

fn qem_cat(file: &Path, path: &str) -> Vec<u8> {
    let out = Command::new(qem())
        .arg("cat")
        .arg(file)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn mounted_files_equal_qem_cat_and_the_reference_arrays() {
    if !can_mount() {
        return;
    }
    let m = Mounted::daemon();
    let mut names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "README.txt",
            "broken.qem",
            "corrupt.qem",
            "f32-special-128x128.qem",
            "nested",
            "scaled-three-regions-9x9.qem",
            "u16-invalid-mask-33x40.qem",
            "u8-two-block-chunks.qem",
        ]
    );
    for name in [
        "u16-invalid-mask-33x40",
        "u8-two-block-chunks",
        "f32-special-128x128",
        "scaled-three-regions-9x9",
    ] {
        let mounted = fs::read(m.path(&format!("{name}.qem/data.npy"))).unwrap();
        let source = m.src.join(format!("{name}.qem"));
        assert_eq!(mounted, qem_cat(&source, "data.npy"), "{name}");
        let want = fs::read(fixtures().join(format!("qem/{name}.npy"))).unwrap();
        assert_eq!(npy_data(&mounted), npy_data(&want), "{name}");
        let meta = fs::metadata(m.path(&format!("{name}.qem/data.npy"))).unwrap();
        assert_eq!(meta.len(), mounted.len() as u64);
        for rel in ["frames/0/0.npy", "info.json", "logical_sha256", "raw.qem"] {
            // Columns are zero-padded to the widest index (300 and 179 here).
            let rel = if matches!(name, "u8-two-block-chunks" | "scaled-three-regions-9x9") {
                rel.replace("frames/0/0", "frames/0/000")
            } else {
                rel.to_string()
            };
            assert_eq!(
                fs::read(m.path(&format!("{name}.qem/{rel}"))).unwrap(),
                qem_cat(&source, &rel),
                "{name}/{rel}"
            );
        }
    }
    for name in [
        "u16-invalid-mask-33x40",
        "f32-special-128x128",
        "scaled-three-regions-9x9",
    ] {
        let source = m.src.join(format!("{name}.qem"));
        let mut rels: Vec<String> = fs::read_dir(m.path(&format!("{name}.qem/virtual")))
            .unwrap()
            .map(|e| format!("virtual/{}", e.unwrap().file_name().to_string_lossy()))
            .collect();
        assert!(rels.len() >= 17, "{name}: {rels:?}");
        rels.push("virtual/disk-3-4-2.5.npy".into());
        rels.push("virtual/annulus-3-4-1-6.png".into());
        for rel in rels {
            assert_eq!(
                fs::read(m.path(&format!("{name}.qem/{rel}"))).unwrap(),
                qem_cat(&source, &rel),
                "{name}/{rel}"
            );
        }
    }
    assert_eq!(
        fs::read(m.path("README.txt")).unwrap(),
        b"not a container\n"
    );
    let state = fs::read_to_string(m.path("nested/emb.semq/state_id")).unwrap();
    assert_eq!(state.len(), 65);
}

#[test]
fn broken_and_corrupt_files_fail_alone() {
    if !can_mount() {
        return;
    }
    let m = Mounted::daemon();
    let listing: Vec<_> = fs::read_dir(m.path("broken.qem"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listing, vec!["ERROR.txt"]);
    let reason = fs::read_to_string(m.path("broken.qem/ERROR.txt")).unwrap();
    assert!(reason.contains("checksum"), "{reason}");
    // The header is fine, a stream is not: reading the data fails with EIO.
    let err = fs::read(m.path("corrupt.qem/data.npy")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    assert!(fs::read(m.path("corrupt.qem/header.json")).is_ok());
    // Neighbours are unaffected.
    assert!(fs::read(m.path("u8-two-block-chunks.qem/data.npy")).is_ok());
    // Read-only.
    let err = fs::write(m.path("new.txt"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let err = fs::OpenOptions::new()
        .write(true)
        .open(m.path("README.txt"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
}

#[test]
fn parallel_readers_see_identical_bytes() {
    if !can_mount() {
        return;
    }
    let m = Mounted::daemon();
    let name = "u8-two-block-chunks";
    let want = fs::read(m.path(&format!("{name}.qem/data.npy"))).unwrap();
    let data = std::sync::Arc::new(want);
    let path = m.path(&format!("{name}.qem/data.npy"));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (data, path) = (data.clone(), path.clone());
            std::thread::spawn(move || {
                use std::os::unix::fs::FileExt;
                let f = fs::File::open(&path).unwrap();
                let mut seed = t * 7919 + 1;
                for _ in 0..200 {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (seed >> 33) as usize % data.len();
                    let len = ((seed >> 13) as usize % 9000 + 1).min(data.len() - off);
                    let mut buf = vec![0u8; len];
                    f.read_exact_at(&mut buf, off as u64).unwrap();
                    assert_eq!(&buf[..], &data[off..off + len]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn numpy_reads_and_maps_the_arrays() {
    if !can_mount() {
        return;
    }
    let has_numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_numpy {
        assert!(std::env::var_os("CI").is_none(), "CI must install numpy");
        eprintln!("skipping: python3 with numpy is not installed");
        return;
    }
    let m = Mounted::daemon();
    let script = format!(
        r#"
import numpy as np
mnt, ref = {mnt:?}, {reference:?}
for name in ["u16-invalid-mask-33x40", "f32-special-128x128", "scaled-three-regions-9x9"]:
    a = np.load(f"{{mnt}}/{{name}}.qem/data.npy", mmap_mode="r")
    b = np.load(f"{{ref}}/{{name}}.npy")
    assert a.shape == b.shape and a.dtype == b.dtype, name
    assert (np.asarray(a).view(np.uint8) == b.view(np.uint8)).all(), name
    column = "001" if name == "scaled-three-regions-9x9" else "1"
    f = np.load(f"{{mnt}}/{{name}}.qem/frames/0/{{column}}.npy")
    assert (f.view(np.uint8) == b[0, 1].view(np.uint8)).all(), name
s = np.load(f"{{mnt}}/u16-invalid-mask-33x40.qem/virtual/sum.npy")
assert s.shape == (2, 3)
import json
v = f"{{mnt}}/u8-two-block-chunks.qem/virtual"
d = json.load(open(f"{{v}}/detectors.json"))
a = np.load(f"{{mnt}}/u8-two-block-chunks.qem/data.npy")
rr, cc = np.mgrid[0:a.shape[2], 0:a.shape[3]]
cy, cx = d["center"]
r = d["bright_field_radius"]
disk = (rr - cy) ** 2 + (cc - cx) ** 2 <= r * r
bf = np.load(f"{{v}}/bf.npy")
assert bf.dtype == np.uint64 and bf.shape == a.shape[:2]
assert (bf == a[..., disk].astype(np.uint64).sum(-1)).all()
assert (np.load(f"{{v}}/max_dp.npy") == a.max(axis=(0, 1))).all()
print("ok")
"#,
        mnt = m.mnt.to_string_lossy(),
        reference = fixtures().join("qem").to_string_lossy()
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn xattrs_describe_containers() {
    if !can_mount() {
        return;
    }
    let m = Mounted::daemon();
    let get = |rel: &str, name: &str| -> Option<String> {
        let path = CString::new(m.path(rel).as_os_str().as_bytes()).unwrap();
        let name = CString::new(name).unwrap();
        let mut buf = vec![0u8; 256];
        // SAFETY: valid C strings and a buffer of the stated size.
        let n = unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
    };
    assert_eq!(
        get("u16-invalid-mask-33x40.qem", "user.qem.codec").as_deref(),
        Some("runtime-column-rans-spatial-v2")
    );
    assert_eq!(
        get("u16-invalid-mask-33x40.qem", "user.qem.shape").as_deref(),
        Some("2,3,33,40")
    );
    assert_eq!(
        get("f32-special-128x128.qem", "user.qem.dtype").as_deref(),
        Some("float32")
    );
    let state = fs::read_to_string(m.path("nested/emb.semq/state_id")).unwrap();
    assert_eq!(
        get("nested/emb.semq", "user.semq.state_id"),
        Some(state.trim().to_string())
    );
    assert_eq!(get("README.txt", "user.qem.codec"), None);
    // Files and folders inside a container carry its attributes.
    for rel in ["data.npy", "virtual/bf.npy", "frames/0"] {
        assert_eq!(
            get(&format!("f32-special-128x128.qem/{rel}"), "user.qem.codec").as_deref(),
            Some("float32-bit-lanes-rans-v1"),
            "{rel}"
        );
    }
    assert_eq!(
        get("nested/emb.semq/ids.txt", "user.semq.state_id"),
        Some(state.trim().to_string())
    );
}

#[test]
fn source_changes_show_up() {
    if !can_mount() {
        return;
    }
    let m = Mounted::daemon();
    assert!(!m.path("late.qem").exists());
    fs::copy(
        fixtures().join("qem/u8-zeros-8x8.qem"),
        m.src.join("late.qem"),
    )
    .unwrap();
    // Names are trusted for a second at most.
    std::thread::sleep(Duration::from_millis(1100));
    assert!(m.path("late.qem/data.npy").exists());
    fs::remove_file(m.src.join("late.qem")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(!m.path("late.qem").exists());
}

/// `nohup qemfs mount -f ...`: a signal ignored when the daemon started
/// (here SIGHUP, the terminal closing) stays ignored, and the mount stays;
/// SIGTERM still unmounts.
#[test]
fn a_signal_ignored_at_start_leaves_the_mount_alone() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::foreground_ignoring(&[libc::SIGHUP]);
    let mut child = m.child.take().unwrap();
    // SAFETY: signalling our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended a daemon started with it ignored"
    );
    assert!(is_mounted(&m.mnt));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(!is_mounted(&m.mnt));
}

#[test]
fn unmount_cleans_up_even_after_the_daemon_is_killed() {
    if !can_mount() {
        return;
    }
    // A clean stop: SIGTERM unmounts.
    let mut m = Mounted::foreground();
    let mut child = m.child.take().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(!is_mounted(&m.mnt));

    // A killed daemon leaves a stale mount; `qemfs unmount` removes it.
    let mut m = Mounted::foreground();
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(is_mounted(&m.mnt), "killed daemon leaves its mount");
    let out = Command::new(qemfs())
        .arg("unmount")
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(&m.mnt));

    // Mounting over a stale mount cleans it first.
    let mut m = Mounted::foreground();
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let out = Command::new(qemfs())
        .arg("mount")
        .arg(&m.src)
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fs::read(m.path("README.txt")).is_ok());
    drop(m);

    // Errors: not a folder, not mounted.
    let out = Command::new(qemfs())
        .args(["mount", "/nonexistent-src", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent-src"));
    let out = Command::new(qemfs())
        .args(["unmount", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// The short version of `benches/stress.py`: 16 readers for 15 s while a
/// source is truncated and replaced under them.
#[test]
fn parallel_readers_survive_truncation_and_replacement() {
    if !can_mount() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/stress.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--seconds", "15", "--readers", "16", "--cache-mib", "128"])
        .env("QEMFS_BIN_DIR", qemfs().parent().unwrap())
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{report}");
    assert!(out.status.success(), "{report}");
    assert!(report.contains("truncate+replace cycles"), "{report}");
}

#[test]
fn numbers_the_kernel_forgets_are_freed_and_paths_still_resolve() {
    if !can_mount() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let m = Mounted::daemon();
    let frame = m.path("u8-two-block-chunks.qem/frames/0/000.npy");
    let before = fs::metadata(&frame).unwrap().ino();
    let bytes = fs::read(&frame).unwrap();
    // Evict unused dentries and inodes: the kernel sends FORGET for each.
    let drop = || {
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
        fs::write("/proc/sys/vm/drop_caches", b"2").expect("root writes drop_caches");
    };
    // The daemon dropped its number (so the table follows the kernel's
    // cache instead of growing): the path resolves again, under a new
    // number, to the same bytes. Numbers are never reused.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        drop();
        let ino = fs::metadata(&frame).unwrap().ino();
        if ino != before || Instant::now() > deadline {
            break ino;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(after, before, "the forgotten number was not freed");
    assert_eq!(fs::read(&frame).unwrap(), bytes);
    // Listings and reads keep working after any number of evictions.
    for _ in 0..3 {
        drop();
        let names: Vec<_> = fs::read_dir(m.path("u8-two-block-chunks.qem/frames/0"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(!names.is_empty());
        assert_eq!(fs::read(&frame).unwrap(), bytes);
    }
}
