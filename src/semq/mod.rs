//! The `.semq` format (see `shared/spec/semq.md`): quantised embedding
//! states, their file image, identities, diff, concat and floors.

pub mod concat;
pub mod config;
pub mod diff;
pub mod encode;
pub mod encoding;
pub mod error;
pub mod floor;
pub mod identity;
pub mod ids;
pub mod manifest;
pub mod read;
pub mod report;
pub mod rows;
pub mod write;

pub use config::{Config, Operator};
pub use diff::{Diff, ManifestChange};
pub use encode::{encode, from_rows, from_symbols};
pub use encoding::Encoding;
pub use error::{Section, SemqError, Which};
pub use floor::{Floor, Reason, Verdict};
pub use identity::{to_hex, Digest32};
pub use ids::{Id, IdKind, IdList, IdRef};
pub use manifest::Manifest;
