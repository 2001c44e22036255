//! `.npy` arrays: a source of any integer or float dtype, either byte
//! order, C or Fortran order, 4-D or 3-D with `--scan`; and a sink.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::dense::{not_representable, DenseFrames};
use super::describe::{foreign, shape4};
use super::element::{ByteOrder, Narrowing, SourceDtype};
use super::{ConvertError, Description, Options, Sink, Source};
use crate::mapguard::Mapping;
use crate::npy;
use crate::publish::{AtomicFile, Overwrite};
use crate::qem::write::Calibration;

/// A header is at most 1 MiB (see `npy::parse_header`) plus its preamble.
const HEADER_PREFIX: u64 = (1 << 20) + 16;

pub struct NpySource {
    description: Description,
    frames: Frames,
}

enum Frames {
    C(DenseFrames),
    Fortran(FortranFrames),
}

impl NpySource {
    pub fn open(path: &Path, options: &Options) -> Result<NpySource, ConvertError> {
        let mut file = crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
        let len = file
            .metadata()
            .map_err(|e| ConvertError::io(path, e))?
            .len();
        let mut head = Vec::new();
        (&mut file)
            .take(HEADER_PREFIX)
            .read_to_end(&mut head)
            .map_err(|e| ConvertError::io(path, e))?;
        let bad = |e: npy::NpyError| ConvertError::input(path, e.to_string());
        let header = npy::parse_header_any(&head).map_err(bad)?;
        header.header().check_file_len(len).map_err(bad)?;
        let dims: Vec<u64> = header.shape.iter().map(|&d| d as u64).collect();
        let shape = shape4(path, &dims, options.scan)?;
        let source = SourceDtype {
            dtype: header.dtype,
            order: if header.big_endian {
                ByteOrder::Big
            } else {
                ByteOrder::Little
            },
        };
        let narrowing = Narrowing::plan(source, options.allow_float_rounding);
        let calibration = Calibration {
            processing: narrowing.record.iter().cloned().collect(),
            ..Calibration::default()
        };
        let description = foreign(path, shape, narrowing.stored, &calibration, "unknown", &[])?;
        let frame_elements = shape[2] * shape[3];
        let frames = if header.fortran_order {
            Frames::Fortran(FortranFrames::map(
                path,
                &file,
                header.data_offset,
                narrowing,
                dims,
            )?)
        } else {
            Frames::C(DenseFrames::new(
                path,
                file,
                header.data_offset as u64,
                narrowing,
                dims,
                frame_elements,
            ))
        };
        Ok(NpySource {
            description,
            frames,
        })
    }
}

impl Source for NpySource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        match &mut self.frames {
            Frames::C(d) => d.read_frames(first, out),
            Frames::Fortran(f) => f.read_frames(first, out),
        }
    }
}

/// A Fortran-order array, gathered element by element from a mapping.
/// The mapped pages are released after every window, so the resident set
/// stays bounded by the window even though the gather touches the whole
/// file.
struct FortranFrames {
    path: PathBuf,
    map: Mapping,
    data_offset: usize,
    narrowing: Narrowing,
    dims: Vec<u64>,
    /// Column-major strides of `dims`, in elements.
    strides: Vec<u64>,
    scratch: Vec<u8>,
}

impl FortranFrames {
    fn map(
        path: &Path,
        file: &File,
        data_offset: usize,
        narrowing: Narrowing,
        dims: Vec<u64>,
    ) -> Result<FortranFrames, ConvertError> {
        // A file truncated underneath us reads as zeros through the
        // mapguard; `read_frames` checks this mapping's fault count.
        let map = Mapping::map(file).map_err(|e| ConvertError::io(path, e))?;
        let mut strides = Vec::with_capacity(dims.len());
        let mut s = 1;
        for &d in &dims {
            strides.push(s);
            s *= d;
        }
        Ok(FortranFrames {
            path: path.to_path_buf(),
            map,
            data_offset,
            narrowing,
            dims,
            strides,
            scratch: Vec::new(),
        })
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let size = self.narrowing.source.size();
        let nd = self.dims.len();
        let (rows, cols) = (self.dims[nd - 2], self.dims[nd - 1]);
        let pixels = rows * cols;
        let frames = (out.len() / self.narrowing.stored.size()) as u64 / pixels;
        // Offset (elements) of a frame: 4-D frames are (r, c) = divmod(f, C).
        let frame_offset = |f: u64| match nd {
            4 => (f / self.dims[1]) * self.strides[0] + (f % self.dims[1]) * self.strides[1],
            _ => f * self.strides[0],
        };
        self.scratch.resize((frames * pixels) as usize * size, 0);
        let data = &self.map[self.data_offset..];
        for p in 0..pixels {
            let pixel_offset =
                (p / cols) * self.strides[nd - 2] + (p % cols) * self.strides[nd - 1];
            for k in 0..frames {
                let at = ((frame_offset(first + k) + pixel_offset) as usize) * size;
                let to = ((k * pixels + p) as usize) * size;
                self.scratch[to..to + size].copy_from_slice(&data[at..at + size]);
            }
        }
        release(&self.map);
        if self.map.faults() != 0 {
            return Err(ConvertError::input(&self.path, crate::mapguard::CHANGED));
        }
        let start = first * pixels;
        self.narrowing.apply(&self.scratch, out).map_err(|(i, v)| {
            not_representable(
                &self.path,
                &self.narrowing,
                &self.dims,
                start + i as u64,
                &v,
            )
        })
    }
}

/// Drops the mapping's pages from our resident set; they stay in the page
/// cache and are read back from the (unchanged) file when touched again.
fn release(map: &[u8]) {
    if !map.is_empty() {
        // SAFETY: `map` is a whole, page-aligned, read-only file mapping;
        // MADV_DONTNEED on it only discards clean pages.
        unsafe {
            libc::madvise(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                libc::MADV_DONTNEED,
            );
        }
    }
}

/// The frames in C order after a header (a `.npy` header, or none for a
/// raw export), in one file published atomically.
pub struct FileSink {
    target: AtomicFile,
}

impl FileSink {
    pub fn create(path: &Path, header: &[u8], force: bool) -> Result<FileSink, ConvertError> {
        let overwrite = if force {
            Overwrite::Replace
        } else {
            Overwrite::Never
        };
        let mut target = AtomicFile::create(path, overwrite)?;
        target
            .write_all(header)
            .map_err(|e| ConvertError::io(path, e))?;
        Ok(FileSink { target })
    }

    /// A `.npy` of the frames.
    pub fn npy(path: &Path, d: &Description, force: bool) -> Result<FileSink, ConvertError> {
        let shape: Vec<usize> = d.shape.iter().map(|&n| n as usize).collect();
        FileSink::create(path, &npy::encode_header(d.element.npy(), &shape), force)
    }
}

impl Sink for FileSink {
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
        let path = self.target.target().to_path_buf();
        self.target
            .write_all(window)
            .map_err(|e| ConvertError::io(&path, e))
    }

    fn publish(self: Box<Self>) -> Result<(), ConvertError> {
        Ok(self.target.publish()?)
    }
}
