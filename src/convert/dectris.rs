//! DECTRIS ARINA / EIGER HDF5: a master file whose `/entry/data/data_NNNNNN`
//! members are external links to data files of `(frames, rows, columns)`
//! counts, read through the HDF5 library (built from its sources and linked
//! in, via `hdf5-metno`). Chunks compressed with bitshuffle+LZ4 (filter 32008) or
//! LZ4 (32004) are read raw with a direct chunk read and decoded here
//! (`bitshuffle.rs`), so no HDF5 plugin is needed; gzip and uncompressed
//! chunks go through the library's own pipeline.
//!
//! The master file has no scan shape: it comes from `--scan`, or is the
//! square root of the frame count when that is whole. The detector's
//! `pixel_mask` (non-zero = defective) becomes the `valid` mask.
//! `count_time` (s), `incident_wavelength` (Å), `x_pixel_size`/`y_pixel_size`
//! and `detector_distance` (m), in DECTRIS's NeXus units, go into
//! `source_metadata` with those units; pixel size over distance gives the
//! detector sampling in mrad. uint32 counts are stored as uint16 only when
//! each fits, otherwise the file is refused naming the frame and pixel.
//!
//! DECTRIS writes `2^bit_depth_image - 1` (the dtype's largest value when the
//! depth is not given) where a pixel overflowed or is defective. That value
//! is never stored as a count: in pixels the `pixel_mask` flags it becomes 0;
//! in any other pixel the file is refused, naming the frame and pixel, unless
//! `--dectris-markers mask` ([`Markers::Mask`]) is given, which finds every
//! pixel holding a marker in a first pass and marks it invalid; the markers
//! there are stored as 0 and the pixel's other counts kept, as the format
//! keeps every invalid pixel's counts. Both are recorded in `processing`.

use std::path::{Path, PathBuf};

use hdf5_metno as h5;
use hdf5_metno::filters::Filter;
use serde_json::{json, Map};

use super::bitshuffle::{bitshuffle_lz4, hdf5_lz4};
use super::describe::foreign;
use super::element::Element;
use super::hdf5::{check_external_links, folder_of, library_error, linked_file, located, Linked};
use super::{ConvertError, Description, Markers, Options, Source};
use crate::npy::DType;
use crate::qem::write::{Calibration, Content, DetectorUnit};

pub const MAGIC: &[u8; 8] = b"\x89HDF\r\n\x1a\n";
const BITSHUFFLE: i32 = 32008;
const LZ4: i32 = 32004;
const MASK_PATH: &str = "/entry/instrument/detector/detectorSpecific/pixel_mask";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Codec {
    Library,
    Bitshuffle,
    Lz4,
}

/// One linked data dataset.
struct Part {
    name: String,
    dataset: h5::Dataset,
    frames: u64,
    codec: Codec,
    /// Frames per chunk (chunks must be whole frames for raw reads).
    chunk_frames: u64,
}

pub struct DectrisSource {
    description: Description,
    chunks: Chunks,
    narrowing: Narrowing,
}

/// From the detector's values to stored counts.
struct Narrowing {
    path: PathBuf,
    dtype: DType,
    columns: usize,
    /// The overflow/defect marker of the image's bit depth.
    marker: u32,
    /// Invalid pixels: the `pixel_mask`'s, and with `--dectris-markers
    /// mask` every pixel that holds a marker. Markers there are stored as 0.
    invalid: Option<Vec<bool>>,
}

/// The linked data, read a chunk at a time.
struct Chunks {
    path: PathBuf,
    parts: Vec<Part>,
    dtype: DType,
    pixels: usize,
    /// The decoded chunk: (part, first frame in part, frames) and its bytes.
    cached: Option<(usize, u64, u64)>,
    chunk: Vec<u8>,
    raw: Vec<u8>,
}

fn h5err(path: &Path, what: &str, e: h5::Error) -> ConvertError {
    ConvertError::input(path, format!("{what}: {}", library_error(&e)))
}

fn scalar_f64(file: &h5::File, name: &str) -> Option<f64> {
    file.dataset(name).ok()?.read_scalar::<f64>().ok()
}

