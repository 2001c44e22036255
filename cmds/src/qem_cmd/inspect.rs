//! `qem show`, `qem validate` and `qem hash`.

use std::io::Write;
use std::path::Path;

use rayon::prelude::*;
use serde_json::Value;

use qemfs::qem::checksum;
use qemfs::qem::{QemFile, ValidationLevel};

use crate::exit::{Failure, ERROR, OK};
use crate::out::Stdout;
use crate::out_of_memory::working_on;
use crate::qem_args::{HashArgs, ShowArgs, ValidateArgs};

pub fn open(path: &Path) -> Result<QemFile, Failure> {
    QemFile::open(path).map_err(|e| Failure::file(path, e))
}

pub fn show(args: &ShowArgs) -> Result<u8, Failure> {
    let file = open(&args.file)?;
    let mut out = Stdout::new();
    if args.json {
        let backend = args.gpu.accelerator_quiet_on_auto();
        let info =
            qemfs::tree::info_json(&file, &*backend).map_err(|e| Failure::file(&args.file, e))?;
        qemfs::export::json::write_pretty(&info, &mut out)?;
        out.done()?;
        return Ok(OK);
    }
    let s = file.summary();
    let shape = file.shape();
    writeln!(out, "file:            {}", args.file.display())?;
    writeln!(
        out,
        "codec:           {} ({})",
        s["codec"].as_str().unwrap_or(""),
        s["kind"].as_str().unwrap_or("")
    )?;
    writeln!(
        out,
        "dtype:           {} (stored {})",
        file.decoded_dtype().name(),
        file.stored_dtype().name()
    )?;
    writeln!(
        out,
        "shape:           {} x {} x {} x {}  (scan_row, scan_column, detector_row, detector_column)",
        shape[0], shape[1], shape[2], shape[3]
    )?;
    writeln!(out, "frames:          {}", file.frames())?;
    let scans: Vec<usize> = file.chunks().iter().map(|c| c.scans).collect();
    let chunking = match (scans.first(), scans.last()) {
        (Some(first), Some(last)) if scans.len() > 1 && first != last => {
            format!("{} ({first} scans each, last {last})", scans.len())
        }
        (Some(first), _) => format!("{} ({first} scans each)", scans.len()),
        _ => "0".to_string(),
    };
    writeln!(out, "chunks:          {chunking}")?;
    writeln!(out, "file size:       {} bytes", file.file_bytes())?;
    match file.dense_bytes() {
        Some(d) => {
            writeln!(out, "decoded size:    {d} bytes")?;
            writeln!(
                out,
                "compression:     {:.2}x",
                d as f64 / file.file_bytes().max(1) as f64
            )?;
        }
        None => writeln!(out, "decoded size:    too large to address")?,
    }
    if let Some(mask) = file.valid_mask() {
        writeln!(
            out,
            "valid pixels:    {} of {}",
            file.pixels() - mask.invalid_count(),
            file.pixels()
        )?;
    }
    if let Some(regions) = s["intensity_regions"].as_array() {
        writeln!(
            out,
            "regions:         {} calibration region(s)",
            regions.len()
        )?;
    }
    let md = file.metadata();
    for axis in &md.axes {
        if let Some(q) = &axis.sampling {
            writeln!(
                out,
                "sampling:        {} = {} {}",
                axis.name, q.value, q.unit
            )?;
        }
    }
    if let Value::Object(cal) = &s["calibration"] {
        for (path, q) in cal {
            let mark = if q["overridden"] == Value::Bool(true) {
                " (override)"
            } else {
                ""
            };
            writeln!(
                out,
                "calibration:     {path} = {} {}{mark}",
                q["value"],
                q["unit"].as_str().unwrap_or("")
            )?;
        }
    }
    for p in &md.processing {
        writeln!(
            out,
            "processing:      {}{}",
            p.operation,
            if p.changes_measurements {
                " (changes measurements)"
            } else {
                ""
            }
        )?;
    }
    out.done()?;
    Ok(OK)
}

pub fn validate(args: &ValidateArgs) -> Result<u8, Failure> {
    let level = if args.quick {
        ValidationLevel::Quick
    } else {
        ValidationLevel::Full
    };
    // validate_path reports a file truncated under its map as changed.
    let bar = crate::progress::bar(args.files.len() as u64, "validating", false);
    let verdicts: Vec<Result<(), String>> = args
        .files
        .par_iter()
        .map(|path| {
            let _working = working_on(path);
            let result = qemfs::qem::validate_path(path, level)
                .map(|_| ())
                .map_err(|e| format!("FAILED: {e}"));
            bar.inc(1);
            result
        })
        .collect();
    bar.finish_and_clear();
    crate::out::print_verdicts(&args.files, verdicts)
}

/// SHA-256 of the decoded array's C-order little-endian bytes: blocks
/// decoded in batches of bounded size, a block larger than a window in
/// windows ([`qemfs::qem::WINDOW_BYTES`]), so memory never follows the
/// detector size. A float file whose digest disagrees with its
/// `logical_sha256` fails.
pub fn logical_sha256(file: &QemFile) -> Result<String, qemfs::qem::QemError> {
    file.verify_logical()
}

pub fn hash(args: &HashArgs) -> Result<u8, Failure> {
    let digests: Vec<Result<String, String>> = args
        .files
        .par_iter()
        .map(|path| {
            let _working = working_on(path);
            if args.file {
                checksum::sha256_file_hex(path).map_err(|e| e.to_string())
            } else {
                QemFile::open(path)
                    .and_then(|f| logical_sha256(&f))
                    .map_err(|e| e.to_string())
            }
        })
        .collect();
    let mut out = Stdout::new();
    let all = qemfs::sums::write_sums(
        &mut out,
        &mut std::io::stderr(),
        args.files.iter().map(|p| p.as_path()).zip(digests),
    )?;
    out.done()?;
    Ok(if all { OK } else { ERROR })
}
