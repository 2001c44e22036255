//! `semq show`, `semq diff` (with floor gating), `semq floor` and
//! `semq version`: the upstream command's output, byte for byte.

use rayon::prelude::*;
use std::fs;
use std::io::Write;
use std::path::Path;

use qemfs::semq::floor::{self, Floor, Verdict};
use qemfs::semq::report::{
    diff_json, gate_messages, gate_text, per_row_warning, show_json, write_diff_text,
    write_show_text,
};
use qemfs::semq::{Diff, Encoding, SemqError};

use crate::exit::{Failure, DIFFERENT, OK};
use crate::out::Stdout;
use crate::semq_args::{DiffArgs, FloorArgs, ShowArgs, VersionArgs};

/// Loads a file, reporting failures as the upstream command does:
/// `<path>: <message>`, with Python's wording for operating system errors.
pub fn load(path: &Path) -> Result<Encoding, Failure> {
    Encoding::open(path).map_err(|e| Failure::file(path, semq_message(&e, path)))
}

/// The message of a library error; I/O errors read as Python's `OSError`
/// (`[Errno 2] No such file or directory: 'x.semq'`), which scripts match.
pub fn semq_message(e: &SemqError, path: &Path) -> String {
    match e {
        SemqError::Io { source, .. } => os_error(source, path),
        other => other.message(),
    }
}

/// Python's `str(OSError)` for `open(path)`.
pub fn os_error(e: &std::io::Error, path: &Path) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let text = std::io::Error::from_raw_os_error(code).to_string();
            // Rust appends " (os error N)" to the C library's text.
            let text = text
                .strip_suffix(&format!(" (os error {code})"))
                .unwrap_or(&text)
                .to_string();
            format!(
                "[Errno {code}] {text}: {}",
                qemfs::python_json::str_repr(&path.to_string_lossy())
            )
        }
        None => e.to_string(),
    }
}

pub fn show(args: &ShowArgs) -> Result<u8, Failure> {
    let e = load(&args.file)?;
    let mut out = Stdout::new();
    if args.json {
        out.write_all(show_json(&e).as_bytes())?;
        out.done()?;
        return Ok(OK);
    }
    write_show_text(&mut out, &e, args.limit)?;
    out.done()?;
    Ok(OK)
}

/// The floor gate's inputs, checked against the diff before anything is
/// printed.
struct Gate {
    floor: Floor,
    verdict: Verdict,
    within: bool,
}

fn read_floor(path: &Path) -> Result<Floor, Failure> {
    let bytes = fs::read(path)
        .map_err(|e| Failure::file(path, format!("invalid floor: {}", os_error(&e, path))))?;
    Floor::from_json(&bytes)
        .map_err(|e| Failure::file(path, format!("invalid floor: {}", e.message())))
}

/// The messages of the upstream command for a floor that does not fit the
/// diff; `evaluate` reports the same conditions, checked here first so the
/// wording is the command's.
fn check_floor_fits(path: &Path, floor: &Floor, diff: &Diff, per_row: bool) -> Result<(), Failure> {
    let problem = if floor.config() != diff.config {
        Some("floor was measured with a different config".to_string())
    } else if floor.id_kind() != diff.id_kind {
        Some("floor was measured with a different id kind".to_string())
    } else if floor.reference_id() != &diff.reference_id {
        Some("floor was measured against a different reference".to_string())
    } else if per_row && floor.max_hamming().is_none() {
        Some(
            "floor has no per-row data (max_hamming); measure it again with the per-row \
             check; measure it with `semq floor --per-row`"
                .to_string(),
        )
    } else {
        None
    };
    match problem {
        Some(message) => Err(Failure::file(path, message)),
        None => Ok(()),
    }
}

