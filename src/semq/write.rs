//! Writing an image: to a temporary sibling, fsync, then publish under the
//! final name without ever replacing an existing file (spec 5, DESIGN).

use std::io;
use std::path::Path;

use super::encoding::Encoding;
use super::error::{Result, SemqError};
use crate::publish::{self, Overwrite, PublishError};

impl Encoding {
    /// Writes the file image to `path`. Fails with an `Io` error of kind
    /// `AlreadyExists` when `path` exists; never leaves a partial file
    /// under `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_new_file(path.as_ref(), self.image())
    }
}

/// Publishes `bytes` as a new file at `path` atomically with
/// [`crate::publish`]: the bytes go to a temporary sibling
/// `.NAME.tmp-PID-N` (same directory, so same filesystem), are synced, and
/// the temporary is hard-linked to the final name, which fails rather than
/// replaces when the name exists. Temporaries left by killed writers of the
/// same name are removed.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    publish::write_file(path, bytes, Overwrite::Never).map_err(|e| match e {
        PublishError::Exists(path) => SemqError::Io {
            source: io::Error::new(io::ErrorKind::AlreadyExists, "file exists"),
            path,
        },
        PublishError::SourceChanged(path) => SemqError::Io {
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not written: {}", crate::mapguard::CHANGED),
            ),
            path,
        },
        PublishError::Io { path, source } => SemqError::Io { path, source },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_replace_and_cleans_dead_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.semq");
        // PIDs above the kernel's pid_max never run.
        let stale = dir.path().join(".s.semq.tmp-4999999-0");
        std::fs::write(&stale, b"partial").unwrap();
        write_new_file(&path, b"image").unwrap();
        assert!(!stale.exists());
        let err = write_new_file(&path, b"other").unwrap_err();
        assert!(
            matches!(&err, SemqError::Io { source, .. } if source.kind() == io::ErrorKind::AlreadyExists),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"image");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
