//! Strict JSON parsing of the header: duplicate keys are refused in every
//! object at every depth (§4.1), which `serde_json::Value` alone would
//! silently resolve by keeping the last one.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

use super::error::QemError;

/// Marks a duplicate-key error inside serde's opaque error string, so it can
/// be told apart from a syntax error after parsing.
const DUP_MARK: &str = "\u{1}duplicate\u{1}";

/// Parses `bytes` as one JSON value, refusing duplicate object keys.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, QemError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictValue { path: "$" }
        .deserialize(&mut de)
        .map_err(convert_error)?;
    de.end().map_err(convert_error)?;
    Ok(value)
}

fn convert_error(e: serde_json::Error) -> QemError {
    let msg = e.to_string();
    if let Some(rest) = msg.strip_prefix(DUP_MARK) {
        let mut parts = rest.splitn(2, '\u{1}');
        let key = parts.next().unwrap_or_default().to_string();
        let path = parts
            .next()
            .map(|p| p.split(" at line ").next().unwrap_or(p).to_string())
            .unwrap_or_default();
        return QemError::DuplicateKey { key, path };
    }
    QemError::Json { detail: msg }
}

struct StrictValue<'p> {
    path: &'p str,
}

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("non-finite number"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let child = format!("{}[]", self.path);
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(StrictValue { path: &child })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "{DUP_MARK}{key}\u{1}{}",
                    self.path
                )));
            }
            let child = format!("{}.{}", self.path, key);
            let v = map.next_value_seed(StrictValue { path: &child })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let e = parse_strict(br#"{"a":1,"b":{"c":[{"d":1,"d":2}]}}"#).unwrap_err();
        match e {
            QemError::DuplicateKey { key, path } => {
                assert_eq!(key, "d");
                assert_eq!(path, "$.b.c[]");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            parse_strict(br#"{"a":1,"a":1}"#),
            Err(QemError::DuplicateKey { .. })
        ));
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(matches!(
            parse_strict(deep.as_bytes()),
            Err(QemError::Json { .. })
        ));
    }

    #[test]
    fn ordinary_json_parses_with_order_kept() {
        let v = parse_strict(b" {\n \"z\": [1, 2.5, null, true], \"a\": \"x\" } ").unwrap();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["z", "a"]);
        assert!(matches!(parse_strict(b"{} x"), Err(QemError::Json { .. })));
        assert!(matches!(
            parse_strict(b"{\"a\":NaN}"),
            Err(QemError::Json { .. })
        ));
    }
}
