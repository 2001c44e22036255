//! Uncompressed grayscale TIFF laid out so that every byte offset is known
//! before any pixel is decoded: the mount states a file's size from the
//! header alone and serves any byte range of it.
//!
//! A 4-D acquisition is written as an ImageJ hyperstack, the layout Fiji
//! opens with one slider per scan axis and the detector frame as the image:
//! ImageJ's `ImageDescription` (`images=`, `slices=` = scan columns,
//! `frames=` = scan rows, `hyperstack=true`) on the first page, and all
//! pixels stored contiguously, because ImageJ reads only the first IFD and
//! then `images` planes one after another. The remaining IFDs follow the
//! pixels, as tifffile writes them, so readers that walk the IFD chain
//! (tifffile, libtiff) see every page too.
//!
//! File = header, out-of-line tag values, IFD 0, every page's pixels, then
//! IFDs 1.. . Classic TIFF is used while every offset fits 32 bits; larger
//! files switch to BigTIFF (tifffile, libtiff and Bio-Formats read it;
//! ImageJ's own opener reads classic TIFF only).
//!
//! Calibration is written twice, in the two conventions the field's readers
//! know: ImageJ's (`unit`, `spacing`, `finterval`, … in the description and
//! XResolution/YResolution as pixels per unit) and the DigitalMicrograph
//! private tags 65003–65011 that hyperspy's TIFF writer emits and its reader
//! (rosettasciio) takes units from.

#[cfg(test)]
use std::io::{self, Write};

use crate::qem::{QemFile, ScientificMetadata};

/// Pixel types TIFF pages can hold here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    U8,
    U16,
    U32,
    F32,
    F64,
}

impl Sample {
    pub fn size(self) -> u64 {
        match self {
            Sample::U8 => 1,
            Sample::U16 => 2,
            Sample::U32 | Sample::F32 => 4,
            Sample::F64 => 8,
        }
    }

    /// TIFF SampleFormat: 1 = unsigned integer, 3 = IEEE float.
    fn format(self) -> u16 {
        match self {
            Sample::F32 | Sample::F64 => 3,
            Sample::U8 | Sample::U16 | Sample::U32 => 1,
        }
    }

    /// The name numpy gives it.
    pub fn name(self) -> &'static str {
        match self {
            Sample::U8 => "uint8",
            Sample::U16 => "uint16",
            Sample::U32 => "uint32",
            Sample::F32 => "float32",
            Sample::F64 => "float64",
        }
    }
}

/// The distance between neighbouring pixels along one axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub value: f64,
    pub unit: String,
}

impl Step {
    /// A usable step: positive, finite, with a unit that fits one line of
    /// ImageJ's `key=value` description.
    fn checked(value: f64, unit: &str) -> Option<Step> {
        let unit: String = unit.chars().filter(|c| c.is_ascii_graphic()).collect();
        (value.is_finite() && value > 0.0 && !unit.is_empty()).then_some(Step { value, unit })
    }
}

/// A stack of pages over a 2-D scan, page `row * columns + column`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanStack {
    pub rows: u64,
    pub columns: u64,
    pub row_step: Option<Step>,
    pub column_step: Option<Step>,
}

/// What a TIFF says about the geometry of its pixels. `None` is unknown:
/// nothing is written for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// Sampling of the image's rows (Y) and columns (X).
    pub image: [Option<Step>; 2],
    /// Present for a hyperstack: one page per scan position.
    pub stack: Option<ScanStack>,
}

fn axis_step(file: &QemFile, axis: usize) -> Option<Step> {
    metadata_step(file.metadata(), axis)
}

fn metadata_step(metadata: &ScientificMetadata, axis: usize) -> Option<Step> {
    let q = metadata.effective_axis_sampling(axis)?;
    Step::checked(q.value, &q.unit)
}

impl Sampling {
    /// The whole acquisition: detector frames over the scan.
    pub fn acquisition(file: &QemFile) -> Sampling {
        let shape = file.shape().map(|s| s as u64);
        Sampling::stack_of(shape, file.metadata())
    }

