//! The FUSE adapter: maps kernel requests onto the core library's virtual
//! tree. Inodes are numbered by path; reads run on a worker pool so a slow
//! decode never holds up other requests.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

use qemfs::tree::{Attr, Content, Node, Tree, TreeError};

/// How long the kernel may trust names and attributes. Short, so that a
/// changed source file shows up quickly; contents are immutable per
/// opening, so the page cache is kept (FOPEN_KEEP_CACHE).
const TTL: Duration = Duration::from_secs(1);

const ROOT: u64 = 1;

/// A number handed to the kernel. It holds the path only, never the node:
/// a node holds its container (a mapping, parsed headers), and the kernel
/// may keep numbers for as long as it likes, so holding nodes here would
/// keep every container ever looked at open. The tree's bounded table of
/// opened containers is what keeps them, and closes idle ones.
struct Inode {
    path: String,
    /// Modification time of the source behind the node when the number
    /// was handed out.
    version: SystemTime,
    /// The kernel's references: one per entry reply (lookup, a
    /// readdirplus entry other than `.` and `..`), given back by FORGET.
    lookups: u64,
}

#[derive(Default)]
struct Inodes {
    by_ino: HashMap<u64, Inode>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Inodes {
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
        if inode.lookups == 0 {
            self.drop_unreferenced(ino);
        }
    }

    /// Drops `ino` if the kernel holds no reference to it (the root stays).
    fn drop_unreferenced(&mut self, ino: u64) {
        if ino == ROOT || self.by_ino.get(&ino).is_none_or(|i| i.lookups > 0) {
            return;
        }
        if let Some(inode) = self.by_ino.remove(&ino) {
            if self.by_path.get(&inode.path) == Some(&ino) {
                self.by_path.remove(&inode.path);
            }
        }
    }
}

/// An open directory: its listing, taken once at opendir so that paging
/// through a large folder (the frames of a big scan) is linear.
/// A directory's entries as of `opendir`, with their attributes (served
/// by readdirplus, so `ls -l` needs no lookup per entry).
struct DirListing {
    entries: Vec<(u64, Attr, String)>,
}

