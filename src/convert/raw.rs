//! Raw binary: a dense C-order array whose shape and dtype the user gives
//! (`--shape`, `--dtype`), since the file carries neither.

use std::path::Path;

use super::dense::DenseFrames;
use super::describe::foreign;
use super::element::Narrowing;
use super::{ConvertError, Description, Options, Source};
use crate::qem::write::Calibration;

pub struct RawSource {
    description: Description,
    frames: DenseFrames,
}

impl RawSource {
    pub fn open(path: &Path, options: &Options) -> Result<RawSource, ConvertError> {
        let Some(layout) = options.raw else {
            return Err(ConvertError::input(
                path,
                "not a recognised format (.npy, .qem, TIFF, EMPAD .xml, Merlin .mib, HDF5); raw input needs --shape and --dtype",
            ));
        };
        let file = crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
        let len = file
            .metadata()
            .map_err(|e| ConvertError::io(path, e))?
            .len();
        let shape = layout.shape;
        let need = shape
            .iter()
            .try_fold(layout.dtype.size() as u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| ConvertError::input(path, "shape too large"))?;
        if need != len {
            return Err(ConvertError::input(
                path,
                format!(
                    "holds {len} bytes, but shape {shape:?} of {} needs {need}",
                    layout.dtype.dtype
                ),
            ));
        }
        let narrowing = Narrowing::plan(layout.dtype, options.allow_float_rounding);
        let calibration = Calibration {
            processing: narrowing.record.iter().cloned().collect(),
            ..Calibration::default()
        };
        let description = foreign(path, shape, narrowing.stored, &calibration, "unknown", &[])?;
        let frames = DenseFrames::new(
            path,
            file,
            0,
            narrowing,
            shape.to_vec(),
            shape[2] * shape[3],
        );
        Ok(RawSource {
            description,
            frames,
        })
    }
}

impl Source for RawSource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        self.frames.read_frames(first, out)
    }
}

/// What a raw file holds and the command that reads it back, since the
/// file itself says neither.
pub fn raw_layout_note(path: &Path, shape: [u64; 4], element: super::Element) -> String {
    let dims = shape.map(|n| n.to_string()).join(",");
    let shown = path.display().to_string();
    // Quoted for the shell when it needs it, so the line can be pasted.
    let quoted = if shown
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c))
    {
        shown.clone()
    } else {
        format!("'{}'", shown.replace('\'', "'\\''"))
    };
    format!(
        "{shown}: shape {dims} (scan_row, scan_column, detector_row, detector_column), dtype {}, little-endian, C order, no header\nread it back with: qem convert {quoted} OUT.qem --shape {dims} --dtype {}",
        element.name(),
        element.name(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_names_the_layout_and_a_command_that_pastes() {
        let note = raw_layout_note(
            Path::new("/d/a b's.raw"),
            [2, 3, 4, 5],
            super::super::Element::F32,
        );
        let lines: Vec<&str> = note.lines().collect();
        assert!(
            lines[0].starts_with("/d/a b's.raw: shape 2,3,4,5 "),
            "{note}"
        );
        assert!(lines[0].contains("dtype float32, little-endian, C order"));
        assert_eq!(
            lines[1],
            "read it back with: qem convert '/d/a b'\\''s.raw' OUT.qem --shape 2,3,4,5 --dtype float32"
        );
        let plain = raw_layout_note(
            Path::new("x/y.raw"),
            [1, 1, 1, 1],
            super::super::Element::U8,
        );
        assert!(plain.ends_with("qem convert x/y.raw OUT.qem --shape 1,1,1,1 --dtype uint8"));
    }
}