fn dtype_of(path: &Path, name: &str, ds: &h5::Dataset) -> Result<DType, ConvertError> {
    let t = ds.dtype().map_err(|e| h5err(path, name, e))?;
    let d = t.to_descriptor().map_err(|e| h5err(path, name, e))?;
    use h5::types::{IntSize, TypeDescriptor as T};
    Ok(match d {
        T::Unsigned(IntSize::U1) => DType::U8,
        T::Unsigned(IntSize::U2) => DType::U16,
        T::Unsigned(IntSize::U4) => DType::U32,
        other => {
            return Err(ConvertError::input(
                path,
                format!("{name} holds {other:?}; detector counts are uint8, uint16 or uint32"),
            ))
        }
    })
}

/// Why `/entry/data/NAME` cannot be opened: the library's answer for an
/// external link says only that the file did not open, so the linked file
/// is looked at directly (missing, or the library's reason for it, e.g.
/// "truncated file").
fn unopenable(
    path: &Path,
    group: &h5::Group,
    name: &str,
    full: &str,
    e: h5::Error,
) -> ConvertError {
    let Some(file) = linked_file(group, name) else {
        return h5err(path, &format!("{full} cannot be opened"), e);
    };
    let reason = match located(path, &file, Linked::Link) {
        // Found nowhere: named where it belongs, beside the master file.
        Ok(None) => format!(
            "its linked data file {} is missing",
            folder_of(path).join(&file).display()
        ),
        Ok(Some(linked)) => match super::hdf5::open_file(&linked) {
            Err(inner) => format!(
                "its linked data file {} cannot be read: {}",
                linked.display(),
                library_error(&inner)
            ),
            Ok(_) => library_error(&e),
        },
        Err((linked, inner)) => format!(
            "its linked data file {} cannot be read: {inner}",
            linked.display()
        ),
    };
    ConvertError::input(path, format!("{full} cannot be opened: {reason}"))
}

const BIT_DEPTH_PATH: &str = "/entry/instrument/detector/bit_depth_image";

/// DECTRIS writes `2^bit_depth_image - 1` where a pixel overflowed or is
/// defective; without that dataset (or with a depth the dtype cannot hold)
/// the dtype's largest value is the marker.
fn marker_of(file: &h5::File, dtype: DType) -> u32 {
    let bits = 8 * dtype.size() as u32;
    match scalar_f64(file, BIT_DEPTH_PATH) {
        Some(b) if b >= 1.0 && b <= f64::from(bits) && b.fract() == 0.0 => {
            (((1u64) << b as u32) - 1) as u32
        }
        _ => (((1u64) << bits) - 1) as u32,
    }
}

