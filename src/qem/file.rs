//! [`QemFile`]: an opened acquisition and every way of reading it.
//!
//! Opening checks the envelope, the header, the metadata and the chunk table
//! (everything that needs no body byte). Body bytes are exposed only after
//! their 64 MiB checksum block has been verified; each block is hashed once
//! per opened file and its verdict remembered.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::mapguard::Mapping;
use crate::remote::{Address, Staged};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::block::Output;
use super::checksum::{hex, BodyIntegrity, CHECKSUM_BLOCK};
use super::envelope::Envelope;
use super::error::{QemError, Result, StreamFault, StreamSite};
use super::header::{Codec, Dtype, Header, ValidMask};
use super::json::{for_each_element, parse_strict, parse_strict_leaving_out};
use super::layout::{BlockInfo, Chunk, Layout, SpatialArrays};
use super::metadata::ScientificMetadata;
use super::scaled::IntensityCalibration;
use super::spatial::{self, Tile};
use super::stream::StreamTable;

/// The file's bytes, shared (cheaply cloned) with the unverified twin that
/// validation decodes with (see [`QemFile::unverified_twin`]).
#[derive(Clone)]
enum Source {
    /// A mapped file, and its (device, inode) when opened.
    Mapped(Arc<Mapping>, (u64, u64)),
    Owned(Arc<Vec<u8>>),
    /// A remote object, fetched by ranges as they are first checked.
    Staged(Arc<Staged>),
}

impl Source {
    fn faults(&self) -> u64 {
        match self {
            Source::Mapped(m, _) => m.faults(),
            Source::Owned(_) => 0,
            Source::Staged(s) => s.mapping().faults(),
        }
    }

    fn changed(&self) -> bool {
        match self {
            Source::Mapped(m, _) => m.changed(),
            Source::Owned(_) => false,
            Source::Staged(s) => s.mapping().changed(),
        }
    }

    fn release_pages(&self) {
        match self {
            Source::Mapped(m, _) => m.release_pages(),
            Source::Staged(s) => s.mapping().release_pages(),
            Source::Owned(_) => {}
        }
    }

    /// Makes the file's bytes of `range` readable: fetches them, for a
    /// remote object; nothing for the others, which are here whole.
    fn ensure(&self, range: Range<usize>) -> Result<()> {
        match self {
            Source::Staged(s) => s
                .ensure(range.start as u64..range.end as u64)
                .map_err(|e| QemError::from(e.into_io())),
            _ => Ok(()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Source::Mapped(m, _) => &m[..],
            Source::Owned(v) => &v[..],
            Source::Staged(s) => s.bytes(),
        }
    }
}

/// Bytes of a remote object fetched first when it is opened: the envelope
/// and, for all but the largest scans, the whole header.
pub const HEADER_GUESS: u64 = crate::remote::OPENING_BYTES;

/// A structural fault of a chunk's tables, remembered once found.
#[derive(Debug, Clone)]
enum ChunkFault {
    Offsets(String),
    Stream(usize, StreamFault),
    Spatial(String),
}

/// The SHA-256 of a file's bytes as opened, fed in pieces
/// (see [`QemFile::file_digest`]).
pub struct FileDigest<'a> {
    file: &'a QemFile,
    hasher: Sha256,
    /// Bytes hashed so far.
    at: usize,
    /// The mapping's fault count when the digest began.
    faults: u64,
    /// A piece of a remote object could not be fetched.
    failed: bool,
}

impl FileDigest<'_> {
    /// Hashes up to `most` more bytes; true once every byte is hashed (or
    /// hashing failed, which [`finish`](Self::finish) reports).
    pub fn step(&mut self, most: usize) -> bool {
        let end = self.file.file_bytes();
        if self.failed || self.at == end {
            return true;
        }
        let piece = self.at..end.min(self.at.saturating_add(most.max(1)));
        if self.file.source.ensure(piece.clone()).is_err() {
            self.failed = true;
            return true;
        }
        self.hasher.update(&self.file.source.bytes()[piece.clone()]);
        self.at = piece.end;
        self.at == end
    }

    /// Hashes what is left and gives the digest, or `None` when the file
    /// changed while it was hashed (see [`QemFile::file_sha256_hex`]) or
    /// could not be read.
    pub fn finish(mut self, path: &Path) -> Option<String> {
        while !self.step(usize::MAX) {}
        let file = self.file;
        let shorter = match &file.source {
            Source::Mapped(_, id) => std::fs::metadata(path)
                .is_ok_and(|m| (m.dev(), m.ino()) == *id && m.len() < file.file_bytes() as u64),
            Source::Owned(_) | Source::Staged(_) => false,
        };
        let unchanged = !self.failed && file.faults() == self.faults && !shorter;
        unchanged.then(|| hex(&self.hasher.finalize()))
    }
}

/// Decoded streams of selected pixels over all frames.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelStreams {
    /// The requested pixels, in request order.
    pub pixels: Vec<usize>,
    /// Values per pixel: `N`, or a block's frame count from
    /// [`QemFile::decode_block_pixels`].
    pub frames: usize,
    /// Pixel-major values: entry `k * frames + f` is pixel `pixels[k]` at
    /// frame `f`.
    pub values: PixelValues,
}

/// Values of [`PixelStreams`].
#[derive(Debug, Clone, PartialEq)]
pub enum PixelValues {
    /// Integer counts, or the scaled codec's codes (calibrate per frame with
    /// [`QemFile::calibration`]).
    U16(Vec<u16>),
    /// float32 bit patterns.
    F32Bits(Vec<u32>),
}

/// The stored streams of one block, integrity verified and structurally
/// checked (offsets in bounds and nondecreasing, selectors known, lengths
/// fitting their selectors), for decoders outside this crate (GPU).
#[derive(Debug, Clone, Copy)]
pub struct RawBlockStreams<'a> {
    pub block: BlockInfo,
    /// The chunk's whole stream payload; `offsets` index into it.
    pub payload: &'a [u8],
    /// `streams + 1` little-endian u32 offsets into `payload`: stream `j`
    /// of this block is `payload[offsets[j]..offsets[j + 1]]`.
    pub offsets: &'a [u8],
    /// One model selector per stream.
    pub selectors: &'a [u8],
    /// Streams in this block: `P`, or `2P` float lanes (`2p` low half,
    /// `2p + 1` high half of pixel `p`).
    pub streams: usize,
    /// Chunk-relative index of the block's first stream (for error sites).
    pub first_stream: usize,
    /// Values per stream (`m`).
    pub frames: usize,
}

