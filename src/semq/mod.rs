//! The `.semq` format (see `shared/spec/semq.md`): quantised embedding
//! states, their file image, identities, diff, concat and floors.
//!
//! An [`Encoding`] is one verified state held as its canonical file image
//! ([`Encoding::open`] maps large files without copying rows). States come
//! from files, from [`encode()`] (float32 vectors), [`from_rows`] or
//! [`from_symbols`]; [`Encoding::diff`], [`concat()`] and the floor functions
//! ([`measure`], [`within`], [`evaluate`]) operate on them, and [`report`]
//! renders what the `semq` command prints.

pub mod concat;
pub(crate) mod config;
pub(crate) mod diff;
pub mod encode;
pub(crate) mod encoding;
pub(crate) mod error;
pub mod floor;
pub mod identity;
pub(crate) mod ids;
pub(crate) mod manifest;
pub(crate) mod read;
pub mod report;
pub mod rows;
pub(crate) mod write;

pub use concat::concat;
pub use config::{Config, ConfigFault, Operator};
pub use diff::{Diff, ManifestChange};
pub use encode::{encode, encode_with_progress, from_rows, from_symbols};
pub use encoding::Encoding;
pub use error::{Section, SemqError, Which};
pub use floor::{evaluate, measure, within, Floor, FloorFields, Reason, Verdict};
pub use identity::{from_hex, to_hex, Digest32};
pub use ids::{Id, IdKind, IdList, IdRef};
pub use manifest::Manifest;
pub use read::Progress;
pub use write::write_new_file;
