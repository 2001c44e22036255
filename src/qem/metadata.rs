//! `scientific_metadata` (§5): the rules the reference enforces, and typed
//! access to axes, calibration, overrides and declared processing.
//!
//! This is the one place the §5 rules live: the reader applies them when a
//! file is opened and the writer ([`crate::qem::write`]) before it writes
//! anything, so a file we write is never refused for its metadata, and a
//! refusal reads the same from either side.
//!
//! Schema-1 quantities are converted to the canonical units of §5.2 while
//! reading, so callers only ever see canonical values.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::checksum::hex;
use super::error::QemError;

pub(crate) const SCHEMA_2: &str = "quantem.scientific-metadata/2";
pub(crate) const SCHEMA_1: &str = "quantem.scientific-metadata/1";

pub(crate) const AXIS_NAMES: [&str; 4] =
    ["scan_row", "scan_column", "detector_row", "detector_column"];

pub const PIXEL_SIZE_ROW: &str = "scan_controller/regular_scan/pixel_size_row";
pub(crate) const PIXEL_SIZE_COLUMN: &str = "scan_controller/regular_scan/pixel_size_column";
pub(crate) const RECIPROCAL_ROW: &str = "imaging_system/reciprocal_pixel_size_row";
pub(crate) const RECIPROCAL_COLUMN: &str = "imaging_system/reciprocal_pixel_size_column";
pub const ACCELERATING_VOLTAGE: &str = "electron_source/accelerating_voltage";
pub(crate) const BEAM_ENERGY: &str = "electron_source/beam_energy";
pub(crate) const SEMI_CONVERGENCE: &str = "illumination_system/semi_convergence_angle";
pub(crate) const DWELL_TIME: &str = "scan_controller/regular_scan/dwell_time";
pub(crate) const CAMERA_LENGTH: &str = "imaging_system/camera_length";

/// The `processing` operation that the scaled codec requires (§9.1).
pub(crate) const SCALED_QUANTIZATION: &str = "scaled_uint16_quantization";

/// The microscope path that each axis's sampling must agree with.
const AXIS_PATHS: [&str; 4] = [
    PIXEL_SIZE_ROW,
    PIXEL_SIZE_COLUMN,
    RECIPROCAL_ROW,
    RECIPROCAL_COLUMN,
];

const RETIRED_NAMES: [&str; 4] = [
    "scan_controller/regular_scan/pixel_size_y",
    "scan_controller/regular_scan/pixel_size_x",
    "imaging_system/reciprocal_pixel_size_y",
    "imaging_system/reciprocal_pixel_size_x",
];

const OVERRIDE_PATHS: [&str; 8] = [
    ACCELERATING_VOLTAGE,
    SEMI_CONVERGENCE,
    DWELL_TIME,
    CAMERA_LENGTH,
    PIXEL_SIZE_ROW,
    PIXEL_SIZE_COLUMN,
    RECIPROCAL_ROW,
    RECIPROCAL_COLUMN,
];

/// Which kind of physical quantity a known path holds, with its canonical
/// units and the schema-1 source units it converts from.
#[derive(Clone, Copy)]
enum Dimension {
    ScanLength,
    DetectorSampling,
    Voltage,
    Energy,
    Angle,
    Time,
    CameraLength,
}

impl Dimension {
    fn of_path(path: &str) -> Option<Self> {
        Some(match path {
            PIXEL_SIZE_ROW | PIXEL_SIZE_COLUMN => Dimension::ScanLength,
            RECIPROCAL_ROW | RECIPROCAL_COLUMN => Dimension::DetectorSampling,
            ACCELERATING_VOLTAGE => Dimension::Voltage,
            BEAM_ENERGY => Dimension::Energy,
            SEMI_CONVERGENCE => Dimension::Angle,
            DWELL_TIME => Dimension::Time,
            CAMERA_LENGTH => Dimension::CameraLength,
            _ => return None,
        })
    }

    fn is_canonical(self, unit: &str) -> bool {
        match self {
            Dimension::ScanLength => unit == "angstrom",
            Dimension::DetectorSampling => unit == "mrad" || unit == "1/angstrom",
            Dimension::Voltage => unit == "kV",
            Dimension::Energy => unit == "keV",
            Dimension::Angle => unit == "mrad",
            Dimension::Time => unit == "us",
            Dimension::CameraLength => unit == "mm",
        }
    }