impl DectrisSource {
    pub fn open(path: &Path, options: &Options) -> Result<DectrisSource, ConvertError> {
        // HDF5 opens the file itself; check first that it is one.
        crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
        let file =
            super::hdf5::open_file(path).map_err(|e| h5err(path, "not a readable HDF5 file", e))?;
        let group = file
            .group("/entry/data")
            .map_err(|e| {
                h5err(
                    path,
                    "neither an EMD file nor a DECTRIS master file (no /entry/data group); name a 4-D dataset as FILE:/path",
                    e,
                )
            })?;
        let mut names: Vec<String> = group
            .member_names()
            .map_err(|e| h5err(path, "/entry/data", e))?
            .into_iter()
            .filter(|n| n.starts_with("data_"))
            .collect();
        names.sort();
        if names.is_empty() {
            return Err(ConvertError::input(
                path,
                "/entry/data has no data_NNNNNN members",
            ));
        }
        let mut parts = Vec::new();
        let mut dims: Option<(DType, [u64; 2])> = None;
        for name in names {
            let full = format!("/entry/data/{name}");
            check_external_links(path, &file, &full)?;
            let dataset = group
                .dataset(&name)
                .map_err(|e| unopenable(path, &group, &name, &full, e))?;
            let shape = dataset.shape();
            let [n, h, w] = shape[..] else {
                return Err(ConvertError::input(
                    path,
                    format!("{full} has shape {shape:?}, not (frames, rows, columns)"),
                ));
            };
            let dtype = dtype_of(path, &full, &dataset)?;
            let frame = [h as u64, w as u64];
            match dims {
                None => dims = Some((dtype, frame)),
                Some(d) if d == (dtype, frame) => {}
                Some((t, f)) => {
                    return Err(ConvertError::input(
                        path,
                        format!("{full} holds {dtype} frames of {h}×{w}, the first data holds {t} frames of {}×{}", f[0], f[1]),
                    ))
                }
            }
            let filters = dataset.filters();
            let user = |id: i32| {
                filters
                    .iter()
                    .any(|f| matches!(f, Filter::User(i, _) if *i == id))
            };
            let codec = if user(BITSHUFFLE) {
                Codec::Bitshuffle
            } else if user(LZ4) {
                Codec::Lz4
            } else {
                Codec::Library
            };
            let chunk_frames = match (codec, dataset.chunk()) {
                (Codec::Library, _) => 1,
                (_, Some(c)) if c.len() == 3 && c[1] == h && c[2] == w && filters.len() == 1 => c[0] as u64,
                (_, c) => {
                    return Err(ConvertError::input(
                        path,
                        format!("{full}: chunks {c:?} with filters {filters:?} are not whole frames under one LZ4 filter"),
                    ))
                }
            };
            parts.push(Part {
                name: full,
                dataset,
                frames: n as u64,
                codec,
                chunk_frames: chunk_frames.max(1),
            });
        }
        let (dtype, [rows, columns]) = dims.unwrap_or((DType::U16, [0, 0]));
        let frames: u64 = parts.iter().map(|p| p.frames).sum();
        let scan = match options.scan {
            Some(s) => s,
            None => {
                let side = (frames as f64).sqrt().round() as u64;
                if side * side != frames {
                    return Err(ConvertError::input(
                        path,
                        format!(
                            "{frames} frames and no scan shape in the file: give --scan ROWS,COLS"
                        ),
                    ));
                }
                [side, side]
            }
        };
        if scan[0].checked_mul(scan[1]) != Some(frames) {
            return Err(ConvertError::input(
                path,
                format!(
                    "holds {frames} frames, but the scan {}×{} needs {}",
                    scan[0],
                    scan[1],
                    scan[0].saturating_mul(scan[1])
                ),
            ));
        }
        let pixels = (rows * columns) as usize;
        let mask = match file.dataset(MASK_PATH) {
            Ok(ds) => {
                // Its declared size first: the file may declare any size
                // without storing it.
                if ds.size() != pixels {
                    return Err(ConvertError::input(
                        path,
                        format!("{MASK_PATH} has {} pixels, the frames {pixels}", ds.size()),
                    ));
                }
                let m: Vec<u32> = ds.read_raw().map_err(|e| h5err(path, MASK_PATH, e))?;
                Some(m.iter().map(|&v| v != 0).collect::<Vec<bool>>())
            }
            Err(_) => None,
        };
        let mut sm = Map::new();
        let mut quantity = |key: &str, name: &str, unit: &str| {
            let v = scalar_f64(&file, name);
            if let Some(v) = v {
                sm.insert(key.into(), json!({"value": v, "unit": unit, "path": name}));
            }
            v
        };
        quantity("count_time", "/entry/instrument/detector/count_time", "s");
        quantity(
            "incident_wavelength",
            "/entry/instrument/beam/incident_wavelength",
            "angstrom",
        );
        let px = quantity(
            "x_pixel_size",
            "/entry/instrument/detector/x_pixel_size",
            "m",
        );
        let py = quantity(
            "y_pixel_size",
            "/entry/instrument/detector/y_pixel_size",
            "m",
        );
        let distance = quantity(
            "detector_distance",
            "/entry/instrument/detector/detector_distance",
            "m",
        );
        let detector_sampling = match (py, px, distance) {
            (Some(y), Some(x), Some(d)) if d > 0.0 && x > 0.0 && y > 0.0 => Some((
                [(y / d).atan() * 1e3, (x / d).atan() * 1e3],
                DetectorUnit::Mrad,
            )),
            _ => None,
        };
        let marker = marker_of(&file, dtype);
        let mut chunks = Chunks {
            path: path.to_path_buf(),
            parts,
            dtype,
            pixels,
            cached: None,
            chunk: Vec::new(),
            raw: Vec::new(),
        };
        let flagged = mask
            .as_ref()
            .map_or(0, |m| m.iter().filter(|&&bad| bad).count());
        let mut invalid = mask;
        let mut processing = Vec::new();
        if dtype == DType::U32 {
            processing.push(json!({
                "changes_measurements": false,
                "operation": "exact_integer_narrowing",
                "source_dtype": "uint32",
                "stored_dtype": "uint16",
            }));
        }
        if options.dectris_markers == Markers::Mask {
            let found = chunks.pixels_holding(marker, frames)?;
            let all = invalid.get_or_insert_with(|| vec![false; pixels]);
            let added = found
                .iter()
                .zip(all.iter_mut())
                .filter(|(&f, bad)| f && !**bad)
                .map(|(_, bad)| *bad = true)
                .count();
            if added > 0 {
                processing.push(json!({
                    "changes_measurements": true,
                    "description": format!("{added} pixels that hold the DECTRIS overflow/defect marker {marker} in some frame, but are not flagged by the pixel_mask, are marked invalid; the markers there are stored as 0, the pixels' other counts are kept (--dectris-markers mask)"),
                    "operation": "marker_pixel_masking",
                }));
            }
        }
        if flagged > 0 {
            processing.push(json!({
                "changes_measurements": false,
                "description": format!("the DECTRIS overflow/defect marker {marker} in pixels the pixel_mask flags is stored as 0; those pixels are invalid"),
                "operation": "flagged_marker_zeroing",
            }));
        }
        let calibration = Calibration {
            detector_sampling,
            source_metadata: sm,
            provenance: "source file".into(),
            processing,
            ..Calibration::default()
        };
        let element = if dtype == DType::U8 {
            Element::U8
        } else {
            Element::U16
        };
        let shape = [scan[0], scan[1], rows, columns];
        let mut description = foreign(path, shape, element, &calibration, "dectris-hdf5", &[])?;
        let invalid = invalid.filter(|m| m.iter().any(|&bad| bad));
        if let (Some(m), Content::Counts { valid, .. }) = (&invalid, &mut description.content) {
            *valid = Some(m.iter().map(|&bad| !bad).collect());
        }
        Ok(DectrisSource {
            description,
            chunks,
            narrowing: Narrowing {
                path: path.to_path_buf(),
                dtype,
                columns: columns as usize,
                marker,
                invalid,
            },
        })
    }
}

