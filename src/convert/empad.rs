//! EMPAD acquisitions: an XML description beside a `.raw` file of
//! 128 × 130 little-endian float32 frames, whose last two rows are the
//! detector's per-frame metadata (the layout Thermo Fisher's EMPAD software
//! writes and rosettasciio's and LiberTEM's readers read). The stored frames
//! are the 128 × 128 measurement rows, bit for bit, with the float codec and
//! an `empad` description (spec §8.5); the XML itself is attached to
//! `source_documents`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::describe::{foreign, Document};
use super::{ConvertError, Description, Element, Monitor, Options, Source};
use crate::qem::write::{Calibration, Content, DetectorUnit};

pub const DETECTOR_ROWS: u64 = 128;
pub const DETECTOR_COLUMNS: u64 = 128;
/// Rows per frame in the `.raw` file: 128 measured and 2 of metadata.
pub const RAW_ROWS: u64 = 130;
const RAW_FRAME_BYTES: u64 = RAW_ROWS * DETECTOR_COLUMNS * 4;
const FRAME_BYTES: usize = (DETECTOR_ROWS * DETECTOR_COLUMNS * 4) as usize;
/// XML descriptions larger than this are not read (real ones are a few KiB).
const MAX_XML_BYTES: u64 = 4 << 20;

/// True when `head` (the start of a file) looks like an EMPAD description.
pub fn looks_like(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    let text = text.trim_start_matches('\u{feff}').trim_start();
    (text.starts_with("<?xml") || text.starts_with("<root")) && text.contains("<root")
}

pub struct EmpadSource {
    description: Description,
    raw_path: PathBuf,
    raw: File,
}

/// What the XML says, in the names of its own elements.
struct Xml {
    raw_filename: String,
    /// `(scan_rows, scan_columns)` when the XML gives a scan.
    scan: Option<[u64; 2]>,
    /// Frames of a `series_count` acquisition (a 1-D series).
    series: Option<u64>,
    /// Leaf path (`a/b/c` or `a/b@attr`) → text, in document order.
    leaves: Map<String, Value>,
}

fn leaves(node: roxmltree::Node, prefix: &str, out: &mut Map<String, Value>) {
    for attr in node.attributes() {
        out.insert(format!("{prefix}@{}", attr.name()), attr.value().into());
    }
    let children: Vec<_> = node.children().filter(|c| c.is_element()).collect();
    if children.is_empty() {
        if let Some(text) = node.text().map(str::trim).filter(|t| !t.is_empty()) {
            out.insert(prefix.to_string(), text.into());
        }
    }
    for child in children {
        leaves(child, &format!("{prefix}/{}", child.tag_name().name()), out);
    }
}

fn parse_xml(path: &Path, text: &str) -> Result<Xml, ConvertError> {
    let lower = text.to_ascii_lowercase();
    if lower.contains("<!doctype") || lower.contains("<!entity") {
        return Err(ConvertError::input(
            path,
            "EMPAD XML with a DOCTYPE or ENTITY declaration is refused",
        ));
    }
    let doc = roxmltree::Document::parse(text)
        .map_err(|e| ConvertError::input(path, format!("not well-formed XML: {e}")))?;
    let root = doc.root_element();
    if root.tag_name().name() != "root" {
        return Err(ConvertError::input(
            path,
            format!(
                "not an EMPAD description: the root element is <{}>, not <root>",
                root.tag_name().name()
            ),
        ));
    }
    let mut map = Map::new();
    leaves(root, "root", &mut map);
    let get = |key: &str| map.get(key).and_then(Value::as_str);
    let raw_filename = get("root/raw_file@filename")
        .or_else(|| get("root/raw_file/filename"))
        .ok_or_else(|| {
            ConvertError::input(path, "not an EMPAD description: no <raw_file filename=...>")
        })?
        .to_string();
    let number = |key: &str| -> Result<Option<u64>, ConvertError> {
        get(key)
            .map(|t| {
                t.trim().parse::<u64>().map_err(|_| {
                    ConvertError::input(path, format!("{key} is {t:?}, not a whole number"))
                })
            })
            .transpose()
    };
    let series = number("root/scan_parameters/series_count")?;
    let scan = match (number("root/pix_y")?, number("root/pix_x")?) {
        (Some(y), Some(x)) => Some([y, x]),
        _ => scan_from_name(&raw_filename),
    };
    Ok(Xml {
        raw_filename,
        scan,
        series,
        leaves: map,
    })
}

