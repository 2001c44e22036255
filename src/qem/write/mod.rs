//! Writing `.qem` files (spec §2–§9) for the three codecs.
//!
//! Frames are pushed in C order, in pieces of any size; every complete chunk
//! is encoded at once and its arrays hashed and spooled (module `body`) into the
//! output's temporary sibling file while the next chunk is encoded, so
//! memory stays bounded by two chunks. [`Writer::finish`] then builds the
//! header (which must precede the body) and writes it into the room left
//! before the body (module `room`) or, where none was left or it does not
//! fit, moves the body up behind it in the same file (module `spool`), and
//! publishes the file without ever replacing an existing one.
//!
//! ```no_run
//! use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec, Writer};
//! let shape = [64, 64, 128, 128];
//! let sm = scientific_metadata(shape, &Calibration::default())?;
//! let spec = WriteSpec::counts(shape, CountDtype::U16, sm);
//! let mut w = Writer::create("scan.qem", spec)?;
//! # let frames: Vec<u16> = vec![0; 64 * 64 * 128 * 128];
//! w.push_u16(&frames)?;
//! w.finish()?;
//! # Ok::<(), qemfs::qem::write::WriteError>(())
//! ```

mod body;
mod chunk;
mod header;
mod metadata;
mod publish;
mod rans;
mod room;
mod spatial;
mod spool;
pub mod stream;

use std::io;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Number, Value};
use sha2::{Digest, Sha256};

pub use header::to_canonical_json;
pub use metadata::{
    scientific_metadata, validate_scientific_metadata, Calibration, DetectorUnit,
    SCALED_QUANTIZATION_DESCRIPTION,
};

use crate::publish::{AtomicFile, Overwrite};
use crate::qem::checksum::hex;
use crate::qem::envelope;
use body::{Body, Sink};
use chunk::Frames;
use publish::{io_error, publish_error};
use spatial::Tiles;

/// The codec identifiers, as the reader knows them.
pub use crate::qem::header::{FLOAT_CODEC, INTEGER_CODEC, SCALED_CODEC};
/// Frames per block of the integer and scaled codecs.
pub(crate) const INTERVAL: u64 = crate::qem::header::INTERVAL as u64;
/// Largest header the format allows.
pub(crate) const MAX_HEADER_BYTES: usize = envelope::MAX_HEADER_BYTES as usize;
/// Default chunk length (scans) of the integer and scaled codecs.
pub(crate) const DEFAULT_CHUNK_SCANS: u64 = 512;
/// Longest chunk the reference writer uses for counts (two blocks).
pub const MAX_COUNT_CHUNK_SCANS: u64 = 1024;

/// How each count stream's model is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelChoice {
    /// Exactly the reference writer's heuristic (spec §7.2): byte-identical output.
    Reference,
    /// The smallest encoding among every form and all 64 rANS tables, never
    /// larger than the reference choice.
    #[default]
    Smallest,
}

/// Stored integer type of the integer codec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountDtype {
    U8,
    U16,
}

impl CountDtype {
    /// The reader's dtype of the same name, size and NumPy type.
    pub fn dtype(self) -> crate::qem::Dtype {
        match self {
            CountDtype::U8 => crate::qem::Dtype::U8,
            CountDtype::U16 => crate::qem::Dtype::U16,
        }
    }

    pub fn name(self) -> &'static str {
        self.dtype().name()
    }

    fn bytes(self) -> usize {
        self.dtype().size()
    }
}

/// One calibration region of the scaled codec (spec §9.1):
/// `value = float32(code · scale + offset)` for frames `first_frame..stop_frame`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaledRegion {
    pub first_frame: u64,
    pub stop_frame: u64,
    pub scale: f64,
    pub offset: f64,
    pub intensity_min: f64,
    pub intensity_max: f64,
    /// Further members of the region object, kept as given.
    pub extra: Map<String, Value>,
}

/// What the file stores, with the codec-specific header members.
#[derive(Clone, Debug)]
pub enum Content {
    /// Detector counts, codec `runtime-column-rans-spatial-v2`; pushed as
    /// uint8 or little-endian uint16 elements.
    Counts {
        dtype: CountDtype,
        /// Detector validity in pixel order (`true` = valid); `None` = all valid.
        valid: Option<Vec<bool>>,
        /// The producer's `metadata` record. When some pixel is invalid and
        /// it has no `valid_pixels`, the mask is added there as the reference does.
        metadata: Map<String, Value>,
    },
    /// Float32 measurements, codec `float32-bit-lanes-rans-v1`; pushed as
    /// little-endian float32 elements.
    Float32 {
        /// The `empad` member; `None` = the reference writer's default,
        /// built from `scientific_metadata.source_metadata`.
        empad: Option<Map<String, Value>>,
        metadata: Map<String, Value>,
    },
    /// Scaled uint16 codes, codec `scaled-uint16-column-rans-v1`; pushed as
    /// little-endian uint16 elements.
    Scaled {
        regions: Vec<ScaledRegion>,
        /// Further members of `intensity_calibration` (`source_dtype`,
        /// `changed`, `rmse`, …), kept as given.
        calibration_extra: Map<String, Value>,
        /// The `attributes` member (producer provenance strings).
        attributes: Map<String, Value>,
    },
}

