//! The virtual tree: a source folder mirrored with every `.qem` and `.semq`
//! file shown as a directory of ordinary files.
//!
//! It is a plain type, used by the FUSE adapter (`qemfs mount`) and by
//! `qem ls`/`qem cat` alike, so both serve identical bytes. Paths are
//! relative to the mirrored folder, `/`-separated.
//!
//! Containers are opened on first lookup (headers only) and remembered
//! with the source file's size and modification time; a changed file is
//! opened again and its cached blocks dropped, a removed one disappears.
//! At most `TreeOptions::open_containers` are remembered: the least
//! recently used is closed (its mapping goes once no open file holds it),
//! so a folder of 100,000 containers never holds 100,000 mappings.
//! A file whose header cannot be read appears as a directory holding only
//! `ERROR.txt` with the reason; its neighbours are unaffected.
//!
//! The root may also be one container file: the tree is then that file's
//! directory (`qemfs mount scan.qem /mnt/scan`). What of the source is
//! shown (symbolic links, the mount point itself) is decided in `source`.

pub(crate) mod block_buf;
pub mod budget;
pub mod content;
pub mod filesystem;
mod prefetch;
mod qem_view;
mod remote_dir;
mod semq_view;
pub(crate) mod source;
mod virtual_dir;
pub(crate) mod zarr_view;

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

pub use content::{Content, Held};
pub use remote_dir::RemoteDir;
pub use source::{Origin, SourceDir};

use crate::qem::QemFile;
use crate::reduce::geometry::DetectorOptions;
use crate::reduce::{Accelerator, Cpu};
use crate::semq::Encoding;

/// Why a path could not be served. Clone, so that every waiter of a
/// failed single-flight decode gets the error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: not a directory")]
    NotADirectory(String),
    #[error("{0}: is a directory")]
    IsADirectory(String),
    /// Corrupt data met while decoding (EIO at the FUSE edge).
    #[error("{file}: {reason}")]
    Decode { file: String, reason: String },
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("internal error: {0}")]
    Internal(String),
    /// A memory-mapped source was truncated while being read (EIO).
    #[error("{}", crate::mapguard::CHANGED)]
    SourceChanged,
    /// The system refused the memory a read needed (ENOMEM): that read
    /// fails, the mount goes on.
    #[error("{file}: out of memory: {bytes} bytes for its decoded block could not be allocated")]
    OutOfMemory { file: String, bytes: usize },
}

/// Cache key of a decoded window of a block: which opening of which file,
/// which block, the window's first frame within it (0 for an ordinary
/// block, which is one window), and whether it holds scaled codes rather
/// than decoded values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub view: u64,
    pub block: usize,
    pub window: usize,
    pub codes: bool,
}

pub use budget::{Budget, CacheKey};

/// A node inside a container.
#[derive(Clone)]
pub enum Entry {
    File(Arc<dyn Content>),
    Dir(Arc<dyn Directory>),
}

/// A virtual directory. Large ones (frames of a big scan) generate their
/// entries on demand instead of holding them.
pub trait Directory: Send + Sync {
    fn lookup(&self, name: &str) -> Option<Entry>;
    fn list(&self) -> Vec<(String, Entry)>;

    /// The entries `range` of [`Directory::list`], in its order; large
    /// directories make only those (a scan of millions of frames is
    /// listed page by page, never whole).
    fn list_range(&self, range: std::ops::Range<usize>) -> Vec<(String, Entry)> {
        self.list()
            .into_iter()
            .skip(range.start)
            .take(range.len())
            .collect()
    }

    /// Extended attributes (`user.qem.codec`, ...), on container folders.
    fn xattrs(&self) -> Vec<(String, Vec<u8>)> {
        Vec::new()
    }
}

/// A directory whose entries are fixed when it is made.
pub struct StaticDir {
    entries: BTreeMap<String, Entry>,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl StaticDir {
    pub fn new(entries: BTreeMap<String, Entry>) -> Self {
        StaticDir {
            entries,
            xattrs: Vec::new(),
        }
    }

    pub fn with_xattrs(mut self, xattrs: Vec<(String, Vec<u8>)>) -> Self {
        self.xattrs = xattrs;
        self
    }
}

impl Directory for StaticDir {
    fn lookup(&self, name: &str) -> Option<Entry> {
        self.entries.get(name).cloned()
    }

