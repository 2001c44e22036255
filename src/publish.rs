//! Crash-safe creation of output files.
//!
//! Every file we write goes to a temporary sibling first, is fsynced, and is
//! then published under its final name in one step: a hard link, which fails
//! instead of replacing an existing file, or (when the caller asked to
//! overwrite) a rename. A crash at any point leaves either no file or the
//! complete file under the final name, never a partial one.
//!
//! Temporary files are named `.NAME.tmp-PID-N` so users recognise them.
//! A process ending on a signal it can catch removes its own first
//! ([`remove_unpublished`], called by the commands' signal thread); ones
//! left behind by a process that was killed outright are removed the next
//! time the same output is written.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The temporaries this process has made and not yet published or
/// removed: what an interrupted run removes on its way out (see
/// [`remove_unpublished`]). Every change to it, and the step that makes,
/// publishes or removes a temporary, happens under its lock, so that the
/// removal never sees a temporary half made or half published.
static UNPUBLISHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Held shared by every write that reaches a temporary by its path, and
/// exclusively by [`remove_unpublished`]. Such a write makes the folders
/// on its path (zarrs makes a store's folders as it stores each chunk;
/// the HDF5 library creates its file by name): one in flight while the
/// temporaries are removed would make the store's folder anew and leave
/// it behind.
static BY_PATH: RwLock<()> = RwLock::new(());

/// Runs `write`, which reaches a temporary by its path, so that an
/// interrupted run's removal of its temporaries waits for it and no such
/// write starts afterwards.
pub(crate) fn by_path<T>(write: impl FnOnce() -> T) -> T {
    let _shared = BY_PATH.read().unwrap_or_else(|e| e.into_inner());
    write()
}

fn unpublished() -> MutexGuard<'static, Vec<PathBuf>> {
    UNPUBLISHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `step`, which publishes or removes the temporary `temp`, under the
/// list's lock; once it succeeds, `temp` is forgotten (and emptied, so
/// that Drop has nothing left to remove).
fn settle<T, E>(temp: &mut PathBuf, step: impl FnOnce(&Path) -> Result<T, E>) -> Result<T, E> {
    let mut live = unpublished();
    let done = step(temp)?;
    live.retain(|p| p != temp);
    *temp = PathBuf::new();
    Ok(done)
}

