//! What can go wrong in a conversion; every error names the file it is about.

use std::io;
use std::path::{Path, PathBuf};

use crate::publish::PublishError;
use crate::qem::write::WriteError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// The input (or an argument about it) is not what it must be.
    #[error("{}: {reason}", path.display())]
    Input { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: crate::qem::QemError,
    },
    #[error("{}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: WriteError,
    },
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl ConvertError {
    pub fn input(path: &Path, reason: impl Into<String>) -> ConvertError {
        ConvertError::Input {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub fn io(path: &Path, source: io::Error) -> ConvertError {
        ConvertError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn read(path: &Path, source: crate::qem::QemError) -> ConvertError {
        ConvertError::Read {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn write(path: &Path, source: WriteError) -> ConvertError {
        ConvertError::Write {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A shape the output format cannot hold, or a mask the input's own
    /// metadata contradicts, is the input's fault, not the output's: such
    /// an error names `input` instead (a store of 2^40 frames was reported
    /// as `out.qem: invalid shape`).
    pub fn of_input(self, input: &Path) -> ConvertError {
        match self {
            ConvertError::Write {
                source: source @ (WriteError::Shape { .. } | WriteError::ValidPixels),
                path,
            } => ConvertError::input(
                input,
                format!("cannot be written as {}: {source}", path.display()),
            ),
            other => other,
        }
    }
}
