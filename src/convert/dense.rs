//! Reading frames of a dense C-order array at a known offset of a file
//! (`.npy`, raw binary), with positioned reads into a reused buffer so that
//! memory stays bounded by the window, converting each element by the
//! exact-narrowing rule.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::element::{multi_index, Narrowing};
use super::ConvertError;

pub struct DenseFrames {
    file: File,
    path: PathBuf,
    data_offset: u64,
    narrowing: Narrowing,
    /// The array's own dimensions (for naming an element in messages).
    dims: Vec<u64>,
    /// Elements per frame.
    frame_elements: u64,
    scratch: Vec<u8>,
}

impl DenseFrames {
    pub fn new(
        path: &Path,
        file: File,
        data_offset: u64,
        narrowing: Narrowing,
        dims: Vec<u64>,
        frame_elements: u64,
    ) -> DenseFrames {
        DenseFrames {
            file,
            path: path.to_path_buf(),
            data_offset,
            narrowing,
            dims,
            frame_elements,
            scratch: Vec::new(),
        }
    }

    pub fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let size = self.narrowing.source.size() as u64;
        let elements = (out.len() / self.narrowing.stored.size()) as u64;
        let start = first * self.frame_elements;
        self.scratch.resize((elements * size) as usize, 0);
        self.file
            .read_exact_at(&mut self.scratch, self.data_offset + start * size)
            .map_err(|e| ConvertError::io(&self.path, e))?;
        self.narrowing
            .apply(&self.scratch, out)
            .map_err(|(i, value)| {
                not_representable(
                    &self.path,
                    &self.narrowing,
                    &self.dims,
                    start + i as u64,
                    &value,
                )
            })
    }
}

/// The error for an element that cannot be stored exactly.
pub fn not_representable(
    path: &Path,
    narrowing: &Narrowing,
    dims: &[u64],
    index: u64,
    value: &str,
) -> ConvertError {
    let source = narrowing.source.dtype.name();
    let stored = narrowing.stored.name();
    let hint = if narrowing.source.dtype == crate::npy::DType::F64 {
        " (--allow-float-rounding stores the nearest float32 and records it in processing)"
    } else {
        ""
    };
    ConvertError::input(
        path,
        format!(
            "element {} = {value} of this {source} array is not exactly representable as {stored}{hint}",
            multi_index(index, dims)
        ),
    )
}