    fn list(&self) -> Vec<(String, Entry)> {
        self.entries
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn xattrs(&self) -> Vec<(String, Vec<u8>)> {
        self.xattrs.clone()
    }
}

/// `info.json` of a `.qem` container (and `qem show --json`): the file's
/// summary and the backend that computes its `virtual/` products.
pub fn info_json<'a>(
    file: &'a QemFile,
    accelerator: &'a dyn Accelerator,
) -> Result<crate::qem::Info<'a>, crate::qem::QemError> {
    Ok(file.info()?.with_backend(accelerator.name()))
}

/// What a path resolves to.
#[derive(Clone)]
pub enum Node {
    /// A folder of the source tree.
    SourceDir(SourceDir),
    /// A folder of a mounted S3 prefix.
    RemoteDir(RemoteDir),
    /// A virtual directory (a container or a folder inside one), with the
    /// attributes of its source file.
    Dir(Arc<dyn Directory>, Origin),
    /// A file: inside a container, or a source file passed through as it
    /// is (`passthrough`, which keeps its execute bits).
    File(Arc<dyn Content>, Origin),
}

/// The attributes a listing or `stat` needs. Permissions, owner and group
/// are the source's (read and execute bits only: everything is read-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub is_dir: bool,
    pub size: u64,
    pub mtime: SystemTime,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
}

impl Attr {
    fn dir(origin: &Origin) -> Attr {
        Attr {
            is_dir: true,
            size: 0,
            mtime: origin.mtime,
            perm: origin.dir_perm(),
            uid: origin.uid,
            gid: origin.gid,
        }
    }

    fn file(origin: &Origin, size: u64, passthrough: bool) -> Attr {
        Attr {
            is_dir: false,
            size,
            mtime: origin.mtime,
            perm: origin.file_perm(passthrough),
            uid: origin.uid,
            gid: origin.gid,
        }
    }
}

/// Where the tree's log lines go (the daemon's log; nowhere for commands).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Distinct refusals logged, at most (a listing repeats them every time).
const LOGGED_REFUSALS: usize = 10_000;

/// Options of a tree.
#[derive(Clone)]
#[non_exhaustive]
pub struct TreeOptions {
    /// The byte budget: decoded blocks and derived files held.
    pub cache_bytes: usize,
    /// The backend of `virtual/` products.
    pub accelerator: Arc<dyn Accelerator>,
    /// Detector geometry given by the user; the rest is found per file.
    pub detectors: DetectorOptions,
    /// Where the tree is mounted, as a real path: never entered.
    pub mountpoint: Option<PathBuf>,
    /// Follow symbolic links that lead out of the source folder.
    pub follow_symlinks: bool,
    /// Lines about source entries not shown (links refused, bad names).
    pub log: Log,
    /// Opened containers kept (mappings and parsed headers); the least
    /// recently used beyond this are closed.
    pub open_containers: usize,
}

impl std::fmt::Debug for TreeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeOptions")
            .field("cache_bytes", &self.cache_bytes)
            .field("accelerator", &self.accelerator.name())
            .field("detectors", &self.detectors)
            .field("mountpoint", &self.mountpoint)
            .field("follow_symlinks", &self.follow_symlinks)
            .finish_non_exhaustive()
    }
}

impl Default for TreeOptions {
    fn default() -> Self {
        TreeOptions {
            cache_bytes: 1 << 30,
            accelerator: Arc::new(Cpu),
            detectors: DetectorOptions::default(),
            mountpoint: None,
            follow_symlinks: false,
            log: Arc::new(|_| {}),
            open_containers: 1024,
        }
    }
}

/// The source file's identity when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime: Option<SystemTime>,
    /// A remote object's ETag (it changes with the bytes even within the
    /// second its modification time is given in).
    etag: Option<String>,
}