/// Removes a temporary file or store (nothing to do when it is gone).
fn remove_entry(path: &Path) -> io::Result<()> {
    let removed = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Ends every write under way: removes each temporary this process has
/// not published, and holds the list locked until the returned guard is
/// dropped, so that no other thread makes or publishes one meanwhile. For
/// a process about to end on a signal (Ctrl-C, `kill`): a final name then
/// holds what it held before, or a complete output published before the
/// removal began, and no temporary is left behind. Writes that reach a
/// temporary by its path (zarrs' chunk stores, the HDF5 library's create)
/// in flight finish first, and none starts until the guard is dropped.
pub fn remove_unpublished() -> Unpublished {
    // Always in this order: `by_path` writes never take the list's lock,
    // and no holder of the list's lock waits for a `by_path` write.
    let paths = BY_PATH.write().unwrap_or_else(|e| e.into_inner());
    removing(paths, unpublished())
}

/// Removes every temporary in the list `live`, with writes by path held
/// off by `paths`, and keeps both locks.
fn removing(
    paths: RwLockWriteGuard<'static, ()>,
    mut live: MutexGuard<'static, Vec<PathBuf>>,
) -> Unpublished {
    for path in live.drain(..) {
        let _ = remove_entry(&path);
    }
    Unpublished {
        _held: live,
        _paths: paths,
    }
}

/// As [`remove_unpublished`], for a thread that may itself be inside a
/// write by path or a change to the list (one that ran out of memory
/// there): it waits for the locks at most `patience`, rather than for
/// ever on itself, and gives `None` when it could not take them.
pub fn try_remove_unpublished(patience: Duration) -> Option<Unpublished> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(paths) = taken(BY_PATH.try_write()) {
            if let Some(live) = taken(UNPUBLISHED.try_lock()) {
                return Some(removing(paths, live));
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The guard of a lock taken without waiting; a poisoned lock is taken
/// too (the list stays valid whatever panicked).
fn taken<G>(attempt: Result<G, TryLockError<G>>) -> Option<G> {
    match attempt {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The list of temporaries, emptied and locked, and writes by path held
/// off (see [`remove_unpublished`]).
pub struct Unpublished {
    _held: MutexGuard<'static, Vec<PathBuf>>,
    _paths: RwLockWriteGuard<'static, ()>,
}

/// Why an output could not be published.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    #[error("{0}: already exists; refusing to replace it (choose another name or remove it)")]
    Exists(PathBuf),
    #[error("{}: not written: {}", .0.display(), crate::mapguard::CHANGED)]
    SourceChanged(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl PublishError {
    fn io(path: &Path, source: io::Error) -> Self {
        PublishError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether publishing may replace an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    Never,
    Replace,
}

/// A file being written under a temporary name; dropped without
/// [`AtomicFile::publish`], it removes itself.
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    file: Option<File>,
    overwrite: Overwrite,
    /// [`crate::mapguard::faults`] when writing began: under
    /// [`crate::mapguard::install_strict`], an input mapped by this process
    /// that was truncated since reads as zeros in parts, so the output is
    /// not published.
    faults: u64,
}

impl AtomicFile {
    /// Starts writing `target`. Fails at once when `target` exists and may
    /// not be replaced, so no work is wasted on an output that cannot land.
    pub fn create(target: impl AsRef<Path>, overwrite: Overwrite) -> Result<Self, PublishError> {
        let faults = crate::mapguard::faults();
        let target = target.as_ref().to_path_buf();
        let (temp, file) = make_temporary(&target, overwrite, |temp| {
            OpenOptions::new()
                .write(true)
                .read(true)
                .create_new(true)
                .open(temp)
        })?;
        Ok(AtomicFile {
            target,
            temp,
            file: Some(file),
            overwrite,
            faults,
        })
    }

    /// The final name.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The temporary file's name, for writers that open it themselves (the
    /// HDF5 library writes by path; it truncates this same inode, so
    /// [`AtomicFile::publish`] still fsyncs what it wrote).
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// The temporary file, for writing (and reading back, e.g. to copy a
    /// spooled body).
    pub fn file(&mut self) -> &mut File {
        // `file` is only taken by `publish`, which consumes `self`.
        self.file.as_mut().expect("file present until publish")
    }

    /// Flushes and fsyncs the data, then puts it under the final name and
    /// fsyncs the directory so the name survives a crash too.
    pub fn publish(mut self) -> Result<(), PublishError> {
        if crate::mapguard::strict() && crate::mapguard::faults() != self.faults {
            // Dropping self removes the temporary file.
            return Err(PublishError::SourceChanged(self.target.clone()));
        }
        let file = self.file.take().expect("file present until publish");
        file.sync_all()
            .map_err(|e| PublishError::io(&self.temp, e))?;
        drop(file);
        let (target, overwrite) = (&self.target, self.overwrite);
        // Afterwards the temporary name is gone; nothing is left for Drop
        // to clean.
        settle(&mut self.temp, |temp| match overwrite {
            Overwrite::Never => {
                fs::hard_link(temp, target).map_err(|e| {
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        PublishError::Exists(target.clone())
                    } else {
                        PublishError::io(target, e)
                    }
                })?;
                fs::remove_file(temp).map_err(|e| PublishError::io(temp, e))
            }
            Overwrite::Replace => fs::rename(temp, target).map_err(|e| PublishError::io(target, e)),
        })?;
        if let Ok(dir) = File::open(parent_dir(&self.target)) {
            // Some filesystems cannot fsync a directory; the data itself is
            // already durable, so this is best effort.
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = settle(&mut self.temp, |temp| fs::remove_file(temp));
        }
    }
}

/// Writes `bytes` to `target` atomically.
pub fn write_file(
    target: impl AsRef<Path>,
    bytes: &[u8],
    overwrite: Overwrite,
) -> Result<(), PublishError> {
    let mut out = AtomicFile::create(target, overwrite)?;
    let temp = out.temp.clone();
    out.write_all(bytes)
        .map_err(|e| PublishError::io(&temp, e))?;
    out.publish()
}

/// A directory (a Zarr store) being written under a temporary name
/// `.NAME.tmp-PID-N`; [`AtomicDir::publish`] fsyncs everything in it and
/// puts it under the final name in one rename that never replaces an
/// existing entry (or, when asked to overwrite, swaps it for the old one,
/// which is then removed). Dropped unpublished, it removes itself.
pub(crate) struct AtomicDir {
    target: PathBuf,
    temp: PathBuf,
    overwrite: Overwrite,
    faults: u64,
}

impl AtomicDir {
    /// Starts writing `target`; fails at once when it exists and may not
    /// be replaced.
    pub fn create(target: impl AsRef<Path>, overwrite: Overwrite) -> Result<Self, PublishError> {
        let faults = crate::mapguard::faults();
        let target = target.as_ref().to_path_buf();
        let (temp, ()) = make_temporary(&target, overwrite, |temp| fs::create_dir(temp))?;
        Ok(AtomicDir {
            target,
            temp,
            overwrite,
            faults,
        })
    }

    /// The temporary directory to write into.
    pub fn temp(&self) -> &Path {
        &self.temp
    }

    /// Makes the contents durable, then publishes them under the final name.
    pub fn publish(mut self) -> Result<(), PublishError> {
        if crate::mapguard::strict() && crate::mapguard::faults() != self.faults {
            return Err(PublishError::SourceChanged(self.target.clone()));
        }
        sync_tree(&self.temp)?;
        let exists = fs::symlink_metadata(&self.target).is_ok();
        let target = &self.target;
        if exists && self.overwrite == Overwrite::Replace {
            {
                // Under the lock: an interrupted run removes the new store
                // before the swap (which then fails) or the old entry
                // after it, never a store half removed under the final
                // name. `temp` then names the old entry, still to be
                // removed (here, else by Drop).
                let _live = unpublished();
                rename2(&self.temp, target, libc::RENAME_EXCHANGE)?;
            }
            settle(&mut self.temp, |old| {
                remove_entry(old).map_err(|e| PublishError::io(old, e))
            })?;
        } else {
            settle(&mut self.temp, |temp| {
                rename2(temp, target, libc::RENAME_NOREPLACE).map_err(|e| match e {
                    PublishError::Io { source, .. }
                        if source.kind() == io::ErrorKind::AlreadyExists =>
                    {
                        PublishError::Exists(target.clone())
                    }
                    other => other,
                })
            })?;
        }
        if let Ok(dir) = File::open(parent_dir(&self.target)) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for AtomicDir {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = settle(&mut self.temp, remove_entry);
        }
    }
}

/// fsyncs every file and directory below `dir`, and `dir` itself.
fn sync_tree(dir: &Path) -> Result<(), PublishError> {
    for entry in fs::read_dir(dir).map_err(|e| PublishError::io(dir, e))? {
        let entry = entry.map_err(|e| PublishError::io(dir, e))?;
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            sync_tree(&path)?;
        } else {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| PublishError::io(&path, e))?;
        }
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// `renameat2(2)`: a rename that refuses to replace (`RENAME_NOREPLACE`)
/// or swaps two names (`RENAME_EXCHANGE`), atomically.
fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> Result<(), PublishError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| {
            PublishError::io(
                p,
                io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in path"),
            )
        })
    };
    let (a, b) = (c(from)?, c(to)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(PublishError::io(to, io::Error::last_os_error()))
    }
}

/// Makes the temporary sibling `.NAME.tmp-PID-N` of `target` with `make`
/// (a file or a folder), after removing dead writers' leftovers and
/// refusing an existing `target` that may not be replaced.
fn make_temporary<T>(
    target: &Path,
    overwrite: Overwrite,
    make: impl Fn(&Path) -> io::Result<T>,
) -> Result<(PathBuf, T), PublishError> {
    let name = target
        .file_name()
        .ok_or_else(|| {
            PublishError::io(
                target,
                io::Error::new(io::ErrorKind::InvalidInput, "not a file name"),
            )
        })?
        .to_string_lossy()
        .into_owned();
    let dir = parent_dir(target);
    // Before the refusal below: a killed writer's leftovers go even when
    // this run cannot write either.
    remove_stale_temporaries(dir, &name);
    if overwrite == Overwrite::Never && fs::symlink_metadata(target).is_ok() {
        return Err(PublishError::Exists(target.to_path_buf()));
    }
    loop {
        let temp = dir.join(format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut live = unpublished();
        match make(&temp) {
            Ok(made) => {
                live.push(temp.clone());
                return Ok((temp, made));
            }
            // Left by an earlier process that had our PID (so it was not
            // removed as stale): take the next number.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(PublishError::io(&temp, e)),
        }
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Removes `.NAME.tmp-PID-...` files (`N`, `body-N`, `replace`) whose
/// writer process is gone (killed before it could clean up). Files of
/// running processes are left alone.
pub(crate) fn remove_stale_temporaries(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            // Directories are the stores of an AtomicDir.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir_all(entry.path());
            } else {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn publishes_complete_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bin");
        let mut f = AtomicFile::create(&target, Overwrite::Never).unwrap();
        f.write_all(b"hello").unwrap();
        assert!(
            !target.exists(),
            "nothing under the final name before publish"
        );
        f.publish().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"hello");
        assert_eq!(names(dir.path()), vec!["out.bin"]);
    }

    #[test]
    fn never_replaces_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("keep.txt");
        fs::write(&target, b"precious").unwrap();
        let err = write_file(&target, b"new", Overwrite::Never).unwrap_err();
        assert!(matches!(err, PublishError::Exists(_)), "{err}");
        assert_eq!(fs::read(&target).unwrap(), b"precious");
        // A file that appears while we write is not replaced either.
        let late = dir.path().join("late.txt");
        let mut f = AtomicFile::create(&late, Overwrite::Never).unwrap();
        f.write_all(b"mine").unwrap();
        fs::write(&late, b"theirs").unwrap();
        assert!(matches!(f.publish(), Err(PublishError::Exists(_))));
        assert_eq!(fs::read(&late).unwrap(), b"theirs");
        assert_eq!(names(dir.path()), vec!["keep.txt", "late.txt"]);
    }

    #[test]
    fn replaces_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("x");
        fs::write(&target, b"old").unwrap();
        write_file(&target, b"new", Overwrite::Replace).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(names(dir.path()), vec!["x"]);
    }

    #[test]
    fn abandoned_writes_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("y");
        {
            let mut f = AtomicFile::create(&target, Overwrite::Never).unwrap();
            f.write_all(b"partial").unwrap();
        }
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn temporaries_of_dead_writers_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        // PIDs above the kernel's pid_max (at most 2^22) never run.
        let dead = dir.path().join(".z.tmp-4999999-0");
        let alive = dir.path().join(format!(".z.tmp-{}-99", std::process::id()));
        fs::write(&dead, b"x").unwrap();
        fs::write(&alive, b"x").unwrap();
        write_file(dir.path().join("z"), b"done", Overwrite::Never).unwrap();
        assert!(!dead.exists());
        assert!(alive.exists());
    }

    #[test]
    fn a_refused_write_still_cleans_dead_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("w");
        fs::write(&target, b"kept").unwrap();
        let dead = dir.path().join(".w.tmp-4999999-body-3");
        fs::write(&dead, b"x").unwrap();
        assert!(matches!(
            AtomicFile::create(&target, Overwrite::Never),
            Err(PublishError::Exists(_))
        ));
        assert_eq!(names(dir.path()), vec!["w"]);
    }

    #[test]
    fn directories_publish_whole_and_never_replace() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("s.zarr");
        let d = AtomicDir::create(&target, Overwrite::Never).unwrap();
        fs::create_dir(d.temp().join("a")).unwrap();
        fs::write(d.temp().join("a/0"), b"chunk").unwrap();
        assert!(
            !target.exists(),
            "nothing under the final name before publish"
        );
        d.publish().unwrap();
        assert_eq!(fs::read(target.join("a/0")).unwrap(), b"chunk");
        assert_eq!(names(dir.path()), vec!["s.zarr"]);
        // An existing store is kept, even one that appears while writing.
        assert!(matches!(
            AtomicDir::create(&target, Overwrite::Never),
            Err(PublishError::Exists(_))
        ));
        let late = dir.path().join("late.zarr");
        let d = AtomicDir::create(&late, Overwrite::Never).unwrap();
        fs::create_dir(&late).unwrap();
        assert!(matches!(d.publish(), Err(PublishError::Exists(_))));
        assert_eq!(names(dir.path()), vec!["late.zarr", "s.zarr"]);
        // Replacing swaps the whole store for the new one.
        let d = AtomicDir::create(&target, Overwrite::Replace).unwrap();
        fs::write(d.temp().join("new"), b"x").unwrap();
        d.publish().unwrap();
        assert_eq!(names(&target), vec!["new"]);
        assert_eq!(names(dir.path()), vec!["late.zarr", "s.zarr"]);
        // Abandoned: nothing left.
        {
            let d = AtomicDir::create(dir.path().join("gone.zarr"), Overwrite::Never).unwrap();
            fs::write(d.temp().join("partial"), b"x").unwrap();
        }
        assert_eq!(names(dir.path()), vec!["late.zarr", "s.zarr"]);
    }

    /// Where [`removal_holds_off_writes_by_path`]'s own process writes.
    const ALONE: &str = "QEMFS_TEST_REMOVAL_DIR";

    /// An interrupted run's removal of its temporaries must not be undone
    /// by a write still under way: zarrs makes a store's folders as it
    /// stores each chunk, so a chunk stored just after the removal would
    /// make the temporary store anew, and the process would end leaving
    /// it behind. The removal acts on the whole process, so the test runs
    /// alone in a process of its own (this test binary, started again).
    #[test]
    fn removal_holds_off_writes_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "publish::tests::removal_alone",
                "--ignored",
                "--nocapture",
            ])
            .env(ALONE, dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("removal held"),
            "{}{}",
            said,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The process of [`removal_holds_off_writes_by_path`].
    #[test]
    #[ignore = "started by removal_holds_off_writes_by_path in a process of its own"]
    fn removal_alone() {
        let dir = PathBuf::from(std::env::var_os(ALONE).expect("started by the test above"));
        let store = AtomicDir::create(dir.join("s.zarr"), Overwrite::Never).unwrap();
        let temp = store.temp().to_path_buf();
        let written = std::sync::Arc::new(AtomicU64::new(0));
        let writer = {
            let (temp, written) = (temp.clone(), std::sync::Arc::clone(&written));
            // Stores chunks as zarrs does, as fast as it can.
            std::thread::spawn(move || {
                for n in 0u64.. {
                    let _ = by_path(|| {
                        let folder = temp.join(format!("c/{}", n % 7));
                        fs::create_dir_all(&folder)?;
                        fs::write(folder.join(n.to_string()), b"chunk")
                    });
                    written.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        while written.load(Ordering::Relaxed) < 1000 {
            std::thread::yield_now();
        }
        let _held = remove_unpublished();
        let after = written.load(Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!temp.exists(), "the store was made anew after its removal");
        assert!(
            written.load(Ordering::Relaxed) <= after + 1,
            "writes by path went on after the removal"
        );
        assert!(!writer.is_finished());
        println!("removal held");
        // The writer waits for the guard for good: end here, as the
        // commands do after the removal.
        std::process::exit(0);
    }

    #[test]
    fn a_removal_that_cannot_wait_gives_up_on_its_own_write_by_path() {
        // A thread out of memory inside a write by path: waiting for the
        // lock it holds itself would hang the process for good.
        let started = std::time::Instant::now();
        let gave_up = by_path(|| try_remove_unpublished(Duration::from_millis(50)).is_none());
        assert!(gave_up);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_leftover_with_our_own_name_is_stepped_over() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("v");
        // What a process with our PID could have left: the next names
        // (more than the other tests here can take meanwhile).
        let next = COUNTER.load(Ordering::Relaxed);
        for n in next..next + 64 {
            fs::write(
                dir.path()
                    .join(format!(".v.tmp-{}-{n}", std::process::id())),
                b"old",
            )
            .unwrap();
        }
        write_file(&target, b"new", Overwrite::Never).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
    }
}
