//! Backend selection: one log line, never a panic, `None` (the CPU) when
//! nothing usable exists.

use std::cell::RefCell;
use std::process::Command;

use qemfs_gpu::{select, Choice, OpenError, Wgpu};

fn lines_of(choice: Choice) -> (bool, Vec<String>) {
    let lines = RefCell::new(Vec::new());
    let got = select(choice, |l| lines.borrow_mut().push(l.to_string()));
    (got.is_some(), lines.into_inner())
}

#[test]
fn every_choice_logs_one_line_at_most_and_off_logs_none() {
    for choice in [Choice::Auto, Choice::Wgpu, Choice::Cuda] {
        let (_, lines) = lines_of(choice);
        assert_eq!(lines.len(), 1, "{choice}: {lines:?}");
    }
    assert_eq!(lines_of(Choice::Off), (false, Vec::new()));
}

#[test]
fn auto_never_picks_a_software_adapter() {
    let (picked, lines) = lines_of(Choice::Auto);
    if picked {
        assert!(
            !lines[0].contains("Cpu"),
            "auto chose a software adapter: {lines:?}"
        );
    }
}

/// Run by `no_adapter_means_none_and_one_line` in a child process whose
/// Vulkan loader finds no driver and whose wgpu tries Vulkan only.
#[test]
#[ignore = "run in a child process without Vulkan drivers"]
fn child_without_drivers() {
    let (picked, lines) = lines_of(Choice::Wgpu);
    assert!(!picked, "{lines:?}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("no wgpu adapter"), "{lines:?}");
}

#[test]
fn no_adapter_means_none_and_one_line() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_without_drivers",
            "--ignored",
            "--nocapture",
        ])
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .env("WGPU_BACKEND", "vulkan")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn wgpu_is_selected_whenever_an_adapter_exists() {
    match Wgpu::new(true) {
        Ok(_) => assert!(lines_of(Choice::Wgpu).0),
        Err(OpenError::NoAdapter(_)) => assert!(!lines_of(Choice::Wgpu).0),
        Err(e) => panic!("an adapter exists but cannot be used: {e}"),
    }
}
