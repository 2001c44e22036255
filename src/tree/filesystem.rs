//! The filesystem over a tree, as a kernel sees it: inode numbers, open
//! file and directory handles, listings paged across requests, and the
//! kernel's lookup references.
//!
//! It is a plain type with no FUSE in it (as mountpoint-s3 keeps its
//! filesystem logic), so that it is tested without mounting
//! (`tests/filesystem_model.rs` runs random sequences of requests and
//! source changes against a reference model); the `qemfs` binary only
//! turns FUSE requests into calls of this type and its answers into
//! replies.
//!
//! Inode numbers hold paths, never nodes: a node holds its container (a
//! mapping, parsed headers), and the kernel may keep numbers for as long
//! as it likes, so holding nodes here would keep every container ever
//! looked at open. The tree's bounded table of opened containers is what
//! keeps them, and closes idle ones.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{Attr, Content, Held, Node, Tree, TreeError};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// How long the kernel may trust names and attributes. Short, so that a
/// changed source file shows up quickly; contents are immutable per
/// opening, so the page cache is kept (FOPEN_KEEP_CACHE).
pub const TTL: Duration = Duration::from_secs(1);

/// The number of the root.
pub const ROOT: u64 = 1;

/// The root's attribute with the byte budget's counters, as JSON: what
/// `--cache-size` holds now and how lookups have gone since the mount
/// started (`getfattr -n user.qemfs.cache --only-values MOUNTPOINT`).
pub const CACHE_XATTR: &str = "user.qemfs.cache";

/// Why a request failed, by the errno the kernel gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// The tree could not serve the path (ENOENT, ENOTDIR, EISDIR, or EIO
    /// for corrupt data and I/O errors).
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// A number unknown to the table (ENOENT).
    #[error("no such inode")]
    UnknownInode,
    /// A number handed out for an earlier version of its source (ESTALE:
    /// the kernel looks the path up again and gets the new number).
    #[error("stale inode: its source changed")]
    Stale,
    /// A handle that is not open (EBADF).
    #[error("bad file handle")]
    BadHandle,
    /// Everything is read-only (EROFS).
    #[error("read-only filesystem")]
    ReadOnly,
    /// No extended attribute of that name (ENODATA).
    #[error("no such attribute")]
    NoAttribute,
}

impl FsError {
    /// The errno of this failure.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Tree(TreeError::NotFound(_)) | FsError::UnknownInode => libc::ENOENT,
            FsError::Tree(TreeError::NotADirectory(_)) => libc::ENOTDIR,
            FsError::Tree(TreeError::IsADirectory(_)) => libc::EISDIR,
            FsError::Tree(
                TreeError::Decode { .. }
                | TreeError::Io { .. }
                | TreeError::Internal(_)
                | TreeError::SourceChanged,
            ) => libc::EIO,
            FsError::Tree(TreeError::OutOfMemory { .. }) => libc::ENOMEM,
            FsError::Stale => libc::ESTALE,
            FsError::BadHandle => libc::EBADF,
            FsError::ReadOnly => libc::EROFS,
            FsError::NoAttribute => libc::ENODATA,
        }
    }
}

struct Inode {
    path: String,
    /// Modification time of the source behind the node when the number
    /// was handed out.
    version: SystemTime,
    /// The kernel's references: one per entry reply (lookup, a
    /// readdirplus entry other than `.` and `..`), given back by FORGET.
    lookups: u64,
    /// Open directory snapshots that list this number: a readdirplus of
    /// any of them may still hand it to the kernel.
    listings: u64,
}

