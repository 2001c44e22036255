//! The floor JSON: the canonical writer and the strict reader (spec 10.1).

use super::{Floor, FloorFields};
use crate::python_json::Separators;
use crate::semq::config::{check_fields, Operator};
use crate::semq::error::{Result, SemqError};
use crate::semq::identity::{from_hex, to_hex};
use crate::semq::ids::IdKind;
use crate::semq::report::push_config;

const VERSION: &str = "semq-floor/1";
/// The outer object is level 1; a container at level 65 is rejected.
const MAX_DEPTH: usize = 64;

pub(super) fn write(f: &Floor) -> String {
    let mut s = format!("{{\"version\":\"{VERSION}\",\"config\":");
    push_config(&mut s, &f.config, Separators::COMPACT);
    s.push_str(&format!(
        ",\"id_kind\":\"{}\",\"reference_id\":\"{}\",\"nulls\":{},\"changed_rows\":{},\"total_rows\":{},\"hamming\":{}",
        f.id_kind.name(),
        to_hex(&f.reference_id),
        f.nulls,
        f.changed_rows,
        f.total_rows,
        f.hamming,
    ));
    if let Some(m) = f.max_hamming {
        s.push_str(&format!(",\"max_hamming\":{m}"));
    }
    if let Some(d) = f.distinct_nulls {
        s.push_str(&format!(",\"distinct_nulls\":{d}"));
    }
    s.push('}');
    s
}

/// A parsed JSON value; numbers keep their text so that integers up to
/// 2^64−1 are never rounded through a double.
#[derive(Debug)]
enum Value {
    Object(Vec<(String, Value)>),
    Array,
    String(String),
    Number(String),
    Bool,
    Null,
}

fn invalid(message: impl Into<String>) -> SemqError {
    SemqError::invalid(message)
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn syntax(&self, what: &str) -> SemqError {
        invalid(format!("floor is not valid JSON: {what}"))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, b: u8, what: &str) -> Result<()> {
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.syntax(what))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value> {
        self.skip_ws();
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true", Value::Bool),
            Some(b'f') => self.literal(b"false", Value::Bool),
            Some(b'n') => self.literal(b"null", Value::Null),
            _ => Err(self.syntax("expected a value")),
        }
    }

    fn literal(&mut self, word: &[u8], v: Value) -> Result<Value> {
        if self.s.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(v)
        } else {
            Err(self.syntax("expected a value"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value> {
        if depth > MAX_DEPTH {
            return Err(invalid("floor is nested too deeply"));
        }
        self.expect(b'{', "expected an object")?;
        let mut pairs = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(pairs));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected a string"));
            }
            let key = self.string()?;
            self.skip_ws();
            self.expect(b':', "expected ':'")?;
            let v = self.value(depth)?;
            pairs.push((key, v));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(pairs));
                }
                _ => return Err(self.syntax("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value> {
        if depth > MAX_DEPTH {
            return Err(invalid("floor is nested too deeply"));
        }
        self.expect(b'[', "expected an array")?;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array);
        }
        loop {
            self.value(depth)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array);
                }
                _ => return Err(self.syntax("expected ',' or ']'")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits = self
            .s
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.syntax("bad \\u escape"))?;
        let mut v = 0u32;
        for &d in digits {
            let n = (d as char)
                .to_digit(16)
                .ok_or_else(|| self.syntax("bad \\u escape"))?;
            v = v * 16 + n;
        }
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String> {
        self.expect(b'"', "expected a string")?;
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            let raw = std::str::from_utf8(&self.s[start..self.pos])
                .map_err(|_| invalid("floor is not valid UTF-8"))?;
            out.push_str(raw);
            match self.peek() {
                None => return Err(self.syntax("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let e = self
                        .peek()
                        .ok_or_else(|| self.syntax("unterminated string"))?;
                    self.pos += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xd800..0xdc00).contains(&hi) {
                                if self.s.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                    return Err(self.syntax("lone surrogate"));
                                }
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return Err(self.syntax("lone surrogate"));
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else if (0xdc00..0xe000).contains(&hi) {
                                return Err(self.syntax("lone surrogate"));
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(c).ok_or_else(|| self.syntax("bad \\u escape"))?,
                            );
                        }
                        _ => return Err(self.syntax("bad escape")),
                    }
                }
                Some(_) => return Err(self.syntax("control character in a string")),
            }
        }
    }

    fn number(&mut self) -> Result<Value> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let s = p.pos;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.pos += 1;
            }
            p.pos - s
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.syntax("bad number")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if digits(self) == 0 {
                return Err(self.syntax("bad number"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if digits(self) == 0 {
                return Err(self.syntax("bad number"));
            }
        }
        // Only ASCII was consumed.
        let text = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        Ok(Value::Number(text))
    }
}

/// A count: JSON integer text of digits only (the grammar already forbids
/// leading zeros), at most 2^64−1.
fn as_u64(v: &Value) -> Option<u64> {
    let Value::Number(t) = v else { return None };
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<u64>().ok()
}

