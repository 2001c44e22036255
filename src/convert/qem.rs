//! `.qem` as a source (decoded block by block; scaled files as their codes
//! when re-encoded, so the codes are kept exactly) and as a sink (the
//! library's writer, which publishes atomically).

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::element::Element;
use super::{ConvertError, Description, Options, Sink, Source};
use crate::qem::write::{
    Content, CountDtype, ScaledRegion, WriteSpec, Writer, DEFAULT_CHUNK_SCANS, RESERVED,
};

/// Most frame bytes one chunk of a written `.qem` buffers (see [`QemSink::create`]).
pub const CHUNK_BYTES: u64 = 256 << 20;

/// Most frame bytes a chunk of a chosen `--chunk-scans` may buffer: a
/// chunk's pixel streams each run through all its frames, so the writer
/// holds them all.
pub const MAX_CHUNK_BYTES: u64 = 4 * CHUNK_BYTES;
use crate::qem::{BlockCursor, Codec, Dtype, LogicalDigest, QemFile};

pub struct QemSource {
    path: PathBuf,
    file: QemFile,
    codes: bool,
    description: Description,
    /// The last decoded window: its frames and their bytes.
    block: Vec<u8>,
    block_frames: Range<usize>,
    /// Where the block being read stands.
    cursor: Option<BlockCursor>,
    /// Float files: `logical_sha256` checked as the blocks go by, so that
    /// the last window fails (before any sink publishes) on a mismatch.
    logical: Option<LogicalDigest>,
}

impl QemSource {
    /// Opens `path`; `codes`: a scaled file yields its uint16 codes (for a
    /// re-encode) rather than its float32 values.
    pub fn open(path: &Path, codes: bool) -> Result<QemSource, ConvertError> {
        let file = QemFile::open(path).map_err(|e| ConvertError::read(path, e))?;
        let codes = codes && file.codec() == Codec::Scaled;
        let description = describe(path, &file, codes)?;
        let logical = file.logical_expected().map(|_| file.logical_digest());
        Ok(QemSource {
            logical,
            path: path.to_path_buf(),
            file,
            codes,
            description,
            block: Vec::new(),
            block_frames: 0..0,
            cursor: None,
        })
    }

    /// Decodes the window holding `frame` (a whole ordinary block, a
    /// window of a block larger than [`crate::qem::WINDOW_BYTES`]): the next window of
    /// the block being read when it is that one, else from the block's
    /// first frame on.
    fn load_window_of(&mut self, frame: usize) -> Result<(), ConvertError> {
        let read = |e| ConvertError::read(&self.path, e);
        let info = *self.file.block_of_frame(frame).map_err(read)?;
        let w = self.file.window_frames(info.index);
        let want = (frame - info.first_frame) / w * w;
        let resumable = self
            .cursor
            .as_ref()
            .is_some_and(|c| c.block() == info.index && c.next_frame() <= want);
        if !resumable {
            self.cursor = Some(self.file.block_cursor(info.index).map_err(read)?);
        }
        let Some(cursor) = self.cursor.as_mut() else {
            return Ok(());
        };
        if cursor.next_frame() < want {
            let skip = want - cursor.next_frame();
            cursor.skip(&self.file, skip).map_err(read)?;
        }
        let n = w.min(info.frames - want);
        if self.codes {
            self.block.resize(2 * n * self.file.pixels(), 0);
            cursor
                .read_codes_le(&self.file, n, &mut self.block)
                .map_err(read)?;
        } else {
            self.block.resize(n * self.file.frame_bytes(), 0);
            cursor.read(&self.file, n, &mut self.block).map_err(read)?;
            if let Some(digest) = &mut self.logical {
                digest
                    .feed_window(&self.file, info.index, want..want + n, &self.block)
                    .map_err(read)?;
            }
        }
        let first = info.first_frame + want;
        self.block_frames = first..first + n;
        Ok(())
    }
}

impl Source for QemSource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let frame_bytes = self.description.frame_bytes();
        let mut frame = first as usize;
        let mut at = 0;
        while at < out.len() {
            if !self.block_frames.contains(&frame) {
                self.load_window_of(frame)?;
            }
            let from = (frame - self.block_frames.start) * frame_bytes;
            let n = (self.block.len() - from).min(out.len() - at);
            out[at..at + n].copy_from_slice(&self.block[from..from + n]);
            at += n;
            frame += n / frame_bytes;
        }
        if frame == self.file.frames() {
            if let Some(digest) = self.logical.take() {
                digest
                    .finish(&self.file)
                    .map_err(|e| ConvertError::read(&self.path, e))?;
            }
        }
        Ok(())
    }
}