/// Everything needed to write one file besides the frames.
#[derive(Clone, Debug)]
pub struct WriteSpec {
    /// `(scan_row, scan_column, detector_row, detector_column)`.
    pub shape: [u64; 4],
    pub content: Content,
    /// The `scientific_metadata` object (see [`scientific_metadata`]); it is
    /// checked against the rules the reference reader enforces.
    pub scientific_metadata: Value,
    /// Frames per chunk; `None` = the codec's default (512 for counts, capped
    /// by the uint32 bound; `min(512, 8 388 608 / P)` for floats).
    pub chunk_scans: Option<u64>,
    pub model: ModelChoice,
    /// Further top-level header members, kept as given.
    pub extra: Map<String, Value>,
}

impl WriteSpec {
    /// Integer counts, all pixels valid, empty `metadata`.
    pub fn counts(shape: [u64; 4], dtype: CountDtype, scientific_metadata: Value) -> WriteSpec {
        WriteSpec::new(
            shape,
            Content::Counts {
                dtype,
                valid: None,
                metadata: Map::new(),
            },
            scientific_metadata,
        )
    }

    /// Float32 measurements with the default `empad` member.
    pub fn float32(shape: [u64; 4], scientific_metadata: Value) -> WriteSpec {
        WriteSpec::new(
            shape,
            Content::Float32 {
                empad: None,
                metadata: Map::new(),
            },
            scientific_metadata,
        )
    }

    /// Scaled codes with their calibration regions.
    pub fn scaled(
        shape: [u64; 4],
        regions: Vec<ScaledRegion>,
        scientific_metadata: Value,
    ) -> WriteSpec {
        WriteSpec::new(
            shape,
            Content::Scaled {
                regions,
                calibration_extra: Map::new(),
                attributes: Map::new(),
            },
            scientific_metadata,
        )
    }

    fn new(shape: [u64; 4], content: Content, scientific_metadata: Value) -> WriteSpec {
        WriteSpec {
            shape,
            content,
            scientific_metadata,
            chunk_scans: None,
            model: ModelChoice::default(),
            extra: Map::new(),
        }
    }

    pub fn with_chunk_scans(mut self, scans: u64) -> WriteSpec {
        self.chunk_scans = Some(scans);
        self
    }

    pub fn with_model(mut self, model: ModelChoice) -> WriteSpec {
        self.model = model;
        self
    }
}

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    #[error("invalid shape {shape:?}: {reason}")]
    Shape { shape: [u64; 4], reason: String },
    #[error("invalid chunk length of {scans} scans: {reason}")]
    ChunkScans { scans: u64, reason: String },
    #[error("the validity mask has {got} entries but the detector has {expected} pixels")]
    ValidMask { got: usize, expected: usize },
    #[error("{got} bytes of frame data pushed, but the shape holds only {expected}")]
    TooMuchData { got: u64, expected: u64 },
    #[error("{got} bytes of frame data pushed, but the shape needs {expected}")]
    Incomplete { got: u64, expected: u64 },
    #[error("invalid scaled calibration regions: {0}")]
    Regions(String),
    /// A `scientific_metadata` rule refused; the text is the reader's for
    /// the same fault (`QemError::Metadata`).
    #[error("scientific metadata {path}: {reason}")]
    Metadata { path: String, reason: String },
    #[error("metadata.valid_pixels disagrees with the validity mask")]
    ValidPixels,
    #[error("non-finite number at {path}: JSON headers cannot hold NaN or infinities")]
    NonFinite { path: String },
    #[error("header member {0:?} is set by the writer and cannot be supplied")]
    ReservedMember(String),
    #[error("the header would be {0} bytes, more than the 16 MiB the format allows")]
    HeaderTooLarge(usize),
    #[error("a chunk's payload exceeds the codec's uint32 offsets")]
    ChunkTooLarge,
    #[error("{path}: no file name to write to")]
    BadPath { path: PathBuf },
    #[error(
        "finish() completes writers made by create(), finish_to_vec() those made by in_memory()"
    )]
    WrongFinish,
    #[error("{path} already exists; a .qem file is never replaced, choose another name or remove it first")]
    TargetExists { path: PathBuf },
    #[error("{path}: not written: {}", crate::mapguard::CHANGED)]
    SourceChanged { path: PathBuf },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What a finished write produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    /// Header bytes (`n`).
    pub header_bytes: u64,
    /// Body bytes.
    pub body_bytes: u64,
    /// Whole file size.
    pub file_bytes: u64,
}

