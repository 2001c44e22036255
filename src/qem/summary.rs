//! What `qem show --json` prints and the mount's `info.json` holds: the
//! stored header plus a summary computed from it alone (no decoding, no
//! body checksums), so it is instant on any file size.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Map, Value};

use crate::export::json::Stored;

use super::error::QemError;
use super::file::QemFile;
use super::header::Codec;
use super::metadata::{Quantity, Schema};

fn quantity(q: &Quantity) -> Value {
    json!({
        "value": q.value,
        "unit": q.unit,
        "provenance": q.provenance,
    })
}

impl QemFile {
    /// The computed summary: codec, dtypes, shape, chunking, sizes,
    /// compression ratio, validity and effective calibration.
    pub fn summary(&self) -> Value {
        let md = self.metadata();
        let decoded = self.dense_bytes();
        let axes: Vec<Value> = md
            .axes
            .iter()
            .map(|a| {
                json!({
                    "name": a.name,
                    "size": a.size,
                    "sampling": a.sampling.as_ref().map(quantity),
                })
            })
            .collect();
        // Effective values: an override wins over the recorded value.
        let mut calibration = Map::new();
        for (path, q) in &md.electron_microscope {
            calibration.insert(path.clone(), quantity(q));
        }
        for (path, q) in &md.calibration_overrides {
            let mut v = quantity(q);
            v["overridden"] = Value::Bool(true);
            calibration.insert(path.clone(), v);
        }
        let chunk_scans: Vec<usize> = self.chunks().iter().map(|c| c.scans).collect();
        let regions = self.calibration().map(|c| {
            c.regions
                .iter()
                .map(|r| {
                    json!({
                        "first_frame": r.first_frame,
                        "stop_frame": r.stop_frame,
                        "scale": r.scale,
                        "offset": r.offset,
                    })
                })
                .collect::<Vec<_>>()
        });
        json!({
            "codec": self.codec().id(),
            "kind": match self.codec() {
                Codec::Integer => "counts",
                Codec::Float => "float32 measurements",
                Codec::Scaled => "scaled codes (derived results, not counts)",
            },
            "stored_dtype": self.stored_dtype().name(),
            "decoded_dtype": self.decoded_dtype().name(),
            "shape": self.shape(),
            "axes": axes,
            "frames": self.frames(),
            "pixels": self.pixels(),
            "chunks": self.chunks().len(),
            "chunk_scans": chunk_scans,
            "blocks": self.blocks().len(),
            "file_bytes": self.file_bytes(),
            "header_bytes": self.header_bytes(),
            "body_bytes": self.body_bytes(),
            "decoded_bytes": decoded,
            "compression_ratio": decoded.map(|d| d as f64 / self.file_bytes().max(1) as f64),
            "invalid_pixels": self.valid_mask().map(|m| m.invalid_count()),
            // Detector pixels the mask keeps (`null` for codecs without one).
            "valid_pixels": self.valid_mask().map(|m| m.pixels() - m.invalid_count()),
            "metadata_schema": match md.schema {
                Schema::V1 => super::metadata::SCHEMA_1,
                Schema::V2 => super::metadata::SCHEMA_2,
            },
            "calibration": calibration,
            "intensity_regions": regions,
            "processing": md.processing.iter().map(|r| json!({
                "operation": r.operation,
                "changes_measurements": r.changes_measurements,
            })).collect::<Vec<_>>(),
        })
    }

    /// `{"header": <stored header>, "summary": <summary>}`, to be written
    /// by [`crate::export::json::write_pretty`]: the header is re-indented
    /// from its text as it is written, never parsed into a tree.
    pub fn info(&self) -> Result<Info<'_>, QemError> {
        Ok(Info {
            header: Stored(self.header_text()?),
            summary: self.summary(),
            backend: None,
        })
    }
}

/// What `info.json` and `qem show --json` hold (see [`QemFile::info`]).
pub struct Info<'a> {
    header: Stored<'a>,
    summary: Value,
    backend: Option<&'a str>,
}

impl<'a> Info<'a> {
    /// Names the backend that computes the container's `virtual/` products
    /// (`reductions_backend`, after the summary).
    pub fn with_backend(mut self, name: &'a str) -> Self {
        self.backend = Some(name);
        self
    }
}

impl Serialize for Info<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2 + usize::from(self.backend.is_some())))?;
        map.serialize_entry("header", &self.header)?;
        map.serialize_entry("summary", &self.summary)?;
        if let Some(name) = self.backend {
            map.serialize_entry("reductions_backend", name)?;
        }
        map.end()
    }
}
