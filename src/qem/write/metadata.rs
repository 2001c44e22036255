//! `scientific_metadata` (spec §5): building the reference writer's form and
//! checking a caller's object against the rules the reference reader
//! enforces, so that a written file is never refused for its metadata.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::{header::python_float_repr, WriteError, SCALED_CODEC};

/// The scaled codec's mandatory processing record text, as native writers put it.
pub const SCALED_QUANTIZATION_DESCRIPTION: &str =
    "Regional scaled uint16: intensity = float32(code x scale + offset).";

const SCHEMA: &str = "quantem.scientific-metadata/2";
const AXES: [&str; 4] = ["scan_row", "scan_column", "detector_row", "detector_column"];

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
            "operation": "scaled_uint16_quantization",
        })
    }
}

fn quantity(value: f64, unit: &str, provenance: &str, path: &str) -> Result<Value, WriteError> {
    if !(value.is_finite() && value > 0.0) {
        return Err(WriteError::Metadata {
            path: path.into(),
            reason: format!("a calibrated quantity must be finite and positive, not {value}"),
        });
    }
    Ok(json!({"provenance": provenance, "unit": unit, "value": value}))
}

/// The `scientific_metadata` the reference writer emits for `shape` and the
/// given calibration (schema 2, canonical units, axis sampling mirrored in
/// `electron_microscope` for the scan step).
pub fn scientific_metadata(shape: [u64; 4], cal: &Calibration) -> Result<Value, WriteError> {
    let mut sampling: [Option<Value>; 4] = Default::default();
    let mut microscope = Map::new();
    let prov = cal.provenance.as_str();
    if let Some([r, c]) = cal.scan_sampling_angstrom {
        let row = quantity(r, "angstrom", prov, "axes[0].sampling")?;
        let col = quantity(c, "angstrom", prov, "axes[1].sampling")?;
        microscope.insert(
            "scan_controller/regular_scan/pixel_size_row".into(),
            row.clone(),
        );
        microscope.insert(
            "scan_controller/regular_scan/pixel_size_column".into(),
            col.clone(),
        );
        sampling[0] = Some(row);
        sampling[1] = Some(col);
    }
    if let Some(([r, c], unit)) = cal.detector_sampling {
        sampling[2] = Some(quantity(r, unit.name(), prov, "axes[2].sampling")?);
        sampling[3] = Some(quantity(c, unit.name(), prov, "axes[3].sampling")?);
    }
    if let Some(kv) = cal.voltage_kv {
        microscope.insert(
            "electron_source/accelerating_voltage".into(),
            quantity(kv, "kV", prov, "electron_source/accelerating_voltage")?,
        );
    }
    let axes: Vec<Value> = AXES
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
    Ok(json!({
        "axes": axes,
        "calibration_overrides": {},
        "electron_microscope": microscope,
        "processing": processing,
        "schema": SCHEMA,
        "source_documents": [],
        "source_format": "unknown",
        "source_metadata": cal.source_metadata,
        "source_metadata_coverage": "reader-retained",
    }))
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
            (_, _, Some(f)) => python_float_repr(f),
            _ => n.to_string(),
        },
        Value::String(s) => {
            // Python prefers single quotes unless the text holds one and no double quote.
            let q = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            let mut out = String::from(q);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == q => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        out.push_str(&format!("\\x{:02x}", c as u32))
                    }
                    c => out.push(c),
                }
            }
            out.push(q);
            out
        }
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

fn fail<T>(path: impl Into<String>, reason: impl Into<String>) -> Result<T, WriteError> {
    Err(WriteError::Metadata {
        path: path.into(),
        reason: reason.into(),
    })
}

/// Canonical unit(s) of the quantity paths schema 2 constrains.
fn canonical_units(path: &str) -> Option<&'static [&'static str]> {
    Some(match path {
        "scan_controller/regular_scan/pixel_size_row"
        | "scan_controller/regular_scan/pixel_size_column" => &["angstrom"],
        "imaging_system/reciprocal_pixel_size_row"
        | "imaging_system/reciprocal_pixel_size_column" => &["mrad", "1/angstrom"],
        "electron_source/accelerating_voltage" => &["kV"],
        "electron_source/beam_energy" => &["keV"],
        "illumination_system/semi_convergence_angle" => &["mrad"],
        "scan_controller/regular_scan/dwell_time" => &["us"],
        "imaging_system/camera_length" => &["mm"],
        _ => return None,
    })
}

