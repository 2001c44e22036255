//! `qemfs completions SHELL`: the script bash loads completes the
//! subcommands and the mount's flags (no mount needed).

use std::process::Command;

fn qemfs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qemfs"))
}

/// What bash's completion offers for the words typed so far.
fn bash_completes(script: &str, words: &[&str]) -> String {
    let typed = words.join(" ");
    let program = format!(
        "{script}\nCOMP_WORDS=({typed}); COMP_CWORD={}; COMP_LINE='{typed}'; COMP_POINT=${{#COMP_LINE}}\n\
         _qemfs qemfs \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words.len() - 1
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &program])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bash_completes_subcommands_and_mount_flags() {
    let out = qemfs().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    let offered = bash_completes(&script, &["qemfs", "mo"]);
    assert_eq!(offered.lines().collect::<Vec<_>>(), ["mount"], "{offered}");
    let offered = bash_completes(&script, &["qemfs", "mount", "--cache"]);
    assert!(offered.lines().any(|l| l == "--cache-size"), "{offered}");
    // The detached daemon's entry point is internal and hidden from help.
    let offered = bash_completes(&script, &["qemfs", "''"]);
    let offered: Vec<_> = offered.lines().collect();
    assert!(offered.contains(&"unmount"), "{offered:?}");
    assert!(!offered.contains(&"daemon"), "{offered:?}");
}

#[test]
fn every_shell_gets_a_script_and_a_bad_one_is_refused() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = qemfs().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("qemfs"),
            "{shell}"
        );
    }
    let out = qemfs().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
