//! Building the description of a foreign source: its `scientific_metadata`
//! (calibration, processing, the source's own documents) and the `.qem`
//! content its element type maps to.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::{ConvertError, Description, Element};
use crate::qem::write::{scientific_metadata, Calibration, Content, CountDtype};
use std::path::Path;

/// A source file's own header, attached to `source_documents` (spec §5.5).
#[derive(Clone, Debug)]
pub struct Document {
    pub filename: String,
    /// `application/xml` or `application/json`.
    pub media_type: &'static str,
    pub content: String,
}

impl Document {
    fn to_json(&self) -> Value {
        let digest = Sha256::digest(self.content.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        json!({
            "content": self.content,
            "filename": self.filename,
            "mediaType": self.media_type,
            "sha256": hex,
        })
    }
}

/// The `scientific_metadata` of a new conversion from a foreign format.
pub fn fresh_metadata(
    shape: [u64; 4],
    calibration: &Calibration,
    source_format: &str,
    documents: &[Document],
) -> Result<Value, crate::qem::write::WriteError> {
    let mut sm = scientific_metadata(shape, calibration)?;
    sm["source_format"] = source_format.into();
    sm["source_documents"] = documents.iter().map(Document::to_json).collect();
    Ok(sm)
}

/// The description of a foreign source whose frames are `element`s.
pub fn foreign(
    path: &Path,
    shape: [u64; 4],
    element: Element,
    calibration: &Calibration,
    source_format: &str,
    documents: &[Document],
) -> Result<Description, ConvertError> {
    let scientific_metadata = fresh_metadata(shape, calibration, source_format, documents)
        .map_err(|e| ConvertError::input(path, e.to_string()))?;
    let content = match element {
        Element::U8 | Element::U16 => Content::Counts {
            dtype: if element == Element::U8 {
                CountDtype::U8
            } else {
                CountDtype::U16
            },
            valid: None,
            metadata: Map::new(),
        },
        Element::F32 => Content::Float32 {
            empad: None,
            metadata: Map::new(),
        },
    };
    Ok(Description {
        shape,
        element,
        content,
        scientific_metadata,
        extra: Map::new(),
    })
}

/// The 4-D shape of an array of `dims` with scan shape `scan` for 3-D input.
pub fn shape4(path: &Path, dims: &[u64], scan: Option<[u64; 2]>) -> Result<[u64; 4], ConvertError> {
    match (dims, scan) {
        ([a, b, c, d], None) => Ok([*a, *b, *c, *d]),
        ([a, b, c, d], Some(s)) if s == [*a, *b] => Ok([*a, *b, *c, *d]),
        ([a, b, _, _], Some([r, c])) => Err(ConvertError::input(
            path,
            format!("the array's scan shape is {a}×{b}, not the --scan {r},{c} given"),
        )),
        ([n, h, w], Some([r, c])) => {
            if r.checked_mul(c) != Some(*n) {
                return Err(ConvertError::input(
                    path,
                    format!("--scan {r},{c} is {} frames, but the array holds {n}", r.saturating_mul(c)),
                ));
            }
            Ok([r, c, *h, *w])
        }
        ([n, _, _], None) => Err(ConvertError::input(
            path,
            format!("a 3-D array of {n} frames needs --scan ROWS,COLS"),
        )),
        _ => Err(ConvertError::input(
            path,
            format!(
                "expected a 4-D array (scan_row, scan_column, detector_row, detector_column) or a 3-D one with --scan, not shape {dims:?}"
            ),
        )),
    }
}
