//! Inputs found by the fuzz targets in `fuzz/` and by hostile-input
//! sweeps of the commands, fed to the commands that read them: a clean
//! `error: <file>: <reason>` and exit code 2, no panic, and no file left
//! behind.

use assert_cmd::Command;
use std::fs;

/// The `npy_parse` finding, kept in `tests/regressions/` (see
/// `tests/fuzz_regressions.rs` of the core library): a format 3.0 `.npy`
/// whose `descr` starts with a two-byte character made `DType::from_descr`
/// panic.
fn npy_v3_descr_multibyte() -> Vec<u8> {
    fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/regressions/npy-v3-descr-multibyte.npy"
    ))
    .unwrap()
}

fn assert_clean_refusal(out: &std::process::Output, file: &std::path::Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {}: ", file.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn npy_with_a_multibyte_descr_is_refused_by_convert_and_encode() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.npy");
    fs::write(&input, npy_v3_descr_multibyte()).unwrap();

    let qem_out = dir.path().join("out.qem");
    let out = Command::cargo_bin("qem")
        .unwrap()
        .arg("convert")
        .arg(&input)
        .arg(&qem_out)
        .output()
        .unwrap();
    assert_clean_refusal(&out, &input);

    let ids = dir.path().join("ids.txt");
    fs::write(&ids, "a\nb\n").unwrap();
    let semq_out = dir.path().join("out.semq");
    let out = Command::cargo_bin("semq")
        .unwrap()
        .args([
            "encode",
            "--op",
            "quant",
            "--dim",
            "2",
            "--bins",
            "4",
            "--vectors",
        ])
        .arg(&input)
        .arg("--ids")
        .arg(&ids)
        .arg(&semq_out)
        .output()
        .unwrap();
    assert_clean_refusal(&out, &input);

    let mut left: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["bad.npy", "ids.txt"]);
}

/// Found by a hostile-input sweep: a `.qem` whose `metadata.valid_pixels`
/// (a producer's free-form copy of the mask) was edited to disagree with
/// its `valid` mask, the header digest recomputed. The specification makes
/// `valid` the authority and leaves `metadata` free-form, so the file is
/// valid and reads; writing it again as a `.qem` is refused, since the
/// writer keeps the two in agreement, and the refusal names the input
/// (it named the output).
#[test]
fn a_valid_pixels_copy_that_contradicts_the_mask_is_blamed_on_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("forged.qem");
    fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/regressions/qem-valid-pixels-contradict-mask.qem"
        ),
        &input,
    )
    .unwrap();
    let qem = || Command::cargo_bin("qem").unwrap();
    qem().arg("validate").arg(&input).assert().success();
    qem()
        .arg("convert")
        .arg(&input)
        .arg(dir.path().join("out.npy"))
        .assert()
        .success();
    let out = qem()
        .arg("convert")
        .arg(&input)
        .arg(dir.path().join("out.qem"))
        .output()
        .unwrap();
    assert_clean_refusal(&out, &input);
    assert!(String::from_utf8_lossy(&out.stderr).contains("valid_pixels disagrees"));
    assert!(!dir.path().join("out.qem").exists());
}
