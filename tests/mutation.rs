//! Structure-aware mutation of valid files: every byte of the envelope and
//! header, and every byte of small bodies (a fixed pseudo-random sample of
//! larger ones), is flipped, and the readers must answer with an error or
//! with exactly the data of the unmodified file, never a panic.
//!
//! Two kinds of flip:
//!
//! * raw: the file's digests are left as they are, so every flip must be
//!   caught (by the header digest, a body checksum block, the semq content
//!   digest or state id) or must not change what is decoded;
//! * resealed: the digests are recomputed after the flip, so the parsers
//!   and decoders behind them meet the flipped byte. Whatever then passes
//!   full validation must be readable by every read path, and the paths must
//!   agree with each other (and, for the codecs whose values are covered by
//!   the spatial index or `logical_sha256`, with the unmodified decode).
//!
//! Each case runs under `catch_unwind`, so a panic is reported with the
//! fixture, the kind of flip and the byte offset.

use rand::{rngs::Xoshiro256PlusPlus, RngExt, SeedableRng};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use qemfs::qem::{checksum::sha256_hex, Codec, Dtype, PixelValues, QemFile, Tile, ValidationLevel};
use qemfs::semq::{identity, Encoding};

#[path = "support/reseal.rs"]
mod reseal;
use reseal::{body_start, reseal_body, reseal_header};

/// Largest decoded array a mutated header may declare before the test stops
/// decoding it (a flip that passes validation with a huge shape would be a
/// finding of its own: it is reported).
const MAX_DENSE: usize = 64 << 20;

fn shared(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/conformance")
        .join(sub)
}

/// The accepted `.qem` fixtures of the conformance manifest.
fn accepted_qem() -> Vec<(String, Vec<u8>)> {
    let dir = shared("qem");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for e in manifest["entries"].as_array().unwrap() {
        if e["expected"] == "accepted" {
            let name = e["name"].as_str().unwrap().to_string();
            let bytes = std::fs::read(dir.join(format!("{name}.qem"))).unwrap();
            out.push((name, bytes));
        }
    }
    assert!(
        out.len() >= 20,
        "the manifest lists {} accepted files",
        out.len()
    );
    out
}

/// Offsets of `region` to flip: all of them when there are at most
/// `limit`, else `limit` of them chosen by a seeded Xoshiro256++ sequence
/// (always including both ends).
fn offsets(region: Range<usize>, limit: usize, seed: u64) -> Vec<usize> {
    let len = region.len();
    if len <= limit {
        return region.collect();
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut picked: Vec<usize> = (0..limit.saturating_sub(2))
        .map(|_| rng.random_range(region.clone()))
        .chain([region.start, region.end - 1])
        .collect();
    picked.sort_unstable();
    picked.dedup();
    picked
}

fn read_all(f: &QemFile) -> Result<Option<Vec<u8>>, String> {
    match f.dense_bytes() {
        Some(n) if n <= MAX_DENSE => {
            let mut out = vec![0u8; n];
            f.read_all(&mut out).map_err(|e| e.to_string())?;
            Ok(Some(out))
        }
        other => Err(format!("opens with a dense size of {other:?} bytes")),
    }
}

/// Every read path once; errors are fine, panics are not.
fn exercise(f: &QemFile) {
    if f.dense_bytes().is_none_or(|n| n > MAX_DENSE) {
        return;
    }
    let mut frame = vec![0u8; f.frame_bytes()];
    let _ = f.read_frame(0, &mut frame);
    let _ = f.spatial_sums(Tile::Px8, 0..f.frames());
    let _ = f.spatial_sums(Tile::Px32, 0..f.frames().min(3));
    if f.pixels() > 0 {
        let _ = f.decode_pixels(&[0, f.pixels() - 1]);
    }
    if let Some(last) = f.blocks().len().checked_sub(1) {
        let _ = f.decode_block(last);
    }
}

/// For a file that passed full validation: the read paths succeed and agree
/// with the whole-array decode `dense`.
fn paths_agree(f: &QemFile, dense: &[u8]) -> Result<(), String> {
    let fb = f.frame_bytes();
    let n = f.frames();
    for frame in [0, n / 2, n - 1] {
        let mut out = vec![0u8; fb];
        f.read_frame(frame, &mut out)
            .map_err(|e| format!("read_frame({frame}) fails after validation: {e}"))?;
        if out[..] != dense[frame * fb..(frame + 1) * fb] {
            return Err(format!("read_frame({frame}) disagrees with read_all"));
        }
    }
    let p = f.pixels();
    let pixels = [0, p / 2, p - 1];
    let streams = f
        .decode_pixels(&pixels)
        .map_err(|e| format!("decode_pixels fails after validation: {e}"))?;
    let e = f.decoded_dtype().size();
    for (k, &px) in pixels.iter().enumerate() {
        for t in 0..n {
            let at = (t * p + px) * e;
            let want = &dense[at..at + e];
            let same = match (&streams.values, f.codec(), f.stored_dtype()) {
                (PixelValues::U16(v), Codec::Integer, Dtype::U8) => {
                    u16::from(want[0]) == v[k * n + t]
                }
                (PixelValues::U16(v), Codec::Integer, _) => {
                    u16::from_le_bytes([want[0], want[1]]) == v[k * n + t]
                }
                (PixelValues::F32Bits(v), Codec::Float, _) => {
                    u32::from_le_bytes(want.try_into().unwrap()) == v[k * n + t]
                }
                // Scaled codes are calibrated per region; read_frame covers it.
                (PixelValues::U16(_), Codec::Scaled, _) => true,
                _ => return Err("decode_pixels returns the wrong value kind".into()),
            };
            if !same {
                return Err(format!(
                    "decode_pixels disagrees with read_all at pixel {px}, frame {t}"
                ));
            }
        }
    }
    if f.codec() == Codec::Integer {
        f.spatial_sums(Tile::Px8, 0..n)
            .map_err(|e| format!("spatial_sums fails after validation: {e}"))?;
    }
    Ok(())
}

/// How far a mutant got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Refused when opened.
    Refused,
    /// Opened, then refused by validation.
    Invalid,
    /// Passed full validation (and every check after it).
    Valid,
}

