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
//! A file whose header cannot be read appears as a directory holding only
//! `ERROR.txt` with the reason; its neighbours are unaffected.

pub mod content;
mod qem_view;
mod semq_view;
mod virtual_dir;
pub mod zarr_view;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

pub use content::Content;

use crate::qem::QemFile;
use crate::reduce::geometry::DetectorOptions;
use crate::reduce::{Accelerator, Cpu};
use crate::semq::Encoding;

/// Why a path could not be served. Clone, so that every waiter of a
/// failed single-flight decode gets the error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
}

/// Cache key of a decoded block: which opening of which file, which block,
/// and whether it holds scaled codes rather than decoded values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub view: u64,
    pub block: usize,
    pub codes: bool,
}

/// The decoded-block cache shared by every container of a tree.
pub type BlockCache = crate::cache::BlockCache<BlockKey, Vec<u8>, TreeError>;

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
pub fn info_json(file: &QemFile, accelerator: &dyn Accelerator) -> serde_json::Value {
    let mut info = file.info_json();
    if let Some(map) = info.as_object_mut() {
        map.insert(
            "reductions_backend".into(),
            accelerator.name().to_string().into(),
        );
    }
    info
}

/// What a path resolves to.
#[derive(Clone)]
pub enum Node {
    /// A folder of the source tree.
    SourceDir(PathBuf),
    /// A virtual directory (a container or a folder inside one), with the
    /// modification time of its source file.
    Dir(Arc<dyn Directory>, SystemTime),
    File(Arc<dyn Content>, SystemTime),
}

/// The attributes a listing or `stat` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub is_dir: bool,
    pub size: u64,
    pub mtime: SystemTime,
}

/// Options of a tree.
#[derive(Clone)]
pub struct TreeOptions {
    /// Byte budget of the decoded-block cache.
    pub cache_bytes: usize,
    /// The backend of `virtual/` products.
    pub accelerator: Arc<dyn Accelerator>,
    /// Detector geometry given by the user; the rest is found per file.
    pub detectors: DetectorOptions,
}

impl std::fmt::Debug for TreeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeOptions")
            .field("cache_bytes", &self.cache_bytes)
            .field("accelerator", &self.accelerator.name())
            .field("detectors", &self.detectors)
            .finish()
    }
}

impl Default for TreeOptions {
    fn default() -> Self {
        TreeOptions {
            cache_bytes: 1 << 30,
            accelerator: Arc::new(Cpu),
            detectors: DetectorOptions::default(),
        }
    }
}

/// The source file's identity when it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime: Option<SystemTime>,
}

fn stamp(meta: &fs::Metadata) -> Stamp {
    Stamp {
        size: meta.len(),
        mtime: meta.modified().ok(),
    }
}