/// `scan_x256_y128.raw` → 128 rows × 256 columns, as EMPAD names its files.
fn scan_from_name(name: &str) -> Option<[u64; 2]> {
    let stem = name.strip_prefix("scan_")?.split('.').next()?;
    let (x, y) = stem.rsplit_once('_')?;
    let x = x.rsplit('_').next()?.strip_prefix('x')?.parse().ok()?;
    let y = y.strip_prefix('y')?.parse().ok()?;
    Some([y, x])
}

fn float(map: &Map<String, Value>, key: &str) -> Option<f64> {
    map.get(key)?.as_str()?.trim().parse().ok()
}

/// Numbers of a Python tuple text such as `(1.2e-08, 1.2e-08)`.
fn floats(text: &str) -> Vec<f64> {
    text.trim_matches(|c| c == '(' || c == ')' || c == '[' || c == ']')
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

/// Scan step (row, column) in ångström, as rosettasciio's EMPAD reader
/// derives it: the optics' full field of view per pixel, or the newer
/// `full_scan_field_of_view` (which covers the larger scan dimension and is
/// stored multiplied by its `scale_factor`).
fn scan_step(map: &Map<String, Value>, scan: [u64; 2]) -> Option<[f64; 2]> {
    const M_TO_ANGSTROM: f64 = 1e10;
    if let Some(fov) = map
        .get("root/iom_measurements/optics/get_full_scan_field_of_view")
        .and_then(Value::as_str)
    {
        if let [r, c] = floats(fov)[..] {
            return Some([
                r / scan[0] as f64 * M_TO_ANGSTROM,
                c / scan[1] as f64 * M_TO_ANGSTROM,
            ]);
        }
    }
    let fov = float(map, "root/iom_measurements/full_scan_field_of_view/x")?;
    let factor = float(
        map,
        "root/iom_measurements/full_scan_field_of_view/scale_factor",
    )?;
    let step = fov / factor / scan[0].max(scan[1]) as f64 * M_TO_ANGSTROM;
    Some([step, step])
}

impl EmpadSource {
    pub fn open(
        path: &Path,
        options: &Options,
        monitor: &mut dyn Monitor,
    ) -> Result<EmpadSource, ConvertError> {
        let len = std::fs::metadata(path)
            .map_err(|e| ConvertError::io(path, e))?
            .len();
        if len > MAX_XML_BYTES {
            return Err(ConvertError::input(
                path,
                format!("{len} bytes is too large for an EMPAD XML description"),
            ));
        }
        let text =
            crate::regular_file::read_to_string(path).map_err(|e| ConvertError::io(path, e))?;
        let xml = parse_xml(path, &text)?;
        if xml.raw_filename.contains(['/', '\\']) || xml.raw_filename.is_empty() {
            return Err(ConvertError::input(
                path,
                format!(
                    "raw_file {:?} must be a file name beside the XML",
                    xml.raw_filename
                ),
            ));
        }
        let raw_path = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&xml.raw_filename);
        let raw =
            crate::regular_file::open(&raw_path).map_err(|e| ConvertError::io(&raw_path, e))?;
        let raw_len = raw
            .metadata()
            .map_err(|e| ConvertError::io(&raw_path, e))?
            .len();
        let scan = match (xml.scan, xml.series, options.scan) {
            (Some(s), _, Some(given)) if s != given => {
                return Err(ConvertError::input(
                    path,
                    format!("the XML's scan is {}×{}, not the --scan {},{} given", s[0], s[1], given[0], given[1]),
                ))
            }
            (_, Some(n), Some(given)) if given[0].checked_mul(given[1]) != Some(n) => {
                return Err(ConvertError::input(
                    path,
                    format!("the XML's series has {n} frames, not the {} of --scan {},{}", given[0].saturating_mul(given[1]), given[0], given[1]),
                ))
            }
            (_, _, Some(given)) => given,
            (Some(s), _, None) => s,
            (None, Some(n), None) => [1, n],
            (None, None, None) => {
                return Err(ConvertError::input(
                    path,
                    "the XML gives no scan shape (pix_x/pix_y, series_count or a scan_xN_yM file name): give --scan ROWS,COLS",
                ))
            }
        };
        let frames = scan[0]
            .checked_mul(scan[1])
            .ok_or_else(|| ConvertError::input(path, "scan too large"))?;
        let need = frames.checked_mul(RAW_FRAME_BYTES);
        if need != Some(raw_len) {
            return Err(ConvertError::input(
                &raw_path,
                format!(
                    "holds {raw_len} bytes, but the {}×{} scan of {} needs {} ({frames} frames of 128×130 float32)",
                    scan[0],
                    scan[1],
                    path.display(),
                    need.map_or("more than 2^64".into(), |n| n.to_string())
                ),
            ));
        }
        let shape = [scan[0], scan[1], DETECTOR_ROWS, DETECTOR_COLUMNS];
        let step = scan_step(&xml.leaves, scan);
        // `calibrated_pixelsize` × 1e9 is 1/nm (rosettasciio's reading); we store 1/Å.
        let detector = float(&xml.leaves, "root/iom_measurements/calibrated_pixelsize")
            .map(|v| v * 1e9 / 10.0)
            .filter(|v| v.is_finite() && *v > 0.0);
        let calibration = Calibration {
            scan_sampling_angstrom: step.filter(|s| s.iter().all(|v| v.is_finite() && *v > 0.0)),
            detector_sampling: detector.map(|d| ([d, d], DetectorUnit::InverseAngstrom)),
            source_metadata: xml.leaves.clone(),
            provenance: "source file".into(),
            ..Calibration::default()
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "empad.xml".into());
        let document = Document {
            filename: name,
            media_type: "application/xml",
            content: text,
        };
        if document.content.len() > 4 << 20 {
            monitor.warn(&format!(
                "{}: the XML is larger than source_documents allows; not attached",
                path.display()
            ));
        }
        let documents: Vec<Document> = std::iter::once(document)
            .filter(|d| d.content.len() <= 4 << 20)
            .collect();
        let mut description =
            foreign(path, shape, Element::F32, &calibration, "empad", &documents)?;
        description.content = Content::Float32 {
            empad: Some(empad_member(&xml.leaves, step, detector)),
            metadata: Map::new(),
        };
        Ok(EmpadSource {
            description,
            raw_path,
            raw,
        })
    }
}