/// Writes a whole in-memory array (dense little-endian element bytes, C order) to `path`.
pub fn write_file(
    path: impl AsRef<Path>,
    spec: WriteSpec,
    dense: &[u8],
) -> Result<WriteSummary, WriteError> {
    let mut w = Writer::create(path, spec)?;
    w.push(dense)?;
    w.finish()
}

/// Encodes a whole in-memory array into the bytes of a `.qem` file.
pub fn encode_to_vec(spec: WriteSpec, dense: &[u8]) -> Result<Vec<u8>, WriteError> {
    let mut w = Writer::in_memory(spec)?;
    w.push(dense)?;
    w.finish_to_vec()
}

/// Codec-specific state derived from the spec.
enum Kind {
    Counts {
        dtype: CountDtype,
        /// `u16::MAX` for a valid pixel, 0 for an invalid one.
        valid: Vec<u16>,
        tiles: Tiles,
    },
    Float {
        logical: Box<Sha256>,
    },
    Scaled {
        stops: Vec<u64>,
    },
}

/// A `.qem` file being written; see the module documentation.
pub struct Writer {
    target: Option<PathBuf>,
    overwrite: Overwrite,
    kind: Kind,
    model: ModelChoice,
    frames: u64,
    pixels: usize,
    elem_bytes: usize,
    chunk_scans: u64,
    header: Map<String, Value>,
    body: Body,
    /// The output's temporary file, which the body thread writes to
    /// (removed when dropped unpublished).
    out: Option<AtomicFile>,
    pending: Vec<u8>,
    frames_done: u64,
    chunks: Vec<Value>,
    /// Bytes before the body when it is written behind reserved room
    /// (module `room`).
    room: Option<u64>,
}

impl Writer {
    /// Checks the spec and starts a file that will appear at `path` on
    /// [`finish`](Writer::finish). Fails at once if `path` exists.
    pub fn create(path: impl AsRef<Path>, spec: WriteSpec) -> Result<Writer, WriteError> {
        let target = path.as_ref().to_path_buf();
        publish::check_target_free(&target)?;
        Writer::spooled(target, Overwrite::Never, spec)
    }

    /// Like [`create`](Writer::create), but [`finish`](Writer::finish)
    /// replaces `path` if it exists, in one rename: until then the old file
    /// is untouched, and a crash leaves either it or the complete new file.
    pub fn create_replacing(path: impl AsRef<Path>, spec: WriteSpec) -> Result<Writer, WriteError> {
        Writer::spooled(path.as_ref().to_path_buf(), Overwrite::Replace, spec)
    }

    fn spooled(
        target: PathBuf,
        overwrite: Overwrite,
        spec: WriteSpec,
    ) -> Result<Writer, WriteError> {
        let mut out = AtomicFile::create(&target, overwrite).map_err(publish_error)?;
        let temp = out.temp_path().to_path_buf();
        let file = out.file().try_clone().map_err(|e| io_error(&temp, e))?;
        let spool = spool::Spool::new(file).map_err(|e| io_error(&temp, e))?;
        let mut w = Writer::start(Some(target), spec, Sink::Spool(spool, temp))?;
        w.overwrite = overwrite;
        w.out = Some(out);
        Ok(w)
    }

    /// Like [`create`](Writer::create), producing the file's bytes in memory
    /// ([`finish_to_vec`](Writer::finish_to_vec)).
    pub fn in_memory(spec: WriteSpec) -> Result<Writer, WriteError> {
        Writer::start(None, spec, Sink::Memory(Vec::new()))
    }

