//! `qem diff A B`: differences in shape, dtype, codec, scientific metadata
//! (as JSON-pointer paths with both values) and measurements. Exit 0 when
//! measurements and scientific metadata are the same (another codec or
//! chunking alone is not a difference), 1 when not.

use std::io::Write;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;

use qemfs::qem::{Dtype, QemFile};

use crate::exit::{Failure, DIFFERENT, OK};
use crate::out::Stdout;
use crate::qem_args::DiffArgs;
use crate::qem_cmd::inspect::open;

/// How many differing scan positions are listed.
const LISTED: usize = 10;
/// Frames compared per step: bounded memory on any file size.
const STEP_FRAMES: usize = 256;

/// JSON-pointer escaping of one path segment (RFC 6901).
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Every path where `a` and `b` differ, with both values (`null` for a
/// missing side).
fn json_differences(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<Value>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = format!("{path}/{}", pointer_segment(k));
                json_differences(&sub, x.get(k), y.get(k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                json_differences(&format!("{path}/{i}"), Some(p), Some(q), out);
            }
        }
        (x, y) if x != y => out.push(json!({"path": path, "a": x, "b": y})),
        _ => {}
    }
}

/// Differing frames, the first few scan positions and the largest absolute
/// difference (floats compared by bit pattern; NaNs count as different
/// when their bits differ but do not enter the maximum).
struct Measurements {
    differing_frames: usize,
    first: Vec<[usize; 2]>,
    max_abs_difference: f64,
}

fn element(bytes: &[u8], dtype: Dtype, i: usize) -> (u64, f64) {
    match dtype {
        Dtype::U8 => (u64::from(bytes[i]), f64::from(bytes[i])),
        Dtype::U16 => {
            let v = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
            (u64::from(v), f64::from(v))
        }
        Dtype::F32 => {
            let bits = u32::from_le_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ]);
            (u64::from(bits), f64::from(f32::from_bits(bits)))
        }
    }
}

fn compare_measurements(
    (a, a_path): (&QemFile, &Path),
    (b, b_path): (&QemFile, &Path),
) -> Result<Measurements, Failure> {
    let frames = a.frames();
    let columns = a.shape()[1].max(1);
    let frame_bytes = a.frame_bytes();
    let size = a.decoded_dtype().size();
    let dtype = a.decoded_dtype();
    let mut result = Measurements {
        differing_frames: 0,
        first: Vec::new(),
        max_abs_difference: 0.0,
    };
    let (mut x, mut y) = (Vec::new(), Vec::new());
    // Every value of both arrays is compared, so a float file's whole-array
    // checksum is checked on the way: a diff never reports values that no
    // other command would hand out.
    let digest = |f: &QemFile| f.logical_expected().map(|_| Sha256::new());
    let (mut hash_a, mut hash_b) = (digest(a), digest(b));
    let mut start = 0;
    while start < frames {
        let end = (start + STEP_FRAMES).min(frames);
        x.resize((end - start) * frame_bytes, 0);
        y.resize((end - start) * frame_bytes, 0);
        a.read_frames(start..end, &mut x).map_err(Failure::plain)?;
        b.read_frames(start..end, &mut y).map_err(Failure::plain)?;
        hash_a.iter_mut().for_each(|h| h.update(&x));
        hash_b.iter_mut().for_each(|h| h.update(&y));
        for (k, (fx, fy)) in x.chunks(frame_bytes).zip(y.chunks(frame_bytes)).enumerate() {
            if fx == fy {
                continue;
            }
            let frame = start + k;
            result.differing_frames += 1;
            if result.first.len() < LISTED {
                result.first.push([frame / columns, frame % columns]);
            }
            for i in 0..frame_bytes / size {
                let ((bx, vx), (by, vy)) = (element(fx, dtype, i), element(fy, dtype, i));
                if bx != by {
                    let d = (vx - vy).abs();
                    if d.is_finite() && d > result.max_abs_difference {
                        result.max_abs_difference = d;
                    } else if d.is_infinite() {
                        result.max_abs_difference = f64::INFINITY;
                    }
                }
            }
        }
        start = end;
    }
    for (file, hash, path) in [(a, hash_a, a_path), (b, hash_b, b_path)] {
        if let Some(h) = hash {
            file.check_logical(qemfs::qem::checksum::hex(&h.finalize()))
                .map_err(|e| Failure::file(path, e))?;
        }
    }
    Ok(result)
}

