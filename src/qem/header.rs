//! The JSON header (§4) as typed values: codec identity, dtype, shape,
//! body size and checksums, the validity mask and the codec-specific members.

use serde_json::{Map, Value};

use super::error::QemError;
use super::metadata::ScientificMetadata;
use super::scaled::IntensityCalibration;

pub const CONTAINER: &str = "quantem.qem";
pub const INTEGER_CODEC: &str = "runtime-column-rans-spatial-v2";
pub const FLOAT_CODEC: &str = "float32-bit-lanes-rans-v1";
pub const SCALED_CODEC: &str = "scaled-uint16-column-rans-v1";
pub const RETIRED_FLOAT_CODEC: &str = "empad-xor-row-packed-v1";
/// Scans per block of the integer and scaled codecs.
pub const INTERVAL: usize = 512;
/// Each shape entry is below 2^24.
pub const MAX_AXIS: u64 = 1 << 24;

/// The three codecs of container version 1. Exhaustive on purpose (as are
/// [`Dtype`] and `PixelValues`): a new codec comes with a new container
/// version, and every decoder and backend that matches on these must then
/// fail to compile until it handles it, not fall back silently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// `runtime-column-rans-spatial-v2`: uint8/uint16 detector counts.
    Integer,
    /// `float32-bit-lanes-rans-v1`: float32 bit patterns as two u16 lanes.
    Float,
    /// `scaled-uint16-column-rans-v1`: regional u16 codes of float32 results.
    Scaled,
}

impl Codec {
    pub fn id(self) -> &'static str {
        match self {
            Codec::Integer => INTEGER_CODEC,
            Codec::Float => FLOAT_CODEC,
            Codec::Scaled => SCALED_CODEC,
        }
    }
}

/// Element types of stored and decoded arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    U8,
    U16,
    F32,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::F32 => "float32",
        }
    }
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::U16 => 2,
            Dtype::F32 => 4,
        }
    }
    /// NumPy `descr` of the little-endian type.
    pub fn npy_descr(self) -> &'static str {
        match self {
            Dtype::U8 => "|u1",
            Dtype::U16 => "<u2",
            Dtype::F32 => "<f4",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "uint8" => Dtype::U8,
            "uint16" => Dtype::U16,
            "float32" => Dtype::F32,
            _ => return None,
        })
    }
}

/// The detector validity mask (§6.1): one flag per pixel, MSB first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidMask {
    bytes: Vec<u8>,
    pixels: usize,
}

impl ValidMask {
    /// Parses the hex mask of `pixels` pixels: hex digits only, exactly
    /// `ceil(pixels / 8)` pairs. As the reference does (spec §15.7), upper
    /// case and whitespace between byte pairs are accepted and padding bits
    /// are ignored; anything else (a sign, `0x`, other characters) is
    /// refused rather than left to a lenient number parser.
    pub fn parse(hex: &str, pixels: usize) -> Result<Self, QemError> {
        let bad =
            |why: &str| QemError::header("valid", format!("invalid detector validity mask: {why}"));
        // Whitespace may separate byte pairs, never split one.
        if hex
            .split_ascii_whitespace()
            .any(|t| !t.len().is_multiple_of(2))
        {
            return Err(bad("hex digits not in pairs"));
        }
        let digits: Vec<u8> = hex.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
        if let Some(at) = digits.iter().position(|c| !c.is_ascii_hexdigit()) {
            return Err(bad(&format!(
                "{:?} is not a hex digit (digit {at})",
                char::from(digits[at])
            )));
        }
        let want = pixels.div_ceil(8);
        if digits.len() != 2 * want {
            return Err(bad(&format!(
                "{} hex digits for {pixels} pixels, {} expected",
                digits.len(),
                2 * want
            )));
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => c - b'A' + 10,
        };
        let bytes: Vec<u8> = digits
            .chunks_exact(2)
            .map(|pair| (nibble(pair[0]) << 4) | nibble(pair[1]))
            .collect();
        Ok(ValidMask { bytes, pixels })
    }

    /// A mask with every pixel valid.
    pub fn all_valid(pixels: usize) -> Self {
        ValidMask {
            bytes: vec![0xff; pixels.div_ceil(8)],
            pixels,
        }
    }

    pub fn pixels(&self) -> usize {
        self.pixels
    }

    /// Whether pixel `p` is valid (`false` for `p` out of range).
    pub fn is_valid(&self, p: usize) -> bool {
        p < self.pixels && self.bytes[p / 8] & (0x80 >> (p % 8)) != 0
    }

    /// One byte per pixel, 1 where valid: numpy's and Zarr's `bool` layout
    /// (`mask.npy`, `data.zarr/mask`).
    pub fn flags(&self) -> Vec<u8> {
        (0..self.pixels)
            .map(|p| u8::from(self.is_valid(p)))
            .collect()
    }

    pub fn invalid_count(&self) -> usize {
        (0..self.pixels).filter(|&p| !self.is_valid(p)).count()
    }