    fn start(
        target: Option<PathBuf>,
        spec: WriteSpec,
        mut sink: Sink,
    ) -> Result<Writer, WriteError> {
        let shape = spec.shape;
        if shape.iter().any(|&s| s == 0 || s >= 1 << 24) {
            return Err(WriteError::Shape {
                shape,
                reason: "every axis must hold 1 to 2^24 - 1 entries".into(),
            });
        }
        let frames = shape[0] * shape[1];
        let pixels64 = shape[2] * shape[3];
        let codec = match spec.content {
            Content::Counts { .. } => INTEGER_CODEC,
            Content::Float32 { .. } => FLOAT_CODEC,
            Content::Scaled { .. } => SCALED_CODEC,
        };
        let chunk_scans = chunk_scans(&spec, pixels64)?;
        let pixels = pixels64 as usize;
        let mut sm = spec.scientific_metadata;
        let mut header = Map::new();
        let (kind, elem_bytes) = match spec.content {
            Content::Counts {
                dtype,
                valid,
                mut metadata,
            } => {
                // The mask is one header member, a hex digit per 4 pixels:
                // a larger detector cannot be written, and is refused before
                // anything the size of the detector is made.
                let mask_digits = 2 * pixels.div_ceil(8);
                if mask_digits > MAX_HEADER_BYTES {
                    return Err(WriteError::Shape {
                        shape,
                        reason: format!(
                            "a detector of {pixels} pixels needs a validity mask of \
                             {mask_digits} hex digits in the header, more than the 16 MiB \
                             the format allows"
                        ),
                    });
                }
                let valid = valid.unwrap_or_else(|| vec![true; pixels]);
                if valid.len() != pixels {
                    return Err(WriteError::ValidMask {
                        got: valid.len(),
                        expected: pixels,
                    });
                }
                add_valid_pixels(&mut metadata, &valid, shape[3] as usize)?;
                validate_scientific_metadata(&sm, shape, codec, dtype.name(), &metadata)?;
                header.insert("dtype".into(), dtype.name().into());
                header.insert("interval".into(), INTERVAL.into());
                header.insert("valid".into(), valid_hex(&valid).into());
                header.insert("metadata".into(), Value::Object(metadata));
                let tiles = Tiles::new(shape[2] as usize, shape[3] as usize);
                let valid = valid
                    .iter()
                    .map(|&v| if v { u16::MAX } else { 0 })
                    .collect();
                (
                    Kind::Counts {
                        dtype,
                        valid,
                        tiles,
                    },
                    dtype.bytes(),
                )
            }
            Content::Float32 { empad, metadata } => {
                validate_scientific_metadata(&sm, shape, codec, "float32", &metadata)?;
                let empad = match empad {
                    Some(e) => e,
                    None => metadata::default_empad(&sm),
                };
                header.insert("dtype".into(), "float32".into());
                header.insert("empad".into(), Value::Object(empad));
                header.insert("metadata".into(), Value::Object(metadata));
                (
                    Kind::Float {
                        logical: Box::default(),
                    },
                    4,
                )
            }
            Content::Scaled {
                regions,
                calibration_extra,
                attributes,
            } => {
                validate_scientific_metadata(&sm, shape, codec, "uint16", &Map::new())?;
                let stops = check_regions(&regions, frames)?;
                header.insert("dtype".into(), "uint16".into());
                header.insert("interval".into(), INTERVAL.into());
                header.insert("attributes".into(), Value::Object(attributes));
                header.insert(
                    "intensity_calibration".into(),
                    intensity_calibration(&regions, calibration_extra, shape)?,
                );
                (Kind::Scaled { stops }, 2)
            }
        };
        for (key, value) in spec.extra {
            if RESERVED.contains(&key.as_str()) || header.contains_key(&key) {
                return Err(WriteError::ReservedMember(key));
            }
            header.insert(key, value);
        }
        header.insert("codec".into(), codec.into());
        header.insert("profile".into(), codec.into());
        header.insert("container".into(), "quantem.qem".into());
        header.insert("container_version".into(), 1.into());
        header.insert("version".into(), 1.into());
        header.insert("shape".into(), json!(shape));
        header.insert("scientific_metadata".into(), std::mem::take(&mut sm));
        // A header that cannot be serialised, or is already too large
        // without its chunk list, is better refused now than after encoding.
        let base = to_canonical_json(&Value::Object(header.clone()))?;
        if base.len() > MAX_HEADER_BYTES {
            return Err(WriteError::HeaderTooLarge(base.len()));
        }
        // So is one whose chunk list alone cannot fit (a 3 KB HDF5 file may
        // declare 2^32 scan positions, to be converted for hours first).
        let chunks = frames.div_ceil(chunk_scans);
        let least = room::least_header(base.len() as u64, chunks);
        if least > MAX_HEADER_BYTES as u64 {
            return Err(WriteError::Shape {
                shape,
                reason: format!(
                    "{frames} scan positions in chunks of {chunk_scans} scans make {chunks} \
                     chunks, whose list needs a header of at least {least} bytes, more than \
                     the 16 MiB the format allows"
                ),
            });
        }
        let region_splits = match &kind {
            Kind::Scaled { stops } => stops.len() as u64,
            _ => 0,
        };
        let room = room::reserve(
            spec.model,
            &room::Shape {
                known_bytes: base.len() as u64,
                dense_bytes: frames * pixels64 * elem_bytes as u64,
                chunks: chunks + region_splits,
            },
        );
        if let (Some(room), Sink::Spool(spool, _)) = (room, &mut sink) {
            spool.place_at(room);
        }
        Ok(Writer {
            target,
            overwrite: Overwrite::Never,
            kind,
            model: spec.model,
            frames,
            pixels,
            elem_bytes,
            chunk_scans,
            header,
            body: Body::start(sink)?,
            out: None,
            pending: Vec::new(),
            frames_done: 0,
            chunks: Vec::new(),
            room,
        })
    }

    fn frame_bytes(&self) -> u64 {
        (self.pixels * self.elem_bytes) as u64
    }

