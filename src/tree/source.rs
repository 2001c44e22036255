//! What of the source folder the tree may show: the rule that keeps a
//! mount from reaching into itself or out of its source.
//!
//! Every name is looked at with `lstat`. A symbolic link is resolved one
//! component at a time, each checked *before* it is touched, so that no
//! path inside the mount point is ever stat'ed by the daemon serving it
//! (that request would wait for a worker of the very daemon making it; a
//! few of them wedge the whole mount). A link is shown only when it
//! resolves inside the source (or anywhere, with `follow_symlinks`),
//! never into the mount point, and never to a folder that contains the
//! folder the link is in (a loop, which would make the tree endless).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// Symbolic links followed while resolving one path, as Linux's MAXSYMLINKS.
const MAX_LINKS: usize = 40;

/// The attributes a node takes from the source file or folder behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub mtime: SystemTime,
    /// The source's permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Origin {
    /// A remote object's: readable by this process's user alone, as a
    /// file downloaded would be; `mtime` as the caller knows it.
    pub fn remote(mtime: SystemTime) -> Origin {
        // SAFETY: getuid and getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Origin {
            mtime,
            mode: 0o400,
            uid,
            gid,
        }
    }

    pub fn of(meta: &Metadata) -> Origin {
        Origin {
            mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }

    /// Read-only permission bits for a file: the source's read bits (and
    /// execute bits, for a file passed through as it is).
    pub fn file_perm(&self, passthrough: bool) -> u16 {
        let keep = if passthrough { 0o555 } else { 0o444 };
        (self.mode & keep) as u16
    }

    /// Read-only permission bits for a folder: whoever may read the
    /// source may list and enter the folder made of it.
    pub fn dir_perm(&self) -> u16 {
        let read = self.mode & 0o444;
        (read | (read >> 2)) as u16
    }
}

/// A folder of the source, by its real path, with the real paths of the
/// folders it was reached through (for loop detection).
#[derive(Debug, Clone)]
pub struct SourceDir {
    pub path: PathBuf,
    pub origin: Origin,
    chain: Arc<Vec<PathBuf>>,
}

impl SourceDir {
    /// Whether `real` holds (or is) a folder this one was reached through.
    fn encloses_chain(&self, real: &Path) -> bool {
        self.chain.iter().any(|c| c.starts_with(real))
    }
}

/// Why a source entry is not shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It does not exist (or vanished).
    Missing,
    /// A link out of the source folder (shown with `--follow-symlinks`).
    Escapes(PathBuf),
    /// A link into the mount point.
    IntoMount(PathBuf),
    /// A link to a folder that holds the link: the tree would be endless.
    Loop(PathBuf),
    /// Too many links, or one that cannot be read.
    Unresolvable(String),
    /// A name that is not UTF-8 (paths of the tree are text).
    NotUtf8,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Missing => write!(f, "no such file or directory"),
            Refusal::Escapes(t) => write!(
                f,
                "symbolic link to {} outside the source folder, not followed \
                 (--follow-symlinks follows it)",
                t.display()
            ),
            Refusal::IntoMount(t) => {
                write!(
                    f,
                    "symbolic link into the mount point ({}), not followed",
                    t.display()
                )
            }
            Refusal::Loop(t) => write!(
                f,
                "symbolic link to {}, a folder holding the link: a loop, not followed",
                t.display()
            ),
            Refusal::Unresolvable(why) => write!(f, "symbolic link not followed: {why}"),
            Refusal::NotUtf8 => write!(f, "name is not UTF-8, not shown"),
        }
    }
}

/// The source folder and what may be shown of it.
#[derive(Debug, Clone)]
pub struct Sources {
    root_real: PathBuf,
    mountpoint: Option<PathBuf>,
    follow_symlinks: bool,
}

impl Sources {
    /// `root` must exist; `mountpoint` is where the tree is mounted (never
    /// entered), as a real path.
    pub fn new(
        root: &Path,
        mountpoint: Option<PathBuf>,
        follow_symlinks: bool,
    ) -> io::Result<Sources> {
        let root_real = fs::canonicalize(root)?;
        Ok(Sources {
            root_real,
            mountpoint,
            follow_symlinks,
        })
    }

    pub fn root_real(&self) -> &Path {
        &self.root_real
    }

    /// The source root as a folder, when it is one.
    pub fn root_dir(&self, meta: &Metadata) -> SourceDir {
        SourceDir {
            path: self.root_real.clone(),
            origin: Origin::of(meta),
            chain: Arc::new(vec![self.root_real.clone()]),
        }
    }

    /// The folder `real` reached from `parent`.
    pub fn child_dir(&self, parent: &SourceDir, real: PathBuf, meta: &Metadata) -> SourceDir {
        let mut chain = Vec::with_capacity(parent.chain.len() + 1);
        chain.extend(parent.chain.iter().cloned());
        chain.push(real.clone());
        SourceDir {
            path: real,
            origin: Origin::of(meta),
            chain: Arc::new(chain),
        }
    }

    fn in_mount(&self, path: &Path) -> bool {
        self.mountpoint
            .as_deref()
            .is_some_and(|m| path.starts_with(m))
    }

    /// The entry `name` of `parent`: its real path and (followed) metadata.
    pub fn entry(&self, parent: &SourceDir, name: &str) -> Result<(PathBuf, Metadata), Refusal> {
        let path = parent.path.join(name);
        if self.in_mount(&path) {
            return Err(Refusal::IntoMount(path));
        }
        let meta = fs::symlink_metadata(&path).map_err(|_| Refusal::Missing)?;
        if !meta.file_type().is_symlink() {
            return Ok((path, meta));
        }
        let real = self.real_path(&path)?;
        if !self.follow_symlinks && !real.starts_with(&self.root_real) {
            return Err(Refusal::Escapes(real));
        }
        let meta = fs::metadata(&real).map_err(|_| Refusal::Missing)?;
        if meta.is_dir() && parent.encloses_chain(&real) {
            return Err(Refusal::Loop(real));
        }
        Ok((real, meta))
    }

    /// `path` with every symbolic link resolved, component by component,
    /// refusing before it touches anything inside the mount point.
    fn real_path(&self, path: &Path) -> Result<PathBuf, Refusal> {
        let mut pending: VecDeque<OsString> = VecDeque::new();
        let mut resolved = PathBuf::from("/");
        let push = |pending: &mut VecDeque<OsString>, p: &Path, front: bool| {
            let parts: Vec<OsString> = p
                .components()
                .filter_map(|c| match c {
                    Component::Normal(n) => Some(n.to_os_string()),
                    Component::ParentDir => Some(OsString::from("..")),
                    _ => None,
                })
                .collect();
            if front {
                for part in parts.into_iter().rev() {
                    pending.push_front(part);
                }
            } else {
                pending.extend(parts);
            }
        };
        push(&mut pending, path, false);
        let mut links = 0;
        while let Some(part) = pending.pop_front() {
            if part == ".." {
                resolved.pop();
                continue;
            }
            let next = resolved.join(&part);
            if self.in_mount(&next) {
                return Err(Refusal::IntoMount(next));
            }
            let meta = fs::symlink_metadata(&next).map_err(|_| Refusal::Missing)?;
            if !meta.file_type().is_symlink() {
                resolved = next;
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Refusal::Unresolvable("too many levels of links".into()));
            }
            let target = fs::read_link(&next).map_err(|e| Refusal::Unresolvable(e.to_string()))?;
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            push(&mut pending, &target, true);
        }
        Ok(resolved)
    }
}
