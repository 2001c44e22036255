//! `qem convert IN OUT`: `.npy` or raw binary → `.qem`; `.qem` → `.qem`
//! (re-encoded, metadata kept), `.npy` or multi-page `.tiff`.
//!
//! Inputs are recognised by their signature, outputs by their extension.
//! Everything streams: `.npy` and raw inputs are memory-mapped and pushed in
//! slices, `.qem` inputs are decoded block by block, so memory stays bounded
//! for arrays larger than RAM.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use memmap2::Mmap;
use serde_json::{Map, Value};

use qemfs::export::masked::InvalidPixels;
use qemfs::export::tiff::{Sample, Sampling, TiffLayout};
use qemfs::npy::{self, DType};
use qemfs::publish::{AtomicFile, Overwrite};
use qemfs::qem::write::{
    scientific_metadata, Calibration, Content, CountDtype, ScaledRegion, WriteSpec, Writer,
};
use qemfs::qem::{Codec, Dtype, QemFile};

use crate::exit::{Failure, OK};
use crate::qem_args::{ConvertArgs, RawDtype};
use crate::qem_cmd::inspect::open;

/// Bytes pushed to the writer at a time from a mapped input.
const SLICE_BYTES: usize = 64 << 20;

enum Input {
    Npy { map: Mmap, header: npy::Header },
    Qem(Box<QemFile>),
    Raw { map: Mmap },
}

fn map_file(path: &Path) -> Result<Mmap, Failure> {
    let file = File::open(path).map_err(|e| Failure::file(path, e))?;
    // SAFETY: the mapping is read-only; a file truncated underneath us by
    // another process is outside what any reader can defend against.
    unsafe { Mmap::map(&file) }.map_err(|e| Failure::file(path, e))
}

fn identify(path: &Path) -> Result<Input, Failure> {
    let map = map_file(path)?;
    if map.starts_with(npy::MAGIC) {
        let header = npy::parse_header(&map).map_err(|e| Failure::file(path, e))?;
        header
            .check_file_len(map.len() as u64)
            .map_err(|e| Failure::file(path, e))?;
        return Ok(Input::Npy { map, header });
    }
    if map.starts_with(b"QEMDATA1") || map.starts_with(b"QGPUSTRM") || map.starts_with(b"QGANS") {
        drop(map);
        return Ok(Input::Qem(Box::new(open(path)?)));
    }
    Ok(Input::Raw { map })
}

fn overwrite(force: bool) -> Overwrite {
    if force {
        Overwrite::Replace
    } else {
        Overwrite::Never
    }
}