fn stamp(meta: &fs::Metadata) -> Stamp {
    Stamp {
        size: meta.len(),
        mtime: meta.modified().ok(),
        etag: None,
    }
}

/// A container as opened (or being opened) once for a stamp of its file.
struct Opened {
    stamp: Stamp,
    id: u64,
    /// Filled by the first lookup; concurrent lookups of the same file wait
    /// here, and only they: the tree-wide map is not held while opening.
    dir: Arc<OnceLock<Arc<dyn Directory>>>,
}

/// Which format a file name announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Qem,
    Semq,
}

/// The container format of a source file name, by extension.
pub fn format_of(name: &str) -> Option<Format> {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with(".qem") {
        Some(Format::Qem)
    } else if lower.ends_with(".semq") {
        Some(Format::Semq)
    } else {
        None
    }
}

/// Returns freed heap pages to the system. Opening a container parses its
/// header into a tree many times the header's size and drops it; glibc's
/// allocator keeps such freed pages resident, so without this each opened
/// container's header stayed in the daemon's memory for good.
pub(crate) fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A mirrored source folder (or one container file).
pub struct Tree {
    root: PathBuf,
    /// The container of a remote root (a URL), once opened: a failed open
    /// is tried again at the next lookup, as the server may be back.
    remote_root: Mutex<Option<(Arc<dyn Directory>, Origin)>>,
    /// When the tree was made: the time of a mounted prefix's folders.
    started: SystemTime,
    sources: std::io::Result<source::Sources>,
    log: Log,
    logged: Mutex<HashSet<PathBuf>>,
    cache: Arc<Budget>,
    accelerator: Arc<dyn Accelerator>,
    detectors: DetectorOptions,
    opened: Mutex<lru::LruCache<PathBuf, Opened>>,
    next_id: AtomicU64,
    /// Listings of the folders of a mounted S3 prefix.
    listings: remote_dir::Listings,
}

