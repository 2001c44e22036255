//! Quantum Detectors Merlin `.mib` files: every frame is an ASCII header
//! (`MQ1,<sequence>,<header bytes>,<chips>,<width>,<height>,<pixel type>,
//! <layout>,...,<bit depth>,`) followed by its pixels, in the layouts the
//! Merlin manual describes and LiberTEM's and rosettasciio's readers read:
//!
//! * non-raw `U08` (1- and 6-bit counters), `U16` (12-bit), `U32` (24-bit):
//!   big-endian integers in row order;
//! * raw `R64` of one chip: 1-bit pixels packed LSB-first, 64 to a
//!   word whose 8 bytes are reversed; 6-bit bytes and 12-bit big-endian
//!   uint16 in groups of 8 and 4 reversed; 24-bit as two such 12-bit frames
//!   after another, the first holding the high 12 bits (the header's width
//!   then counts both);
//! * raw `R64` of a 2×2 quad (1-, 6- and 12-bit): each raw row holds a row
//!   of each of the four chips, the bottom two turned by 180°, which are
//!   assembled into the detector's frame as LiberTEM does.
//!
//! Frames are stored in file order (rosettasciio shows them flipped
//! vertically). 24-bit counts are stored as uint16 when each fits, else the
//! conversion stops naming the frame and pixel. Every frame's header is
//! checked against the first: a file that changes size, type or sequence
//! midway is refused naming the frame. A `.hdr` beside the file gives the
//! scan shape, which `--scan` overrides.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::describe::{foreign, Document};
use super::element::Element;
use super::{ConvertError, Description, Options, Source};
use crate::qem::write::Calibration;

/// Largest frame header we accept (single chips use 384, quads 768).
const MAX_HEADER: usize = 64 << 10;
/// Largest `.hdr` file we read.
const MAX_HDR: u64 = 1 << 20;

pub fn looks_like(head: &[u8]) -> bool {
    head.starts_with(b"MQ1,")
}

/// How a frame's pixels are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pixels {
    U8,
    U16,
    U32,
    Raw1,
    Raw6,
    Raw12,
    Raw24,
}

impl Pixels {
    fn stored(self) -> Element {
        match self {
            Pixels::U8 | Pixels::Raw1 | Pixels::Raw6 => Element::U8,
            _ => Element::U16,
        }
    }

    /// Data bytes of a frame of `pixels` pixels.
    fn data_bytes(self, pixels: u64) -> u64 {
        match self {
            Pixels::U8 | Pixels::Raw6 => pixels,
            Pixels::U16 | Pixels::Raw12 => 2 * pixels,
            Pixels::U32 | Pixels::Raw24 => 4 * pixels,
            Pixels::Raw1 => pixels / 8,
        }
    }

    fn wide(self) -> bool {
        matches!(self, Pixels::U32 | Pixels::Raw24)
    }
}

/// The fields of one frame header that must agree across the file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Header {
    sequence: u64,
    header_bytes: usize,
    chips: u32,
    /// Detector pixels (rows, columns): for a raw quad, the assembled
    /// 2×2 chips.
    rows: u64,
    columns: u64,
    /// A raw 2×2 quad: each raw row holds one row of chips 4, 3, 2, 1 in
    /// that order; chips 1 and 2 are the top half of the detector, 3 and 4
    /// the bottom half turned by 180° (the arrangement LiberTEM reads).
    quad: bool,
    pixel_type: String,
    layout: String,
    depth: u32,
    pixels: Pixels,
    /// The header text without its padding.
    text: String,
    /// Everything after the layout, for the record.
    fields: Vec<String>,
}

fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| "the frame header is not ASCII".to_string())?
        .trim_end_matches(['\0', ' ']);
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() < 9 || parts[0] != "MQ1" {
        return Err("not a Merlin frame header (MQ1,...)".into());
    }
    let int = |i: usize, what: &str| -> Result<u64, String> {
        parts[i]
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("header field {i} ({what}) is {:?}, not a number", parts[i]))
    };
    let sequence = int(1, "sequence number")?;
    let header_bytes = int(2, "header size")? as usize;
    if !(text.len()..=MAX_HEADER).contains(&header_bytes) {
        return Err(format!("header size {header_bytes} is not plausible"));
    }
    let chips = int(3, "number of chips")? as u32;
    let width = int(4, "width")?;
    let height = int(5, "height")?;
    let pixel_type = parts[6].trim().to_string();
    let layout = parts[7].trim().to_string();
    // The bit depth is the last field (the header ends with a comma).
    let last = parts
        .iter()
        .rev()
        .map(|p| p.trim())
        .find(|p| !p.is_empty())
        .unwrap_or("");
    let depth: u32 = last
        .parse()
        .map_err(|_| format!("the last header field (counter depth) is {last:?}, not a number"))?;
    let pixels = match (pixel_type.as_str(), depth) {
        ("U08", _) => Pixels::U8,
        ("U16", _) => Pixels::U16,
        ("U32", _) => Pixels::U32,
        ("R64", 1) => Pixels::Raw1,
        ("R64", 6) => Pixels::Raw6,
        ("R64", 12) => Pixels::Raw12,
        ("R64", 24) => Pixels::Raw24,
        ("R64", d) => return Err(format!("raw counter depth {d} is not 1, 6, 12 or 24")),
        (t, _) => return Err(format!("pixel type {t:?} is not U08, U16, U32 or R64")),
    };
    let columns = if pixels == Pixels::Raw24 {
        width / 2
    } else {
        width
    };
    if columns == 0 || height == 0 || width > 1 << 16 || height > 1 << 16 {
        return Err(format!("frame size {width}×{height} is not plausible"));
    }
    if pixels == Pixels::Raw1 && (columns * height) % 64 != 0 {
        return Err("1-bit raw frames must hold a multiple of 64 pixels".into());
    }
    let raw = matches!(
        pixels,
        Pixels::Raw1 | Pixels::Raw6 | Pixels::Raw12 | Pixels::Raw24
    );
    // A raw quad's frame is its four chips' rows interleaved: the header's
    // width is the four chips side by side, its height one chip's.
    let quad = raw && chips == 4 && layout.trim_end_matches('G') == "2x2";
    if raw && chips != 1 && !quad {
        return Err(format!(
            "raw frames of {chips} chips ({layout}) are not supported; only single chips and 2x2 quads are"
        ));
    }
    if quad && pixels == Pixels::Raw24 {
        return Err("24-bit raw quad frames are not supported: no reader of the field defines how their two 12-bit halves interleave with the chips".into());
    }
    let group = match pixels {
        Pixels::Raw1 => 64,
        Pixels::Raw6 => 8,
        _ => 4,
    };
    if quad && (columns % 4 != 0 || (columns / 4) % group != 0) {
        return Err(format!(
            "a raw quad frame {columns} pixels wide is not four chips of whole {group}-pixel groups"
        ));
    }
    let (rows, columns) = if quad {
        (2 * height, columns / 2)
    } else {
        (height, columns)
    };
    Ok(Header {
        sequence,
        header_bytes,
        chips,
        rows,
        columns,
        quad,
        pixel_type,
        layout,
        depth,
        pixels,
        text: text.to_string(),
        fields: parts[8..].iter().map(|p| p.trim().to_string()).collect(),
    })
}

impl Header {
    /// True when `other` describes frames of the same shape and type.
    fn agrees(&self, other: &Header) -> bool {
        (
            self.header_bytes,
            self.chips,
            self.rows,
            self.columns,
            &self.pixel_type,
            &self.layout,
            self.depth,
        ) == (
            other.header_bytes,
            other.chips,
            other.rows,
            other.columns,
            &other.pixel_type,
            &other.layout,
            other.depth,
        )
    }

    fn summary(&self) -> String {
        format!(
            "{}×{} {} depth {} header {} bytes",
            self.columns, self.rows, self.pixel_type, self.depth, self.header_bytes
        )
    }
}

/// `key:\tvalue` lines of a Merlin `.hdr` file.
fn read_hdr(path: &Path) -> Result<Option<Map<String, Value>>, ConvertError> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(None);
    };
    if meta.len() > MAX_HDR {
        return Err(ConvertError::input(
            path,
            "too large for a Merlin .hdr file",
        ));
    }
    let bytes = crate::regular_file::read(path).map_err(|e| ConvertError::io(path, e))?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.starts_with("HDR") {
        return Err(ConvertError::input(
            path,
            "not a Merlin .hdr file (it must start with HDR)",
        ));
    }
    let mut map = Map::new();
    for line in text.lines() {
        if line.starts_with("HDR") || line.starts_with("End") {
            continue;
        }
        if let Some((k, v)) = line.split_once('\t') {
            map.insert(k.trim_end_matches(':').trim().to_string(), v.trim().into());
        }
    }
    Ok(Some(map))
}