    /// Frames of the next chunk and the calibration region holding it.
    fn next_chunk(&self) -> (u64, Option<usize>) {
        let left = self.frames - self.frames_done;
        match &self.kind {
            Kind::Scaled { stops } => {
                let region = stops.partition_point(|&s| s <= self.frames_done);
                let to_stop = stops[region] - self.frames_done;
                (self.chunk_scans.min(to_stop), Some(region))
            }
            _ => (self.chunk_scans.min(left), None),
        }
    }

    /// Appends dense little-endian element bytes in C order (uint8, uint16 or
    /// float32 as the content says). Pieces may split frames anywhere.
    pub fn push(&mut self, mut data: &[u8]) -> Result<(), WriteError> {
        let total = self.frames * self.frame_bytes();
        let done = self.frames_done * self.frame_bytes() + self.pending.len() as u64;
        if done + data.len() as u64 > total {
            return Err(WriteError::TooMuchData {
                got: done + data.len() as u64,
                expected: total,
            });
        }
        while !data.is_empty() {
            let (scans, _) = self.next_chunk();
            let chunk_bytes = (scans * self.frame_bytes()) as usize;
            if self.pending.is_empty() && data.len() >= chunk_bytes {
                let (now, rest) = data.split_at(chunk_bytes);
                self.encode_chunk(now)?;
                data = rest;
                continue;
            }
            let take = (chunk_bytes - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() == chunk_bytes {
                let pending = std::mem::take(&mut self.pending);
                let result = self.encode_chunk(&pending);
                self.pending = pending;
                self.pending.clear();
                result?;
            }
        }
        Ok(())
    }

    /// [`push`](Writer::push) for uint16 values (counts or scaled codes).
    pub fn push_u16(&mut self, values: &[u16]) -> Result<(), WriteError> {
        for piece in values.chunks(1 << 20) {
            let bytes: Vec<u8> = piece.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.push(&bytes)?;
        }
        Ok(())
    }

    /// [`push`](Writer::push) for float32 values; bit patterns are kept exactly.
    pub fn push_f32(&mut self, values: &[f32]) -> Result<(), WriteError> {
        for piece in values.chunks(1 << 20) {
            let bytes: Vec<u8> = piece
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect();
            self.push(&bytes)?;
        }
        Ok(())
    }

    /// Frames encoded so far.
    pub fn frames_written(&self) -> u64 {
        self.frames_done
    }

    fn encode_chunk(&mut self, data: &[u8]) -> Result<(), WriteError> {
        let (scans64, region) = self.next_chunk();
        let scans = scans64 as usize;
        let first = self.frames_done;
        let model = self.model;
        let recycled = self.body.recycled.clone();
        let entry = match &mut self.kind {
            Kind::Counts {
                dtype,
                valid,
                tiles,
            } => {
                let src = Frames {
                    bytes: data,
                    wide: *dtype == CountDtype::U16,
                    width: self.pixels,
                };
                let streams =
                    chunk::encode_streams(src, scans, INTERVAL as usize, model, &recycled)
                        .ok_or(WriteError::ChunkTooLarge)?;
                let index = spatial_index(src, scans, tiles, valid);
                let mut arrays = write_count_arrays(&mut self.body, streams);
                let words = index.words.len();
                arrays.push(array(&mut self.body, [u32_bytes(&index.words)], words));
                let offsets: Vec<u8> = index.offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
                arrays.push(array(&mut self.body, [offsets], index.offsets.len()));
                let widths = index.widths.len();
                arrays.push(array(&mut self.body, [index.widths], widths));
                json!({"arrays": arrays, "first": first, "scans": scans64})
            }
            Kind::Scaled { .. } => {
                let src = Frames {
                    bytes: data,
                    wide: true,
                    width: self.pixels,
                };
                let streams =
                    chunk::encode_streams(src, scans, INTERVAL as usize, model, &recycled)
                        .ok_or(WriteError::ChunkTooLarge)?;
                let arrays = write_count_arrays(&mut self.body, streams);
                json!({"arrays": arrays, "first": first, "region": region, "scans": scans64})
            }
            Kind::Float { logical } => {
                let src = Frames {
                    bytes: data,
                    wide: true,
                    width: 2 * self.pixels,
                };
                // The whole-array SHA-256 is one serial stream: it runs
                // beside the (parallel) encoding of the same chunk.
                let (_, streams) = rayon::join(
                    || logical.update(data),
                    || chunk::encode_streams(src, scans, scans, model, &recycled),
                );
                let mut streams = streams.ok_or(WriteError::ChunkTooLarge)?;
                if streams.payload_len == 0 {
                    // Every array must be non-empty: one padding byte.
                    streams.payload = vec![vec![0]];
                    streams.payload_len = 1;
                }
                let (offset_bytes, model_bytes) =
                    (4 * streams.offsets.len(), streams.selectors.len());
                let payload_offset = self.body.len;
                for piece in streams.payload {
                    self.body.put(piece);
                }
                let offset_offset = self.body.len;
                self.body.put(u32_bytes(&streams.offsets));
                let model_offset = self.body.len;
                self.body.put(streams.selectors);
                json!({
                    "first": first,
                    "scans": scans64,
                    "payload_offset": payload_offset,
                    "payload_bytes": streams.payload_len,
                    "offset_offset": offset_offset,
                    "offset_bytes": offset_bytes,
                    "model_offset": model_offset,
                    "model_bytes": model_bytes,
                })
            }
        };
        self.chunks.push(entry);
        self.frames_done += scans64;
        // The chunk's bytes are hashed and written while the next is encoded.
        self.body.send()
    }

    /// Waits for the body's thread: the body's sink and `sha256` list,
    /// once every frame was pushed.
    fn written(&mut self) -> Result<body::Written, WriteError> {
        let expected = self.frames * self.frame_bytes();
        let got = self.frames_done * self.frame_bytes() + self.pending.len() as u64;
        if got != expected {
            return Err(WriteError::Incomplete { got, expected });
        }
        self.body.finish()
    }

    /// The complete header and the file's first 56 bytes.
    fn envelope(&mut self, digests: Vec<Value>) -> Result<(Vec<u8>, WriteSummary), WriteError> {
        let mut header = std::mem::take(&mut self.header);
        header.insert("bytes".into(), self.body.len.into());
        header.insert("sha256".into(), Value::Array(digests));
        header.insert(
            "chunks".into(),
            Value::Array(std::mem::take(&mut self.chunks)),
        );
        if let Kind::Float { logical } = &self.kind {
            header.insert(
                "logical_sha256".into(),
                hex(&logical.clone().finalize()).into(),
            );
        }
        let mut text = to_canonical_json(&Value::Object(header))?;
        if text.len() > MAX_HEADER_BYTES {
            return Err(WriteError::HeaderTooLarge(text.len()));
        }
        room::fill(&mut text, self.room);
        let n = text.len() as u64;
        let start = (envelope::ENVELOPE_BYTES + text.len()) as u64;
        let mut out = Vec::with_capacity(envelope::ENVELOPE_BYTES + text.len());
        out.extend_from_slice(envelope::SIGNATURE);
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&Sha256::digest(text.as_bytes()));
        out.extend_from_slice(text.as_bytes());
        let summary = WriteSummary {
            header_bytes: n,
            body_bytes: self.body.len,
            file_bytes: start + self.body.len,
        };
        Ok((out, summary))
    }

