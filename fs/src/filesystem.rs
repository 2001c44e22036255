//! The FUSE adapter: turns kernel requests into calls of the core's
//! [`qemfs::tree::filesystem::Filesystem`] (inode numbers, handles,
//! listings and lookup counts live there, tested without mounting) and its
//! answers into replies. Reads run on a worker pool so a slow decode never
//! holds up other requests.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

use qemfs::tree::filesystem::{Filesystem, FsError, TTL};
use qemfs::tree::{Attr, Tree};

pub struct QemFs {
    core: Filesystem,
    pool: qemfs::workers::Workers,
    log: Arc<dyn Fn(&str) + Send + Sync>,
    /// Files that ask for it are opened with direct I/O (set at INIT,
    /// where the kernel says what it supports).
    direct_io: bool,
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn kind(attr: &Attr) -> FileType {
    if attr.is_dir {
        FileType::Directory
    } else {
        FileType::RegularFile
    }
}

fn file_attr(ino: u64, attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.mtime,
        mtime: attr.mtime,
        ctime: attr.mtime,
        crtime: attr.mtime,
        kind: kind(attr),
        perm: attr.perm,
        nlink: if attr.is_dir { 2 } else { 1 },
        uid: attr.uid,
        gid: attr.gid,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

/// An xattr reply: the size when asked for it (`size` 0), else the bytes
/// if they fit.
fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() <= size as usize {
        reply.data(value);
    } else {
        reply.error(Errno::ERANGE);
    }
}

impl QemFs {
    pub fn new(
        tree: Arc<Tree>,
        workers: usize,
        log: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> std::io::Result<Self> {
        // The daemon names itself on the root, for `qemfs unmount`, which
        // waits for it to exit.
        let pid = (
            crate::mountpoint::PID_XATTR.to_string(),
            std::process::id().to_string().into_bytes(),
        );
        Ok(QemFs {
            core: Filesystem::new(tree, vec![pid]),
            pool: qemfs::workers::Workers::new("qemfs-read", workers.max(2), None)?,
            log,
            direct_io: false,
        })
    }
}

impl fuser::Filesystem for QemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large readahead: decoded arrays are read sequentially in bulk.
        let _ = config.set_max_readahead(1 << 20);
        // Listings carry attributes: `ls -l` of a container of thousands
        // of frames then costs one request per page, not one per entry.
        // AUTO: the kernel asks for attributes only while the listing's
        // entries are being looked up (`ls -l`); a plain `ls` of a scan of
        // millions of frames then goes on as readdir and leaves no inode
        // per entry in the kernel or in our table.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Zarr chunks are read once, whole (Content::direct_io): with
        // direct I/O the kernel copies each reply straight into the
        // reader's buffer, instead of into page-cache pages that the
        // reader copies again and that stay behind. Only where a file so
        // opened can still be mapped (Linux 6.6+): a reader that maps a
        // chunk must not get ENODEV. ASYNC_DIO sends one large read as
        // parallel requests, which the worker pool answers together.
        self.direct_io = config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok();
        if self.direct_io {
            let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.core.lookup(parent.0, name) {
            Ok((ino, attr)) => reply.entry(&TTL, &file_attr(ino, &attr), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &file_attr(ino.0, &attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let read_only = flags.acc_mode() == OpenAccMode::O_RDONLY;
        match self.core.open(ino.0, read_only) {
            Ok(fh) => {
                let direct = self.direct_io && self.core.file(fh).is_ok_and(|f| f.direct_io());
                let flags = if direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    // Immutable content: the page cache survives reopening.
                    FopenFlags::FOPEN_KEEP_CACHE
                };
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(errno(&e)),
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
        let file = match self.core.file(fh.0) {
            Ok(f) => f,
            Err(e) => return reply.error(errno(&e)),
        };
        let log = Arc::clone(&self.log);
        let job = Box::new(move || match file.read_bytes(offset, size) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => {
                log(&format!("read failed: {e}"));
                reply.error(errno(&e));
            }
        });
        // The queue has no bound; it refuses only when the workers are
        // gone, and then the read is answered here.
        if let Err(job) = self.pool.try_run(job) {
            job();
        }
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
        self.core.release(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self.core.readdir(fh.0, offset, false, |e| {
            reply.add(INodeNo(e.ino), e.next_offset, kind(&e.attr), &e.name)
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let listed = self.core.readdir(fh.0, offset, true, |e| {
            reply.add(
                INodeNo(e.ino),
                e.next_offset,
                &e.name,
                &TTL,
                &file_attr(e.ino, &e.attr),
                Generation(0),
            )
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: fuser::ReplyEmpty,
    ) {
        self.core.releasedir(fh.0);
        reply.ok();
    }

    // BATCH_FORGET comes here too: fuser's default splits it (its
    // `ForgetOne` is not public, so it cannot be overridden).
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let stats = self.core.tree().cache().stats();
        reply.statfs(0, 0, 0, stats.entries as u64, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.core.getxattr(ino.0, name) {
            Ok(value) => xattr_reply(&value, size, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.core.listxattr(ino.0) {
            Ok(names) => xattr_reply(&names, size, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// The time for log lines: RFC 3339, UTC, milliseconds.
pub fn timestamp() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}
