//! What the user adds to a conversion's `scientific_metadata`: a JSON file
//! merged in (`--metadata`), whose keys outside the schema are named in a
//! warning (or refused with `--strict-metadata`), and flags for the common
//! calibrated quantities, in canonical units.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{ConvertError, Monitor, Source};
use crate::qem::write::DetectorUnit;

/// Top-level members of `scientific_metadata` in schema 2 (spec §5.1).
pub(crate) const KNOWN_KEYS: &[&str] = &[
    "schema",
    "axes",
    "source_metadata",
    "source_metadata_coverage",
    "processing",
    "electron_microscope",
    "calibration_overrides",
    "source_documents",
    "source_format",
];

/// `provenance` of quantities given on the command line.
pub(crate) const FLAG_PROVENANCE: &str = "user";

#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct MetadataOptions {
    /// A JSON object merged into the scientific metadata.
    pub file: Option<PathBuf>,
    /// Refuse keys of that object outside the schema instead of warning.
    pub strict: bool,
    pub voltage_kv: Option<f64>,
    /// Scan step (row, column) in ångström.
    pub scan_step_angstrom: Option<[f64; 2]>,
    /// Detector pixel size (row, column).
    pub detector_sampling: Option<([f64; 2], DetectorUnit)>,
}

/// Splits `"0.5,0.6 nm"` / `"0.5nm"` into its numbers (one is used for both
/// axes) and its unit.
fn split_quantity(text: &str) -> Result<([f64; 2], String), String> {
    let text = text.trim();
    let cut = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | ',' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(text.len());
    let (numbers, unit) = text.split_at(cut);
    let values: Vec<f64> = numbers
        .split(',')
        .map(|v| v.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            format!("{text:?}: expected NUMBER[,NUMBER]UNIT, e.g. 0.5nm or 1.2,1.3mrad")
        })?;
    let pair = match values[..] {
        [v] => [v, v],
        [r, c] => [r, c],
        _ => return Err(format!("{text:?}: one value, or two for row and column")),
    };
    if pair.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return Err(format!("{text:?}: values must be finite and positive"));
    }
    Ok((pair, unit.trim().to_string()))
}

/// `--scan-step`: a length per scan pixel, returned in ångström.
pub fn parse_scan_step(text: &str) -> Result<[f64; 2], String> {
    let (v, unit) = split_quantity(text)?;
    let factor = match unit.as_str() {
        "A" | "Å" | "angstrom" => 1.0,
        "nm" => 10.0,
        "pm" => 0.01,
        "um" | "µm" => 1e4,
        other => {
            return Err(format!(
                "{text:?}: unit {other:?} is not one of A, nm, pm, um"
            ))
        }
    };
    Ok([v[0] * factor, v[1] * factor])
}

/// `--detector-sampling`: an angle or reciprocal length per detector pixel,
/// in mrad or cycles per ångström (no 2π).
pub fn parse_detector_sampling(text: &str) -> Result<([f64; 2], DetectorUnit), String> {
    let (v, unit) = split_quantity(text)?;
    Ok(match unit.as_str() {
        "mrad" => (v, DetectorUnit::Mrad),
        "urad" | "µrad" => ([v[0] * 1e-3, v[1] * 1e-3], DetectorUnit::Mrad),
        "1/A" | "1/Å" | "1/angstrom" => (v, DetectorUnit::InverseAngstrom),
        "1/nm" => ([v[0] / 10.0, v[1] / 10.0], DetectorUnit::InverseAngstrom),
        other => {
            return Err(format!(
                "{text:?}: unit {other:?} is not one of mrad, urad, 1/A, 1/nm"
            ))
        }
    })
}

/// Deep-merges `patch` into `base` (objects merge, anything else replaces).
pub(crate) fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn read_user(path: &Path) -> Result<Value, ConvertError> {
    let text = crate::regular_file::read(path).map_err(|e| ConvertError::io(path, e))?;
    let value: Value = serde_json::from_slice(&text)
        .map_err(|e| ConvertError::input(path, format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ConvertError::input(
            path,
            "the metadata must be a JSON object",
        ));
    }
    Ok(value)
}

