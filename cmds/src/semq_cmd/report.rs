//! `semq show`, `semq diff` (with floor gating), `semq floor` and
//! `semq version`: the upstream command's output, byte for byte.

use rayon::prelude::*;
use std::fs;
use std::io::Write;
use std::path::Path;

use qemfs::semq::floor::{self, Floor, Verdict};
use qemfs::semq::report::{diff_json, escape_human, show_json};
use qemfs::semq::{to_hex, Diff, Encoding, IdRef, SemqError};

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
                python_repr(&path.to_string_lossy())
            )
        }
        None => e.to_string(),
    }
}

/// `repr()` of a Python string as far as paths need it.
fn python_repr(s: &str) -> String {
    if s.contains('\'') && !s.contains('"') {
        format!("\"{s}\"")
    } else {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

fn escaped(id: IdRef<'_>) -> String {
    match id {
        IdRef::U64(v) => v.to_string(),
        IdRef::Utf8(s) => escape_human(s).into_owned(),
    }
}

/// How many list entries a (possibly negative) `--limit` allows.
fn shown(limit: i64, len: usize) -> usize {
    usize::try_from(limit).map_or(0, |l| l.min(len))
}

pub fn show(args: &ShowArgs) -> Result<u8, Failure> {
    let e = load(&args.file)?;
    let mut out = Stdout::new();
    if args.json {
        out.write_all(show_json(&e).as_bytes())?;
        out.done()?;
        return Ok(OK);
    }
    let c = e.config();
    writeln!(
        out,
        "config:         {} dim={} {}={}",
        c.operator().name(),
        c.dim(),
        c.operator().param_name(),
        c.param()
    )?;
    writeln!(out, "id_kind:        {}", e.id_kind().name())?;
    writeln!(out, "rows:           {}", e.len())?;
    writeln!(out, "content_digest: {}", to_hex(e.content_digest()))?;
    writeln!(out, "state_id:       {}", to_hex(e.state_id()))?;
    writeln!(out, "manifest:       {} pair(s)", e.manifest().len())?;
    for (k, v) in e.manifest().pairs() {
        writeln!(out, "  {} = {}", escape_human(k), escape_human(v))?;
    }
    // Upstream prints min(n, limit) as it is, negative limits included.
    let first = args.limit.min(i64::try_from(e.len()).unwrap_or(i64::MAX));
    writeln!(out, "ids:            first {first} of {}", e.len())?;
    for id in e.ids().take(shown(args.limit, e.len())) {
        writeln!(out, "  {}", escaped(id))?;
    }
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

/// `100/(nulls+1)` with zero decimals, as Python's `.0f` rounds it
/// (half to even on the binary value, which Rust's formatting also does).
fn percent(nulls: u64) -> String {
    format!("{:.0}", 100.0 / (nulls as f64 + 1.0))
}

fn per_row_warning(floor: &Floor) -> Option<String> {
    let nulls = floor.nulls();
    if nulls >= 20 || floor.distinct_nulls() == Some(1) {
        return None;
    }
    let states = match floor.distinct_nulls() {
        Some(d) => format!("{d} of the floor's {nulls} nulls are different states"),
        None => "the floor does not record whether its nulls vary".to_string(),
    };
    Some(format!(
        "warning: {states}, so each check can reject an unchanged rebuild with probability \
         up to 1/{} ({}%); measure the floor from at least 20 nulls for --per-row",
        nulls + 1,
        percent(nulls)
    ))
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
                eprintln!("{w}");
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
            writeln!(out, "within:        {}", python_bool(g.within))?;
            if args.per_row {
                writeln!(out, "passed:        {}", python_bool(g.verdict.passed))?;
            }
        }
    }
    out.done()?;

    let Some(g) = gate else {
        return Ok(OK);
    };
    for change in &report.manifest_changes {
        eprintln!("manifest key {} changed", escape_human(&change.key));
    }
    if !g.verdict.passed {
        let reasons: Vec<&str> = g.verdict.reasons.iter().map(|r| r.name()).collect();
        eprintln!(
            "error: candidate is not within the floor ({})",
            reasons.join(", ")
        );
    }
    if !g.verdict.rows.is_empty() {
        let n = shown(args.limit, g.verdict.rows.len());
        let listed: Vec<String> = g.verdict.rows[..n]
            .iter()
            .map(|id| escaped(id.as_ref()))
            .collect();
        let more = g.verdict.rows.len() - n;
        let tail = if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        };
        eprintln!("rows above max_hamming: {}{tail}", listed.join(", "));
    }
    Ok(if g.verdict.passed { OK } else { DIFFERENT })
}

fn python_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn write_diff_text(out: &mut Stdout, d: &Diff, limit: i64) -> std::io::Result<()> {
    writeln!(out, "reference_id:  {}", to_hex(&d.reference_id))?;
    writeln!(out, "candidate_id:  {}", to_hex(&d.candidate_id))?;
    writeln!(out, "added:         {}", d.added.len())?;
    for id in d.added.iter().take(shown(limit, d.added.len())) {
        writeln!(out, "  + {}", escaped(id.as_ref()))?;
    }
    writeln!(out, "removed:       {}", d.removed.len())?;
    for id in d.removed.iter().take(shown(limit, d.removed.len())) {
        writeln!(out, "  - {}", escaped(id.as_ref()))?;
    }
    writeln!(out, "changed:       {}", d.changed.len())?;
    for (id, h) in d.changed.iter().take(shown(limit, d.changed.len())) {
        writeln!(out, "  ~ {} hamming={h}", escaped(id.as_ref()))?;
    }
    writeln!(out, "unchanged:     {}", d.n_unchanged)?;
    writeln!(out, "manifest:      {} change(s)", d.manifest_changes.len())?;
    let side = |v: &Option<String>| match v {
        Some(s) => escape_human(s).into_owned(),
        None => "<absent>".to_string(),
    };
    for c in &d.manifest_changes {
        writeln!(
            out,
            "  {}: {} -> {}",
            escape_human(&c.key),
            side(&c.before),
            side(&c.after)
        )?;
    }
    Ok(())
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
    fn percentages_round_like_python() {
        assert_eq!(percent(3), "25");
        assert_eq!(percent(4), "20");
        assert_eq!(percent(2), "33");
        assert_eq!(percent(7), "12"); // 12.5 rounds half to even
        assert_eq!(percent(0), "100");
    }

    #[test]
    fn os_errors_read_like_python() {
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(
            os_error(&e, Path::new("x.semq")),
            "[Errno 2] No such file or directory: 'x.semq'"
        );
    }
}
