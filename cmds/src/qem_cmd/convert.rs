//! `qem convert IN OUT`: the arguments of the library's conversion pipeline
//! (`qemfs::convert`), a progress bar on a terminal and warnings on stderr.

use std::io::Write;

use indicatif::ProgressBar;

use qemfs::convert::{self, Markers, MetadataOptions, Monitor, Options, RawLayout, SourceDtype};
use qemfs::npy::DType;

use crate::exit::{Failure, OK};
use crate::qem_args::{ConvertArgs, DectrisMarkers, Hdf5Compression, RawDtype, ZarrCompression};
use qemfs::zarr::store::Compression;

fn raw_dtype(d: RawDtype) -> DType {
    match d {
        RawDtype::Uint8 => DType::U8,
        RawDtype::Uint16 => DType::U16,
        RawDtype::Uint32 => DType::U32,
        RawDtype::Int16 => DType::I16,
        RawDtype::Int32 => DType::I32,
        RawDtype::Float32 => DType::F32,
        RawDtype::Float64 => DType::F64,
    }
}

/// Draws the pipeline's progress as a byte bar (hidden off a terminal) and
/// prints its warnings.
struct Bar(Option<ProgressBar>);

impl Monitor for Bar {
    fn start(&mut self, total: u64) {
        self.0 = Some(crate::progress::bar(total, "converting", true));
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(b) = &self.0 {
            b.inc(bytes);
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.0.take() {
            b.finish_and_clear();
        }
    }

    fn warn(&mut self, message: &str) {
        match &self.0 {
            Some(b) => b.suspend(|| eprintln!("warning: {message}")),
            None => eprintln!("warning: {message}"),
        }
    }
}

pub fn convert(args: &ConvertArgs) -> Result<u8, Failure> {
    let raw = match (args.shape, args.dtype) {
        (Some(shape), Some(dtype)) => Some(RawLayout {
            shape: shape.map(u64::from),
            dtype: SourceDtype::little(raw_dtype(dtype)),
        }),
        _ => None,
    };
    // Both option structs may grow (`#[non_exhaustive]`): set field by field.
    let mut metadata = MetadataOptions::default();
    metadata.file = args.metadata.clone();
    metadata.strict = args.strict_metadata;
    metadata.voltage_kv = args.voltage_kv;
    metadata.scan_step_angstrom = args.scan_step;
    metadata.detector_sampling = args.detector_sampling;
    let mut options = Options::default();
    options.force = args.force;
    options.chunk_scans = args.chunk_scans.map(u64::from);
    options.raw = raw;
    options.scan = args.scan;
    options.allow_float_rounding = args.allow_float_rounding;
    options.metadata = metadata;
    options.zarr_compression = match args.zarr_compression {
        ZarrCompression::BloscZstd => Compression::BloscZstd,
        ZarrCompression::BloscLz4 => Compression::BloscLz4,
        ZarrCompression::Zstd => Compression::Zstd,
        ZarrCompression::None => Compression::None,
    };
    options.zarr_shard_mib = Some(args.zarr_shard_mib);
    options.hdf5_compression = match args.hdf5_compression {
        Hdf5Compression::None => convert::Hdf5Compression::None,
        Hdf5Compression::Gzip => convert::Hdf5Compression::Gzip,
    };
    options.masked = args.masked;
    options.dectris_markers = match args.dectris_markers {
        DectrisMarkers::Refuse => Markers::Refuse,
        DectrisMarkers::Mask => Markers::Mask,
    };
    let mut bar = Bar(None);
    let result = convert::convert(&args.input, &args.output, &options, &mut bar);
    bar.finish();
    let converted = result.map_err(Failure::plain)?;
    if let Some(note) = converted.note {
        let mut out = crate::out::Stdout::new();
        writeln!(out, "{note}")?;
        out.done()?;
    }
    Ok(OK)
}
