//! The `semq` subcommands beyond the upstream ones, end to end on files in
//! a temporary folder: encode (every conformance encode case), validate,
//! hash, convert, concat, completions, and their error paths.

use assert_cmd::Command;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/conformance/semq")
}

fn semq() -> Command {
    Command::cargo_bin("semq").unwrap()
}

fn cases(kind: &str) -> Vec<Value> {
    let all: Vec<Value> =
        serde_json::from_str(&fs::read_to_string(fixtures().join("cases.json")).unwrap()).unwrap();
    all.into_iter().filter(|c| c["kind"] == kind).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn encode_reproduces_every_conformance_case() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let all = cases("encode");
    for case in &all {
        let id = case["id"].as_str().unwrap();
        let config = &case["config"];
        let op = config["operator"].as_str().unwrap();
        let param = match op {
            "quant" => "--bins",
            "phase" => "--sectors",
            _ => "--scale",
        };
        let param_value = config[&param[2..]].to_string();
        let manifest = tmp.path().join(format!("{id}.manifest.json"));
        fs::write(&manifest, case["manifest"].to_string()).unwrap();
        let out = tmp.path().join(format!("{id}.semq"));
        let output = semq()
            .current_dir(&dir)
            .args(["encode", "--op", op, "--dim", &config["dim"].to_string()])
            .args([param, &param_value])
            .args(["--vectors", case["vectors"].as_str().unwrap()])
            .args(["--ids", case["ids"].as_str().unwrap()])
            .args(["--id-kind", case["id_kind"].as_str().unwrap()])
            .arg("--manifest-json")
            .arg(&manifest)
            .arg(&out)
            .output()
            .unwrap();
        let expect = &case["expect"];
        match expect["file"].as_str() {
            Some(file) => {
                let want = fs::read(dir.join(file)).unwrap();
                if !output.status.success() || fs::read(&out).ok().as_ref() != Some(&want) {
                    failures.push(format!("{id}: {}", text(&output.stderr)));
                }
            }
            None => {
                let stderr = text(&output.stderr);
                let class = expect["error"].as_str().unwrap();
                let message = expect["message"].as_str().unwrap();
                // `error: FILE: reason`, naming the input the error is about.
                let blamed = if message == "duplicate id" {
                    case["ids"].as_str().unwrap().to_string()
                } else if !expect["row"].is_null() {
                    case["vectors"].as_str().unwrap().to_string()
                } else {
                    manifest.display().to_string()
                };
                let ok = output.status.code() == Some(2)
                    && stderr.starts_with(&format!("error: {blamed}: {class}"))
                    && stderr.contains(message)
                    && !out.exists();
                if !ok {
                    failures.push(format!("{id}: expected {blamed}: {class}, got {stderr:?}"));
                }
            }
        }
    }
    assert!(all.len() >= 100);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn encode_reads_text_and_npy_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let vectors: Vec<u8> = [0.5f32, -0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    fs::write(tmp.path().join("v.f32"), &vectors).unwrap();
    fs::write(tmp.path().join("ids.txt"), "b\na\n").unwrap();
    let mut npy = qemfs::npy::encode_header(qemfs::npy::DType::U64, &[2]);
    npy.extend_from_slice(&7u64.to_le_bytes());
    npy.extend_from_slice(&3u64.to_le_bytes());
    fs::write(tmp.path().join("ids.npy"), &npy).unwrap();
    for (ids, kind) in [("ids.txt", "utf8"), ("ids.npy", "u64")] {
        let out = format!("{kind}.semq");
        semq()
            .current_dir(tmp.path())
            .args(["encode", "--op", "quant", "--dim", "4", "--bins", "4"])
            .args([
                "--vectors",
                "v.f32",
                "--ids",
                ids,
                "--manifest",
                "model=x",
                &out,
            ])
            .assert()
            .success();
        let shown = semq()
            .current_dir(tmp.path())
            .args(["show", "--json", &out])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&shown.stdout).unwrap();
        assert_eq!(v["id_kind"], kind);
        assert_eq!(v["n"], 2);
        assert_eq!(v["manifest"]["model"], "x");
    }
}

