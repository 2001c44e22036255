//! Byte encoders for the files the tree and the CLI present: TIFF pages and
//! PNG previews, and masked exports (`.npy` headers live in [`crate::npy`]).

pub mod masked;
pub mod png;
pub mod tiff;
