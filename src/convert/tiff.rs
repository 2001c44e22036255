//! Multi-page TIFF: as output, one page per frame, in scan order, laid out
//! by the same encoder the mount's TIFF views use; as input, stacks of
//! single-channel pages (multi-page, BigTIFF, ImageJ hyperstacks).

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use tiff::decoder::{Decoder, DecodingResult};
use tiff::tags::Tag;
use tiff::{ColorType, TiffError};

use super::dense::not_representable;
use super::describe::{foreign, Document};
use super::element::{Element, Narrowing, SourceDtype};
use super::{ConvertError, Description, Options, Sink, Source};
use crate::export::tiff::{Sample, Sampling, TiffLayout};
use crate::npy::DType;
use crate::publish::{AtomicFile, Overwrite};
use crate::qem::write::Calibration;
use crate::qem::ScientificMetadata;

pub struct TiffSink {
    path: PathBuf,
    layout: TiffLayout,
    out: BufWriter<AtomicFile>,
}

impl TiffSink {
    pub fn create(path: &Path, d: &Description, force: bool) -> Result<TiffSink, ConvertError> {
        let sample = match d.element {
            Element::U8 => Sample::U8,
            Element::U16 => Sample::U16,
            Element::F32 => Sample::F32,
        };
        // An ImageJ hyperstack with the description's calibration (see
        // export::tiff): Fiji, tifffile and hyperspy read it to scale.
        let metadata = ScientificMetadata::parse(&d.scientific_metadata, &d.shape)
            .map_err(|e| ConvertError::input(path, e.to_string()))?;
        let layout = TiffLayout::new(
            d.shape[2] as u32,
            d.shape[3] as u32,
            sample,
            &Sampling::stack_of(d.shape, &metadata),
        )
        .ok_or_else(|| ConvertError::input(path, "too large for one TIFF file"))?;
        let overwrite = if force {
            Overwrite::Replace
        } else {
            Overwrite::Never
        };
        let target = AtomicFile::create(path, overwrite)?;
        let mut out = BufWriter::with_capacity(1 << 20, target);
        out.write_all(&layout.prefix())
            .map_err(|e| ConvertError::io(path, e))?;
        Ok(TiffSink {
            path: path.to_path_buf(),
            layout,
            out,
        })
    }
}

impl Sink for TiffSink {
    fn write_frames(&mut self, window: &[u8]) -> Result<(), ConvertError> {
        // The pixels of every page lie back to back after the prefix.
        self.out
            .write_all(window)
            .map_err(|e| ConvertError::io(&self.path, e))
    }

    fn publish(mut self: Box<Self>) -> Result<(), ConvertError> {
        self.out
            .write_all(&self.layout.trailer())
            .map_err(|e| ConvertError::io(&self.path, e))?;
        let target = self
            .out
            .into_inner()
            .map_err(|e| ConvertError::io(&self.path, e.into_error()))?;
        Ok(target.publish()?)
    }
}

/// A TIFF stack read through the `tiff` crate: one single-channel page per
/// frame, in scan order (classic or BigTIFF, uncompressed, LZW or Deflate).
/// The scan shape comes from `--scan`, an ImageJ hyperstack's `frames`,
/// `slices` and `channels` (two of them above one), or tifffile's JSON
/// description `{"shape": [R, C, H, W]}`.
pub struct TiffSource {
    description: Description,
    path: PathBuf,
    decoder: Decoder<BufReader<File>>,
    /// The page the decoder is positioned on.
    page: usize,
    narrowing: Narrowing,
    page_elements: usize,
    bytes: Vec<u8>,
}

fn tiff_error(path: &Path, page: usize, e: TiffError) -> ConvertError {
    ConvertError::input(path, format!("page {page}: {e}"))
}

