//! The `qem` command end to end: every subcommand on the conformance
//! fixtures and on files made in a temporary folder, with its error paths
//! and exit codes.

use assert_cmd::Command;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/conformance/qem")
}

fn qem() -> Command {
    Command::cargo_bin("qem").unwrap()
}

fn entries() -> Vec<Value> {
    let m: Value =
        serde_json::from_str(&fs::read_to_string(fixtures().join("manifest.json")).unwrap())
            .unwrap();
    m["entries"].as_array().unwrap().clone()
}

fn accepted() -> Vec<Value> {
    entries()
        .into_iter()
        .filter(|e| e["expected"] == "accepted")
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn name(e: &Value) -> String {
    e["name"].as_str().unwrap().to_string()
}

#[test]
fn hash_equals_the_reference_dense_sha256() {
    let dir = fixtures();
    let all = accepted();
    let files: Vec<String> = all.iter().map(|e| format!("{}.qem", name(e))).collect();
    let out = qem()
        .current_dir(&dir)
        .arg("hash")
        .args(&files)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), all.len());
    for (line, e) in lines.iter().zip(&all) {
        let want = format!("{}  {}.qem", e["dense_sha256"].as_str().unwrap(), name(e));
        assert_eq!(*line, want);
    }
    // --file hashes the bytes.
    let first = &all[0];
    qem()
        .current_dir(&dir)
        .args(["hash", "--file", &format!("{}.qem", name(first))])
        .assert()
        .success()
        .stdout(format!(
            "{}  {}.qem\n",
            first["qem_sha256"].as_str().unwrap(),
            name(first)
        ));
}

#[test]
fn validate_accepts_good_files_and_rejects_every_bad_one() {
    let dir = fixtures();
    for e in entries() {
        let file = format!("{}.qem", name(&e));
        let out = qem()
            .current_dir(&dir)
            .args(["validate", &file])
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        if e["expected"] == "accepted" {
            assert!(out.status.success(), "{file}: {stdout}");
            assert_eq!(stdout, format!("{file}: OK\n"));
        } else {
            assert_eq!(out.status.code(), Some(2), "{file} accepted: {stdout}");
            assert!(stdout.starts_with(&format!("{file}: FAILED: ")), "{stdout}");
        }
    }
}

/// A damaged file is refused by every conversion that reads its content,
/// and the message names the damaged file, not the output being written.
#[test]
fn conversions_of_a_damaged_file_name_the_file() {
    let dir = fixtures();
    let mut refused = std::collections::BTreeMap::<&str, usize>::new();
    for e in entries().iter().filter(|e| e["expected"] != "accepted") {
        let input = dir.join(format!("{}.qem", name(e)));
        for extension in ["npy", "zarr", "qem"] {
            let tmp = tempfile::tempdir().unwrap();
            let output = tmp.path().join(format!("out.{extension}"));
            let out = qem()
                .arg("convert")
                .arg(&input)
                .arg(&output)
                .output()
                .unwrap();
            if out.status.success() {
                // Damage that only full validation sees (the spatial
                // index, say) does not stop a conversion.
                continue;
            }
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(
                stderr.starts_with(&format!("error: {}: ", input.display())),
                "{} -> out.{extension}: {stderr}",
                name(e)
            );
            assert!(
                fs::read_dir(tmp.path()).unwrap().next().is_none(),
                "{} -> out.{extension} left files behind",
                name(e)
            );
            *refused.entry(extension).or_default() += 1;
        }
    }
    // Damage in the body reaches each kind of output.
    for extension in ["npy", "zarr", "qem"] {
        assert!(
            refused.get(extension).is_some_and(|&n| n >= 3),
            "{refused:?}"
        );
    }
}

#[test]
fn npy_to_qem_to_npy_round_trips_every_accepted_array() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    for e in accepted() {
        let n = name(&e);
        let source = dir.join(format!("{n}.npy"));
        let qem_path = tmp.path().join(format!("{n}.qem"));
        let back = tmp.path().join(format!("{n}.npy"));
        qem()
            .arg("convert")
            .arg(&source)
            .arg(&qem_path)
            .assert()
            .success();
        qem()
            .arg("convert")
            .arg(&qem_path)
            .arg(&back)
            .assert()
            .success();
        let (a, b) = (fs::read(&source).unwrap(), fs::read(&back).unwrap());
        let (ha, hb) = (
            qemfs::npy::parse_header(&a).unwrap(),
            qemfs::npy::parse_header(&b).unwrap(),
        );
        assert_eq!((ha.dtype, &ha.shape), (hb.dtype, &hb.shape), "{n}");
        assert_eq!(&a[ha.data_offset..], &b[hb.data_offset..], "{n}");
    }
}

