//! Header serialisation as the reference writer does it (spec §4.1): keys
//! sorted by code point at every level, no whitespace, every character
//! outside printable ASCII escaped as `\uxxxx`, floats in Python `repr` form.
//!
//! Byte-identical output depends on every one of these details, so the
//! serialiser is written out here rather than configured from serde_json;
//! strings and floats are spelt by [`crate::python_json`].

use serde_json::{Map, Number, Value};

use super::WriteError;
use crate::python_json::{float_repr, push_string, Escape};

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
        Value::String(s) => push_string(out, s, Escape::Ascii),
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
        push_string(out, key, Escape::Ascii);
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
        out.push_str(&float_repr(f));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorted_compact_escaped() {
        let v = json!({"b": [1, 2.5, null, true], "a": {"z": "é\u{1F600}\n\"\u{7f}", "y": -3}, "B": 1e-7});
        assert_eq!(
            to_canonical_json(&v).unwrap(),
            r#"{"B":1e-07,"a":{"y":-3,"z":"\u00e9\ud83d\ude00\n\"\u007f"},"b":[1,2.5,null,true]}"#
        );
    }
}