impl Tree {
    pub fn new(root: impl AsRef<Path>, options: &TreeOptions) -> Self {
        let root = root.as_ref().to_path_buf();
        Tree {
            sources: source::Sources::new(
                &root,
                options.mountpoint.clone(),
                options.follow_symlinks,
            ),
            root,
            remote_root: Mutex::new(None),
            started: SystemTime::now(),
            log: Arc::clone(&options.log),
            logged: Mutex::new(HashSet::new()),
            cache: Arc::new(Budget::new(options.cache_bytes)),
            accelerator: Arc::clone(&options.accelerator),
            detectors: options.detectors.clone(),
            opened: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(options.open_containers.max(1)).expect("at least 1"),
            )),
            next_id: AtomicU64::new(1),
            listings: remote_dir::Listings::default(),
        }
    }

    /// Extended attributes of `path`: a container's (`user.qem.*`,
    /// `user.semq.*`) on the container and on everything inside it.
    pub fn xattrs(&self, path: &str) -> Vec<(String, Vec<u8>)> {
        let mut prefix = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if format_of(part).is_some() {
                return match self.resolve(&prefix) {
                    Ok(Node::Dir(d, _)) => d.xattrs(),
                    _ => Vec::new(),
                };
            }
        }
        Vec::new()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The tree's byte budget (decoded blocks and derived files).
    pub fn cache(&self) -> &Budget {
        &self.cache
    }

    /// Opens one container file as a directory (for `qem ls`/`qem cat`);
    /// unlike a mounted folder, a file that cannot be read is an error.
    ///
    /// `source` may be a URL (`s3://`, `http(s)://`: see
    /// [`crate::remote::Address`]); its object is read by ranges.
    pub fn open_container(&self, source: &Path) -> Result<Arc<dyn Directory>, TreeError> {
        let name = match crate::remote::Address::of_path(source) {
            Some(address) => address
                .map_err(|e| TreeError::Io {
                    path: source.to_path_buf(),
                    reason: e.to_string(),
                })?
                .file_name()
                .to_string(),
            None => {
                let meta = fs::metadata(source).map_err(|e| TreeError::Io {
                    path: source.to_path_buf(),
                    reason: e.to_string(),
                })?;
                if !meta.is_file() {
                    return Err(TreeError::Io {
                        path: source.to_path_buf(),
                        reason: "not a regular file".into(),
                    });
                }
                source
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }
        };
        let format = format_of(&name).ok_or_else(|| TreeError::Io {
            path: source.to_path_buf(),
            reason: "not a .qem or .semq file".into(),
        })?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.try_open_dir(source, format, id)
            .map_err(|reason| TreeError::Decode {
                file: source.display().to_string(),
                reason,
            })
    }

    /// The container directory of `source`, opened now or reused when the
    /// file is unchanged since it was opened.
    fn container(&self, source: &Path, format: Format, now: Stamp) -> Arc<dyn Directory> {
        let (id, slot) = {
            let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
            match opened.get(source) {
                Some(o) if o.stamp == now => (o.id, Arc::clone(&o.dir)),
                found => {
                    if let Some(stale) = found.map(|o| o.id) {
                        self.cache.remove_where(|k| k.view() == stale);
                    }
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let slot = Arc::new(OnceLock::new());
                    let evicted = opened.push(
                        source.to_path_buf(),
                        Opened {
                            stamp: now,
                            id,
                            dir: Arc::clone(&slot),
                        },
                    );
                    if let Some((path, closed)) = evicted {
                        if path != source {
                            self.cache.remove_where(|k| k.view() == closed.id);
                        }
                    }
                    (id, slot)
                }
            }
        };
        Arc::clone(slot.get_or_init(|| self.open_dir(source, format, id)))
    }

    fn open_dir(&self, source: &Path, format: Format, id: u64) -> Arc<dyn Directory> {
        let opened = self.try_open_dir(source, format, id);
        give_back_freed_memory();
        match opened {
            Ok(dir) => dir,
            Err(reason) => {
                let mut entries = BTreeMap::new();
                let text = format!("{}: {reason}\n", source.display());
                entries.insert(
                    "ERROR.txt".to_string(),
                    Entry::File(
                        Arc::new(content::Bytes::new(text.into_bytes())) as Arc<dyn Content>
                    ),
                );
                Arc::new(StaticDir::new(entries))
            }
        }
    }

    fn try_open_dir(
        &self,
        source: &Path,
        format: Format,
        id: u64,
    ) -> Result<Arc<dyn Directory>, String> {
        match format {
            Format::Qem => QemFile::open(source)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    qem_view::directory(
                        id,
                        source,
                        f,
                        Arc::clone(&self.cache),
                        Arc::clone(&self.accelerator),
                        self.detectors.clone(),
                    )
                    .map_err(|e| e.to_string())
                }),
            Format::Semq => Encoding::open(source)
                .map_err(|e| e.to_string())
                .and_then(|e| semq_view::directory(source, e).map_err(|e| e.to_string())),
        }
    }

    /// Forgets containers whose source file is gone.
    fn forget(&self, source: &Path) {
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = opened.pop(source) {
            self.cache.remove_where(|k| k.view() == o.id);
        }
    }

    fn sources(&self) -> Result<&source::Sources, TreeError> {
        self.sources.as_ref().map_err(|e| TreeError::Io {
            path: self.root.clone(),
            reason: e.to_string(),
        })
    }

    /// Logs why `path` is not shown, once per path.
    fn refused(&self, path: &Path, why: &source::Refusal) {
        if *why == source::Refusal::Missing {
            return;
        }
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.len() < LOGGED_REFUSALS && logged.insert(path.to_path_buf()) {
            (self.log)(&format!("{}: {why}", path.display()));
        }
    }

    /// The root: the source folder, or the container of a single file.
    pub fn root_node(&self) -> Result<Node, TreeError> {
        if let Some(address) = crate::remote::Address::of_path(&self.root) {
            if let Ok(crate::remote::Address::S3 { bucket, key }) = address {
                if format_of(&key).is_none() {
                    // A prefix: its keys as folders. Its time is the
                    // mount's (S3 folders have none of their own).
                    return Ok(Node::RemoteDir(RemoteDir {
                        bucket,
                        prefix: key.trim_end_matches('/').to_string(),
                        origin: Origin::remote(self.started),
                    }));
                }
            }
            return self.remote_root_node();
        }
        let sources = self.sources()?;
        let real = sources.root_real();
        let meta = fs::metadata(real).map_err(|e| TreeError::Io {
            path: self.root.clone(),
            reason: e.to_string(),
        })?;
        if meta.is_dir() {
            return Ok(Node::SourceDir(sources.root_dir(&meta)));
        }
        let name = real
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        match format_of(name) {
            Some(format) if meta.is_file() => Ok(Node::Dir(
                self.container(real, format, stamp(&meta)),
                Origin::of(&meta),
            )),
            _ => Err(TreeError::Io {
                path: self.root.clone(),
                reason: "neither a folder nor a .qem or .semq file".into(),
            }),
        }
    }

    /// The container of a remote root, opened once it opens.
    fn remote_root_node(&self) -> Result<Node, TreeError> {
        let mut held = self.remote_root.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((dir, origin)) = &*held {
            return Ok(Node::Dir(Arc::clone(dir), *origin));
        }
        let dir = self.open_container(&self.root)?;
        // Its time: when it was opened (the object's own is not asked for).
        let origin = Origin::remote(std::time::SystemTime::now());
        *held = Some((Arc::clone(&dir), origin));
        Ok(Node::Dir(dir, origin))
    }

    /// What the source entry `name` of `parent` appears as.
    fn source_node(&self, parent: &SourceDir, name: &str) -> Result<Node, TreeError> {
        let sources = self.sources()?;
        let (path, meta) = sources.entry(parent, name).map_err(|why| {
            let path = parent.path.join(name);
            if why == source::Refusal::Missing {
                self.forget(&path);
            }
            self.refused(&path, &why);
            TreeError::NotFound(name.to_string())
        })?;
        let origin = Origin::of(&meta);
        if meta.is_dir() {
            return Ok(Node::SourceDir(sources.child_dir(parent, path, &meta)));
        }
        if meta.is_file() {
            if let Some(format) = format_of(name) {
                return Ok(Node::Dir(
                    self.container(&path, format, stamp(&meta)),
                    origin,
                ));
            }
            return Ok(Node::File(
                Arc::new(content::Passthrough::new(&path, meta.len())),
                origin,
            ));
        }
        // Sockets, devices and FIFOs are not mirrored: reading one could
        // block a worker for good.
        Err(TreeError::NotFound(name.to_string()))
    }

    /// What the entry `name` of a mounted prefix's folder appears as.
    fn remote_node(&self, parent: &RemoteDir, name: &str) -> Result<Node, TreeError> {
        let listing = self.listings.of(parent)?;
        if listing.folder(name) {
            return Ok(Node::RemoteDir(parent.child(name)));
        }
        let Some(object) = listing.object(name) else {
            return Err(TreeError::NotFound(name.to_string()));
        };
        let origin = Origin::remote(object.modified);
        let url = parent.url(name);
        if let Some(format) = format_of(name) {
            let now = Stamp {
                size: object.size,
                mtime: Some(object.modified),
                etag: object.etag.clone(),
            };
            return Ok(Node::Dir(
                self.container(Path::new(&url), format, now),
                origin,
            ));
        }
        let address = crate::remote::Address::S3 {
            bucket: parent.bucket.clone(),
            key: parent.key(name),
        };
        Ok(Node::File(
            Arc::new(remote_dir::RemoteFile::new(address, object.size)),
            origin,
        ))
    }

    /// Resolves a path relative to the mirrored folder.
    pub fn resolve(&self, path: &str) -> Result<Node, TreeError> {
        let mut node = self.root_node()?;
        for part in Path::new(path).components() {
            let name = match part {
                Component::Normal(n) => n
                    .to_str()
                    .ok_or_else(|| TreeError::NotFound(path.to_string()))?,
                Component::CurDir | Component::RootDir => continue,
                _ => return Err(TreeError::NotFound(path.to_string())),
            };
            node = self.child(&node, name)?;
        }
        Ok(node)
    }

    /// The entry `name` inside the directory `parent`.
    pub fn child(&self, parent: &Node, name: &str) -> Result<Node, TreeError> {
        match parent {
            Node::SourceDir(dir) => self.source_node(dir, name),
            Node::RemoteDir(dir) => self.remote_node(dir, name),
            Node::Dir(d, origin) => match d.lookup(name) {
                Some(Entry::Dir(d)) => Ok(Node::Dir(d, *origin)),
                Some(Entry::File(f)) => Ok(Node::File(f, *origin)),
                None => Err(TreeError::NotFound(name.to_string())),
            },
            Node::File(..) => Err(TreeError::NotADirectory(name.to_string())),
        }
    }

    /// The entries of a directory with their attributes, sorted by name.
    /// Containers are listed as directories without opening them. Source
    /// names that are not UTF-8, and links not followed, are left out
    /// (with a log line), never shown under another name.
    pub fn list(&self, dir: &Node) -> Result<Vec<(String, Attr)>, TreeError> {
        match dir {
            Node::SourceDir(parent) => {
                let sources = self.sources()?;
                let entries = fs::read_dir(&parent.path).map_err(|e| TreeError::Io {
                    path: parent.path.clone(),
                    reason: e.to_string(),
                })?;
                let mut out = Vec::new();
                for entry in entries.flatten() {
                    let Ok(name) = entry.file_name().into_string() else {
                        self.refused(&entry.path(), &source::Refusal::NotUtf8);
                        continue;
                    };
                    let (_, meta) = match sources.entry(parent, &name) {
                        Ok(found) => found,
                        Err(why) => {
                            self.refused(&entry.path(), &why);
                            continue;
                        }
                    };
                    let origin = Origin::of(&meta);
                    let attr = if meta.is_dir() || (meta.is_file() && format_of(&name).is_some()) {
                        Attr::dir(&origin)
                    } else if meta.is_file() {
                        Attr::file(&origin, meta.len(), true)
                    } else {
                        continue;
                    };
                    out.push((name, attr));
                }
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
            Node::RemoteDir(parent) => {
                let listing = self.listings.of(parent)?;
                let mut out: Vec<(String, Attr)> = listing
                    .folders
                    .iter()
                    .map(|name| (name.clone(), Attr::dir(&parent.origin)))
                    .collect();
                // A key that is also a prefix (`a` and `a/x`) shows as
                // the folder, which a lookup finds first.
                for object in &listing.objects {
                    if listing.folder(&object.name) {
                        continue;
                    }
                    let origin = Origin::remote(object.modified);
                    let attr = if format_of(&object.name).is_some() {
                        Attr::dir(&origin)
                    } else {
                        Attr::file(&origin, object.size, false)
                    };
                    out.push((object.name.clone(), attr));
                }
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
            Node::Dir(..) => self.list_range(dir, 0..usize::MAX),
            Node::File(..) => Err(TreeError::NotADirectory(String::new())),
        }
    }

    /// Entries `range` of a container's directory (see
    /// [`Directory::list_range`]); a source folder is listed whole.
    pub fn list_range(
        &self,
        dir: &Node,
        range: std::ops::Range<usize>,
    ) -> Result<Vec<(String, Attr)>, TreeError> {
        match dir {
            Node::Dir(d, origin) => Ok(d
                .list_range(range)
                .into_iter()
                .map(|(name, e)| {
                    let attr = match e {
                        Entry::Dir(_) => Attr::dir(origin),
                        Entry::File(f) => Attr::file(origin, f.size(), false),
                    };
                    (name, attr)
                })
                .collect()),
            _ => Ok(self
                .list(dir)?
                .into_iter()
                .skip(range.start)
                .take(range.len())
                .collect()),
        }
    }

    /// The attributes of a node.
    pub fn attr(&self, node: &Node) -> Attr {
        match node {
            Node::SourceDir(dir) => Attr::dir(&dir.origin),
            Node::RemoteDir(dir) => Attr::dir(&dir.origin),
            Node::Dir(_, origin) => Attr::dir(origin),
            Node::File(f, origin) => Attr::file(origin, f.size(), f.is_passthrough()),
        }
    }
}