/// An opened `.qem` file.
pub struct QemFile {
    source: Source,
    envelope: Envelope,
    header: Header,
    layout: Layout,
    integrity: BodyIntegrity,
    chunk_tables: Vec<OnceLock<std::result::Result<(), ChunkFault>>>,
    chunk_spatial: Vec<OnceLock<std::result::Result<(), ChunkFault>>>,
    /// Per block (integer codec): whether its spatial index agrees with
    /// its decoded counts, known once any decode of the whole block (for
    /// any reader) compared them. Index products refuse a block found to
    /// disagree.
    block_index: Vec<OnceLock<Result<()>>>,
    pixel_fields: OnceLock<Vec<(u32, u32)>>,
    /// Float codec: the SHA-256 of the whole decoded array once computed,
    /// or the mismatch with `logical_sha256` (see [`super::logical`]).
    pub(super) logical: OnceLock<Result<String>>,
}

impl std::fmt::Debug for QemFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QemFile")
            .field("codec", &self.header.codec)
            .field("shape", &self.header.shape)
            .field("dtype", &self.header.stored_dtype)
            .field("chunks", &self.layout.chunks.len())
            .finish_non_exhaustive()
    }
}

/// Streams per block and the stream index of its first stream.
pub(super) fn block_streams(codec: Codec, pixels: usize, block_in_chunk: usize) -> (usize, usize) {
    match codec {
        Codec::Float => (0, 2 * pixels),
        _ => (block_in_chunk * pixels, pixels),
    }
}