pub struct QemFs {
    tree: Arc<Tree>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<dyn Content>>>,
    dirs: Mutex<HashMap<u64, Arc<DirListing>>>,
    next_handle: AtomicU64,
    pool: crate::workers::Workers,
    log: Arc<dyn Fn(&str) + Send + Sync>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn errno(e: &TreeError) -> Errno {
    match e {
        TreeError::NotFound(_) => Errno::ENOENT,
        TreeError::NotADirectory(_) => Errno::ENOTDIR,
        TreeError::IsADirectory(_) => Errno::EISDIR,
        TreeError::Decode { .. }
        | TreeError::Io { .. }
        | TreeError::Internal(_)
        | TreeError::SourceChanged => Errno::EIO,
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

impl QemFs {
    pub fn new(
        tree: Arc<Tree>,
        workers: usize,
        log: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> std::io::Result<Self> {
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
            },
        );
        let pool = crate::workers::Workers::new(workers.max(2))?;
        Ok(QemFs {
            tree,
            inodes: Mutex::new(inodes),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            pool,
            log,
        })
    }

    fn file_attr(&self, ino: u64, attr: &Attr) -> FileAttr {
        let (kind, nlink) = if attr.is_dir {
            (FileType::Directory, 2)
        } else {
            (FileType::RegularFile, 1)
        };
        FileAttr {
            ino: INodeNo(ino),
            size: attr.size,
            blocks: attr.size.div_ceil(512),
            atime: attr.mtime,
            mtime: attr.mtime,
            ctime: attr.mtime,
            crtime: attr.mtime,
            kind,
            perm: attr.perm,
            nlink,
            uid: attr.uid,
            gid: attr.gid,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }

    /// The node behind `ino`, resolved by its path. A number handed out
    /// for an earlier version of its source is stale (ESTALE makes the
    /// kernel look the path up again and get the new number), so the old
    /// number's cached pages are never taken for the new file's.
    fn node(&self, ino: u64) -> Result<(String, Node), Errno> {
        let (path, version) = {
            let inodes = lock(&self.inodes);
            let inode = inodes.by_ino.get(&ino).ok_or(Errno::ENOENT)?;
            (inode.path.clone(), inode.version)
        };
        let node = self.tree.resolve(&path).map_err(|e| errno(&e))?;
        if ino != ROOT && self.tree.attr(&node).mtime != version {
            return Err(Errno::ESTALE);
        }
        Ok((path, node))
    }

    /// Extended attributes: the container's, and on the root the
    /// daemon's pid (for `qemfs unmount`, which waits for it to exit).
    fn xattrs(&self, ino: u64, path: &str) -> Vec<(String, Vec<u8>)> {
        let mut out = self.tree.xattrs(path);
        if ino == ROOT {
            out.push((
                crate::mountpoint::PID_XATTR.to_string(),
                std::process::id().to_string().into_bytes(),
            ));
        }
        out
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

impl Filesystem for QemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large readahead: decoded arrays are read sequentially in bulk.
        let _ = config.set_max_readahead(1 << 20);
        // Listings carry attributes: `ls -l` of a container of thousands
        // of frames then costs one request per page, not one per entry.
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Ok((parent_path, parent_node)) = self.node(parent.0) else {
            return reply.error(Errno::ENOENT);
        };
        // Tree paths are text; a name that is not UTF-8 is not listed
        // either, and must not alias one that is.
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.tree.child(&parent_node, name) {
            Ok(node) => {
                let path = join(&parent_path, name);
                let attr = self.tree.attr(&node);
                let ino = {
                    let mut inodes = lock(&self.inodes);
                    let ino = inodes.ino_of(&path, attr.mtime);
                    inodes.referenced(ino);
                    ino
                };
                reply.entry(&TTL, &self.file_attr(ino, &attr), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino.0) {
            Ok((_, node)) => reply.attr(&TTL, &self.file_attr(ino.0, &self.tree.attr(&node))),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.node(ino.0) {
            Ok((_, Node::File(content, _))) => {
                let fh = self.handle();
                lock(&self.files).insert(fh, content);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
            }
            Ok(_) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(content) = lock(&self.files).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let log = Arc::clone(&self.log);
        self.pool.spawn(move || {
            let end = content.size().min(offset.saturating_add(u64::from(size)));
            let len = end.saturating_sub(offset) as usize;
            let mut buffer = vec![0u8; len];
            let mut done = 0;
            while done < len {
                match content.read_at(offset + done as u64, &mut buffer[done..]) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) => {
                        log(&format!("read failed: {e}"));
                        return reply.error(errno(&e));
                    }
                }
            }
            reply.data(&buffer[..done]);
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: fuser::ReplyEmpty,
    ) {
        lock(&self.files).remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let (path, node) = match self.node(ino.0) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        let listing = match self.tree.list(&node) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        let parent_ino = {
            let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
            lock(&self.inodes)
                .by_path
                .get(parent)
                .copied()
                .unwrap_or(ROOT)
        };
        let own = self.tree.attr(&node);
        let mut entries = vec![
            (ino.0, own, ".".to_string()),
            (parent_ino, own, "..".to_string()),
        ];
        {
            let mut inodes = lock(&self.inodes);
            for (name, attr) in listing {
                entries.push((inodes.ino_of(&join(&path, &name), attr.mtime), attr, name));
            }
        }
        let fh = self.handle();
        lock(&self.dirs).insert(fh, Arc::new(DirListing { entries }));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(listing) = lock(&self.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, attr, name)) in listing.entries.iter().enumerate().skip(offset as usize) {
            let kind = if attr.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(*ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Some(listing) = lock(&self.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let mut added = Vec::new();
        for (i, (ino, attr, name)) in listing.entries.iter().enumerate().skip(offset as usize) {
            let attr = self.file_attr(*ino, attr);
            if reply.add(
                INodeNo(*ino),
                (i + 1) as u64,
                name,
                &TTL,
                &attr,
                Generation(0),
            ) {
                break;
            }
            // The kernel takes a reference to every entry but `.` and `..`.
            if i >= 2 {
                added.push(*ino);
            }
        }
        {
            let mut inodes = lock(&self.inodes);
            for ino in added {
                inodes.referenced(ino);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: fuser::ReplyEmpty,
    ) {
        // Numbers of entries the kernel never took (a listing abandoned
        // part way, or plain readdir) go; a later lookup makes new ones.
        if let Some(listing) = lock(&self.dirs).remove(&fh.0) {
            let mut inodes = lock(&self.inodes);
            for (ino, _, _) in listing.entries.iter().skip(2) {
                inodes.drop_unreferenced(*ino);
            }
        }
        reply.ok();
    }

    // BATCH_FORGET comes here too: fuser's default splits it (its
    // `ForgetOne` is not public, so it cannot be overridden).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.inodes).forget(ino.0, nlookup);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let stats = self.tree.cache().stats();
        reply.statfs(0, 0, 0, stats.entries as u64, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = match self.node(ino.0) {
            Ok((path, _)) => self
                .xattrs(ino.0, &path)
                .into_iter()
                .find(|(k, _)| OsStr::new(k) == name)
                .map(|(_, v)| v),
            Err(e) => return reply.error(e),
        };
        match value {
            None => reply.error(Errno::NO_XATTR),
            Some(v) if size == 0 => reply.size(v.len() as u32),
            Some(v) if v.len() <= size as usize => reply.data(&v),
            Some(_) => reply.error(Errno::ERANGE),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names: Vec<u8> = match self.node(ino.0) {
            Ok((path, _)) => self
                .xattrs(ino.0, &path)
                .into_iter()
                .flat_map(|(k, _)| k.into_bytes().into_iter().chain([0]))
                .collect(),
            Err(e) => return reply.error(e),
        };
        if size == 0 {
            reply.size(names.len() as u32);
        } else if names.len() <= size as usize {
            reply.data(&names);
        } else {
            reply.error(Errno::ERANGE);
        }
    }
}

/// The time for log lines: RFC 3339, UTC, milliseconds.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Inodes {
        let mut t = Inodes {
            next: ROOT,
            ..Inodes::default()
        };
        t.by_path.insert(String::new(), ROOT);
        t.by_ino.insert(
            ROOT,
            Inode {
                path: String::new(),
                version: SystemTime::UNIX_EPOCH,
                lookups: 1,
            },
        );
        t
    }

    #[test]
    fn a_number_lives_until_the_kernel_returns_every_reference() {
        let t0 = SystemTime::UNIX_EPOCH;
        let mut t = table();
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
        let mut t = table();
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
        let mut t = table();
        let listed = t.ino_of("y.qem", SystemTime::UNIX_EPOCH);
        let taken = t.ino_of("z.qem", SystemTime::UNIX_EPOCH);
        t.referenced(taken);
        t.drop_unreferenced(listed);
        t.drop_unreferenced(taken);
        assert!(!t.by_ino.contains_key(&listed));
        assert!(t.by_ino.contains_key(&taken));
    }
}
