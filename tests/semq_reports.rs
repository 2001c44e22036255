//! The report texts the `semq` CLI prints, checked against the stdout and
//! stderr of the conformance `cli` cases that succeed (exit 0 or 1).
//! Argument parsing, errors and exit codes belong to the CLI.

use std::path::PathBuf;

use qemfs::semq::{floor, report, Encoding, Floor};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/semq"
    ))
}

struct Args {
    positional: Vec<String>,
    json: bool,
    per_row: bool,
    limit: i64,
    floor: Option<String>,
}

fn parse(argv: &[String]) -> Args {
    let mut a = Args {
        positional: vec![],
        json: false,
        per_row: false,
        limit: 20,
        floor: None,
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--json" => a.json = true,
            "--per-row" => a.per_row = true,
            "--limit" => a.limit = it.next().and_then(|v| v.trim().parse().ok()).unwrap_or(20),
            "--floor" => a.floor = it.next().cloned(),
            _ => a.positional.push(arg.clone()),
        }
    }
    a
}

/// What a report writer writes, as text.
fn written(write: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    write(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// (stdout, stderr) of a command that succeeds.
fn outputs_of(argv: &[String]) -> Result<(String, String), String> {
    let a = parse(argv);
    let open = |rel: &str| Encoding::open(root().join(rel)).map_err(|e| e.to_string());
    match a.positional.first().map(String::as_str) {
        Some("show") => {
            let e = open(&a.positional[1])?;
            let out = if a.json {
                report::show_json(&e)
            } else {
                written(|out| report::write_show_text(out, &e, a.limit))
            };
            Ok((out, String::new()))
        }
        Some("diff") => {
            let r = open(&a.positional[1])?;
            let c = open(&a.positional[2])?;
            let d = r.diff(&c).map_err(|e| e.to_string())?;
            let Some(fpath) = &a.floor else {
                let out = if a.json {
                    report::diff_json(&d, None)
                } else {
                    written(|out| report::write_diff_text(out, &d, a.limit))
                };
                return Ok((out, String::new()));
            };
            let text = std::fs::read(root().join(fpath)).map_err(|e| e.to_string())?;
            let f = Floor::from_json(&text).map_err(|e| e.to_string())?;
            let within = floor::within(&d, &f).map_err(|e| e.to_string())?;
            let verdict = floor::evaluate(&d, &f, a.per_row).map_err(|e| e.to_string())?;
            let out = if a.json {
                report::diff_json(&d, Some((within, &verdict)))
            } else {
                written(|out| report::write_diff_text(out, &d, a.limit))
                    + &report::gate_text(within, a.per_row.then_some(verdict.passed))
            };
            let warning = if a.per_row {
                report::per_row_warning(&f)
            } else {
                None
            };
            let err = warning.unwrap_or_default() + &report::gate_messages(&d, &verdict, a.limit);
            Ok((out, err))
        }
        other => Err(format!("not a report command: {other:?}")),
    }
}

#[test]
fn cli_outputs_of_show_and_diff() {
    let text = std::fs::read_to_string(root().join("cases.json")).expect("cases.json");
    let all: Vec<Value> = serde_json::from_str(&text).expect("cases parse");
    let mut checked = 0;
    let mut failures = Vec::new();
    for c in all.iter().filter(|c| c["kind"] == "cli") {
        let argv: Vec<String> = c["argv"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let exit = c["expect"]["exit"].as_i64().unwrap_or(2);
        if exit == 2 || !matches!(argv.first().map(String::as_str), Some("show" | "diff")) {
            continue;
        }
        checked += 1;
        let read = |key: &str| {
            std::fs::read_to_string(root().join(c["expect"][key].as_str().unwrap_or("")))
                .unwrap_or_default()
        };
        let (want, want_err) = (read("stdout"), read("stderr"));
        match outputs_of(&argv) {
            Ok((got, err)) if got == want && err == want_err => {}
            Ok((got, err)) if got == want => {
                failures.push(format!("{}: stderr {err:?}, want {want_err:?}", c["id"]))
            }
            Ok((got, _)) => failures.push(format!(
                "{}: stdout differs\n--- got\n{}\n--- want\n{}",
                c["id"],
                got.chars().take(400).collect::<String>(),
                want.chars().take(400).collect::<String>()
            )),
            Err(e) => failures.push(format!("{}: {e}", c["id"])),
        }
    }
    eprintln!("checked {checked} cli cases");
    assert!(checked >= 70, "only {checked} cli cases were checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
