//! The filesystem core (`tree::filesystem`: inode numbers, handles,
//! listings, lookup counts) driven through random sequences of kernel
//! requests and source changes, every answer compared with a reference
//! model, errno included. No mount: the real mount is tested separately
//! (fs/tests).
//!
//! The model is independent of the code for everything the core decides:
//! which paths exist at which version, which number the kernel must get
//! (the same one for as long as a number for that version is held or
//! listed, a never-seen one otherwise), when a number is stale, how many
//! numbers the table may hold, what a handle reads after its file was
//! replaced, truncated or deleted. What a container shows inside is the
//! views' business, tested elsewhere; here it comes from a private copy of
//! the container's bytes opened by a separate tree, so that the test
//! checks the core routes every request to the right opening.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use qemfs::tree::content::read_all;
use qemfs::tree::filesystem::{DirEntry, Filesystem, FsError, ROOT, SHOWN_ONLY};
use qemfs::tree::{Attr, Content, Node, Tree, TreeError, TreeOptions};

/// Source files the sequences create, replace, truncate and delete. `sub`
/// is a folder that always exists.
const SLOTS: [&str; 6] = ["a.txt", "b.txt", "c.qem", "d.qem", "sub/x.txt", "sub/e.qem"];

/// Container versions: two valid files, and one whose header is refused
/// (shown as a folder holding ERROR.txt).
const FIXTURES: [&str; 3] = [
    "u8-mixed-13x7.qem",
    "u8-zeros-8x8.qem",
    "bad-container-version.qem",
];

fn fixture(name: &str) -> Vec<u8> {
    fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/conformance/qem")
            .join(name),
    )
    .unwrap()
}

fn tree_errno(e: &TreeError) -> i32 {
    FsError::Tree(e.clone()).errno()
}

/// A container's bytes opened by a tree of their own, once per distinct
/// content for the whole run: the reference for what the core must show
/// inside that container.
struct Reference {
    file: PathBuf,
    tree: Tree,
}

fn reference(content: &[u8]) -> Arc<Reference> {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    static REFS: OnceLock<Mutex<HashMap<Vec<u8>, Arc<Reference>>>> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let mut refs = REFS.get_or_init(Default::default).lock().unwrap();
    let n = refs.len();
    Arc::clone(refs.entry(content.to_vec()).or_insert_with(|| {
        let file = dir.path().join(format!("{n}.qem"));
        fs::write(&file, content).unwrap();
        let tree = Tree::new(&file, &TreeOptions::default());
        Arc::new(Reference { file, tree })
    }))
}

impl Reference {
    /// What `inner` is inside the container: (is a folder, size) or errno.
    fn resolve(&self, inner: &str, real: &Path) -> Result<(bool, u64), i32> {
        let node = self.tree.resolve(inner).map_err(|e| tree_errno(&e))?;
        let attr = self.tree.attr(&node);
        if is_error_text(inner) {
            return Ok((false, self.error_text(inner, real).len() as u64));
        }
        Ok((attr.is_dir, if attr.is_dir { 0 } else { attr.size }))
    }

    /// What a handle on `inner` must read.
    fn open(&self, inner: &str, real: &Path) -> Expected {
        if is_error_text(inner) {
            return Expected::Bytes(self.error_text(inner, real));
        }
        match self.tree.resolve(inner) {
            Ok(Node::File(f, _)) => Expected::Content(f),
            _ => panic!("{inner}: not a file of the reference"),
        }
    }

    /// ERROR.txt is the one file that names its container's path: the
    /// copy's path is replaced by the real one.
    fn error_text(&self, inner: &str, real: &Path) -> Vec<u8> {
        let Ok(Node::File(f, _)) = self.tree.resolve(inner) else {
            panic!("{inner}: not a file of the reference");
        };
        String::from_utf8(read_all(f.as_ref()).unwrap())
            .unwrap()
            .replace(
                &self.file.display().to_string(),
                &real.display().to_string(),
            )
            .into_bytes()
    }

