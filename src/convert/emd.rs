//! EMD 1.0 (HDF5) output, in the layout py4DSTEM (0.14 and later, through
//! emdfile) reads back as a `DataCube` with its calibration, and that h5py,
//! rosettasciio's EMD reader and our own HDF5 import read too:
//!
//! ```text
//! /                       emd_group_type "file", version_major 1, version_minor 0, authoring_program
//! /datacube_root          emd_group_type "root", python_class "Root"
//!   metadatabundle/       emd_group_type "metadatabundle"
//!     calibration/        emd_group_type "metadata", python_class "Calibration":
//!                         R_pixel_size, R_pixel_units, Q_pixel_size, Q_pixel_units
//!                         (one dataset each, with a `type` attribute "number" / "string"),
//!                         _root_treepath "" and _target_paths ["/datacube"]: the nodes
//!                         py4DSTEM.read calibrates from it
//!     qem/                emd_group_type "metadata", python_class "Metadata":
//!                         scientific_metadata (the .qem JSON, for people and tools),
//!                         valid_mask (counts files with one: bool, detector-shaped, true = valid)
//!   datacube/             emd_group_type "array", python_class "DataCube"
//!     data                (scan_row, scan_column, detector_row, detector_column), units attribute
//!     dim0 … dim3         [0, step] per axis, with `name` (Rx Ry Qx Qy) and `units`
//! ```
//!
//! Our HDF5 import reads this layout back: the values, the calibration,
//! the mask and (from `qem/scientific_metadata`) the original metadata.
//!
//! The layout facts come from emdfile's and py4DSTEM's readers (the EMD 1.0
//! specification at emdatasets.com): dimension vectors are numbered from 0,
//! a linear one is stored as its first two values, strings are UTF-8, and
//! py4DSTEM's Q units must be `A^-1`, `mrad` or `pixels`. py4DSTEM keeps one
//! R and one Q pixel size: the calibration group holds the scan-row and
//! detector-row steps, while the dimension vectors keep every axis's own.
//!
//! `data` is chunked by scan block (the rule of [`crate::zarr::layout`]: one
//! 512-scan block's frames, whole scan rows when a row is shorter) and
//! written one whole chunk band at a time, so every chunk is compressed
//! once. `--hdf5-compression gzip` adds the standard shuffle and deflate
//! filters, which every HDF5 reader has.
//!
//! The file is written by the HDF5 library into a temporary sibling and
//! published by [`crate::publish::AtomicFile`]: never half-written under its
//! final name.

use std::path::{Path, PathBuf};

use hdf5_metno as h5;
use hdf5_metno::types::VarLenUnicode;

use super::element::Element;
use super::{ConvertError, Description, Sink};
use crate::publish::{AtomicFile, Overwrite};
use crate::qem::header::INTERVAL;
use crate::qem::{Quantity, ScientificMetadata};

/// The root and array group names py4DSTEM gives a new `DataCube`.
pub const ROOT: &str = "datacube_root";
pub const ARRAY: &str = "datacube";

/// Chunk compression of a written EMD file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    #[default]
    None,
    /// Byte shuffle, then deflate (gzip) level 4.
    Gzip,
}

/// `(step, unit)` of a scan axis in the units an EMD reader knows.
fn scan_step(q: &Quantity) -> Option<(f64, &'static str)> {
    let unit = match q.unit.trim() {
        "angstrom" | "A" | "Å" => "A",
        "nm" => "nm",
        "pm" => "pm",
        "m" => "m",
        _ => return None,
    };
    Some((q.value, unit))
}

/// `(step, unit)` of a detector axis in py4DSTEM's Q units.
fn detector_step(q: &Quantity) -> Option<(f64, &'static str)> {
    let unit = match q.unit.trim() {
        "mrad" => "mrad",
        "1/angstrom" | "1/A" | "1/Å" | "A^-1" => "A^-1",
        _ => return None,
    };
    Some((q.value, unit))
}

