//! The interface between the reductions and whatever computes them.
//!
//! An [`Accelerator`] reduces the *stored* values of a run of blocks: integer
//! counts and the scaled codec's codes as exact integers, float32 lanes
//! joined to float32 with compensated float32 sums ([`super::Neumaier`]). Everything that
//! is the same for every backend (planning which pixels a mask needs, the
//! spatial-sum shortcut, calibration of scaled codes, centre-of-mass
//! division, mean subtraction, float32 rounding of exact results) happens in
//! [`super`], once, so backends stay small and comparable bit for bit.
//!
//! Invalid pixels (the header's `valid` mask) read as 0 in every product.

use std::ops::Range;

use crate::qem::{QemError, QemFile};

/// A set of detector pixels (row-major indices `row * columns + column`),
/// sorted and without repeats.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PixelSet {
    pixels: Vec<u32>,
}

impl PixelSet {
    /// Sorts and deduplicates `pixels`.
    pub fn new(mut pixels: Vec<u32>) -> Self {
        pixels.sort_unstable();
        pixels.dedup();
        PixelSet { pixels }
    }

    pub fn pixels(&self) -> &[u32] {
        &self.pixels
    }

    pub fn len(&self) -> usize {
        self.pixels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pixels.is_empty()
    }

    /// One byte per detector pixel, 1 where selected.
    pub fn bitmap(&self, detector_pixels: usize) -> Vec<u8> {
        let mut map = vec![0u8; detector_pixels];
        for &p in &self.pixels {
            if let Some(b) = map.get_mut(p as usize) {
                *b = 1;
            }
        }
        map
    }
}

/// What to compute over a run of blocks. Every product covers valid pixels
/// only.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Per-frame sums over each set.
    pub masks: Vec<PixelSet>,
    /// Per-frame total and first moments (`Σ row·I`, `Σ column·I`) over the
    /// whole detector.
    pub moments: bool,
    /// Per-pixel sum and maximum over the frames.
    pub pattern: bool,
    /// Float codec only: a detector-shaped plane subtracted (in float32)
    /// from every value before any product (the saved mean-dark recipe).
    pub background: Option<Vec<f32>>,
}

/// Values of one product: exact integers for integer counts and scaled
/// codes, compensated float32 for float sources.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Exact(Vec<u64>),
    Float(Vec<f32>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::Exact(v) => v.len(),
            Values::Float(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The exact values, if these are.
    pub fn exact(self) -> Option<Vec<u64>> {
        match self {
            Values::Exact(v) => Some(v),
            Values::Float(_) => None,
        }
    }

    /// The float32 values, if these are.
    pub fn float(self) -> Option<Vec<f32>> {
        match self {
            Values::Float(v) => Some(v),
            Values::Exact(_) => None,
        }
    }
}

/// Per-frame total and first moments over all valid pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Moments {
    pub total: Values,
    /// `Σ row · I`, zero-based detector row.
    pub row: Values,
    /// `Σ column · I`, zero-based detector column.
    pub column: Values,
}

/// Per-pixel sum and maximum over the frames (0 at invalid pixels).
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    pub sum: Values,
    /// For integer sources the exact maximum of the stored values (≤ 65535);
    /// for floats the float32 maximum, NaN where any value is NaN.
    pub max: Values,
}

/// The products of one [`Request`] over a run of blocks. Per-frame vectors
/// hold one value per frame of the run, in frame order.
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    /// One per entry of [`Request::masks`].
    pub masks: Vec<Values>,
    pub moments: Option<Moments>,
    pub pattern: Option<Pattern>,
}

/// Why a reduction failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReduceError {
    /// The file's data could not be decoded (names chunk and stream).
    #[error(transparent)]
    Decode(#[from] QemError),
    /// The backend failed (device lost, out of memory, shader error).
    #[error("{backend}: {reason}")]
    Backend {
        backend: &'static str,
        reason: String,
    },
    /// The request cannot be served for this file.
    #[error("{0}")]
    Unsupported(String),
}

/// A backend for reductions: the CPU reference ([`super::Cpu`]) or a GPU.
pub trait Accelerator: Send + Sync {
    /// A short name for logs and `info.json` (`cpu`, `wgpu`, `cuda`).
    fn name(&self) -> &str;

    /// Reduces blocks `blocks` (global block indices, see
    /// [`QemFile::blocks`]) of `file`. The frames covered are those of the
    /// blocks, contiguous and in order.
    fn reduce(
        &self,
        file: &QemFile,
        blocks: Range<usize>,
        request: &Request,
    ) -> Result<Partial, ReduceError>;
}