    /// A hyperstack of `shape` calibrated by `metadata` (a conversion's
    /// description, before any `.qem` exists).
    pub fn stack_of(shape: [u64; 4], metadata: &ScientificMetadata) -> Sampling {
        Sampling {
            image: [metadata_step(metadata, 2), metadata_step(metadata, 3)],
            stack: Some(ScanStack {
                rows: shape[0],
                columns: shape[1],
                row_step: metadata_step(metadata, 0),
                column_step: metadata_step(metadata, 1),
            }),
        }
    }

    /// One detector frame.
    pub fn frame(file: &QemFile) -> Sampling {
        Sampling {
            image: [axis_step(file, 2), axis_step(file, 3)],
            stack: None,
        }
    }

    /// An image shaped like the scan (a virtual detector image).
    pub fn scan_image(file: &QemFile) -> Sampling {
        Sampling {
            image: [axis_step(file, 0), axis_step(file, 1)],
            stack: None,
        }
    }

    fn pages(&self) -> u64 {
        self.stack
            .as_ref()
            .map_or(1, |s| s.rows.saturating_mul(s.columns))
    }

    /// ImageJ's description: `key=value` lines, read by ImageJ's
    /// `FileOpener` and by tifffile's `imagej_metadata`.
    fn imagej_description(&self) -> String {
        // tifffile writes this version; ImageJ only checks the key.
        let mut lines = vec!["ImageJ=1.11a".to_string()];
        if let Some(s) = &self.stack {
            lines.push(format!("images={}", self.pages()));
            lines.push(format!("slices={}", s.columns));
            lines.push(format!("frames={}", s.rows));
            lines.push("hyperstack=true".into());
            lines.push("mode=grayscale".into());
        }
        let [y, x] = &self.image;
        // ImageJ's `unit` is X's; Y and Z inherit it unless given their own.
        let unit = x.as_ref().or(y.as_ref()).map(|s| s.unit.as_str());
        if let Some(unit) = unit {
            lines.push(format!("unit={unit}"));
        }
        if let Some(y) = y.as_ref().filter(|y| Some(y.unit.as_str()) != unit) {
            lines.push(format!("yunit={}", y.unit));
        }
        if let Some(s) = &self.stack {
            // ImageJ has no second spatial stack axis: scan columns are its
            // Z (`spacing`), scan rows its T (`finterval`, `tunit`).
            if let Some(z) = &s.column_step {
                lines.push(format!("spacing={}", z.value));
                if Some(z.unit.as_str()) != unit {
                    lines.push(format!("zunit={}", z.unit));
                }
            }
            if let Some(t) = &s.row_step {
                lines.push(format!("finterval={}", t.value));
                lines.push(format!("tunit={}", t.unit));
            }
            lines.push("loop=false".into());
        }
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }
}

// TIFF field types.
const ASCII: u16 = 2;
const SHORT: u16 = 3;
const LONG: u16 = 4;
const RATIONAL: u16 = 5;
const DOUBLE: u16 = 12;
const LONG8: u16 = 16;

/// One IFD entry's value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Short(u16),
    Long(u32),
    /// An offset or byte count: LONG in classic TIFF, LONG8 in BigTIFF.
    Offset(u64),
    /// Filled in per page with the page's first pixel byte.
    StripOffset,
    /// NUL-terminated text.
    Ascii(Vec<u8>),
    Rational(u32, u32),
    Double(f64),
}

impl Value {
    /// (field type, count, value bytes) for page `strip` offset.
    fn encode(&self, big: bool, strip: u64) -> (u16, u64, Vec<u8>) {
        let offset = |v: u64| {
            if big {
                (LONG8, 1, v.to_le_bytes().to_vec())
            } else {
                (LONG, 1, (v as u32).to_le_bytes().to_vec())
            }
        };
        match self {
            Value::Short(v) => (SHORT, 1, v.to_le_bytes().to_vec()),
            Value::Long(v) => (LONG, 1, v.to_le_bytes().to_vec()),
            Value::Offset(v) => offset(*v),
            Value::StripOffset => offset(strip),
            Value::Ascii(text) => (ASCII, text.len() as u64, text.clone()),
            Value::Rational(n, d) => {
                let mut b = n.to_le_bytes().to_vec();
                b.extend_from_slice(&d.to_le_bytes());
                (RATIONAL, 1, b)
            }
            Value::Double(v) => (DOUBLE, 1, v.to_le_bytes().to_vec()),
        }
    }
}

