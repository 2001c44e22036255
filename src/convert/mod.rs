//! The conversion pipeline: `qem convert A B` opens A as a [`Source`],
//! streams bounded windows of frames in scan order into B's [`Sink`], and
//! publishes B atomically.
//!
//! Every foreign format is one module here implementing `Source` and/or
//! `Sink`; adding a format never touches another's module. Memory is
//! bounded by [`WINDOW_BYTES`] (plus the sink's own chunk buffer), never by
//! the acquisition: sources read their windows with positioned reads, not
//! by mapping the whole input.

mod bitshuffle;
mod dectris;
mod dense;
mod describe;
mod detect;
mod element;
mod emd;
mod empad;
mod error;
mod hdf5;
mod hdf5_filters;
pub mod metadata;
mod mib;
mod npy;
mod qem;
mod raw;
mod tiff;
mod zarr;

use std::path::Path;

use serde_json::{Map, Value};

use crate::qem::write::Content;

pub use describe::{fresh_metadata, Document};
pub use detect::{detect, SourceFormat};
pub use element::{ByteOrder, Element, Narrowing, SourceDtype};
pub use emd::Compression as Hdf5Compression;
pub use error::ConvertError;
pub use metadata::MetadataOptions;

/// Bytes of stored frames handed from a source to a sink at a time.
///
/// The pipeline's first read and last write overlap nothing, so a window
/// is also what filling and draining it costs. 32 MiB (one float32 chunk)
/// measured best on 2 cores: 268 MB of EMPAD 378 → 413 MB/s and 233 → 164
/// MiB peak against 64 MiB windows, ARINA and MIB unchanged within noise
/// (`benches/import.py`); 16 MiB was slower again.
pub const WINDOW_BYTES: usize = 32 << 20;

/// Everything a sink needs to know about the frames before the first one.
#[derive(Clone, Debug)]
pub struct Description {
    /// `(scan_row, scan_column, detector_row, detector_column)`.
    pub shape: [u64; 4],
    /// The element type of the window bytes (little-endian).
    pub element: Element,
    /// What a `.qem` sink stores: codec, stored dtype, valid mask, the
    /// producer's `metadata`, the `empad` description or scaled regions.
    pub content: Content,
    /// The complete `scientific_metadata` (calibration, processing,
    /// source documents).
    pub scientific_metadata: Value,
    /// Further top-level header members a `.qem` sink keeps.
    pub extra: Map<String, Value>,
}

impl Description {
    pub fn frames(&self) -> u64 {
        self.shape[0] * self.shape[1]
    }

    pub fn pixels(&self) -> u64 {
        self.shape[2] * self.shape[3]
    }

    pub fn frame_bytes(&self) -> usize {
        (self.pixels() as usize) * self.element.size()
    }

    /// Detector validity in pixel order (`true` = valid); `None` = all valid.
    pub fn valid(&self) -> Option<&[bool]> {
        match &self.content {
            Content::Counts { valid, .. } => valid.as_deref(),
            _ => None,
        }
    }

    /// Frames per window: as many whole frames as fit [`WINDOW_BYTES`], at least one.
    pub fn window_frames(&self) -> u64 {
        let per = self.frame_bytes().max(1) as u64;
        (WINDOW_BYTES as u64 / per).clamp(1, self.frames().max(1))
    }
}

/// A foreign (or `.qem`) acquisition read frame by frame in scan order.
pub trait Source {
    fn description(&self) -> &Description;
    /// For the pipeline to add the user's metadata before a sink is made.
    fn description_mut(&mut self) -> &mut Description;
    /// Fills `out` (a whole number of frames of `description().element`,
    /// little-endian) with the frames starting at `first`. Called with
    /// consecutive, increasing windows.
    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError>;
}

/// A destination that accepts windows of frames and publishes them whole.
/// `Send`: [`run`] writes one window on a thread of its own while the
/// source reads the next.
pub trait Sink: Send {
    /// Takes the next window (whole frames, in scan order).
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError>;
    /// Makes the output visible under its final name; dropping a sink
    /// without publishing leaves nothing behind.
    fn publish(self: Box<Self>) -> Result<(), ConvertError>;
}

