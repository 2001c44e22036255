//! File contents of the virtual tree: every file knows its exact size up
//! front and serves any byte range on demand.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::sync::{lock, Mutex};

use super::budget::{Budget, CacheKey};
use super::TreeError;

/// A virtual file: its size is fixed when the node is created (from
/// headers, never by decoding), and `read_at` fills `buf` from `offset`.
pub trait Content: Send + Sync {
    fn size(&self) -> u64;

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were
    /// read, 0 at or past the end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError>;

    /// A source file served as it is (keeps its execute bits).
    fn is_passthrough(&self) -> bool {
        false
    }

    /// Called when a handle is opened on this content: a source file
    /// passed through is opened now, so that the handle reads the file it
    /// opened even if another is renamed over it before the first read.
    fn pin(&self) -> Result<(), TreeError> {
        Ok(())
    }

    /// The bytes `[offset, offset + len)` (clamped to the size) when they
    /// lie whole in one value this content already holds or loads (a
    /// decoded window, a computed file), lent out so that a reply is sent
    /// from there: a 1 MiB read of `data.npy` then costs no buffer and no
    /// copy in the daemon. `None`: they do not (a read across two windows,
    /// a header), and [`read_at`](Self::read_at) serves them. Both give
    /// the same bytes.
    fn held_at(&self, _offset: u64, _len: usize) -> Result<Option<Held>, TreeError> {
        Ok(None)
    }

    /// Read once, whole, by bulk readers (a Zarr chunk): a mount serves it
    /// around the kernel's page cache (direct I/O), whose copy of the
    /// bytes would be a second one, paid for by the reader and kept long
    /// after. Re-reads are answered from the budget's cached windows.
    fn direct_io(&self) -> bool {
        false
    }
}

/// A range of bytes held in the budget (or by whoever made them), lent to
/// a reader: the range stays valid for as long as the `Held` lives, even
/// if the budget lets the value go meanwhile.
#[derive(Clone)]
pub struct Held {
    bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: std::ops::Range<usize>,
}

impl Held {
    /// `bytes[start..start + len]`, clamped to the value's end.
    pub fn new(
        bytes: Arc<impl AsRef<[u8]> + Send + Sync + 'static>,
        start: usize,
        len: usize,
    ) -> Self {
        let all = (*bytes).as_ref().len();
        let start = start.min(all);
        let end = start + len.min(all - start);
        Held {
            bytes,
            range: start..end,
        }
    }
}

impl std::ops::Deref for Held {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.range.clone()]
    }
}

/// Copies the part of `bytes` at `offset` into `buf`.
pub(crate) fn copy_range(bytes: &[u8], offset: u64, buf: &mut [u8]) -> usize {
    let Ok(start) = usize::try_from(offset) else {
        return 0;
    };
    if start >= bytes.len() {
        return 0;
    }
    let n = buf.len().min(bytes.len() - start);
    buf[..n].copy_from_slice(&bytes[start..start + n]);
    n
}

/// Bytes known when the node is made (headers, digests, small JSON).
pub struct Bytes(pub Arc<[u8]>);

impl Bytes {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Bytes(Arc::from(bytes.into()))
    }
}

impl Content for Bytes {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        Ok(copy_range(&self.0, offset, buf))
    }
}

type Producer = Box<dyn Fn() -> Result<Vec<u8>, TreeError> + Send + Sync>;

/// Bytes whose size is known in advance but whose content is computed on
/// the first read (a digest of the decoded array, a preview image) and then
/// held in the tree's budget, like decoded blocks: evicted with them when
/// the budget is full, and computed again if read after that. A failed
/// computation is not kept, so a later read retries; a producer that reads
/// a memory-mapped source must fail when that mapping faulted while it ran.
///
/// A value larger than the whole budget (a virtual image of a huge scan
/// under a small `--cache-size`) is computed once and spilled to an
/// unlinked temporary file (in `$TMPDIR`) that this content keeps for as
/// long as its container is open, and reads are served from there: held
/// in the budget it would evict everything and then itself, and be
/// computed again for every read. Files whose computation itself needs
/// more than a budget are not `Lazy`: they are served in windows computed
/// per read ([`Windowed`]).
pub struct Lazy {
    size: u64,
    produce: Producer,
    budget: Arc<Budget>,
    key: CacheKey,
    /// Held while computing, so that concurrent first readers wait for one
    /// computation instead of each running their own.
    computing: Mutex<()>,
    /// The value, once computed, if the budget cannot hold it.
    spilled: OnceLock<File>,
}