/// `1 / step` (pixels per unit, as XResolution holds it) as the closest
/// fraction whose terms fit 32 bits: continued fractions, stopped before a
/// term overflows.
fn per_unit(step: f64) -> (u32, u32) {
    let target = 1.0 / step;
    let max = f64::from(u32::MAX);
    if !target.is_finite() || target <= 0.0 {
        return (1, 1);
    }
    if target >= max {
        return (u32::MAX, 1);
    }
    let (mut h0, mut h1) = (0.0f64, 1.0f64);
    let (mut k0, mut k1) = (1.0f64, 0.0f64);
    let mut x = target;
    let mut best = (target.round().max(1.0), 1.0);
    for _ in 0..40 {
        let a = x.floor();
        let (h2, k2) = (a * h1 + h0, a * k1 + k0);
        if h2 > max || k2 > max {
            break;
        }
        best = (h2, k2);
        if (h2 / k2 - target).abs() <= f64::EPSILON * target || x - a < 1e-12 {
            break;
        }
        (h0, h1, k0, k1) = (h1, h2, k1, k2);
        x = 1.0 / (x - a);
    }
    if best.0 < 1.0 {
        // Below 1 / u32::MAX pixels per unit: the smallest fraction there is.
        return (1, u32::MAX);
    }
    (best.0 as u32, best.1 as u32)
}

/// The byte layout of one TIFF: `pages` planes of `rows × columns` samples.
#[derive(Debug, Clone, PartialEq)]
pub struct TiffLayout {
    rows: u32,
    columns: u32,
    sample: Sample,
    pages: u64,
    big: bool,
    /// Page 0's entries, ascending by tag as TIFF requires.
    first: Vec<(u16, Value)>,
    /// The entries of every later page.
    rest: Vec<(u16, Value)>,
    /// Out-of-line values of page 0's entries, and where each starts.
    values: Vec<u8>,
    value_at: Vec<(u16, u64)>,
}

fn align8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

impl TiffLayout {
    /// The layout of a TIFF of `rows × columns` images: one page, or one
    /// per scan position when `calibration.stack` is given.
    /// `None` when the file would not fit 64-bit offsets (a header may
    /// declare such a shape; no offset is then computed at all).
    pub fn new(rows: u32, columns: u32, sample: Sample, calibration: &Sampling) -> Option<Self> {
        let page_bytes = u128::from(rows) * u128::from(columns) * u128::from(sample.size());
        // Generous bounds on an IFD (under 1 KiB) and on the header and
        // out-of-line values (under 64 KiB: a description of a few lines).
        let bound = u128::from(calibration.pages()) * (page_bytes + 1024) + 65_536;
        if bound > u128::from(u64::MAX) {
            return None;
        }
        let mut layout = Self::plan(rows, columns, sample, calibration, false);
        if layout.total_len() > u64::from(u32::MAX) {
            layout = Self::plan(rows, columns, sample, calibration, true);
        }
        Some(layout)
    }