    /// Schema-1 conversion to `(canonical unit, factor)`.
    fn convert(self, unit: &str) -> Option<(&'static str, f64)> {
        Some(match (self, unit) {
            (Dimension::ScanLength, "angstrom" | "Å") => ("angstrom", 1.0),
            (Dimension::ScanLength, "m") => ("angstrom", 1e10),
            (Dimension::ScanLength, "nm") => ("angstrom", 10.0),
            (Dimension::DetectorSampling, "mrad") => ("mrad", 1.0),
            (Dimension::DetectorSampling, "rad") => ("mrad", 1000.0),
            (Dimension::DetectorSampling, "1/angstrom" | "1/Å") => ("1/angstrom", 1.0),
            (Dimension::DetectorSampling, "1/nm") => ("1/angstrom", 0.1),
            (Dimension::Voltage, "kV") => ("kV", 1.0),
            (Dimension::Voltage, "V") => ("kV", 0.001),
            (Dimension::Energy, "keV") => ("keV", 1.0),
            (Dimension::Energy, "eV") => ("keV", 0.001),
            (Dimension::Angle, "mrad") => ("mrad", 1.0),
            (Dimension::Angle, "rad") => ("mrad", 1000.0),
            (Dimension::Time, "us") => ("us", 1.0),
            (Dimension::Time, "s") => ("us", 1e6),
            (Dimension::Time, "ms") => ("us", 1000.0),
            (Dimension::CameraLength, "mm") => ("mm", 1.0),
            (Dimension::CameraLength, "m") => ("mm", 1000.0),
            (Dimension::CameraLength, "cm") => ("mm", 10.0),
            _ => return None,
        })
    }
}

/// Metadata schema generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Schema {
    V1,
    V2,
}

/// A calibrated quantity, in canonical units.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    pub value: f64,
    pub unit: String,
    pub provenance: String,
    pub evidence: Option<String>,
    /// The value and unit as stored, when schema-1 conversion changed them.
    pub stored: Option<(f64, String)>,
}

/// One axis of the 4-D array.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub name: &'static str,
    pub size: u64,
    pub sampling: Option<Quantity>,
}

/// One `processing` record.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessingRecord {
    pub operation: String,
    pub changes_measurements: bool,
    /// Every member of the record (operation-specific fields included).
    pub fields: Map<String, Value>,
}

/// An attached original document, hash verified.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceDocument {
    pub filename: String,
    pub media_type: String,
    pub content: String,
    pub sha256: String,
}

/// Validated `scientific_metadata`.
#[derive(Debug, Clone, PartialEq)]
pub struct ScientificMetadata {
    pub schema: Schema,
    pub axes: [Axis; 4],
    pub source_metadata: Map<String, Value>,
    pub source_metadata_coverage: String,
    pub processing: Vec<ProcessingRecord>,
    /// Recorded quantities by path, canonical units, file order.
    pub electron_microscope: Vec<(String, Quantity)>,
    /// User edits by path; they take precedence in calculations.
    pub calibration_overrides: Vec<(String, Quantity)>,
    pub source_documents: Vec<SourceDocument>,
    pub source_format: Option<String>,
    pub sample: Option<Map<String, Value>>,
    pub extensions: Option<Map<String, Value>>,
    /// The object as stored, unknown members included.
    pub raw: Map<String, Value>,
}

fn err(path: impl Into<String>, reason: impl Into<String>) -> QemError {
    QemError::metadata(path, reason)
}

impl ScientificMetadata {
    /// Every §5 rule of a file's `scientific_metadata` (steps 5–10 of the
    /// reference order, §10): [`Self::parse`], then the §5.6 cross-checks
    /// against the producer record `metadata` and the stored `dtype`.
    pub fn validate(
        value: &Value,
        shape: &[u64; 4],
        metadata: Option<&Map<String, Value>>,
        dtype: &str,
    ) -> Result<Self, QemError> {
        let sm = Self::parse(value, shape)?;
        sm.check_declared_processing(metadata, dtype)?;
        Ok(sm)
    }

    /// §9.1: a scaled file declares its quantisation, which changes
    /// measurements. The reference checks this with the scaled layout
    /// (§10 step 16c), so the reader calls it there.
    pub fn check_scaled_quantization(&self) -> Result<(), QemError> {
        if self
            .processing
            .iter()
            .any(|r| r.operation == SCALED_QUANTIZATION && r.changes_measurements)
        {
            return Ok(());
        }
        Err(err(
            "processing",
            "scaled .qem metadata must declare scaled_uint16_quantization with changes_measurements: true; save the result again",
        ))
    }

