//! What the mount tests share: whether this machine can mount, where the
//! binaries and fixtures are, and the mount table.
#![allow(dead_code)] // each test file uses its own part

use std::fs;
use std::path::{Path, PathBuf};

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
