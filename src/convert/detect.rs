//! Recognising an input's format from its first bytes, not its name.

use std::io::Read;
use std::path::Path;

use super::ConvertError;

/// The formats `qem convert` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceFormat {
    Npy,
    Qem,
    /// An EMPAD XML description (its `.raw` beside it).
    Empad,
    /// A Quantum Detectors Merlin `.mib`.
    Mib,
    /// A TIFF stack (classic or BigTIFF, either byte order).
    Tiff,
    /// HDF5 (a DECTRIS master file).
    Hdf5,
    /// A Zarr store (a folder).
    Zarr,
    /// Anything unrecognised: raw binary, described by `--shape`/`--dtype`.
    Raw,
}

/// Bytes read to recognise a format.
const SNIFF: usize = 512;

/// The format of the file at `path`, from its content.
///
/// A URL is read by ranges, and only a `.qem` object is taken: the other
/// formats' readers read local files.
pub fn detect(path: &Path) -> Result<SourceFormat, ConvertError> {
    if let Some(address) = crate::remote::Address::of_path(path) {
        let head = address
            .and_then(|a| {
                let object = crate::remote::Object::open(&a)?;
                let opening = object.opening();
                Ok(opening.slice(..opening.len().min(SNIFF)))
            })
            .map_err(|e| ConvertError::io(path, e.into_io()))?;
        return match recognise(&head) {
            SourceFormat::Qem => Ok(SourceFormat::Qem),
            _ => Err(ConvertError::input(
                path,
                "a remote input converts when it is a .qem file; download other formats first",
            )),
        };
    }
    if path.is_dir() {
        return Ok(SourceFormat::Zarr);
    }
    let mut head = Vec::with_capacity(SNIFF);
    crate::regular_file::open(path)
        .and_then(|f| f.take(SNIFF as u64).read_to_end(&mut head))
        .map_err(|e| ConvertError::io(path, e))?;
    Ok(recognise(&head))
}

fn recognise(head: &[u8]) -> SourceFormat {
    if head.starts_with(crate::npy::MAGIC) {
        return SourceFormat::Npy;
    }
    if [&b"QEMDATA1"[..], b"QGPUSTRM", b"QGANS"]
        .iter()
        .any(|m| head.starts_with(m))
    {
        return SourceFormat::Qem;
    }
    if [&b"II*\0"[..], b"MM\0*", b"II+\0", b"MM\0+"]
        .iter()
        .any(|m| head.starts_with(m))
    {
        return SourceFormat::Tiff;
    }
    if head.starts_with(super::dectris::MAGIC) {
        return SourceFormat::Hdf5;
    }
    if super::mib::looks_like(head) {
        return SourceFormat::Mib;
    }
    if super::empad::looks_like(head) {
        return SourceFormat::Empad;
    }
    SourceFormat::Raw
}