fn hdr_number(hdr: &Map<String, Value>, key: &str) -> Option<u64> {
    hdr.get(key)?.as_str()?.trim().parse().ok()
}

/// The scan shape a `.hdr` states: `ScanY`×`ScanX`, or lines of "Frames
/// per Trigger" frames when a trigger starts each scan line (more than one
/// frame per trigger, and fewer than all). One frame per trigger (a
/// trigger at every position) or every frame on one trigger says nothing
/// of the shape: an 8-frame 4×2 scan is not 8×1, and nothing is guessed.
fn hdr_scan(hdr: &Map<String, Value>) -> Option<[u64; 2]> {
    if let (Some(y), Some(x)) = (hdr_number(hdr, "ScanY"), hdr_number(hdr, "ScanX")) {
        return Some([y, x]);
    }
    let total = hdr_number(hdr, "Frames in Acquisition (Number)")?;
    let line = hdr_number(hdr, "Frames per Trigger (Number)")?;
    (line > 1 && line < total && total % line == 0).then_some([total / line, line])
}

/// What a `.hdr` said of the scan, for a refusal that found no shape in it.
fn hdr_scan_fields(hdr: &Map<String, Value>) -> String {
    let said: Vec<String> = [
        "Frames in Acquisition (Number)",
        "Frames per Trigger (Number)",
    ]
    .iter()
    .filter_map(|key| Some(format!("{key} {}", hdr.get(*key)?.as_str()?.trim())))
    .collect();
    match said.is_empty() {
        true => "no ScanX/ScanY or frame counts".to_string(),
        false => format!("only {}", said.join(", ")),
    }
}

pub struct MibSource {
    description: Description,
    path: PathBuf,
    file: File,
    first: Header,
    frame_bytes: u64,
    scratch: Vec<u8>,
    /// One chip's row of a raw quad frame, unpacked before it is placed.
    row: Vec<u8>,
}

impl MibSource {
    pub fn open(path: &Path, options: &Options) -> Result<MibSource, ConvertError> {
        let file = crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
        let len = file
            .metadata()
            .map_err(|e| ConvertError::io(path, e))?
            .len();
        let mut head = vec![0u8; (len as usize).min(MAX_HEADER)];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| ConvertError::io(path, e))?;
        let declared = std::str::from_utf8(&head[..head.len().min(64)])
            .ok()
            .and_then(|t| t.split(',').nth(2))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .filter(|&n| n <= head.len())
            .ok_or_else(|| {
                ConvertError::input(
                    path,
                    "frame 0: the header size field is missing or larger than the file",
                )
            })?;
        let first = parse_header(&head[..declared])
            .map_err(|e| ConvertError::input(path, format!("frame 0: {e}")))?;
        let pixels = first.rows * first.columns;
        let frame_bytes = first.header_bytes as u64 + first.pixels.data_bytes(pixels);
        if len % frame_bytes != 0 {
            return Err(ConvertError::input(
                path,
                format!(
                    "holds {len} bytes, not a whole number of {frame_bytes}-byte frames ({}): truncated, or frames differ",
                    first.summary()
                ),
            ));
        }
        let frames = len / frame_bytes;
        let hdr_path = path.with_extension("hdr");
        let hdr = read_hdr(&hdr_path)?;
        let scan = match (options.scan, hdr.as_ref().and_then(hdr_scan)) {
            (Some(s), _) | (None, Some(s)) => s,
            (None, None) => {
                let why = match &hdr {
                    None => format!("there is no {}", hdr_path.display()),
                    Some(hdr) => format!("{} states {}", hdr_path.display(), hdr_scan_fields(hdr)),
                };
                return Err(ConvertError::input(
                    path,
                    format!("{frames} frames and no scan shape ({why}): give --scan ROWS,COLS"),
                ));
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
        let shape = [scan[0], scan[1], first.rows, first.columns];
        let stored = first.pixels.stored();
        let mut source_metadata = Map::new();
        source_metadata.insert("mib_first_frame_header".into(), first.text.clone().into());
        source_metadata.insert("mib_counter_depth".into(), first.depth.into());
        if let Some(ns) = first.fields.iter().rev().find_map(|f| f.strip_suffix("ns")) {
            source_metadata.insert("mib_exposure".into(), format!("{ns} ns").into());
        }
        if let Some(h) = &hdr {
            source_metadata.insert("hdr".into(), Value::Object(h.clone()));
        }
        let processing = if first.pixels.wide() {
            vec![json!({
                "changes_measurements": false,
                "operation": "exact_integer_narrowing",
                "source_dtype": "uint32",
                "stored_dtype": "uint16",
            })]
        } else {
            Vec::new()
        };
        let calibration = Calibration {
            source_metadata: source_metadata.clone(),
            provenance: "source file".into(),
            processing,
            ..Calibration::default()
        };
        let stem = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "merlin.mib".into());
        let document = Document {
            filename: format!("{stem}.header.json"),
            media_type: "application/json",
            content: Value::Object(source_metadata).to_string(),
        };
        let description = foreign(path, shape, stored, &calibration, "merlin-mib", &[document])?;
        Ok(MibSource {
            description,
            path: path.to_path_buf(),
            file,
            first,
            frame_bytes,
            scratch: Vec::new(),
            row: Vec::new(),
        })
    }

