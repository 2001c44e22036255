//! Mount-table checks and unmounting, including recovery of stale mounts
//! (a daemon that was killed leaves a mount answering ENOTCONN).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Whether `path` is a mount point, read from /proc/self/mountinfo (never
/// by stat, which hangs or fails on a stale FUSE mount).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(path) = absolute(path) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = escape(&path.to_string_lossy());
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mount_point| mount_point == want)
}

/// Raises the kernel's readahead for the mount at `path` (FUSE mounts get
/// a small default; sequential reads of decoded arrays gain about 2× from
/// a larger one). Returns the `maj:min` of the mount when it worked.
pub fn raise_readahead(path: &Path, kib: u32) -> io::Result<String> {
    let path = absolute(path)?;
    let want = escape(&path.to_string_lossy());
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let device = info
        .lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .rfind(|f| f.len() > 4 && f[4] == want)
        .map(|f| f[2].to_string())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "mount not in mountinfo"))?;
    std::fs::write(
        format!("/sys/class/bdi/{device}/read_ahead_kb"),
        kib.to_string(),
    )?;
    Ok(device)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn escape(path: &str) -> String {
    path.replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012")
}

/// An absolute path without touching the file system below `path` itself
/// (canonicalize would stat a possibly stale mount).
pub fn absolute(path: &Path) -> io::Result<PathBuf> {
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    };
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// Whether the mount at `path` is stale: its daemon is gone, so every
/// access fails with ENOTCONN.
pub fn is_stale(path: &Path) -> bool {
    matches!(std::fs::metadata(path), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

fn umount2(path: &Path, flags: libc::c_int) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How an unmount went.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Unmounted at once.
    Clean,
    /// Busy (files still open): detached; it goes when the last user closes.
    Lazy,
}

/// Unmounts `path`; a busy mount is detached lazily instead of failing.
pub fn unmount(path: &Path) -> io::Result<Unmounted> {
    match umount2(path, 0) {
        Ok(()) => Ok(Unmounted::Clean),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            umount2(path, libc::MNT_DETACH).map(|()| Unmounted::Lazy)
        }
        Err(e) => Err(e),
    }
}