/// One axis as written: its dimension vector's step, unit and name.
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    step: f64,
    unit: String,
    name: &'static str,
}

/// The four axes of `metadata`, uncalibrated ones in pixels.
fn axes(metadata: &ScientificMetadata) -> [Axis; 4] {
    const NAMES: [&str; 4] = ["Rx", "Ry", "Qx", "Qy"];
    std::array::from_fn(|i| {
        let q = metadata.effective_axis_sampling(i);
        let known = q
            .and_then(|q| {
                if i < 2 {
                    scan_step(q)
                } else {
                    detector_step(q)
                }
            })
            .filter(|(v, _)| v.is_finite() && *v > 0.0);
        match known {
            Some((step, unit)) => Axis {
                step,
                unit: unit.into(),
                name: NAMES[i],
            },
            None => Axis {
                step: 1.0,
                unit: "pixels".into(),
                name: NAMES[i],
            },
        }
    })
}

fn text(s: &str) -> h5::Result<VarLenUnicode> {
    s.parse::<VarLenUnicode>()
        .map_err(|e| h5::Error::from(format!("{s:?}: {e}")))
}

fn attr_text(loc: &h5::Location, name: &str, value: &str) -> h5::Result<()> {
    loc.new_attr::<VarLenUnicode>()
        .create(name)?
        .write_scalar(&text(value)?)
}

fn attr_int(loc: &h5::Location, name: &str, value: i64) -> h5::Result<()> {
    loc.new_attr::<i64>().create(name)?.write_scalar(&value)
}

/// An EMD node group: `emd_group_type` and, for data nodes, `python_class`.
fn node(parent: &h5::Group, name: &str, kind: &str, class: Option<&str>) -> h5::Result<h5::Group> {
    let g = parent.create_group(name)?;
    attr_text(&g, "emd_group_type", kind)?;
    if let Some(class) = class {
        attr_text(&g, "python_class", class)?;
    }
    Ok(g)
}

/// An emdfile `Metadata` entry: a scalar dataset with its `type`.
fn metadata_number(group: &h5::Group, key: &str, value: f64) -> h5::Result<()> {
    let ds = group.new_dataset::<f64>().create(key)?;
    ds.write_scalar(&value)?;
    attr_text(&ds, "type", "number")
}

fn metadata_text(group: &h5::Group, key: &str, value: &str) -> h5::Result<()> {
    let ds = group.new_dataset::<VarLenUnicode>().create(key)?;
    ds.write_scalar(&text(value)?)?;
    attr_text(&ds, "type", "string")
}