/// Cases run and how far the mutants got, for the summary line.
#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    refused: usize,
    invalid: usize,
    valid: usize,
    failures: Vec<String>,
}

impl Tally {
    /// Prints the summary (`--nocapture` shows it) and fails the test with
    /// every offset that panicked or broke a rule.
    fn finish(self, test: &str) {
        eprintln!(
            "{test}: {} cases: {} refused at open, {} refused by validation, {} valid",
            self.cases, self.refused, self.invalid, self.valid
        );
        let failures = self.failures;
        assert!(
            failures.is_empty(),
            "{} failing flips, the first ones:\n{}",
            failures.len(),
            failures[..failures.len().min(20)].join("\n")
        );
    }
}

/// Runs `case` for every offset, each under `catch_unwind`, recording
/// panics and broken rules with the byte offset.
fn run_cases(
    tally: &mut Tally,
    what: &str,
    name: &str,
    offsets: &[usize],
    case: impl Fn(usize) -> Result<Outcome, String>,
) {
    let failures = &mut tally.failures;
    for &at in offsets {
        tally.cases += 1;
        match catch_unwind(AssertUnwindSafe(|| case(at))) {
            Ok(Ok(Outcome::Refused)) => tally.refused += 1,
            Ok(Ok(Outcome::Invalid)) => tally.invalid += 1,
            Ok(Ok(Outcome::Valid)) => tally.valid += 1,
            Ok(Err(why)) => failures.push(format!("{name}: {what} flip at byte {at}: {why}")),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{name}: {what} flip at byte {at}: panic: {msg}"));
            }
        }
    }
}

#[test]
fn qem_raw_flips_are_caught_by_the_digests() {
    let mut tally = Tally::default();
    for (name, original) in accepted_qem() {
        let f = QemFile::from_bytes(original.clone()).unwrap();
        let reference = read_all(&f).unwrap().unwrap();
        let start = body_start(&original);
        // The envelope and header: every byte. The body: a sample, since
        // each case rehashes it.
        let mut at = offsets(0..start, usize::MAX, 0);
        at.extend(offsets(start..original.len(), 256, original.len() as u64));
        run_cases(&mut tally, "raw", &name, &at, |at| {
            let mut bytes = original.clone();
            bytes[at] ^= 0x01;
            let Ok(f) = QemFile::from_bytes(bytes) else {
                return Ok(Outcome::Refused);
            };
            exercise(&f);
            if f.validate(ValidationLevel::Full).is_err() {
                return Ok(Outcome::Invalid);
            }
            match read_all(&f)? {
                Some(d) if d == reference => Ok(Outcome::Valid),
                _ => Err("passes full validation but decodes differently".into()),
            }
        });
    }
    assert!(tally.cases > 20_000, "only {} cases", tally.cases);
    tally.finish("qem raw flips");
}

#[test]
fn qem_resealed_header_flips_are_rejected_or_read_consistently() {
    let mut tally = Tally::default();
    for (name, original) in accepted_qem() {
        let f = QemFile::from_bytes(original.clone()).unwrap();
        let reference = read_all(&f).unwrap().unwrap();
        let start = body_start(&original);
        let at = offsets(56..start, usize::MAX, 0);
        run_cases(&mut tally, "resealed header", &name, &at, |at| {
            let mut bytes = original.clone();
            bytes[at] ^= 0x01;
            reseal_header(&mut bytes);
            check_resealed(bytes, &reference)
        });
    }
    tally.finish("qem resealed header flips");
}

