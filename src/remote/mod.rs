//! Objects read by byte ranges: `s3://BUCKET/KEY` and `http://`/`https://`
//! URLs wherever a command or the library takes a file.
//!
//! The stores are `object_store`'s (its S3 and HTTP clients: signing,
//! retries with backoff, time-outs). What this module adds:
//! - [`Address`]: which inputs are URLs, and which store and key they name;
//! - [`options`]: the endpoint, region and credentials the AWS way, for the
//!   whole process;
//! - [`Object`]: one opened object, every range of it pinned to the version
//!   seen when it was opened (ETag, else size and modification time), so
//!   that a replaced object fails a read instead of mixing two versions;
//! - [`listing`]: the folders and objects under an S3 prefix (a mounted
//!   prefix is that tree of keys);
//! - [`Staged`]: an object's bytes staged by ranges into an unlinked local
//!   file of its size and mapped, so that the readers (which address a file
//!   as one slice) read what was fetched, and fetch only what they touch.
//!
//! Errors say what happened in words ("no such bucket", "access denied",
//! "the server does not support Range requests"), never an OS errno: see
//! [`RemoteError`].

mod address;
mod error;
pub mod listing;
mod object;
pub mod options;
mod runtime;
mod staged;

pub use address::Address;
pub use error::RemoteError;
pub use object::{Object, Version, OPENING_BYTES};
pub use options::StoreOptions;
pub use staged::Staged;

/// Bytes one request asks for at most: a large range is split into parts
/// of this size fetched concurrently, which hides the round trip of each.
pub const PART_BYTES: u64 = 8 << 20;

/// Requests in flight at once for one range.
pub const CONCURRENT_PARTS: usize = 8;
