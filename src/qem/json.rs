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

/// Marks an error raised by the caller's element handler, kept aside in
/// [`for_each_element`] because serde's error carries only text.
const STOP_MARK: &str = "\u{1}stop\u{1}";

/// Parses `bytes` as one JSON value, refusing duplicate object keys.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, QemError> {
    parse_with(
        bytes,
        StrictValue {
            path: "$",
            left_out: None,
        },
    )
}

/// Parses the object in `bytes` as [`parse_strict`] does, with its
/// top-level member `left_out` checked (syntax, duplicate keys) but not
/// kept: the chunk table of a large scan is megabytes of text, and its
/// parsed tree many times that. [`for_each_element`] reads it after.
pub fn parse_strict_leaving_out(bytes: &[u8], left_out: &str) -> Result<Value, QemError> {
    parse_with(
        bytes,
        StrictValue {
            path: "$",
            left_out: Some(left_out),
        },
    )
}

fn parse_with(bytes: &[u8], seed: StrictValue<'_>) -> Result<Value, QemError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = seed.deserialize(&mut de).map_err(convert_error)?;
    de.end().map_err(convert_error)?;
    Ok(value)
}

/// Hands each element of the top-level array member `name` of the object in
/// `bytes` to `each`, one at a time, and returns how many there were;
/// `None` when the member is absent or not an array. `bytes` must have
/// passed [`parse_strict_leaving_out`]. The first error of `each` stops the
/// walk and is returned.
pub fn for_each_element(
    bytes: &[u8],
    name: &str,
    mut each: impl FnMut(usize, Value) -> Result<(), QemError>,
) -> Result<Option<usize>, QemError> {
    let mut stopped = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let walk = Members {
        name,
        each: &mut each,
        stopped: &mut stopped,
    };
    match walk.deserialize(&mut de) {
        Ok(count) => Ok(count),
        Err(e) => Err(stopped.take().unwrap_or_else(|| convert_error(e))),
    }
}

/// The top-level object of [`for_each_element`]: other members are skipped.
struct Members<'a, F> {
    name: &'a str,
    each: &'a mut F,
    stopped: &'a mut Option<QemError>,
}

impl<'de, F: FnMut(usize, Value) -> Result<(), QemError>> DeserializeSeed<'de> for Members<'_, F> {
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(usize, Value) -> Result<(), QemError>> Visitor<'de> for Members<'_, F> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<usize>, A::Error> {
        let mut count = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.name {
                count = map.next_value_seed(Elements {
                    each: &mut *self.each,
                    stopped: &mut *self.stopped,
                })?;
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
        }
        Ok(count)
    }
}

/// The member's value: each element of an array goes to `each`.
struct Elements<'a, F> {
    each: &'a mut F,
    stopped: &'a mut Option<QemError>,
}

impl<'de, F: FnMut(usize, Value) -> Result<(), QemError>> DeserializeSeed<'de> for Elements<'_, F> {
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, F: FnMut(usize, Value) -> Result<(), QemError>> Visitor<'de> for Elements<'_, F> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<usize>, A::Error> {
        let mut count = 0;
        while let Some(v) = seq.next_element::<Value>()? {
            if let Err(e) = (self.each)(count, v) {
                *self.stopped = Some(e);
                return Err(de::Error::custom(STOP_MARK));
            }
            count += 1;
        }
        Ok(Some(count))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<usize>, A::Error> {
        while map
            .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
            .is_some()
        {}
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<usize>, E> {
        Ok(None)
    }
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
    /// A member of this object checked but not kept.
    left_out: Option<&'p str>,
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
        while let Some(v) = seq.next_element_seed(StrictValue {
            path: &child,
            left_out: None,
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut left_out_seen = false;
        while let Some(key) = map.next_key::<String>()? {
            let left_out = self.left_out == Some(key.as_str());
            if out.contains_key(&key) || (left_out && left_out_seen) {
                return Err(duplicate(&key, self.path));
            }
            let child = format!("{}.{}", self.path, key);
            if left_out {
                left_out_seen = true;
                map.next_value_seed(StrictCheck { path: &child })?;
                continue;
            }
            let v = map.next_value_seed(StrictValue {
                path: &child,
                left_out: None,
            })?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

fn duplicate<E: de::Error>(key: &str, path: &str) -> E {
    E::custom(format_args!("{DUP_MARK}{key}\u{1}{path}"))
}

/// Checks a value as [`StrictValue`] does (duplicate keys at any depth,
/// finite numbers) and keeps nothing but each object's keys, while it is
/// read.
struct StrictCheck<'p> {
    path: &'p str,
}

impl<'de> DeserializeSeed<'de> for StrictCheck<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictCheck<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(E::custom("non-finite number"))
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let child = format!("{}[]", self.path);
        while seq
            .next_element_seed(StrictCheck { path: &child })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if keys.contains(&key) {
                return Err(duplicate(&key, self.path));
            }
            let child = format!("{}.{}", self.path, key);
            map.next_value_seed(StrictCheck { path: &child })?;
            keys.insert(key);
        }
        Ok(())
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
    fn a_member_left_out_is_still_checked_and_then_walked() {
        let text = br#"{"a":1,"list":[{"x":1},{"y":[2]}],"b":2}"#;
        let v = parse_strict_leaving_out(text, "list").unwrap();
        assert_eq!(v, serde_json::json!({"a": 1, "b": 2}));
        let mut seen = Vec::new();
        let count = for_each_element(text, "list", |i, v| {
            seen.push((i, v));
            Ok(())
        })
        .unwrap();
        assert_eq!(count, Some(2));
        assert_eq!(seen[1], (1, serde_json::json!({"y": [2]})));
        assert_eq!(for_each_element(text, "a", |_, _| Ok(())).unwrap(), None);
        assert_eq!(for_each_element(text, "zz", |_, _| Ok(())).unwrap(), None);
        // The handler's own error stops the walk and comes back as it was.
        let stop = for_each_element(text, "list", |i, _| {
            Err(QemError::layout(Some(i), "refused"))
        });
        assert!(
            matches!(stop, Err(QemError::Layout { chunk: Some(0), .. })),
            "{stop:?}"
        );
        // Duplicates inside the left-out member, and the member twice.
        for (bad, key, path) in [
            (&br#"{"list":[{"x":1,"x":2}]}"#[..], "x", "$.list[]"),
            (br#"{"list":[],"list":[]}"#, "list", "$"),
        ] {
            match parse_strict_leaving_out(bad, "list") {
                Err(QemError::DuplicateKey { key: k, path: p }) => {
                    assert_eq!((k.as_str(), p.as_str()), (key, path));
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            parse_strict_leaving_out(br#"{"list":[1,}"#, "list"),
            Err(QemError::Json { .. })
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