/// The source dtype of a decoded page, and its values as little-endian bytes.
fn page_bytes(result: DecodingResult, out: &mut Vec<u8>) -> Result<DType, String> {
    out.clear();
    macro_rules! le {
        ($v:expr, $d:expr) => {{
            out.extend($v.iter().flat_map(|x| x.to_le_bytes()));
            Ok($d)
        }};
    }
    match result {
        DecodingResult::U8(v) => {
            out.extend_from_slice(&v);
            Ok(DType::U8)
        }
        DecodingResult::U16(v) => le!(v, DType::U16),
        DecodingResult::U32(v) => le!(v, DType::U32),
        DecodingResult::U64(v) => le!(v, DType::U64),
        DecodingResult::I8(v) => le!(v, DType::I8),
        DecodingResult::I16(v) => le!(v, DType::I16),
        DecodingResult::I32(v) => le!(v, DType::I32),
        DecodingResult::I64(v) => le!(v, DType::I64),
        DecodingResult::F32(v) => le!(v, DType::F32),
        DecodingResult::F64(v) => le!(v, DType::F64),
        DecodingResult::F16(_) => Err("float16 pages are not supported".into()),
    }
}

/// `(slower, faster)` of an ImageJ hyperstack's non-trivial dimensions.
fn imagej_scan(description: &str, pages: u64) -> Option<[u64; 2]> {
    if !description.starts_with("ImageJ=") {
        return None;
    }
    let field = |k: &str| -> u64 {
        description
            .lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1)
    };
    // ImageJ orders pages channel fastest, then slice, then frame.
    let dims: Vec<u64> = [field("frames"), field("slices"), field("channels")]
        .into_iter()
        .filter(|&n| n > 1)
        .collect();
    match dims[..] {
        [a, b] if a * b == pages => Some([a, b]),
        _ => None,
    }
}

fn shaped_scan(description: &str, pages: u64, rows: u64, columns: u64) -> Option<[u64; 2]> {
    let v: serde_json::Value = serde_json::from_str(description).ok()?;
    let shape: Vec<u64> = v
        .get("shape")?
        .as_array()?
        .iter()
        .map(serde_json::Value::as_u64)
        .collect::<Option<_>>()?;
    match shape[..] {
        [r, c, h, w] if r * c == pages && [h, w] == [rows, columns] => Some([r, c]),
        _ => None,
    }
}