pub fn diff(args: &DiffArgs) -> Result<u8, Failure> {
    if args.per_row && args.floor.is_none() {
        return Err(Failure::plain("--per-row needs --floor"));
    }
    // Loading verifies each file's digests (SHA-256 over all of it, most of
    // the time); the two run at once. The reference's error still wins.
    let (reference, candidate) = rayon::join(|| load(&args.reference), || load(&args.candidate));
    let (reference, candidate) = (reference?, candidate?);
    let report = reference
        .diff(&candidate)
        .map_err(|e| Failure::plain(e.message()))?;
    let gate = match &args.floor {
        None => None,
        Some(path) => {
            let floor = read_floor(path)?;
            check_floor_fits(path, &floor, &report, args.per_row)?;
            let verdict = floor::evaluate(&report, &floor, args.per_row)
                .map_err(|e| Failure::file(path, e.message()))?;
            let within = verdict.within();
            Some(Gate {
                floor,
                verdict,
                within,
            })
        }
    };

    if let Some(g) = &gate {
        if args.per_row {
            if let Some(w) = per_row_warning(&g.floor) {
                eprint!("{w}");
            }
        }
    }
    let mut out = Stdout::new();
    if args.json {
        let g = gate.as_ref().map(|g| (g.within, &g.verdict));
        out.write_all(diff_json(&report, g).as_bytes())?;
    } else {
        write_diff_text(&mut out, &report, args.limit)?;
        if let Some(g) = &gate {
            let passed = args.per_row.then_some(g.verdict.passed);
            out.write_all(gate_text(g.within, passed).as_bytes())?;
        }
    }
    out.done()?;

    let Some(g) = gate else {
        return Ok(OK);
    };
    eprint!("{}", gate_messages(&report, &g.verdict, args.limit));
    Ok(if g.verdict.passed { OK } else { DIFFERENT })
}

pub fn floor(args: &FloorArgs) -> Result<u8, Failure> {
    if args.min_nulls < 1 {
        return Err(Failure::plain("--min-nulls must be at least 1"));
    }
    let given = args.nulls.len();
    if (given as i64) < args.min_nulls {
        return Err(Failure::plain(format!(
            "a floor needs at least {} null rebuilds, got {given}; pass --min-nulls to lower \
             the requirement explicitly",
            args.min_nulls
        )));
    }
    let reference = load(&args.reference)?;
    // Nulls are loaded (digests verified) and compared in parallel; the
    // first failure in argument order is the one reported, as when they
    // were taken one by one.
    let results: Vec<Result<_, Failure>> = args
        .nulls
        .par_iter()
        .map(|path| {
            reference
                .diff(&load(path)?)
                .map_err(|e| Failure::file(path, e.message()))
        })
        .collect();
    let mut diffs = Vec::with_capacity(given);
    for d in results {
        diffs.push(d?);
    }
    let floor = floor::measure(&diffs, args.per_row).map_err(|e| Failure::plain(e.message()))?;
    let mut out = Stdout::new();
    writeln!(out, "{}", floor.to_json())?;
    out.done()?;
    Ok(OK)
}

pub fn version(args: &VersionArgs) -> Result<u8, Failure> {
    let version = env!("CARGO_PKG_VERSION");
    let arch = std::env::consts::ARCH;
    let os = std::env::consts::OS;
    let build = option_env!("QEMFS_BUILD_ID").unwrap_or("release");
    let mut out = Stdout::new();
    if args.json {
        writeln!(
            out,
            "{{\"sdk_version\": \"{version}\", \"core_version\": \"qemfs {version}\", \
             \"backend\": {{\"orbit\": \"rust\", \"phase\": \"rust\", \"quant\": \"rust\"}}, \
             \"build_id\": \"{build}\", \"platform\": \"{os}\", \"architecture\": \"{arch}\", \
             \"runtime\": \"rust\"}}"
        )?;
    } else {
        writeln!(out, "sdk_version: {version}")?;
        writeln!(out, "core_version: qemfs {version}")?;
        writeln!(
            out,
            "backend: {{'orbit': 'rust', 'phase': 'rust', 'quant': 'rust'}}"
        )?;
        writeln!(out, "build_id: {build}")?;
        writeln!(out, "platform: {os}")?;
        writeln!(out, "architecture: {arch}")?;
        writeln!(out, "runtime: rust")?;
    }
    out.done()?;
    Ok(OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_read_like_python() {
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            os_error(&e, Path::new("x.semq")),
            "[Errno 2] No such file or directory: 'x.semq'"
        );
    }
}