const RETIRED: [&str; 4] = [
    "scan_controller/regular_scan/pixel_size_y",
    "scan_controller/regular_scan/pixel_size_x",
    "imaging_system/reciprocal_pixel_size_y",
    "imaging_system/reciprocal_pixel_size_x",
];

fn nonblank(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str)
        .is_some_and(|s| !s.trim().is_empty())
}

fn check_quantity(q: &Value, path: &str) -> Result<f64, WriteError> {
    let Some(o) = q.as_object() else {
        return fail(path, "a quantity must be an object");
    };
    let value = match o.get("value") {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
        _ => return fail(path, "a quantity needs a numeric value"),
    };
    if !(value.is_finite() && value > 0.0) {
        return fail(path, "a quantity's value must be finite and positive");
    }
    if o.get("unit")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return fail(path, "a quantity needs a non-empty unit");
    }
    if !nonblank(o.get("provenance")) {
        return fail(path, "calibrated quantities require a non-empty provenance");
    }
    if o.get("evidence").is_some_and(|e| !e.is_string()) {
        return fail(path, "evidence must be a string");
    }
    Ok(value)
}

fn unit(q: &Value) -> &str {
    q.get("unit").and_then(Value::as_str).unwrap_or("")
}

/// Checks `sm` against what the reference reader requires of a new file
/// (spec §5, §5.6 and, for the scaled codec, §9.1): schema 2, the four axes
/// matching `shape`, the mandatory members, valid quantities in canonical
/// units, consistent axis/microscope calibration, valid overrides and
/// source documents, and processing records for what `metadata` declares.
pub fn validate_scientific_metadata(
    sm: &Value,
    shape: [u64; 4],
    codec: &str,
    dtype: &str,
    metadata: &Map<String, Value>,
) -> Result<(), WriteError> {
    let p = "scientific_metadata";
    let Some(o) = sm.as_object() else {
        return fail(p, "must be an object");
    };
    if o.get("schema").and_then(Value::as_str) != Some(SCHEMA) {
        return fail(
            format!("{p}.schema"),
            format!("new files must declare {SCHEMA:?}"),
        );
    }
    let Some(axes) = o
        .get("axes")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 4)
    else {
        return fail(format!("{p}.axes"), "must list exactly four axes");
    };
    for (i, axis) in axes.iter().enumerate() {
        let ap = format!("{p}.axes[{i}]");
        if axis.get("name").and_then(Value::as_str) != Some(AXES[i]) {
            return fail(ap, format!("axis {i} must be named {:?}", AXES[i]));
        }
        if axis.get("size").and_then(Value::as_u64) != Some(shape[i]) {
            return fail(ap, format!("size must equal shape[{i}] = {}", shape[i]));
        }
        if let Some(s) = axis.get("sampling") {
            check_quantity(s, &format!("{ap}.sampling"))?;
            let allowed: &[&str] = if i < 2 {
                &["angstrom"]
            } else {
                &["mrad", "1/angstrom"]
            };
            if !allowed.contains(&unit(s)) {
                return fail(
                    format!("{ap}.sampling"),
                    format!("unit must be one of {allowed:?}"),
                );
            }
        }
    }
    if !o.get("source_metadata").is_some_and(Value::is_object) {
        return fail(
            format!("{p}.source_metadata"),
            "must be an object, even when empty",
        );
    }
    let coverage = o.get("source_metadata_coverage").and_then(Value::as_str);
    if !matches!(coverage, Some("reader-retained" | "exhaustive" | "unknown")) {
        return fail(
            format!("{p}.source_metadata_coverage"),
            "must be \"reader-retained\", \"exhaustive\" or \"unknown\"",
        );
    }
    let Some(processing) = o
        .get("processing")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
    else {
        return fail(format!("{p}.processing"), "must be a non-empty list");
    };
    for (i, rec) in processing.iter().enumerate() {
        let ok = rec
            .get("operation")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
            && rec
                .get("changes_measurements")
                .is_some_and(Value::is_boolean);
        if !ok {
            return fail(
                format!("{p}.processing[{i}]"),
                "needs a non-empty operation and a boolean changes_measurements",
            );
        }
    }
    if let Some(em) = o.get("electron_microscope") {
        let Some(em) = em.as_object() else {
            return fail(format!("{p}.electron_microscope"), "must be an object");
        };
        for (path, q) in em {
            let qp = format!("{p}.electron_microscope.{path}");
            if RETIRED.contains(&path.as_str()) {
                return fail(
                    qp,
                    "x/y names of specification 0.0.1 are retired; use _row/_column",
                );
            }
            check_quantity(q, &qp)?;
            if let Some(units) = canonical_units(path) {
                if !units.contains(&unit(q)) {
                    return fail(
                        qp,
                        format!("schema 2 requires the canonical unit {units:?}"),
                    );
                }
            }
        }
        let pairs = [
            ("scan_controller/regular_scan/pixel_size_row", 0),
            ("scan_controller/regular_scan/pixel_size_column", 1),
            ("imaging_system/reciprocal_pixel_size_row", 2),
            ("imaging_system/reciprocal_pixel_size_column", 3),
        ];
        for (path, i) in pairs {
            let Some(q) = em.get(path) else { continue };
            let qp = format!("{p}.electron_microscope.{path}");
            let Some(s) = axes[i].get("sampling") else {
                return fail(qp, format!("needs the same sampling on axis {}", AXES[i]));
            };
            let (a, b) = (
                q["value"].as_f64().unwrap_or(f64::NAN),
                s["value"].as_f64().unwrap_or(f64::NAN),
            );
            if unit(q) != unit(s) || (a - b).abs() > 1e-14 * a.abs().max(b.abs()) {
                return fail(
                    qp,
                    format!("conflicts with the sampling of axis {}", AXES[i]),
                );
            }
        }
    }
    if let Some(ov) = o.get("calibration_overrides") {
        check_overrides(ov, &format!("{p}.calibration_overrides"))?;
    }
    if let Some(docs) = o.get("source_documents") {
        check_documents(docs, &format!("{p}.source_documents"))?;
    }
    if let Some(sample) = o.get("sample") {
        if !sample.is_object() || !nonblank(sample.get("provenance")) {
            return fail(
                format!("{p}.sample"),
                "must be an object with a non-empty provenance",
            );
        }
    }
    if o.get("extensions").is_some_and(|e| !e.is_object()) {
        return fail(format!("{p}.extensions"), "must be an object");
    }
    check_declared_processing(processing, dtype, metadata)?;
    if codec == SCALED_CODEC {
        let declared = processing.iter().any(|r| {
            r["operation"] == "scaled_uint16_quantization" && r["changes_measurements"] == true
        });
        if !declared {
            return fail(
                format!("{p}.processing"),
                "scaled files must declare scaled_uint16_quantization with changes_measurements true",
            );
        }
    }
    Ok(())
}

