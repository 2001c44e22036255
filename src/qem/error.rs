//! The one error type of the `.qem` reader.
//!
//! Every variant says what failed and where (envelope, header member, chunk,
//! stream `b*P+p`, body checksum block), so that a binary can print
//! `error: <file>: <reason>` and a mount can log it next to `EIO`.

use std::fmt;

/// Result alias of the `.qem` reader.
pub type Result<T, E = QemError> = std::result::Result<T, E>;

/// What is wrong with one count stream (§7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamFault {
    /// Selector byte outside 0..=63 and 252..=255.
    UnknownSelector(u8),
    /// Stream length does not fit the selector (zeros/constant/literal/sparse,
    /// rANS shorter than 4 bytes or, in the float codec, longer than `2m`).
    Length { selector: u8, len: usize },
    /// rANS initial state outside `[2^23, 2^31)`.
    InitialState(u32),
    /// The stream ended while renormalising.
    Truncated,
    /// The stream ended inside an escaped u16.
    TruncatedEscape,
    /// Final state differs from 2^23 or bytes are left over.
    FinalState { state: u32, unread: usize },
    /// Sparse event positions not strictly increasing or not `< m`.
    SparsePosition { position: usize },
}

impl fmt::Display for StreamFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            StreamFault::UnknownSelector(s) => write!(f, "unknown model selector {s}"),
            StreamFault::Length { selector, len } => {
                write!(f, "length {len} does not fit model selector {selector}")
            }
            StreamFault::InitialState(x) => {
                write!(f, "rANS initial state {x:#x} outside [2^23, 2^31)")
            }
            StreamFault::Truncated => write!(f, "rANS stream ends too early"),
            StreamFault::TruncatedEscape => write!(f, "rANS stream ends inside an escaped count"),
            StreamFault::FinalState { state, unread } => write!(
                f,
                "rANS stream has trailing data or an invalid final state (state {state:#x}, {unread} bytes unread)"
            ),
            StreamFault::SparsePosition { position } => {
                write!(f, "sparse event position {position} out of order or out of range")
            }
        }
    }
}

/// A coarse classification of [`QemError`], stable for tests and for mapping
/// to exit codes or errno values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    Io,
    NotQem,
    LegacyContainer,
    HeaderLength,
    HeaderChecksum,
    Json,
    DuplicateKey,
    Header,
    UnsupportedCodec,
    UnsupportedVersion,
    Metadata,
    FileLength,
    ChecksumTable,
    BodyChecksum,
    Layout,
    StreamOffsets,
    Stream,
    ValueRange,
    LogicalChecksum,
    SpatialIndex,
    Calibration,
    OutOfRange,
    Changed,
}

/// Where in the file a stream lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSite {
    pub chunk: usize,
    /// Stream index inside the chunk: `b*P + p` (integer/scaled) or the lane
    /// `2p + half` (float).
    pub stream: usize,
}

impl fmt::Display for StreamSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chunk {} stream {}", self.chunk, self.stream)
    }
}