    fn decode(&mut self, frame: u64, data: &[u8], out: &mut [u8]) -> Result<(), ConvertError> {
        let columns = self.first.columns;
        let too_wide = |i: usize, v: u32| {
            ConvertError::input(
                &self.path,
                format!(
                    "frame {frame} pixel ({}, {}) counts {v}, more than uint16 holds (24-bit counts are stored only when every one fits)",
                    i as u64 / columns,
                    i as u64 % columns
                ),
            )
        };
        match self.first.pixels {
            Pixels::U8 => out.copy_from_slice(data),
            Pixels::U16 => {
                for (o, s) in out.chunks_exact_mut(2).zip(data.chunks_exact(2)) {
                    o.copy_from_slice(&[s[1], s[0]]);
                }
            }
            Pixels::U32 => {
                for (i, (o, s)) in out
                    .chunks_exact_mut(2)
                    .zip(data.chunks_exact(4))
                    .enumerate()
                {
                    let v = u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
                    let c = u16::try_from(v).map_err(|_| too_wide(i, v))?;
                    o.copy_from_slice(&c.to_le_bytes());
                }
            }
            Pixels::Raw1 => self.raw(Packing::One, data, out),
            Pixels::Raw6 => self.raw(Packing::Six, data, out),
            Pixels::Raw12 => self.raw(Packing::Twelve, data, out),
            Pixels::Raw24 => {
                let (high, low) = data.split_at(data.len() / 2);
                for (i, (h, l)) in high.chunks_exact(2).zip(low.chunks_exact(2)).enumerate() {
                    let v = (u32::from(u16::from_be_bytes([h[0], h[1]])) << 12)
                        + u32::from(u16::from_be_bytes([l[0], l[1]]));
                    let p = (i / 4) * 4 + 3 - i % 4;
                    let c = u16::try_from(v).map_err(|_| too_wide(p, v))?;
                    out[2 * p..2 * p + 2].copy_from_slice(&c.to_le_bytes());
                }
            }
        }
        Ok(())
    }
}

/// How 1-, 6- and 12-bit raw pixels are packed: 1-bit pixels LSB-first in
/// 64-bit words whose 8 bytes are reversed, 6-bit bytes in groups of 8 and
/// 12-bit big-endian values in groups of 4, each group reversed.
#[derive(Clone, Copy)]
enum Packing {
    One,
    Six,
    Twelve,
}

impl Packing {
    /// Bytes of one stored (unpacked) pixel.
    fn stored_bytes(self) -> usize {
        match self {
            Packing::One | Packing::Six => 1,
            Packing::Twelve => 2,
        }
    }

    /// Raw bytes of `pixels` pixels (whole groups).
    fn raw_bytes(self, pixels: usize) -> usize {
        match self {
            Packing::One => pixels / 8,
            Packing::Six => pixels,
            Packing::Twelve => 2 * pixels,
        }
    }