    fn plan(rows: u32, columns: u32, sample: Sample, cal: &Sampling, big: bool) -> Self {
        let page_bytes = u64::from(rows) * u64::from(columns) * sample.size();
        let mut rest = vec![
            (256, Value::Long(columns)),
            (257, Value::Long(rows)),
            (258, Value::Short(sample.size() as u16 * 8)),
            (259, Value::Short(1)), // no compression
            (262, Value::Short(1)), // black is zero
            (273, Value::StripOffset),
            (277, Value::Short(1)),
            (278, Value::Long(rows)),
            (279, Value::Offset(page_bytes)),
        ];
        let [y, x] = &cal.image;
        if x.is_some() || y.is_some() {
            let res = |s: &Option<Step>| s.as_ref().map_or((1, 1), |s| per_unit(s.value));
            let ((xn, xd), (yn, yd)) = (res(x), res(y));
            rest.push((282, Value::Rational(xn, xd)));
            rest.push((283, Value::Rational(yn, yd)));
            // No absolute unit: the description's `unit` names it.
            rest.push((296, Value::Short(1)));
        }
        rest.push((339, Value::Short(sample.format())));

        let mut first = rest.clone();
        let mut description = cal.imagej_description().into_bytes();
        description.push(0);
        first.push((270, Value::Ascii(description)));
        let text = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            b.push(0);
            Value::Ascii(b)
        };
        // DigitalMicrograph's private tags, as hyperspy writes them:
        // X is the image's columns, Y its rows, Z the (column) scan step.
        if let Some(x) = x {
            first.push((65003, text(&x.unit)));
            first.push((65009, Value::Double(x.value)));
        }
        if let Some(y) = y {
            first.push((65004, text(&y.unit)));
            first.push((65010, Value::Double(y.value)));
        }
        if let Some(z) = cal.stack.as_ref().and_then(|s| s.column_step.as_ref()) {
            first.push((65005, text(&z.unit)));
            first.push((65011, Value::Double(z.value)));
        }
        first.sort_by_key(|(tag, _)| *tag);