/// Numbers by path and paths by number.
#[derive(Default)]
struct Inodes {
    by_ino: HashMap<u64, Inode>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Inodes {
    fn new() -> Self {
        let mut inodes = Inodes {
            next: ROOT,
            ..Inodes::default()
        };
        inodes.by_path.insert(String::new(), ROOT);
        inodes.by_ino.insert(
            ROOT,
            Inode {
                path: String::new(),
                version: SystemTime::UNIX_EPOCH,
                lookups: 1,
                listings: 0,
            },
        );
        inodes
    }

    /// The number of `path` as of source modification time `version`. A
    /// changed source gets new numbers for everything it shows: the kernel
    /// keeps attributes and (FOPEN_KEEP_CACHE) pages per inode, and must
    /// not serve the old file's size or bytes for the new one. Old numbers
    /// stay valid for handles still open on them.
    fn ino_of(&mut self, path: &str, version: SystemTime) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if self.by_ino.get(&ino).is_some_and(|i| i.version == version) {
                return ino;
            }
        }
        self.next += 1;
        let ino = self.next;
        self.by_path.insert(path.to_string(), ino);
        self.by_ino.insert(
            ino,
            Inode {
                path: path.to_string(),
                version,
                lookups: 0,
                listings: 0,
            },
        );
        ino
    }

    /// The kernel took a reference to `ino` (an entry reply).
    fn referenced(&mut self, ino: u64) {
        if let Some(inode) = self.by_ino.get_mut(&ino) {
            inode.lookups += 1;
        }
    }

    /// The kernel gave back `n` references (FORGET); a number nobody
    /// holds any more is dropped, so the table stays as large as the
    /// kernel's inode cache, however often sources change.
    fn forget(&mut self, ino: u64, n: u64) {
        let Some(inode) = self.by_ino.get_mut(&ino) else {
            return;
        };
        inode.lookups = inode.lookups.saturating_sub(n);
        self.drop_unreferenced(ino);
    }

    /// A snapshot listing `ino` was made.
    fn listed(&mut self, ino: u64) {
        if let Some(inode) = self.by_ino.get_mut(&ino) {
            inode.listings += 1;
        }
    }

    /// A snapshot listing `ino` was released.
    fn unlisted(&mut self, ino: u64) {
        if let Some(inode) = self.by_ino.get_mut(&ino) {
            inode.listings = inode.listings.saturating_sub(1);
        }
        self.drop_unreferenced(ino);
    }

    /// Drops `ino` if neither the kernel nor an open snapshot holds it
    /// (the root stays).
    fn drop_unreferenced(&mut self, ino: u64) {
        if ino == ROOT
            || self
                .by_ino
                .get(&ino)
                .is_none_or(|i| i.lookups > 0 || i.listings > 0)
        {
            return;
        }
        if let Some(inode) = self.by_ino.remove(&ino) {
            if self.by_path.get(&inode.path) == Some(&ino) {
                self.by_path.remove(&inode.path);
            }
        }
    }
}

/// One entry of a directory page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The offset of the entry after this one (what the kernel passes to
    /// continue the listing).
    pub next_offset: u64,
    pub ino: u64,
    pub attr: Attr,
    pub name: String,
}

/// An open directory. A source folder is listed once at opendir (so that
/// paging through it is linear); a folder inside a container is paged from
/// the container on demand, so that a scan of millions of frames never has
/// its listing made whole (a 16.7 M-row scan listed whole took 1.6 GB).
/// Entries carry their attributes (served by readdirplus, so `ls -l` needs
/// no lookup per entry).
enum DirListing {
    Snapshot(Vec<(u64, Attr, String)>),
    Paged {
        path: String,
        node: Node,
        own: (u64, Attr),
        parent: u64,
    },
}

/// Entries made at a time for a readdir request of a paged folder (about
/// what a reply buffer of plain readdir holds; more pages are made while
/// the reply has room), so a request makes little more than it sends.
const PAGE: usize = 128;

/// Numbers shown by plain readdir for entries never looked up: the kernel
/// only displays them (d_ino), and entering them in the table would make
/// it as large as the listing. Real numbers count up from 2 and never
/// reach this range.
pub const SHOWN_ONLY: u64 = 1 << 63;

fn shown_only(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    SHOWN_ONLY | (h.finish() >> 1)
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// An open file: what its handle reads from. Kept whole for as long as the
/// handle is open, so that a source replaced meanwhile is never mixed in.
pub struct OpenFile {
    content: Arc<dyn Content>,
}

impl OpenFile {
    /// Whether the file is served around the kernel's page cache (see
    /// [`Content::direct_io`]).
    pub fn direct_io(&self) -> bool {
        self.content.direct_io()
    }

    /// The bytes `[offset, offset + size)`, clamped to the file's size.
    pub fn read(&self, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        self.read_bytes(offset, size).map(|b| b.to_vec())
    }

    /// As [`read`](Self::read), lent from the value that holds them when
    /// one does (see [`Content::held_at`]): what a reply sends without a
    /// copy.
    pub fn read_bytes(&self, offset: u64, size: u32) -> Result<ReadBytes, FsError> {
        let content = &self.content;
        let end = content.size().min(offset.saturating_add(u64::from(size)));
        let len = end.saturating_sub(offset) as usize;
        if len > 0 {
            if let Some(held) = content.held_at(offset, len)? {
                if held.len() == len {
                    return Ok(ReadBytes::Held(held));
                }
            }
        }
        let mut buffer = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match content.read_at(offset + done as u64, &mut buffer[done..])? {
                0 => break,
                n => done += n,
            }
        }
        buffer.truncate(done);
        Ok(ReadBytes::Owned(buffer))
    }
}

