//! The core library of qemfs: exact, fast implementations of the `.qem`
//! (4D-STEM acquisitions) and `.semq` (quantised embedding states) formats.
//!
//! The binaries (`qem`, `semq`, `qemfs`) are thin layers over this crate;
//! nothing here knows about FUSE, GPUs or command lines.
//!
//! # The public API
//!
//! What the binaries, the GPU backends, the tests, benchmarks and fuzz
//! targets use, and nothing more; the rest is `pub(crate)`:
//! - [`qem`]: [`qem::QemFile`] (open, validate, decode), its header and
//!   metadata types, [`qem::write`] (the writer), and the codec modules
//!   the benchmarks and fuzz targets drive directly (`rans`, `stream`,
//!   `tables`, `lanes`, `checksum`);
//! - [`semq`]: [`semq::Encoding`] (read), encode/concat/diff/floor and the
//!   upstream-identical report text in [`semq::report`];
//! - [`convert`]: `qem convert`'s pipeline ([`convert::convert`],
//!   [`convert::Options`]); [`zarr`] and [`export`] the formats it writes;
//! - [`tree`]: the virtual tree that `qemfs mount` and `qem ls`/`cat` serve
//!   ([`tree::Tree`], [`tree::TreeOptions`], [`tree::filesystem`]);
//! - [`reduce`]: virtual detectors and the [`reduce::Accelerator`] trait
//!   the GPU backends implement;
//! - [`sums`]: the `sha256sum`-style lines of `qem hash` and `semq hash`;
//! - [`python_json`]: JSON text and `repr()` as the upstream Python tools
//!   write them;
//! - [`remote`]: `s3://` and `http(s)://` inputs, read by ranges;
//! - [`npy`], [`publish`], [`mapguard`], [`regular_file`], [`cache`],
//!   [`workers`]: the `.npy` header, atomic outputs, the SIGBUS guard for
//!   mapped inputs, checked input reads, the decoded-block cache and the
//!   thread pool behind the mount's reads and the prefetcher.
//!
//! Error enums and the option structs (`TreeOptions`, `convert::Options`,
//! `MetadataOptions`, `DetectorOptions`) are `#[non_exhaustive]`: build
//! options from `Default` and set fields. The format enums a new container
//! version would extend ([`qem::Codec`], [`qem::Dtype`]) are deliberately
//! exhaustive, so that every decoder must handle a new one.

// A `pub` type reachable only through a private module would be an API
// its users cannot name: re-export it or make it `pub(crate)`.
#![warn(unnameable_types)]

pub mod cache;
pub mod contained;
pub mod convert;
pub mod export;
pub mod mapguard;
pub mod npy;
pub(crate) mod pool;
pub mod publish;
pub mod python_json;
pub mod qem;
pub mod reduce;
pub mod regular_file;
pub mod remote;
pub mod semq;
pub mod signals;
pub mod sums;
pub(crate) mod sync;
pub mod tree;
pub mod workers;
pub mod zarr;