fn count(v: &Value, name: &str) -> Result<u64> {
    as_u64(v).ok_or_else(|| invalid(format!("floor.{name} must be an integer in [0, 2^64)")))
}

/// Keeps the first occurrence of each known key and rejects a second one.
fn take_known<'v>(
    pairs: &'v [(String, Value)],
    known: &[&str],
    duplicate: &str,
) -> Result<Vec<Option<&'v Value>>> {
    let mut found: Vec<Option<&Value>> = vec![None; known.len()];
    for (k, v) in pairs {
        if let Some(i) = known.iter().position(|n| n == k) {
            if found[i].is_some() {
                return Err(invalid(duplicate));
            }
            found[i] = Some(v);
        }
    }
    Ok(found)
}

const TOP_KEYS: [&str; 10] = [
    "version",
    "config",
    "id_kind",
    "reference_id",
    "nulls",
    "changed_rows",
    "total_rows",
    "hamming",
    "max_hamming",
    "distinct_nulls",
];
const CONFIG_KEYS: [&str; 6] = [
    "operator",
    "dim",
    "scale",
    "sectors",
    "bins",
    "rule_revision",
];

pub(super) fn read(text: &[u8]) -> Result<Floor> {
    let mut p = Parser { s: text, pos: 0 };
    p.skip_ws();
    if p.peek() != Some(b'{') {
        return Err(invalid("floor must be a JSON object"));
    }
    let top = p.value(0)?;
    p.skip_ws();
    if p.pos != text.len() {
        return Err(p.syntax("data after the object"));
    }
    let Value::Object(pairs) = top else {
        return Err(invalid("floor must be a JSON object"));
    };
    let found = take_known(&pairs, &TOP_KEYS, "floor has a duplicate key")?;
    let mut required = Vec::with_capacity(8);
    for (i, name) in TOP_KEYS.iter().enumerate().take(8) {
        required.push(found[i].ok_or_else(|| invalid(format!("floor is missing {name}")))?);
    }

    match required[0] {
        Value::String(s) if s == VERSION => {}
        _ => return Err(invalid("floor.version must be \"semq-floor/1\"")),
    }
    let config = read_config(required[1])?;
    let id_kind = match required[2] {
        Value::String(s) => IdKind::from_name(s),
        _ => None,
    }
    .ok_or_else(|| invalid("floor.id_kind must be \"u64\" or \"utf8\""))?;
    let reference_id = match required[3] {
        Value::String(s) => from_hex(s),
        _ => None,
    }
    .ok_or_else(|| invalid("floor.reference_id must be 64 hex characters"))?;
    let nulls = count(required[4], "nulls")?;
    let changed_rows = count(required[5], "changed_rows")?;
    let total_rows = count(required[6], "total_rows")?;
    let hamming = count(required[7], "hamming")?;
    let optional = |i: usize, name: &str| -> Result<Option<u64>> {
        match found[i] {
            None => Ok(None),
            Some(v) => {
                let c = count(v, name)?;
                if c == u64::MAX {
                    return Err(invalid(format!(
                        "floor.{name} is 18446744073709551615, which is reserved (SEMQ_NONE)"
                    )));
                }
                Ok(Some(c))
            }
        }
    };
    let max_hamming = optional(8, "max_hamming")?;
    let distinct_nulls = optional(9, "distinct_nulls")?;
    Floor::new(FloorFields {
        config,
        id_kind,
        reference_id,
        nulls,
        changed_rows,
        total_rows,
        hamming,
        max_hamming,
        distinct_nulls,
    })
}

fn read_config(v: &Value) -> Result<crate::semq::config::Config> {
    let Value::Object(pairs) = v else {
        return Err(invalid("floor.config must be an object"));
    };
    let found = take_known(pairs, &CONFIG_KEYS, "floor.config has a duplicate key")?;
    let operator = match found[0] {
        Some(Value::String(s)) => Operator::from_name(s),
        _ => None,
    }
    .ok_or_else(|| invalid("floor.config.operator must be \"orbit\", \"phase\" or \"quant\""))?;
    let own = match operator {
        Operator::Orbit => 2,
        Operator::Phase => 3,
        Operator::Quant => 4,
    };
    let (Some(dim), Some(param), Some(rev)) = (found[1], found[own], found[5]) else {
        return Err(invalid(
            "floor.config is missing dim, its operator's parameter or rule_revision",
        ));
    };
    if (2..5).any(|i| i != own && found[i].is_some()) {
        return Err(invalid("floor.config has a parameter of another operator"));
    }
    let field = |v: &Value| {
        as_u64(v)
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| invalid("floor.config fields must be integers in [0, 2^32)"))
    };
    let (dim, param, rev) = (field(dim)?, field(param)?, field(rev)?);
    check_fields(operator as u8, dim, param, rev).map_err(|f| invalid(f.message))
}