/// Everything but the frames: header attributes, root, calibration and
/// the (empty, chunked) `data` dataset with its dimension vectors.
fn layout(
    file: &h5::File,
    d: &Description,
    chunk: [usize; 4],
    compression: Compression,
) -> h5::Result<h5::Dataset> {
    attr_text(file, "emd_group_type", "file")?;
    attr_int(file, "version_major", 1)?;
    attr_int(file, "version_minor", 0)?;
    attr_text(
        file,
        "authoring_program",
        concat!("qemfs ", env!("CARGO_PKG_VERSION")),
    )?;
    let root = node(file, ROOT, "root", Some("Root"))?;
    let bundle = node(&root, "metadatabundle", "metadatabundle", None)?;
    let metadata = ScientificMetadata::parse(&d.scientific_metadata, &d.shape)
        .map_err(|e| h5::Error::from(e.to_string()))?;
    let axes = axes(&metadata);
    let calibration = node(&bundle, "calibration", "metadata", Some("Calibration"))?;
    metadata_number(&calibration, "R_pixel_size", axes[0].step)?;
    metadata_text(&calibration, "R_pixel_units", &axes[0].unit)?;
    metadata_number(&calibration, "Q_pixel_size", axes[2].step)?;
    metadata_text(&calibration, "Q_pixel_units", &axes[2].unit)?;
    // py4DSTEM.read re-links the calibration to the nodes listed here, and
    // only those get their dimension vectors from it.
    metadata_text(&calibration, "_root_treepath", "")?;
    let targets = calibration.create_group("_target_paths")?;
    attr_text(&targets, "type", "list_of_strings")?;
    attr_int(&targets, "length", 1)?;
    let target = targets.new_dataset::<VarLenUnicode>().create("0")?;
    target.write_scalar(&text(&format!("/{ARRAY}"))?)?;
    let qem = node(&bundle, "qem", "metadata", Some("Metadata"))?;
    metadata_text(
        &qem,
        "scientific_metadata",
        &d.scientific_metadata.to_string(),
    )?;
    if let Some(valid) = d.valid() {
        // Metadata, not a data node: a second node would make py4DSTEM.read
        // return the root instead of the DataCube, and rosettasciio would
        // stack it with the data.
        let ds = qem
            .new_dataset::<bool>()
            .shape([d.shape[2] as usize, d.shape[3] as usize])
            .create("valid_mask")?;
        ds.write_raw(valid)?;
        attr_text(&ds, "type", "array")?;
    }

    let array = node(&root, ARRAY, "array", Some("DataCube"))?;
    let shape: Vec<usize> = d.shape.iter().map(|&n| n as usize).collect();
    macro_rules! create {
        ($t:ty) => {{
            let mut b = array.new_dataset::<$t>();
            if shape.iter().all(|&n| n > 0) {
                b = b.chunk(chunk);
                if compression == Compression::Gzip {
                    b = b.shuffle().deflate(4);
                }
            }
            b.shape(shape.clone()).create("data")?
        }};
    }
    let data = match d.element {
        Element::U8 => create!(u8),
        Element::U16 => create!(u16),
        Element::F32 => create!(f32),
    };
    let units = match d.element {
        Element::F32 => "intensity",
        _ => "counts",
    };
    attr_text(&data, "units", units)?;
    dims(&array, &axes)?;
    Ok(data)
}

/// The dimension vectors `dim0`… of an array group.
fn dims(array: &h5::Group, axes: &[Axis]) -> h5::Result<()> {
    for (i, axis) in axes.iter().enumerate() {
        let dim = array
            .new_dataset::<f64>()
            .shape(2)
            .create(format!("dim{i}").as_str())?;
        dim.write_raw(&[0.0, axis.step])?;
        attr_text(&dim, "name", axis.name)?;
        attr_text(&dim, "units", &axis.unit)?;
    }
    Ok(())
}

/// An EMD 1.0 file being written: frames arrive in scan order and leave in
/// whole chunk bands.
pub struct EmdSink {
    path: PathBuf,
    shape: [u64; 4],
    element: Element,
    /// Scan rows and columns of one chunk.
    chunk: [u64; 2],
    frame_bytes: usize,
    /// Frames not yet written, starting at frame `pending_first`.
    pending: Vec<u8>,
    pending_first: u64,
    data: h5::Dataset,
    file: h5::File,
    target: AtomicFile,
}

impl EmdSink {
    pub fn create(
        path: &Path,
        d: &Description,
        force: bool,
        compression: Compression,
    ) -> Result<EmdSink, ConvertError> {
        let overwrite = if force {
            Overwrite::Replace
        } else {
            Overwrite::Never
        };
        let target = AtomicFile::create(path, overwrite)?;
        let fail = |e: h5::Error| ConvertError::input(path, format!("writing HDF5: {e}"));
        let [rows, columns, h, w] = d.shape.map(|n| n as usize);
        let scan = crate::zarr::layout::scan_chunk(rows, columns, INTERVAL, d.frame_bytes());
        // By name: the library creates the file anew if it is gone.
        let file =
            crate::publish::by_path(|| h5::File::create(target.temp_path())).map_err(fail)?;
        let data = layout(&file, d, [scan[0], scan[1], h, w], compression).map_err(fail)?;
        Ok(EmdSink {
            path: path.to_path_buf(),
            shape: d.shape,
            element: d.element,
            chunk: scan.map(|n| n as u64),
            frame_bytes: d.frame_bytes(),
            pending: Vec::new(),
            pending_first: 0,
            data,
            file,
            target,
        })
    }

