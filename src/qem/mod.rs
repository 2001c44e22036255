//! The `.qem` container (see `shared/spec/qem.md`).

pub mod tables;
pub mod write;