/// Output formats, chosen by the output's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkFormat {
    Qem,
    Npy,
    Tiff,
    /// A compressed Zarr v3 store (from a `.qem` file only).
    Zarr,
    /// EMD 1.0 in HDF5 (`.emd`, `.h5`, `.hdf5`): py4DSTEM's DataCube layout.
    Emd,
    /// Headerless little-endian C-order frames.
    Raw,
}

impl SinkFormat {
    pub fn from_path(path: &Path) -> Option<SinkFormat> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "qem" => Some(SinkFormat::Qem),
            "npy" => Some(SinkFormat::Npy),
            "tif" | "tiff" => Some(SinkFormat::Tiff),
            "zarr" => Some(SinkFormat::Zarr),
            "emd" | "h5" | "hdf5" => Some(SinkFormat::Emd),
            "raw" => Some(SinkFormat::Raw),
            _ => None,
        }
    }
}

/// Raw binary input: the layout the file itself does not carry.
#[derive(Clone, Copy, Debug)]
pub struct RawLayout {
    pub shape: [u64; 4],
    pub dtype: SourceDtype,
}

/// How to convert.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Options {
    /// Replace the output when it exists.
    pub force: bool,
    /// Scans per chunk of a written `.qem`.
    pub chunk_scans: Option<u64>,
    /// Layout of raw binary input.
    pub raw: Option<RawLayout>,
    /// Scan shape for inputs that do not carry one (3-D arrays, stacks).
    pub scan: Option<[u64; 2]>,
    /// Store float64 input as float32 even where values round.
    pub allow_float_rounding: bool,
    pub metadata: MetadataOptions,
    /// Chunk compression of a written Zarr store.
    pub zarr_compression: crate::zarr::store::Compression,
    /// Decoded MiB per shard of a written Zarr store; `Some(0)` writes one
    /// file per chunk, `None` the default
    /// ([`crate::zarr::shard::DEFAULT_SHARD_MIB`]).
    pub zarr_shard_mib: Option<u64>,
    /// Chunk compression of a written EMD / HDF5 file.
    pub hdf5_compression: Hdf5Compression,
    /// Exports (`.npy`, `.tiff`, `.emd`, `.raw`): write the pixels the
    /// validity mask marks invalid as zero.
    pub masked: bool,
    /// DECTRIS HDF5 input: what an overflow/defect marker in a pixel the
    /// detector's `pixel_mask` does not flag means.
    pub dectris_markers: Markers,
}

/// DECTRIS marks overflowed and defective pixels with the largest value of
/// the image's bit depth. Such a value is not a count, so it is never stored
/// as one: in a pixel the `pixel_mask` flags it becomes 0 either way; in any
/// other pixel the user chooses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Markers {
    /// Refuse the file, naming the first frame and pixel holding a marker.
    #[default]
    Refuse,
    /// Find every pixel that holds a marker in any frame first (one extra
    /// pass over the input) and mark it invalid; the markers become 0, the
    /// pixel's other counts are kept.
    Mask,
}

/// What a finished conversion tells the user.
#[derive(Debug, Default)]
pub struct Converted {
    /// Printed on stdout: for a raw output, its shape and dtype and the
    /// command that reads it back (the file carries neither).
    pub note: Option<String>,
}

/// Progress and warnings of a conversion, drawn by the caller.
pub trait Monitor {
    /// The conversion will move `total` bytes of frames.
    fn start(&mut self, _total: u64) {}
    fn advance(&mut self, _bytes: u64) {}
    fn finish(&mut self) {}
    /// Something the user should know that does not stop the conversion.
    fn warn(&mut self, message: &str);
}

/// A monitor that collects warnings and draws nothing (tests, scripts).
#[derive(Default, Debug)]
pub struct Quiet {
    pub warnings: Vec<String>,
}

impl Monitor for Quiet {
    fn warn(&mut self, message: &str) {
        self.warnings.push(message.to_string());
    }
}