    /// Writes the header and publishes the file under its name.
    pub fn finish(mut self) -> Result<WriteSummary, WriteError> {
        if self.target.is_none() {
            return Err(WriteError::WrongFinish);
        }
        let written = self.written()?;
        let (head, summary) = self.envelope(written.digests)?;
        let (Sink::Spool(spool, temp), Some(out)) = (written.sink, self.out.take()) else {
            return Err(WriteError::WrongFinish);
        };
        let spooled = spool.finish().map_err(|e| io_error(&temp, e))?;
        if spooled.len != summary.body_bytes {
            return Err(io_error(
                &temp,
                io::Error::new(io::ErrorKind::UnexpectedEof, "spooled body changed size"),
            ));
        }
        let file = spooled.put_head(&head).map_err(|e| io_error(&temp, e))?;
        drop(file);
        out.publish().map_err(publish_error)?;
        Ok(summary)
    }

    /// Finishes an [`in_memory`](Writer::in_memory) writer: the file's bytes.
    pub fn finish_to_vec(mut self) -> Result<Vec<u8>, WriteError> {
        if self.target.is_some() {
            return Err(WriteError::WrongFinish);
        }
        let written = self.written()?;
        let (mut head, _) = self.envelope(written.digests)?;
        match written.sink {
            Sink::Memory(body) => {
                head.extend_from_slice(&body);
                Ok(head)
            }
            Sink::Spool(..) => Err(WriteError::WrongFinish),
        }
    }
}

/// Top-level header members the writer sets itself; callers pass anything
/// else through `WriteSpec::extra` (a re-encode carries the rest along).
pub const RESERVED: &[&str] = &[
    "bytes",
    "chunks",
    "codec",
    "container",
    "container_version",
    "profile",
    "sha256",
    "shape",
    "version",
    "scientific_metadata",
    "logical_sha256",
    "dtype",
    "interval",
    "valid",
    "metadata",
    "empad",
    "intensity_calibration",
    "attributes",
];