/// Where a computed value is.
enum Computed<'a> {
    Held(Arc<Vec<u8>>),
    Spilled(&'a File),
}

impl Lazy {
    /// A file of container opening `view` (its value goes when the
    /// container is closed).
    pub fn new(
        budget: &Arc<Budget>,
        view: u64,
        size: u64,
        produce: impl Fn() -> Result<Vec<u8>, TreeError> + Send + Sync + 'static,
    ) -> Self {
        Lazy {
            size,
            produce: Box::new(produce),
            budget: Arc::clone(budget),
            key: budget.derived(view),
            computing: Mutex::new(()),
            spilled: OnceLock::new(),
        }
    }

    fn held(&self) -> Option<Computed<'_>> {
        if let Some(file) = self.spilled.get() {
            return Some(Computed::Spilled(file));
        }
        self.budget.get(self.key).map(Computed::Held)
    }

    fn value(&self) -> Result<Computed<'_>, TreeError> {
        if let Some(v) = self.held() {
            return Ok(v);
        }
        let _one = lock(&self.computing);
        if let Some(v) = self.held() {
            return Ok(v);
        }
        // A producer that reads a mapping checks that mapping's own fault
        // count (QemView::block, the virtual products, the .semq views).
        let bytes = (self.produce)()?;
        if bytes.len() as u64 != self.size {
            // The announced size is a promise to every reader already
            // holding it; breaking it silently would corrupt their copy.
            return Err(TreeError::Internal(format!(
                "computed {} bytes for a file announced as {} bytes",
                bytes.len(),
                self.size
            )));
        }
        if self.budget.can_hold(bytes.len()) {
            let bytes = Arc::new(bytes);
            self.budget.keep(self.key, Arc::clone(&bytes));
            return Ok(Computed::Held(bytes));
        }
        match spill(&bytes) {
            Ok(file) => Ok(Computed::Spilled(self.spilled.get_or_init(|| file))),
            // No room for it on disk either: this read is served from the
            // value, and the next computes it again.
            Err(_) => Ok(Computed::Held(Arc::new(bytes))),
        }
    }
}

/// `bytes` written to a new unlinked temporary file.
fn spill(bytes: &[u8]) -> std::io::Result<File> {
    use std::io::Write;
    let mut file = tempfile::tempfile()?;
    file.write_all(bytes)?;
    Ok(file)
}

impl Content for Lazy {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        if offset >= self.size {
            return Ok(0);
        }
        match self.value()? {
            Computed::Held(bytes) => Ok(copy_range(&bytes, offset, buf)),
            Computed::Spilled(file) => {
                let n = buf.len().min((self.size - offset) as usize);
                file.read_exact_at(&mut buf[..n], offset)
                    .map_err(|e| TreeError::Internal(format!("reading a spilled file: {e}")))?;
                Ok(n)
            }
        }
    }

    fn held_at(&self, offset: u64, len: usize) -> Result<Option<Held>, TreeError> {
        if offset >= self.size {
            return Ok(None);
        }
        Ok(match self.value()? {
            Computed::Held(bytes) => Some(Held::new(bytes, offset as usize, len)),
            Computed::Spilled(_) => None,
        })
    }
}

/// How many of `want` bytes at `offset` lie within a file of `size` (0 at
/// or past its end): what a `read_at` serves.
pub(crate) fn readable(size: u64, offset: u64, want: usize) -> usize {
    size.saturating_sub(offset).min(want as u64) as usize
}

