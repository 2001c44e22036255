//! Header serialisation as the reference writer does it (spec §4.1): keys
//! sorted by code point at every level, no whitespace, every character
//! outside printable ASCII escaped as `\uxxxx`, floats in Python `repr` form.
//!
//! Byte-identical output depends on every one of these details, so the
//! serialiser is written out here rather than configured from serde_json.

use serde_json::{Map, Number, Value};

use super::WriteError;

/// Serialises `value` canonically.
pub fn to_canonical_json(value: &Value) -> Result<String, WriteError> {
    let mut out = String::new();
    let mut path = String::new();
    write_value(value, &mut out, &mut path)?;
    Ok(out)
}

fn write_value(value: &Value, out: &mut String, path: &mut String) -> Result<(), WriteError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out, path)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                write_value(item, out, path)?;
                path.truncate(len);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(map, out, path)?,
    }
    Ok(())
}

/// `value` with its objects' members in the order [`to_canonical_json`]
/// writes them: the order in which a reader meets them in the file.
pub(crate) fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&map[k.as_str()])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

fn write_object(
    map: &Map<String, Value>,
    out: &mut String,
    path: &mut String,
) -> Result<(), WriteError> {
    // Byte order of UTF-8 strings is code-point order, Python's sort order for str.
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_unstable();
    out.push('{');
    for (i, key) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        let len = path.len();
        path.push('.');
        path.push_str(key);
        write_value(&map[key.as_str()], out, path)?;
        path.truncate(len);
    }
    out.push('}');
    Ok(())
}

fn write_number(n: &Number, out: &mut String, path: &str) -> Result<(), WriteError> {
    if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else {
        let f = n.as_f64().unwrap_or(f64::NAN);
        if !f.is_finite() {
            return Err(WriteError::NonFinite {
                path: path.to_string(),
            });
        }
        out.push_str(&python_float_repr(f));
    }
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// `repr(float)` of Python 3: the shortest digits that round-trip, in fixed
/// notation when the decimal exponent lies in `[-4, 16)`, else in exponent
/// notation with a sign and at least two exponent digits.
///
/// Non-finite values are refused by callers; they are rendered as Python
/// does (`nan`, `inf`) only so the function is total.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    // Rust's `{:e}` yields the shortest round-trip digits, e.g. `1.2345e-7`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let n = digits.len() as i32;
    // Position of the decimal point relative to the first digit: value = 0.DIGITS × 10^point.
    let point = exponent + 1;
    let body = if -4 < point && point <= 16 {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point >= n {
            format!("{digits}{}.0", "0".repeat((point - n) as usize))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e = point - 1;
        let esign = if e < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", e.abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_reprs() {
        // Expected strings are Python 3's repr() of the same doubles.
        let cases: &[(f64, &str)] = &[
            (300.0, "300.0"),
            (0.4, "0.4"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00012, "0.00012"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (4.0000000000000004e-11, "4.0000000000000004e-11"),
            (6e-11, "6e-11"),
            (562.1470209281907, "562.1470209281907"),
            (0.008493889081074093, "0.008493889081074093"),
            (-100.25, "-100.25"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (123456789012345.6, "123456789012345.6"),
            (1234567890123456.7, "1234567890123456.8"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (0.1 + 0.2, "0.30000000000000004"),
        ];
        for &(f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn sorted_compact_escaped() {
        let v = json!({"b": [1, 2.5, null, true], "a": {"z": "é\u{1F600}\n\"\u{7f}", "y": -3}, "B": 1e-7});
        assert_eq!(
            to_canonical_json(&v).unwrap(),
            r#"{"B":1e-07,"a":{"y":-3,"z":"\u00e9\ud83d\ude00\n\"\u007f"},"b":[1,2.5,null,true]}"#
        );
    }
}