/// The answer to a read: bytes copied for it, or lent from a held value.
pub enum ReadBytes {
    Owned(Vec<u8>),
    Held(Held),
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Owned(v) => v,
            ReadBytes::Held(h) => h,
        }
    }
}

/// The filesystem: a tree and the tables a kernel's requests need.
pub struct Filesystem {
    tree: Arc<Tree>,
    /// Extended attributes of the root besides the tree's own (the
    /// daemon's pid, which `qemfs unmount` waits for).
    root_xattrs: Vec<(String, Vec<u8>)>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<DirListing>>>,
    next_handle: AtomicU64,
}

impl Filesystem {
    pub fn new(tree: Arc<Tree>, root_xattrs: Vec<(String, Vec<u8>)>) -> Self {
        Filesystem {
            tree,
            root_xattrs,
            inodes: Mutex::new(Inodes::new()),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        }
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// How many numbers the table holds (the root included): as many as
    /// the kernel holds references to or open snapshots list.
    pub fn inode_count(&self) -> usize {
        lock(&self.inodes).by_ino.len()
    }

    /// How many file and directory handles are open.
    pub fn handle_count(&self) -> usize {
        lock(&self.files).len() + lock(&self.dirs).len()
    }

    /// The node behind `ino`, resolved by its path. A number handed out
    /// for an earlier version of its source is stale, so the old number's
    /// cached pages are never taken for the new file's.
    fn node(&self, ino: u64) -> Result<(String, Node), FsError> {
        let (path, version) = {
            let inodes = lock(&self.inodes);
            let inode = inodes.by_ino.get(&ino).ok_or(FsError::UnknownInode)?;
            (inode.path.clone(), inode.version)
        };
        let node = self.tree.resolve(&path)?;
        if ino != ROOT && self.tree.attr(&node).mtime != version {
            return Err(FsError::Stale);
        }
        Ok((path, node))
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// LOOKUP: the entry `name` of `parent`; the kernel takes a reference
    /// to the number returned.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<(u64, Attr), FsError> {
        // A parent that cannot be resolved (gone, or stale) has no
        // entries: ENOENT, as a kernel expects of a lookup.
        let Ok((parent_path, parent_node)) = self.node(parent) else {
            return Err(FsError::UnknownInode);
        };
        // Tree paths are text; a name that is not UTF-8 is not listed
        // either, and must not alias one that is.
        let name = name
            .to_str()
            .ok_or_else(|| TreeError::NotFound(name.to_string_lossy().into_owned()))?;
        let node = self.tree.child(&parent_node, name)?;
        let path = join(&parent_path, name);
        let attr = self.tree.attr(&node);
        let mut inodes = lock(&self.inodes);
        let ino = inodes.ino_of(&path, attr.mtime);
        inodes.referenced(ino);
        Ok((ino, attr))
    }

    /// GETATTR.
    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        let (_, node) = self.node(ino)?;
        Ok(self.tree.attr(&node))
    }

    /// OPEN: a handle reading the file as it is now.
    pub fn open(&self, ino: u64, read_only: bool) -> Result<u64, FsError> {
        if !read_only {
            return Err(FsError::ReadOnly);
        }
        match self.node(ino)? {
            (_, Node::File(content, _)) => {
                // A source file passed through is opened now, so that the
                // handle reads this file even if another is renamed over it.
                content.pin()?;
                let fh = self.handle();
                lock(&self.files).insert(fh, Arc::new(OpenFile { content }));
                Ok(fh)
            }
            (path, _) => Err(TreeError::IsADirectory(path).into()),
        }
    }