    /// The packed bytes, MSB first, padding bits as stored.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The typed header of a `.qem` file.
#[derive(Debug, Clone)]
pub struct Header {
    pub codec: Codec,
    /// The header `dtype` (codes for the scaled codec).
    pub stored_dtype: Dtype,
    /// `(scan_row, scan_column, detector_row, detector_column)`.
    pub shape: [u64; 4],
    pub bytes: u64,
    pub sha256: Vec<String>,
    pub valid: Option<ValidMask>,
    pub logical_sha256: Option<String>,
    pub empad: Option<Map<String, Value>>,
    pub intensity_calibration: Option<IntensityCalibration>,
    pub metadata: Option<Map<String, Value>>,
    pub attributes: Option<Map<String, Value>>,
    pub scientific: ScientificMetadata,
}

/// A JSON integer (never a boolean or a float).
pub(crate) fn json_uint(v: Option<&Value>) -> Option<u64> {
    match v {
        Some(Value::Number(n)) => n.as_u64(),
        _ => None,
    }
}

impl Header {
    /// Checks the header's members (everything except the chunk table and
    /// the body). `file_len` and `header_len` check rule 4 of §2.
    /// The object itself is not kept (see [`crate::qem::QemFile::header_object`]).
    pub fn from_value(value: &Value, file_len: u64, header_len: u64) -> Result<Self, QemError> {
        let Value::Object(raw) = value else {
            return Err(QemError::header("(header)", "not a JSON object"));
        };
        if !raw.get("scientific_metadata").is_some_and(Value::is_object) {
            return Err(QemError::metadata(
                "scientific_metadata",
                "missing or not an object; re-export the original acquisition",
            ));
        }
        match raw.get("container") {
            Some(Value::String(c)) if c == CONTAINER => {}
            other => {
                return Err(QemError::header(
                    "container",
                    format!(
                        "{} is not \"{CONTAINER}\"; update the reader or re-export the original",
                        describe(other)
                    ),
                ))
            }
        }
        if json_uint(raw.get("container_version")) != Some(1) {
            return Err(QemError::UnsupportedVersion {
                what: "container_version",
                found: describe(raw.get("container_version")),
                expected: "1".into(),
            });
        }
        let codec = parse_codec(raw)?;
        let shape = parse_shape(raw.get("shape"))?;
        let stored_dtype = raw
            .get("dtype")
            .and_then(Value::as_str)
            .and_then(Dtype::parse)
            .filter(|d| match codec {
                Codec::Integer => matches!(d, Dtype::U8 | Dtype::U16),
                Codec::Float => *d == Dtype::F32,
                Codec::Scaled => *d == Dtype::U16,
            })
            .ok_or_else(|| {
                QemError::header(
                    "dtype",
                    format!(
                        "{} is not a dtype of codec {}",
                        describe(raw.get("dtype")),
                        codec.id()
                    ),
                )
            })?;
        let metadata = match raw.get("metadata") {
            Some(Value::Object(m)) => Some(m.clone()),
            None if codec != Codec::Integer => None,
            other => {
                return Err(QemError::header(
                    "metadata",
                    format!(
                        "invalid acquisition metadata: {} is not an object",
                        describe(other)
                    ),
                ))
            }
        };
        let scientific = ScientificMetadata::validate(
            &raw["scientific_metadata"],
            &shape,
            metadata.as_ref(),
            stored_dtype.name(),
        )?;

        let bytes = json_uint(raw.get("bytes"))
            .filter(|&b| b > 0)
            .ok_or_else(|| QemError::header("bytes", "must be an integer > 0"))?;
        let expected = 56u128 + u128::from(header_len) + u128::from(bytes);
        if expected != u128::from(file_len) {
            return Err(QemError::FileLength {
                expected,
                actual: file_len,
            });
        }
        let sha256 = raw
            .get("sha256")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|s| s.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| QemError::header("sha256", "must be a list of strings"))?;

