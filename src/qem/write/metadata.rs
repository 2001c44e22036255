//! `scientific_metadata` (spec §5) for new files: the reference writer's
//! form built from a [`Calibration`], and the check of a caller's object
//! before anything is written. The rules themselves are the reader's
//! ([`crate::qem::metadata`]); this module adds only the writer's own, that
//! new files are schema 2 (§5.8).

use serde_json::{json, Map, Value};

use super::header::sorted;
use super::{WriteError, SCALED_CODEC};
use crate::python_json::float_repr;
use crate::qem::error::QemError;
use crate::qem::metadata::{
    ScientificMetadata, ACCELERATING_VOLTAGE, AXIS_NAMES, PIXEL_SIZE_COLUMN, PIXEL_SIZE_ROW,
    SCALED_QUANTIZATION, SCHEMA_2,
};

/// The scaled codec's mandatory processing record text, as native writers put it.
pub const SCALED_QUANTIZATION_DESCRIPTION: &str =
    "Regional scaled uint16: intensity = float32(code x scale + offset).";

/// Unit of detector sampling: angular or reciprocal length (cycles per ångström, no 2π).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetectorUnit {
    Mrad,
    InverseAngstrom,
}

impl DetectorUnit {
    fn name(self) -> &'static str {
        match self {
            DetectorUnit::Mrad => "mrad",
            DetectorUnit::InverseAngstrom => "1/angstrom",
        }
    }
}

/// Calibration known about an acquisition; everything optional (absent = unknown).
#[derive(Clone, Debug)]
pub struct Calibration {
    /// Scan step (row, column) in ångström.
    pub scan_sampling_angstrom: Option<[f64; 2]>,
    /// Detector pixel size (row, column) and its unit.
    pub detector_sampling: Option<([f64; 2], DetectorUnit)>,
    /// Accelerating voltage in kV.
    pub voltage_kv: Option<f64>,
    /// Original reader-provided fields, uninterpreted.
    pub source_metadata: Map<String, Value>,
    /// Where the calibrated values come from (`provenance` of each quantity).
    pub provenance: String,
    /// The processing records; empty = `lossless_storage` only.
    pub processing: Vec<Value>,
}

impl Default for Calibration {
    fn default() -> Calibration {
        Calibration {
            scan_sampling_angstrom: None,
            detector_sampling: None,
            voltage_kv: None,
            source_metadata: Map::new(),
            provenance: "source_metadata".into(),
            processing: Vec::new(),
        }
    }
}

impl Calibration {
    /// The processing record the scaled codec requires.
    pub fn scaled_quantization_record() -> Value {
        json!({
            "changes_measurements": true,
            "description": SCALED_QUANTIZATION_DESCRIPTION,
            "operation": SCALED_QUANTIZATION,
        })
    }
}

fn quantity(value: f64, unit: &str, provenance: &str) -> Value {
    json!({"provenance": provenance, "unit": unit, "value": value})
}

/// The `scientific_metadata` the reference writer emits for `shape` and the
/// given calibration (schema 2, canonical units, axis sampling mirrored in
/// `electron_microscope` for the scan step).
pub fn scientific_metadata(shape: [u64; 4], cal: &Calibration) -> Result<Value, WriteError> {
    let mut sampling: [Option<Value>; 4] = Default::default();
    let mut microscope = Map::new();
    let prov = cal.provenance.as_str();
    if let Some([r, c]) = cal.scan_sampling_angstrom {
        let row = quantity(r, "angstrom", prov);
        let col = quantity(c, "angstrom", prov);
        microscope.insert(PIXEL_SIZE_ROW.into(), row.clone());
        microscope.insert(PIXEL_SIZE_COLUMN.into(), col.clone());
        sampling[0] = Some(row);
        sampling[1] = Some(col);
    }
    if let Some(([r, c], unit)) = cal.detector_sampling {
        sampling[2] = Some(quantity(r, unit.name(), prov));
        sampling[3] = Some(quantity(c, unit.name(), prov));
    }
    if let Some(kv) = cal.voltage_kv {
        microscope.insert(ACCELERATING_VOLTAGE.into(), quantity(kv, "kV", prov));
    }
    let axes: Vec<Value> = AXIS_NAMES
        .iter()
        .zip(shape)
        .zip(sampling)
        .map(|((name, size), s)| {
            let mut a = Map::new();
            a.insert("name".into(), (*name).into());
            a.insert("size".into(), size.into());
            if let Some(s) = s {
                a.insert("sampling".into(), s);
            }
            Value::Object(a)
        })
        .collect();
    let processing = if cal.processing.is_empty() {
        vec![json!({"changes_measurements": false, "operation": "lossless_storage"})]
    } else {
        cal.processing.clone()
    };
    let sm = json!({
        "axes": axes,
        "calibration_overrides": {},
        "electron_microscope": microscope,
        "processing": processing,
        "schema": SCHEMA_2,
        "source_documents": [],
        "source_format": "unknown",
        "source_metadata": cal.source_metadata,
        "source_metadata_coverage": "reader-retained",
    });
    // A non-finite calibration became `null` above; the rules name it.
    ScientificMetadata::parse(&sm, &shape).map_err(refused)?;
    Ok(sm)
}

/// The reference writer's default `empad` member of a float file: the
/// source metadata entries rendered as Python `str`.
pub(crate) fn default_empad(sm: &Value) -> Map<String, Value> {
    let mut mm = Map::new();
    if let Some(Value::Object(src)) = sm.get("source_metadata") {
        for (k, v) in src {
            mm.insert(k.clone(), Value::String(python_str(v)));
        }
    }
    let mut e = Map::new();
    e.insert("format_identifier".into(), "numpy-float32".into());
    e.insert("format_name".into(), "NumPy float32".into());
    e.insert("microscope_metadata".into(), Value::Object(mm));
    e
}