/// The `empad` header member (spec §8.5).
fn empad_member(
    leaves: &Map<String, Value>,
    step: Option<[f64; 2]>,
    detector_inv_angstrom: Option<f64>,
) -> Map<String, Value> {
    let mut e = Map::new();
    e.insert("format_identifier".into(), "empad-xml-raw".into());
    e.insert("format_name".into(), "EMPAD (.xml + .raw)".into());
    e.insert("microscope_metadata".into(), Value::Object(leaves.clone()));
    if let Some(date) = leaves
        .get("root/timestamp@isoformat")
        .or_else(|| leaves.get("root/timestamp/isoformat"))
    {
        e.insert("acquisition_date".into(), date.clone());
    }
    if let Some([r, c]) = step {
        e.insert(
            "scan_calibration".into(),
            serde_json::json!({"row_step_angstrom": r, "column_step_angstrom": c}),
        );
    }
    if let Some(d) = detector_inv_angstrom {
        e.insert("diffraction_sampling_inv_nm".into(), (d * 10.0).into());
    }
    e
}

impl Source for EmpadSource {
    fn description(&self) -> &Description {
        &self.description
    }

    fn description_mut(&mut self) -> &mut Description {
        &mut self.description
    }

    fn read_frames(&mut self, first: u64, out: &mut [u8]) -> Result<(), ConvertError> {
        // One pass, straight into the window: each frame's measured rows
        // are read to their place, and its two metadata rows land on the
        // start of the next frame's place, which that frame's read then
        // overwrites. The last frame's metadata rows are not read.
        let frames = out.len() / FRAME_BYTES;
        let raw = RAW_FRAME_BYTES as usize;
        for k in 0..frames {
            let at = k * FRAME_BYTES;
            let end = (at + raw).min(out.len());
            self.raw
                .read_exact_at(&mut out[at..end], (first + k as u64) * RAW_FRAME_BYTES)
                .map_err(|e| ConvertError::io(&self.raw_path, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_shape_from_the_file_name() {
        assert_eq!(scan_from_name("scan_x256_y128.raw"), Some([128, 256]));
        assert_eq!(scan_from_name("scan_x4_y3.raw"), Some([3, 4]));
        assert_eq!(scan_from_name("data.raw"), None);
    }
}