        if json_uint(raw.get("version")) != Some(1) {
            return Err(QemError::UnsupportedVersion {
                what: "codec version",
                found: describe(raw.get("version")),
                expected: "1".into(),
            });
        }
        if codec != Codec::Float && json_uint(raw.get("interval")) != Some(INTERVAL as u64) {
            return Err(QemError::header(
                "interval",
                format!(
                    "{} is not {INTERVAL} (unsupported geometry)",
                    describe(raw.get("interval"))
                ),
            ));
        }
        let pixels = (shape[2] * shape[3]) as usize;
        let valid = match codec {
            Codec::Integer => {
                let hex = raw
                    .get("valid")
                    .and_then(Value::as_str)
                    .ok_or_else(|| QemError::header("valid", "missing or not a string"))?;
                Some(ValidMask::parse(hex, pixels)?)
            }
            _ => None,
        };
        let (logical_sha256, empad) = if codec == Codec::Float {
            let empad = raw
                .get("empad")
                .and_then(Value::as_object)
                .cloned()
                .ok_or_else(|| {
                    QemError::header(
                        "empad",
                        "missing or not an object (invalid floating-point description)",
                    )
                })?;
            let logical = raw
                .get("logical_sha256")
                .and_then(Value::as_str)
                .filter(|s| s.len() == 64)
                .ok_or_else(|| {
                    QemError::header("logical_sha256", "must be a string of 64 hex digits")
                })?;
            (Some(logical.to_string()), Some(empad))
        } else {
            (None, None)
        };
        let intensity_calibration = if codec == Codec::Scaled {
            scientific.check_scaled_quantization()?;
            Some(IntensityCalibration::parse(
                raw.get("intensity_calibration"),
                &shape,
            )?)
        } else {
            None
        };
        let attributes = match raw.get("attributes") {
            None => None,
            Some(Value::Object(a)) if codec == Codec::Scaled => Some(a.clone()),
            Some(_) if codec != Codec::Scaled => None,
            Some(_) => return Err(QemError::header("attributes", "must be an object")),
        };
        Ok(Header {
            codec,
            stored_dtype,
            shape,
            bytes,
            sha256,
            valid,
            logical_sha256,
            empad,
            intensity_calibration,
            metadata,
            attributes,
            scientific,
        })
    }

    /// Frames `N = shape[0] * shape[1]`.
    pub fn frames(&self) -> usize {
        (self.shape[0] * self.shape[1]) as usize
    }

    /// Detector pixels `P = shape[2] * shape[3]`.
    pub fn pixels(&self) -> usize {
        (self.shape[2] * self.shape[3]) as usize
    }

    /// Element type of decoded values (float32 for the scaled codec).
    pub fn decoded_dtype(&self) -> Dtype {
        match self.codec {
            Codec::Scaled => Dtype::F32,
            _ => self.stored_dtype,
        }
    }
}

fn describe(v: Option<&Value>) -> String {
    match v {
        None => "missing".into(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 80 {
                format!("{}…", s.chars().take(80).collect::<String>())
            } else {
                s
            }
        }
    }
}

fn parse_codec(raw: &Map<String, Value>) -> Result<Codec, QemError> {
    let codec = raw.get("codec").and_then(Value::as_str);
    let codec_enum = match codec {
        Some(INTEGER_CODEC) => Codec::Integer,
        Some(FLOAT_CODEC) => Codec::Float,
        Some(SCALED_CODEC) => Codec::Scaled,
        Some(RETIRED_FLOAT_CODEC) => {
            return Err(QemError::UnsupportedCodec {
                codec: RETIRED_FLOAT_CODEC.into(),
                advice: "this float codec is retired and no reader decodes it; re-export the original acquisition as float32-bit-lanes-rans-v1",
            })
        }
        Some(other) => {
            return Err(QemError::UnsupportedCodec {
                codec: other.into(),
                advice: "unknown codec; update the reader, or re-export the original acquisition",
            })
        }
        None => {
            return Err(QemError::UnsupportedCodec {
                codec: describe(raw.get("codec")),
                advice: "no codec named in the header; re-export the original acquisition",
            })
        }
    };
    if raw.get("profile").and_then(Value::as_str) != codec {
        return Err(QemError::header(
            "profile",
            format!(
                "{} disagrees with codec; update the reader or re-export the original",
                describe(raw.get("profile"))
            ),
        ));
    }
    Ok(codec_enum)
}

fn parse_shape(v: Option<&Value>) -> Result<[u64; 4], QemError> {
    let bad = || QemError::header("shape", "expected four positive integer axes below 2^24");
    let a = v.and_then(Value::as_array).ok_or_else(bad)?;
    if a.len() != 4 {
        return Err(bad());
    }
    let mut shape = [0u64; 4];
    for (s, v) in shape.iter_mut().zip(a) {
        *s = json_uint(Some(v))
            .filter(|&x| (1..MAX_AXIS).contains(&x))
            .ok_or_else(bad)?;
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_mask_from_the_spec() {
        let m = ValidMask::parse("ec", 6).unwrap();
        let flags: Vec<bool> = (0..6).map(|p| m.is_valid(p)).collect();
        assert_eq!(flags, [true, true, true, false, true, true]);
        assert_eq!(m.invalid_count(), 1);
        assert!(ValidMask::parse("ec00", 6).is_err());
        assert!(ValidMask::parse("E C", 6).is_err());
        assert!(ValidMask::parse("EC", 6).is_ok());
    }

    #[test]
    fn valid_mask_takes_hex_digits_only() {
        for bad in ["+c", "-1", "0x", "g0", "é", "e", "ec0"] {
            let e = ValidMask::parse(bad, 6).unwrap_err().to_string();
            assert!(e.contains("validity mask"), "{bad}: {e}");
        }
        assert!(ValidMask::parse("+c", 6)
            .unwrap_err()
            .to_string()
            .contains("'+' is not a hex digit"));
        assert_eq!(ValidMask::parse("Ec ff", 16).unwrap().invalid_count(), 3);
    }
}
