//! The `.qem` container (see `shared/spec/qem.md`).

pub mod checksum;
pub mod envelope;
pub mod error;
pub mod file;
pub mod header;
pub mod json;
pub mod layout;
pub mod metadata;
pub mod rans;
pub mod scaled;
pub mod spatial;
pub mod stream;
pub mod summary;
pub mod tables;
pub mod validate;
pub mod write;
mod xml;

pub use error::{ErrorKind, QemError, StreamFault, StreamSite};
pub use file::{PixelStreams, PixelValues, QemFile};
pub use header::{Codec, Dtype, Header, ValidMask};
pub use layout::{BlockInfo, Chunk};
pub use metadata::{Quantity, ScientificMetadata};
pub use scaled::{IntensityCalibration, Region};
pub use spatial::Tile;
pub use validate::{validate_bytes, validate_path, ValidationLevel, ValidationReport};

// Frame and array sizes are products of 24-bit axes; they need 64-bit usize.
const _: () = assert!(usize::BITS >= 64);
