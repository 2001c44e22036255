//! The `.qem` container (see `shared/spec/qem.md`).
//!
//! Reading: [`QemFile::open`] (memory-mapped) or [`QemFile::from_bytes`]
//! checks the envelope, the header, the scientific metadata and the chunk
//! table; body bytes are verified per 64 MiB checksum block on first use.
//! Access paths, all decoding in parallel with rayon:
//! [`QemFile::read_frame`], [`QemFile::read_frames`],
//! [`QemFile::decode_block`] (a 512-scan block, or a float chunk; see
//! [`QemFile::blocks`] for the global index, frame range and decoded size),
//! [`QemFile::decode_pixels`], [`QemFile::read_all`],
//! [`QemFile::read_all_codes`] / [`QemFile::decode_block_codes`] (stored
//! u16 values), [`QemFile::spatial_sums`] (tile sums without decoding).
//! [`QemFile::validate`] runs the `quick` or `full` checks and returns a
//! [`ValidationReport`].

pub(crate) mod block;
pub mod checksum;
pub(crate) mod envelope;
pub(crate) mod error;
pub(crate) mod file;
pub(crate) mod frame_major;
pub(crate) mod header;
pub(crate) mod json;
pub mod lanes;
pub(crate) mod layout;
pub(crate) mod logical;
pub mod metadata;
pub mod partial_index;
pub mod rans;
pub(crate) mod scaled;
pub(crate) mod spatial;
pub mod stream;
pub(crate) mod summary;
pub mod tables;
pub(crate) mod validate;
pub mod write;
mod xml;

pub use block::{BlockCursor, WINDOW_BYTES};
pub use error::{ErrorKind, QemError, StreamFault, StreamSite};
pub use file::{FileDigest, PixelStreams, PixelValues, QemFile, RawBlockStreams, HEADER_GUESS};
pub use header::{Codec, Dtype, Header, ValidMask};
pub use layout::{BlockInfo, Chunk, SpatialArrays};
pub use logical::LogicalDigest;
pub use metadata::{Quantity, ScientificMetadata};
pub use partial_index::{IndexCheck, IndexCoverage};
pub use scaled::{IntensityCalibration, Region};
pub use spatial::Tile;
pub use summary::Info;
pub use validate::{validate_bytes, validate_path, ValidationLevel, ValidationReport};

// Frame and array sizes are products of 24-bit axes; they need 64-bit usize.
const _: () = assert!(usize::BITS >= 64);