/// Deep-merges `patch` into `base` (objects merge, anything else replaces).
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn user_metadata(args: &ConvertArgs) -> Result<Option<Value>, Failure> {
    let Some(path) = &args.metadata else {
        return Ok(None);
    };
    let text = fs::read(path).map_err(|e| Failure::file(path, e))?;
    let value: Value = serde_json::from_slice(&text)
        .map_err(|e| Failure::file(path, format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(Failure::file(path, "the metadata must be a JSON object"));
    }
    Ok(Some(value))
}

fn shape4(dims: &[usize], path: &Path) -> Result<[u64; 4], Failure> {
    match dims {
        [a, b, c, d] => Ok([*a as u64, *b as u64, *c as u64, *d as u64]),
        _ => Err(Failure::file(
            path,
            format!(
                "expected a 4-D array (scan_row, scan_column, detector_row, detector_column), not shape {dims:?}"
            ),
        )),
    }
}

/// A `.qem` output: written by the library's writer, which never replaces
/// a file, or with `--force` replaces it in one rename at the end.
fn write_qem(
    out: &Path,
    force: bool,
    spec: WriteSpec,
    feed: impl FnOnce(&mut Writer) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let mut writer = if force {
        Writer::create_replacing(out, spec)
    } else {
        Writer::create(out, spec)
    }
    .map_err(|e| Failure::file(out, e))?;
    feed(&mut writer)?;
    writer.finish().map_err(|e| Failure::file(out, e))?;
    Ok(())
}

fn push_mapped(writer: &mut Writer, data: &[u8], out: &Path, what: &str) -> Result<(), Failure> {
    let bar = crate::progress::bar(data.len() as u64, what, true);
    for slice in data.chunks(SLICE_BYTES) {
        writer.push(slice).map_err(|e| Failure::file(out, e))?;
        bar.inc(slice.len() as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

fn dense_spec(
    shape: [u64; 4],
    dtype: DType,
    args: &ConvertArgs,
    input: &Path,
) -> Result<WriteSpec, Failure> {
    let mut sm =
        scientific_metadata(shape, &Calibration::default()).map_err(|e| Failure::file(input, e))?;
    if let Some(patch) = user_metadata(args)? {
        merge(&mut sm, &patch);
    }
    let spec = match dtype {
        DType::U8 => WriteSpec::counts(shape, CountDtype::U8, sm),
        DType::U16 => WriteSpec::counts(shape, CountDtype::U16, sm),
        DType::F32 => WriteSpec::float32(shape, sm),
        other => {
            return Err(Failure::file(
                input,
                format!("{other} arrays cannot be stored; .qem holds uint8, uint16 or float32"),
            ))
        }
    };
    Ok(match args.chunk_scans {
        Some(n) => spec.with_chunk_scans(u64::from(n)),
        None => spec,
    })
}

/// The spec that re-encodes `file` with its metadata, mask, calibration and
/// unknown members kept.
fn reencode_spec(file: &QemFile, args: &ConvertArgs) -> Result<WriteSpec, Failure> {
    let header = file.header();
    let mut sm = Value::Object(header.scientific.raw.clone());
    if let Some(patch) = user_metadata(args)? {
        merge(&mut sm, &patch);
    }
    let metadata = header.metadata.clone().unwrap_or_default();
    let content = match file.codec() {
        Codec::Integer => Content::Counts {
            dtype: if file.stored_dtype() == Dtype::U8 {
                CountDtype::U8
            } else {
                CountDtype::U16
            },
            valid: file
                .valid_mask()
                .map(|m| (0..file.pixels()).map(|p| m.is_valid(p)).collect()),
            metadata,
        },
        Codec::Float => Content::Float32 {
            empad: header.empad.clone(),
            metadata,
        },
        Codec::Scaled => {
            let cal = file
                .calibration()
                .ok_or_else(|| Failure::plain("scaled file without intensity_calibration"))?;
            let raw_regions = cal.raw.get("regions").and_then(Value::as_array);
            let regions = cal
                .regions
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let mut extra: Map<String, Value> = raw_regions
                        .and_then(|v| v.get(i))
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    for k in [
                        "first_frame",
                        "stop_frame",
                        "scale",
                        "offset",
                        "intensity_min",
                        "intensity_max",
                        "storage",
                    ] {
                        extra.remove(k);
                    }
                    ScaledRegion {
                        first_frame: r.first_frame as u64,
                        stop_frame: r.stop_frame as u64,
                        scale: r.scale,
                        offset: r.offset,
                        intensity_min: r.intensity_min,
                        intensity_max: r.intensity_max,
                        extra,
                    }
                })
                .collect();
            let mut calibration_extra = cal.raw.clone();
            for k in ["storage", "version", "complete", "source_shape", "regions"] {
                calibration_extra.remove(k);
            }
            Content::Scaled {
                regions,
                calibration_extra,
                attributes: header.attributes.clone().unwrap_or_default(),
            }
        }
    };
    let mut extra = header.raw.clone();
    for k in qemfs::qem::write::RESERVED {
        extra.remove(*k);
    }
    let mut spec = match content {
        Content::Scaled { .. } => WriteSpec::scaled(header.shape, Vec::new(), sm),
        _ => WriteSpec::counts(header.shape, CountDtype::U8, sm),
    };
    spec.content = content;
    spec.extra = extra;
    if let Some(n) = args.chunk_scans {
        spec = spec.with_chunk_scans(u64::from(n));
    }
    Ok(spec)
}

/// Feeds every decoded block of `file` to `sink` in frame order (codes for
/// the scaled codec, so a re-encode keeps them exactly).
fn for_each_block(
    file: &QemFile,
    codes: bool,
    what: &str,
    mut sink: impl FnMut(&[u8]) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let total: usize = file.blocks().iter().map(|b| b.decoded_bytes).sum();
    let bar = crate::progress::bar(total as u64, what, true);
    let mut buffer = Vec::new();
    let mut code_buffer = Vec::new();
    for block in file.blocks() {
        if codes {
            code_buffer.resize(block.frames * file.pixels(), 0u16);
            file.decode_block_codes(block.index, &mut code_buffer)
                .map_err(Failure::plain)?;
            buffer.clear();
            buffer.extend(code_buffer.iter().flat_map(|c| c.to_le_bytes()));
        } else {
            buffer.resize(block.decoded_bytes, 0);
            file.decode_block_into(block.index, &mut buffer)
                .map_err(Failure::plain)?;
        }
        sink(&buffer)?;
        bar.inc(block.decoded_bytes as u64);
    }
    bar.finish_and_clear();
    Ok(())
}

fn npy_dtype(d: Dtype) -> DType {
    match d {
        Dtype::U8 => DType::U8,
        Dtype::U16 => DType::U16,
        Dtype::F32 => DType::F32,
    }
}

/// The pixels `--masked` zeroes, if it was given.
fn masked_pixels(file: &QemFile, args: &ConvertArgs) -> Result<Option<InvalidPixels>, Failure> {
    if !args.masked {
        return Ok(None);
    }
    match file.valid_mask() {
        Some(mask) => Ok(Some(InvalidPixels::of(mask))),
        None => Err(Failure::file(
            &args.input,
            "--masked: this file has no validity mask (only counts files have one)",
        )),
    }
}

fn qem_to_npy(file: &QemFile, args: &ConvertArgs) -> Result<(), Failure> {
    let invalid = masked_pixels(file, args)?;
    let mut target =
        AtomicFile::create(&args.output, overwrite(args.force)).map_err(Failure::plain)?;
    let out = args.output.clone();
    target
        .write_all(&npy::encode_header(
            npy_dtype(file.decoded_dtype()),
            &file.shape(),
        ))
        .map_err(|e| Failure::file(&out, e))?;
    let mut sink = std::io::BufWriter::with_capacity(1 << 20, &mut target);
    let mut scratch = Vec::new();
    for_each_block(file, false, "writing .npy", |bytes| {
        let bytes = match &invalid {
            Some(invalid) => {
                scratch.clear();
                scratch.extend_from_slice(bytes);
                invalid.zero(&mut scratch, file.decoded_dtype().size());
                &scratch[..]
            }
            None => bytes,
        };
        sink.write_all(bytes).map_err(|e| Failure::file(&out, e))
    })?;
    sink.flush().map_err(|e| Failure::file(&out, e))?;
    drop(sink);
    target.publish().map_err(Failure::plain)
}

fn qem_to_tiff(file: &QemFile, args: &ConvertArgs) -> Result<(), Failure> {
    let shape = file.shape();
    let sample = match file.decoded_dtype() {
        Dtype::U8 => Sample::U8,
        Dtype::U16 => Sample::U16,
        Dtype::F32 => Sample::F32,
    };
    // An ImageJ hyperstack with the file's calibration (see export::tiff).
    let layout = TiffLayout::new(
        shape[2] as u32,
        shape[3] as u32,
        sample,
        &Sampling::acquisition(file),
    )
    .ok_or_else(|| {
        Failure::file(
            &args.input,
            "too large for one TIFF (its offsets would exceed 64 bits)",
        )
    })?;
    let invalid = masked_pixels(file, args)?;
    let mut target =
        AtomicFile::create(&args.output, overwrite(args.force)).map_err(Failure::plain)?;
    let out = args.output.clone();
    let frame_bytes = file.frame_bytes();
    let mut block: Vec<u8> = Vec::new();
    let mut block_frames = 0..0;
    let mut failure = None;
    let bar = crate::progress::bar(file.frames() as u64, "writing .tiff", false);
    let mut sink = std::io::BufWriter::with_capacity(1 << 20, &mut target);
    let written = layout.write(&mut sink, |page, w| {
        let frame = page as usize;
        if !block_frames.contains(&frame) {
            let info = match file.block_of_frame(frame) {
                Ok(info) => *info,
                Err(e) => {
                    failure = Some(Failure::plain(e));
                    return Err(std::io::Error::other("decode failed"));
                }
            };
            block.resize(info.decoded_bytes, 0);
            if let Err(e) = file.decode_block_into(info.index, &mut block) {
                failure = Some(Failure::plain(e));
                return Err(std::io::Error::other("decode failed"));
            }
            if let Some(invalid) = &invalid {
                invalid.zero(&mut block, file.decoded_dtype().size());
            }
            block_frames = info.frame_range();
        }
        let at = (frame - block_frames.start) * frame_bytes;
        bar.inc(1);
        w.write_all(&block[at..at + frame_bytes])
    });
    let flushed = written.and_then(|()| sink.flush());
    drop(sink);
    bar.finish_and_clear();
    if let Some(f) = failure {
        return Err(f);
    }
    flushed.map_err(|e| Failure::file(&out, e))?;
    target.publish().map_err(Failure::plain)
}

fn raw_dtype(d: RawDtype) -> DType {
    match d {
        RawDtype::Uint8 => DType::U8,
        RawDtype::Uint16 => DType::U16,
        RawDtype::Float32 => DType::F32,
    }
}

pub fn convert(args: &ConvertArgs) -> Result<u8, Failure> {
    let ext = args
        .output
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if !matches!(ext.as_str(), "qem" | "npy" | "tif" | "tiff") {
        return Err(Failure::file(
            &args.output,
            "unknown output type; use .qem, .npy or .tiff",
        ));
    }
    if !args.force && fs::symlink_metadata(&args.output).is_ok() {
        return Err(Failure::file(
            &args.output,
            "already exists; refusing to replace it (use --force)",
        ));
    }
    if args.masked && ext == "qem" {
        return Err(Failure::file(
            &args.output,
            "--masked applies to .npy and .tiff outputs; a .qem keeps the mask itself",
        ));
    }
    let input = identify(&args.input)?;
    match (input, ext.as_str()) {
        (Input::Npy { map, header }, "qem") => {
            let shape = shape4(&header.shape, &args.input)?;
            let spec = dense_spec(shape, header.dtype, args, &args.input)?;
            write_qem(&args.output, args.force, spec, |w| {
                push_mapped(w, &map[header.data_offset..], &args.output, "encoding")
            })?;
        }
        (Input::Raw { map }, "qem") => {
            let (Some(shape), Some(dtype)) = (&args.shape, args.dtype) else {
                return Err(Failure::file(
                    &args.input,
                    "not a .npy or .qem file; raw input needs --shape and --dtype",
                ));
            };
            let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let shape4 = shape4(&dims, &args.input)?;
            let dtype = raw_dtype(dtype);
            let need = dims
                .iter()
                .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
                .ok_or_else(|| Failure::file(&args.input, "shape too large"))?;
            if need != map.len() {
                return Err(Failure::file(
                    &args.input,
                    format!(
                        "holds {} bytes, but shape {shape:?} of {dtype} needs {need}",
                        map.len()
                    ),
                ));
            }
            let spec = dense_spec(shape4, dtype, args, &args.input)?;
            write_qem(&args.output, args.force, spec, |w| {
                push_mapped(w, &map, &args.output, "encoding")
            })?;
        }
        (Input::Qem(file), "qem") => {
            let spec = reencode_spec(&file, args)?;
            let codes = file.codec() == Codec::Scaled;
            write_qem(&args.output, args.force, spec, |w| {
                for_each_block(&file, codes, "re-encoding", |bytes| {
                    w.push(bytes).map_err(|e| Failure::file(&args.output, e))
                })
            })?;
        }
        (Input::Qem(file), "npy") => qem_to_npy(&file, args)?,
        (Input::Qem(file), _) => qem_to_tiff(&file, args)?,
        (Input::Npy { .. } | Input::Raw { .. }, _) => {
            return Err(Failure::file(
                &args.input,
                "only a .qem file converts to .npy or .tiff",
            ))
        }
    }
    Ok(OK)
}