    /// Unpacks whole groups of `data` into stored pixels in counting order.
    fn unpack(self, data: &[u8], out: &mut [u8]) {
        match self {
            Packing::One => {
                for (s, word) in data.chunks_exact(8).enumerate() {
                    for b in 0..8 {
                        let byte = word[7 - b];
                        for bit in 0..8 {
                            out[64 * s + 8 * b + bit] = (byte >> bit) & 1;
                        }
                    }
                }
            }
            Packing::Six => {
                for (i, &v) in data.iter().enumerate() {
                    out[(i / 8) * 8 + 7 - i % 8] = v;
                }
            }
            Packing::Twelve => {
                for (i, s) in data.chunks_exact(2).enumerate() {
                    let at = ((i / 4) * 4 + 3 - i % 4) * 2;
                    out[at..at + 2].copy_from_slice(&[s[1], s[0]]);
                }
            }
        }
    }
}

impl MibSource {
    /// A raw frame of one chip, or of a 2×2 quad (see [`Header::quad`])
    /// assembled in detector order.
    fn raw(&mut self, packing: Packing, data: &[u8], out: &mut [u8]) {
        if !self.first.quad {
            return packing.unpack(data, out);
        }
        let (rows, columns) = (self.first.rows as usize, self.first.columns as usize);
        let chip = columns / 2;
        let e = packing.stored_bytes();
        let segment = packing.raw_bytes(chip);
        let mut row = std::mem::take(&mut self.row);
        row.resize(chip * e, 0);
        for y in 0..rows {
            // (raw row, chip for the left half, chip for the right half);
            // chips are numbered by their place in the raw row.
            let (raw_row, left, right, turned) = if y < rows / 2 {
                (y, 3, 2, false)
            } else {
                (rows - 1 - y, 1, 0, true)
            };
            for (half, chip_at) in [(0, left), (1, right)] {
                let at = (4 * raw_row + chip_at) * segment;
                packing.unpack(&data[at..at + segment], &mut row);
                let dst = &mut out[(y * columns + half * chip) * e..][..chip * e];
                if turned {
                    for (d, s) in dst.chunks_exact_mut(e).zip(row.chunks_exact(e).rev()) {
                        d.copy_from_slice(s);
                    }
                } else {
                    dst.copy_from_slice(&row);
                }
            }
        }
        self.row = row;
    }
}

impl Source for MibSource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let stored = self.description.frame_bytes();
        let frames = out.len() / stored;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(frames * self.frame_bytes as usize, 0);
        self.file
            .read_exact_at(&mut scratch, first * self.frame_bytes)
            .map_err(|e| ConvertError::io(&self.path, e))?;
        let h = self.first.header_bytes;
        for (k, (o, raw)) in out
            .chunks_exact_mut(stored)
            .zip(scratch.chunks_exact(self.frame_bytes as usize))
            .enumerate()
        {
            let frame = first + k as u64;
            let header = parse_header(&raw[..h])
                .map_err(|e| ConvertError::input(&self.path, format!("frame {frame}: {e}")))?;
            if !header.agrees(&self.first) {
                return Err(ConvertError::input(
                    &self.path,
                    format!(
                        "frame {frame}: its header says {}, but frame 0's says {}",
                        header.summary(),
                        self.first.summary()
                    ),
                ));
            }
            if header.sequence != self.first.sequence + frame {
                return Err(ConvertError::input(
                    &self.path,
                    format!(
                        "frame {frame}: sequence number {} where {} was expected (frames missing or out of order)",
                        header.sequence,
                        self.first.sequence + frame
                    ),
                ));
            }
            self.decode(frame, &raw[h..], o)?;
        }
        self.scratch = scratch;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pixel_type: &str, depth: u32, width: u32) -> Vec<u8> {
        let text = format!(
            "MQ1,000001,00384,01,{width:05},00004,{pixel_type},   1x1,01,2026-01-01 00:00:00.000000,0.001000,0,0,0,MQ1A,2026-01-01T00:00:00.000000000Z,1000000ns,{depth},"
        );
        let mut b = text.into_bytes();
        b.resize(384, 0);
        b
    }

    #[test]
    fn headers_parse_and_refuse_what_they_cannot_describe() {
        let h = parse_header(&header("U16", 12, 16)).unwrap();
        assert_eq!(
            (h.rows, h.columns, h.pixels, h.depth),
            (4, 16, Pixels::U16, 12)
        );
        let h = parse_header(&header("R64", 24, 32)).unwrap();
        assert_eq!((h.columns, h.pixels), (16, Pixels::Raw24));
        assert!(parse_header(&header("R64", 7, 16)).is_err());
        assert!(parse_header(&header("F32", 12, 16)).is_err());
        assert!(parse_header(b"MQ2,1,2").is_err());
    }
}