#[test]
fn reencoding_keeps_measurements_and_metadata() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    for n in [
        "u16-invalid-mask-33x40",
        "f32-special-13x7",
        "scaled-three-regions-9x9",
        "u16-unknown-fields",
    ] {
        let source = dir.join(format!("{n}.qem"));
        let out = tmp.path().join(format!("{n}.qem"));
        qem()
            .arg("convert")
            .arg(&source)
            .arg(&out)
            .args(["--chunk-scans", "7"])
            .assert()
            .success();
        let hash = |p: &Path| text(&qem().arg("hash").arg(p).output().unwrap().stdout);
        assert_eq!(
            hash(&source).split_whitespace().next(),
            hash(&out).split_whitespace().next(),
            "{n}"
        );
        // Same measurements and metadata: exit 0, though the chunking differs.
        let diff = qem().arg("diff").arg(&source).arg(&out).output().unwrap();
        assert_eq!(diff.status.code(), Some(0), "{n}: {}", text(&diff.stdout));
        let show = |p: &Path| -> Value {
            serde_json::from_slice(
                &qem()
                    .args(["show", "--json"])
                    .arg(p)
                    .output()
                    .unwrap()
                    .stdout,
            )
            .unwrap()
        };
        let (a, b) = (show(&source), show(&out));
        assert_eq!(
            a["summary"]["invalid_pixels"],
            b["summary"]["invalid_pixels"]
        );
        assert_eq!(
            a["header"]["scientific_metadata"],
            b["header"]["scientific_metadata"]
        );
        let frames = a["summary"]["frames"].as_u64().unwrap();
        assert_eq!(b["summary"]["chunk_scans"][0], frames.min(7));
        if frames > 7 {
            assert!(text(&diff.stdout).contains("chunking"));
        }
        if n == "u16-unknown-fields" {
            let unknown: Vec<&String> = a["header"]
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| !b["header"].as_object().unwrap().contains_key(*k))
                .collect();
            assert!(unknown.is_empty(), "lost members {unknown:?}");
        }
    }
}

#[test]
fn diff_reports_measurement_differences() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    // Change one value of one frame and store it again.
    let source = fs::read(dir.join("u8-mixed-13x7.npy")).unwrap();
    let header = qemfs::npy::parse_header(&source).unwrap();
    let mut changed = source.clone();
    let frame_bytes = 13 * 7;
    let at = header.data_offset + 4 * frame_bytes + 10;
    changed[at] = changed[at].wrapping_add(3);
    fs::write(tmp.path().join("changed.npy"), &changed).unwrap();
    let b = tmp.path().join("changed.qem");
    qem()
        .arg("convert")
        .arg(tmp.path().join("changed.npy"))
        .arg(&b)
        .arg("--metadata")
        .arg(write_json(tmp.path(), &serde_json::json!({})))
        .assert()
        .success();
    let out = qem()
        .arg("diff")
        .arg("--json")
        .arg(dir.join("u8-mixed-13x7.qem"))
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["measurements"]["differing_frames"], 1);
    assert_eq!(
        report["measurements"]["first_differing_scans"][0],
        serde_json::json!([0, 4])
    );
    assert_eq!(report["measurements"]["max_abs_difference"], 3.0);
    // The fixture carries calibration our plain conversion does not.
    assert!(!report["scientific_metadata"].as_array().unwrap().is_empty());
    qem()
        .arg("diff")
        .arg(dir.join("u8-mixed-13x7.qem"))
        .arg(dir.join("u8-header-pretty-json.qem"))
        .assert()
        .code(0);
}

fn write_json(dir: &Path, v: &Value) -> PathBuf {
    let p = dir.join("meta.json");
    fs::write(&p, v.to_string()).unwrap();
    p
}

