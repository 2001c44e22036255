//! Every `cli` case of the shared conformance set: the `semq` binary's
//! stdout, stderr and exit status equal the upstream command's.
//!
//! One documented difference: our `semq` has more subcommands than the
//! upstream one, so the two usage errors that list the subcommands name
//! ours; those lines are compared with the list substituted.

use assert_cmd::Command;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/conformance/semq")
}

/// Our subcommands, as the top-level usage error lists them.
fn our_commands() -> Vec<String> {
    use clap::CommandFactory;
    qemfs_cmds::semq_args::Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect()
}

fn with_upstream_commands(text: &str) -> String {
    let ours = our_commands();
    let upstream = ["show", "diff", "floor", "version"];
    let braces = |names: &[&str]| format!("{{{}}}", names.join(","));
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ours: Vec<&str> = ours.iter().map(String::as_str).collect();
    text.replace(&braces(&ours), &braces(&upstream))
        .replace(&quoted(&ours), &quoted(&upstream))
}

#[test]
fn every_cli_case_matches_upstream() {
    let dir = fixtures();
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in cases.iter().filter(|c| c["kind"] == "cli") {
        let id = case["id"].as_str().unwrap();
        let argv: Vec<&str> = case["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let expect = &case["expect"];
        let want_out = std::fs::read(dir.join(expect["stdout"].as_str().unwrap())).unwrap();
        let want_err = std::fs::read(dir.join(expect["stderr"].as_str().unwrap())).unwrap();
        let want_exit = expect["exit"].as_i64().unwrap() as i32;
        let output = Command::cargo_bin("semq")
            .unwrap()
            .args(&argv)
            .current_dir(&dir)
            .output()
            .unwrap();
        ran += 1;
        let got_err = with_upstream_commands(&String::from_utf8_lossy(&output.stderr));
        let mut problems = Vec::new();
        if output.status.code() != Some(want_exit) {
            problems.push(format!("exit {:?}, want {want_exit}", output.status.code()));
        }
        if output.stdout != want_out {
            problems.push(format!(
                "stdout differs:\n--- got\n{}\n--- want\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&want_out)
            ));
        }
        if got_err.as_bytes() != want_err.as_slice() {
            problems.push(format!(
                "stderr differs:\n--- got\n{got_err}\n--- want\n{}",
                String::from_utf8_lossy(&want_err)
            ));
        }
        if !problems.is_empty() {
            failures.push(format!("{id} {argv:?}: {}", problems.join("; ")));
        }
    }
    assert!(ran >= 100, "only {ran} cli cases found");
    assert!(
        failures.is_empty(),
        "{} of {ran} cases differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
