//! The JSON files the tree presents and the CLI prints (`info.json`,
//! `detectors.json`, the Zarr metadata, `qem show --json`): serde_json's
//! pretty form (two-space indent) and a final newline, as `python -m
//! json.tool` and `jq` end their output. Text that must match the
//! upstream Python tools byte for byte is `crate::python_json`'s instead.

use std::io;

use serde::{Serialize, Serializer};

/// `value` as an indented JSON document ending in a newline.
pub fn pretty(value: &serde_json::Value) -> String {
    // A `Value` has string keys only and is written to memory: this cannot
    // fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// `value` in the form of [`pretty`], written to `out`.
pub fn write_pretty(value: &impl Serialize, mut out: impl io::Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut out, value).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

/// A JSON text that was checked when its file was opened (a stored
/// header), serialised as it is parsed: written by [`write_pretty`], alone
/// or inside another document, it never becomes a tree, so memory does not
/// follow its size (a parsed tree takes about 50 times its text). The
/// output is the one [`pretty`] gives for the parsed value: the same parser
/// hands the same keys, in order, and numbers to the same serializer.
pub struct Stored<'a>(pub &'a [u8]);

impl Serialize for Stored<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut de = serde_json::Deserializer::from_slice(self.0);
        serde_transcode::transcode(&mut de, s)
    }
}

/// Counts what is written to it: the size of a document without keeping it.
#[derive(Default)]
pub struct Counted(pub u64);

impl io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn indented_with_a_final_newline() {
        let v = serde_json::json!({"shape": [2, 3], "name": "é"});
        assert_eq!(
            super::pretty(&v),
            "{\n  \"shape\": [\n    2,\n    3\n  ],\n  \"name\": \"é\"\n}\n"
        );
        assert_eq!(super::pretty(&serde_json::json!({})), "{}\n");
    }

    #[test]
    fn a_stored_text_is_written_as_its_parsed_value_would_be() {
        let text = br#"{"b": [1, -2, 3.5e-7, 18446744073709551615, 1e300, true, null],
            "a": {"\u00e9": "x\ty\ud83d\ude00", "nested": {"deep": [[], {}]}},
            "z": -0, "f": 0.1, "big": 123456789012345678901234567890}"#;
        let parsed: serde_json::Value = serde_json::from_slice(text).unwrap();
        let mut out = Vec::new();
        super::write_pretty(&super::Stored(text), &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), super::pretty(&parsed));
        let mut counted = super::Counted::default();
        super::write_pretty(&super::Stored(text), &mut counted).unwrap();
        assert_eq!(counted.0, super::pretty(&parsed).len() as u64);
    }
}
