//! JSON text byte for byte as the upstream tools write it: they are Python
//! programs, so strings are escaped and floats spelt the way Python's `json`
//! module does. The two dialects differ only in what a string escapes; the
//! separators are the caller's (`","`/`":"` compact, `", "`/`": "` for
//! reports).
//!
//! Every writer of such text in the crate (the `.qem` header, the `.semq`
//! reports and floor files) goes through these two functions.

use std::fmt::Write as _;

/// The text between items and between a key and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Separators {
    pub item: &'static str,
    pub key: &'static str,
}

impl Separators {
    /// `separators=(",", ":")`: the `.qem` header and `.semq` floor files.
    pub const COMPACT: Separators = Separators {
        item: ",",
        key: ":",
    };
    /// Python's default, `(", ", ": ")`: the `semq` reports.
    pub const SPACED: Separators = Separators {
        item: ", ",
        key: ": ",
    };
}

/// What a JSON string escapes besides `"`, `\\` and control characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    /// Everything outside printable ASCII as `\uXXXX` (UTF-16 units):
    /// the `.qem` header (spec §4.1).
    Ascii,
    /// Nothing more: characters from U+0020 on are written as they are, as
    /// `json.dump(..., ensure_ascii=False)` does (the `semq` reports).
    Unicode,
}

/// Appends `s` as a JSON string.
pub fn push_string(out: &mut String, s: &str, escape: Escape) {
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
            c if (c as u32) >= 0x20 && escape == Escape::Unicode => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
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
pub fn float_repr(f: f64) -> String {
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

/// Whether Python's `str.isprintable()` holds for `c`, for the characters
/// text in paths and metadata holds: controls (Cc), format characters (Cf)
/// and separators other than the space (Zs, Zl, Zp) are not printable.
/// Unassigned code points (Cn), which Python escapes too, are taken as
/// printable: telling them needs the Unicode tables.
fn printable(c: char) -> bool {
    !(c.is_control()
        || matches!(
            c,
            '\u{a0}'
                | '\u{ad}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{1680}'
                | '\u{180e}'
                | '\u{2000}'..='\u{200f}'
                | '\u{2028}'..='\u{202f}'
                | '\u{205f}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{3000}'
                | '\u{e000}'..='\u{f8ff}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{f0000}'..
        ))
}

/// Python's `repr()` of a string: single quotes unless the text holds one
/// and no double quote, backslashes and the chosen quote escaped, and every
/// character Python does not print as `\t`, `\n`, `\r`, `\xNN`, `\uNNNN`
/// or `\UNNNNNNNN`.
pub fn str_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if printable(c) => out.push(c),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push(q);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our `repr` of strings against Python's own, run here.
    #[test]
    fn str_reprs_are_pythons() {
        let cases = [
            "plain",
            "it's",
            "say \"hi\"",
            "both ' and \"",
            "back\\slash",
            "tab\there\nnew\rret",
            "\u{0}\u{1}\u{1b}\u{7f}\u{80}\u{9f}",
            "nbsp\u{a0} shy\u{ad} zwsp\u{200b} ls\u{2028} bom\u{feff} ideo\u{3000}",
            "caf\u{e9} \u{3b1}\u{3b2} \u{1f600} \u{fffd}",
            "/data/run 7/scan.semq",
        ];
        let json = serde_json::to_string(&cases).unwrap();
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import json, sys\nfor s in json.loads(sys.argv[1]): print(json.dumps(repr(s)))",
                &json,
            ])
            .output()
            .expect("python3 runs (it is on every machine of this kind)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let ours: Vec<String> = cases.iter().map(|s| str_repr(s)).collect();
        assert_eq!(ours, theirs);
    }

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
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn strings_in_both_dialects() {
        let s = "a\"\\\n\u{1}\u{7f}é\u{2028}\u{1F600}";
        let mut ascii = String::new();
        push_string(&mut ascii, s, Escape::Ascii);
        assert_eq!(ascii, r#""a\"\\\n\u0001\u007f\u00e9\u2028\ud83d\ude00""#);
        let mut unicode = String::new();
        push_string(&mut unicode, s, Escape::Unicode);
        assert_eq!(unicode, "\"a\\\"\\\\\\n\\u0001\u{7f}é\u{2028}\u{1F600}\"");
    }
}