struct Opened {
    stamp: Stamp,
    id: u64,
    dir: Arc<dyn Directory>,
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

/// A mirrored source folder.
pub struct Tree {
    root: PathBuf,
    cache: Arc<BlockCache>,
    accelerator: Arc<dyn Accelerator>,
    detectors: DetectorOptions,
    opened: Mutex<HashMap<PathBuf, Opened>>,
    next_id: AtomicU64,
}

impl Tree {
    pub fn new(root: impl AsRef<Path>, options: &TreeOptions) -> Self {
        Tree {
            root: root.as_ref().to_path_buf(),
            cache: Arc::new(BlockCache::new(options.cache_bytes)),
            accelerator: Arc::clone(&options.accelerator),
            detectors: options.detectors.clone(),
            opened: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
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

    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// Opens one container file as a directory (for `qem ls`/`qem cat`);
    /// unlike a mounted folder, a file that cannot be read is an error.
    pub fn open_container(&self, source: &Path) -> Result<Arc<dyn Directory>, TreeError> {
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
        let name = source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
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
    fn container(&self, source: &Path, format: Format, meta: &fs::Metadata) -> Arc<dyn Directory> {
        let now = stamp(meta);
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = opened.get(source) {
            if o.stamp == now {
                return Arc::clone(&o.dir);
            }
            let stale = o.id;
            self.cache.remove_where(|k| k.view == stale);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let dir = self.open_dir(source, format, id);
        opened.insert(
            source.to_path_buf(),
            Opened {
                stamp: now,
                id,
                dir: Arc::clone(&dir),
            },
        );
        dir
    }

    fn open_dir(&self, source: &Path, format: Format, id: u64) -> Arc<dyn Directory> {
        match self.try_open_dir(source, format, id) {
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
        if let Some(o) = opened.remove(source) {
            self.cache.remove_where(|k| k.view == o.id);
        }
    }

    /// What a source directory entry appears as.
    fn source_node(&self, path: &Path, name: &str) -> Result<Node, TreeError> {
        let meta = fs::metadata(path).map_err(|_| {
            self.forget(path);
            TreeError::NotFound(name.to_string())
        })?;
        if meta.is_dir() {
            return Ok(Node::SourceDir(path.to_path_buf()));
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if meta.is_file() {
            if let Some(format) = format_of(name) {
                return Ok(Node::Dir(self.container(path, format, &meta), mtime));
            }
            return Ok(Node::File(
                Arc::new(content::Passthrough::new(path, meta.len())),
                mtime,
            ));
        }
        // Sockets, devices and the like are not mirrored.
        Err(TreeError::NotFound(name.to_string()))
    }

    /// Resolves a path relative to the mirrored folder.
    pub fn resolve(&self, path: &str) -> Result<Node, TreeError> {
        let mut node = Node::SourceDir(self.root.clone());
        for part in Path::new(path).components() {
            let name = match part {
                Component::Normal(n) => n.to_string_lossy().into_owned(),
                Component::CurDir | Component::RootDir => continue,
                _ => return Err(TreeError::NotFound(path.to_string())),
            };
            node = self.child(&node, &name)?;
        }
        Ok(node)
    }

    /// The entry `name` inside the directory `parent`.
    pub fn child(&self, parent: &Node, name: &str) -> Result<Node, TreeError> {
        match parent {
            Node::SourceDir(dir) => self.source_node(&dir.join(name), name),
            Node::Dir(d, mtime) => match d.lookup(name) {
                Some(Entry::Dir(d)) => Ok(Node::Dir(d, *mtime)),
                Some(Entry::File(f)) => Ok(Node::File(f, *mtime)),
                None => Err(TreeError::NotFound(name.to_string())),
            },
            Node::File(..) => Err(TreeError::NotADirectory(name.to_string())),
        }
    }

    /// The entries of a directory with their attributes, sorted by name.
    /// Containers are listed as directories without opening them.
    pub fn list(&self, dir: &Node) -> Result<Vec<(String, Attr)>, TreeError> {
        match dir {
            Node::SourceDir(path) => {
                let entries = fs::read_dir(path).map_err(|e| TreeError::Io {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                let mut out = Vec::new();
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let Ok(meta) = fs::metadata(entry.path()) else {
                        continue;
                    };
                    let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    let attr = if meta.is_dir() || (meta.is_file() && format_of(&name).is_some()) {
                        Attr {
                            is_dir: true,
                            size: 0,
                            mtime,
                        }
                    } else if meta.is_file() {
                        Attr {
                            is_dir: false,
                            size: meta.len(),
                            mtime,
                        }
                    } else {
                        continue;
                    };
                    out.push((name, attr));
                }
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
            Node::Dir(d, mtime) => {
                let mtime = *mtime;
                Ok(d.list()
                    .into_iter()
                    .map(|(name, e)| {
                        let attr = match e {
                            Entry::Dir(_) => Attr {
                                is_dir: true,
                                size: 0,
                                mtime,
                            },
                            Entry::File(f) => Attr {
                                is_dir: false,
                                size: f.size(),
                                mtime,
                            },
                        };
                        (name, attr)
                    })
                    .collect())
            }
            Node::File(..) => Err(TreeError::NotADirectory(String::new())),
        }
    }

    /// The attributes of a node.
    pub fn attr(&self, node: &Node) -> Attr {
        match node {
            Node::SourceDir(p) => Attr {
                is_dir: true,
                size: 0,
                mtime: fs::metadata(p)
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH),
            },
            Node::Dir(_, mtime) => Attr {
                is_dir: true,
                size: 0,
                mtime: *mtime,
            },
            Node::File(f, mtime) => Attr {
                is_dir: false,
                size: f.size(),
                mtime: *mtime,
            },
        }
    }
}