    fn names(&self, inner: &str) -> Vec<String> {
        let Ok(node) = self.tree.resolve(inner) else {
            return Vec::new();
        };
        let Ok(list) = self.tree.list(&node) else {
            return Vec::new();
        };
        list.into_iter().map(|(name, _)| name).collect()
    }
}

fn is_error_text(inner: &str) -> bool {
    inner == "ERROR.txt" || inner.ends_with("/ERROR.txt")
}

/// The reference of a handle on a file inside a container.
enum Expected {
    Bytes(Vec<u8>),
    Content(Arc<dyn Content>),
}

impl Expected {
    /// The bytes `[offset, offset + size)` as the reference reads them.
    fn range(&self, offset: usize, size: usize) -> Result<Vec<u8>, i32> {
        match self {
            Expected::Bytes(b) => {
                let end = (offset + size).min(b.len());
                Ok(b.get(offset..end.max(offset)).unwrap_or(&[]).to_vec())
            }
            Expected::Content(c) => {
                let end = (c.size() as usize).min(offset + size);
                let mut buf = vec![0u8; end.saturating_sub(offset)];
                let mut done = 0;
                while done < buf.len() {
                    match c.read_at((offset + done) as u64, &mut buf[done..]) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) => return Err(tree_errno(&e)),
                    }
                }
                buf.truncate(done);
                Ok(buf)
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Lookup {
        parent: usize,
        name: usize,
    },
    Getattr {
        ino: usize,
    },
    Open {
        ino: usize,
        write: bool,
    },
    Read {
        fh: usize,
        offset: u16,
        size: u16,
    },
    Release {
        fh: usize,
    },
    Opendir {
        ino: usize,
    },
    Readdir {
        dh: usize,
        offset: u8,
        room: u8,
        plus: bool,
    },
    Releasedir {
        dh: usize,
    },
    Forget {
        ino: usize,
        n: u8,
    },
    /// Creates the file, or replaces it by a rename (as editors and
    /// copying tools do).
    Write {
        slot: Slot,
        plain: Vec<u8>,
        fixture: usize,
    },
    /// Cuts the file in place to `keep`/256 of its length.
    Truncate {
        slot: Slot,
        keep: u8,
    },
    Delete {
        slot: Slot,
    },
}

/// Which source file a change hits: any slot, or the one behind an open
/// handle (the cases that matter most, and rare when picked blindly).
#[derive(Debug, Clone, Copy)]
enum Slot {
    Any(usize),
    UnderHandle(usize),
}

impl Slot {
    fn pick(self, m: &Model) -> &'static str {
        match self {
            Slot::UnderHandle(k) if !m.open_files.is_empty() => {
                m.open_files[k % m.open_files.len()].2
            }
            Slot::Any(k) | Slot::UnderHandle(k) => SLOTS[k % SLOTS.len()],
        }
    }
}

fn slot() -> impl Strategy<Value = Slot> {
    prop_oneof![
        (0usize..64).prop_map(Slot::Any),
        (0usize..64).prop_map(Slot::UnderHandle),
    ]
}

/// The source file a path inside the source belongs to.
fn slot_of(path: &str) -> &'static str {
    SLOTS
        .iter()
        .find(|s| path == **s || path.starts_with(&format!("{s}/")))
        .unwrap_or_else(|| panic!("{path}: in no slot"))
}

fn op() -> impl Strategy<Value = Op> {
    let i = || 0usize..64;
    prop_oneof![
        6 => (i(), i()).prop_map(|(parent, name)| Op::Lookup { parent, name }),
        2 => i().prop_map(|ino| Op::Getattr { ino }),
        3 => (i(), proptest::bool::weighted(0.1)).prop_map(|(ino, write)| Op::Open { ino, write }),
        4 => (i(), any::<u16>(), 1u16..8192).prop_map(|(fh, offset, size)| Op::Read { fh, offset, size }),
        1 => i().prop_map(|fh| Op::Release { fh }),
        2 => i().prop_map(|ino| Op::Opendir { ino }),
        3 => (i(), any::<u8>(), any::<u8>(), any::<bool>())
            .prop_map(|(dh, offset, room, plus)| Op::Readdir { dh, offset, room, plus }),
        1 => i().prop_map(|dh| Op::Releasedir { dh }),
        2 => (i(), 1u8..4).prop_map(|(ino, n)| Op::Forget { ino, n }),
        2 => (slot(), proptest::collection::vec(any::<u8>(), 0..300), 0usize..FIXTURES.len())
            .prop_map(|(slot, plain, fixture)| Op::Write { slot, plain, fixture }),
        1 => (slot(), any::<u8>()).prop_map(|(slot, keep)| Op::Truncate { slot, keep }),
        1 => slot().prop_map(|slot| Op::Delete { slot }),
    ]
}