/// A file of `size` bytes made piece by piece: `fill(offset, buf)` writes
/// the bytes at `offset` into `buf` (whole, clamped to the size), from
/// values it holds or computes for that range only. For derived files that
/// can be larger than the budget (`vectors.npy` of a large `.semq`).
pub struct Windowed<F> {
    size: u64,
    fill: F,
}

impl<F> Windowed<F>
where
    F: Fn(u64, &mut [u8]) -> Result<(), TreeError> + Send + Sync,
{
    pub fn new(size: u64, fill: F) -> Self {
        Windowed { size, fill }
    }
}

impl<F> Content for Windowed<F>
where
    F: Fn(u64, &mut [u8]) -> Result<(), TreeError> + Send + Sync,
{
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let n = readable(self.size, offset, buf.len());
        if n == 0 {
            return Ok(0);
        }
        (self.fill)(offset, &mut buf[..n])?;
        Ok(n)
    }
}

/// A source file served as it is.
pub(crate) struct Passthrough {
    path: PathBuf,
    size: u64,
    file: OnceLock<Result<File, String>>,
}

impl Passthrough {
    pub fn new(path: &Path, size: u64) -> Self {
        Passthrough {
            path: path.to_path_buf(),
            size,
            file: OnceLock::new(),
        }
    }
}

impl Passthrough {
    /// The source file, opened on first use (a stat does not open it).
    fn file(&self) -> Result<&File, TreeError> {
        // Only a regular file (see crate::regular_file): a FIFO or device
        // swapped in after lookup must not block the worker reading it.
        let file = self
            .file
            .get_or_init(|| crate::regular_file::open(&self.path).map_err(|e| e.to_string()));
        file.as_ref().map_err(|e| TreeError::Io {
            path: self.path.clone(),
            reason: e.clone(),
        })
    }
}

impl Content for Passthrough {
    fn size(&self) -> u64 {
        self.size
    }

    fn is_passthrough(&self) -> bool {
        true
    }