    /// The open file behind a handle (to read on another thread).
    pub fn file(&self, fh: u64) -> Result<Arc<OpenFile>, FsError> {
        lock(&self.files)
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)
    }

    /// RELEASE.
    pub fn release(&self, fh: u64) {
        lock(&self.files).remove(&fh);
    }

    /// OPENDIR: a source folder is listed now, a container's folder is
    /// paged from the container as it is read.
    pub fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        let (path, node) = self.node(ino)?;
        let parent_ino = {
            let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
            lock(&self.inodes)
                .by_path
                .get(parent)
                .copied()
                .unwrap_or(ROOT)
        };
        let own = self.tree.attr(&node);
        let listing = if matches!(node, Node::Dir(..)) {
            DirListing::Paged {
                path,
                node,
                own: (ino, own),
                parent: parent_ino,
            }
        } else {
            let listing = self.tree.list(&node)?;
            let mut entries = vec![
                (ino, own, ".".to_string()),
                (parent_ino, own, "..".to_string()),
            ];
            let mut inodes = lock(&self.inodes);
            for (name, attr) in listing {
                let child = inodes.ino_of(&join(&path, &name), attr.mtime);
                inodes.listed(child);
                entries.push((child, attr, name));
            }
            DirListing::Snapshot(entries)
        };
        let fh = self.handle();
        lock(&self.dirs).insert(fh, Arc::new(listing));
        Ok(fh)
    }

    /// Entries of an open directory from `offset` on, with their indices.
    /// `numbered`: the kernel will take references (readdirplus), so every
    /// entry gets a real number; plain readdir gets display-only numbers
    /// for entries not yet known.
    fn page(
        &self,
        listing: &DirListing,
        offset: usize,
        numbered: bool,
    ) -> Result<Vec<(usize, u64, Attr, String)>, FsError> {
        match listing {
            // A page, not the rest: a request that cloned everything
            // after its offset made listing a folder quadratic.
            DirListing::Snapshot(entries) => {
                let start = offset.min(entries.len());
                let end = start.saturating_add(PAGE).min(entries.len());
                Ok(entries[start..end]
                    .iter()
                    .enumerate()
                    .map(|(k, (ino, attr, name))| (start + k, *ino, *attr, name.clone()))
                    .collect())
            }
            DirListing::Paged {
                path,
                node,
                own,
                parent,
            } => {
                let mut out = Vec::new();
                for i in offset..2 {
                    let (ino, name) = if i == 0 {
                        (own.0, ".")
                    } else {
                        (*parent, "..")
                    };
                    out.push((i, ino, own.1, name.to_string()));
                }
                let start = offset.max(2) - 2;
                let entries = self.tree.list_range(node, start..start + PAGE)?;
                let mut inodes = lock(&self.inodes);
                for (k, (name, attr)) in entries.into_iter().enumerate() {
                    let child = join(path, &name);
                    let ino = match inodes.by_path.get(&child) {
                        Some(&ino) if !numbered => ino,
                        _ if numbered => {
                            // Listed until the reply is made, so that a
                            // FORGET of the same number meanwhile cannot
                            // drop it before the kernel's reference is
                            // counted (found by the shuttle test).
                            let ino = inodes.ino_of(&child, attr.mtime);
                            inodes.listed(ino);
                            ino
                        }
                        _ => shown_only(&child),
                    };
                    out.push((start + k + 2, ino, attr, name));
                }
                Ok(out)
            }
        }
    }

    /// READDIR (`plus` false) or READDIRPLUS (`plus` true) of an open
    /// directory from `offset`: hands entries to `add` until it answers
    /// `true` (the reply is full; that entry was not taken). For
    /// readdirplus the kernel takes a reference to every entry taken but
    /// `.` and `..`.
    pub fn readdir(
        &self,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirEntry) -> bool,
    ) -> Result<(), FsError> {
        let listing = lock(&self.dirs)
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)?;
        let mut offset = usize::try_from(offset).unwrap_or(usize::MAX);
        // Page after page until the reply is full: a reply holds a few
        // dozen to a few hundred entries, so pages are small and only
        // about what one reply takes is made per request.
        loop {
            let entries = self.page(&listing, offset, plus)?;
            let Some(last) = entries.last().map(|e| e.0) else {
                return Ok(());
            };
            let mut taken = Vec::new();
            let mut full = false;
            for (i, ino, attr, name) in &entries {
                let entry = DirEntry {
                    next_offset: (i + 1) as u64,
                    ino: *ino,
                    attr: *attr,
                    name: name.clone(),
                };
                if add(&entry) {
                    full = true;
                    break;
                }
                if *i >= 2 {
                    taken.push(*ino);
                }
            }
            if plus {
                let mut inodes = lock(&self.inodes);
                for ino in taken {
                    inodes.referenced(ino);
                }
                // A page's numbers are listed only while its reply is
                // made: those the reply had no room for go now (a
                // snapshot keeps its numbers until releasedir).
                if matches!(*listing, DirListing::Paged { .. }) {
                    for (i, ino, _, _) in &entries {
                        if *i >= 2 {
                            inodes.unlisted(*ino);
                        }
                    }
                }
            }
            if full {
                return Ok(());
            }
            offset = last + 1;
        }
    }

    /// RELEASEDIR: numbers of entries the kernel never took (a listing
    /// abandoned part way, or plain readdir) go; a later lookup makes new
    /// ones.
    pub fn releasedir(&self, fh: u64) {
        if let Some(listing) = lock(&self.dirs).remove(&fh) {
            if let DirListing::Snapshot(entries) = &*listing {
                let mut inodes = lock(&self.inodes);
                for (ino, _, _) in entries.iter().skip(2) {
                    inodes.unlisted(*ino);
                }
            }
        }
    }

    /// FORGET: the kernel gives back `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        lock(&self.inodes).forget(ino, n);
    }

    /// Extended attributes of `ino`: the container's, and on the root the
    /// daemon's own and the budget's counters ([`CACHE_XATTR`]).
    pub fn xattrs(&self, ino: u64) -> Result<Vec<(String, Vec<u8>)>, FsError> {
        let (path, _) = self.node(ino)?;
        let mut out = self.tree.xattrs(&path);
        if ino == ROOT {
            out.extend(self.root_xattrs.iter().cloned());
            out.push((CACHE_XATTR.to_string(), self.cache_counters()));
        }
        Ok(out)
    }

    /// The budget's counters as a JSON object (see [`crate::cache::CacheStats`]).
    fn cache_counters(&self) -> Vec<u8> {
        let s = self.tree.cache().stats();
        serde_json::json!({
            "budget_bytes": s.budget,
            "held_bytes": s.bytes,
            "reserved_bytes": s.reserved,
            "entries": s.entries,
            "hits": s.hits,
            "misses": s.misses,
            "loads": s.loads,
            "evictions": s.evictions,
        })
        .to_string()
        .into_bytes()
    }

    /// GETXATTR: the value of one extended attribute.
    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<Vec<u8>, FsError> {
        self.xattrs(ino)?
            .into_iter()
            .find(|(k, _)| OsStr::new(k) == name)
            .map(|(_, v)| v)
            .ok_or(FsError::NoAttribute)
    }

    /// LISTXATTR: the names, each ended by a NUL.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        Ok(self
            .xattrs(ino)?
            .into_iter()
            .flat_map(|(k, _)| k.into_bytes().into_iter().chain([0]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_lives_until_the_kernel_returns_every_reference() {
        let t0 = SystemTime::UNIX_EPOCH;
        let mut t = Inodes::new();
        let a = t.ino_of("x.qem/info.json", t0);
        assert_eq!(t.ino_of("x.qem/info.json", t0), a, "stable while held");
        t.referenced(a);
        t.referenced(a);
        t.forget(a, 1);
        assert!(t.by_ino.contains_key(&a));
        t.forget(a, 1);
        assert!(!t.by_ino.contains_key(&a));
        assert!(!t.by_path.contains_key("x.qem/info.json"));
        // Resolving the path again gives a new number, never an old one.
        let b = t.ino_of("x.qem/info.json", t0);
        assert!(b > a);
        // The root is never dropped.
        t.forget(ROOT, 5);
        t.drop_unreferenced(ROOT);
        assert!(t.by_ino.contains_key(&ROOT));
    }

    #[test]
    fn forgetting_an_old_version_keeps_the_current_one() {
        let (t0, t1) = (
            SystemTime::UNIX_EPOCH,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1),
        );
        let mut t = Inodes::new();
        let old = t.ino_of("x.qem/data.npy", t0);
        t.referenced(old);
        let new = t.ino_of("x.qem/data.npy", t1);
        assert_ne!(old, new, "a changed source gets a new number");
        t.referenced(new);
        t.forget(old, 1);
        assert!(!t.by_ino.contains_key(&old));
        assert_eq!(t.by_path.get("x.qem/data.npy"), Some(&new));
        assert_eq!(t.ino_of("x.qem/data.npy", t1), new);
    }

    #[test]
    fn listed_but_never_taken_numbers_can_go() {
        let mut t = Inodes::new();
        let listed = t.ino_of("y.qem", SystemTime::UNIX_EPOCH);
        let taken = t.ino_of("z.qem", SystemTime::UNIX_EPOCH);
        t.referenced(taken);
        t.drop_unreferenced(listed);
        t.drop_unreferenced(taken);
        assert!(!t.by_ino.contains_key(&listed));
        assert!(t.by_ino.contains_key(&taken));
    }

    #[test]
    fn a_number_listed_by_two_snapshots_stays_until_both_are_released() {
        let mut t = Inodes::new();
        let y = t.ino_of("y.qem", SystemTime::UNIX_EPOCH);
        t.listed(y);
        t.listed(y);
        t.unlisted(y);
        assert!(
            t.by_ino.contains_key(&y),
            "the other snapshot may hand it out"
        );
        t.unlisted(y);
        assert!(!t.by_ino.contains_key(&y));
    }
}