/// An operator's parameter given to another operator is refused, naming
/// it, before anything is written: `--op quant --sectors 8` built a quant
/// file and ignored the 8.
#[test]
fn parameters_of_another_operator_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let vectors: Vec<u8> = [0.5f32, -0.5, 0.5, 0.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    fs::write(tmp.path().join("v.f32"), &vectors).unwrap();
    fs::write(tmp.path().join("ids.txt"), "a\n").unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["--op", "quant", "--bins", "4", "--sectors", "8"],
            "--sectors does not apply to --op quant",
        ),
        (
            &["--op", "phase", "--sectors", "8", "--scale", "9"],
            "--scale does not apply to --op phase",
        ),
        (
            &["--op", "orbit", "--bins", "4", "--sectors", "8"],
            "--bins and --sectors do not apply to --op orbit",
        ),
        (
            &["--op", "quant", "--bins", "4", "--scale", "50"],
            "--scale does not apply to --op quant",
        ),
    ];
    for (flags, named) in cases {
        semq()
            .current_dir(tmp.path())
            .arg("encode")
            .args(flags)
            .args([
                "--dim",
                "4",
                "--vectors",
                "v.f32",
                "--ids",
                "ids.txt",
                "out.semq",
            ])
            .assert()
            .code(2)
            .stderr(predicates::str::contains(named));
        assert!(!tmp.path().join("out.semq").exists(), "{flags:?}");
    }
    // The operator's own parameter alone is accepted.
    semq()
        .current_dir(tmp.path())
        .args(["encode", "--op", "phase", "--sectors", "8", "--dim", "4"])
        .args(["--vectors", "v.f32", "--ids", "ids.txt", "out.semq"])
        .assert()
        .success();
}

#[test]
fn outputs_are_never_replaced_without_force() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("whole.semq");
    fs::write(&out, b"keep me").unwrap();
    let parts = [
        "concat/part-0.semq",
        "concat/part-1.semq",
        "concat/part-2.semq",
    ];
    let assert = semq()
        .current_dir(&dir)
        .arg("concat")
        .arg(&out)
        .args(parts)
        .assert()
        .code(2);
    assert!(text(&assert.get_output().stderr).contains("already exists"));
    assert_eq!(fs::read(&out).unwrap(), b"keep me");
    semq()
        .current_dir(&dir)
        .arg("concat")
        .arg("--force")
        .arg(&out)
        .args(parts)
        .assert()
        .success();
    assert_eq!(
        fs::read(&out).unwrap(),
        fs::read(dir.join("concat/whole.semq")).unwrap()
    );
    let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "no temporary files left behind");
}

#[test]
fn concat_errors_name_the_offending_part() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("joined.semq");
    for (second, reason) in [
        ("concat/other-config.semq", "parts have different configs"),
        ("concat/other-kind.semq", "parts have different id kinds"),
        ("concat/part-1.semq", "parts share an id (row 0)"),
    ] {
        let assert = semq()
            .current_dir(&dir)
            .arg("concat")
            .arg(&out)
            .args(["concat/part-1.semq", second])
            .assert()
            .code(2);
        let stderr = text(&assert.get_output().stderr);
        let want = format!("error: {second}: {reason}");
        assert!(stderr.starts_with(&want), "{stderr:?}, want {want:?}");
        assert!(!out.exists());
    }
}

