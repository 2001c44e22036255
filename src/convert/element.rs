//! Element types: what a source holds, what a `.qem` stores, and the one
//! rule that turns the first into the second.
//!
//! A value is stored only when it is exactly representable: integers go to
//! uint16 counts when they lie in 0..=65535, float64 to float32 when it
//! round-trips bitwise. Anything else stops the conversion naming the first
//! element that is not, unless the user allowed float64 → float32 rounding,
//! which is then declared in `processing`.

use serde_json::{json, Value};

use crate::npy::DType;

/// The element type of window bytes (and of what a `.qem` stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    U8,
    U16,
    F32,
}

impl Element {
    pub fn size(self) -> usize {
        match self {
            Element::U8 => 1,
            Element::U16 => 2,
            Element::F32 => 4,
        }
    }

    pub fn npy(self) -> DType {
        match self {
            Element::U8 => DType::U8,
            Element::U16 => DType::U16,
            Element::F32 => DType::F32,
        }
    }

    pub fn name(self) -> &'static str {
        self.npy().name()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    Little,
    Big,
}

/// An element type as a source file holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceDtype {
    pub dtype: DType,
    pub order: ByteOrder,
}

impl SourceDtype {
    pub fn little(dtype: DType) -> SourceDtype {
        SourceDtype {
            dtype,
            order: ByteOrder::Little,
        }
    }

    pub fn size(self) -> usize {
        self.dtype.size()
    }

    /// True when the bytes are already the stored element's bytes.
    fn is_identity(self, stored: Element) -> bool {
        let little = self.order == ByteOrder::Little || self.size() == 1;
        little && self.dtype == stored.npy()
    }
}

/// How a source dtype is stored, and the processing record that says so.
#[derive(Clone, Debug)]
pub struct Narrowing {
    pub source: SourceDtype,
    pub stored: Element,
    /// float64 values that do not round-trip are rounded (not refused).
    pub round: bool,
    /// The `processing` record; `None` when the values are stored as they are.
    pub record: Option<Value>,
}

impl Narrowing {
    /// The storage of `source`.
    pub fn plan(source: SourceDtype, allow_rounding: bool) -> Narrowing {
        let name = source.dtype.name();
        let (stored, record, round) = match source.dtype {
            // A bool is a byte of 0 or 1: stored as uint8 counts, exactly.
            DType::Bool | DType::U8 => (Element::U8, None, false),
            DType::U16 => (Element::U16, None, false),
            DType::F32 => (Element::F32, None, false),
            DType::U32 | DType::U64 | DType::I8 | DType::I16 | DType::I32 | DType::I64 => (
                Element::U16,
                Some(json!({
                    "changes_measurements": false,
                    "operation": "exact_integer_narrowing",
                    "source_dtype": name,
                    "stored_dtype": "uint16",
                })),
                false,
            ),
            DType::F64 if allow_rounding => (
                Element::F32,
                Some(json!({
                    "changes_measurements": true,
                    "description": "float64 values rounded to the nearest float32 (round half to even)",
                    "operation": "float64_to_float32_rounding",
                    "source_dtype": "float64",
                    "stored_dtype": "float32",
                })),
                true,
            ),
            DType::F64 => (
                Element::F32,
                Some(json!({
                    "changes_measurements": false,
                    "operation": "exact_float_narrowing",
                    "source_dtype": "float64",
                    "stored_dtype": "float32",
                })),
                false,
            ),
        };
        Narrowing {
            source,
            stored,
            round,
            record,
        }
    }

