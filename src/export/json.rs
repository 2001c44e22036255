//! The JSON files the tree presents and the CLI prints (`info.json`,
//! `detectors.json`, the Zarr metadata, `qem show --json`): serde_json's
//! pretty form (two-space indent) and a final newline, as `python -m
//! json.tool` and `jq` end their output. Text that must match the
//! upstream Python tools byte for byte is `crate::python_json`'s instead.

/// `value` as an indented JSON document ending in a newline.
pub fn pretty(value: &serde_json::Value) -> String {
    // A `Value` has string keys only and is written to memory: this cannot
    // fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
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
}