/// Python's `str()` of a JSON-decoded value.
fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => python_repr(other),
    }
}

fn python_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (_, Some(i), _) => i.to_string(),
            (_, _, Some(f)) => float_repr(f),
            _ => n.to_string(),
        },
        Value::String(s) => crate::python_json::str_repr(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(python_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!(
                    "{}: {}",
                    python_repr(&Value::String(k.clone())),
                    python_repr(v)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The reader's refusal as the writer reports it: the same path and reason,
/// and so the same text (the two error types display `Metadata` alike).
fn refused(e: QemError) -> WriteError {
    match e {
        QemError::Metadata { path, reason } => WriteError::Metadata { path, reason },
        other => WriteError::Metadata {
            path: "scientific_metadata".into(),
            reason: other.to_string(),
        },
    }
}

/// Checks `sm` before a file of `codec` storing `dtype` with the producer
/// record `metadata` is written: every rule the reader applies when it opens
/// the file (spec §5, §5.6 and, for the scaled codec, §9.1), and the
/// writer's own, that new files are schema 2 (§5.8).
pub fn validate_scientific_metadata(
    sm: &Value,
    shape: [u64; 4],
    codec: &str,
    dtype: &str,
    metadata: &Map<String, Value>,
) -> Result<(), WriteError> {
    if let Some(schema) = sm.get("schema").and_then(Value::as_str) {
        if schema != SCHEMA_2 {
            return Err(WriteError::Metadata {
                path: "schema".into(),
                reason: format!("new files are written as {SCHEMA_2:?}, not {schema:?}"),
            });
        }
    }
    // The rules stop at the first fault; check the members in the order the
    // file will hold them, so that it is the fault the reader reports.
    let md = ScientificMetadata::validate(&sorted(sm), &shape, Some(metadata), dtype)
        .map_err(refused)?;
    if codec == SCALED_CODEC {
        md.check_scaled_quantization().map_err(refused)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_form_matches_the_reference() {
        let sm = scientific_metadata([1, 2, 2, 3], &Calibration::default()).unwrap();
        let text = crate::qem::write::to_canonical_json(&sm).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"axes":[{"name":"scan_row","size":1},{"name":"scan_column","size":2},"#,
                r#"{"name":"detector_row","size":2},{"name":"detector_column","size":3}],"calibration_overrides":{},"#,
                r#""electron_microscope":{},"processing":[{"changes_measurements":false,"#,
                r#""operation":"lossless_storage"}],"schema":"quantem.scientific-metadata/2","#,
                r#""source_documents":[],"source_format":"unknown","source_metadata":{},"#,
                r#""source_metadata_coverage":"reader-retained"}"#
            )
        );
        validate_scientific_metadata(&sm, [1, 2, 2, 3], "x", "uint8", &Map::new()).unwrap();
    }

    #[test]
    fn refuses_what_the_reader_refuses() {
        let shape = [1, 2, 2, 3];
        let good = scientific_metadata(shape, &Calibration::default()).unwrap();
        let check = |edit: &dyn Fn(&mut Value)| {
            let mut sm = good.clone();
            edit(&mut sm);
            validate_scientific_metadata(&sm, shape, "x", "uint8", &Map::new())
        };
        assert!(check(&|_| {}).is_ok());
        assert!(check(&|s| s["schema"] = "quantem.scientific-metadata/1".into()).is_err());
        assert!(check(&|s| s["axes"][1]["size"] = 3.into()).is_err());
        assert!(check(&|s| s["processing"] = json!([])).is_err());
        assert!(check(&|s| s["processing"][0]
            .as_object_mut()
            .unwrap()
            .retain(|k, _| k != "changes_measurements"))
        .is_err());
        assert!(check(&|s| {
            s.as_object_mut()
                .unwrap()
                .remove("source_metadata_coverage");
        })
        .is_err());
        assert!(check(
            &|s| s["axes"][0]["sampling"] = json!({"value": 1e-10, "unit": "m", "provenance": "x"})
        )
        .is_err());
        assert!(check(&|s| {
            s["axes"][0]["sampling"] = json!({"value": 0.4, "unit": "angstrom", "provenance": "x"});
            s["electron_microscope"]["scan_controller/regular_scan/pixel_size_row"] =
                json!({"value": 0.5, "unit": "angstrom", "provenance": "x"});
        })
        .is_err());
        assert!(check(&|s| s["electron_microscope"]
            ["scan_controller/regular_scan/pixel_size_y"] =
            json!({"value": 0.5, "unit": "angstrom", "provenance": "x"}))
        .is_err());
        let mut md = Map::new();
        md.insert("source_dtype".into(), "uint32".into());
        assert!(validate_scientific_metadata(&good, shape, "x", "uint16", &md).is_err());
        assert!(
            validate_scientific_metadata(&good, shape, SCALED_CODEC, "uint16", &Map::new())
                .is_err()
        );
    }

    #[test]
    fn python_str_of_values() {
        assert_eq!(python_str(&json!("text")), "text");
        assert_eq!(python_str(&json!(300)), "300");
        assert_eq!(python_str(&json!(1e-5)), "1e-05");
        assert_eq!(
            python_str(&json!([1, true, null, "a'b"])),
            "[1, True, None, \"a'b\"]"
        );
        assert_eq!(python_str(&json!({"k": 0.5})), "{'k': 0.5}");
    }
}
