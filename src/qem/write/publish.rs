//! The body spool and publication (spec §2, writer procedure).
//!
//! The body is spooled to a temporary sibling while it is hashed; the final
//! file (envelope, header, body copy) is assembled by [`crate::publish`],
//! which fsyncs it and hard-links it to the target name. A hard link fails
//! when the name exists, so an existing file is never replaced, and readers
//! never see a partial file under the final name.

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

/// A file that is removed when dropped.
pub(crate) struct TempFile {
    pub path: PathBuf,
    pub file: File,
}

impl TempFile {
    /// Creates `.NAME.tmp-PID-body-N` beside `target`, exclusively; the name
    /// follows [`crate::publish`]'s pattern so that a spool left by a killed
    /// writer is cleaned up like its other temporaries.
    pub fn spool(target: &Path) -> Result<TempFile, WriteError> {
        let name = target
            .file_name()
            .ok_or_else(|| WriteError::BadPath {
                path: target.to_path_buf(),
            })?
            .to_string_lossy()
            .into_owned();
        let dir = parent_dir(target);
        // A killed writer's spool can be large: free it before spooling.
        crate::publish::remove_stale_temporaries(&dir, &name);
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".{name}.tmp-{}-body-{n}", std::process::id()));
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => return Ok(TempFile { path, file }),
                // A stale name from an earlier process with the same pid: take the next.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_error(&path, e)),
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
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

/// The writer's error for a failed publication.
pub(crate) fn publish_error(e: crate::publish::PublishError) -> WriteError {
    match e {
        crate::publish::PublishError::Exists(path) => WriteError::TargetExists { path },
        crate::publish::PublishError::SourceChanged(path) => WriteError::SourceChanged { path },
        crate::publish::PublishError::Io { path, source } => WriteError::Io { path, source },
    }
}