impl Narrowing {
    /// Stores one frame of detector values as counts: markers in invalid
    /// pixels become 0; markers elsewhere and counts above uint16 refuse.
    fn store(&self, global: u64, frame: &[u8], out: &mut [u8]) -> Result<(), ConvertError> {
        let columns = self.columns;
        let refuse = |i: usize, v: u32| {
            let why = if v == self.marker {
                format!(
                    "the DECTRIS overflow/defect marker {v} in a pixel the pixel_mask does not \
                     flag; --dectris-markers mask marks such pixels invalid"
                )
            } else {
                format!("counts {v}, more than uint16 holds")
            };
            ConvertError::input(
                &self.path,
                format!(
                    "frame {global} pixel ({}, {}): {why}",
                    i / columns,
                    i % columns
                ),
            )
        };
        let invalid = |i: usize| self.invalid.as_ref().is_some_and(|m| m[i]);
        let keep = |i: usize, v: u32| -> Result<u32, ConvertError> {
            if v == self.marker {
                return if invalid(i) { Ok(0) } else { Err(refuse(i, v)) };
            }
            Ok(v)
        };
        match self.dtype {
            DType::U8 => {
                for (i, (o, &s)) in out.iter_mut().zip(frame).enumerate() {
                    *o = keep(i, u32::from(s))? as u8;
                }
            }
            DType::U16 => {
                for (i, (o, s)) in out
                    .chunks_exact_mut(2)
                    .zip(frame.chunks_exact(2))
                    .enumerate()
                {
                    let v = keep(i, u32::from(u16::from_le_bytes([s[0], s[1]])))?;
                    o.copy_from_slice(&(v as u16).to_le_bytes());
                }
            }
            _ => {
                for (i, (o, s)) in out
                    .chunks_exact_mut(2)
                    .zip(frame.chunks_exact(4))
                    .enumerate()
                {
                    let v = keep(i, u32::from_le_bytes([s[0], s[1], s[2], s[3]]))?;
                    let c = u16::try_from(v).map_err(|_| refuse(i, v))?;
                    o.copy_from_slice(&c.to_le_bytes());
                }
            }
        }
        Ok(())
    }
}

impl Chunks {
    /// The frame `global` of the whole acquisition, as stored bytes.
    fn frame(&mut self, global: u64) -> Result<&[u8], ConvertError> {
        let (mut part, mut local) = (0, global);
        while local >= self.parts[part].frames {
            local -= self.parts[part].frames;
            part += 1;
        }
        let hit =
            matches!(self.cached, Some((p, f, n)) if p == part && (f..f + n).contains(&local));
        if !hit {
            self.load(part, local)?;
        }
        let (_, f, _) = self.cached.unwrap_or((0, 0, 0));
        let src = self.pixels * self.dtype.size();
        let at = (local - f) as usize * src;
        Ok(&self.chunk[at..at + src])
    }