fn quantity(value: f64, unit: &str) -> Value {
    json!({"provenance": FLAG_PROVENANCE, "unit": unit, "value": value})
}

fn unit_name(u: DetectorUnit) -> &'static str {
    match u {
        DetectorUnit::Mrad => "mrad",
        DetectorUnit::InverseAngstrom => "1/angstrom",
    }
}

/// Applies the user's metadata file and flags to `source`'s description.
pub(crate) fn apply(
    input: &Path,
    source: &mut dyn Source,
    options: &MetadataOptions,
    monitor: &mut dyn Monitor,
) -> Result<(), ConvertError> {
    let sm = &mut source.description_mut().scientific_metadata;
    if let Some(path) = &options.file {
        let user = read_user(path)?;
        let unknown: Vec<&String> = user
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys())
            .filter(|k| !KNOWN_KEYS.contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            let names: Vec<String> = unknown.iter().map(|k| format!("{k:?}")).collect();
            let names = names.join(", ");
            if options.strict {
                return Err(ConvertError::input(
                    path,
                    format!("unknown scientific_metadata key(s) {names} (known: {}); refused by --strict-metadata", KNOWN_KEYS.join(", ")),
                ));
            }
            monitor.warn(&format!(
                "{}: unknown scientific_metadata key(s) {names} kept but not used by any reader (known: {})",
                path.display(),
                KNOWN_KEYS.join(", ")
            ));
        }
        merge(sm, &user);
    }
    let set_axis = |sm: &mut Value, axis: usize, q: Value| {
        if let Some(a) = sm.get_mut("axes").and_then(|a| a.get_mut(axis)) {
            a["sampling"] = q;
        }
    };
    let microscope = |sm: &mut Value, path: &str, q: Value| {
        if !sm.get("electron_microscope").is_some_and(Value::is_object) {
            sm["electron_microscope"] = json!({});
        }
        sm["electron_microscope"][path] = q;
    };
    if let Some(kv) = options.voltage_kv {
        if !(kv.is_finite() && kv > 0.0) {
            return Err(ConvertError::input(
                input,
                format!("--voltage-kv {kv} must be finite and positive"),
            ));
        }
        microscope(
            sm,
            "electron_source/accelerating_voltage",
            quantity(kv, "kV"),
        );
    }
    if let Some([r, c]) = options.scan_step_angstrom {
        set_axis(sm, 0, quantity(r, "angstrom"));
        set_axis(sm, 1, quantity(c, "angstrom"));
        microscope(
            sm,
            "scan_controller/regular_scan/pixel_size_row",
            quantity(r, "angstrom"),
        );
        microscope(
            sm,
            "scan_controller/regular_scan/pixel_size_column",
            quantity(c, "angstrom"),
        );
    }
    if let Some(([r, c], unit)) = options.detector_sampling {
        let u = unit_name(unit);
        set_axis(sm, 2, quantity(r, u));
        set_axis(sm, 3, quantity(c, u));
        // A reciprocal pixel size recorded by the source must agree with the axes.
        for (path, v) in [
            ("imaging_system/reciprocal_pixel_size_row", r),
            ("imaging_system/reciprocal_pixel_size_column", c),
        ] {
            if sm
                .get("electron_microscope")
                .and_then(|m| m.get(path))
                .is_some()
            {
                microscope(sm, path, quantity(v, u));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_with_units() {
        assert_eq!(parse_scan_step("0.5nm").unwrap(), [5.0, 5.0]);
        assert_eq!(parse_scan_step("1.5,2 A").unwrap(), [1.5, 2.0]);
        assert!(parse_scan_step("3 furlongs").is_err());
        assert!(parse_scan_step("-1nm").is_err());
        assert_eq!(
            parse_detector_sampling("0.02,0.03 1/nm").unwrap(),
            ([0.002, 0.003], DetectorUnit::InverseAngstrom)
        );
        assert_eq!(
            parse_detector_sampling("1.2mrad").unwrap(),
            ([1.2, 1.2], DetectorUnit::Mrad)
        );
    }
}
