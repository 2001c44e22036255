//! The error classes of the format (spec section 11).

use std::fmt;
use std::path::PathBuf;

/// Section of a file image named by a [`SemqError::Format`] (spec section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    Framing = 0,
    Config = 1,
    Sizes = 2,
    Ids = 3,
    Manifest = 4,
    /// Never produced by SEMQ 1.1; kept so that the numbering matches the spec.
    Footer = 5,
    Rows = 6,
}

impl Section {
    /// The number used for this section in error payloads.
    pub fn number(self) -> u8 {
        self as u8
    }

    pub fn name(self) -> &'static str {
        match self {
            Section::Framing => "framing",
            Section::Config => "config",
            Section::Sizes => "sizes",
            Section::Ids => "ids",
            Section::Manifest => "manifest",
            Section::Footer => "footer",
            Section::Rows => "rows",
        }
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of the two footer digests disagreed with the recomputed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    Content,
    State,
}

impl Which {
    pub fn name(self) -> &'static str {
        match self {
            Which::Content => "content",
            Which::State => "state",
        }
    }
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every failure of the `.semq` library. The class and its payload
/// (`row`, `field`, `section`, `which`) are the contract; messages are
/// informative English sentences and never contain input data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SemqError {
    /// An argument violates its contract.
    #[error("{message}")]
    InvalidInput {
        message: String,
        row: Option<u64>,
        field: Option<u64>,
    },
    /// Two things that must share a config, id kind or reference do not.
    #[error("{message}")]
    Incompatible { message: String, field: Option<u64> },
    /// A file image that is not a valid version 2 image.
    #[error("{message} ({section} section{})", row.map(|r| format!(", row {r}")).unwrap_or_default())]
    Format {
        section: Section,
        row: Option<u64>,
        message: String,
    },
    /// A recomputed digest differs from the footer.
    #[error("{}", match which { Which::Content => "content digest does not match the footer", Which::State => "state id does not match the footer" })]
    Integrity { which: Which },
    /// The floating-point environment is not round-to-nearest.
    #[error("unsupported: {operation}")]
    Unsupported { operation: String },
    /// The file could not be opened, read, mapped or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SemqError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        SemqError::InvalidInput {
            message: message.into(),
            row: None,
            field: None,
        }
    }

    pub(crate) fn invalid_at(
        message: impl Into<String>,
        row: Option<u64>,
        field: Option<u64>,
    ) -> Self {
        SemqError::InvalidInput {
            message: message.into(),
            row,
            field,
        }
    }

    pub(crate) fn incompatible(message: impl Into<String>, field: Option<u64>) -> Self {
        SemqError::Incompatible {
            message: message.into(),
            field,
        }
    }

    pub(crate) fn format(section: Section, message: impl Into<String>) -> Self {
        SemqError::Format {
            section,
            row: None,
            message: message.into(),
        }
    }

    /// The class name used by the spec and the conformance fixtures.
    pub fn class(&self) -> &'static str {
        match self {
            SemqError::InvalidInput { .. } => "InvalidInput",
            SemqError::Incompatible { .. } => "Incompatible",
            SemqError::Format { .. } => "FormatError",
            SemqError::Integrity { .. } => "IntegrityError",
            SemqError::Unsupported { .. } => "Unsupported",
            SemqError::Io { .. } => "Io",
        }
    }

    pub fn row(&self) -> Option<u64> {
        match self {
            SemqError::InvalidInput { row, .. } | SemqError::Format { row, .. } => *row,
            _ => None,
        }
    }

    pub fn field(&self) -> Option<u64> {
        match self {
            SemqError::InvalidInput { field, .. } | SemqError::Incompatible { field, .. } => *field,
            _ => None,
        }
    }

    pub fn section(&self) -> Option<Section> {
        match self {
            SemqError::Format { section, .. } => Some(*section),
            _ => None,
        }
    }

    pub fn which(&self) -> Option<Which> {
        match self {
            SemqError::Integrity { which } => Some(*which),
            _ => None,
        }
    }

    /// The message without the payload decoration of `Display`.
    pub fn message(&self) -> String {
        match self {
            SemqError::InvalidInput { message, .. }
            | SemqError::Incompatible { message, .. }
            | SemqError::Format { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

pub type Result<T, E = SemqError> = std::result::Result<T, E>;
