//! `semq validate` and `semq hash`: many files at once, checked in parallel,
//! reported in the order given.

use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use qemfs::semq::{to_hex, Encoding};

use crate::exit::{Failure, DIFFERENT, ERROR, OK};
use crate::out::Stdout;
use crate::out_of_memory::working_on;
use crate::semq_args::{HashArgs, ValidateArgs};
use crate::semq_cmd::report::semq_message;

pub fn validate(args: &ValidateArgs) -> Result<u8, Failure> {
    let verdicts: Vec<Result<(), String>> = args
        .files
        .par_iter()
        .map(|path| {
            let _working = working_on(path);
            Encoding::open(path).map(|_| ()).map_err(|e| {
                let mut where_ = String::new();
                if let Some(s) = e.section() {
                    where_ = format!(" ({} section", s.name());
                    if let Some(r) = e.row() {
                        where_.push_str(&format!(", row {r}"));
                    }
                    where_.push(')');
                }
                format!("{}: {}{where_}", e.class(), semq_message(&e, path))
            })
        })
        .collect();
    crate::out::print_verdicts(&args.files, verdicts)
}

fn digest_of(path: &Path, content: bool) -> Result<String, String> {
    let _working = working_on(path);
    let e = Encoding::open(path).map_err(|e| semq_message(&e, path))?;
    Ok(to_hex(if content {
        e.content_digest()
    } else {
        e.state_id()
    }))
}

pub fn hash(args: &HashArgs) -> Result<u8, Failure> {
    match &args.check {
        Some(sums) => check(sums, args.content),
        None => print_hashes(&args.files, args.content),
    }
}

fn print_hashes(files: &[PathBuf], content: bool) -> Result<u8, Failure> {
    let digests: Vec<_> = files.par_iter().map(|p| digest_of(p, content)).collect();
    let mut out = Stdout::new();
    let all = qemfs::sums::write_sums(
        &mut out,
        &mut std::io::stderr(),
        files.iter().map(|p| p.as_path()).zip(digests),
    )?;
    out.done()?;
    Ok(if all { OK } else { ERROR })
}

/// A list of digests from standard input (`--check -`, as `sha256sum -c -`).
/// A list names files, so 64 MiB is far beyond any real one; past that the
/// input is refused rather than held.
fn read_stdin_list() -> std::io::Result<String> {
    use std::io::Read;
    const LIMIT: u64 = 64 << 20;
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(LIMIT + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > LIMIT {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "standard input holds more than 64 MiB; not a list of digests",
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Verifies `<hex>  <file>` lines as `sha256sum -c` does: `<file>: OK` or
/// `<file>: FAILED` per line; exit 1 when a digest differs, 2 when a file
/// cannot be read or the list is malformed.
fn check(sums: &Path, content: bool) -> Result<u8, Failure> {
    let text = if sums == Path::new("-") {
        read_stdin_list().map_err(|e| Failure::file(sums, e))?
    } else {
        qemfs::regular_file::read_to_string(sums).map_err(|e| Failure::file(sums, e))?
    };
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = line
            .split_once("  ")
            .filter(|(hex, _)| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
        match parsed {
            Some((hex, file)) => entries.push((hex.to_ascii_lowercase(), PathBuf::from(file))),
            None => {
                return Err(Failure::file(
                    sums,
                    format!("line {}: expected `<64 hex digits>  <file>`", n + 1),
                ))
            }
        }
    }
    let results: Vec<_> = entries
        .par_iter()
        .map(|(_, path)| digest_of(path, content))
        .collect();
    let mut out = Stdout::new();
    let (mut mismatched, mut unreadable) = (0, 0);
    for ((want, path), got) in entries.iter().zip(results) {
        match got {
            Ok(hex) if &hex == want => writeln!(out, "{}: OK", path.display())?,
            Ok(_) => {
                writeln!(out, "{}: FAILED", path.display())?;
                mismatched += 1;
            }
            Err(reason) => {
                writeln!(out, "{}: FAILED open or read", path.display())?;
                out.flush()?;
                eprintln!("error: {}: {reason}", path.display());
                unreadable += 1;
            }
        }
    }
    out.done()?;
    if mismatched > 0 {
        eprintln!("semq: WARNING: {mismatched} computed checksum(s) did NOT match");
    }
    Ok(if unreadable > 0 {
        ERROR
    } else if mismatched > 0 {
        DIFFERENT
    } else {
        OK
    })
}