    /// Which pixels hold `marker` in any of the `frames` frames.
    fn pixels_holding(&mut self, marker: u32, frames: u64) -> Result<Vec<bool>, ConvertError> {
        let mut found = vec![false; self.pixels];
        let elem = self.dtype.size();
        for global in 0..frames {
            let frame = self.frame(global)?;
            for (f, s) in found.iter_mut().zip(frame.chunks_exact(elem)) {
                let v = match *s {
                    [a] => u32::from(a),
                    [a, b] => u32::from(u16::from_le_bytes([a, b])),
                    [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
                    _ => 0,
                };
                *f |= v == marker;
            }
        }
        self.cached = None;
        Ok(found)
    }

    /// Decodes the chunk of `part` holding frame `frame` (of that part).
    fn load(&mut self, part: usize, frame: u64) -> Result<(), ConvertError> {
        let p = &self.parts[part];
        let first = frame / p.chunk_frames * p.chunk_frames;
        let frames = p.chunk_frames.min(p.frames - first);
        let elem = self.dtype.size();
        let frame_bytes = self.pixels * elem;
        let what = |reason: String| {
            ConvertError::input(
                &self.path,
                format!("{} chunk at frame {first}: {reason}", p.name),
            )
        };
        match p.codec {
            Codec::Library => {
                self.chunk.clear();
                macro_rules! read {
                    ($t:ty) => {{
                        let v: ndarray::Array3<$t> = p
                            .dataset
                            .read_slice(ndarray::s![
                                first as usize..(first + frames) as usize,
                                ..,
                                ..
                            ])
                            .map_err(|e| what(library_error(&e)))?;
                        self.chunk.extend(v.iter().flat_map(|x| x.to_le_bytes()));
                    }};
                }
                match self.dtype {
                    DType::U8 => read!(u8),
                    DType::U16 => read!(u16),
                    _ => read!(u32),
                }
            }
            Codec::Bitshuffle | Codec::Lz4 => {
                let offset: [hdf5_metno_sys::h5::hsize_t; 3] = [first, 0, 0];
                let (mut size, mut mask, mut addr) = (0u64, 0u32, 0u64);
                let id = p.dataset.id();
                let status = h5::sync::sync(|| unsafe {
                    hdf5_metno_sys::h5d::H5Dget_chunk_info_by_coord(
                        id,
                        offset.as_ptr(),
                        &mut mask,
                        &mut addr,
                        &mut size,
                    )
                });
                if status < 0 || size == 0 {
                    return Err(what("the chunk is missing from the file".into()));
                }
                // The stored size bounds the allocation; a compressed chunk of
                // whole frames is never much larger than the frames themselves.
                let full = p.chunk_frames as usize * frame_bytes;
                if size as usize > full + full / 2 + 4096 {
                    return Err(what(format!(
                        "stored chunk of {size} bytes is implausible for {full} bytes of frames"
                    )));
                }
                self.raw.resize(size as usize, 0);
                let mut filters = 0u32;
                let buf = self.raw.as_mut_ptr();
                // In: the buffer's size, which the library never writes past.
                let mut room = self.raw.len();
                let status = h5::sync::sync(|| unsafe {
                    hdf5_metno_sys::h5d::H5Dread_chunk(
                        id,
                        hdf5_metno_sys::h5p::H5P_DEFAULT,
                        offset.as_ptr(),
                        &mut filters,
                        buf.cast(),
                        &mut room,
                    )
                });
                if status < 0 {
                    return Err(what(
                        "the chunk cannot be read (truncated data file?)".into(),
                    ));
                }
                self.chunk.resize(full, 0);
                if filters & 1 != 0 {
                    if self.raw.len() != full {
                        return Err(what("an unfiltered chunk of the wrong size".into()));
                    }
                    self.chunk.copy_from_slice(&self.raw);
                } else if p.codec == Codec::Bitshuffle {
                    bitshuffle_lz4(&self.raw, elem, &mut self.chunk).map_err(what)?;
                } else {
                    hdf5_lz4(&self.raw, &mut self.chunk).map_err(what)?;
                }
                self.chunk.truncate(frames as usize * frame_bytes);
            }
        }
        self.cached = Some((part, first, frames));
        Ok(())
    }
}

impl Source for DectrisSource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let stored = self.description.frame_bytes();
        for (k, o) in out.chunks_exact_mut(stored).enumerate() {
            let global = first + k as u64;
            let frame = self.chunks.frame(global)?;
            self.narrowing.store(global, frame, o)?;
        }
        Ok(())
    }
}