/// Converts `input` into `output` (format by extension).
pub fn convert(
    input: &Path,
    output: &Path,
    options: &Options,
    monitor: &mut dyn Monitor,
) -> Result<Converted, ConvertError> {
    if crate::remote::Address::of_path(output).is_some() {
        return Err(ConvertError::input(
            output,
            "writing to s3:// or http(s):// is not supported yet; write a local file and upload it",
        ));
    }
    let Some(sink_format) = SinkFormat::from_path(output) else {
        return Err(ConvertError::input(
            output,
            "unknown output type; use .qem, .npy, .tiff, .zarr, .emd (.h5, .hdf5) or .raw",
        ));
    };
    if !options.force && std::fs::symlink_metadata(output).is_ok() {
        return Err(ConvertError::input(
            output,
            "already exists; refusing to replace it (use --force)",
        ));
    }
    if sink_format == SinkFormat::Zarr {
        qem_to_zarr(input, output, options, monitor)?;
        return Ok(Converted::default());
    }
    if options.masked && sink_format == SinkFormat::Qem {
        return Err(ConvertError::input(
            output,
            "--masked applies to exports (.npy, .tiff, .emd, .raw); a .qem keeps the mask itself",
        ));
    }
    let mut source = open_source(input, sink_format, options, monitor)?;
    if sink_format == SinkFormat::Tiff {
        if let Some(message) = tiff_scan_steps_warning(source.description()) {
            monitor.warn(&message);
        }
    }
    let mut sink = open_sink(output, sink_format, source.description(), options)
        .map_err(|e| e.of_input(input))?;
    if options.masked {
        let Some(valid) = source.description().valid() else {
            return Err(ConvertError::input(
                input,
                "--masked: this file has no validity mask (only counts files have one)",
            ));
        };
        sink = Box::new(Masked {
            invalid: crate::export::masked::InvalidPixels::of_flags(valid),
            element: source.description().element.size(),
            inner: sink,
            scratch: Vec::new(),
        });
    }
    run(source.as_mut(), sink, monitor)?;
    let d = source.description();
    Ok(Converted {
        note: (sink_format == SinkFormat::Raw)
            .then(|| raw::raw_layout_note(output, d.shape, d.element)),
    })
}

/// TIFF has no second stack axis for the scan: ImageJ keeps the row step
/// as its frame interval, which Fiji and tifffile read, but rosettasciio
/// (hyperspy) gives both scan axes the column step. EMD carries both.
fn tiff_scan_steps_warning(d: &Description) -> Option<String> {
    let metadata = crate::qem::ScientificMetadata::parse(&d.scientific_metadata, &d.shape).ok()?;
    let (row, column) = (
        metadata.effective_axis_sampling(0)?,
        metadata.effective_axis_sampling(1)?,
    );
    let same = row.value == column.value && row.unit == column.unit;
    (!same).then(|| {
        format!(
            "the scan steps differ ({} {} per row, {} {} per column): hyperspy's TIFF reader gives both scan axes the column step; convert to .emd for hyperspy and py4DSTEM",
            row.value, row.unit, column.value, column.unit
        )
    })
}

/// `--masked`: zeroes the invalid pixels of every window on its way to the
/// sink.
struct Masked {
    invalid: crate::export::masked::InvalidPixels,
    element: usize,
    inner: Box<dyn Sink>,
    scratch: Vec<u8>,
}

impl Sink for Masked {
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
        self.scratch.clear();
        self.scratch.extend_from_slice(window);
        self.invalid.zero(&mut self.scratch, self.element);
        self.inner.write_frames(&self.scratch)
    }

    fn publish(self: Box<Self>) -> Result<(), ConvertError> {
        self.inner.publish()
    }
}

