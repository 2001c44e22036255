//! The scaled codec's regional calibration (§9): codes become
//! `float32(code * scale + offset)`, product and sum in binary64 (Rust never
//! contracts them into a fused multiply-add), rounded once to binary32.

use serde_json::{Map, Value};

use super::error::QemError;
use super::header::json_uint;

/// One calibration region: frames `[first_frame, stop_frame)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    pub first_frame: usize,
    pub stop_frame: usize,
    pub scale: f64,
    pub offset: f64,
    pub intensity_min: f64,
    pub intensity_max: f64,
}

impl Region {
    /// The calibrated value of one code.
    #[inline]
    pub fn value(&self, code: u16) -> f32 {
        (f64::from(code) * self.scale + self.offset) as f32
    }

    /// A masked sum over `n` pixels whose codes add up to `code_sum`,
    /// calibrated once (in binary64) as the format defines.
    pub fn sum_value(&self, code_sum: u64, n: u64) -> f64 {
        self.scale * code_sum as f64 + self.offset * n as f64
    }
}

/// `intensity_calibration` of a scaled file.
#[derive(Debug, Clone, PartialEq)]
pub struct IntensityCalibration {
    pub regions: Vec<Region>,
    /// The object as stored, error report fields included.
    pub raw: Map<String, Value>,
}

fn finite(v: Option<&Value>) -> Option<f64> {
    match v {
        Some(Value::Number(n)) => n.as_f64().filter(|f| f.is_finite()),
        _ => None,
    }
}

impl IntensityCalibration {
    pub fn parse(v: Option<&Value>, shape: &[u64; 4]) -> Result<Self, QemError> {
        let bad = |why: String| {
            QemError::calibration(format!("invalid regional intensity calibration: {why}"))
        };
        let o = v
            .and_then(Value::as_object)
            .ok_or_else(|| bad("intensity_calibration missing or not an object".into()))?;
        if o.get("storage").and_then(Value::as_str) != Some("scaled_uint16") {
            return Err(bad("storage is not \"scaled_uint16\"".into()));
        }
        if json_uint(o.get("version")) != Some(2) {
            return Err(bad("version is not 2".into()));
        }
        if o.get("complete") != Some(&Value::Bool(true)) {
            return Err(bad("complete is not true".into()));
        }
        let source_shape = o
            .get("source_shape")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|x| json_uint(Some(x))).collect::<Vec<_>>());
        if source_shape != Some(shape.iter().map(|&s| Some(s)).collect()) {
            return Err(bad("source_shape differs from shape".into()));
        }
        let list = o
            .get("regions")
            .and_then(Value::as_array)
            .filter(|l| !l.is_empty())
            .ok_or_else(|| bad("regions must be a non-empty list".into()))?;
        let frames = shape[0] * shape[1];
        let mut regions = Vec::with_capacity(list.len());
        let mut cursor = 0u64;
        for (j, r) in list.iter().enumerate() {
            let r = r
                .as_object()
                .ok_or_else(|| bad(format!("region {j} is not an object")))?;
            let first = json_uint(r.get("first_frame"));
            let stop = json_uint(r.get("stop_frame"));
            let (Some(first), Some(stop)) = (first, stop) else {
                return Err(bad(format!(
                    "region {j}: first_frame/stop_frame must be integers"
                )));
            };
            if first != cursor || stop <= first {
                return Err(bad(format!(
                    "region {j} covers [{first}, {stop}) but must start at {cursor} and be non-empty"
                )));
            }
            if stop > frames {
                return Err(bad(format!(
                    "region {j} ends at {stop}, beyond the {frames} frames"
                )));
            }
            if r.get("storage").and_then(Value::as_str) != Some("scaled_uint16") {
                return Err(bad(format!("region {j}: storage is not \"scaled_uint16\"")));
            }
            let scale = finite(r.get("scale"))
                .filter(|s| *s > 0.0)
                .ok_or_else(|| bad(format!("region {j}: scale must be finite and > 0")))?;
            let offset = finite(r.get("offset"))
                .ok_or_else(|| bad(format!("region {j}: offset must be finite")))?;
            let (Some(intensity_min), Some(intensity_max)) = (
                finite(r.get("intensity_min")),
                finite(r.get("intensity_max")),
            ) else {
                return Err(bad(format!("region {j}: invalid regional intensity range")));
            };
            regions.push(Region {
                first_frame: first as usize,
                stop_frame: stop as usize,
                scale,
                offset,
                intensity_min,
                intensity_max,
            });
            cursor = stop;
        }
        if cursor != frames {
            return Err(QemError::calibration(format!(
                "regional calibration covers {cursor} of {frames} frames; repeat the export"
            )));
        }
        Ok(IntensityCalibration {
            regions,
            raw: o.clone(),
        })
    }

    /// The region containing frame `f`.
    pub fn region_of_frame(&self, f: usize) -> Option<&Region> {
        let k = self.regions.partition_point(|r| r.stop_frame <= f);
        self.regions.get(k).filter(|r| r.first_frame <= f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_is_binary64_then_rounded() {
        let r = Region {
            first_frame: 0,
            stop_frame: 1,
            scale: 0.1,
            offset: -100.25,
            intensity_min: 0.0,
            intensity_max: 0.0,
        };
        let direct = (f64::from(12345u16) * 0.1 + -100.25) as f32;
        assert_eq!(r.value(12345).to_bits(), direct.to_bits());
        let single = 12345f32 * 0.1f32 + -100.25f32;
        // A float32 evaluation differs for some codes; make sure we are not
        // accidentally computing in f32.
        let differs = (0..=65535u16)
            .any(|c| r.value(c).to_bits() != (f32::from(c) * 0.1f32 + -100.25f32).to_bits());
        assert!(differs, "{single}");
    }
}