    /// Converts `src` (whole source elements) into `out` (stored elements).
    /// `Err((i, text))`: element `i` of `src` (value `text`) is not exactly
    /// representable and nothing after it was converted.
    pub fn apply(&self, src: &[u8], out: &mut [u8]) -> Result<(), (usize, String)> {
        let n = self.source.size();
        debug_assert_eq!(src.len() / n * self.stored.size(), out.len());
        if self.source.is_identity(self.stored) {
            out.copy_from_slice(src);
            return Ok(());
        }
        let big = self.source.order == ByteOrder::Big;
        macro_rules! each {
            ($t:ty, $w:expr, $store:expr) => {{
                for (i, (s, o)) in src
                    .chunks_exact(n)
                    .zip(out.chunks_exact_mut($w))
                    .enumerate()
                {
                    let b: [u8; std::mem::size_of::<$t>()] = s.try_into().unwrap_or_default();
                    let v = if big {
                        <$t>::from_be_bytes(b)
                    } else {
                        <$t>::from_le_bytes(b)
                    };
                    #[allow(clippy::redundant_closure_call)]
                    $store(v, o).map_err(|()| (i, v.to_string()))?;
                }
                Ok(())
            }};
        }
        let to_u16 = |v: i128, o: &mut [u8]| -> Result<(), ()> {
            let c = u16::try_from(v).map_err(|_| ())?;
            o.copy_from_slice(&c.to_le_bytes());
            Ok(())
        };
        let to_f32 = |v: f32, o: &mut [u8]| -> Result<(), ()> {
            o.copy_from_slice(&v.to_le_bytes());
            Ok(())
        };
        let round = self.round;
        match self.source.dtype {
            DType::Bool | DType::U8 => each!(u8, 1, |v: u8, o: &mut [u8]| {
                o[0] = v;
                Ok::<(), ()>(())
            }),
            DType::I8 => each!(i8, 2, |v: i8, o| to_u16(v.into(), o)),
            DType::U16 => each!(u16, 2, |v: u16, o| to_u16(v.into(), o)),
            DType::I16 => each!(i16, 2, |v: i16, o| to_u16(v.into(), o)),
            DType::U32 => each!(u32, 2, |v: u32, o| to_u16(v.into(), o)),
            DType::I32 => each!(i32, 2, |v: i32, o| to_u16(v.into(), o)),
            DType::U64 => each!(u64, 2, |v: u64, o| to_u16(v.into(), o)),
            DType::I64 => each!(i64, 2, |v: i64, o| to_u16(v.into(), o)),
            DType::F32 => each!(f32, 4, to_f32),
            DType::F64 => each!(f64, 4, |v: f64, o: &mut [u8]| {
                let f = v as f32;
                // Bitwise round trip: NaN payloads and -0.0 must survive too.
                if !round && f64::from(f).to_bits() != v.to_bits() {
                    return Err(());
                }
                to_f32(f, o)
            }),
        }
    }
}

/// `(a, b, c)` of C-order element `index` of an array of `shape`.
pub fn multi_index(mut index: u64, shape: &[u64]) -> String {
    let mut parts = vec![0u64; shape.len()];
    for (p, &d) in parts.iter_mut().zip(shape).rev() {
        if d > 0 {
            *p = index % d;
            index /= d;
        }
    }
    let text: Vec<String> = parts.iter().map(u64::to_string).collect();
    format!("({})", text.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(dtype: DType, order: ByteOrder, round: bool) -> Narrowing {
        Narrowing::plan(SourceDtype { dtype, order }, round)
    }

    #[test]
    fn integers_narrow_only_when_they_fit() {
        let n = plan(DType::I32, ByteOrder::Big, false);
        let src: Vec<u8> = [0i32, 65535, 7]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let mut out = vec![0u8; 6];
        n.apply(&src, &mut out).unwrap();
        assert_eq!(out, [0, 0, 255, 255, 7, 0]);
        let src: Vec<u8> = [1i32, -1].iter().flat_map(|v| v.to_be_bytes()).collect();
        let mut out = vec![0u8; 4];
        assert_eq!(n.apply(&src, &mut out), Err((1, "-1".into())));
        let n = plan(DType::U32, ByteOrder::Little, false);
        let src = 65536u32.to_le_bytes();
        assert_eq!(n.apply(&src, &mut [0; 2]), Err((0, "65536".into())));
    }

    #[test]
    fn float64_needs_a_bitwise_round_trip_unless_rounding_is_allowed() {
        let exact = plan(DType::F64, ByteOrder::Little, false);
        let src: Vec<u8> = [1.5f64, -0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut out = vec![0u8; 8];
        exact.apply(&src, &mut out).unwrap();
        assert_eq!(&out[4..], &(-0.0f32).to_le_bytes());
        let src = 0.1f64.to_le_bytes();
        assert_eq!(exact.apply(&src, &mut [0; 4]), Err((0, "0.1".into())));
        let rounding = plan(DType::F64, ByteOrder::Little, true);
        let mut out = [0u8; 4];
        rounding.apply(&src, &mut out).unwrap();
        assert_eq!(out, 0.1f32.to_le_bytes());
        assert_eq!(
            rounding.record.unwrap()["changes_measurements"],
            Value::Bool(true)
        );
    }

    #[test]
    fn multi_index_is_c_order() {
        assert_eq!(multi_index(0, &[2, 3, 4]), "(0, 0, 0)");
        assert_eq!(multi_index(23, &[2, 3, 4]), "(1, 2, 3)");
        assert_eq!(multi_index(5, &[2, 3, 4]), "(0, 1, 1)");
    }
}
