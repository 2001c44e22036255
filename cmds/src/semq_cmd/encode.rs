//! `semq encode`, `semq convert` and `semq concat`: the commands that write
//! files. Every output is published atomically and never replaces an
//! existing file unless `--force` is given.

use std::io::Write;
use std::path::Path;

use qemfs::npy;
use qemfs::publish::{AtomicFile, Overwrite};
use qemfs::semq::concat::concat as concat_all;
use qemfs::semq::report::push_json_string;
use qemfs::semq::{encode as encode_vectors, Config, Encoding, IdList};
use serde_json::Value;

use crate::exit::{Failure, OK};
use crate::semq_args::{ConcatArgs, ConvertArgs, EncodeArgs, IdKind, Op, What};
use crate::semq_cmd::report::{load, os_error};

fn overwrite(force: bool) -> Overwrite {
    if force {
        Overwrite::Replace
    } else {
        Overwrite::Never
    }
}

fn extension(path: &Path) -> String {
    path.extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase()
}

fn read(path: &Path) -> Result<Vec<u8>, Failure> {
    qemfs::regular_file::read(path).map_err(|e| Failure::file(path, os_error(&e, path)))
}

/// float32 vectors from `.npy` ([n, dim], float32) or raw little-endian
/// `.f32`; returns the values and n.
fn read_vectors(path: &Path, dim: usize) -> Result<(Vec<f32>, usize), Failure> {
    let bytes = read(path)?;
    let data = if extension(path) == "npy" {
        let header = npy::parse_header(&bytes).map_err(|e| Failure::file(path, e))?;
        header
            .check_file_len(bytes.len() as u64)
            .map_err(|e| Failure::file(path, e))?;
        if header.dtype != npy::DType::F32 {
            return Err(Failure::file(
                path,
                format!("vectors must be float32, not {}", header.dtype),
            ));
        }
        let ok_shape = match header.shape.as_slice() {
            [_, d] => *d == dim,
            [] | [_] => false,
            _ => false,
        };
        if !ok_shape {
            return Err(Failure::file(
                path,
                format!("vectors must have shape [n, {dim}], not {:?}", header.shape),
            ));
        }
        &bytes[header.data_offset..]
    } else {
        &bytes[..]
    };
    let row_bytes = dim * 4;
    if row_bytes == 0 || data.len() % row_bytes != 0 {
        return Err(Failure::file(
            path,
            format!(
                "{} bytes is not a whole number of {dim}-dimensional float32 vectors",
                data.len()
            ),
        ));
    }
    let values = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((values, data.len() / row_bytes))
}

fn parse_u64_id(path: &Path, text: &str, index: usize) -> Result<u64, Failure> {
    text.trim().parse::<u64>().map_err(|_| {
        Failure::file(
            path,
            format!("id {index} ({text:?}) is not an unsigned 64-bit integer"),
        )
    })
}

/// Ids from `.txt` (one per line), `.json` (array of strings) or `.npy`
/// (uint64), in input order.
fn read_ids(path: &Path, kind: Option<IdKind>) -> Result<IdList, Failure> {
    let ext = extension(path);
    let kind = kind.unwrap_or(if ext == "npy" {
        IdKind::U64
    } else {
        IdKind::Utf8
    });
    let bytes = read(path)?;
    match ext.as_str() {
        "npy" => {
            let header = npy::parse_header(&bytes).map_err(|e| Failure::file(path, e))?;
            header
                .check_file_len(bytes.len() as u64)
                .map_err(|e| Failure::file(path, e))?;
            if header.dtype != npy::DType::U64 || header.shape.len() != 1 || kind != IdKind::U64 {
                return Err(Failure::file(
                    path,
                    "ids in .npy must be a one-dimensional uint64 array (id kind u64)",
                ));
            }
            let ids = bytes[header.data_offset..]
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect();
            Ok(IdList::U64(ids))
        }
        "json" => {
            let value: Value = serde_json::from_slice(&bytes)
                .map_err(|e| Failure::file(path, format!("not valid JSON: {e}")))?;
            let items = value
                .as_array()
                .ok_or_else(|| Failure::file(path, "ids must be a JSON array of strings"))?;
            match kind {
                IdKind::Utf8 => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_str()
                            .map(|s| s.as_bytes().to_vec())
                            .ok_or_else(|| Failure::file(path, format!("id {i} is not a string")))
                    })
                    .collect::<Result<_, _>>()
                    .map(IdList::Utf8),
                IdKind::U64 => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| match v {
                        Value::String(s) => parse_u64_id(path, s, i),
                        Value::Number(n) => n.as_u64().ok_or_else(|| {
                            Failure::file(path, format!("id {i} is not an unsigned 64-bit integer"))
                        }),
                        _ => Err(Failure::file(path, format!("id {i} is not a string"))),
                    })
                    .collect::<Result<_, _>>()
                    .map(IdList::U64),
            }
        }
        _ => {
            // One id per line; a final newline does not start another id.
            let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
            let lines: Vec<&[u8]> = if body.is_empty() && bytes.len() <= 1 {
                Vec::new()
            } else {
                body.split(|&b| b == b'\n').collect()
            };
            match kind {
                IdKind::Utf8 => Ok(IdList::Utf8(lines.iter().map(|l| l.to_vec()).collect())),
                IdKind::U64 => lines
                    .iter()
                    .enumerate()
                    .map(|(i, l)| parse_u64_id(path, &String::from_utf8_lossy(l), i))
                    .collect::<Result<_, _>>()
                    .map(IdList::U64),
            }
        }
    }
}