#[test]
fn convert_merges_metadata_and_reads_raw_input() {
    let tmp = tempfile::tempdir().unwrap();
    let raw: Vec<u8> = (0..2 * 3 * 4 * 5u32)
        .flat_map(|i| ((i * 7) as u16).to_le_bytes())
        .collect();
    fs::write(tmp.path().join("scan.raw"), &raw).unwrap();
    let meta = write_json(
        tmp.path(),
        &serde_json::json!({"source_metadata": {"instrument": "test rig"}}),
    );
    let out = tmp.path().join("scan.qem");
    qem()
        .arg("convert")
        .arg(tmp.path().join("scan.raw"))
        .arg(&out)
        .args(["--shape", "2,3,4,5", "--dtype", "uint16", "--metadata"])
        .arg(&meta)
        .assert()
        .success();
    let shown: Value = serde_json::from_slice(
        &qem()
            .args(["show", "--json"])
            .arg(&out)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(shown["summary"]["shape"], serde_json::json!([2, 3, 4, 5]));
    assert_eq!(
        shown["header"]["scientific_metadata"]["source_metadata"]["instrument"],
        "test rig"
    );
    // Raw input of the wrong length, or without a shape, is refused.
    qem()
        .arg("convert")
        .arg(tmp.path().join("scan.raw"))
        .arg(tmp.path().join("bad.qem"))
        .args(["--shape", "2,3,4,6", "--dtype", "uint16"])
        .assert()
        .code(2);
    qem()
        .arg("convert")
        .arg(tmp.path().join("scan.raw"))
        .arg(tmp.path().join("bad.qem"))
        .assert()
        .code(2);
    assert!(!tmp.path().join("bad.qem").exists());
}

#[test]
fn tiff_pages_hold_the_frames() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("frames.tiff");
    qem()
        .arg("convert")
        .arg(dir.join("u16-mixed-chunks-9x9.qem"))
        .arg(&out)
        .assert()
        .success();
    let tiff = fs::read(&out).unwrap();
    let npy = fs::read(dir.join("u16-mixed-chunks-9x9.npy")).unwrap();
    let h = qemfs::npy::parse_header(&npy).unwrap();
    let frames = h.shape[0] * h.shape[1];
    let frame_bytes = h.shape[2] * h.shape[3] * 2;
    // Every page, through the `tiff` crate's decoder, is its frame.
    let mut decoder = tiff::decoder::Decoder::new(std::io::Cursor::new(&tiff)).unwrap();
    for f in 0..frames {
        assert_eq!(
            decoder.dimensions().unwrap(),
            (h.shape[3] as u32, h.shape[2] as u32)
        );
        let tiff::decoder::DecodingResult::U16(page) = decoder.read_image().unwrap() else {
            panic!("frame {f} is not uint16");
        };
        let page: Vec<u8> = page.iter().flat_map(|v| v.to_le_bytes()).collect();
        let want = &npy[h.data_offset + f * frame_bytes..][..frame_bytes];
        assert_eq!(page, want, "frame {f}");
        assert_eq!(decoder.more_images(), f + 1 < frames);
        if f + 1 < frames {
            decoder.next_image().unwrap();
        }
    }
}

#[test]
fn errors_name_the_file_and_exit_2() {
    let dir = fixtures();
    let tmp = tempfile::tempdir().unwrap();
    let missing = qem().args(["show", "nope.qem"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).starts_with("error: nope.qem: "));
    let corrupt = qem()
        .current_dir(&dir)
        .args(["show", "bad-header-checksum.qem"])
        .output()
        .unwrap();
    assert_eq!(corrupt.status.code(), Some(2));
    assert!(text(&corrupt.stderr).starts_with("error: bad-header-checksum.qem: "));
    // A corrupt stream fails the conversion and leaves no output.
    let out = tmp.path().join("x.npy");
    qem()
        .arg("convert")
        .arg(dir.join("bad-rans-final-state.qem"))
        .arg(&out)
        .assert()
        .code(2);
    assert!(!out.exists());
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    // Wrong output type, existing output, bad arguments.
    qem()
        .arg("convert")
        .arg(dir.join("u8-zeros-8x8.qem"))
        .arg(tmp.path().join("x.csv"))
        .assert()
        .code(2);
    let existing = tmp.path().join("keep.npy");
    fs::write(&existing, b"keep").unwrap();
    qem()
        .arg("convert")
        .arg(dir.join("u8-zeros-8x8.qem"))
        .arg(&existing)
        .assert()
        .code(2);
    assert_eq!(fs::read(&existing).unwrap(), b"keep");
    qem()
        .arg("convert")
        .arg(dir.join("u8-zeros-8x8.qem"))
        .arg(&existing)
        .arg("--force")
        .assert()
        .success();
    assert_ne!(fs::read(&existing).unwrap(), b"keep");
    qem().args(["show"]).assert().code(2);
    qem().args(["frobnicate"]).assert().code(2);
    qem().args(["--help"]).assert().success();
    let c = qem().args(["completions", "zsh"]).output().unwrap();
    assert!(c.status.success() && text(&c.stdout).contains("qem"));
}