/// The tables under randomised thread schedules (`shuttle`): the kernel
/// sends lookups, listings and forgets of the same paths from many
/// threads at once.
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests {
    use super::*;
    use crate::tree::TreeOptions;
    use shuttle::thread;
    use std::path::Path;

    fn source() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"alpha\n").unwrap();
        std::fs::write(dir.path().join("b.txt"), b"beta\n").unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/conformance/qem/u8-mixed-13x7.qem"),
            dir.path().join("c.qem"),
        )
        .unwrap();
        dir
    }

    /// Every entry readdirplus hands out, read whole: the numbers the
    /// kernel now holds.
    fn list_plus(fs: &Filesystem, ino: u64) -> Vec<u64> {
        let dh = fs.opendir(ino).unwrap();
        let mut taken = Vec::new();
        let mut offset = 0;
        loop {
            let mut page = Vec::new();
            fs.readdir(dh, offset, true, |e| {
                page.push(e.clone());
                false
            })
            .unwrap();
            let Some(last) = page.last() else { break };
            offset = last.next_offset;
            taken.extend(
                page.iter()
                    .filter(|e| e.name != "." && e.name != "..")
                    .map(|e| e.ino),
            );
        }
        fs.releasedir(dh);
        taken
    }

    #[test]
    fn shuttle_numbers_held_by_the_kernel_stay_known() {
        let dir = source();
        let root = dir.path().to_path_buf();
        shuttle::check_random(
            move || {
                let tree = Arc::new(Tree::new(&root, &TreeOptions::default()));
                let fs = Arc::new(Filesystem::new(tree, Vec::new()));
                // The container is opened once before the threads start:
                // its opening is the tree's, not under test here.
                let (c, _) = fs.lookup(ROOT, OsStr::new("c.qem")).unwrap();
                let mut threads = Vec::new();
                // A listing of the container, with attributes...
                let f = Arc::clone(&fs);
                threads.push(thread::spawn(move || {
                    for ino in list_plus(&f, c) {
                        f.getattr(ino).expect("a number readdirplus handed out");
                        f.forget(ino, 1);
                    }
                }));
                // ... a listing of the root ...
                let f = Arc::clone(&fs);
                threads.push(thread::spawn(move || {
                    for ino in list_plus(&f, ROOT) {
                        f.getattr(ino).expect("a number readdirplus handed out");
                        f.forget(ino, 1);
                    }
                }));
                // ... and lookups and forgets of the same entries.
                for name in ["info.json", "header.json"] {
                    let f = Arc::clone(&fs);
                    threads.push(thread::spawn(move || {
                        for _ in 0..2 {
                            let (ino, _) = f.lookup(c, OsStr::new(name)).unwrap();
                            f.getattr(ino).expect("a number lookup handed out");
                            let fh = f.open(ino, true).unwrap();
                            assert!(!f.file(fh).unwrap().read(0, 64).unwrap().is_empty());
                            f.release(fh);
                            f.forget(ino, 1);
                        }
                    }));
                }
                let f = Arc::clone(&fs);
                threads.push(thread::spawn(move || {
                    let (ino, _) = f.lookup(ROOT, OsStr::new("a.txt")).unwrap();
                    f.getattr(ino).expect("a number lookup handed out");
                    f.forget(ino, 1);
                }));
                for t in threads {
                    t.join().unwrap();
                }
                fs.forget(c, 1);
                assert_eq!(fs.inode_count(), 1, "every reference given back");
                assert_eq!(fs.handle_count(), 0);
            },
            1000,
        );
    }
}
