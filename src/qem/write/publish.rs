//! Publication (spec §2, writer procedure).
//!
//! The file (body first, then moved up behind the envelope and header) is
//! written under a temporary name by [`crate::publish`], which fsyncs it and
//! hard-links it to the target name. A hard link fails when the name
//! exists, so an existing file is never replaced, and readers never see a
//! partial file under the final name.

use std::fs;
use std::io;
use std::path::Path;

use super::WriteError;

pub(crate) fn io_error(path: &Path, source: io::Error) -> WriteError {
    WriteError::Io {
        path: path.to_path_buf(),
        source,
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