/// A source file as the model knows it: which file (a rename makes a new
/// one; a truncation changes the same one) and its modification time.
#[derive(Clone, Copy)]
struct SourceFile {
    file: u64,
    mtime: SystemTime,
}

/// A number in the table: bound once the core has shown it.
#[derive(Default)]
struct Live {
    ino: Option<u64>,
    held: u64,
    listings: u64,
}

type Key = (String, SystemTime);

/// What an open handle must read.
enum OpenModel {
    /// A passthrough source file: the file it opened, as it is now, cut to
    /// the size it had.
    Plain { file: u64, size: u64 },
    /// A file inside a container: its bytes when opened; `degraded` once
    /// its container was truncated in place (then an error or a short
    /// read is allowed, wrong bytes never).
    Inner {
        expected: Expected,
        inner: String,
        container: u64,
        degraded: bool,
    },
}

struct DirModel {
    own: u64,
    path: String,
    /// (name, is_dir, size, mtime); `.` and `..` first.
    entries: Vec<(String, bool, u64, SystemTime)>,
    snapshot: bool,
}

/// What a path resolves to now.
#[derive(Debug, Clone, PartialEq)]
struct Expect {
    is_dir: bool,
    size: u64,
    mtime: SystemTime,
    /// A passthrough source file and which file it is.
    plain: Option<u64>,
    /// Inside a container: the container's file and the inner path.
    inner: Option<(u64, String)>,
    source_dir: bool,
}

struct Model {
    src: PathBuf,
    staging: PathBuf,
    files: HashMap<&'static str, SourceFile>,
    /// Bytes of every file ever made, deleted and replaced ones too (an
    /// open handle still reads them).
    contents: HashMap<u64, Vec<u8>>,
    dir_mtime: HashMap<&'static str, SystemTime>,
    clock: u64,
    next_file: u64,
    live: HashMap<Key, Live>,
    /// Every number shown, with its path.
    ever: HashMap<u64, String>,
    /// Open handles, with the source file (slot) each reads from.
    open_files: Vec<(u64, OpenModel, &'static str)>,
    open_dirs: Vec<(u64, DirModel)>,
}

fn errno_of<T>(r: &Result<T, FsError>) -> Result<(), i32> {
    match r {
        Ok(_) => Ok(()),
        Err(e) => Err(e.errno()),
    }
}

impl Model {
    fn new(root: &Path) -> Model {
        let src = root.join("src");
        let staging = root.join("staging");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::create_dir_all(&staging).unwrap();
        let mut m = Model {
            src,
            staging,
            files: HashMap::new(),
            contents: HashMap::new(),
            dir_mtime: HashMap::new(),
            clock: 0,
            next_file: 0,
            live: HashMap::new(),
            ever: HashMap::from([(ROOT, String::new())]),
            open_files: Vec::new(),
            open_dirs: Vec::new(),
        };
        m.touch_dir("");
        m.touch_dir("sub");
        m
    }

    /// A modification time never used before. Set explicitly: the
    /// kernel's timestamps are as coarse as its clock tick, and versions
    /// are told apart by modification time.
    fn tick(&mut self) -> SystemTime {
        self.clock += 1;
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + self.clock)
    }

    fn set_mtime(path: &Path, t: SystemTime) {
        fs::File::open(path).unwrap().set_modified(t).unwrap();
    }

    fn touch_dir(&mut self, dir: &'static str) {
        let t = self.tick();
        Model::set_mtime(&self.src.join(dir), t);
        self.dir_mtime.insert(dir, t);
    }