fn element(d: Dtype) -> Element {
    match d {
        Dtype::U8 => Element::U8,
        Dtype::U16 => Element::U16,
        Dtype::F32 => Element::F32,
    }
}

/// The description that re-encodes `file` with its metadata, mask,
/// calibration and unknown members kept.
fn describe(path: &Path, file: &QemFile, codes: bool) -> Result<Description, ConvertError> {
    let header = file.header();
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
        Codec::Scaled => scaled_content(path, file)?,
    };
    let mut extra = file
        .header_object()
        .map_err(|e| ConvertError::read(path, e))?;
    for k in RESERVED {
        extra.remove(*k);
    }
    Ok(Description {
        shape: header.shape,
        element: if codes {
            Element::U16
        } else {
            element(file.decoded_dtype())
        },
        content,
        scientific_metadata: Value::Object(header.scientific.raw.clone()),
        extra,
    })
}

fn scaled_content(path: &Path, file: &QemFile) -> Result<Content, ConvertError> {
    let header = file.header();
    let cal = file
        .calibration()
        .ok_or_else(|| ConvertError::input(path, "scaled file without intensity_calibration"))?;
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
    Ok(Content::Scaled {
        regions,
        calibration_extra,
        attributes: header.attributes.clone().unwrap_or_default(),
    })
}

/// A `.qem` output: the library's writer never replaces a file, or with
/// `--force` replaces it in one rename at the end.
pub struct QemSink {
    path: PathBuf,
    writer: Writer,
}

impl QemSink {
    pub fn create(
        path: &Path,
        d: &Description,
        options: &Options,
    ) -> Result<QemSink, ConvertError> {
        let fits = matches!(
            (&d.content, d.element),
            (
                Content::Counts {
                    dtype: CountDtype::U8,
                    ..
                },
                Element::U8
            ) | (
                Content::Counts {
                    dtype: CountDtype::U16,
                    ..
                },
                Element::U16
            ) | (Content::Float32 { .. }, Element::F32)
                | (Content::Scaled { .. }, Element::U16)
        );
        if !fits {
            return Err(ConvertError::input(
                path,
                format!(
                    "{} frames do not fit the content described",
                    d.element.name()
                ),
            ));
        }
        let mut spec = WriteSpec::counts(d.shape, CountDtype::U8, d.scientific_metadata.clone());
        spec.content = d.content.clone();
        spec.extra = d.extra.clone();
        match options.chunk_scans {
            Some(n) if n.saturating_mul(d.frame_bytes() as u64) > MAX_CHUNK_BYTES => {
                return Err(ConvertError::input(
                    path,
                    format!(
                        "--chunk-scans {n}: a chunk of {n} frames of {} bytes is held in memory while it is written, more than the {} MiB ceiling; at most {} scans fit",
                        d.frame_bytes(),
                        MAX_CHUNK_BYTES >> 20,
                        (MAX_CHUNK_BYTES / d.frame_bytes().max(1) as u64).max(1)
                    ),
                ));
            }
            Some(n) => spec = spec.with_chunk_scans(n),
            // The writer buffers a whole chunk: for large detectors the
            // default 512 scans would cost gigabytes, so the chunk is
            // shortened until it holds at most CHUNK_BYTES of frames.
            None if !matches!(d.content, Content::Float32 { .. }) => {
                let mut scans = DEFAULT_CHUNK_SCANS;
                while scans > 1 && scans * d.frame_bytes() as u64 > CHUNK_BYTES {
                    scans /= 2;
                }
                if scans < DEFAULT_CHUNK_SCANS {
                    spec = spec.with_chunk_scans(scans);
                }
            }
            None => {}
        }
        let writer = if options.force {
            Writer::create_replacing(path, spec)
        } else {
            Writer::create(path, spec)
        }
        .map_err(|e| ConvertError::write(path, e))?;
        Ok(QemSink {
            path: path.to_path_buf(),
            writer,
        })
    }
}

impl Sink for QemSink {
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
        self.writer
            .push(window)
            .map_err(|e| ConvertError::write(&self.path, e))
    }

    fn publish(self: Box<Self>) -> Result<(), ConvertError> {
        let QemSink { path, writer } = *self;
        writer
            .finish()
            .map(drop)
            .map_err(|e| ConvertError::write(&path, e))
    }
}