#[test]
fn qem_resealed_body_flips_are_rejected_or_read_consistently() {
    let mut tally = Tally::default();
    for (name, original) in accepted_qem() {
        let f = QemFile::from_bytes(original.clone()).unwrap();
        let reference = read_all(&f).unwrap().unwrap();
        let start = body_start(&original);
        let old = sha256_hex(&original[start..]);
        let at = offsets(start..original.len(), 512, 7 + original.len() as u64);
        run_cases(&mut tally, "resealed body", &name, &at, |at| {
            let mut bytes = original.clone();
            bytes[at] ^= 0x01;
            reseal_body(&mut bytes, &old);
            check_resealed(bytes, &reference)
        });
    }
    tally.finish("qem resealed body flips");
}

/// A resealed mutant: open and every read path must not panic; if it
/// passes full validation, every path reads it and they agree; integer and
/// float files must then decode exactly as the original (their values are
/// covered by the spatial index and `logical_sha256`), unless an
/// invalid pixel (outside the index) is all that changed.
fn check_resealed(bytes: Vec<u8>, reference: &[u8]) -> Result<Outcome, String> {
    let Ok(f) = QemFile::from_bytes(bytes) else {
        return Ok(Outcome::Refused);
    };
    exercise(&f);
    if f.validate(ValidationLevel::Full).is_err() {
        return Ok(Outcome::Invalid);
    }
    let dense = read_all(&f)?
        .ok_or_else(|| "passes full validation but cannot be read whole".to_string())?;
    paths_agree(&f, &dense)?;
    let covered = match f.codec() {
        Codec::Float => true,
        Codec::Integer => f.valid_mask().is_none_or(|m| m.invalid_count() == 0),
        Codec::Scaled => false,
    };
    if covered && dense != reference {
        return Err("passes full validation but decodes differently".into());
    }
    Ok(Outcome::Valid)
}

// ----- semq ------------------------------------------------------------

fn semq_fixtures() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for rel in [
        "corrupt/base-orbit.semq",
        "corrupt/base-phase.semq",
        "corrupt/base-phase-packed.semq",
        "corrupt/base-quant.semq",
        "corrupt/base-utf8.semq",
        "files/empty-quant-utf8.semq",
        "files/utf8-escapes-orbit.semq",
        "files/utf8-escapes-phase.semq",
        "files/utf8-escapes-quant.semq",
        "floor/base.semq",
        "files/phase-d4-p16-n3000.semq",
        "files/quant-d384-p8-n400.semq",
    ] {
        let bytes = std::fs::read(shared("semq").join(rel)).unwrap();
        Encoding::from_slice(&bytes).unwrap_or_else(|e| panic!("{rel}: {e}"));
        out.push((rel.to_string(), bytes));
    }
    out
}

/// Everything a reader of a verified state does, checked for consistency.
fn semq_reads(e: &Encoding) -> Result<(), String> {
    let d = e
        .diff(e)
        .map_err(|err| format!("diff with itself fails: {err}"))?;
    if !d.is_empty() {
        return Err("differs from itself".into());
    }
    for (i, id) in e.ids().enumerate() {
        if e.find(id) != Some(i) {
            return Err(format!("id of row {i} is not found at its row"));
        }
        if e.symbols(i).is_none() || e.row(i).is_none() {
            return Err(format!("row {i} cannot be read"));
        }
    }
    let _ = e.decode_rows(0..e.len().min(16));
    Ok(())
}

#[test]
fn semq_raw_flips_are_caught_by_the_digests() {
    let mut tally = Tally::default();
    for (name, original) in semq_fixtures() {
        let at = offsets(0..original.len(), 2048, original.len() as u64);
        run_cases(&mut tally, "raw", &name, &at, |at| {
            for mask in [0x01, 0x80] {
                let mut bytes = original.clone();
                bytes[at] ^= mask;
                if Encoding::from_slice(&bytes).is_ok() {
                    return Err(format!("accepted with byte ^ {mask:#04x}"));
                }
            }
            Ok(Outcome::Refused)
        });
    }
    tally.finish("semq raw flips");
}

#[test]
fn semq_resealed_flips_are_rejected_or_read_consistently() {
    let mut tally = Tally::default();
    for (name, original) in semq_fixtures() {
        let e = Encoding::from_slice(&original).unwrap();
        let footer = original.len() - 64;
        let rows_end = footer - e.manifest_section().len();
        let at = offsets(6..footer, 2048, 3 * original.len() as u64);
        run_cases(&mut tally, "resealed", &name, &at, |at| {
            let mut bytes = original.clone();
            bytes[at] ^= 0x01;
            // The section boundaries of the original: a flip that moves
            // them makes these digests wrong, which must be caught too.
            let content = identity::content_digest(&bytes[6..rows_end]);
            let state = identity::state_id(&content, &bytes[rows_end..footer]);
            bytes[footer..footer + 32].copy_from_slice(&content);
            bytes[footer + 32..].copy_from_slice(&state);
            let Ok(m) = Encoding::from_slice(&bytes) else {
                return Ok(Outcome::Refused);
            };
            semq_reads(&m)?;
            // The mutant is a different, valid state: comparing it with the
            // original must work or be refused (another config), cleanly.
            let _ = e.diff(&m);
            let _ = m.diff(&e);
            Ok(Outcome::Valid)
        });
    }
    tally.finish("semq resealed flips");
}
