//! What the mount tests share: whether this machine can mount, where the
//! binaries and fixtures are, and the mount table.
#![allow(dead_code)] // each test file uses its own part

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `DIR/src` and `DIR/mnt`, made: a mount test's source folder and
/// mountpoint.
pub fn source_and_mountpoint(dir: &Path) -> (PathBuf, PathBuf) {
    let (src, mnt) = (dir.join("src"), dir.join("mnt"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&mnt).unwrap();
    (src, mnt)
}

pub fn can_mount() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !(root && Path::new("/dev/fuse").exists()) {
        eprintln!("skipping: mounting needs root and /dev/fuse");
        return false;
    }
    true
}

pub fn qemfs() -> PathBuf {
    assert_cmd::cargo::cargo_bin("qemfs")
}

pub fn qem() -> PathBuf {
    // The qem binary lives in the same target folder.
    qemfs().with_file_name("qem")
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/conformance")
}

pub fn is_mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_string_lossy().to_string();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn mount(src: &Path, mnt: &Path, extra: &[&str]) -> Output {
    run(Command::new(qemfs())
        .arg("mount")
        .arg(src)
        .arg(mnt)
        .args(extra))
}

pub fn unmount(mnt: &Path) -> Output {
    run(Command::new(qemfs()).arg("unmount").arg(mnt))
}

/// Unmounts `0` when dropped, if it is still mounted: a test that fails
/// between its mount and its own unmount leaves no daemon behind (one
/// holding its budget would skew the memory and speed of later tests).
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = unmount(&self.0);
        }
    }
}

pub fn daemon_pid(mnt: &Path) -> u32 {
    let c = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let name = CString::new("user.qemfs.pid").unwrap();
    let mut buf = [0u8; 32];
    // SAFETY: valid C strings, a buffer of the length given.
    let n = unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 32) };
    assert!(n > 0, "the mount names its daemon");
    std::str::from_utf8(&buf[..n as usize])
        .unwrap()
        .parse()
        .unwrap()
}

pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}