    /// Validates `value` against §5 for an array of `shape`.
    pub fn parse(value: &Value, shape: &[u64; 4]) -> Result<Self, QemError> {
        let obj = value.as_object().ok_or_else(|| {
            err(
                "scientific_metadata",
                "missing or not an object; re-export the original acquisition",
            )
        })?;
        let schema = match obj.get("schema").and_then(Value::as_str) {
            Some(SCHEMA_2) => Schema::V2,
            Some(SCHEMA_1) => Schema::V1,
            Some(other) => {
                return Err(QemError::UnsupportedVersion {
                    what: "scientific metadata schema",
                    found: format!("'{other}'"),
                    expected: format!("'{SCHEMA_2}' (or '{SCHEMA_1}')"),
                })
            }
            None => return Err(err("schema", "missing or not a string")),
        };
        let axes = parse_axes(obj.get("axes"), shape, schema)?;

        let source_metadata = obj
            .get("source_metadata")
            .and_then(Value::as_object)
            .cloned()
            .ok_or_else(|| err("source_metadata", "must be an object, including when empty"))?;
        let source_metadata_coverage = match obj
            .get("source_metadata_coverage")
            .and_then(Value::as_str)
        {
            Some(c @ ("reader-retained" | "exhaustive" | "unknown")) => c.to_string(),
            _ => return Err(err(
                "source_metadata_coverage",
                "must be declared explicitly as \"reader-retained\", \"exhaustive\" or \"unknown\"",
            )),
        };
        let source_documents = parse_documents(obj.get("source_documents"))?;
        let processing = parse_processing(obj.get("processing"))?;
        let electron_microscope = parse_microscope(obj.get("electron_microscope"), schema)?;
        for (i, axis) in axes.iter().enumerate() {
            let path = AXIS_PATHS[i];
            let Some((_, q)) = electron_microscope.iter().find(|(p, _)| p == path) else {
                continue;
            };
            if schema != Schema::V2 {
                continue;
            }
            let agree = axis
                .sampling
                .as_ref()
                .is_some_and(|s| s.unit == q.unit && is_close(s.value, q.value));
            if !agree {
                return Err(err(
                    format!("electron_microscope.{path}"),
                    format!("conflicts with the sampling of axis {} (conflicting axis and microscope calibration)", axis.name),
                ));
            }
        }
        let calibration_overrides = parse_overrides(obj.get("calibration_overrides"))?;
        let source_format = match obj.get("source_format") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(err("source_format", "must be a string")),
        };
        let sample = match obj.get("sample") {
            None => None,
            Some(v) => Some(validate_sample(v)?),
        };
        let extensions = match obj.get("extensions") {
            None => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(_) => return Err(err("extensions", "must be an object")),
        };
        Ok(ScientificMetadata {
            schema,
            axes,
            source_metadata,
            source_metadata_coverage,
            processing,
            electron_microscope,
            calibration_overrides,
            source_documents,
            source_format,
            sample,
            extensions,
            raw: obj.clone(),
        })
    }

    /// A recorded quantity by path.
    pub fn recorded(&self, path: &str) -> Option<&Quantity> {
        self.electron_microscope
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, q)| q)
    }

    /// A user override by path.
    pub fn override_of(&self, path: &str) -> Option<&Quantity> {
        self.calibration_overrides
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, q)| q)
    }

    /// The value to use in calculations: the override if any, else the
    /// recorded value. `None` means unknown (never zero).
    pub fn effective(&self, path: &str) -> Option<&Quantity> {
        self.override_of(path).or_else(|| self.recorded(path))
    }

    /// Effective sampling of axis `i` (0..4): an override of the matching
    /// pixel-size path wins over the axis's recorded sampling.
    pub fn effective_axis_sampling(&self, i: usize) -> Option<&Quantity> {
        let path = AXIS_PATHS.get(i)?;
        self.override_of(path)
            .or_else(|| self.axes.get(i).and_then(|a| a.sampling.as_ref()))
    }

    /// Whether any `processing` record changes measurements.
    pub fn measurements_changed_by(&self) -> Vec<&str> {
        self.processing
            .iter()
            .filter(|r| r.changes_measurements)
            .map(|r| r.operation.as_str())
            .collect()
    }

    pub fn has_operation(&self, op: &str) -> bool {
        self.processing.iter().any(|r| r.operation == op)
    }

    /// §5.6 cross-checks between the producer record `metadata` and the
    /// declared processing; `dtype` is the header's stored dtype.
    pub fn check_declared_processing(
        &self,
        metadata: Option<&Map<String, Value>>,
        dtype: &str,
    ) -> Result<(), QemError> {
        let Some(md) = metadata else { return Ok(()) };
        let hot = md
            .get("hot_pixel_correction")
            .and_then(Value::as_object)
            .and_then(|o| o.get("applied"))
            .is_some_and(truthy);
        if hot
            && !self
                .processing
                .iter()
                .any(|r| r.operation == "flagged_pixel_replacement" && r.changes_measurements)
        {
            return Err(err(
                "processing",
                "metadata reports hot-pixel correction but processing does not declare flagged_pixel_replacement with changes_measurements: true; re-export the original acquisition",
            ));
        }
        if md.get("flagged_markers_stored_as_zero").is_some_and(truthy)
            && !self.has_operation("flagged_marker_zeroing")
        {
            return Err(err(
                "processing",
                "metadata reports flagged markers stored as zero but processing does not declare flagged_marker_zeroing; re-export the original acquisition",
            ));
        }
        if let Some(src) = md.get("source_dtype").and_then(Value::as_str) {
            if src != dtype {
                let op = if src == "float64" && dtype == "float32" {
                    "exact_float_narrowing"
                } else {
                    "exact_integer_narrowing"
                };
                let declared = self.processing.iter().any(|r| {
                    r.operation == op
                        && !r.changes_measurements
                        && r.fields.get("source_dtype").and_then(Value::as_str) == Some(src)
                        && r.fields.get("stored_dtype").and_then(Value::as_str) == Some(dtype)
                });
                if !declared {
                    return Err(err(
                        "processing",
                        format!("counts were stored as {dtype} from {src} but processing does not declare matching {op}; re-export the original acquisition"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Python truthiness of a JSON value, as the reference tests these flags.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn is_close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-14 * a.abs().max(b.abs())
}

/// A positive finite JSON number; booleans are not numbers.
fn positive_number(v: Option<&Value>) -> Option<f64> {
    match v {
        Some(Value::Number(n)) => n.as_f64().filter(|f| f.is_finite() && *f > 0.0),
        _ => None,
    }
}

/// Parses a quantity at `path` (§5.2); `dimension` given for known paths.
fn parse_quantity(
    v: &Value,
    path: &str,
    dimension: Option<Dimension>,
    schema: Schema,
) -> Result<Quantity, QemError> {
    let o = v
        .as_object()
        .ok_or_else(|| err(path, "invalid quantity: not an object"))?;
    let value = positive_number(o.get("value"))
        .ok_or_else(|| err(path, "invalid quantity: value must be a finite number > 0"))?;
    let unit = match o.get("unit") {
        Some(Value::String(u)) if !u.is_empty() => u.clone(),
        _ => {
            return Err(err(
                path,
                "invalid quantity: unit must be a non-empty string",
            ))
        }
    };
    let provenance = match o.get("provenance") {
        Some(Value::String(p)) if p.chars().any(|c| !c.is_whitespace()) => p.clone(),
        _ => {
            return Err(err(
                path,
                "calibrated quantities require nonempty provenance",
            ))
        }
    };
    let evidence = match o.get("evidence") {
        None => None,
        Some(Value::String(e)) => Some(e.clone()),
        Some(_) => return Err(err(path, "invalid quantity: evidence must be a string")),
    };
    let mut q = Quantity {
        value,
        unit,
        provenance,
        evidence,
        stored: None,
    };
    if let Some(dim) = dimension {
        match schema {
            Schema::V2 => {
                if !dim.is_canonical(&q.unit) {
                    return Err(err(
                        path,
                        format!(
                            "schema-2 quantities require canonical microscopy units (found '{}')",
                            q.unit
                        ),
                    ));
                }
            }
            Schema::V1 => {
                let (unit, factor) = dim.convert(&q.unit).ok_or_else(|| {
                    err(path, format!("invalid quantity: unknown unit '{}'", q.unit))
                })?;
                if unit != q.unit {
                    q.stored = Some((q.value, std::mem::replace(&mut q.unit, unit.to_string())));
                    q.value *= factor;
                }
            }
        }
    }
    Ok(q)
}

fn parse_axes(v: Option<&Value>, shape: &[u64; 4], schema: Schema) -> Result<[Axis; 4], QemError> {
    let list = v
        .and_then(Value::as_array)
        .filter(|a| a.iter().all(Value::is_object))
        .ok_or_else(|| {
            err(
                "axes",
                "must be a list of axis objects; re-export the original acquisition",
            )
        })?;
    if list.len() != 4 {
        return Err(err(
            "axes",
            format!("{} axes, exactly 4 required", list.len()),
        ));
    }
    let mut axes: Vec<Axis> = Vec::with_capacity(4);
    for (i, a) in list.iter().enumerate() {
        let name = AXIS_NAMES[i];
        let o = a.as_object().ok_or_else(|| err("axes", "not an object"))?;
        if o.get("name").and_then(Value::as_str) != Some(name) {
            return Err(err(format!("axes[{i}].name"), format!("must be '{name}'")));
        }
        let size = match o.get("size") {
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        if size != Some(shape[i]) {
            return Err(err(
                format!("axes[{i}].size"),
                format!("inconsistent with shape[{i}] = {}", shape[i]),
            ));
        }
        let dim = if i < 2 {
            Dimension::ScanLength
        } else {
            Dimension::DetectorSampling
        };
        let sampling = match o.get("sampling") {
            None => None,
            Some(q) => Some(parse_quantity(
                q,
                &format!("axes[{i}].sampling"),
                Some(dim),
                schema,
            )?),
        };
        axes.push(Axis {
            name,
            size: shape[i],
            sampling,
        });
    }
    axes.try_into()
        .map_err(|_| err("axes", "exactly 4 axes required"))
}

fn parse_processing(v: Option<&Value>) -> Result<Vec<ProcessingRecord>, QemError> {
    const WHY: &str = "must list every operation with its name and whether it changes measurements";
    let list = v
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| err("processing", WHY))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, r) in list.iter().enumerate() {
        let o = r
            .as_object()
            .ok_or_else(|| err(format!("processing[{i}]"), WHY))?;
        let operation = match o.get("operation") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(err(format!("processing[{i}].operation"), WHY)),
        };
        let changes_measurements = match o.get("changes_measurements") {
            Some(Value::Bool(b)) => *b,
            _ => return Err(err(format!("processing[{i}].changes_measurements"), WHY)),
        };
        out.push(ProcessingRecord {
            operation,
            changes_measurements,
            fields: o.clone(),
        });
    }
    Ok(out)
}

fn retired_name_error(section: &str, path: &str) -> QemError {
    err(
        format!("{section}.{path}"),
        "uses the x/y names of specification 0.0.1; quantities are named by row and column. Re-export the original acquisition",
    )
}

fn parse_microscope(
    v: Option<&Value>,
    schema: Schema,
) -> Result<Vec<(String, Quantity)>, QemError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let o = v
        .as_object()
        .ok_or_else(|| err("electron_microscope", "must be an object"))?;
    let mut out = Vec::with_capacity(o.len());
    for (path, q) in o {
        if RETIRED_NAMES.contains(&path.as_str()) {
            return Err(retired_name_error("electron_microscope", path));
        }
        let q = parse_quantity(
            q,
            &format!("electron_microscope.{path}"),
            Dimension::of_path(path),
            schema,
        )?;
        out.push((path.clone(), q));
    }
    Ok(out)
}

fn parse_overrides(v: Option<&Value>) -> Result<Vec<(String, Quantity)>, QemError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let o = v
        .as_object()
        .ok_or_else(|| err("calibration_overrides", "must be an object"))?;
    let mut out: Vec<(String, Quantity)> = Vec::with_capacity(o.len());
    for (path, q) in o {
        if RETIRED_NAMES.contains(&path.as_str()) {
            return Err(retired_name_error("calibration_overrides", path));
        }
        let at = format!("calibration_overrides.{path}");
        let bad = || {
            err(
                &at,
                "invalid calibration override; check value, units and evidence",
            )
        };
        if !OVERRIDE_PATHS.contains(&path.as_str()) {
            return Err(bad());
        }
        let dim = Dimension::of_path(path).ok_or_else(bad)?;
        let q = parse_quantity(q, &at, Some(dim), Schema::V2).map_err(|_| bad())?;
        if q.provenance != "user_override" || q.evidence.as_deref().is_none_or(str::is_empty) {
            return Err(bad());
        }
        if matches!(dim, Dimension::ScanLength) && !(1e-4..=1e4).contains(&q.value) {
            return Err(bad());
        }
        out.push((path.clone(), q));
    }
    for (a, b) in [
        (PIXEL_SIZE_ROW, PIXEL_SIZE_COLUMN),
        (RECIPROCAL_ROW, RECIPROCAL_COLUMN),
    ] {
        let qa = out.iter().find(|(p, _)| p == a);
        let qb = out.iter().find(|(p, _)| p == b);
        match (qa, qb) {
            (None, None) => {}
            (Some((_, x)), Some((_, y))) if x.unit == y.unit => {}
            _ => {
                return Err(err(
                    format!("calibration_overrides.{a}"),
                    "invalid calibration override; row and column must both be present with the same unit",
                ))
            }
        }
    }
    Ok(out)
}

const MAX_DOCUMENTS: usize = 16;
const MAX_DOCUMENT_BYTES: usize = 4 * 1024 * 1024;

fn parse_documents(v: Option<&Value>) -> Result<Vec<SourceDocument>, QemError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let list = v
        .as_array()
        .ok_or_else(|| err("source_documents", "must be a list"))?;
    if list.len() > MAX_DOCUMENTS {
        return Err(err(
            "source_documents",
            format!("{} documents, at most {MAX_DOCUMENTS}", list.len()),
        ));
    }
    let mut total = 0usize;
    let mut out = Vec::with_capacity(list.len());
    for (i, d) in list.iter().enumerate() {
        let at = format!("source_documents[{i}]");
        let o = d.as_object().ok_or_else(|| err(&at, "not an object"))?;
        let text = |k: &str| o.get(k).and_then(Value::as_str);
        let filename = text("filename")
            .filter(|f| !f.is_empty() && !f.contains(['/', '\\']))
            .ok_or_else(|| err(&at, "filename must be non-empty without '/' or '\\'"))?;
        let media_type = text("mediaType").ok_or_else(|| err(&at, "mediaType missing"))?;
        let content = text("content").ok_or_else(|| err(&at, "content must be a string"))?;
        let sha = text("sha256").ok_or_else(|| err(&at, "sha256 missing"))?;
        total += content.len();
        if total > MAX_DOCUMENT_BYTES {
            return Err(err("source_documents", "total content exceeds 4 MiB"));
        }
        if hex(&Sha256::digest(content.as_bytes())) != sha {
            return Err(err(&at, "sha256 does not match the content"));
        }
        match media_type {
            "application/xml" => {
                let lower = content.to_ascii_lowercase();
                if lower.contains("<!doctype") || lower.contains("<!entity") {
                    return Err(err(
                        &at,
                        "XML with a DOCTYPE or ENTITY declaration is refused",
                    ));
                }
                super::xml::check_well_formed(content)
                    .map_err(|why| err(&at, format!("XML does not parse: {why}")))?;
            }
            "application/json" => {
                let parsed: Value = serde_json::from_str(content)
                    .map_err(|e| err(&at, format!("JSON does not parse: {e}")))?;
                if !parsed.is_object() {
                    return Err(err(&at, "JSON document must be an object"));
                }
            }
            other => return Err(err(&at, format!("unsupported mediaType '{other}'"))),
        }
        out.push(SourceDocument {
            filename: filename.to_string(),
            media_type: media_type.to_string(),
            content: content.to_string(),
            sha256: sha.to_string(),
        });
    }
    Ok(out)
}

fn nonempty_text(o: &Map<String, Value>, key: &str, at: &str) -> Result<(), QemError> {
    match o.get(key) {
        None => Ok(()),
        Some(Value::String(_)) => Ok(()),
        Some(_) => Err(err(format!("{at}.{key}"), "must be text")),
    }
}

/// Miller-type index list: 3 or 4 integers, not all zero.
fn check_index_list(v: &Value, at: &str) -> Result<(), QemError> {
    let ok = v.as_array().is_some_and(|a| {
        (a.len() == 3 || a.len() == 4)
            && a.iter().all(|x| x.is_i64() || x.is_u64())
            && a.iter().any(|x| x.as_i64() != Some(0))
    });
    if ok {
        Ok(())
    } else {
        Err(err(at, "must be 3 or 4 integer indices, not all zero"))
    }
}

fn validate_sample(v: &Value) -> Result<Map<String, Value>, QemError> {
    let o = v
        .as_object()
        .ok_or_else(|| err("sample", "must be an object"))?;
    match o.get("provenance") {
        Some(Value::String(p)) if p.chars().any(|c| !c.is_whitespace()) => {}
        _ => {
            return Err(err(
                "sample.provenance",
                "a declared sample requires nonempty provenance",
            ))
        }
    }
    for k in [
        "id",
        "name",
        "description",
        "orientation_relationship",
        "evidence",
    ] {
        nonempty_text(o, k, "sample")?;
    }
    if let Some(g) = o.get("geometry") {
        if !matches!(g.as_str(), Some("cross-section" | "plan-view")) {
            return Err(err(
                "sample.geometry",
                "must be \"cross-section\" or \"plan-view\"",
            ));
        }
    }
    if let Some(g) = o.get("growth_direction") {
        check_index_list(g, "sample.growth_direction")?;
    }
    let mut labels: Vec<&str> = Vec::new();
    if let Some(c) = o.get("components") {
        let comps = c
            .as_object()
            .ok_or_else(|| err("sample.components", "must be an object"))?;
        for (label, comp) in comps {
            let at = format!("sample.components.{label}");
            if label.trim().is_empty() {
                return Err(err(
                    "sample.components",
                    "component labels must be non-empty",
                ));
            }
            labels.push(label);
            let co = comp
                .as_object()
                .ok_or_else(|| err(&at, "must be an object"))?;
            nonempty_text(co, "chemical_formula", &at)?;
            if let Some(r) = co.get("role") {
                if !matches!(
                    r.as_str(),
                    Some("film" | "substrate" | "support" | "particle")
                ) {
                    return Err(err(
                        format!("{at}.role"),
                        "must be film, substrate, support or particle",
                    ));
                }
            }
            if let Some(z) = co.get("zone_axis") {
                check_index_list(z, &format!("{at}.zone_axis"))?;
            }
            if let Some(cif) = co.get("cif") {
                let ok = cif.as_object().is_some_and(|c| {
                    c.get("document").is_some_and(Value::is_string)
                        && c.get("sha256").is_some_and(Value::is_string)
                });
                if !ok {
                    return Err(err(format!("{at}.cif"), "must be {document, sha256}"));
                }
            }
            if let Some(t) = co.get("thickness_estimates") {
                let list = t
                    .as_array()
                    .ok_or_else(|| err(format!("{at}.thickness_estimates"), "must be a list"))?;
                let mut preferred = 0;
                for (i, e) in list.iter().enumerate() {
                    if check_thickness(e, &format!("{at}.thickness_estimates[{i}]"))? {
                        preferred += 1;
                    }
                }
                if preferred > 1 {
                    return Err(err(
                        format!("{at}.thickness_estimates"),
                        "at most one preferred estimate",
                    ));
                }
            }
        }
    }
    if let Some(civ) = o.get("components_in_view") {
        let ok = civ.as_array().is_some_and(|a| {
            a.iter()
                .all(|l| l.as_str().is_some_and(|l| labels.contains(&l)))
        });
        if !ok {
            return Err(err(
                "sample.components_in_view",
                "must list component labels",
            ));
        }
    }
    Ok(o.clone())
}

/// Checks one thickness estimate; returns whether it is `preferred`.
fn check_thickness(v: &Value, at: &str) -> Result<bool, QemError> {
    let o = v.as_object().ok_or_else(|| err(at, "must be an object"))?;
    let method_ok = matches!(
        o.get("method").and_then(Value::as_str),
        Some(
            "diffraction_ridge"
                | "pacbed_fit"
                | "ssb_depth"
                | "ptychography_multislice"
                | "cross_section"
                | "nominal"
        )
    );
    if !method_ok {
        return Err(err(format!("{at}.method"), "unknown thickness method"));
    }
    if o.get("unit").and_then(Value::as_str) != Some("angstrom") {
        return Err(err(format!("{at}.unit"), "must be angstrom"));
    }
    if positive_number(o.get("value")).is_none() {
        return Err(err(format!("{at}.value"), "must be a positive number"));
    }
    if o.contains_key("uncertainty") && positive_number(o.get("uncertainty")).is_none() {
        return Err(err(
            format!("{at}.uncertainty"),
            "must be a positive number",
        ));
    }
    if let Some(r) = o.get("range") {
        let ok = r.as_array().is_some_and(|a| {
            a.len() == 2
                && match (positive_number(a.first()), positive_number(a.get(1))) {
                    (Some(lo), Some(hi)) => lo <= hi,
                    _ => false,
                }
        });
        if !ok {
            return Err(err(
                format!("{at}.range"),
                "must be [low, high], positive, low <= high",
            ));
        }
    }
    if let Some(r) = o.get("region") {
        let pair = |v: Option<&Value>| -> Option<(u64, u64)> {
            let a = v?.as_array()?;
            if a.len() != 2 {
                return None;
            }
            Some((a[0].as_u64()?, a[1].as_u64()?))
        };
        let ok = match r {
            Value::String(_) => true,
            Value::Object(ro) if ro.contains_key("point") => pair(ro.get("point")).is_some(),
            Value::Object(ro) => {
                matches!(pair(ro.get("rows")), Some((a, b)) if a < b)
                    && matches!(pair(ro.get("cols")), Some((c, d)) if c < d)
            }
            _ => false,
        };
        if !ok {
            return Err(err(
                format!("{at}.region"),
                "must be a label, {rows, cols} or {point}",
            ));
        }
    }
    for k in ["reference", "date"] {
        nonempty_text(o, k, at)?;
    }
    match o.get("preferred") {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(err(format!("{at}.preferred"), "must be a boolean")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SHAPE: [u64; 4] = [1, 2, 2, 3];

    fn base() -> Value {
        json!({
            "axes": [
                {"name": "scan_row", "size": 1},
                {"name": "scan_column", "size": 2},
                {"name": "detector_row", "size": 2},
                {"name": "detector_column", "size": 3}
            ],
            "processing": [{"changes_measurements": false, "operation": "lossless_storage"}],
            "schema": SCHEMA_2,
            "source_metadata": {},
            "source_metadata_coverage": "unknown"
        })
    }

    fn with(key: &str, v: Value) -> Value {
        let mut b = base();
        b[key] = v;
        b
    }

    fn q(value: f64, unit: &str) -> Value {
        json!({"value": value, "unit": unit, "provenance": "user_override", "evidence": "measured"})
    }

    #[test]
    fn smallest_object_is_accepted() {
        let md = ScientificMetadata::parse(&base(), &SHAPE).unwrap();
        assert_eq!(md.schema, Schema::V2);
        assert!(ScientificMetadata::parse(&base(), &[1, 2, 2, 4]).is_err());
    }

    #[test]
    fn overrides_take_precedence_and_follow_the_rules() {
        let ov = json!({PIXEL_SIZE_ROW: q(0.5, "angstrom"), PIXEL_SIZE_COLUMN: q(0.5, "angstrom"),
                        ACCELERATING_VOLTAGE: q(200.0, "kV")});
        let mut v = with("calibration_overrides", ov);
        v["electron_microscope"] =
            json!({ACCELERATING_VOLTAGE: {"value": 300.0, "unit": "kV", "provenance": "file"}});
        let md = ScientificMetadata::parse(&v, &SHAPE).unwrap();
        assert_eq!(md.effective(ACCELERATING_VOLTAGE).unwrap().value, 200.0);
        assert_eq!(md.recorded(ACCELERATING_VOLTAGE).unwrap().value, 300.0);
        assert_eq!(md.effective_axis_sampling(0).unwrap().value, 0.5);
        assert!(md.effective_axis_sampling(2).is_none());

        let bad = [
            json!({PIXEL_SIZE_ROW: q(0.5, "angstrom")}),
            json!({PIXEL_SIZE_ROW: q(0.5, "angstrom"), PIXEL_SIZE_COLUMN: q(0.5, "nm")}),
            json!({PIXEL_SIZE_ROW: q(1e5, "angstrom"), PIXEL_SIZE_COLUMN: q(1e5, "angstrom")}),
            json!({ACCELERATING_VOLTAGE: {"value": 1.0, "unit": "kV", "provenance": "file", "evidence": "x"}}),
            json!({ACCELERATING_VOLTAGE: {"value": 1.0, "unit": "kV", "provenance": "user_override"}}),
            json!({BEAM_ENERGY: q(1.0, "keV")}),
            json!({"scan_controller/regular_scan/pixel_size_y": q(1.0, "angstrom")}),
        ];
        for b in bad {
            let e = ScientificMetadata::parse(&with("calibration_overrides", b.clone()), &SHAPE);
            assert!(matches!(e, Err(QemError::Metadata { .. })), "{b}");
        }
    }

    #[test]
    fn quantities_and_units() {
        let em = |u: &str, v: Value| with("electron_microscope", json!({u: v}));
        let ok = em(
            CAMERA_LENGTH,
            json!({"value": 100.0, "unit": "mm", "provenance": "file"}),
        );
        assert!(ScientificMetadata::parse(&ok, &SHAPE).is_ok());
        let other = em(
            "detector/gain",
            json!({"value": 2.0, "unit": "e/count", "provenance": "file"}),
        );
        assert!(ScientificMetadata::parse(&other, &SHAPE).is_ok());
        for bad in [
            em(
                CAMERA_LENGTH,
                json!({"value": 0.1, "unit": "m", "provenance": "file"}),
            ),
            em(
                CAMERA_LENGTH,
                json!({"value": -1.0, "unit": "mm", "provenance": "file"}),
            ),
            em(
                CAMERA_LENGTH,
                json!({"value": true, "unit": "mm", "provenance": "file"}),
            ),
            em(
                CAMERA_LENGTH,
                json!({"value": 1.0, "unit": "mm", "provenance": "  "}),
            ),
            em(
                "detector/gain",
                json!({"value": 1.0, "unit": "", "provenance": "file"}),
            ),
        ] {
            assert!(ScientificMetadata::parse(&bad, &SHAPE).is_err(), "{bad}");
        }
        // Schema 1 converts known units and refuses unknown ones.
        let mut v1 = em(
            CAMERA_LENGTH,
            json!({"value": 0.1, "unit": "m", "provenance": "file"}),
        );
        v1["schema"] = json!(SCHEMA_1);
        let md = ScientificMetadata::parse(&v1, &SHAPE).unwrap();
        assert_eq!(md.recorded(CAMERA_LENGTH).unwrap().value, 100.0);
        v1["electron_microscope"][CAMERA_LENGTH]["unit"] = json!("inch");
        assert!(ScientificMetadata::parse(&v1, &SHAPE).is_err());
        let mut v3 = base();
        v3["schema"] = json!("quantem.scientific-metadata/3");
        assert!(matches!(
            ScientificMetadata::parse(&v3, &SHAPE),
            Err(QemError::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn source_documents() {
        let doc = |media: &str, content: &str, sha: Option<&str>| {
            let sha = sha.map_or_else(|| hex(&Sha256::digest(content.as_bytes())), str::to_string);
            with(
                "source_documents",
                json!([{"filename": "a.xml", "mediaType": media, "content": content, "sha256": sha}]),
            )
        };
        assert!(
            ScientificMetadata::parse(&doc("application/xml", "<a><b/></a>", None), &SHAPE).is_ok()
        );
        assert!(
            ScientificMetadata::parse(&doc("application/json", "{\"a\": 1}", None), &SHAPE).is_ok()
        );
        for bad in [
            doc("application/xml", "<a><b></a>", None),
            doc("application/xml", "<!DOCTYPE a><a/>", None),
            doc("application/json", "[1]", None),
            doc("application/json", "{\"a\": NaN}", None),
            doc("text/plain", "x", None),
            doc("application/json", "{}", Some(&"0".repeat(64))),
        ] {
            assert!(ScientificMetadata::parse(&bad, &SHAPE).is_err());
        }
    }

    #[test]
    fn declared_processing() {
        let md = ScientificMetadata::parse(&base(), &SHAPE).unwrap();
        let meta = |v: Value| v.as_object().cloned();
        assert!(md
            .check_declared_processing(
                meta(json!({"hot_pixel_correction": {"applied": true}})).as_ref(),
                "uint16"
            )
            .is_err());
        assert!(md
            .check_declared_processing(
                meta(json!({"hot_pixel_correction": {"applied": false}})).as_ref(),
                "uint16"
            )
            .is_ok());
        assert!(md
            .check_declared_processing(
                meta(json!({"flagged_markers_stored_as_zero": 1})).as_ref(),
                "uint16"
            )
            .is_err());
        assert!(md
            .check_declared_processing(meta(json!({"source_dtype": "uint16"})).as_ref(), "uint16")
            .is_ok());
        let mut v = base();
        v["processing"] = json!([{"operation": "exact_integer_narrowing", "changes_measurements": false,
                                   "source_dtype": "uint32", "stored_dtype": "uint16"}]);
        let md = ScientificMetadata::parse(&v, &SHAPE).unwrap();
        assert!(md
            .check_declared_processing(meta(json!({"source_dtype": "uint32"})).as_ref(), "uint16")
            .is_ok());
        assert!(md
            .check_declared_processing(meta(json!({"source_dtype": "int32"})).as_ref(), "uint16")
            .is_err());
    }

    #[test]
    fn sample_declarations() {
        let ok = json!({"provenance": "operator", "geometry": "plan-view", "growth_direction": [0, 0, 1],
            "components": {"film": {"role": "film", "zone_axis": [1, 1, 0],
                "thickness_estimates": [{"method": "nominal", "unit": "angstrom", "value": 50.0,
                    "range": [40.0, 60.0], "region": {"rows": [0, 1], "cols": [0, 2]}, "preferred": true}]}},
            "components_in_view": ["film"]});
        assert!(ScientificMetadata::parse(&with("sample", ok.clone()), &SHAPE).is_ok());
        let mut edits: Vec<Value> = Vec::new();
        for (path, v) in [
            ("/provenance", json!("")),
            ("/geometry", json!("side")),
            ("/growth_direction", json!([0, 0, 0])),
            ("/components/film/role", json!("lid")),
            ("/components/film/thickness_estimates/0/unit", json!("nm")),
            (
                "/components/film/thickness_estimates/0/range",
                json!([60.0, 40.0]),
            ),
            (
                "/components/film/thickness_estimates/0/region",
                json!({"rows": [1, 1], "cols": [0, 2]}),
            ),
            ("/components_in_view", json!(["substrate"])),
        ] {
            let mut s = ok.clone();
            *s.pointer_mut(path).unwrap() = v;
            edits.push(s);
        }
        for s in edits {
            assert!(
                ScientificMetadata::parse(&with("sample", s.clone()), &SHAPE).is_err(),
                "{s}"
            );
        }
    }
}
