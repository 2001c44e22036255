//! Mount-table checks and unmounting, including recovery of stale mounts
//! (a daemon that was killed leaves a mount answering ENOTCONN).

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount's ID, unique while it exists.
    pub id: u64,
    /// `maj:min` of the mount's device.
    pub device: String,
    /// `fuse.qemfs` for ours when fusermount3 made it, `fuse` when root
    /// mounted it directly (the kernel then shows no subtype).
    pub fstype: String,
    /// The mount's source: `qemfs:SRC` for ours.
    pub source: String,
}

/// What the mount source of ours starts with (`df`, mountinfo).
pub const SOURCE_PREFIX: &str = "qemfs:";

impl Mount {
    pub fn is_qemfs(&self) -> bool {
        self.fstype == "fuse.qemfs"
            || (self.fstype == "fuse" && self.source.starts_with(SOURCE_PREFIX))
    }
}

fn parse_mount(line: &str) -> Option<(String, Mount)> {
    let (fields, tail) = line.split_once(" - ")?;
    let mut fields = fields.split(' ');
    let id = fields.next()?.parse().ok()?;
    let device = fields.nth(1)?.to_string();
    let point = fields.nth(1)?.to_string();
    let mut tail = tail.split(' ');
    let fstype = tail.next()?.to_string();
    let source = tail.next()?.to_string();
    Some((
        point,
        Mount {
            id,
            device,
            fstype,
            source,
        },
    ))
}

fn mounts() -> Vec<(String, Mount)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| info.lines().filter_map(parse_mount).collect())
        .unwrap_or_default()
}

/// The topmost mount at `path`, read from /proc/self/mountinfo (never by
/// stat, which hangs or fails on a stale FUSE mount).
pub fn find(path: &Path) -> Option<Mount> {
    let want = escape(&absolute(path).ok()?.to_string_lossy());
    mounts()
        .into_iter()
        .filter(|(point, _)| *point == want)
        .map(|(_, m)| m)
        .next_back()
}

/// Whether `path` is a mount point.
pub fn is_mounted(path: &Path) -> bool {
    find(path).is_some()
}

/// Whether the mount with this ID still exists.
pub fn id_present(id: u64) -> bool {
    mounts().iter().any(|(_, m)| m.id == id)
}

/// The attribute on a mount's root that names its daemon's process.
pub const PID_XATTR: &str = "user.qemfs.pid";

/// The pid of the daemon serving the mount at `path`, asked of the mount
/// itself; `None` for a stale or unresponsive mount (asked on a thread so
/// that a wedged daemon cannot hang the caller).
pub fn daemon_pid(path: &Path) -> Option<u32> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let name = CString::new(PID_XATTR).expect("no NUL");
        let mut buf = [0u8; 32];
        // SAFETY: valid C strings and a buffer of the length passed.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let pid = usize::try_from(n)
            .ok()
            .and_then(|n| std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok());
        let _ = tx.send(pid);
    });
    rx.recv_timeout(Duration::from_secs(2)).ok().flatten()
}

/// Waits until process `pid` has exited (or is a zombie); false on timeout.
pub fn wait_exit(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        // The state follows the parenthesised command name.
        let gone = state
            .as_deref()
            .and_then(|s| s.rsplit_once(") "))
            .is_none_or(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'));
        if gone {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Raises the kernel's readahead for the mount at `path` (FUSE mounts get
/// a small default; sequential reads of decoded arrays gain about 2× from
/// a larger one). Returns the `maj:min` of the mount when it worked.
pub fn raise_readahead(path: &Path, kib: u32) -> io::Result<String> {
    let device = find(path)
        .map(|m| m.device)
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
/// A user other than root goes through the setuid `fusermount3 -u`, as
/// every FUSE tool does (umount2 is root's only).
pub fn unmount(path: &Path) -> io::Result<Unmounted> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return fusermount_unmount(path);
    }
    match umount2(path, 0) {
        Ok(()) => Ok(Unmounted::Clean),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            umount2(path, libc::MNT_DETACH).map(|()| Unmounted::Lazy)
        }
        Err(e) => Err(e),
    }
}

fn fusermount_unmount(path: &Path) -> io::Result<Unmounted> {
    let run = |flags: &str| {
        let out = Command::new("fusermount3")
            .arg(flags)
            .arg(path)
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("fusermount3: {e}")))?;
        Ok::<_, io::Error>((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    };
    match run("-u")? {
        (true, _) => Ok(Unmounted::Clean),
        (false, why) if why.contains("busy") => match run("-uz")? {
            (true, _) => Ok(Unmounted::Lazy),
            (false, why) => Err(io::Error::other(why)),
        },
        (false, why) => Err(io::Error::other(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_parsed() {
        let line = "36 35 0:52 / /tmp/my\\040mnt ro,nosuid,nodev - fuse qemfs:/data rw,user_id=0";
        let (point, m) = parse_mount(line).unwrap();
        assert_eq!(point, "/tmp/my\\040mnt");
        assert_eq!(
            m,
            Mount {
                id: 36,
                device: "0:52".into(),
                fstype: "fuse".into(),
                source: "qemfs:/data".into(),
            }
        );
        assert!(m.is_qemfs());
        let optional = "25 1 0:23 / /run rw shared:5 master:1 - tmpfs tmpfs rw";
        let other_fuse = "26 1 0:24 / /m rw - fuse sshfs rw";
        assert!(!parse_mount(other_fuse).unwrap().1.is_qemfs());
        let (point, m) = parse_mount(optional).unwrap();
        assert_eq!(
            (point.as_str(), m.fstype.as_str(), m.is_qemfs()),
            ("/run", "tmpfs", false)
        );
        assert_eq!(escape("/a b"), "/a\\040b");
    }
}