        let mut layout = TiffLayout {
            rows,
            columns,
            sample,
            pages: cal.pages(),
            big,
            first,
            rest,
            values: Vec::new(),
            value_at: Vec::new(),
        };
        let field = layout.field_len();
        let mut values = Vec::new();
        let mut value_at = Vec::new();
        for (tag, value) in &layout.first {
            let (_, _, bytes) = value.encode(big, 0);
            if bytes.len() > field {
                value_at.push((*tag, layout.header_len() + values.len() as u64));
                values.extend_from_slice(&bytes);
                // Values start on a word boundary.
                values.resize(values.len().next_multiple_of(2), 0);
            }
        }
        values.resize(align8(values.len() as u64) as usize, 0);
        layout.values = values;
        layout.value_at = value_at;
        layout
    }

    #[cfg(test)]
    pub fn is_bigtiff(&self) -> bool {
        self.big
    }

    #[cfg(test)]
    pub fn pages(&self) -> u64 {
        self.pages
    }

    fn field_len(&self) -> usize {
        if self.big {
            8
        } else {
            4
        }
    }

    fn header_len(&self) -> u64 {
        if self.big {
            16
        } else {
            8
        }
    }

    fn ifd_len(&self, entries: usize) -> u64 {
        let n = entries as u64;
        align8(if self.big {
            8 + 20 * n + 8
        } else {
            2 + 12 * n + 4
        })
    }

    fn first_ifd_offset(&self) -> u64 {
        self.header_len() + self.values.len() as u64
    }

    /// Bytes of one page's pixels.
    pub fn page_data_len(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.columns) * self.sample.size()
    }

    /// Offset of the first pixel byte of page 0; the pages follow it
    /// contiguously.
    pub fn data_offset(&self) -> u64 {
        self.first_ifd_offset() + self.ifd_len(self.first.len())
    }

    /// Offset of page `page`'s first pixel byte.
    pub fn page_data_offset(&self, page: u64) -> u64 {
        self.data_offset() + page * self.page_data_len()
    }

    /// Where the IFDs of pages 1.. start, after all pixels.
    fn trailer_offset(&self) -> u64 {
        align8(self.page_data_offset(self.pages))
    }

    fn ifd_offset(&self, page: u64) -> u64 {
        if page == 0 {
            self.first_ifd_offset()
        } else {
            self.trailer_offset() + (page - 1) * self.ifd_len(self.rest.len())
        }
    }

    /// The size of the whole file.
    pub fn total_len(&self) -> u64 {
        if self.pages <= 1 {
            self.page_data_offset(self.pages)
        } else {
            self.ifd_offset(self.pages)
        }
    }

    /// Everything before the first pixel: header, out-of-line values and
    /// page 0's IFD.
    pub fn prefix(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data_offset() as usize);
        out.extend_from_slice(b"II");
        if self.big {
            out.extend_from_slice(&43u16.to_le_bytes());
            out.extend_from_slice(&8u16.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&self.first_ifd_offset().to_le_bytes());
        } else {
            out.extend_from_slice(&42u16.to_le_bytes());
            out.extend_from_slice(&(self.first_ifd_offset() as u32).to_le_bytes());
        }
        out.extend_from_slice(&self.values);
        out.extend_from_slice(&self.ifd(0));
        out
    }

    /// Page `page`'s IFD, padded to its stride.
    fn ifd(&self, page: u64) -> Vec<u8> {
        let entries = if page == 0 { &self.first } else { &self.rest };
        let next = if page + 1 < self.pages {
            self.ifd_offset(page + 1)
        } else {
            0
        };
        let strip = self.page_data_offset(page);
        let field = self.field_len();
        let mut out = Vec::with_capacity(self.ifd_len(entries.len()) as usize);
        if self.big {
            out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        } else {
            out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        }
        for (tag, value) in entries {
            let (kind, count, bytes) = value.encode(self.big, strip);
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            if self.big {
                out.extend_from_slice(&count.to_le_bytes());
            } else {
                out.extend_from_slice(&(count as u32).to_le_bytes());
            }
            let mut slot = vec![0u8; field];
            if bytes.len() <= field {
                // Values that fit sit left-justified in the entry.
                slot[..bytes.len()].copy_from_slice(&bytes);
            } else {
                // Every out-of-line value is page 0's (later pages share it).
                let at = self
                    .value_at
                    .iter()
                    .find(|(t, _)| t == tag)
                    .map_or(0, |(_, at)| *at);
                slot.copy_from_slice(&at.to_le_bytes()[..field]);
            }
            out.extend_from_slice(&slot);
        }
        if self.big {
            out.extend_from_slice(&next.to_le_bytes());
        } else {
            out.extend_from_slice(&(next as u32).to_le_bytes());
        }
        out.resize(self.ifd_len(entries.len()) as usize, 0);
        out
    }

    /// The bytes after the last pixel: padding, then the IFDs of pages 1..
    fn trailer_at(&self, offset: u64, buf: &mut [u8]) -> usize {
        let total = self.total_len();
        let end = self.page_data_offset(self.pages);
        let stride = self.ifd_len(self.rest.len());
        let mut done = 0;
        while done < buf.len() && offset + (done as u64) < total {
            let at = offset + done as u64;
            if at < self.trailer_offset() {
                let n = (buf.len() - done).min((self.trailer_offset() - at) as usize);
                buf[done..done + n].fill(0);
                done += n;
                continue;
            }
            debug_assert!(at >= end);
            let page = 1 + (at - self.trailer_offset()) / stride;
            let ifd = self.ifd(page);
            let within = (at - self.ifd_offset(page)) as usize;
            let n = (buf.len() - done).min(ifd.len() - within);
            buf[done..done + n].copy_from_slice(&ifd[within..within + n]);
            done += n;
        }
        done
    }

    /// Fills `buf` with the file's bytes from `offset`, asking `pixels` for
    /// pixel bytes: `pixels(at, buf)` fills `buf` from byte `at` of the
    /// pages' C-order data and returns how much it filled. Returns the
    /// bytes filled (fewer only at the end of the file).
    pub fn read_at<E>(
        &self,
        offset: u64,
        buf: &mut [u8],
        mut pixels: impl FnMut(u64, &mut [u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let data = self.data_offset();
        let end = self.page_data_offset(self.pages);
        let mut done = 0;
        if offset < data {
            let prefix = self.prefix();
            let n = buf.len().min((data - offset) as usize);
            buf[..n].copy_from_slice(&prefix[offset as usize..offset as usize + n]);
            done = n;
        }
        let at = offset + done as u64;
        if done < buf.len() && at < end {
            let want = (buf.len() - done).min((end - at) as usize);
            let got = pixels(at - data, &mut buf[done..done + want])?;
            done += got;
            if got < want {
                return Ok(done);
            }
        }
        let at = offset + done as u64;
        if done < buf.len() && at >= end {
            done += self.trailer_at(at, &mut buf[done..]);
        }
        Ok(done)
    }

    /// Writes the whole file, asking `page_data` for each page's pixels
    /// (`page_data_len()` little-endian bytes) in order; only the tests
    /// make a whole file at once.
    #[cfg(test)]
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        mut page_data: impl FnMut(u64, &mut W) -> io::Result<()>,
    ) -> io::Result<()> {
        out.write_all(&self.prefix())?;
        for page in 0..self.pages {
            page_data(page, out)?;
        }
        out.write_all(&self.trailer())
    }

    /// Everything after the last pixel: padding and the IFDs of pages 1..
    /// (a streaming writer sends `prefix()`, the pixels, then this).
    pub fn trailer(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.pages > 1 {
            let padding = self.trailer_offset() - self.page_data_offset(self.pages);
            out.resize(padding as usize, 0);
            for page in 1..self.pages {
                out.extend_from_slice(&self.ifd(page));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use tiff::decoder::{Decoder, DecodingResult};
    use tiff::tags::Tag;

    fn step(value: f64, unit: &str) -> Option<Step> {
        Step::checked(value, unit)
    }

    fn build(layout: &TiffLayout, fill: impl Fn(u64) -> Vec<u8>) -> Vec<u8> {
        let mut out = Vec::new();
        layout
            .write(&mut out, |page, w| w.write_all(&fill(page)))
            .unwrap();
        out
    }

    fn fill(layout: &TiffLayout) -> impl Fn(u64) -> Vec<u8> {
        let n = layout.page_data_len();
        move |p| (0..n).map(|i| (i * 7 + p * 3) as u8).collect()
    }

    fn stack(rows: u64, columns: u64) -> Sampling {
        Sampling {
            image: [step(0.25, "mrad"), step(0.5, "mrad")],
            stack: Some(ScanStack {
                rows,
                columns,
                row_step: step(1.5, "angstrom"),
                column_step: step(2.0, "angstrom"),
            }),
        }
    }

    /// Every page through the `tiff` crate's decoder, which walks the IFD
    /// chain as libtiff does.
    fn decode_all(bytes: &[u8]) -> Vec<(u32, u32, DecodingResult)> {
        let mut decoder = Decoder::new(Cursor::new(bytes)).unwrap();
        let mut pages = Vec::new();
        loop {
            let (w, h) = decoder.dimensions().unwrap();
            pages.push((w, h, decoder.read_image().unwrap()));
            if !decoder.more_images() {
                break;
            }
            decoder.next_image().unwrap();
        }
        pages
    }

    #[test]
    fn every_page_decodes_with_its_pixels() {
        for sample in [Sample::U8, Sample::U16, Sample::F32] {
            let layout = TiffLayout::new(3, 5, sample, &stack(2, 3)).unwrap();
            let bytes = build(&layout, fill(&layout));
            assert_eq!(bytes.len() as u64, layout.total_len());
            let pages = decode_all(&bytes);
            assert_eq!(pages.len(), 6);
            for (p, (w, h, data)) in pages.into_iter().enumerate() {
                assert_eq!((w, h), (5, 3));
                let want = fill(&layout)(p as u64);
                let got: Vec<u8> = match (sample, data) {
                    (Sample::U8, DecodingResult::U8(v)) => v,
                    (Sample::U16, DecodingResult::U16(v)) => {
                        v.iter().flat_map(|x| x.to_le_bytes()).collect()
                    }
                    (Sample::F32, DecodingResult::F32(v)) => {
                        v.iter().flat_map(|x| x.to_le_bytes()).collect()
                    }
                    (s, _) => panic!("{s:?} decoded as another type"),
                };
                assert_eq!(got, want, "page {p} of {sample:?}");
            }
        }
    }

    #[test]
    fn pixels_are_contiguous_after_the_first_ifd_as_imagej_reads_them() {
        let layout = TiffLayout::new(4, 2, Sample::U16, &stack(3, 2)).unwrap();
        let bytes = build(&layout, fill(&layout));
        let start = layout.data_offset() as usize;
        let n = layout.page_data_len() as usize;
        for p in 0..6 {
            assert_eq!(&bytes[start + p * n..][..n], &fill(&layout)(p as u64)[..]);
        }
        let mut decoder = Decoder::new(Cursor::new(&bytes)).unwrap();
        let strip = decoder.get_tag_u64(Tag::StripOffsets).unwrap();
        assert_eq!(strip, layout.data_offset());
        // IFD 1 comes after all pixels (ImageJ never looks for it).
        decoder.next_image().unwrap();
        let second = decoder.get_tag_u64(Tag::StripOffsets).unwrap();
        assert_eq!(second, layout.page_data_offset(1));
    }

    #[test]
    fn the_description_is_an_imagej_hyperstack() {
        let layout = TiffLayout::new(4, 2, Sample::U16, &stack(3, 2)).unwrap();
        let bytes = build(&layout, fill(&layout));
        let mut decoder = Decoder::new(Cursor::new(&bytes)).unwrap();
        let text = decoder.get_tag_ascii_string(Tag::ImageDescription).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ImageJ=1.11a");
        for want in [
            "images=6",
            "slices=2",
            "frames=3",
            "hyperstack=true",
            "unit=mrad",
            "spacing=2",
            "zunit=angstrom",
            "finterval=1.5",
            "tunit=angstrom",
        ] {
            assert!(lines.contains(&want), "{want} missing from {text:?}");
        }
        // Pixels per unit: 1 / 0.5 mrad across, 1 / 0.25 mrad down.
        let x = decoder.get_tag_u32_vec(Tag::XResolution).unwrap();
        let y = decoder.get_tag_u32_vec(Tag::YResolution).unwrap();
        assert_eq!((x[0] / x[1], y[0] / y[1]), (2, 4));
        assert_eq!(decoder.get_tag_u32(Tag::ResolutionUnit).unwrap(), 1);
        let unit = decoder.get_tag_ascii_string(Tag::Unknown(65003)).unwrap();
        assert_eq!(unit, "mrad");
        let z = decoder.get_tag_f64(Tag::Unknown(65011)).unwrap();
        assert_eq!(z, 2.0);
        // Later pages repeat the resolution but not the description.
        decoder.next_image().unwrap();
        assert!(decoder.find_tag(Tag::ImageDescription).unwrap().is_none());
        assert_eq!(decoder.get_tag_u32_vec(Tag::XResolution).unwrap(), x);
    }

    #[test]
    fn unknown_calibration_writes_no_units() {
        let cal = Sampling {
            image: [None, None],
            stack: Some(ScanStack {
                rows: 2,
                columns: 2,
                row_step: None,
                column_step: None,
            }),
        };
        let layout = TiffLayout::new(2, 2, Sample::U8, &cal).unwrap();
        let bytes = build(&layout, fill(&layout));
        let mut decoder = Decoder::new(Cursor::new(&bytes)).unwrap();
        let text = decoder.get_tag_ascii_string(Tag::ImageDescription).unwrap();
        assert!(
            !text.contains("unit") && !text.contains("spacing"),
            "{text}"
        );
        assert!(decoder.find_tag(Tag::XResolution).unwrap().is_none());
        assert!(decoder.find_tag(Tag::Unknown(65003)).unwrap().is_none());
        // Nonsense steps are dropped, not written.
        assert_eq!(Step::checked(0.0, "mrad"), None);
        assert_eq!(Step::checked(f64::NAN, "mrad"), None);
        assert_eq!(Step::checked(1.0, "\n"), None);
    }

    #[test]
    fn a_single_frame_carries_its_calibration() {
        let cal = Sampling {
            image: [step(0.3, "1/angstrom"), step(0.3, "1/angstrom")],
            stack: None,
        };
        let layout = TiffLayout::new(3, 3, Sample::F32, &cal).unwrap();
        assert_eq!(layout.pages(), 1);
        let bytes = build(&layout, fill(&layout));
        assert_eq!(bytes.len() as u64, layout.total_len());
        let mut decoder = Decoder::new(Cursor::new(&bytes)).unwrap();
        let text = decoder.get_tag_ascii_string(Tag::ImageDescription).unwrap();
        assert_eq!(text, "ImageJ=1.11a\nunit=1/angstrom\n");
        let x = decoder.get_tag_u32_vec(Tag::XResolution).unwrap();
        assert!((f64::from(x[1]) / f64::from(x[0]) - 0.3).abs() < 1e-12);
        assert!(!decoder.more_images());
    }

    #[test]
    fn read_at_serves_the_same_bytes_as_write() {
        let layout = TiffLayout::new(3, 5, Sample::U16, &stack(2, 3)).unwrap();
        let bytes = build(&layout, fill(&layout));
        let data: Vec<u8> = (0..6).flat_map(|p| fill(&layout)(p)).collect();
        let total = layout.total_len() as usize;
        for (offset, len) in [(0, total), (0, 7), (5, 300), (150, 40), (total - 30, 64)] {
            let mut buf = vec![0xAAu8; len];
            let n = layout
                .read_at(offset as u64, &mut buf, |at, out: &mut [u8]| {
                    let at = at as usize;
                    out.copy_from_slice(&data[at..at + out.len()]);
                    Ok::<_, ()>(out.len())
                })
                .unwrap();
            let want = &bytes[offset..(offset + len).min(total)];
            assert_eq!(&buf[..n], want, "{offset}+{len}");
        }
    }

    #[test]
    fn resolutions_are_close_fractions() {
        for s in [0.25, 0.5, 1.0, 3.0, 0.0123, 1e-7, 123_456.789, 0.017_453] {
            let (n, d) = per_unit(s);
            let got = f64::from(d) / f64::from(n);
            assert!((got - s).abs() <= 1e-9 * s, "{s}: {n}/{d}");
        }
        assert_eq!(per_unit(0.25), (4, 1));
    }

    #[test]
    fn shapes_beyond_64_bit_offsets_are_refused() {
        let axis = (1u64 << 24) - 1;
        let cal = Sampling {
            image: [None, None],
            stack: Some(ScanStack {
                rows: axis,
                columns: axis,
                row_step: None,
                column_step: None,
            }),
        };
        let side = axis as u32;
        assert!(TiffLayout::new(side, side, Sample::F32, &cal).is_none());
        // One such frame alone fits.
        assert!(TiffLayout::new(side, side, Sample::F32, &Sampling::default()).is_some());
    }

    #[test]
    fn huge_files_switch_to_bigtiff() {
        let layout = TiffLayout::new(256, 256, Sample::F32, &stack(100, 200)).unwrap();
        assert!(layout.is_bigtiff());
        assert!(layout.total_len() > u64::from(u32::MAX));
        assert!(!TiffLayout::new(256, 256, Sample::F32, &stack(10, 10))
            .unwrap()
            .is_bigtiff());
        // Check the structure on a small BigTIFF built with the same code.
        let small = TiffLayout::plan(2, 3, Sample::U16, &stack(2, 2), true);
        let bytes = build(&small, fill(&small));
        assert_eq!(&bytes[..4], b"II+\0");
        assert_eq!(bytes.len() as u64, small.total_len());
        let pages = decode_all(&bytes);
        assert_eq!(pages.len(), 4);
        let mut decoder = Decoder::new(Cursor::new(&bytes)).unwrap();
        let text = decoder.get_tag_ascii_string(Tag::ImageDescription).unwrap();
        assert!(text.starts_with("ImageJ=1.11a\nimages=4\n"), "{text}");
        assert_eq!(decoder.get_tag_f64(Tag::Unknown(65009)).unwrap(), 0.5);
    }
}