impl QemFile {
    /// Opens and memory-maps `path` (a regular file only: see
    /// [`crate::regular_file`]), checking everything but the body.
    ///
    /// A path whose text is a URL (`s3://BUCKET/KEY`, `http://`,
    /// `https://`: see [`Address::parse`]) opens that object instead,
    /// fetching only its header ([`QemFile::open_remote`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        match Address::of_path(path.as_ref()) {
            Some(Ok(address)) => return Self::open_remote(&address),
            Some(Err(e)) => return Err(e.into_io().into()),
            None => {}
        }
        let file = crate::regular_file::open(path.as_ref())?;
        // A file truncated by another process while mapped faults on
        // access: `mapguard` (when installed) turns that into zeros and a
        // fault count its callers check; the format's writers never modify
        // a published file in place.
        let meta = file.metadata()?;
        Self::from_source(Source::Mapped(
            Arc::new(Mapping::map(&file)?),
            (meta.dev(), meta.ino()),
        ))
    }

    /// Opens a remote object, fetching its envelope and header only (the
    /// opening request's [`HEADER_GUESS`] bytes, and one more request for
    /// the rest of a longer header); body bytes are fetched by checksum block as
    /// they are first checked, and held on local disk (see
    /// [`crate::remote::Staged`]).
    pub fn open_remote(address: &Address) -> Result<Self> {
        let remote = |e: crate::remote::RemoteError| QemError::from(e.into_io());
        let staged = Staged::open(address).map_err(remote)?;
        let size = staged.object().size();
        // The opening request staged the first HEADER_GUESS bytes.
        let bytes = staged.bytes();
        if let Some(n) = bytes.get(8..16) {
            let n = u64::from_le_bytes(n.try_into().unwrap_or([0; 8]));
            // A length past the format's ceiling is refused by the envelope
            // check, before any of it is fetched.
            if n <= super::envelope::MAX_HEADER_BYTES {
                let body_start = n + super::envelope::ENVELOPE_BYTES as u64;
                staged.ensure(0..body_start.min(size)).map_err(remote)?;
            }
        }
        Self::from_source(Source::Staged(Arc::new(staged)))
    }

    /// Reads a file held in memory (tests, fuzzing, network sources).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_source(Source::Owned(Arc::new(bytes)))
    }

    fn from_source(source: Source) -> Result<Self> {
        let file = source.bytes();
        let envelope = Envelope::parse(file)?;
        let text = &file[super::envelope::ENVELOPE_BYTES..envelope.body_start];
        // Only the typed parts of the header are kept, and the chunk table
        // (megabytes of text for a large scan, its parsed tree many times
        // that) is never parsed whole: it is checked with the rest, then
        // read entry by entry. The text stays in the file (`header_object`).
        let value = parse_strict_leaving_out(text, "chunks")?;
        let header = Header::from_value(&value, file.len() as u64, envelope.header_len as u64)?;
        drop(value);
        let integrity = BodyIntegrity::new(&header.sha256, file.len() - envelope.body_start)?;
        let layout = Layout::read(&header, |each| for_each_element(text, "chunks", each))?;
        let n = layout.chunks.len();
        let blocks = layout.blocks.len();
        Ok(QemFile {
            envelope,
            header,
            integrity,
            chunk_tables: (0..n).map(|_| OnceLock::new()).collect(),
            chunk_spatial: (0..n).map(|_| OnceLock::new()).collect(),
            block_index: (0..blocks).map(|_| OnceLock::new()).collect(),
            layout,
            pixel_fields: OnceLock::new(),
            logical: OnceLock::new(),
            source,
        })
    }

    // ----- description ------------------------------------------------

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The header's JSON text as stored (checked when the file was opened;
    /// a source truncated since then fails here).
    pub fn header_text(&self) -> Result<&[u8]> {
        self.source
            .bytes()
            .get(super::envelope::ENVELOPE_BYTES..self.envelope.body_start)
            .ok_or_else(|| QemError::header("(header)", crate::mapguard::CHANGED))
    }

    /// The whole header object as stored, unknown members included, parsed
    /// again from the file (it was checked when the file was opened; a
    /// source truncated since then fails here).
    pub fn header_object(&self) -> Result<serde_json::Map<String, serde_json::Value>> {
        match parse_strict(self.header_text()?)? {
            serde_json::Value::Object(map) => Ok(map),
            _ => Err(QemError::header("(header)", "not a JSON object")),
        }
    }
    pub fn codec(&self) -> Codec {
        self.header.codec
    }
    /// `(scan_row, scan_column, detector_row, detector_column)`.
    pub fn shape(&self) -> [usize; 4] {
        self.header.shape.map(|s| s as usize)
    }
    /// Scan positions `N`.
    pub fn frames(&self) -> usize {
        self.header.frames()
    }
    /// Detector pixels `P`.
    pub fn pixels(&self) -> usize {
        self.header.pixels()
    }
    pub fn stored_dtype(&self) -> Dtype {
        self.header.stored_dtype
    }
    pub fn decoded_dtype(&self) -> Dtype {
        self.header.decoded_dtype()
    }
    /// Bytes of one decoded frame.
    pub fn frame_bytes(&self) -> usize {
        self.pixels() * self.decoded_dtype().size()
    }
    /// Bytes of the whole decoded array, if addressable.
    pub fn dense_bytes(&self) -> Option<usize> {
        self.frames().checked_mul(self.frame_bytes())
    }
    pub fn metadata(&self) -> &ScientificMetadata {
        &self.header.scientific
    }
    /// Detector validity mask (integer codec; other codecs have none).
    pub fn valid_mask(&self) -> Option<&ValidMask> {
        self.header.valid.as_ref()
    }
    /// Regional calibration (scaled codec).
    pub fn calibration(&self) -> Option<&IntensityCalibration> {
        self.header.intensity_calibration.as_ref()
    }
    pub fn chunks(&self) -> &[Chunk] {
        &self.layout.chunks
    }
    /// Decoded blocks, by global index.
    pub fn blocks(&self) -> &[BlockInfo] {
        &self.layout.blocks
    }
    /// Spatial fields per frame (integer codec).
    pub fn spatial_fields(&self) -> usize {
        self.layout.fields
    }
    pub fn block_of_frame(&self, frame: usize) -> Result<&BlockInfo> {
        self.check_frame(frame)?;
        self.layout
            .block_of_frame(frame)
            .ok_or(QemError::OutOfRange {
                what: "frame",
                index: frame,
                limit: self.frames(),
            })
    }
    /// SIGBUS faults absorbed in this file's mapping (see
    /// [`crate::mapguard`]): a reader compares it before and after its
    /// work and reports the file as changed when it moved.
    pub fn faults(&self) -> u64 {
        self.source.faults()
    }

    pub fn file_bytes(&self) -> usize {
        self.source.bytes().len()
    }

    /// SHA-256 of the whole file as opened, lowercase hex: of the mapping,
    /// not of what `path` names now, since a file renamed over this one is
    /// another file. `None` when this file is known to have changed: its
    /// mapping faulted, or `path` still names it and it is shorter now
    /// (bytes past a new end inside the last page read as zeros, with no
    /// fault to count).
    pub fn file_sha256_hex(&self, path: &Path) -> Option<String> {
        self.file_digest().finish(path)
    }

    /// [`file_sha256_hex`](Self::file_sha256_hex) taken piece by piece, for
    /// a caller that hashes the file between other work.
    pub fn file_digest(&self) -> FileDigest<'_> {
        FileDigest {
            file: self,
            hasher: Sha256::new(),
            at: 0,
            faults: self.faults(),
            failed: false,
        }
    }
    pub fn header_bytes(&self) -> usize {
        self.envelope.header_len
    }
    pub fn body_bytes(&self) -> usize {
        self.file_bytes() - self.envelope.body_start
    }
    /// Number of 64 MiB checksum blocks of the body.
    pub fn checksum_blocks(&self) -> usize {
        self.integrity.blocks()
    }

    // ----- checked body access ----------------------------------------

    fn body(&self) -> &[u8] {
        &self.source.bytes()[self.envelope.body_start..]
    }

    /// Body bytes of `range`, after verifying their checksum blocks. A
    /// mapping whose file changed under it (a fault, or a file now shorter:
    /// see [`crate::mapguard`]) serves nothing, as a verified block may
    /// read as zeros now.
    pub(super) fn checked(&self, range: Range<usize>) -> Result<&[u8]> {
        if self.source.changed() {
            return Err(QemError::Changed);
        }
        if !range.is_empty() {
            // Whole checksum blocks: nothing of a block is exposed before
            // all of it is hashed.
            let body_len = self.body_bytes();
            let start = range.start / CHECKSUM_BLOCK * CHECKSUM_BLOCK;
            let end = range.end.div_ceil(CHECKSUM_BLOCK) * CHECKSUM_BLOCK;
            let at = self.envelope.body_start;
            self.source
                .ensure(at + start.min(body_len)..at + end.min(body_len))?;
        }
        let body = self.body();
        self.integrity.ensure(body, range.clone())?;
        body.get(range)
            .ok_or_else(|| QemError::layout(None, "array outside the body"))
    }

    /// Lets go of the mapped file's pages this process has read
    /// ([`Mapping::release_pages`]); nothing for a file held in memory.
    pub fn release_mapped_pages(&self) {
        self.source.release_pages();
    }

    /// Verifies every body checksum block (in parallel).
    pub fn verify_body(&self) -> Result<()> {
        self.source
            .ensure(self.envelope.body_start..self.file_bytes())?;
        self.integrity.ensure_all(self.body())
    }

    /// The verified stream table of chunk `c`, with its structure checked
    /// once: offsets (start 0, nondecreasing, end), and each stream's
    /// selector and length. Payload bytes are verified by the callers, for
    /// the streams they decode.
    pub(super) fn stream_table(&self, c: usize) -> Result<StreamTable<'_>> {
        let chunk = &self.layout.chunks[c];
        let offsets = self.checked(chunk.offsets.clone())?;
        let selectors = self.checked(chunk.selectors.clone())?;
        let table = StreamTable {
            payload: &self.body()[chunk.payload.clone()],
            offsets,
            selectors,
            float: self.codec() == Codec::Float,
        };
        let verdict = self.chunk_tables[c].get_or_init(|| {
            table.check_offsets().map_err(ChunkFault::Offsets)?;
            // Lengths depend on m, which differs for the tail block.
            let pixels = self.pixels();
            for b in 0..chunk.blocks {
                let info = &self.layout.blocks[chunk.first_block + b];
                let (first, count) = block_streams(self.codec(), pixels, b);
                for s in first..first + count {
                    let (sel, bytes) = table.stream(s);
                    super::stream::check_length(sel, bytes.len(), info.frames, table.float)
                        .map_err(|f| ChunkFault::Stream(s, f))?;
                }
            }
            Ok(())
        });
        match verdict {
            Ok(()) => Ok(table),
            Err(ChunkFault::Offsets(reason)) => Err(QemError::StreamOffsets {
                chunk: c,
                reason: reason.clone(),
            }),
            Err(ChunkFault::Stream(s, fault)) => Err(QemError::Stream {
                site: StreamSite {
                    chunk: c,
                    stream: *s,
                },
                fault: *fault,
            }),
            Err(ChunkFault::Spatial(reason)) => Err(QemError::layout(Some(c), reason.clone())),
        }
    }

    /// The stream table of `info`'s chunk and the block's streams
    /// `(first, count)` in it, with the block's payload verified.
    pub(super) fn block_table(&self, info: &BlockInfo) -> Result<(StreamTable<'_>, usize, usize)> {
        let chunk = &self.layout.chunks[info.chunk];
        let table = self.stream_table(info.chunk)?;
        let (first, count) = block_streams(self.codec(), self.pixels(), info.block_in_chunk);
        self.checked(self.payload_span(chunk, &table, first, count))?;
        Ok((table, first, count))
    }

    /// Payload byte range (body-relative) of streams `first..first+count`.
    fn payload_span(
        &self,
        chunk: &Chunk,
        table: &StreamTable<'_>,
        first: usize,
        count: usize,
    ) -> Range<usize> {
        let offset = |s: usize| {
            let b = &table.offsets[4 * s..4 * s + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
        };
        chunk.payload.start + offset(first)..chunk.payload.start + offset(first + count)
    }

    // ----- decoding -----------------------------------------------------

    fn block_info(&self, block: usize) -> Result<&BlockInfo> {
        self.layout.blocks.get(block).ok_or(QemError::OutOfRange {
            what: "block",
            index: block,
            limit: self.layout.blocks.len(),
        })
    }

    /// Decodes every stream of `block` into stream-major values (`m` per
    /// stream; for float, lane `2p` then `2p + 1`), in parallel, with the
    /// dtype range checked.
    #[cfg(test)]
    pub(super) fn block_columns(&self, info: &BlockInfo) -> Result<Vec<u16>> {
        let c = info.chunk;
        let (table, first, count) = self.block_table(info)?;
        let m = info.frames;
        let mut cols = vec![0u16; count * m];
        let group = (32768 / m).max(4);
        let results: Vec<std::result::Result<(), (usize, StreamFault)>> = cols
            .par_chunks_mut(group * m)
            .enumerate()
            .map(|(g, out)| table.decode_range(first + g * group, m, out))
            .collect();
        for r in results {
            r.map_err(|(s, fault)| QemError::Stream {
                site: StreamSite {
                    chunk: c,
                    stream: s,
                },
                fault,
            })?;
        }
        if self.stored_dtype() == Dtype::U8 {
            let bad = cols
                .par_chunks(m)
                .enumerate()
                .find_first(|(_, col)| col.iter().any(|&v| v > 255));
            if let Some((j, col)) = bad {
                // The first such value, as every reader names it.
                let value = col.iter().copied().find(|&v| v > 255).unwrap_or(256);
                return Err(QemError::ValueRange {
                    site: StreamSite {
                        chunk: c,
                        stream: first + j,
                    },
                    value,
                    dtype: "uint8",
                });
            }
        }
        Ok(cols)
    }

    /// Whether several threads should share each block's pixels: when
    /// there are fewer blocks than threads (else one thread per block).
    fn spread(&self, blocks: usize) -> bool {
        blocks < rayon::current_num_threads()
    }

    /// The verified, structurally checked streams of `block`, undecoded.
    pub fn raw_block_streams(&self, block: usize) -> Result<RawBlockStreams<'_>> {
        let info = *self.block_info(block)?;
        let chunk = &self.layout.chunks[info.chunk];
        let table = self.stream_table(info.chunk)?;
        let payload = self.checked(chunk.payload.clone())?;
        let (first, count) = block_streams(self.codec(), self.pixels(), info.block_in_chunk);
        Ok(RawBlockStreams {
            block: info,
            payload,
            offsets: &table.offsets[4 * first..4 * (first + count + 1)],
            selectors: &table.selectors[first..first + count],
            streams: count,
            first_stream: first,
            frames: info.frames,
        })
    }

    /// Decodes one block into dense bytes of the decoded dtype (frame-major,
    /// `decoded_bytes` long).
    pub fn decode_block(&self, block: usize) -> Result<Vec<u8>> {
        let info = *self.block_info(block)?;
        let mut out = vec![0u8; info.decoded_bytes];
        self.decode_block_into(block, &mut out)?;
        Ok(out)
    }

    /// As [`decode_block`](Self::decode_block), into `out`
    /// (`out.len() == blocks()[block].decoded_bytes`).
    pub fn decode_block_into(&self, block: usize, out: &mut [u8]) -> Result<()> {
        let info = *self.block_info(block)?;
        check_len("block buffer", out.len(), info.decoded_bytes)?;
        self.decode_block_frames(&info, 0..info.frames, Output::Values(out), true)
    }

    /// Stored u16 values of one block, frame-major: the counts of the
    /// integer codec or the codes of the scaled codec (not for float).
    pub fn decode_block_codes(&self, block: usize, out: &mut [u16]) -> Result<()> {
        let info = *self.block_info(block)?;
        self.block_codes(&info, out, true)
    }

    /// As [`decode_block_codes`](Self::decode_block_codes), as
    /// little-endian bytes (`2 * frames * pixels` of them).
    pub fn decode_block_codes_le(&self, block: usize, out: &mut [u8]) -> Result<()> {
        let info = *self.block_info(block)?;
        check_len("code buffer", out.len(), 2 * info.frames * self.pixels())?;
        self.decode_block_frames(&info, 0..info.frames, Output::Codes(out), true)
    }

    fn block_codes(&self, info: &BlockInfo, out: &mut [u16], spread: bool) -> Result<()> {
        check_len("code buffer", out.len(), info.frames * self.pixels())?;
        let bytes = bytemuck::cast_slice_mut(out);
        self.decode_block_frames(info, 0..info.frames, Output::Codes(bytes), spread)?;
        // (The codes were written little-endian.)
        out.iter_mut().for_each(|v| *v = u16::from_le(*v));
        Ok(())
    }

    fn check_frame(&self, frame: usize) -> Result<()> {
        if frame >= self.frames() {
            return Err(QemError::OutOfRange {
                what: "frame",
                index: frame,
                limit: self.frames(),
            });
        }
        Ok(())
    }

    /// Decodes frame `frame` into `out` (`frame_bytes()` long).
    pub fn read_frame(&self, frame: usize, out: &mut [u8]) -> Result<()> {
        self.read_frames(frame..frame + 1, out)
    }

    /// Decodes frames `frames` into `out` (`len * frame_bytes()` long).
    pub fn read_frames(&self, frames: Range<usize>, out: &mut [u8]) -> Result<()> {
        self.read_range(frames, out, false)
    }

    /// The stored u16 codes of frames `frames`, little-endian (`2 * pixels`
    /// bytes a frame; integer and scaled codecs), block by block in bounded
    /// windows like [`read_frames`](Self::read_frames).
    pub fn read_frame_codes_le(&self, frames: Range<usize>, out: &mut [u8]) -> Result<()> {
        self.read_range(frames, out, true)
    }

    fn read_range(&self, frames: Range<usize>, out: &mut [u8], codes: bool) -> Result<()> {
        if frames.start > frames.end || frames.end > self.frames() {
            return Err(QemError::OutOfRange {
                what: "frame range end",
                index: frames.end,
                limit: self.frames(),
            });
        }
        let fb = if codes {
            2 * self.pixels()
        } else {
            self.frame_bytes()
        };
        check_len("frame buffer", out.len(), (frames.end - frames.start) * fb)?;
        let mut f = frames.start;
        while f < frames.end {
            let info = *self.block_of_frame(f)?;
            let t0 = f - info.first_frame;
            let t1 = (frames.end - info.first_frame).min(info.frames);
            let at = (f - frames.start) * fb;
            let part = &mut out[at..at + (t1 - t0) * fb];
            let part = if codes {
                Output::Codes(part)
            } else {
                Output::Values(part)
            };
            self.decode_block_frames(&info, t0..t1, part, true)?;
            f = info.first_frame + t1;
        }
        Ok(())
    }

    /// Decodes the whole array into `out` (`dense_bytes()` long), blocks and
    /// streams in parallel. Float files are also checked against
    /// `logical_sha256`, as the reference decoder does.
    pub fn read_all(&self, out: &mut [u8]) -> Result<()> {
        let total = self
            .dense_bytes()
            .ok_or_else(|| QemError::layout(None, "array too large to address"))?;
        check_len("array buffer", out.len(), total)?;
        let mut parts = Vec::with_capacity(self.layout.blocks.len());
        let mut rest = &mut *out;
        for info in &self.layout.blocks {
            let (head, tail) = rest.split_at_mut(info.decoded_bytes);
            parts.push((info, head));
            rest = tail;
        }
        let spread = self.spread(parts.len());
        let results: Vec<Result<()>> = parts
            .into_par_iter()
            .map(|(info, part)| {
                self.decode_block_frames(info, 0..info.frames, Output::Values(part), spread)
            })
            .collect();
        results.into_iter().collect::<Result<()>>()?;
        if self.logical_expected().is_some() {
            self.record(hex(&Sha256::digest(&*out)))?;
        }
        Ok(())
    }

    /// The stored u16 values of the whole array, frame-major (counts or
    /// scaled codes; not for float).
    pub fn read_all_codes(&self, out: &mut [u16]) -> Result<()> {
        let total = self
            .frames()
            .checked_mul(self.pixels())
            .ok_or_else(|| QemError::layout(None, "array too large to address"))?;
        check_len("code buffer", out.len(), total)?;
        let p = self.pixels();
        let mut parts = Vec::with_capacity(self.layout.blocks.len());
        let mut rest = out;
        for info in &self.layout.blocks {
            let (head, tail) = rest.split_at_mut(info.frames * p);
            parts.push((info, head));
            rest = tail;
        }
        let spread = self.spread(parts.len());
        let results: Vec<Result<()>> = parts
            .into_par_iter()
            .map(|(info, part)| self.block_codes(info, part, spread))
            .collect();
        results.into_iter().collect()
    }

    /// Decodes the streams of `pixels` over all frames, without decoding
    /// other pixels. Pixels may repeat; each must be `< pixels()`. Each
    /// block's index fields covered by the pixels are checked on the way
    /// (see [`super::partial_index`]).
    pub fn decode_pixels(&self, pixels: &[usize]) -> Result<PixelStreams> {
        self.check_pixels(pixels)?;
        let n = self.frames();
        let len = pixels
            .len()
            .checked_mul(n)
            .ok_or_else(|| QemError::layout(None, "request too large"))?;
        let mut values = match self.codec() {
            Codec::Float => PixelValues::F32Bits(vec![0u32; len]),
            _ => PixelValues::U16(vec![0u16; len]),
        };
        // The index fields these pixels cover are checked on the way, each
        // pixel counted once however often it is asked for: `firsts` are
        // the request positions of first occurrences.
        let coverage = self.index_coverage(pixels);
        let firsts: Vec<usize> = match coverage {
            Some(_) => {
                let mut seen = vec![false; self.pixels()];
                (0..pixels.len())
                    .filter(|&k| !std::mem::replace(&mut seen[pixels[k]], true))
                    .collect()
            }
            None => Vec::new(),
        };
        let once: Vec<usize> = firsts.iter().map(|&k| pixels[k]).collect();
        for info in &self.layout.blocks {
            let check = coverage.as_ref().and_then(|c| c.check(self, info.index));
            let part = self.decode_block_pixels(info.index, pixels)?;
            let m = info.frames;
            if let (Some(check), PixelValues::U16(v)) = (check, &part.values) {
                if once.len() == pixels.len() {
                    check.add(self, pixels, v);
                } else {
                    let values: Vec<u16> = firsts
                        .iter()
                        .flat_map(|&k| v[k * m..(k + 1) * m].iter().copied())
                        .collect();
                    check.add(self, &once, &values);
                }
                check.finish(self);
            }
            let range = info.frame_range();
            match (&mut values, part.values) {
                (PixelValues::U16(all), PixelValues::U16(v)) => {
                    for (k, col) in v.chunks_exact(m).enumerate() {
                        all[k * n..(k + 1) * n][range.clone()].copy_from_slice(col);
                    }
                }
                (PixelValues::F32Bits(all), PixelValues::F32Bits(v)) => {
                    for (k, col) in v.chunks_exact(m).enumerate() {
                        all[k * n..(k + 1) * n][range.clone()].copy_from_slice(col);
                    }
                }
                _ => unreachable!("one codec per file"),
            }
        }
        Ok(PixelStreams {
            pixels: pixels.to_vec(),
            frames: n,
            values,
        })
    }

    fn check_pixels(&self, pixels: &[usize]) -> Result<()> {
        let p_count = self.pixels();
        match pixels.iter().find(|&&p| p >= p_count) {
            Some(&p) => Err(QemError::OutOfRange {
                what: "pixel",
                index: p,
                limit: p_count,
            }),
            None => Ok(()),
        }
    }

    /// Decodes the streams of `pixels` within one block only: pixel-major,
    /// [`BlockInfo::frames`] values per pixel (float: the joined lanes as
    /// bits). Pixels may repeat; each must be `< pixels()`. Streams are
    /// decoded in lockstep groups, in parallel.
    pub fn decode_block_pixels(&self, block: usize, pixels: &[usize]) -> Result<PixelStreams> {
        self.check_pixels(pixels)?;
        let info = *self.block_info(block)?;
        let c = info.chunk;
        let (table, first, _) = self.block_table(&info)?;
        let m = info.frames;
        let float = self.codec() == Codec::Float;
        let spp = if float { 2 } else { 1 };
        let u8_counts = self.stored_dtype() == Dtype::U8;
        let fault = |(s, fault): (usize, StreamFault)| QemError::Stream {
            site: StreamSite {
                chunk: c,
                stream: s,
            },
            fault,
        };
        // About 16 Ki decoded values per task.
        let group = (16384 / (m * spp).max(1)).max(8);
        let decode_group = |ps: &[usize], out: &mut [u16]| -> Result<()> {
            let streams = ps
                .iter()
                .flat_map(|&p| (0..spp).map(move |lane| first + spp * p + lane));
            table.decode_streams(streams, m, out).map_err(fault)?;
            if u8_counts {
                if let Some(j) = out.iter().position(|&v| v > 255) {
                    return Err(QemError::ValueRange {
                        site: StreamSite {
                            chunk: c,
                            stream: first + ps[j / m],
                        },
                        value: out[j],
                        dtype: "uint8",
                    });
                }
            }
            Ok(())
        };
        let values = if float {
            let mut bits = vec![0u32; pixels.len() * m];
            bits.par_chunks_mut(group * m.max(1))
                .zip(pixels.par_chunks(group))
                .try_for_each(|(dst, ps)| -> Result<()> {
                    let mut lanes = vec![0u16; 2 * dst.len()];
                    decode_group(ps, &mut lanes)?;
                    for (d, pair) in dst.chunks_exact_mut(m).zip(lanes.chunks_exact(2 * m)) {
                        let (lo, hi) = pair.split_at(m);
                        for ((d, &lo), &hi) in d.iter_mut().zip(lo).zip(hi) {
                            *d = u32::from(lo) | (u32::from(hi) << 16);
                        }
                    }
                    Ok(())
                })?;
            PixelValues::F32Bits(bits)
        } else {
            let mut vals = vec![0u16; pixels.len() * m];
            vals.par_chunks_mut(group * m.max(1))
                .zip(pixels.par_chunks(group))
                .try_for_each(|(dst, ps)| decode_group(ps, dst))?;
            PixelValues::U16(vals)
        };
        Ok(PixelStreams {
            pixels: pixels.to_vec(),
            frames: m,
            values,
        })
    }

    // ----- spatial index ------------------------------------------------

    /// Verified spatial arrays of chunk `c`, with their structure checked
    /// once (word offsets, widths, word counts).
    pub(super) fn spatial_arrays(&self, c: usize) -> Result<(&[u8], &[u8], &[u8])> {
        let chunk = &self.layout.chunks[c];
        let Some(SpatialArrays {
            words,
            word_offsets,
            widths,
        }) = &chunk.spatial
        else {
            return Err(QemError::header(
                "codec",
                "only the integer codec has a spatial index",
            ));
        };
        let words = self.checked(words.clone())?;
        let offs = self.checked(word_offsets.clone())?;
        let widths = self.checked(widths.clone())?;
        let fields = self.layout.fields;
        let verdict = self.chunk_spatial[c].get_or_init(|| {
            let off = |i: usize| {
                u64::from_le_bytes(offs[8 * i..8 * i + 8].try_into().unwrap_or([0xff; 8]))
            };
            if off(0) != 0 {
                return Err(ChunkFault::Spatial(
                    "spatial word offsets do not start at 0".into(),
                ));
            }
            for b in 0..chunk.blocks {
                let m = self.layout.blocks[chunk.first_block + b].frames as u64;
                for t in 0..fields {
                    let i = b * fields + t;
                    let w = u64::from(widths[i]);
                    if w > 32 {
                        return Err(ChunkFault::Spatial(format!(
                            "spatial stream {i} has width {w} > 32"
                        )));
                    }
                    let want = (m * w).div_ceil(32);
                    if off(i + 1).checked_sub(off(i)) != Some(want) {
                        return Err(ChunkFault::Spatial(format!(
                            "spatial stream {i} word offsets disagree with width {w}"
                        )));
                    }
                }
            }
            if off(chunk.blocks * fields) != (words.len() / 4) as u64 {
                return Err(ChunkFault::Spatial(
                    "spatial word offsets do not end at the packed-sum count".into(),
                ));
            }
            Ok(())
        });
        match verdict {
            Ok(()) => Ok((words, offs, widths)),
            Err(ChunkFault::Spatial(r) | ChunkFault::Offsets(r)) => {
                Err(QemError::layout(Some(c), r.clone()))
            }
            Err(ChunkFault::Stream(s, f)) => Err(QemError::Stream {
                site: StreamSite {
                    chunk: c,
                    stream: *s,
                },
                fault: *f,
            }),
        }
    }

    /// All fields of one block from the index: `out[t * m + k]` (the tests'
    /// reference verdict; readers unpack only the fields they need).
    #[cfg(test)]
    fn block_spatial(&self, info: &BlockInfo) -> Result<Vec<u32>> {
        let arrays = self.spatial_arrays(info.chunk)?;
        let m = info.frames;
        let mut out = vec![0u32; self.layout.fields * m];
        for (t, field) in out.chunks_exact_mut(m.max(1)).enumerate() {
            self.block_field(arrays, info, t, field);
        }
        Ok(out)
    }

    /// Field `t` of one block from its chunk's checked spatial `arrays`
    /// (`out.len() == m`).
    pub(super) fn block_field(
        &self,
        arrays: (&[u8], &[u8], &[u8]),
        info: &BlockInfo,
        t: usize,
        out: &mut [u32],
    ) {
        self.block_field_frames(arrays, info, t, 0, out)
    }

    /// Field `t` of block frames `k0..k0 + out.len()` (within the block).
    pub(super) fn block_field_frames(
        &self,
        (words, offs, widths): (&[u8], &[u8], &[u8]),
        info: &BlockInfo,
        t: usize,
        k0: usize,
        out: &mut [u32],
    ) {
        let i = info.block_in_chunk * self.layout.fields + t;
        let a = u64::from_le_bytes(offs[8 * i..8 * i + 8].try_into().unwrap_or_default()) as usize;
        let b =
            u64::from_le_bytes(offs[8 * i + 8..8 * i + 16].try_into().unwrap_or_default()) as usize;
        spatial::unpack_from(&words[4 * a..4 * b], u32::from(widths[i]), k0, out);
    }

    /// Tile sums from the spatial index (integer codec), without decoding
    /// counts: frame-major, `grid.0 * grid.1` values per frame in tile-row
    /// order, for frames `frames`. A block whose index was already found to
    /// disagree with its counts (by any decode of it) is refused.
    pub fn spatial_sums(&self, tile: Tile, frames: Range<usize>) -> Result<Vec<u32>> {
        self.spatial_sums_checked(tile, frames, false)
    }

    /// [`spatial_sums`](Self::spatial_sums), with every block it uses
    /// decoded and checked against its counts first
    /// ([`verify_block_index`](Self::verify_block_index)) when `verify`:
    /// exact even for a forged index whose file checksums were recomputed,
    /// at the cost of decoding those blocks once.
    pub fn spatial_sums_checked(
        &self,
        tile: Tile,
        frames: Range<usize>,
        verify: bool,
    ) -> Result<Vec<u32>> {
        if frames.start > frames.end || frames.end > self.frames() {
            return Err(QemError::OutOfRange {
                what: "frame range end",
                index: frames.end,
                limit: self.frames(),
            });
        }
        let [_, _, r, c] = self.shape();
        let (gr, gc) = tile.grid(r, c);
        let tiles = gr * gc;
        let base = tile.first_field(r, c);
        let mut out = vec![0u32; (frames.end - frames.start) * tiles];
        let mut f = frames.start;
        while f < frames.end {
            let info = *self.block_of_frame(f)?;
            self.usable_index(&info, verify)?;
            // Only this tile size's fields, and only the frames asked for:
            // every field of a 2048×2040 block is 134 MB, this tile's 8 MB.
            let arrays = self.spatial_arrays(info.chunk)?;
            let (k0, k1) = (
                f - info.first_frame,
                (frames.end - info.first_frame).min(info.frames),
            );
            let mut field = vec![0u32; k1 - k0];
            for j in 0..tiles {
                self.block_field_frames(arrays, &info, base + j, k0, &mut field);
                for (k, &v) in field.iter().enumerate() {
                    out[(info.first_frame + k0 + k - frames.start) * tiles + j] = v;
                }
            }
            f = info.first_frame + k1;
        }
        Ok(out)
    }

    /// Adds to `out` (one value per frame of block `block`) the sum of the
    /// index's `tiles` of size `tile` (numbered in tile-row order) in each
    /// frame, with the checks of
    /// [`spatial_sums_checked`](Self::spatial_sums_checked). Only those
    /// tiles' fields are unpacked, each straight into the frames' sums: a
    /// virtual image of a new geometry gathered every 8×8 tile of every
    /// frame, transposed frame-major, to add up the few it covers.
    pub fn add_tile_sums(
        &self,
        tile: Tile,
        tiles: &[usize],
        block: usize,
        verify: bool,
        out: &mut [u64],
    ) -> Result<()> {
        let info = *self.block_info(block)?;
        check_len("tile sums output", out.len(), info.frames)?;
        self.usable_index(&info, verify)?;
        let [_, _, r, c] = self.shape();
        let (gr, gc) = tile.grid(r, c);
        let base = tile.first_field(r, c);
        let arrays = self.spatial_arrays(info.chunk)?;
        let mut field = vec![0u32; info.frames];
        for &t in tiles {
            if t >= gr * gc {
                return Err(QemError::OutOfRange {
                    what: "tile",
                    index: t,
                    limit: gr * gc,
                });
            }
            self.block_field_frames(arrays, &info, base + t, 0, &mut field);
            for (o, &v) in out.iter_mut().zip(&field) {
                *o += u64::from(v);
            }
        }
        Ok(())
    }

    /// Whether block `info`'s index may be used: checked against its
    /// counts first when `verify`, else refused only once some decode
    /// found it to disagree.
    fn usable_index(&self, info: &BlockInfo, verify: bool) -> Result<()> {
        if verify {
            self.verify_block_index(info.index)
        } else if let Some(Err(e)) = self.block_index_verdict(info.index) {
            Err(e)
        } else {
            Ok(())
        }
    }

    /// The field of every pixel, and the validity mask (all valid when the
    /// file has none), for summing decoded counts per field.
    pub(super) fn index_inputs(&self) -> (&[(u32, u32)], std::borrow::Cow<'_, ValidMask>) {
        let [_, _, r, c] = self.shape();
        let pf = self
            .pixel_fields
            .get_or_init(|| spatial::pixel_fields(r, c));
        let valid = match self.valid_mask() {
            Some(v) => std::borrow::Cow::Borrowed(v),
            None => std::borrow::Cow::Owned(ValidMask::all_valid(self.pixels())),
        };
        (pf, valid)
    }

    /// Checks one decoded integer block (stream-major columns) against the
    /// spatial index.
    #[cfg(test)]
    pub(super) fn check_spatial(&self, info: &BlockInfo, cols: &[u16]) -> Result<()> {
        if let Some(known) = self.block_index[info.index].get() {
            return known.clone();
        }
        let (pf, valid) = self.index_inputs();
        let computed =
            spatial::sums_from_columns(cols, info.frames, self.layout.fields, pf, &valid);
        self.record_index(info, &computed)
    }

    /// Compares the decoded per-field sums of a block (`computed[t * m +
    /// k]`) with its stored index and remembers the verdict.
    #[cfg(test)]
    pub(super) fn record_index(&self, info: &BlockInfo, computed: &[u64]) -> Result<()> {
        let verdict = self.block_spatial(info).and_then(|stored| {
            let m = info.frames;
            let first = spatial::first_disagreement(
                0..self.layout.fields,
                m,
                |t, out| out.copy_from_slice(&stored[t * m..(t + 1) * m]),
                |t, k| computed[t * m + k],
            );
            first.map_or(Ok(()), |d| Err(info.index_disagreement(d)))
        });
        self.block_index[info.index].get_or_init(|| verdict).clone()
    }

    /// Whether block `block`'s spatial index is known to agree with its
    /// counts (`None`: no whole decode of it has compared them yet).
    pub fn block_index_verdict(&self, block: usize) -> Option<Result<()>> {
        self.block_index.get(block)?.get().cloned()
    }

    /// Decodes block `block` (unless its verdict is known) and checks its
    /// spatial index against the counts.
    pub fn verify_block_index(&self, block: usize) -> Result<()> {
        let info = *self.block_info(block)?;
        if let Some(known) = self.block_index_verdict(block) {
            return known;
        }
        self.decode_block_frames(&info, 0..info.frames, Output::Check, true)?;
        self.block_index_verdict(block).unwrap_or(Ok(()))
    }

    /// Remembers block `info`'s index verdict (the first one stands).
    pub(super) fn remember_index(&self, info: &BlockInfo, verdict: Result<()>) {
        let _ = self.block_index[info.index].get_or_init(|| verdict);
    }

    // ----- validation ---------------------------------------------------

    /// Quick structural checks of every chunk: stream tables and, for the
    /// integer codec, the spatial index structure. Body checksums included.
    pub(crate) fn check_structure(&self) -> Result<()> {
        self.verify_body()?;
        for c in 0..self.layout.chunks.len() {
            self.stream_table(c)?;
            if self.codec() == Codec::Integer {
                self.spatial_arrays(c)?;
            }
        }
        Ok(())
    }

    /// Distinct model selectors present in the file (after structure checks).
    pub(crate) fn selectors_present(&self) -> Result<Vec<u8>> {
        let mut seen = [false; 256];
        for chunk in &self.layout.chunks {
            for &s in self.checked(chunk.selectors.clone())? {
                seen[usize::from(s)] = true;
            }
        }
        Ok((0..=255u8).filter(|&s| seen[usize::from(s)]).collect())
    }

    /// Runs `work` while the body's checksum blocks are verified beside
    /// it, instead of before it: a 64 MiB checksum block hashes on one
    /// thread, and a full validation or a file's first virtual image
    /// waited for it with the other cores idle. `work` reads an
    /// unverified twin of this file (`unverified_twin`); its value is
    /// returned, and the verdicts it reached are adopted, only once every
    /// block has verified. A checksum failure is the answer otherwise,
    /// whatever `work` found. With every block verified already, or one
    /// thread, `work` reads this file, which verifies before each use.
    pub fn beside_checksums<T: Send>(&self, work: impl FnOnce(&QemFile) -> T + Send) -> Result<T> {
        self.beside_verification(false, || self.verify_body(), work)
    }

    /// Runs `work`, which reads chunk `c`, beside the verification of the
    /// body checksum blocks that chunk lies in when their verdicts are not
    /// yet known, as [`beside_checksums`](Self::beside_checksums) does for
    /// the whole body: a reader's first decode in a chunk then takes about
    /// the longer of the two, not their sum (the 16 ms digest of a 25 MB
    /// body, on one core, came before the first block's decode).
    pub fn beside_chunk_checks<T: Send>(
        &self,
        c: usize,
        work: impl FnOnce(&QemFile) -> T + Send,
    ) -> Result<T> {
        let range = self
            .layout
            .chunks
            .get(c)
            .ok_or_else(|| QemError::layout(None, "no such chunk"))?
            .body_range();
        let known = self.integrity.known(range.clone());
        self.beside_verification(known, || self.checked(range).map(|_| ()), work)
    }

    /// `work` on an unverified twin beside `verify`, its value kept and
    /// the twin's verdicts adopted only once `verify` passes; on this file
    /// itself when the verdicts are `known` already, with one thread, or
    /// when no twin is worth making.
    fn beside_verification<T: Send>(
        &self,
        known: bool,
        verify: impl FnOnce() -> Result<()> + Send,
        work: impl FnOnce(&QemFile) -> T + Send,
    ) -> Result<T> {
        let twin = (!known && rayon::current_num_threads() > 1)
            .then(|| self.unverified_twin())
            .flatten();
        let Some(twin) = twin else {
            return Ok(work(self));
        };
        let (verified, value) = rayon::join(verify, || work(&twin));
        verified?;
        self.adopt_verdicts(twin);
        Ok(value)
    }

    /// A reader of the same bytes that takes every body checksum block as
    /// verified, for [`beside_checksums`](Self::beside_checksums) and
    /// [`beside_chunk_checks`](Self::beside_chunk_checks) alone:
    /// its decoders must (and do, see `fuzz/`) survive any bytes, and
    /// nothing it reads is kept unless the checksums verify. `None` when
    /// copying the header would cost more than the wait it saves.
    fn unverified_twin(&self) -> Option<QemFile> {
        if self.integrity.all_known() || self.header_bytes() > self.body_bytes() / 16 {
            return None;
        }
        let n = self.layout.chunks.len();
        Some(QemFile {
            source: self.source.clone(),
            envelope: self.envelope,
            header: self.header.clone(),
            layout: self.layout.clone(),
            integrity: self.integrity.assumed(),
            chunk_tables: (0..n).map(|_| OnceLock::new()).collect(),
            chunk_spatial: (0..n).map(|_| OnceLock::new()).collect(),
            block_index: (0..self.layout.blocks.len())
                .map(|_| OnceLock::new())
                .collect(),
            pixel_fields: OnceLock::new(),
            logical: OnceLock::new(),
        })
    }

    /// Takes over the structure, block index and float checksum verdicts
    /// `twin` reached, once this file's own body checksums have verified
    /// the bytes they were reached from.
    fn adopt_verdicts(&self, twin: QemFile) {
        let tables = self.chunk_tables.iter().zip(twin.chunk_tables);
        let spatial = self.chunk_spatial.iter().zip(twin.chunk_spatial);
        for (mine, theirs) in tables.chain(spatial) {
            if let Some(verdict) = theirs.into_inner() {
                let _ = mine.set(verdict);
            }
        }
        for (mine, theirs) in self.block_index.iter().zip(twin.block_index) {
            if let Some(verdict) = theirs.into_inner() {
                let _ = mine.set(verdict);
            }
        }
        if let Some(verdict) = twin.logical.into_inner() {
            let _ = self.logical.set(verdict);
        }
    }

    /// Decodes every block (bounded memory), checks the dtype range, the
    /// spatial index (integer) and `logical_sha256` (float).
    pub(crate) fn check_decode(&self) -> Result<()> {
        if self.codec() == Codec::Float {
            return self.verify_logical().map(|_| ());
        }
        let blocks = &self.layout.blocks;
        for batch in block_batches(blocks) {
            let spread = self.spread(batch.len());
            // Collected, so that the first bad block in file order is the
            // one reported.
            let verdicts: Vec<Result<()>> = blocks[batch]
                .par_iter()
                .map(|info| {
                    self.decode_block_frames(info, 0..info.frames, Output::Check, spread)?;
                    match self.codec() {
                        Codec::Integer => self.block_index_verdict(info.index).unwrap_or(Ok(())),
                        _ => Ok(()),
                    }
                })
                .collect();
            verdicts.into_iter().collect::<Result<()>>()?;
        }
        Ok(())
    }
}

/// Decoded bytes held at once by a whole-file pass (validation, the
/// logical checksum): blocks are decoded in parallel a batch at a time.
const BATCH_BYTES: usize = 256 * 1024 * 1024;

/// Consecutive runs of `blocks` of at most [`BATCH_BYTES`] decoded (a
/// larger block is a batch of its own), in file order.
pub(crate) fn block_batches(
    blocks: &[BlockInfo],
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= blocks.len() {
            return None;
        }
        let start = i;
        let mut bytes = 0usize;
        while i < blocks.len() && (i == start || bytes + blocks[i].decoded_bytes <= BATCH_BYTES) {
            bytes += blocks[i].decoded_bytes;
            i += 1;
        }
        Some(start..i)
    })
}

fn check_len(what: &'static str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(QemError::OutOfRange {
            what,
            index: got,
            limit: want,
        });
    }
    Ok(())
}