fn chunk_scans(spec: &WriteSpec, pixels: u64) -> Result<u64, WriteError> {
    let requested = spec.chunk_scans;
    let bad = |scans: u64, reason: String| WriteError::ChunkScans { scans, reason };
    match spec.content {
        Content::Float32 { .. } => {
            if 4 * pixels > 32 << 20 {
                return Err(WriteError::Shape {
                    shape: spec.shape,
                    reason: "a float32 frame must not exceed 32 MiB".into(),
                });
            }
            let cap = 512.min((8 << 20) / pixels);
            match requested {
                None => Ok(cap),
                Some(s) if (1..=cap).contains(&s) => Ok(s),
                Some(s) => Err(bad(
                    s,
                    format!("float32 chunks hold 1 to {cap} scans for this detector"),
                )),
            }
        }
        _ => {
            // B·P·(2·min(scans, 512) + 4) < 2^32 (spec §6.2).
            let fits = |s: u64| s.div_ceil(INTERVAL) * pixels * (2 * s.min(INTERVAL) + 4) < 1 << 32;
            match requested {
                None => {
                    let mut s = DEFAULT_CHUNK_SCANS;
                    while s > 1 && !fits(s) {
                        s /= 2;
                    }
                    if fits(s) {
                        Ok(s)
                    } else {
                        Err(WriteError::Shape {
                            shape: spec.shape,
                            reason: "the detector is too large for the codec's uint32 offsets"
                                .into(),
                        })
                    }
                }
                Some(s) if s == 0 || s > MAX_COUNT_CHUNK_SCANS => Err(bad(
                    s,
                    format!("chunks hold 1 to {MAX_COUNT_CHUNK_SCANS} scans"),
                )),
                // Not even one scan fits: the detector is at fault, not
                // the length asked for.
                Some(_) if !fits(1) => Err(WriteError::Shape {
                    shape: spec.shape,
                    reason: "the detector is too large for the codec's uint32 offsets".into(),
                }),
                Some(s) if !fits(s) => Err(bad(
                    s,
                    "the chunk would overflow the codec's uint32 offsets".into(),
                )),
                Some(s) => Ok(s),
            }
        }
    }
}

fn valid_hex(valid: &[bool]) -> String {
    let bytes: Vec<u8> = valid
        .chunks(8)
        .map(|bits| {
            bits.iter()
                .enumerate()
                .fold(0u8, |acc, (i, &b)| acc | (u8::from(b) << (7 - i)))
        })
        .collect();
    hex(&bytes)
}

/// The reference writer duplicates a non-trivial mask as nested booleans.
/// Compared, and made, only where needed: as JSON values the mask takes
/// 32 bytes a pixel (8.6 GB for 16384 × 16384).
fn add_valid_pixels(
    metadata: &mut Map<String, Value>,
    valid: &[bool],
    cols: usize,
) -> Result<(), WriteError> {
    let cols = cols.max(1);
    match metadata.get("valid_pixels") {
        Some(existing) if !same_mask(existing, valid, cols) => Err(WriteError::ValidPixels),
        Some(_) => Ok(()),
        None => {
            if valid.iter().any(|&v| !v) {
                let nested = valid
                    .chunks(cols)
                    .map(|row| Value::Array(row.iter().map(|&b| Value::Bool(b)).collect()))
                    .collect();
                metadata.insert("valid_pixels".into(), Value::Array(nested));
            }
            Ok(())
        }
    }
}

/// Whether `nested` is `valid` as rows of `cols` booleans.
fn same_mask(nested: &Value, valid: &[bool], cols: usize) -> bool {
    let Some(rows) = nested.as_array() else {
        return false;
    };
    rows.len() == valid.len().div_ceil(cols)
        && rows.iter().zip(valid.chunks(cols)).all(|(row, want)| {
            row.as_array().is_some_and(|row| {
                row.len() == want.len()
                    && row.iter().zip(want).all(|(v, &w)| v.as_bool() == Some(w))
            })
        })
}

fn check_regions(regions: &[ScaledRegion], frames: u64) -> Result<Vec<u64>, WriteError> {
    let bad = |s: String| Err(WriteError::Regions(s));
    if regions.is_empty() {
        return bad("at least one region is needed".into());
    }
    let mut next = 0;
    for (j, r) in regions.iter().enumerate() {
        if r.first_frame != next {
            return bad(format!(
                "region {j} starts at frame {} instead of {next}",
                r.first_frame
            ));
        }
        if r.stop_frame <= r.first_frame {
            return bad(format!("region {j} is empty"));
        }
        if !(r.scale.is_finite() && r.scale > 0.0) {
            return bad(format!(
                "region {j} has scale {}; it must be finite and positive",
                r.scale
            ));
        }
        if !(r.offset.is_finite() && r.intensity_min.is_finite() && r.intensity_max.is_finite()) {
            return bad(format!(
                "region {j} has a non-finite offset or intensity bound"
            ));
        }
        next = r.stop_frame;
    }
    if next != frames {
        return bad(format!(
            "the regions end at frame {next}, the scan has {frames} frames"
        ));
    }
    Ok(regions.iter().map(|r| r.stop_frame).collect())
}