    fn pin(&self) -> Result<(), TreeError> {
        self.file().map(|_| ())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let want = readable(self.size, offset, buf.len());
        if want == 0 {
            return Ok(0);
        }
        let file = self.file()?;
        let mut done = 0;
        while done < want {
            match file.read_at(&mut buf[done..want], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(TreeError::Io {
                        path: self.path.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        Ok(done)
    }
}

/// Reads a whole content `piece` bytes at a time, as a reader asking range
/// by range does (tests of contents made per read).
pub fn read_in_pieces(content: &dyn Content, piece: usize) -> Result<Vec<u8>, TreeError> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; piece.max(1)];
    loop {
        let n = content.read_at(out.len() as u64, &mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Reads a whole content (for `qem cat` and tests).
pub fn read_all(content: &dyn Content) -> Result<Vec<u8>, TreeError> {
    let size = usize::try_from(content.size())
        .map_err(|_| TreeError::Internal("file too large for memory".into()))?;
    let mut out = vec![0u8; size];
    let mut at = 0;
    while at < size {
        let n = content.read_at(at as u64, &mut out[at..])?;
        if n == 0 {
            break;
        }
        at += n;
    }
    out.truncate(at);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_clamped_to_the_content() {
        let b = Bytes::new(b"hello".to_vec());
        let mut buf = [0u8; 4];
        assert_eq!(b.read_at(3, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"lo");
        assert_eq!(b.read_at(5, &mut buf).unwrap(), 0);
        assert_eq!(b.read_at(u64::MAX, &mut buf).unwrap(), 0);
    }

    #[test]
    fn lazy_content_is_computed_once_and_checked() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        let budget = Arc::new(Budget::new(1 << 20));
        let lazy = Lazy::new(&budget, 1, 3, move || {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(b"abc".to_vec())
        });
        assert_eq!(read_all(&lazy).unwrap(), b"abc");
        assert_eq!(read_all(&lazy).unwrap(), b"abc");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        let wrong = Lazy::new(&budget, 1, 2, || Ok(b"abc".to_vec()));
        assert!(read_all(&wrong).is_err());
    }

    /// A computed file is held in the budget, not by itself: when the
    /// budget is full it goes like a block, and is computed again.
    #[test]
    fn lazy_content_is_held_in_the_budget() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let budget = Arc::new(Budget::new(100));
        let c = calls.clone();
        let lazy = Lazy::new(&budget, 1, 60, move || {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(vec![1; 60])
        });
        read_all(&lazy).unwrap();
        assert_eq!(budget.stats().bytes, 60);
        let other = Lazy::new(&budget, 2, 60, || Ok(vec![2; 60]));
        read_all(&other).unwrap();
        assert_eq!(budget.stats().bytes, 60, "one of them was evicted");
        assert_eq!(read_all(&lazy).unwrap(), vec![1; 60]);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A computed file larger than the whole budget is computed once, not
    /// per read, and not held in memory: every read after the first is
    /// served from its spilled copy, byte for byte.
    #[test]
    fn lazy_content_larger_than_the_budget_is_computed_once() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let budget = Arc::new(Budget::new(100));
        let c = calls.clone();
        let value: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let v = value.clone();
        let huge = Lazy::new(&budget, 3, 1000, move || {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(v.clone())
        });
        // Reads of 64 bytes, as a reader asking piece by piece would.
        assert_eq!(read_in_pieces(&huge, 64).unwrap(), value);
        let mut buf = [0u8; 64];
        assert_eq!(huge.read_at(990, &mut buf).unwrap(), 10);
        assert_eq!(&buf[..10], &value[990..]);
        assert!(
            huge.held_at(0, 64).unwrap().is_none(),
            "nothing held to lend"
        );
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(budget.stats().bytes, 0, "never held in the budget");
    }

    #[test]
    fn windowed_content_fills_only_the_range_asked_for() {
        let w = Windowed::new(10, |at, buf: &mut [u8]| {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = at as u8 + i as u8;
            }
            Ok(())
        });
        let mut buf = [0u8; 4];
        assert_eq!(w.read_at(8, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], &[8, 9]);
        assert_eq!(read_all(&w).unwrap(), (0..10).collect::<Vec<u8>>());
    }
}

/// The single-flight computation under randomised thread schedules
/// (`shuttle`).
#[cfg(all(test, feature = "shuttle"))]
mod shuttle_tests {
    use super::*;
    use shuttle::thread;

    #[test]
    fn shuttle_first_readers_share_one_computation_and_a_failure_is_retried() {
        shuttle::check_random(
            || {
                let calls = Arc::new(Mutex::new(0usize));
                let c = Arc::clone(&calls);
                // The first computation fails (a source being replaced),
                // the later ones succeed.
                let budget = Arc::new(Budget::new(1 << 20));
                let lazy = Arc::new(Lazy::new(&budget, 1, 3, move || {
                    let mut n = lock(&c);
                    *n += 1;
                    if *n == 1 {
                        Err(TreeError::SourceChanged)
                    } else {
                        Ok(b"abc".to_vec())
                    }
                }));
                let readers: Vec<_> = (0..3)
                    .map(|_| {
                        let lazy = Arc::clone(&lazy);
                        thread::spawn(move || read_all(lazy.as_ref()))
                    })
                    .collect();
                let results: Vec<_> = readers.into_iter().map(|t| t.join().unwrap()).collect();
                let failed = results.iter().filter(|r| r.is_err()).count();
                assert!(
                    failed <= 1,
                    "a failure reaches only the reader that computed it"
                );
                assert!(results.iter().flatten().all(|b| b == b"abc"));
                assert!(
                    *lock(&calls) <= 2,
                    "one failed computation, one that is kept"
                );
                assert_eq!(read_all(lazy.as_ref()).unwrap(), b"abc");
                assert!(*lock(&calls) <= 2);
            },
            1000,
        );
    }
}
