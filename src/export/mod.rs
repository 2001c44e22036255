//! Byte encoders for the files the tree and the CLI present: TIFF pages,
//! PNG previews, pretty JSON and masked exports (`.npy` headers live in
//! [`crate::npy`]).

pub mod json;
pub(crate) mod masked;
pub mod png;
pub(crate) mod tiff;