/// `.qem` → Zarr store: chunks decoded and compressed in parallel, straight
/// from the file's blocks (the store's layout follows them; see
/// [`crate::zarr::layout`]), rather than through windows.
fn qem_to_zarr(
    input: &Path,
    output: &Path,
    options: &Options,
    monitor: &mut dyn Monitor,
) -> Result<(), ConvertError> {
    if detect(input)? != SourceFormat::Qem {
        return Err(ConvertError::input(
            input,
            "only a .qem file converts to a Zarr store",
        ));
    }
    let file = crate::qem::QemFile::open(input).map_err(|e| ConvertError::read(input, e))?;
    if file.logical_expected().is_some() {
        // The store is written from blocks in parallel, so the whole-array
        // checksum is computed first (the verdict is kept for write_store).
        file.verify_logical()
            .map_err(|e| ConvertError::read(input, e))?;
    }
    let overwrite = if options.force {
        crate::publish::Overwrite::Replace
    } else {
        crate::publish::Overwrite::Never
    };
    monitor.start((file.frames() * file.frame_bytes()) as u64);
    // Chunks are written from rayon workers; the monitor is not Sync.
    let done = std::sync::atomic::AtomicU64::new(0);
    let written = crate::zarr::store::write_store(
        &file,
        input,
        output,
        overwrite,
        options.zarr_compression,
        options
            .zarr_shard_mib
            .unwrap_or(crate::zarr::shard::DEFAULT_SHARD_MIB)
            .saturating_mul(1 << 20),
        &|bytes| {
            done.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        },
    );
    monitor.advance(done.into_inner());
    monitor.finish();
    written.map_err(|e| ConvertError::input(&e.store, e.reason))?;
    Ok(())
}

/// Opens `path` as a source, recognising its format from its content.
pub fn open_source(
    path: &Path,
    sink: SinkFormat,
    options: &Options,
    monitor: &mut dyn Monitor,
) -> Result<Box<dyn Source>, ConvertError> {
    if let Some((file, dataset)) = hdf5::split_dataset_path(path) {
        let mut source: Box<dyn Source> =
            Box::new(hdf5::Hdf5Source::open(&file, &dataset, options)?);
        metadata::apply(&file, &mut *source, &options.metadata, monitor)?;
        return Ok(source);
    }
    let format = detect(path)?;
    if format == SourceFormat::Hdf5 {
        // An EMD file (ours, py4DSTEM's, NCEM's) names its 4-D array
        // itself; any other HDF5 file is taken for a DECTRIS master file.
        if let Some(dataset) = hdf5::find_emd_array(path)? {
            let mut source: Box<dyn Source> =
                Box::new(hdf5::Hdf5Source::open(path, &dataset, options)?);
            metadata::apply(path, &mut *source, &options.metadata, monitor)?;
            return Ok(source);
        }
    }
    let mut source: Box<dyn Source> = match format {
        SourceFormat::Npy => Box::new(npy::NpySource::open(path, options)?),
        SourceFormat::Qem => Box::new(qem::QemSource::open(path, sink == SinkFormat::Qem)?),
        SourceFormat::Raw => Box::new(raw::RawSource::open(path, options)?),
        SourceFormat::Empad => Box::new(empad::EmpadSource::open(path, options, monitor)?),
        SourceFormat::Mib => Box::new(mib::MibSource::open(path, options)?),
        SourceFormat::Tiff => Box::new(tiff::TiffSource::open(path, options)?),
        SourceFormat::Hdf5 => Box::new(dectris::DectrisSource::open(path, options)?),
        SourceFormat::Zarr => Box::new(zarr::ZarrIn::open(path)?),
    };
    metadata::apply(path, &mut *source, &options.metadata, monitor)?;
    Ok(source)
}

/// Creates the sink for `description` at `path`.
pub fn open_sink(
    path: &Path,
    format: SinkFormat,
    description: &Description,
    options: &Options,
) -> Result<Box<dyn Sink>, ConvertError> {
    Ok(match format {
        SinkFormat::Qem => Box::new(qem::QemSink::create(path, description, options)?),
        SinkFormat::Npy => Box::new(npy::FileSink::npy(path, description, options.force)?),
        SinkFormat::Tiff => Box::new(tiff::TiffSink::create(path, description, options.force)?),
        SinkFormat::Emd => Box::new(emd::EmdSink::create(
            path,
            description,
            options.force,
            options.hdf5_compression,
        )?),
        // Raw output: the frames as they are, with no header; the user
        // is told `raw::raw_layout_note` to read it back.
        SinkFormat::Raw => Box::new(npy::FileSink::create(path, &[], options.force)?),
        SinkFormat::Zarr => {
            return Err(ConvertError::input(
                path,
                "a Zarr store is written from a .qem file only",
            ))
        }
    })
}

