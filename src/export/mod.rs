//! Byte encoders for the files the tree and the CLI present: TIFF pages and
//! PNG previews (`.npy` headers live in [`crate::npy`]).

pub mod png;
pub mod tiff;
