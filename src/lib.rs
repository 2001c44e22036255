//! The core library of qemfs: exact, fast implementations of the `.qem`
//! (4D-STEM acquisitions) and `.semq` (quantised embedding states) formats.
//!
//! The binaries (`qem`, `semq`, `qemfs`) are thin layers over this crate;
//! nothing here knows about FUSE, GPUs or command lines.

pub mod cache;
pub mod convert;
pub mod export;
pub mod mapguard;
pub mod npy;
pub mod publish;
pub mod python_json;
pub mod qem;
pub mod reduce;
pub mod regular_file;
pub mod semq;
pub(crate) mod sync;
pub mod tree;
pub mod zarr;