impl TiffSource {
    pub fn open(path: &Path, options: &Options) -> Result<TiffSource, ConvertError> {
        let reader = || -> Result<Decoder<BufReader<File>>, ConvertError> {
            let file = crate::regular_file::open(path).map_err(|e| ConvertError::io(path, e))?;
            Decoder::new(BufReader::new(file)).map_err(|e| tiff_error(path, 0, e))
        };
        // One pass over the directories (no pixels) to count and check the pages.
        let mut scan_pages = reader()?;
        let (columns, rows) = scan_pages
            .dimensions()
            .map_err(|e| tiff_error(path, 0, e))?;
        let colortype = scan_pages.colortype().map_err(|e| tiff_error(path, 0, e))?;
        if !matches!(colortype, ColorType::Gray(_)) {
            return Err(ConvertError::input(
                path,
                format!("page 0 is {colortype:?}; only single-channel (grayscale) pages are detector frames"),
            ));
        }
        let description = scan_pages
            .get_tag_ascii_string(Tag::ImageDescription)
            .unwrap_or_default();
        let mut pages: u64 = 1;
        while scan_pages.more_images() {
            let page = pages as usize;
            scan_pages
                .next_image()
                .map_err(|e| tiff_error(path, page, e))?;
            let dims = scan_pages
                .dimensions()
                .map_err(|e| tiff_error(path, page, e))?;
            let ct = scan_pages
                .colortype()
                .map_err(|e| tiff_error(path, page, e))?;
            if dims != (columns, rows) || ct != colortype {
                return Err(ConvertError::input(
                    path,
                    format!(
                        "page {page} is {}×{} {ct:?}, but page 0 is {columns}×{rows} {colortype:?}",
                        dims.0, dims.1
                    ),
                ));
            }
            pages += 1;
        }
        let (rows, columns) = (u64::from(rows), u64::from(columns));
        let scan = match options.scan {
            Some(s) => s,
            None => imagej_scan(&description, pages)
                .or_else(|| shaped_scan(&description, pages, rows, columns))
                .ok_or_else(|| {
                    ConvertError::input(
                        path,
                        format!("a stack of {pages} pages needs --scan ROWS,COLS (it carries no 4-D shape)"),
                    )
                })?,
        };
        if scan[0].checked_mul(scan[1]) != Some(pages) {
            return Err(ConvertError::input(
                path,
                format!(
                    "holds {pages} pages, but the scan {}×{} needs {}",
                    scan[0],
                    scan[1],
                    scan[0].saturating_mul(scan[1])
                ),
            ));
        }
        let mut decoder = reader()?;
        let first = decoder.read_image().map_err(|e| tiff_error(path, 0, e))?;
        let mut bytes = Vec::new();
        let dtype = page_bytes(first, &mut bytes).map_err(|e| ConvertError::input(path, e))?;
        let narrowing = Narrowing::plan(SourceDtype::little(dtype), options.allow_float_rounding);
        let mut source_metadata = serde_json::Map::new();
        let mut documents = Vec::new();
        if !description.is_empty() {
            source_metadata.insert("tiff_image_description".into(), description.clone().into());
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "stack.tiff".into());
            let trimmed = description.trim_start();
            if serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&description)
                .is_ok()
            {
                documents.push(Document {
                    filename: format!("{name}.description.json"),
                    media_type: "application/json",
                    content: description.clone(),
                });
            } else if trimmed.starts_with("<?xml")
                && !trimmed.to_ascii_lowercase().contains("<!doctype")
            {
                documents.push(Document {
                    filename: format!("{name}.description.xml"),
                    media_type: "application/xml",
                    content: description.clone(),
                });
            }
        }
        let calibration = Calibration {
            source_metadata,
            processing: narrowing.record.iter().cloned().collect(),
            ..Calibration::default()
        };
        let shape = [scan[0], scan[1], rows, columns];
        let description = foreign(
            path,
            shape,
            narrowing.stored,
            &calibration,
            "tiff",
            &documents,
        )?;
        Ok(TiffSource {
            description,
            path: path.to_path_buf(),
            decoder,
            page: 0,
            narrowing,
            page_elements: (rows * columns) as usize,
            bytes,
        })
    }
}

impl Source for TiffSource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        let stored = self.narrowing.stored.size() * self.page_elements;
        for (k, o) in out.chunks_exact_mut(stored).enumerate() {
            let page = first as usize + k;
            // Page 0 was decoded at open; every later page follows the one before.
            if page != 0 || self.page != 0 {
                if page != self.page + 1 {
                    self.decoder
                        .seek_to_image(page)
                        .map_err(|e| tiff_error(&self.path, page, e))?;
                } else {
                    self.decoder
                        .next_image()
                        .map_err(|e| tiff_error(&self.path, page, e))?;
                }
                let result = self
                    .decoder
                    .read_image()
                    .map_err(|e| tiff_error(&self.path, page, e))?;
                let dtype = page_bytes(result, &mut self.bytes)
                    .map_err(|e| ConvertError::input(&self.path, format!("page {page}: {e}")))?;
                if dtype != self.narrowing.source.dtype {
                    return Err(ConvertError::input(
                        &self.path,
                        format!(
                            "page {page} holds {dtype}, but page 0 holds {}",
                            self.narrowing.source.dtype
                        ),
                    ));
                }
                self.page = page;
            }
            if self.bytes.len() != self.page_elements * self.narrowing.source.size() {
                return Err(ConvertError::input(
                    &self.path,
                    format!("page {page}: decoded size differs from its dimensions"),
                ));
            }
            let shape = self.description.shape;
            self.narrowing.apply(&self.bytes, o).map_err(|(i, v)| {
                not_representable(
                    &self.path,
                    &self.narrowing,
                    &shape,
                    page as u64 * self.page_elements as u64 + i as u64,
                    &v,
                )
            })?;
        }
        Ok(())
    }
}
