//! Reductions of `.qem` acquisitions: virtual detector images, centre of
//! mass, mean and maximum patterns (semantics in spec §13).
//!
//! [`Accelerator`] is the seam between planning and computing: the CPU
//! reference ([`Cpu`]) and the GPU backends of the `qemfs-gpu` crate
//! implement it and must agree (integers exactly, floats within the
//! documented tolerance). [`Reducer`] plans the products for any backend;
//! [`geometry`] builds masks and finds the bright-field disk.

pub(crate) mod accelerator;
mod cpu;
pub mod geometry;
pub(crate) mod idpc;
mod neumaier;
mod products;

pub use accelerator::{
    Accelerator, Moments, Partial, Pattern, PixelSet, ReduceError, Request, Values,
};
pub use cpu::Cpu;
pub use neumaier::Neumaier;
pub use products::{image_kinds, mean_subtracted, Full, Image, ImageKind, MaxPattern, Reducer};