fn check_overrides(ov: &Value, p: &str) -> Result<(), WriteError> {
    let Some(ov) = ov.as_object() else {
        return fail(p, "must be an object");
    };
    let allowed: &[(&str, &[&str])] = &[
        ("electron_source/accelerating_voltage", &["kV"]),
        ("illumination_system/semi_convergence_angle", &["mrad"]),
        ("scan_controller/regular_scan/dwell_time", &["us"]),
        ("imaging_system/camera_length", &["mm"]),
        ("scan_controller/regular_scan/pixel_size_row", &["angstrom"]),
        (
            "scan_controller/regular_scan/pixel_size_column",
            &["angstrom"],
        ),
        (
            "imaging_system/reciprocal_pixel_size_row",
            &["mrad", "1/angstrom"],
        ),
        (
            "imaging_system/reciprocal_pixel_size_column",
            &["mrad", "1/angstrom"],
        ),
    ];
    for (path, q) in ov {
        let qp = format!("{p}.{path}");
        let Some((_, units)) = allowed.iter().find(|(a, _)| a == path) else {
            return fail(qp, "not an overridable calibration");
        };
        let value = check_quantity(q, &qp)?;
        if !units.contains(&unit(q))
            || q["provenance"] != "user_override"
            || !nonblank(q.get("evidence"))
        {
            return fail(
                qp,
                "needs a canonical unit, provenance \"user_override\" and non-empty evidence",
            );
        }
        if path.contains("pixel_size_")
            && path.starts_with("scan")
            && !(1e-4..=1e4).contains(&value)
        {
            return fail(qp, "scan steps must lie within 1e-4 to 1e4 angstrom");
        }
    }
    for (row, col) in [
        (
            "scan_controller/regular_scan/pixel_size_row",
            "scan_controller/regular_scan/pixel_size_column",
        ),
        (
            "imaging_system/reciprocal_pixel_size_row",
            "imaging_system/reciprocal_pixel_size_column",
        ),
    ] {
        match (ov.get(row), ov.get(col)) {
            (None, None) => {}
            (Some(a), Some(b)) if unit(a) == unit(b) => {}
            _ => {
                return fail(
                    format!("{p}.{row}"),
                    "row and column overrides come in pairs with one unit",
                )
            }
        }
    }
    Ok(())
}