#[test]
fn validate_reports_each_file_and_fails_on_any_invalid() {
    let dir = fixtures();
    let good = "files/quant-d4-p2-n3000.semq";
    let output = semq()
        .current_dir(&dir)
        .args(["validate", good, "corrupt/bad-magic.semq", "nope.semq"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let lines: Vec<String> = text(&output.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0], format!("{good}: OK"));
    assert!(lines[1].starts_with("corrupt/bad-magic.semq: FormatError: magic bytes are not SEMQ"));
    assert!(lines[2].contains("No such file"));
    semq()
        .current_dir(&dir)
        .args(["validate", good])
        .assert()
        .success();
}

#[test]
fn hash_prints_and_checks_state_ids() {
    let dir = fixtures();
    let file = "files/quant-d4-p2-n3000.semq";
    let shown: Value = serde_json::from_slice(
        &semq()
            .current_dir(&dir)
            .args(["show", "--json", file])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let state = shown["state_id"].as_str().unwrap();
    let content = shown["content_digest"].as_str().unwrap();
    semq()
        .current_dir(&dir)
        .args(["hash", file])
        .assert()
        .success()
        .stdout(format!("{state}  {file}\n"));
    semq()
        .current_dir(&dir)
        .args(["hash", "--content", file])
        .assert()
        .success()
        .stdout(format!("{content}  {file}\n"));

    let tmp = tempfile::tempdir().unwrap();
    let sums = tmp.path().join("SUMS");
    fs::write(&sums, format!("{state}  {file}\n")).unwrap();
    semq()
        .current_dir(&dir)
        .arg("hash")
        .arg("--check")
        .arg(&sums)
        .assert()
        .success()
        .stdout(format!("{file}: OK\n"));
    fs::write(&sums, format!("{content}  {file}\n")).unwrap();
    semq()
        .current_dir(&dir)
        .arg("hash")
        .arg("--check")
        .arg(&sums)
        .assert()
        .code(1)
        .stdout(format!("{file}: FAILED\n"));
    fs::write(&sums, "not a sums line\n").unwrap();
    semq()
        .current_dir(&dir)
        .arg("hash")
        .arg("--check")
        .arg(&sums)
        .assert()
        .code(2);
    // `--check -` reads the list from standard input, as sha256sum -c - does.
    semq()
        .current_dir(&dir)
        .args(["hash", "--check", "-"])
        .write_stdin(format!("{state}  {file}\n"))
        .assert()
        .success()
        .stdout(format!("{file}: OK\n"));
}

#[test]
fn convert_exports_symbols_vectors_rows_and_jsonl() {
    let dir = fixtures();
    let case = cases("encode")
        .into_iter()
        .find(|c| c["expect"]["representatives"].is_string() && c["id_kind"] == "u64")
        .unwrap();
    let file = dir.join(case["expect"]["file"].as_str().unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, what: &str| {
        let out = tmp.path().join(name);
        semq()
            .arg("convert")
            .arg(&file)
            .arg(&out)
            .args(["--what", what])
            .assert()
            .success();
        fs::read(out).unwrap()
    };
    let symbols = run("s.npy", "symbols");
    let header = qemfs::npy::parse_header(&symbols).unwrap();
    let want = fs::read(dir.join(case["expect"]["symbols"].as_str().unwrap())).unwrap();
    assert_eq!(&symbols[header.data_offset..], &want[..]);
    assert_eq!(header.dtype, qemfs::npy::DType::U8);

    let vectors = run("v.npy", "vectors");
    let header = qemfs::npy::parse_header(&vectors).unwrap();
    let want = fs::read(dir.join(case["expect"]["representatives"].as_str().unwrap())).unwrap();
    assert_eq!(&vectors[header.data_offset..], &want[..]);

    let jsonl = text(&run("r.jsonl", "symbols"));
    let n = case["n"].as_u64().unwrap() as usize;
    assert_eq!(jsonl.lines().count(), n);
    let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert!(first["id"].is_string() && first["symbols"].is_array());

    let rows = run("r.bin", "symbols");
    let image = fs::read(&file).unwrap();
    assert!(!rows.is_empty() || n == 0);
    assert!(image.windows(rows.len().max(1)).any(|w| w == &rows[..]));

    semq()
        .arg("convert")
        .arg(&file)
        .arg(tmp.path().join("x.csv"))
        .assert()
        .code(2);
}

#[test]
fn completions_and_usage_errors() {
    let out = semq().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("semq"));
    semq().args(["validate"]).assert().code(2);
    semq().args(["encode", "--op", "quant"]).assert().code(2);
    semq().args(["--help"]).assert().success();
}

#[test]
fn help_is_a_subcommand_as_in_qemfs() {
    for sub in ["show", "diff", "encode", "hash"] {
        let help = semq().args(["help", sub]).output().unwrap();
        assert_eq!(help.status.code(), Some(0), "semq help {sub}");
        let flag = semq().args([sub, "--help"]).output().unwrap();
        assert_eq!(text(&help.stdout), text(&flag.stdout), "semq help {sub}");
        assert!(text(&help.stdout).contains(&format!("Usage: semq {sub}")));
    }
    // The upstream usage error for a missing command is unchanged.
    let none = semq().output().unwrap();
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none.stderr).starts_with("usage: semq [-h] {show,diff,floor,version,"));
}

/// The rows a failed per-row gate names on stderr, and the "and k more"
/// count, for `--limit limit`.
fn rows_above_max(limit: &str) -> (Vec<String>, Option<i64>) {
    let out = semq()
        .current_dir(fixtures())
        .args(["diff", "floor/base.semq", "floor/cand-everything.semq"])
        .args(["--floor", "floor/floor-3-per-row.floor.json", "--per-row"])
        .args(["--limit", limit])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("rows above max_hamming: "))
        .unwrap_or_else(|| panic!("{stderr}"))
        .to_string();
    let mut ids: Vec<String> = line.split(", ").map(String::from).collect();
    let more = ids
        .last()
        .and_then(|l| l.strip_prefix("and "))
        .and_then(|l| l.strip_suffix(" more"))
        .map(|k| k.parse().unwrap());
    if more.is_some() {
        ids.pop();
    }
    (ids, more)
}

/// `--limit` slices the flagged rows as upstream's Python does (spec §15
/// item 9): a negative limit drops ids from the end and the count of the
/// rest becomes `len - limit`.
#[test]
fn gate_rows_follow_the_upstream_limit_slicing() {
    let (all, more) = rows_above_max("1000");
    assert_eq!(more, None);
    let len = all.len() as i64;
    assert!(len > 3, "{all:?}");
    let (three, more) = rows_above_max("3");
    assert_eq!((three.as_slice(), more), (&all[..3], Some(len - 3)));
    let (negative, more) = rows_above_max("-1");
    assert_eq!(
        (negative.as_slice(), more),
        (&all[..all.len() - 1], Some(len + 1))
    );
}