    /// The frame after the chunk band that starts at frame `first`: whole
    /// scan rows when a chunk holds several, else one chunk of a row.
    fn band_end(&self, first: u64) -> u64 {
        let [rows, columns, ..] = self.shape;
        let (row, column) = (first / columns, first % columns);
        if self.chunk[0] > 1 {
            (row + self.chunk[0]).min(rows) * columns
        } else {
            row * columns + (column + self.chunk[1]).min(columns)
        }
    }

    /// Writes frames `first..end` (one band) from `pending[at..]`.
    fn write_band(&self, at: usize, first: u64, end: u64) -> Result<(), ConvertError> {
        use ndarray::{s, ArrayView4};
        let [_, columns, h, w] = self.shape.map(|n| n as usize);
        let (first, end) = (first as usize, end as usize);
        let bytes = &self.pending[at..at + (end - first) * self.frame_bytes];
        let (row, column) = (first / columns, first % columns);
        // A band is whole rows, or one run inside a row.
        let (shape, selection) = if self.chunk[0] > 1 {
            let rows = (end - first) / columns;
            ((rows, columns, h, w), s![row..row + rows, .., .., ..])
        } else {
            let n = end - first;
            ((1, n, h, w), s![row..row + 1, column..column + n, .., ..])
        };
        let fail = |e: h5::Error| {
            ConvertError::input(
                &self.path,
                format!("writing HDF5 frames {first}..{end}: {e}"),
            )
        };
        macro_rules! write {
            ($t:ty) => {{
                let values: Vec<$t> = bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect();
                let view = ArrayView4::from_shape(shape, &values)
                    .map_err(|e| ConvertError::input(&self.path, e.to_string()))?;
                self.data.write_slice(view, selection).map_err(fail)?
            }};
        }
        match self.element {
            Element::U8 => write!(u8),
            Element::U16 => write!(u16),
            Element::F32 => write!(f32),
        }
        Ok(())
    }
}