pub fn diff(args: &DiffArgs) -> Result<u8, Failure> {
    let a = open(&args.a)?;
    let b = open(&args.b)?;
    let mut format = Vec::new();
    if a.codec() != b.codec() {
        format.push(json!({"what": "codec", "a": a.codec().id(), "b": b.codec().id()}));
    }
    let chunking = |f: &QemFile| f.chunks().iter().map(|c| c.scans).collect::<Vec<_>>();
    if chunking(&a) != chunking(&b) {
        format.push(json!({"what": "chunking", "a": chunking(&a), "b": chunking(&b)}));
    }
    let same_array = a.shape() == b.shape() && a.decoded_dtype() == b.decoded_dtype();
    let mut array = Vec::new();
    if a.shape() != b.shape() {
        array.push(json!({"what": "shape", "a": a.shape(), "b": b.shape()}));
    }
    if a.decoded_dtype() != b.decoded_dtype() {
        array.push(
            json!({"what": "dtype", "a": a.decoded_dtype().name(), "b": b.decoded_dtype().name()}),
        );
    }
    let mut metadata = Vec::new();
    let (ma, mb) = (
        Value::Object(a.metadata().raw.clone()),
        Value::Object(b.metadata().raw.clone()),
    );
    json_differences("", Some(&ma), Some(&mb), &mut metadata);
    let valid = |f: &QemFile| f.valid_mask().map(|m| m.as_bytes().to_vec());
    if valid(&a) != valid(&b) {
        array.push(json!({"what": "valid mask", "a": a.valid_mask().map(|m| m.invalid_count()), "b": b.valid_mask().map(|m| m.invalid_count())}));
    }
    let measurements = if same_array {
        Some(compare_measurements((&a, &args.a), (&b, &args.b))?)
    } else {
        None
    };
    let same = array.is_empty()
        && metadata.is_empty()
        && measurements
            .as_ref()
            .is_some_and(|m| m.differing_frames == 0);

    let mut out = Stdout::new();
    if args.json {
        let report = json!({
            "a": args.a.display().to_string(),
            "b": args.b.display().to_string(),
            "same": same,
            "format": format,
            "array": array,
            "scientific_metadata": metadata,
            "measurements": measurements.as_ref().map(|m| json!({
                "frames": a.frames(),
                "differing_frames": m.differing_frames,
                "first_differing_scans": m.first,
                "max_abs_difference": m.max_abs_difference,
            })),
        });
        writeln!(out, "{report}")?;
    } else {
        for d in format.iter().chain(&array) {
            writeln!(
                out,
                "{}: {} -> {}",
                d["what"].as_str().unwrap_or(""),
                d["a"],
                d["b"]
            )?;
        }
        for d in &metadata {
            writeln!(
                out,
                "scientific_metadata{}: {} -> {}",
                d["path"].as_str().unwrap_or(""),
                d["a"],
                d["b"]
            )?;
        }
        match &measurements {
            Some(m) if m.differing_frames == 0 => {
                writeln!(out, "measurements: identical ({} frames)", a.frames())?
            }
            Some(m) => {
                let listed: Vec<String> =
                    m.first.iter().map(|[r, c]| format!("({r}, {c})")).collect();
                writeln!(
                    out,
                    "measurements: {} of {} frames differ, first at scan {}{}; max abs difference {}",
                    m.differing_frames,
                    a.frames(),
                    listed.join(", "),
                    if m.differing_frames > m.first.len() { ", ..." } else { "" },
                    m.max_abs_difference
                )?;
            }
            None => writeln!(out, "measurements: not comparable (shape or dtype differ)")?,
        }
    }
    out.done()?;
    Ok(if same { OK } else { DIFFERENT })
}