#[test]
fn ls_and_cat_serve_the_virtual_tree() {
    let dir = fixtures();
    let name = "u8-two-block-chunks";
    let file = format!("{name}.qem");
    let listing = qem()
        .current_dir(&dir)
        .args(["ls", &file])
        .output()
        .unwrap();
    assert!(listing.status.success());
    assert_eq!(
        text(&listing.stdout),
        "data.npy\ndata.tiff\ndata.zarr/\nframes/\nheader.json\ninfo.json\nlogical_sha256\nmask.npy\nraw.qem\nsha256\nvirtual/\n"
    );
    let long = qem()
        .current_dir(&dir)
        .args(["ls", "-l", &file, "frames/0"])
        .output()
        .unwrap();
    assert!(text(&long.stdout).contains("000.npy"));
    let data = qem()
        .current_dir(&dir)
        .args(["cat", &file, "data.npy"])
        .output()
        .unwrap();
    assert!(data.status.success());
    let want = fs::read(dir.join(format!("{name}.npy"))).unwrap();
    let (gh, wh) = (
        qemfs::npy::parse_header(&data.stdout).unwrap(),
        qemfs::npy::parse_header(&want).unwrap(),
    );
    assert_eq!(&data.stdout[gh.data_offset..], &want[wh.data_offset..]);
    qem()
        .current_dir(&dir)
        .args(["cat", &file, "frames"])
        .assert()
        .code(2);
    qem()
        .current_dir(&dir)
        .args(["cat", &file, "nothing.npy"])
        .assert()
        .code(2);
    let broken = qem()
        .current_dir(&dir)
        .args(["cat", "bad-magic.qem", "data.npy"])
        .output()
        .unwrap();
    assert_eq!(broken.status.code(), Some(2));
    assert!(text(&broken.stderr).starts_with("error: bad-magic.qem: "));
}

#[test]
fn a_closed_pipe_ends_quietly() {
    // `qem cat ... | head -c 10`: the reader leaves early; no error, exit 0.
    let dir = fixtures();
    let script = format!(
        "'{}' cat f32-special-128x128.qem data.npy | head -c 10 > /dev/null; echo ${{PIPESTATUS[0]}}",
        assert_cmd::cargo::cargo_bin("qem").display()
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "0");
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn the_gpu_flag_picks_a_backend_that_agrees_with_the_cpu() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/data/scan-u16.qem");
    let cat = |gpu: &str, path: &str| {
        let out = qem()
            .args(["cat", "--gpu", gpu])
            .arg(&file)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        out.stdout
    };
    let info: Value = serde_json::from_slice(&cat("off", "info.json")).unwrap();
    assert_eq!(info["reductions_backend"], "cpu");
    let info: Value = serde_json::from_slice(&cat("wgpu", "info.json")).unwrap();
    let backend = info["reductions_backend"].as_str().unwrap().to_string();
    // CI installs Mesa's software Vulkan, so wgpu must be there.
    if std::env::var_os("CI").is_some() {
        assert_eq!(backend, "wgpu");
    }
    // Counts: every product is exact, so the bytes are identical.
    for path in [
        "virtual/bf.npy",
        "virtual/haadf.npy",
        "virtual/com_row.npy",
        "virtual/mean_dp.npy",
        "virtual/max_dp.npy",
        "virtual/disk-20-30-6.npy",
    ] {
        assert_eq!(cat("wgpu", path), cat("off", path), "{path} on {backend}");
    }
    let bad = qem()
        .args(["cat", "--gpu", "quantum"])
        .arg(&file)
        .arg("info.json")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn help_is_a_subcommand_as_in_qemfs() {
    for sub in ["show", "validate", "convert", "cat"] {
        let help = qem().args(["help", sub]).output().unwrap();
        assert_eq!(help.status.code(), Some(0), "qem help {sub}");
        let flag = qem().args([sub, "--help"]).output().unwrap();
        assert_eq!(text(&help.stdout), text(&flag.stdout), "qem help {sub}");
        assert!(text(&help.stdout).contains(&format!("Usage: qem {sub}")));
    }
    let top = qem().arg("help").output().unwrap();
    assert_eq!(top.status.code(), Some(0));
    assert!(text(&top.stdout).contains("convert"));
}

#[test]
fn chunk_scans_out_of_range_is_refused_before_anything_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.qem");
    for bad in ["0", "1025", "4294967296", "-1"] {
        let r = qem()
            .arg("convert")
            .arg(dir.path().join("missing.npy"))
            .arg(&out)
            .args(["--chunk-scans", bad])
            .output()
            .unwrap();
        assert_eq!(r.status.code(), Some(2), "--chunk-scans {bad}");
        let err = text(&r.stderr);
        assert!(
            err.contains("error:") && !err.contains("missing.npy"),
            "--chunk-scans {bad}: the value is refused before the input is opened: {err}"
        );
        if bad != "-1" {
            assert!(err.contains("--chunk-scans"), "{err}");
        }
    }
    assert!(!out.exists());
}

#[test]
fn dash_as_a_mapped_input_is_refused_saying_why() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["show", "-"][..],
        &["hash", "-"],
        &["convert", "-", "out.qem"],
    ] {
        let assert = qem().current_dir(tmp.path()).args(args).assert().code(2);
        let stderr = String::from_utf8_lossy(&assert.get_output().stderr).into_owned();
        assert!(
            stderr.starts_with("error: -: ") && stderr.contains("standard input is not read here"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
}