fn manifest_pairs(args: &EncodeArgs) -> Result<Vec<(String, String)>, Failure> {
    let mut pairs = Vec::new();
    if let Some(path) = &args.manifest_json {
        let value: Value = serde_json::from_slice(&read(path)?)
            .map_err(|e| Failure::file(path, format!("not valid JSON: {e}")))?;
        let object = value
            .as_object()
            .ok_or_else(|| Failure::file(path, "the manifest must be a JSON object of strings"))?;
        for (k, v) in object {
            let v = v.as_str().ok_or_else(|| {
                Failure::file(path, format!("manifest value of {k:?} is not a string"))
            })?;
            pairs.push((k.clone(), v.to_string()));
        }
    }
    for entry in &args.manifest {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| Failure::plain(format!("--manifest {entry:?}: expected KEY=VALUE")))?;
        pairs.push((k.to_string(), v.to_string()));
    }
    Ok(pairs)
}

/// Each operator's own parameter; naming another's is a mistake about
/// what is being built, not a default to ignore.
fn check_parameters(args: &EncodeArgs) -> Result<(), Failure> {
    let given = [
        ("--bins", Op::Quant, args.bins.is_some()),
        ("--sectors", Op::Phase, args.sectors.is_some()),
        ("--scale", Op::Orbit, args.scale.is_some()),
    ];
    let stray: Vec<&str> = given
        .iter()
        .filter(|(_, op, set)| *set && *op != args.op)
        .map(|(flag, _, _)| *flag)
        .collect();
    if stray.is_empty() {
        return Ok(());
    }
    let op = format!("{:?}", args.op).to_lowercase();
    Err(Failure::plain(format!(
        "{} {} not apply to --op {op} (--bins is quant's, --sectors phase's, --scale orbit's)",
        stray.join(" and "),
        if stray.len() == 1 { "does" } else { "do" },
    )))
}

pub fn encode(args: &EncodeArgs) -> Result<u8, Failure> {
    check_parameters(args)?;
    let param = match args.op {
        Op::Quant => args.bins,
        Op::Phase => args.sectors,
        Op::Orbit => Some(args.scale.unwrap_or(50)),
    };
    let config = match (args.op, param) {
        (Op::Quant, Some(bins)) => Config::quant(args.dim, bins),
        (Op::Phase, Some(sectors)) => Config::phase(args.dim, sectors),
        (Op::Orbit, Some(scale)) => Config::orbit(args.dim, scale),
        _ => {
            return Err(Failure::plain(
                "--bins (quant) or --sectors (phase) is required",
            ))
        }
    }
    .map_err(|e| Failure::plain(format!("invalid config: {}", e.message())))?;
    // Fail before any work when the output cannot be written.
    let target = AtomicFile::create(&args.out, overwrite(args.force)).map_err(Failure::plain)?;
    let (vectors, n) = read_vectors(&args.vectors, args.dim as usize)?;
    let ids = read_ids(&args.ids, args.id_kind)?;
    if ids.len() != n {
        return Err(Failure::plain(format!(
            "{} holds {n} vectors but {} holds {} ids",
            args.vectors.display(),
            args.ids.display(),
            ids.len()
        )));
    }
    let pairs = manifest_pairs(args)?;
    let encoding = encode_vectors(config, &ids, &vectors, &pairs).map_err(|e| {
        let mut at = String::new();
        if let Some(r) = e.row() {
            at = format!(" (row {r}");
            if let Some(f) = e.field() {
                at.push_str(&format!(", coordinate {f}"));
            }
            at.push(')');
        }
        let reason = format!("{}: {}{at}", e.class(), e.message());
        // Name the input the error is about: ids for a repeated id, the
        // vectors for any other row, the manifest file for the rest.
        if e.message() == qemfs::semq::encode::DUPLICATE_ID {
            Failure::file(&args.ids, reason)
        } else if e.row().is_some() {
            Failure::file(&args.vectors, reason)
        } else if let Some(m) = &args.manifest_json {
            Failure::file(m, reason)
        } else {
            Failure::plain(reason)
        }
    })?;
    write_image(target, encoding.image())?;
    Ok(OK)
}