impl Sink for EmdSink {
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
        self.pending.extend_from_slice(window);
        let total = self.shape[0] * self.shape[1];
        // Bytes of `pending` written so far; dropped once, at the end.
        let mut at = 0;
        while self.pending_first < total {
            let first = self.pending_first;
            let end = self.band_end(first);
            let have = ((self.pending.len() - at) / self.frame_bytes.max(1)) as u64;
            if have < end - first {
                break;
            }
            self.write_band(at, first, end)?;
            at += (end - first) as usize * self.frame_bytes;
            self.pending_first = end;
        }
        self.pending.drain(..at);
        Ok(())
    }

    fn publish(self: Box<Self>) -> Result<(), ConvertError> {
        let EmdSink {
            path,
            shape,
            pending_first,
            data,
            file,
            target,
            ..
        } = *self;
        if pending_first != shape[0] * shape[1] {
            return Err(ConvertError::input(
                &path,
                format!("only {pending_first} frames were written"),
            ));
        }
        drop(data);
        // Closing flushes HDF5's buffers into the temporary file before
        // it is fsynced and published.
        file.close()
            .map_err(|e| ConvertError::input(&path, format!("closing HDF5: {e}")))?;
        Ok(target.publish()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantity(value: f64, unit: &str) -> Quantity {
        Quantity {
            value,
            unit: unit.into(),
            provenance: "test".into(),
            evidence: None,
            stored: None,
        }
    }

    #[test]
    fn units_map_to_the_ones_py4dstem_accepts() {
        assert_eq!(scan_step(&quantity(0.5, "angstrom")), Some((0.5, "A")));
        assert_eq!(scan_step(&quantity(2.0, "nm")), Some((2.0, "nm")));
        assert_eq!(scan_step(&quantity(2.0, "furlong")), None);
        assert_eq!(detector_step(&quantity(0.8, "mrad")), Some((0.8, "mrad")));
        assert_eq!(
            detector_step(&quantity(0.01, "1/angstrom")),
            Some((0.01, "A^-1"))
        );
        // py4DSTEM refuses any other Q unit, so none is written.
        assert_eq!(detector_step(&quantity(0.1, "1/nm")), None);
    }

    /// Frames through the sink in awkward windows (not aligned to chunk
    /// bands), then back through our HDF5 import: the same values, mask
    /// and calibration.
    #[test]
    fn frames_round_trip_through_the_hdf5_import() {
        // 5 columns: a 512-scan chunk holds 102 whole rows, so the whole
        // 7-row scan is one band of whole rows.
        round_trip([7, 5, 3, 2]);
        // 600 columns: chunks are runs of 512 scans inside one row.
        round_trip([2, 600, 1, 2]);
    }

    fn round_trip(shape: [u64; 4]) {
        use crate::convert::{open_source, Options, Quiet, SinkFormat};
        use crate::qem::write::{Calibration, DetectorUnit};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.emd");
        let pixels = (shape[2] * shape[3]) as usize;
        let frames = (shape[0] * shape[1]) as usize;
        let calibration = Calibration {
            scan_sampling_angstrom: Some([1.5, 2.0]),
            detector_sampling: Some(([0.25, 0.25], DetectorUnit::Mrad)),
            ..Calibration::default()
        };
        let mut d = crate::convert::describe::foreign(
            &path,
            shape,
            Element::U16,
            &calibration,
            "test",
            &[],
        )
        .unwrap();
        let valid: Vec<bool> = (0..pixels).map(|p| p != 1).collect();
        if let crate::qem::write::Content::Counts { valid: v, .. } = &mut d.content {
            *v = Some(valid.clone());
        }
        let values: Vec<u16> = (0..frames * pixels)
            .map(|i| (i * 37 % 65521) as u16)
            .collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut sink: Box<dyn Sink> =
            Box::new(EmdSink::create(&path, &d, false, Compression::Gzip).unwrap());
        let frame = d.frame_bytes();
        for window in bytes.chunks(frame * 7) {
            sink.write_frames(window).unwrap();
        }
        assert!(
            !path.exists(),
            "nothing under the final name before publish"
        );
        sink.publish().unwrap();

        let mut source = open_source(
            &path,
            SinkFormat::Qem,
            &Options::default(),
            &mut Quiet::default(),
        )
        .unwrap();
        let back = source.description().clone();
        assert_eq!(back.shape, shape);
        assert_eq!(back.element, Element::U16);
        assert_eq!(back.valid(), Some(&valid[..]));
        let sm = ScientificMetadata::parse(&back.scientific_metadata, &shape).unwrap();
        let step = |i| sm.effective_axis_sampling(i).map(|q| q.value);
        assert_eq!(
            [step(0), step(1), step(2)],
            [Some(1.5), Some(2.0), Some(0.25)]
        );
        let mut out = vec![0u8; bytes.len()];
        source.read_frames(0, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn a_sink_dropped_unpublished_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.h5");
        let d = crate::convert::describe::foreign(
            &path,
            [2, 2, 2, 2],
            Element::F32,
            &crate::qem::write::Calibration::default(),
            "test",
            &[],
        )
        .unwrap();
        let mut sink = EmdSink::create(&path, &d, false, Compression::None).unwrap();
        sink.write_frames(&[0u8; 16 * 3]).unwrap();
        drop(sink);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn uncalibrated_axes_are_pixels() {
        let shape = [2, 3, 4, 5];
        let sm = crate::qem::write::scientific_metadata(
            shape,
            &crate::qem::write::Calibration::default(),
        )
        .unwrap();
        let metadata = ScientificMetadata::parse(&sm, &shape).unwrap();
        let a = axes(&metadata);
        assert!(a.iter().all(|x| x.unit == "pixels" && x.step == 1.0));
        assert_eq!(a.map(|x| x.name), ["Rx", "Ry", "Qx", "Qy"]);
    }
}