fn check_documents(docs: &Value, p: &str) -> Result<(), WriteError> {
    let Some(docs) = docs.as_array() else {
        return fail(p, "must be a list");
    };
    if docs.len() > 16 {
        return fail(p, "at most 16 source documents");
    }
    let mut total = 0usize;
    for (i, d) in docs.iter().enumerate() {
        let dp = format!("{p}[{i}]");
        let name = d.get("filename").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() || name.contains(['/', '\\']) {
            return fail(dp, "filename must be non-empty without path separators");
        }
        let media = d.get("mediaType").and_then(Value::as_str);
        let Some(content) = d.get("content").and_then(Value::as_str) else {
            return fail(dp, "content must be a string");
        };
        match media {
            Some("application/json") => {
                if !serde_json::from_str::<Value>(content).is_ok_and(|v| v.is_object()) {
                    return fail(dp, "JSON documents must parse to an object");
                }
            }
            Some("application/xml") => {
                let lower = content.to_ascii_lowercase();
                if lower.contains("<!doctype") || lower.contains("<!entity") {
                    return fail(dp, "XML documents must not declare a DOCTYPE or entities");
                }
            }
            _ => return fail(dp, "mediaType must be application/xml or application/json"),
        }
        let digest = Sha256::digest(content.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        if d.get("sha256").and_then(Value::as_str) != Some(hex.as_str()) {
            return fail(dp, "sha256 must be the lowercase SHA-256 of the content");
        }
        total += content.len();
    }
    if total > 4 << 20 {
        return fail(p, "source documents may hold at most 4 MiB in total");
    }
    Ok(())
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// Spec §5.6: what `metadata` says was done must be declared in `processing`.
fn check_declared_processing(
    processing: &[Value],
    dtype: &str,
    metadata: &Map<String, Value>,
) -> Result<(), WriteError> {
    let has = |op: &str, f: &dyn Fn(&Value) -> bool| {
        processing.iter().any(|r| r["operation"] == op && f(r))
    };
    let p = "scientific_metadata.processing";
    if truthy(
        metadata
            .get("hot_pixel_correction")
            .and_then(|h| h.get("applied")),
    ) && !has("flagged_pixel_replacement", &|r| {
        r["changes_measurements"] == true
    }) {
        return fail(
            p,
            "metadata declares a hot-pixel correction: add flagged_pixel_replacement",
        );
    }
    if truthy(metadata.get("flagged_markers_stored_as_zero"))
        && !has("flagged_marker_zeroing", &|_| true)
    {
        return fail(
            p,
            "metadata declares zeroed flag markers: add flagged_marker_zeroing",
        );
    }
    if let Some(src) = metadata.get("source_dtype").and_then(Value::as_str) {
        if src != dtype {
            let op = if src == "float64" && dtype == "float32" {
                "exact_float_narrowing"
            } else {
                "exact_integer_narrowing"
            };
            let ok = has(op, &|r| {
                r["source_dtype"] == src
                    && r["stored_dtype"] == dtype
                    && r["changes_measurements"] == false
            });
            if !ok {
                return fail(
                    p,
                    format!("stored as {dtype} from {src}: add a matching {op} record"),
                );
            }
        }
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