fn write_image(mut target: AtomicFile, bytes: &[u8]) -> Result<(), Failure> {
    let path = target.target().to_path_buf();
    target
        .write_all(bytes)
        .map_err(|e| Failure::file(&path, e))?;
    target.publish().map_err(Failure::plain)
}

pub fn convert(args: &ConvertArgs) -> Result<u8, Failure> {
    let ext = extension(&args.out);
    if !matches!(ext.as_str(), "npy" | "jsonl" | "bin") {
        return Err(Failure::file(
            &args.out,
            "unknown output type; use .npy, .jsonl or .bin",
        ));
    }
    let mut target =
        AtomicFile::create(&args.out, overwrite(args.force)).map_err(Failure::plain)?;
    let e = load(&args.input)?;
    let path = args.out.clone();
    let io = |err: std::io::Error| Failure::file(&path, err);
    let config = e.config();
    match ext.as_str() {
        "npy" => match args.what {
            What::Symbols => {
                let units = config.units_per_row();
                target
                    .write_all(&npy::encode_header(npy::DType::U8, &[e.len(), units]))
                    .map_err(io)?;
                target.write_all(&e.unpack()).map_err(io)?;
            }
            What::Vectors => {
                let dim = config.dim() as usize;
                target
                    .write_all(&npy::encode_header(npy::DType::F32, &[e.len(), dim]))
                    .map_err(io)?;
                let values = e.decode();
                let mut bytes = Vec::with_capacity(values.len() * 4);
                for v in values {
                    bytes.extend_from_slice(&v.to_le_bytes());
                }
                target.write_all(&bytes).map_err(io)?;
            }
        },
        "jsonl" => {
            let mut out = std::io::BufWriter::new(&mut target);
            let mut line = String::new();
            for (i, id) in e.ids().enumerate() {
                line.clear();
                line.push_str("{\"id\": ");
                match id {
                    qemfs::semq::IdRef::U64(v) => line.push_str(&format!("\"{v}\"")),
                    qemfs::semq::IdRef::Utf8(s) => push_json_string(&mut line, s),
                }
                line.push_str(", \"symbols\": [");
                let symbols = e.symbols(i).unwrap_or_default();
                let text: Vec<String> = symbols.iter().map(u8::to_string).collect();
                line.push_str(&text.join(", "));
                line.push_str("]}\n");
                out.write_all(line.as_bytes()).map_err(io)?;
            }
            out.flush().map_err(io)?;
        }
        _ => target.write_all(e.rows_section()).map_err(io)?,
    }
    target.publish().map_err(Failure::plain)?;
    Ok(OK)
}

pub fn concat(args: &ConcatArgs) -> Result<u8, Failure> {
    let target = AtomicFile::create(&args.out, overwrite(args.force)).map_err(Failure::plain)?;
    let parts = args
        .inputs
        .iter()
        .map(|p| load(p))
        .collect::<Result<Vec<Encoding>, _>>()?;
    // Concat errors carry the offending part's index as their field.
    let joined = concat_all(&parts).map_err(|e| {
        let at = e.row().map(|r| format!(" (row {r})")).unwrap_or_default();
        let reason = format!("{}{at}", e.message());
        match e.field().and_then(|k| args.inputs.get(k as usize)) {
            Some(part) => Failure::file(part, reason),
            None => Failure::plain(reason),
        }
    })?;
    write_image(target, joined.image())?;
    Ok(OK)
}