    fn parent_of(slot: &str) -> &'static str {
        if slot.starts_with("sub/") {
            "sub"
        } else {
            ""
        }
    }

    // Source changes.

    fn write(&mut self, slot: &'static str, bytes: Vec<u8>) {
        self.next_file += 1;
        let file = self.next_file;
        let staged = self.staging.join(file.to_string());
        fs::write(&staged, &bytes).unwrap();
        let mtime = self.tick();
        Model::set_mtime(&staged, mtime);
        fs::rename(&staged, self.src.join(slot)).unwrap();
        self.contents.insert(file, bytes);
        self.files.insert(slot, SourceFile { file, mtime });
        self.touch_dir(Model::parent_of(slot));
    }

    fn truncate(&mut self, slot: &'static str, keep: u8) {
        let Some(f) = self.files.get(slot).copied() else {
            return;
        };
        let bytes = self.contents.get_mut(&f.file).unwrap();
        let len = bytes.len() * usize::from(keep) / 256;
        bytes.truncate(len);
        let path = self.src.join(slot);
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len as u64)
            .unwrap();
        let mtime = self.tick();
        Model::set_mtime(&path, mtime);
        self.files.get_mut(slot).unwrap().mtime = mtime;
        for (_, open, _) in &mut self.open_files {
            if let OpenModel::Inner {
                container,
                degraded,
                ..
            } = open
            {
                if *container == f.file {
                    *degraded = true;
                }
            }
        }
    }

    fn delete(&mut self, slot: &'static str) {
        if self.files.remove(slot).is_some() {
            fs::remove_file(self.src.join(slot)).unwrap();
            self.touch_dir(Model::parent_of(slot));
        }
    }

    // What the source looks like now.

    fn source_dir(&self, dir: &'static str) -> Expect {
        Expect {
            is_dir: true,
            size: 0,
            mtime: self.dir_mtime[dir],
            plain: None,
            inner: None,
            source_dir: true,
        }
    }

    fn expect(&self, path: &str) -> Result<Expect, i32> {
        if path.is_empty() {
            return Ok(self.source_dir(""));
        }
        let (mut dir, mut rest) = ("", path);
        loop {
            let (name, more) = match rest.split_once('/') {
                Some((n, m)) => (n, Some(m)),
                None => (rest, None),
            };
            if dir.is_empty() && name == "sub" {
                match more {
                    None => return Ok(self.source_dir("sub")),
                    Some(m) => {
                        (dir, rest) = ("sub", m);
                        continue;
                    }
                }
            }
            let here = if dir.is_empty() {
                name.to_string()
            } else {
                format!("{dir}/{name}")
            };
            let Some(f) = self.files.get(here.as_str()) else {
                return Err(libc::ENOENT);
            };
            let bytes = &self.contents[&f.file];
            if !here.ends_with(".qem") {
                return match more {
                    None => Ok(Expect {
                        is_dir: false,
                        size: bytes.len() as u64,
                        mtime: f.mtime,
                        plain: Some(f.file),
                        inner: None,
                        source_dir: false,
                    }),
                    Some(_) => Err(libc::ENOTDIR),
                };
            }
            let inner = more.unwrap_or("");
            let (is_dir, size) = reference(bytes).resolve(inner, &self.src.join(&here))?;
            return Ok(Expect {
                is_dir,
                size,
                mtime: f.mtime,
                plain: None,
                inner: Some((f.file, inner.to_string())),
                source_dir: false,
            });
        }
    }

    /// What `getattr`, `open` and `opendir` find behind a number held for
    /// `key`.
    fn expect_held(&self, ino: u64, key: &Key) -> Result<Expect, i32> {
        let e = self.expect(&key.0)?;
        if ino != ROOT && e.mtime != key.1 {
            return Err(libc::ESTALE);
        }
        Ok(e)
    }

    /// The entries of a folder now, sorted as the tree lists them.
    fn listing(&self, path: &str, e: &Expect) -> Vec<(String, bool, u64, SystemTime)> {
        if e.source_dir {
            let dir = if path.is_empty() { "" } else { "sub" };
            let mut out = Vec::new();
            if dir.is_empty() {
                out.push(("sub".to_string(), true, 0, self.dir_mtime["sub"]));
            }
            for slot in SLOTS {
                let Some(f) = self.files.get(slot) else {
                    continue;
                };
                if Model::parent_of(slot) != dir {
                    continue;
                }
                let name = slot.rsplit('/').next().unwrap().to_string();
                let (is_dir, size) = if slot.ends_with(".qem") {
                    (true, 0)
                } else {
                    (false, self.contents[&f.file].len() as u64)
                };
                out.push((name, is_dir, size, f.mtime));
            }
            out.sort();
            return out;
        }
        let (file, inner) = e.inner.as_ref().unwrap();
        let container = path[..path.len() - inner.len()].trim_end_matches('/');
        let r = reference(&self.contents[file]);
        r.names(inner)
            .into_iter()
            .map(|name| {
                let (is_dir, size) = r
                    .resolve(&join(inner, &name), &self.src.join(container))
                    .unwrap();
                (name, is_dir, size, e.mtime)
            })
            .collect()
    }

    // The kernel's side.

    /// Numbers the kernel holds, the root first.
    fn held(&self) -> Vec<(u64, Key)> {
        let mut out: Vec<(u64, Key)> = self
            .live
            .iter()
            .filter(|(_, l)| l.held > 0)
            .map(|(k, l)| (l.ino.unwrap(), k.clone()))
            .collect();
        out.sort();
        out.insert(0, (ROOT, (String::new(), SystemTime::UNIX_EPOCH)));
        out
    }

    /// The core showed `ino` for `key`: the number of that version while
    /// one is in the table, a never-seen one otherwise.
    fn shown(&mut self, key: &Key, ino: u64) {
        if key.0.is_empty() {
            assert_eq!(ino, ROOT);
            return;
        }
        match self.live.get_mut(key) {
            Some(Live { ino: Some(n), .. }) => {
                assert_eq!(ino, *n, "{key:?}: the number in the table");
            }
            found => {
                assert!(
                    !self.ever.contains_key(&ino),
                    "{key:?}: number {ino} was already used for another version or path"
                );
                match found {
                    Some(live) => live.ino = Some(ino),
                    None => {
                        self.live.insert(
                            key.clone(),
                            Live {
                                ino: Some(ino),
                                ..Live::default()
                            },
                        );
                    }
                }
                self.ever.insert(ino, key.0.clone());
            }
        }
    }

    fn release_number(&mut self, key: &Key) {
        if self
            .live
            .get(key)
            .is_some_and(|l| l.held == 0 && l.listings == 0)
        {
            self.live.remove(key);
        }
    }

    fn check_attr(what: &str, got: &Attr, want: &Expect) {
        assert_eq!(
            (got.is_dir, got.size, got.mtime),
            (want.is_dir, want.size, want.mtime),
            "{what}: attributes"
        );
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

/// Names worth looking up in `path`: what is there, what may come, one
/// that never exists and one that is not UTF-8.
fn candidates(m: &Model, path: &str) -> Vec<Vec<u8>> {
    let mut names: Vec<String> = match m.expect(path) {
        Ok(e) if e.source_dir => {
            let dir = if path.is_empty() { "" } else { "sub" };
            let mut n: Vec<String> = SLOTS
                .iter()
                .filter(|s| Model::parent_of(s) == dir)
                .map(|s| s.rsplit('/').next().unwrap().to_string())
                .collect();
            if dir.is_empty() {
                n.push("sub".into());
            }
            n
        }
        Ok(e) if e.is_dir => m.listing(path, &e).into_iter().map(|e| e.0).collect(),
        _ => vec!["data.npy".into(), "frames".into()],
    };
    names.push("never.npy".into());
    let mut out: Vec<Vec<u8>> = names.into_iter().map(String::into_bytes).collect();
    out.push(b"bad\xffname".to_vec());
    out
}

fn run(ops: Vec<Op>) {
    qemfs::mapguard::install();
    let tmp = tempfile::tempdir().unwrap();
    let mut m = Model::new(tmp.path());
    m.write("a.txt", b"hello\n".to_vec());
    m.write("c.qem", fixture(FIXTURES[0]));
    m.write("sub/e.qem", fixture(FIXTURES[1]));
    // Two opened containers at most, so that closing idle ones is
    // exercised under open handles and listings.
    let mut options = TreeOptions::default();
    options.cache_bytes = 1 << 20;
    options.open_containers = 2;
    let core = Filesystem::new(Arc::new(Tree::new(&m.src, &options)), Vec::new());

    for (step, op) in ops.into_iter().enumerate() {
        let at = format!("step {step}: {op:?}");
        match op {
            Op::Lookup { parent, name } => {
                let held = m.held();
                let (pino, pkey) = held[parent % held.len()].clone();
                let names = candidates(&m, &pkey.0);
                let name = &names[name % names.len()];
                let got = core.lookup(pino, OsStr::from_bytes(name));
                let want = match (m.expect_held(pino, &pkey), std::str::from_utf8(name)) {
                    (Err(_), _) | (_, Err(_)) => Err(libc::ENOENT),
                    (Ok(p), _) if !p.is_dir => Err(libc::ENOTDIR),
                    (Ok(_), Ok(name)) => m.expect(&join(&pkey.0, name)),
                };
                match (&got, want) {
                    (Ok((ino, attr)), Ok(want)) => {
                        Model::check_attr(&at, attr, &want);
                        let key = (
                            join(&pkey.0, std::str::from_utf8(name).unwrap()),
                            attr.mtime,
                        );
                        m.shown(&key, *ino);
                        m.live.get_mut(&key).unwrap().held += 1;
                    }
                    (_, want) => assert_eq!(errno_of(&got), want.map(|_| ()), "{at}"),
                }
            }
            Op::Getattr { ino } => {
                let held = m.held();
                let (ino, key) = held[ino % held.len()].clone();
                let got = core.getattr(ino);
                match (&got, m.expect_held(ino, &key)) {
                    (Ok(attr), Ok(want)) => Model::check_attr(&at, attr, &want),
                    (_, want) => assert_eq!(errno_of(&got), want.map(|_| ()), "{at}"),
                }
            }
            Op::Open { ino, write } => {
                let held = m.held();
                let (ino, key) = held[ino % held.len()].clone();
                let got = core.open(ino, !write);
                let want = if write {
                    Err(libc::EROFS)
                } else {
                    match m.expect_held(ino, &key) {
                        Ok(e) if e.is_dir => Err(libc::EISDIR),
                        other => other,
                    }
                };
                match (&got, want) {
                    (Ok(fh), Ok(want)) => {
                        let open = match (want.plain, want.inner) {
                            (Some(file), _) => OpenModel::Plain {
                                file,
                                size: want.size,
                            },
                            (None, Some((container, inner))) => {
                                let file = &m.contents[&container];
                                let path = &key.0[..key.0.len() - inner.len()];
                                OpenModel::Inner {
                                    expected: reference(file)
                                        .open(&inner, &m.src.join(path.trim_end_matches('/'))),
                                    inner,
                                    container,
                                    degraded: false,
                                }
                            }
                            _ => unreachable!("a file is plain or in a container"),
                        };
                        m.open_files.push((*fh, open, slot_of(&key.0)));
                    }
                    (_, want) => assert_eq!(errno_of(&got), want.map(|_| ()), "{at}"),
                }
            }
            Op::Read { fh, offset, size } => {
                if m.open_files.is_empty() {
                    assert_eq!(core.file(12345).err(), Some(FsError::BadHandle));
                    continue;
                }
                let (fh, open, _) = &m.open_files[fh % m.open_files.len()];
                let got = core
                    .file(*fh)
                    .unwrap()
                    .read(u64::from(offset), u32::from(size));
                let (offset, size) = (usize::from(offset), usize::from(size));
                match open {
                    OpenModel::Plain { file, size: was } => {
                        let now = &m.contents[file];
                        let end = (offset + size).min(*was as usize).min(now.len());
                        let want = now.get(offset..end.max(offset)).unwrap_or(&[]);
                        assert_eq!(got.as_deref(), Ok(want), "{at}");
                    }
                    OpenModel::Inner {
                        expected,
                        degraded,
                        inner,
                        ..
                    } => {
                        let want = expected.range(offset, size);
                        let got = got.map_err(|e| e.errno());
                        match (&got, &want) {
                            (Ok(b), Ok(want)) if *degraded => {
                                assert!(want.starts_with(b), "{at}: {inner}: wrong bytes")
                            }
                            (Err(e), _) if *degraded => assert_eq!(*e, libc::EIO, "{at}"),
                            _ => assert_eq!(got, want, "{at}"),
                        }
                    }
                }
            }
            Op::Release { fh } => {
                if !m.open_files.is_empty() {
                    let (fh, _, _) = m.open_files.remove(fh % m.open_files.len());
                    core.release(fh);
                    assert_eq!(core.file(fh).err(), Some(FsError::BadHandle), "{at}");
                }
            }
            Op::Opendir { ino } => {
                let held = m.held();
                let (ino, key) = held[ino % held.len()].clone();
                let got = core.opendir(ino);
                let want = match m.expect_held(ino, &key) {
                    Ok(e) if !e.is_dir => Err(libc::ENOTDIR),
                    other => other,
                };
                match (&got, want) {
                    (Ok(dh), Ok(want)) => {
                        let mut entries = vec![
                            (".".to_string(), true, 0, want.mtime),
                            ("..".to_string(), true, 0, want.mtime),
                        ];
                        entries.extend(m.listing(&key.0, &want));
                        if want.source_dir {
                            // A snapshot numbers its entries now.
                            for (name, _, _, mtime) in &entries[2..] {
                                let k = (join(&key.0, name), *mtime);
                                m.live.entry(k).or_default().listings += 1;
                            }
                        }
                        m.open_dirs.push((
                            *dh,
                            DirModel {
                                own: ino,
                                path: key.0.clone(),
                                entries,
                                snapshot: want.source_dir,
                            },
                        ));
                    }
                    (_, want) => assert_eq!(errno_of(&got), want.map(|_| ()), "{at}"),
                }
            }
            Op::Readdir {
                dh,
                offset,
                room,
                plus,
            } => {
                if m.open_dirs.is_empty() {
                    let got = core.readdir(12345, 0, plus, |_| false);
                    assert_eq!(got, Err(FsError::BadHandle));
                    continue;
                }
                let k = dh % m.open_dirs.len();
                let dh = m.open_dirs[k].0;
                let len = m.open_dirs[k].1.entries.len();
                let offset = usize::from(offset) % (len + 2);
                let room = usize::from(room) % (len + 1);
                let mut got: Vec<DirEntry> = Vec::new();
                core.readdir(dh, offset as u64, plus, |e| {
                    if got.len() == room {
                        return true;
                    }
                    got.push(e.clone());
                    false
                })
                .unwrap_or_else(|e| panic!("{at}: {e}"));
                let dir = &m.open_dirs[k].1;
                let want: Vec<_> = dir
                    .entries
                    .iter()
                    .cloned()
                    .enumerate()
                    .skip(offset)
                    .take(room)
                    .collect();
                assert_eq!(got.len(), want.len(), "{at}: entries");
                let (own, path, snapshot) = (dir.own, dir.path.clone(), dir.snapshot);
                for (e, (i, (name, is_dir, size, mtime))) in got.iter().zip(&want) {
                    let i = *i;
                    assert_eq!(e.next_offset, i as u64 + 1, "{at}");
                    assert_eq!(&e.name, name, "{at}");
                    assert_eq!(e.attr.is_dir, *is_dir, "{at}: {name}");
                    assert_eq!(e.attr.mtime, *mtime, "{at}: {name}");
                    if i == 0 {
                        assert_eq!(e.ino, own, "{at}: `.` is the folder itself");
                        continue;
                    }
                    let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
                    if i == 1 {
                        // The parent's number when the folder was opened
                        // (only shown: the kernel takes no reference), which
                        // may be one made by a snapshot and not shown yet;
                        // never another path's.
                        let parent_number = m.ever.get(&e.ino).is_none_or(|p| p == parent);
                        assert!(e.ino == ROOT || parent_number, "{at}: `..`");
                        continue;
                    }
                    assert_eq!(e.attr.size, *size, "{at}: {name}");
                    let key = (join(&path, name), *mtime);
                    if snapshot || plus {
                        m.shown(&key, e.ino);
                    } else {
                        // Display-only, or the number the path has now.
                        let known = m
                            .live
                            .iter()
                            .any(|(k, l)| k.0 == key.0 && l.ino == Some(e.ino));
                        assert!(e.ino & SHOWN_ONLY != 0 || known, "{at}: {name}");
                    }
                    if plus {
                        m.live.get_mut(&key).unwrap().held += 1;
                    }
                }
            }
            Op::Releasedir { dh } => {
                if !m.open_dirs.is_empty() {
                    let (dh, dir) = m.open_dirs.remove(dh % m.open_dirs.len());
                    core.releasedir(dh);
                    if dir.snapshot {
                        for (name, _, _, mtime) in &dir.entries[2..] {
                            let k = (join(&dir.path, name), *mtime);
                            m.live.get_mut(&k).unwrap().listings -= 1;
                            m.release_number(&k);
                        }
                    }
                }
            }
            Op::Forget { ino, n } => {
                let held = m.held();
                if held.len() > 1 {
                    let (ino, key) = held[1 + ino % (held.len() - 1)].clone();
                    let live = m.live.get_mut(&key).unwrap();
                    let n = u64::from(n).min(live.held);
                    live.held -= n;
                    core.forget(ino, n);
                    m.release_number(&key);
                }
            }
            Op::Write {
                slot,
                plain,
                fixture: f,
            } => {
                let slot = slot.pick(&m);
                let bytes = if slot.ends_with(".qem") {
                    fixture(FIXTURES[f])
                } else {
                    plain
                };
                m.write(slot, bytes);
            }
            Op::Truncate { slot, keep } => m.truncate(slot.pick(&m), keep),
            Op::Delete { slot } => m.delete(slot.pick(&m)),
        }
        // The table holds exactly the numbers the kernel holds or open
        // snapshots list, and the root.
        assert_eq!(core.inode_count(), 1 + m.live.len(), "{at}: table size");
        assert_eq!(
            core.handle_count(),
            m.open_files.len() + m.open_dirs.len(),
            "{at}: handles"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_answer_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops);
    }
}

/// Two snapshots of one folder: releasing the first must not drop the
/// numbers the second still hands out (found by the model test).
#[test]
fn a_second_listing_of_a_folder_keeps_its_numbers() {
    use Op::*;
    run(vec![
        Opendir { ino: 0 },
        Opendir { ino: 0 },
        Releasedir { dh: 0 },
        Readdir {
            dh: 0,
            offset: 0,
            room: 255,
            plus: true,
        },
        Getattr { ino: 1 },
        Getattr { ino: 2 },
    ]);
}

/// A handle reads the file it opened, even when another is renamed over
/// it before its first read.
#[test]
fn a_handle_reads_the_file_it_opened() {
    use Op::*;
    run(vec![
        Lookup { parent: 0, name: 0 },
        Open {
            ino: 1,
            write: false,
        },
        Write {
            slot: Slot::UnderHandle(0),
            plain: b"replaced".to_vec(),
            fixture: 0,
        },
        Read {
            fh: 0,
            offset: 0,
            size: 100,
        },
    ]);
}

/// `sha256` of a container is the digest of the file that was opened,
/// even when another is renamed over it before the first read (found by
/// the model test: it hashed whatever the path named then).
#[test]
fn a_digest_is_of_the_file_opened() {
    use Op::*;
    assert_eq!(
        reference(&fixture(FIXTURES[0])).names("")[9],
        "sha256",
        "the lookup below names sha256"
    );
    run(vec![
        Lookup { parent: 0, name: 2 }, // c.qem
        Lookup { parent: 1, name: 9 }, // c.qem/sha256
        Open {
            ino: 2,
            write: false,
        },
        Write {
            slot: Slot::UnderHandle(0),
            plain: Vec::new(),
            fixture: 1,
        },
        Read {
            fh: 0,
            offset: 0,
            size: 100,
        },
    ]);
}