/// Streams every frame of `source` into `sink` window by window, then
/// publishes. The sink writes (encodes) a window on a thread of its own
/// while the source reads (decompresses, unpacks) the next one, so the two
/// overlap; two windows are held at once.
pub fn run(
    source: &mut dyn Source,
    sink: Box<dyn Sink>,
    monitor: &mut dyn Monitor,
) -> Result<(), ConvertError> {
    let desc = source.description();
    let (frames, window, frame_bytes) = (desc.frames(), desc.window_frames(), desc.frame_bytes());
    monitor.start(frames * frame_bytes as u64);
    let mut sink = sink;
    let read = |source: &mut dyn Source, first: u64, buffer: &mut Vec<u8>| {
        let n = window.min(frames - first);
        buffer.resize(n as usize * frame_bytes, 0);
        source.read_frames(first, buffer).map(|()| n)
    };
    let (mut writing, mut reading) = (Vec::new(), Vec::new());
    let mut first = read(source, 0, &mut writing)?;
    while !writing.is_empty() {
        let (written, next) = std::thread::scope(|s| {
            let writer = s.spawn(|| sink.write_frames(&writing));
            let next = read(source, first, &mut reading);
            (writer.join(), next)
        });
        // The window being written comes before the one being read: its
        // failure is the one to report.
        written.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        first += next?;
        monitor.advance(writing.len() as u64);
        std::mem::swap(&mut writing, &mut reading);
    }
    monitor.finish();
    sink.publish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qem::write::{Calibration, CountDtype};

    /// Frames whose every pixel is its frame index (mod 2^16).
    struct Counting {
        description: Description,
    }

    impl Source for Counting {
        fn description(&self) -> &Description {
            &self.description
        }
        fn description_mut(&mut self) -> &mut Description {
            &mut self.description
        }
        fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
            let frame_bytes = self.description.frame_bytes();
            for (k, frame) in out.chunks_exact_mut(frame_bytes).enumerate() {
                let v = ((first + k as u64) as u16).to_le_bytes();
                for px in frame.chunks_exact_mut(2) {
                    px.copy_from_slice(&v);
                }
            }
            Ok(())
        }
    }

    /// Checks that windows are bounded, whole frames and in scan order.
    struct Checking {
        frame_bytes: usize,
        next: u64,
        windows: Vec<usize>,
        published: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl Sink for Checking {
        fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
            assert!(window.len() <= WINDOW_BYTES && window.len().is_multiple_of(self.frame_bytes));
            for frame in window.chunks_exact(self.frame_bytes) {
                assert_eq!(&frame[..2], &(self.next as u16).to_le_bytes());
                self.next += 1;
            }
            self.windows.push(window.len() / self.frame_bytes);
            Ok(())
        }
        fn publish(self: Box<Self>) -> Result<(), ConvertError> {
            // 600 frames: as many whole windows as fit, then the rest.
            let per = WINDOW_BYTES / self.frame_bytes;
            let mut expected = vec![per; 600 / per];
            expected.push(600 % per);
            assert_eq!(self.windows, expected);
            self.published
                .store(self.next, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn windows_are_bounded_whole_frames_in_scan_order() {
        let shape = [20, 30, 256, 512];
        let description = describe::foreign(
            Path::new("test"),
            shape,
            Element::U16,
            &Calibration::default(),
            "unknown",
            &[],
        )
        .unwrap();
        assert!(matches!(
            description.content,
            Content::Counts {
                dtype: CountDtype::U16,
                ..
            }
        ));
        let mut source = Counting { description };
        let published = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sink = Box::new(Checking {
            frame_bytes: 256 * 512 * 2,
            next: 0,
            windows: Vec::new(),
            published: published.clone(),
        });
        run(&mut source, sink, &mut Quiet::default()).unwrap();
        assert_eq!(published.load(std::sync::atomic::Ordering::Relaxed), 600);
    }
}