fn number(x: f64, path: &str) -> Result<Value, WriteError> {
    Number::from_f64(x)
        .map(Value::Number)
        .ok_or_else(|| WriteError::NonFinite { path: path.into() })
}

fn intensity_calibration(
    regions: &[ScaledRegion],
    extra: Map<String, Value>,
    shape: [u64; 4],
) -> Result<Value, WriteError> {
    let mut list = Vec::with_capacity(regions.len());
    for (j, r) in regions.iter().enumerate() {
        let path = |m: &str| format!("intensity_calibration.regions[{j}].{m}");
        let mut o = r.extra.clone();
        o.insert("first_frame".into(), r.first_frame.into());
        o.insert("stop_frame".into(), r.stop_frame.into());
        o.insert("scale".into(), number(r.scale, &path("scale"))?);
        o.insert("offset".into(), number(r.offset, &path("offset"))?);
        o.insert(
            "intensity_min".into(),
            number(r.intensity_min, &path("intensity_min"))?,
        );
        o.insert(
            "intensity_max".into(),
            number(r.intensity_max, &path("intensity_max"))?,
        );
        o.insert("storage".into(), "scaled_uint16".into());
        list.push(Value::Object(o));
    }
    let mut c = extra;
    for key in ["storage", "version", "complete", "source_shape", "regions"] {
        if c.contains_key(key) {
            return Err(WriteError::ReservedMember(format!(
                "intensity_calibration.{key}"
            )));
        }
    }
    c.insert("storage".into(), "scaled_uint16".into());
    c.insert("version".into(), 2.into());
    c.insert("complete".into(), true.into());
    c.insert("source_shape".into(), json!(shape));
    c.insert("regions".into(), Value::Array(list));
    Ok(Value::Object(c))
}

fn u32_bytes(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Lays out one 8-aligned array from its pieces and returns its
/// `{offset, count}` entry.
fn array(body: &mut Body, pieces: impl IntoIterator<Item = Vec<u8>>, count: usize) -> Value {
    let offset = body.align8();
    for piece in pieces {
        body.put(piece);
    }
    json!({"count": count, "offset": offset})
}

fn write_count_arrays(body: &mut Body, s: chunk::Streams) -> Vec<Value> {
    let (offsets, selectors) = (s.offsets.len(), s.selectors.len());
    vec![
        array(body, s.payload, s.payload_len),
        array(body, [u32_bytes(&s.offsets)], offsets),
        array(body, [s.selectors], selectors),
    ]
}

/// Arrays 3–5 of an integer chunk.
struct Index {
    words: Vec<u32>,
    offsets: Vec<u64>,
    widths: Vec<u8>,
}

fn spatial_index(src: Frames<'_>, scans: usize, tiles: &Tiles, valid: &[u16]) -> Index {
    use rayon::prelude::*;
    let fields = tiles.fields();
    let mut sums = vec![0u32; scans * fields];
    let frame_bytes = src.bytes.len() / scans;
    sums.par_chunks_mut(fields)
        .zip(src.bytes.par_chunks(frame_bytes))
        .with_min_len(16)
        .for_each(|(out, frame)| tiles.frame_sums(frame, src.wide, valid, out));
    let mut index = Index {
        words: Vec::new(),
        offsets: vec![0],
        widths: Vec::new(),
    };
    let block = INTERVAL as usize;
    for f0 in (0..scans).step_by(block) {
        let frames = f0..(f0 + block).min(scans);
        for t in 0..fields {
            let column = || frames.clone().map(|f| sums[f * fields + t]);
            let width = spatial::width(column());
            spatial::pack(column(), width, &mut index.words);
            index.widths.push(width);
            index.offsets.push(index.words.len() as u64);
        }
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_is_compared_with_its_nested_form_entry_by_entry() {
        let valid = [true, false, true, true, true, false];
        let mut metadata = Map::new();
        add_valid_pixels(&mut metadata, &valid, 3).unwrap();
        let nested = metadata["valid_pixels"].clone();
        assert_eq!(nested, json!([[true, false, true], [true, true, false]]));
        assert!(same_mask(&nested, &valid, 3));
        add_valid_pixels(&mut metadata, &valid, 3).unwrap();
        for other in [
            json!([[true, false, true], [true, true, true]]),
            json!([[true, false, true], [true, true]]),
            json!([[true, false, true], [true, true, false], []]),
            json!([[true, false, true]]),
            json!([[true, 0, true], [true, true, false]]),
            json!({"rows": 2}),
        ] {
            assert!(!same_mask(&other, &valid, 3), "{other}");
            metadata.insert("valid_pixels".into(), other);
            assert!(matches!(
                add_valid_pixels(&mut metadata, &valid, 3),
                Err(WriteError::ValidPixels)
            ));
        }
        // All valid: nothing added.
        let mut metadata = Map::new();
        add_valid_pixels(&mut metadata, &[true; 6], 3).unwrap();
        assert!(metadata.is_empty());
    }
}
