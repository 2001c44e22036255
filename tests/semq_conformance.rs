//! The shared `.semq` conformance cases (shared/conformance/semq/cases.json),
//! one test per case kind. Each test runs every case of its kind, reports
//! every failing case by name, then fails if any did.

use std::path::PathBuf;

use qemfs::semq::{
    self, concat::concat, floor, report, to_hex, Config, Encoding, Floor, Id, IdKind, IdList,
    IdRef, Operator, SemqError,
};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/semq"
    ))
}

fn cases(kind: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("cases.json")).expect("cases.json is readable");
    let all: Vec<Value> = serde_json::from_str(&text).expect("cases.json parses");
    all.into_iter().filter(|c| c["kind"] == kind).collect()
}

fn path(rel: &Value) -> PathBuf {
    root().join(rel.as_str().unwrap_or_default())
}

fn read(rel: &Value) -> Vec<u8> {
    std::fs::read(path(rel)).unwrap_or_default()
}

/// Runs `check` on every case and panics listing each failure.
fn run_all(kind: &str, expected_count: usize, check: impl Fn(&Value) -> Result<(), String>) {
    let cases = cases(kind);
    assert_eq!(cases.len(), expected_count, "number of {kind} cases");
    let mut failures = Vec::new();
    for c in &cases {
        let name = c["id"].as_str().unwrap_or("?").to_owned();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(c))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{name}: {e}")),
            Err(_) => failures.push(format!("{name}: panicked")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} {kind} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn config_of(v: &Value) -> Result<Config, String> {
    let op = Operator::from_name(v["operator"].as_str().unwrap_or("")).ok_or("operator")?;
    let param = v[op.param_name()].as_u64().ok_or("param")? as u32;
    Config::new(op, v["dim"].as_u64().ok_or("dim")? as u32, param).map_err(|e| e.to_string())
}

fn id_kind_of(v: &Value) -> Result<IdKind, String> {
    IdKind::from_name(v.as_str().unwrap_or("")).ok_or_else(|| "id kind".to_owned())
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn opt_u64(v: &Value) -> Option<u64> {
    v.as_u64()
}

/// Compares an error with the fixture's class and payload.
fn check_error(err: &SemqError, expect: &Value) -> Result<(), String> {
    let class = expect["error"].as_str().unwrap_or("");
    if err.class() != class {
        return Err(format!("expected {class}, got {} ({err})", err.class()));
    }
    let same = |name: &str, got: Option<u64>| -> Result<(), String> {
        match expect.get(name) {
            Some(v) if !v.is_null() || got.is_some() => {
                if opt_u64(v) != got {
                    return Err(format!("{name}: expected {v}, got {got:?} ({err})"));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    };
    same("row", err.row())?;
    same("field", err.field())?;
    same("section", err.section().map(|s| u64::from(s.number())))?;
    if let Some(w) = expect.get("which").and_then(Value::as_str) {
        let got = err.which().map(|w| w.name()).unwrap_or("none");
        if got != w {
            return Err(format!("which: expected {w}, got {got}"));
        }
    }
    Ok(())
}

fn parse_id(kind: IdKind, text: &str) -> Result<Id, String> {
    match kind {
        IdKind::U64 => text.parse().map(Id::U64).map_err(|e| e.to_string()),
        IdKind::Utf8 => Ok(Id::Utf8(text.to_owned())),
    }
}

fn load(rel: &Value) -> Result<Encoding, String> {
    Encoding::open(path(rel)).map_err(|e| format!("{}: {e}", rel))
}

#[test]
fn encode_cases() {
    run_all("encode", 118, |c| {
        let config = config_of(&c["config"])?;
        let kind = id_kind_of(&c["id_kind"])?;
        let vectors = f32s(&read(&c["vectors"]));
        let ids_json: Vec<String> =
            serde_json::from_slice(&read(&c["ids"])).map_err(|e| e.to_string())?;
        let ids = match kind {
            IdKind::U64 => IdList::U64(
                ids_json
                    .iter()
                    .map(|s| s.parse::<u64>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.to_string())?,
            ),
            IdKind::Utf8 => IdList::Utf8(ids_json.iter().map(|s| s.as_bytes().to_vec()).collect()),
        };
        if ids.len() as u64 != c["n"].as_u64().unwrap_or(u64::MAX) {
            return Err("n does not match the ids".into());
        }
        // The generator handed the manifest to the encoder sorted by key.
        let mut pairs: Vec<(String, String)> = c["manifest"]
            .as_object()
            .ok_or("manifest")?
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
            .collect();
        pairs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let expect = &c["expect"];
        let result = semq::encode(config, &ids, &vectors, &pairs);
        if expect.get("error").is_some() {
            return match result {
                Ok(_) => Err("encoded, expected an error".into()),
                Err(e) => check_error(&e, expect),
            };
        }
        let e = result
            .map_err(|e| format!("{} {e} row {:?} field {:?}", e.class(), e.row(), e.field()))?;
        if e.image() != read(&expect["file"]).as_slice() {
            return Err("file bytes differ".into());
        }
        if to_hex(e.content_digest()) != expect["content_digest"].as_str().unwrap_or("") {
            return Err("content digest differs".into());
        }
        if to_hex(e.state_id()) != expect["state_id"].as_str().unwrap_or("") {
            return Err("state id differs".into());
        }
        if e.unpack() != read(&expect["symbols"]) {
            return Err("symbols differ".into());
        }
        if let Some(r) = expect.get("representatives") {
            let want = f32s(&read(r));
            let got = e.decode();
            if want.len() != got.len() {
                return Err("representative count differs".into());
            }
            if let Some(i) = (0..want.len()).find(|&i| want[i].to_bits() != got[i].to_bits()) {
                return Err(format!(
                    "representative {i}: expected {:e}, got {:e}",
                    want[i], got[i]
                ));
            }
        }
        // The written file reads back as the same state.
        let back = Encoding::from_slice(e.image()).map_err(|e| e.to_string())?;
        if back != e {
            return Err("image does not read back".into());
        }
        Ok(())
    });
}

#[test]
fn load_cases() {
    run_all("load", 91, |c| {
        let expect = &c["expect"];
        let result = Encoding::open(path(&c["file"]));
        // The in-memory reader must agree with the file reader.
        let from_bytes = Encoding::from_slice(&read(&c["file"]));
        if result.is_ok() != from_bytes.is_ok() {
            return Err("open and from_slice disagree".into());
        }
        if expect.get("error").is_some() {
            return match result {
                Ok(_) => Err("loaded, expected an error".into()),
                Err(e) => {
                    check_error(&e, expect)?;
                    check_error(&from_bytes.err().ok_or("from_slice accepted")?, expect)
                }
            };
        }
        let e = result.map_err(|e| format!("{} {e}", e.class()))?;
        match expect.get("show") {
            Some(Value::String(_)) => {
                let want = String::from_utf8(read(&expect["show"])).map_err(|e| e.to_string())?;
                let got = report::show_json(&e);
                if got != want {
                    return Err(format!(
                        "show json differs:\n got  {}\n want {}",
                        clip(&got),
                        clip(&want)
                    ));
                }
            }
            _ => {
                if to_hex(e.state_id()) != expect["state_id"].as_str().unwrap_or("") {
                    return Err("state id differs".into());
                }
            }
        }
        // Writing reproduces the file byte for byte.
        if e.image() != read(&c["file"]).as_slice() {
            return Err("image differs from the file".into());
        }
        Ok(())
    });
}

fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}

#[test]
fn diff_cases() {
    run_all("diff", 25, |c| {
        let reference = load(&c["reference"])?;
        let candidate = load(&c["candidate"])?;
        let expect = &c["expect"];
        let result = reference.diff(&candidate);
        if expect.get("error").is_some() {
            return match result {
                Ok(_) => Err("diffed, expected an error".into()),
                Err(e) => check_error(&e, expect),
            };
        }
        let d = result.map_err(|e| e.to_string())?;
        let want = String::from_utf8(read(&expect["report"])).map_err(|e| e.to_string())?;
        let got = report::diff_json(&d, None);
        if got != want {
            return Err(format!(
                "report differs:\n got  {}\n want {}",
                clip(&got),
                clip(&want)
            ));
        }
        for u in c
            .get("units")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let id = parse_id(reference.id_kind(), u["id"].as_str().unwrap_or(""))?;
            let result = reference.units(&candidate, id.as_ref());
            let ue = &u["expect"];
            if ue.get("error").is_some() {
                match result {
                    Ok(_) => return Err(format!("units({id}) succeeded, expected an error")),
                    Err(e) => check_error(&e, ue)?,
                }
                continue;
            }
            let got: Vec<Value> = result
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|(u, a, b)| serde_json::json!([u, a, b]))
                .collect();
            if Value::Array(got) != *ue {
                return Err(format!("units({id}) differ"));
            }
        }
        Ok(())
    });
}

fn diffs_against(reference: &Encoding, nulls: &Value) -> Result<Vec<semq::Diff>, SemqError> {
    let mut out = Vec::new();
    for n in nulls.as_array().into_iter().flatten() {
        let null = Encoding::open(path(n))?;
        out.push(reference.diff(&null)?);
    }
    Ok(out)
}

#[test]
fn floor_measure_cases() {
    run_all("floor-measure", 11, |c| {
        let reference = load(&c["reference"])?;
        let per_row = c["per_row"].as_bool().unwrap_or(false);
        let expect = &c["expect"];
        let result =
            diffs_against(&reference, &c["nulls"]).and_then(|d| floor::measure(&d, per_row));
        let want = expect
            .get("floor_json")
            .or_else(|| expect.get("library_floor_json"))
            .and_then(Value::as_str);
        match (want, result) {
            (Some(w), Ok(f)) => {
                if f.to_json() != w {
                    return Err(format!("floor differs:\n got  {}\n want {w}", f.to_json()));
                }
                // The canonical text reads back as the same floor.
                let back = Floor::from_json(w.as_bytes()).map_err(|e| e.to_string())?;
                if back != f {
                    return Err("floor does not read back".into());
                }
                Ok(())
            }
            (Some(_), Err(e)) => Err(format!("{} {e}", e.class())),
            (None, Ok(f)) => {
                if expect.get("error").is_some() {
                    Err(format!("measured {}, expected an error", f.to_json()))
                } else {
                    Ok(()) // Only the CLI refuses (a CLI-level rule).
                }
            }
            (None, Err(e)) => {
                if expect.get("error").is_none() {
                    return Err(format!("unexpected {} {e}", e.class()));
                }
                check_error(&e, expect)
            }
        }
    });
}

#[test]
fn gate_cases() {
    run_all("gate", 32, |c| {
        let reference = load(&c["reference"])?;
        let candidate = load(&c["candidate"])?;
        let floor = Floor::from_json(&read(&c["floor"])).map_err(|e| e.to_string())?;
        let per_row = c["per_row"].as_bool().unwrap_or(false);
        let expect = &c["expect"];
        let result = reference.diff(&candidate).and_then(|d| {
            Ok((
                floor::evaluate(&d, &floor, per_row)?,
                floor::within(&d, &floor)?,
            ))
        });
        if expect.get("error").is_some() {
            return match result {
                Ok(_) => Err("evaluated, expected an error".into()),
                Err(e) => check_error(&e, expect),
            };
        }
        let (verdict, within) = result.map_err(|e| format!("{} {e}", e.class()))?;
        if Some(within) != expect["within"].as_bool() || verdict.within() != within {
            return Err(format!("within: got {within}"));
        }
        let v = &expect["verdict"];
        let reasons: Vec<&str> = verdict.reasons.iter().map(|r| r.name()).collect();
        let rows: Vec<String> = verdict.rows.iter().map(|id| id.to_string()).collect();
        if Some(verdict.passed) != v["passed"].as_bool()
            || serde_json::json!(reasons) != v["reasons"]
            || serde_json::json!(rows) != v["rows"]
        {
            return Err(format!("verdict differs: {verdict:?}"));
        }
        if !per_row && verdict.passed != within {
            return Err("without per_row, passed must equal within".into());
        }
        Ok(())
    });
}

#[test]
fn floor_read_cases() {
    run_all("floor-read", 68, |c| {
        let expect = &c["expect"];
        let result = Floor::from_json(&read(&c["input"]));
        match (expect.get("floor_json").and_then(Value::as_str), result) {
            (Some(w), Ok(f)) if f.to_json() == w => Ok(()),
            (Some(w), Ok(f)) => Err(format!("floor differs:\n got  {}\n want {w}", f.to_json())),
            (Some(_), Err(e)) => Err(format!("rejected: {e}")),
            (None, Ok(f)) => Err(format!("accepted {}", f.to_json())),
            (None, Err(e)) => check_error(&e, expect),
        }
    });
}

#[test]
fn concat_cases() {
    run_all("concat", 8, |c| {
        let parts: Vec<Encoding> = c["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(load)
            .collect::<Result<_, _>>()?;
        let expect = &c["expect"];
        let result = concat(&parts);
        if expect.get("error").is_some() {
            return match result {
                Ok(_) => Err("concatenated, expected an error".into()),
                Err(e) => check_error(&e, expect),
            };
        }
        let e = result.map_err(|e| e.to_string())?;
        if to_hex(e.state_id()) != expect["state_id"].as_str().unwrap_or("") {
            return Err("state id differs".into());
        }
        if let Some(f) = expect.get("file") {
            if e.image() != read(f).as_slice() {
                return Err("file bytes differ".into());
            }
        }
        Ok(())
    });
}

#[test]
fn published_vectors() {
    let config = Config::quant(4, 4).unwrap();
    let empty = semq::encode::<&str, &str>(config, &IdList::U64(vec![]), &[], &[]).unwrap();
    assert_eq!(empty.image().len(), 96);
    assert_eq!(
        to_hex(empty.state_id()),
        "ef4d1522eb158aa9b6b83cd5d51f80ea2cc59ac3aeb45b69a1c28c99375b55b9"
    );
    let one = semq::from_symbols(
        config,
        &IdList::U64(vec![7]),
        &[7, 0, 4, 3],
        &[("encoder", "x")],
    )
    .unwrap();
    assert_eq!(one.row(0), Some(&[7u8, 7][..]));
    assert_eq!(
        to_hex(one.content_digest()),
        "1a3d8e8bfbf3429525d0bc11e18a17b75ea49af40b6b441f6863444f71230489"
    );
    assert_eq!(
        to_hex(one.state_id()),
        "07d119f5a0a76de95bd4b41110d6005e6fc38cfc398421dd15df2be68adf9f85"
    );
    let utf8 = semq::encode::<&str, &str>(config, &IdList::Utf8(vec![]), &[], &[]).unwrap();
    assert_eq!(utf8.image().len(), 104);
    assert_eq!(
        to_hex(utf8.content_digest()),
        "a9ca08c2d5add106d94a2aaf339892f05f14a29c11ea610a80b99e7939e339da"
    );
    let ok = semq::encode::<&str, &str>(
        config,
        &IdList::U64(vec![1]),
        &[1.0, 2f32.powi(-5), 0.0, 0.0],
        &[],
    )
    .unwrap();
    assert_eq!(
        to_hex(ok.content_digest()),
        "343884085d382fc6fe0f696f9e0830f53dd4ef626ce4849a4446e5d77982f7e8"
    );
    let bad = semq::encode::<&str, &str>(
        config,
        &IdList::U64(vec![1]),
        &[1.0, f32::from_bits(0x3d01_6f00), 0.0, 0.0],
        &[],
    )
    .unwrap_err();
    assert_eq!((bad.class(), bad.row()), ("InvalidInput", Some(0)));
    let orbit = Config::orbit(4, 1 << 30).unwrap();
    let o = semq::encode::<&str, &str>(
        orbit,
        &IdList::U64(vec![1]),
        &[1.0 + 2f32.powi(-12), 0.0, 0.0, 0.0],
        &[],
    )
    .unwrap();
    assert_eq!(
        to_hex(o.content_digest()),
        "fd2ff6dd6066884396d186de1f7467cf0b8d0a0e3eda1ba6e943d832ce226f0b"
    );
    assert_eq!(one.find(IdRef::U64(7)), Some(0));
}
