//! Temporary siblings and atomic publication (spec §2, writer procedure).
//!
//! The body is spooled to one temporary sibling while it is hashed; the
//! final file (envelope, header, body copy) is assembled in a second one,
//! fsynced and hard-linked to the target name. A hard link fails when the
//! name exists, so an existing file is never replaced, and readers never see
//! a partial file under the final name.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::WriteError;

static COUNTER: AtomicU64 = AtomicU64::new(0);

pub(crate) fn io_error(path: &Path, source: io::Error) -> WriteError {
    WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A file that is removed when dropped unless it was published.
pub(crate) struct TempFile {
    pub path: PathBuf,
    pub file: File,
    armed: bool,
}

impl TempFile {
    /// Creates `.NAME.KIND-PID-N` beside `target`, exclusively.
    pub fn beside(target: &Path, kind: &str) -> Result<TempFile, WriteError> {
        let name = target
            .file_name()
            .ok_or_else(|| WriteError::BadPath {
                path: target.to_path_buf(),
            })?
            .to_string_lossy()
            .into_owned();
        let dir = parent_dir(target);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".{name}.{kind}-{}-{n}", std::process::id()));
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(TempFile {
                        path,
                        file,
                        armed: true,
                    })
                }
                // A stale name from an earlier process with the same pid: take the next.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_error(&path, e)),
            }
        }
    }

    /// Links this (fsynced) file to `target`, removes the temporary name and
    /// fsyncs the directory.
    pub fn publish(mut self, target: &Path) -> Result<(), WriteError> {
        self.file.sync_all().map_err(|e| io_error(&self.path, e))?;
        if let Err(e) = fs::hard_link(&self.path, target) {
            return Err(if e.kind() == io::ErrorKind::AlreadyExists {
                WriteError::TargetExists {
                    path: target.to_path_buf(),
                }
            } else {
                io_error(target, e)
            });
        }
        self.armed = false;
        // The published name holds the data now; failing to drop the
        // temporary name would leave a stray file, so it is reported.
        fs::remove_file(&self.path).map_err(|e| io_error(&self.path, e))?;
        let dir = parent_dir(target);
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error(&dir, e))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = fs::remove_file(&self.path);
        }
    }
}

pub(crate) fn parent_dir(target: &Path) -> PathBuf {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Fails early, before any encoding work, when the target already exists.
pub(crate) fn check_target_free(target: &Path) -> Result<(), WriteError> {
    match fs::symlink_metadata(target) {
        Ok(_) => Err(WriteError::TargetExists {
            path: target.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(target, e)),
    }
}