/// Errors are `Clone` (I/O errors shared behind an `Arc`) so that a block
/// cache can hand one failed load to every waiter.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum QemError {
    #[error("cannot read the file: {0}")]
    Io(std::sync::Arc<std::io::Error>),

    #[error("not a complete QEM file ({reason}); choose a .qem file")]
    NotQem { reason: String },

    #[error(
        "legacy {signature} container: no longer supported; open the original acquisition and save it again as .qem (renaming does not migrate a file)"
    )]
    LegacyContainer { signature: &'static str },

    #[error(
        "invalid header length {length} (body start {body_start}, file size {file_size}); recopy the file"
    )]
    HeaderLength {
        length: u64,
        body_start: u64,
        file_size: u64,
    },

    #[error("header checksum mismatch; recopy the file")]
    HeaderChecksum,

    #[error("header is not valid JSON: {detail}")]
    Json { detail: String },

    #[error("duplicate key '{key}' at {path} in the header; re-export the file")]
    DuplicateKey { key: String, path: String },

    #[error("header member {field}: {reason}")]
    Header { field: String, reason: String },

    #[error("codec '{codec}' is not supported: {advice}")]
    UnsupportedCodec { codec: String, advice: &'static str },

    #[error("{what} {found} is not supported (expected {expected}); update the reader or re-export the file")]
    UnsupportedVersion {
        what: &'static str,
        found: String,
        expected: String,
    },

    #[error("scientific metadata {path}: {reason}")]
    Metadata { path: String, reason: String },

    #[error(
        "file length {actual} disagrees with the header ({expected} expected); recopy the file"
    )]
    FileLength { expected: u128, actual: u64 },

    #[error(
        "incomplete body checksum table: {found} entries, {expected} expected; recopy the file"
    )]
    ChecksumTable { expected: usize, found: usize },

    #[error("body checksum mismatch in block {block}; recopy the file")]
    BodyChecksum { block: usize },

    #[error("chunk layout{}: {reason}", chunk_suffix(*.chunk))]
    Layout {
        chunk: Option<usize>,
        reason: String,
    },

    #[error("chunk {chunk}: invalid stream offsets: {reason}")]
    StreamOffsets { chunk: usize, reason: String },

    #[error("{site}: {fault}; re-export the file")]
    Stream {
        site: StreamSite,
        fault: StreamFault,
    },

    #[error("{site}: decoded value {value} exceeds {dtype}; refusing truncation")]
    ValueRange {
        site: StreamSite,
        value: u16,
        dtype: &'static str,
    },

    #[error("decoded float32 checksum mismatch (logical_sha256 {expected}, decoded {actual})")]
    LogicalChecksum { expected: String, actual: String },

    #[error(
        "spatial index disagrees with decoded counts: chunk {chunk} block {block} field {field} frame {frame}: stored {stored}, decoded {computed}"
    )]
    SpatialIndex {
        chunk: usize,
        block: usize,
        field: usize,
        frame: usize,
        stored: u64,
        computed: u64,
    },

    #[error("intensity calibration: {reason}; save the result again")]
    Calibration { reason: String },

    #[error("{what} {index} out of range (limit {limit})")]
    OutOfRange {
        what: &'static str,
        index: usize,
        limit: usize,
    },

    #[error(
        "QEM file changed (truncated or replaced) while it was read; retry with a stable copy"
    )]
    Changed,
}

impl From<std::io::Error> for QemError {
    fn from(e: std::io::Error) -> Self {
        QemError::Io(std::sync::Arc::new(e))
    }
}

fn chunk_suffix(chunk: Option<usize>) -> String {
    chunk.map(|c| format!(" of chunk {c}")).unwrap_or_default()
}

impl QemError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            QemError::Io(_) => ErrorKind::Io,
            QemError::NotQem { .. } => ErrorKind::NotQem,
            QemError::LegacyContainer { .. } => ErrorKind::LegacyContainer,
            QemError::HeaderLength { .. } => ErrorKind::HeaderLength,
            QemError::HeaderChecksum => ErrorKind::HeaderChecksum,
            QemError::Json { .. } => ErrorKind::Json,
            QemError::DuplicateKey { .. } => ErrorKind::DuplicateKey,
            QemError::Header { .. } => ErrorKind::Header,
            QemError::UnsupportedCodec { .. } => ErrorKind::UnsupportedCodec,
            QemError::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
            QemError::Metadata { .. } => ErrorKind::Metadata,
            QemError::FileLength { .. } => ErrorKind::FileLength,
            QemError::ChecksumTable { .. } => ErrorKind::ChecksumTable,
            QemError::BodyChecksum { .. } => ErrorKind::BodyChecksum,
            QemError::Layout { .. } => ErrorKind::Layout,
            QemError::StreamOffsets { .. } => ErrorKind::StreamOffsets,
            QemError::Stream { .. } => ErrorKind::Stream,
            QemError::ValueRange { .. } => ErrorKind::ValueRange,
            QemError::LogicalChecksum { .. } => ErrorKind::LogicalChecksum,
            QemError::SpatialIndex { .. } => ErrorKind::SpatialIndex,
            QemError::Calibration { .. } => ErrorKind::Calibration,
            QemError::OutOfRange { .. } => ErrorKind::OutOfRange,
            QemError::Changed => ErrorKind::Changed,
        }
    }

    /// True when the file itself is at fault (as opposed to I/O or a caller
    /// asking for something out of range): a mount answers `EIO` for these.
    pub fn is_corrupt_data(&self) -> bool {
        !matches!(
            self.kind(),
            ErrorKind::Io | ErrorKind::OutOfRange | ErrorKind::Changed
        )
    }

    pub(crate) fn header(field: impl Into<String>, reason: impl Into<String>) -> Self {
        QemError::Header {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn metadata(path: impl Into<String>, reason: impl Into<String>) -> Self {
        QemError::Metadata {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn layout(chunk: Option<usize>, reason: impl Into<String>) -> Self {
        QemError::Layout {
            chunk,
            reason: reason.into(),
        }
    }

    pub(crate) fn calibration(reason: impl Into<String>) -> Self {
        QemError::Calibration {
            reason: reason.into(),
        }
    }
}
