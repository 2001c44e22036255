//! Every `.qem` conformance fixture: accepted files decode to exactly their
//! `.npy` through every access path; rejected files fail full validation for
//! a reason equivalent to the reference's.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use qemfs::npy;
use qemfs::qem::{
    checksum::sha256_hex, Codec, ErrorKind, PixelValues, QemError, QemFile, StreamFault, Tile,
    ValidationLevel,
};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/qem"
    ))
    .to_path_buf()
}

fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join("manifest.json")).expect("conformance manifest");
    let v: Value = serde_json::from_str(&text).expect("manifest JSON");
    v["entries"].as_array().expect("entries").clone()
}

/// The data bytes and shape of an `.npy` fixture.
fn load_npy(name: &str) -> (npy::DType, Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let h = npy::parse_header(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    h.check_file_len(bytes.len() as u64).unwrap();
    (h.dtype, h.shape.clone(), bytes[h.data_offset..].to_vec())
}

/// Checks one accepted fixture through every access path; returns problems.
fn check_accepted(e: &Value) -> Vec<String> {
    let name = e["name"].as_str().unwrap();
    let mut bad = Vec::new();
    let path = dir().join(format!("{name}.qem"));
    let f = match QemFile::open(&path) {
        Ok(f) => f,
        Err(err) => return vec![format!("{name}: open failed: {err}")],
    };
    if let Err(err) = f.validate(ValidationLevel::Full) {
        bad.push(format!("{name}: full validation failed: {err}"));
    }
    if f.codec().id() != e["codec"].as_str().unwrap() {
        bad.push(format!("{name}: codec {}", f.codec().id()));
    }
    if f.decoded_dtype().name() != e["dtype"].as_str().unwrap()
        || f.stored_dtype().name() != e["stored_dtype"].as_str().unwrap()
    {
        bad.push(format!("{name}: dtype mismatch"));
    }
    let shape: Vec<usize> = e["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    if f.shape().to_vec() != shape {
        bad.push(format!("{name}: shape {:?}", f.shape()));
    }
    if let Some(list) = e.get("chunks").and_then(Value::as_array) {
        let chunks: Vec<(usize, usize)> = list
            .iter()
            .map(|c| {
                (
                    c[0].as_u64().unwrap() as usize,
                    c[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        let ours: Vec<(usize, usize)> = f.chunks().iter().map(|c| (c.first, c.scans)).collect();
        if ours != chunks {
            bad.push(format!("{name}: chunk table {ours:?}, manifest {chunks:?}"));
        }
    }
    let (dtype, npy_shape, expected) = load_npy(e["dense_file"].as_str().unwrap());
    if dtype.name() != f.decoded_dtype().name() || npy_shape != shape {
        bad.push(format!("{name}: npy dtype/shape differ from the file"));
    }

    let mut dense = vec![0u8; f.dense_bytes().unwrap()];
    if let Err(err) = f.read_all(&mut dense) {
        return [bad, vec![format!("{name}: read_all failed: {err}")]].concat();
    }
    // Byte equality is bit-pattern equality for floats (NaN payloads, -0).
    if dense != expected {
        bad.push(format!("{name}: decoded array differs from the .npy"));
    }
    if sha256_hex(&dense) != e["dense_sha256"].as_str().unwrap() {
        bad.push(format!("{name}: dense_sha256 differs"));
    }

    // Raw codes of the scaled codec.
    if let Some(codes_file) = e.get("codes_file").and_then(Value::as_str) {
        let (_, _, codes_expected) = load_npy(codes_file);
        let mut codes = vec![0u16; f.frames() * f.pixels()];
        match f.read_all_codes(&mut codes) {
            Ok(()) => {
                let bytes: Vec<u8> = codes.iter().flat_map(|c| c.to_le_bytes()).collect();
                if bytes != codes_expected
                    || sha256_hex(&bytes) != e["codes_sha256"].as_str().unwrap()
                {
                    bad.push(format!("{name}: codes differ from {codes_file}"));
                }
            }
            Err(err) => bad.push(format!("{name}: read_all_codes failed: {err}")),
        }
    }

    // Every frame, alone.
    let fb = f.frame_bytes();
    let mut frame = vec![0u8; fb];
    for i in 0..f.frames() {
        match f.read_frame(i, &mut frame) {
            Ok(()) if frame[..] == dense[i * fb..(i + 1) * fb] => {}
            Ok(()) => {
                bad.push(format!("{name}: frame {i} differs"));
                break;
            }
            Err(err) => {
                bad.push(format!("{name}: frame {i}: {err}"));
                break;
            }
        }
    }
    // Ranges crossing block and chunk boundaries.
    let n = f.frames();
    for (a, b) in [
        (0, n),
        (n / 3, n - n / 4),
        (n.saturating_sub(2), n),
        (n / 2, n / 2),
    ] {
        let mut out = vec![0u8; (b - a) * fb];
        match f.read_frames(a..b, &mut out) {
            Ok(()) if out[..] == dense[a * fb..b * fb] => {}
            Ok(()) => bad.push(format!("{name}: frames {a}..{b} differ")),
            Err(err) => bad.push(format!("{name}: frames {a}..{b}: {err}")),
        }
    }
    // Every block, with its frame range and decoded size.
    let mut covered = 0;
    for (k, info) in f.blocks().iter().enumerate() {
        assert_eq!(info.index, k);
        if info.first_frame != covered || info.decoded_bytes != info.frames * fb {
            bad.push(format!("{name}: block {k} geometry"));
        }
        covered += info.frames;
        let mid = info.first_frame + info.frames / 2;
        let within = info.frame_bytes_in_block(mid, fb);
        if within != Some((mid - info.first_frame) * fb..(mid - info.first_frame + 1) * fb)
            || info
                .frame_bytes_in_block(info.first_frame + info.frames, fb)
                .is_some()
        {
            bad.push(format!("{name}: block {k} frame lookup"));
        }
        match f.decode_block(k) {
            Ok(out)
                if out[..]
                    == dense[info.first_frame * fb..(info.first_frame + info.frames) * fb] => {}
            Ok(_) => bad.push(format!("{name}: block {k} differs")),
            Err(err) => bad.push(format!("{name}: block {k}: {err}")),
        }
    }
    if covered != n {
        bad.push(format!("{name}: blocks cover {covered} of {n} frames"));
    }

    // Pixel subsets, compared with the stored values (codes for scaled).
    let p_count = f.pixels();
    let stored: Vec<u32> = match f.codec() {
        Codec::Integer if f.stored_dtype().size() == 1 => {
            dense.iter().map(|&b| u32::from(b)).collect()
        }
        Codec::Integer => dense
            .chunks_exact(2)
            .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        Codec::Float => dense
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Codec::Scaled => {
            let mut codes = vec![0u16; n * p_count];
            f.read_all_codes(&mut codes).ok();
            codes.into_iter().map(u32::from).collect()
        }
    };
    let subsets: Vec<Vec<usize>> = vec![
        (0..p_count).collect(),
        vec![p_count - 1, 0, p_count / 2, p_count / 2],
        (0..p_count).step_by(7).collect(),
    ];
    for pixels in subsets {
        match f.decode_pixels(&pixels) {
            Ok(ps) => {
                let got: Vec<u32> = match &ps.values {
                    PixelValues::U16(v) => v.iter().map(|&x| u32::from(x)).collect(),
                    PixelValues::F32Bits(v) => v.clone(),
                };
                let want: Vec<u32> = pixels
                    .iter()
                    .flat_map(|&p| (0..n).map(move |t| (p, t)))
                    .map(|(p, t)| stored[t * p_count + p])
                    .collect();
                if got != want || ps.frames != n {
                    bad.push(format!(
                        "{name}: pixel streams of {} pixels differ",
                        pixels.len()
                    ));
                }
            }
            Err(err) => bad.push(format!("{name}: decode_pixels: {err}")),
        }
    }

    // Raw streams decode, with the crate's own stream decoder, to the same
    // values.
    for k in 0..f.blocks().len() {
        let raw = match f.raw_block_streams(k) {
            Ok(raw) => raw,
            Err(err) => {
                bad.push(format!("{name}: raw streams of block {k}: {err}"));
                continue;
            }
        };
        let off = |j: usize| {
            u32::from_le_bytes(raw.offsets[4 * j..4 * j + 4].try_into().unwrap()) as usize
        };
        let mut values = vec![0u16; raw.frames];
        for j in 0..raw.streams {
            let bytes = &raw.payload[off(j)..off(j + 1)];
            qemfs::qem::stream::decode(raw.selectors[j], bytes, &mut values).unwrap();
            let (p, half) = if f.codec() == Codec::Float {
                (j / 2, j % 2)
            } else {
                (j, 0)
            };
            let want: Vec<u16> = raw
                .block
                .frame_range()
                .map(|t| match f.codec() {
                    Codec::Float => (stored[t * p_count + p] >> (16 * half)) as u16,
                    _ => stored[t * p_count + p] as u16,
                })
                .collect();
            if values != want {
                bad.push(format!("{name}: raw stream {j} of block {k} differs"));
                break;
            }
        }
    }

    // Spatial sums from the index equal sums of decoded valid counts.
    if f.codec() == Codec::Integer {
        let [_, _, r, c] = f.shape();
        let valid = f.valid_mask().unwrap().clone();
        for tile in [Tile::Px8, Tile::Px32] {
            let (gr, gc) = tile.grid(r, c);
            let edge = tile.edge();
            let mut want = vec![0u32; n * gr * gc];
            for t in 0..n {
                for p in 0..p_count {
                    if valid.is_valid(p) {
                        let (row, col) = (p / c, p % c);
                        want[t * gr * gc + (row / edge) * gc + col / edge] +=
                            stored[t * p_count + p];
                    }
                }
            }
            match f.spatial_sums(tile, 0..n) {
                Ok(got) if got == want => {}
                Ok(_) => bad.push(format!(
                    "{name}: {tile:?} spatial sums differ from decoded counts"
                )),
                Err(err) => bad.push(format!("{name}: spatial sums: {err}")),
            }
            let (a, b) = (n / 3, n - n / 5);
            match f.spatial_sums(tile, a..b) {
                Ok(got) if got[..] == want[a * gr * gc..b * gr * gc] => {}
                Ok(_) => bad.push(format!("{name}: {tile:?} spatial sums of {a}..{b} differ")),
                Err(err) => bad.push(format!("{name}: spatial sums {a}..{b}: {err}")),
            }
        }
        if let Some(invalid) = e.get("invalid_pixels").and_then(Value::as_u64) {
            if valid.invalid_count() as u64 != invalid {
                bad.push(format!("{name}: {} invalid pixels", valid.invalid_count()));
            }
        }
    }

    // Model selectors present.
    if let (Ok(report), Some(list)) = (
        f.validate(ValidationLevel::Quick),
        e.get("model_selectors").and_then(Value::as_array),
    ) {
        let want: BTreeSet<u8> = list.iter().map(|v| v.as_u64().unwrap() as u8).collect();
        let json = serde_json::to_value(&report).unwrap();
        if json["codec"] != e["codec"] || json["shape"] != e["shape"] || json["level"] != "quick" {
            bad.push(format!("{name}: report JSON {json}"));
        }
        if json["chunk_table"] != e["chunks"] {
            bad.push(format!(
                "{name}: report chunk table {}",
                json["chunk_table"]
            ));
        }
        if report
            .model_selectors
            .iter()
            .copied()
            .collect::<BTreeSet<_>>()
            != want
        {
            bad.push(format!(
                "{name}: model selectors {:?}",
                report.model_selectors
            ));
        }
    }
    bad
}

/// Our error kinds (and a phrase of our message) equivalent to a reference
/// message.
fn equivalent(reference: &str) -> (Vec<ErrorKind>, &'static str) {
    use ErrorKind::*;
    let table: &[(&str, &[ErrorKind], &str)] = &[
        ("Not a complete QEM file", &[NotQem, LegacyContainer], ""),
        ("Invalid QEM header length", &[HeaderLength], ""),
        ("QEM header checksum mismatch", &[HeaderChecksum], ""),
        (
            "QEM body checksum mismatch in block",
            &[BodyChecksum],
            "block",
        ),
        ("Incomplete QEM checksum table", &[ChecksumTable], ""),
        ("QEM file length disagrees", &[FileLength], ""),
        ("QEM codec '", &[UnsupportedCodec], "re-export"),
        (
            "Unsupported or inconsistent QEM metadata",
            &[Header, UnsupportedVersion, Metadata],
            "",
        ),
        (
            "Unsupported ANS snapshot geometry or codec version",
            &[UnsupportedVersion, Header],
            "",
        ),
        ("Duplicate QEM metadata key", &[DuplicateKey], ""),
        (
            "QEM processing must list every operation",
            &[Metadata],
            "processing",
        ),
        (
            "QEM electron_microscope uses the x/y names",
            &[Metadata],
            "0.0.1",
        ),
        (
            "Schema-2 QEM quantities require canonical",
            &[Metadata],
            "canonical",
        ),
        (
            "Calibrated QEM quantities require nonempty provenance",
            &[Metadata],
            "provenance",
        ),
        (
            "Conflicting QEM axis and microscope calibration",
            &[Metadata],
            "conflict",
        ),
        (
            "Declare QEM source_metadata_coverage",
            &[Metadata],
            "source_metadata_coverage",
        ),
        ("Counts were stored as", &[Metadata], "narrowing"),
        ("Invalid ANS array span", &[Layout], "span"),
        ("Invalid ANS chunk scan coverage", &[Layout], "coverage"),
        ("Invalid detector validity mask", &[Header], "validity mask"),
        ("Invalid QEM count offsets", &[StreamOffsets], "offset"),
        ("Invalid QEM count stream", &[Stream], "selector"),
        (
            "QEM count stream has trailing data or an invalid final state",
            &[Stream],
            "final state",
        ),
        ("Invalid QEM entropy state", &[Stream], "initial state"),
        ("Invalid QEM sparse-event position", &[Stream], "sparse"),
        (
            "Decoded QEM count exceeds declared dtype",
            &[ValueRange],
            "exceeds",
        ),
        (
            "Invalid float ANS stream model or extent",
            &[Stream, Layout],
            "",
        ),
        (
            "QEM decoded float32 checksum mismatch",
            &[LogicalChecksum],
            "",
        ),
        ("Invalid float ANS array bounds", &[Layout], "bounds"),
        (
            "Invalid QEM floating-point ANS description",
            &[Header],
            "empad",
        ),
        (
            "Scaled .qem metadata must declare scaled_uint16_quantization",
            &[Metadata],
            "scaled_uint16_quantization",
        ),
        (
            "Invalid regional intensity calibration",
            &[Calibration],
            "region",
        ),
        ("Invalid scaled .qem chunk coverage", &[Layout], "region"),
        ("Invalid scaled uint16 description", &[Header], "dtype"),
    ];
    for (prefix, kinds, needle) in table {
        if reference.starts_with(prefix) {
            return (kinds.to_vec(), needle);
        }
    }
    panic!("no equivalence known for reference error {reference:?}");
}

fn full_validation(path: &Path) -> Result<(), QemError> {
    QemFile::open(path)?
        .validate(ValidationLevel::Full)
        .map(|_| ())
}

#[test]
fn every_manifest_entry() {
    let entries = manifest();
    let mut failures = Vec::new();
    let (mut accepted, mut rejected) = (0, 0);
    for e in &entries {
        let name = e["name"].as_str().unwrap();
        let path = dir().join(format!("{name}.qem"));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            sha256_hex(&bytes),
            e["qem_sha256"].as_str().unwrap(),
            "{name}: fixture altered"
        );
        match e["expected"].as_str().unwrap() {
            "accepted" => {
                accepted += 1;
                failures.extend(check_accepted(e));
            }
            "rejected" => {
                rejected += 1;
                let reference = e["error"].as_str().unwrap();
                match full_validation(&path) {
                    Ok(()) => {
                        failures.push(format!("{name}: accepted, reference says {reference:?}"))
                    }
                    Err(err) => {
                        let (kinds, needle) = equivalent(reference);
                        let msg = err.to_string();
                        if !kinds.contains(&err.kind()) || !msg.to_lowercase().contains(needle) {
                            failures.push(format!(
                                "{name}: rejected as {:?} ({msg}), reference says {reference:?}",
                                err.kind()
                            ));
                        }
                        // The same verdict from an in-memory copy.
                        let again = QemFile::from_bytes(bytes)
                            .and_then(|f| f.validate(ValidationLevel::Full));
                        if again.as_ref().err().map(QemError::kind) != Some(err.kind()) {
                            failures.push(format!("{name}: in-memory verdict differs"));
                        }
                    }
                }
            }
            other => failures.push(format!("{name}: unknown expectation {other}")),
        }
    }
    assert_eq!((accepted, rejected), (21, 49), "manifest size changed");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn specific_rejections_name_the_place() {
    let open = |n: &str| QemFile::open(dir().join(format!("{n}.qem")));
    let full = |n: &str| {
        open(n)
            .and_then(|f| f.validate(ValidationLevel::Full))
            .unwrap_err()
    };
    assert!(matches!(
        full("bad-body-checksum"),
        QemError::BodyChecksum { block: 0 }
    ));
    assert!(
        matches!(full("bad-duplicate-json-key"), QemError::DuplicateKey { key, .. } if key == "version")
    );
    assert!(matches!(
        full("bad-legacy-magic-qgpustrm"),
        QemError::LegacyContainer {
            signature: "QGPUSTRM"
        }
    ));
    assert!(matches!(
        full("bad-rans-initial-state"),
        QemError::Stream {
            fault: StreamFault::InitialState(_),
            ..
        }
    ));
    assert!(matches!(
        full("bad-rans-trailing-byte"),
        QemError::Stream {
            fault: StreamFault::FinalState { .. },
            ..
        }
    ));
    assert!(matches!(
        full("bad-model-selector"),
        QemError::Stream {
            fault: StreamFault::UnknownSelector(100),
            ..
        }
    ));
    let retired = full("bad-retired-float-codec").to_string();
    assert!(
        retired.contains("float32-bit-lanes-rans-v1") && retired.contains("re-export"),
        "{retired}"
    );
}

#[test]
fn corrupt_body_is_never_exposed() {
    // The body checksum fails lazily: opening works, every read fails.
    let f = QemFile::open(dir().join("bad-body-checksum.qem")).unwrap();
    let mut frame = vec![0u8; f.frame_bytes()];
    for i in [0, f.frames() - 1] {
        assert!(matches!(
            f.read_frame(i, &mut frame),
            Err(QemError::BodyChecksum { block: 0 })
        ));
    }
    assert!(matches!(
        f.decode_pixels(&[0]),
        Err(QemError::BodyChecksum { block: 0 })
    ));
    assert!(matches!(
        f.spatial_sums(Tile::Px8, 0..1),
        Err(QemError::BodyChecksum { block: 0 })
    ));
    assert!(matches!(
        f.decode_block(0),
        Err(QemError::BodyChecksum { block: 0 })
    ));
    assert!(matches!(
        f.validate(ValidationLevel::Quick),
        Err(QemError::BodyChecksum { block: 0 })
    ));
}

#[test]
fn worked_example_of_the_spec() {
    // §16: the annotated file, checked against the figures of its prose.
    let f = QemFile::open(dir().join("u8-worked-example.qem")).unwrap();
    assert_eq!(
        (f.file_bytes(), f.header_bytes(), f.body_bytes()),
        (1142, 996, 90)
    );
    let valid = f.valid_mask().unwrap();
    assert_eq!(valid.as_bytes(), [0xec]);
    assert!(!valid.is_valid(3));
    let mut out = vec![0u8; f.dense_bytes().unwrap()];
    f.read_all(&mut out).unwrap();
    assert_eq!(out, [0, 1, 7, 0, 200, 3, 0, 2, 7, 0, 0, 3]);
    // Field 0 (8×8 tile) and field 1 (32×32 tile) of frame 0: 211 and 12
    // cannot both be right unless pixel (1,0) is excluded; frame 1 is 12.
    assert_eq!(f.spatial_sums(Tile::Px8, 0..2).unwrap(), [211, 12]);
    assert_eq!(f.spatial_sums(Tile::Px32, 0..2).unwrap(), [211, 12]);
    let report = f.validate(ValidationLevel::Full).unwrap();
    assert_eq!(report.model_selectors, [253, 254, 255]);
    assert_eq!(report.invalid_pixels, Some(1));
    assert_eq!(report.spatial_index_verified, Some(true));
}

#[test]
fn files_are_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<QemFile>();
}

#[test]
fn metadata_is_typed_and_canonical() {
    use qemfs::qem::metadata::{Schema, ACCELERATING_VOLTAGE, PIXEL_SIZE_ROW};
    let v2 = QemFile::open(dir().join("u8-mixed-13x7.qem")).unwrap();
    let v1 = QemFile::open(dir().join("u8-schema1-metadata.qem")).unwrap();
    assert_eq!(v1.metadata().schema, Schema::V1);
    for f in [&v2, &v1] {
        let md = f.metadata();
        let kv = md.effective(ACCELERATING_VOLTAGE).unwrap();
        assert_eq!((kv.unit.as_str(), kv.value), ("kV", 300.0));
        let row = md.effective_axis_sampling(0).unwrap();
        assert_eq!(row.unit, "angstrom");
        assert!((row.value - 0.4).abs() < 1e-12, "{}", row.value);
        assert_eq!(md.recorded(PIXEL_SIZE_ROW).unwrap().unit, "angstrom");
        assert_eq!(md.axes[3].sampling.as_ref().unwrap().unit, "1/angstrom");
        assert!(md.calibration_overrides.is_empty());
    }
    // Schema 1 keeps what was stored next to the canonical value.
    let stored = v1
        .metadata()
        .recorded(ACCELERATING_VOLTAGE)
        .unwrap()
        .stored
        .clone();
    assert_eq!(stored, Some((300000.0, "V".to_string())));
}

#[test]
fn quick_validation_checks_structure_but_decodes_nothing() {
    let quick = |n: &str| {
        QemFile::open(dir().join(format!("{n}.qem")))
            .and_then(|f| f.validate(ValidationLevel::Quick))
    };
    // Stream tables are structure: quick sees them (upstream's validator
    // checks them for float files only).
    for n in [
        "bad-float-model-selector",
        "bad-stream-offset-end",
        "bad-stream-offsets-decreasing",
        "bad-model-selector",
    ] {
        assert!(quick(n).is_err(), "{n}");
    }
    // Entropy-coded content needs decoding: only full validation sees it.
    for n in [
        "bad-rans-final-state",
        "bad-rans-trailing-byte",
        "bad-rans-initial-state",
        "bad-sparse-order",
        "bad-value-exceeds-uint8",
        "bad-float-logical-checksum",
    ] {
        let report = quick(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(!report.decoded);
    }
}

#[test]
fn errors_can_be_cached() {
    fn clonable<T: Clone + Send + Sync + 'static>() {}
    clonable::<QemError>();
    let missing = QemFile::open(dir().join("no-such-file.qem")).unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::Io);
    assert!(!missing.is_corrupt_data());
    assert_eq!(missing.clone().to_string(), missing.to_string());
}

#[test]
fn decoded_blocks_go_through_the_block_cache() {
    use qemfs::cache::BlockCache;
    use std::sync::Arc;
    let f = QemFile::open(dir().join("u8-two-block-chunks.qem")).unwrap();
    let cache: BlockCache<usize, Vec<u8>, QemError> = BlockCache::new(1 << 20);
    let fb = f.frame_bytes();
    let mut frame = vec![0u8; fb];
    for t in [0, 700, 1100, 1199] {
        let info = *f.block_of_frame(t).unwrap();
        let block = cache
            .get_or_load(&info.index, || f.decode_block(info.index).map(Arc::new))
            .unwrap();
        f.read_frame(t, &mut frame).unwrap();
        assert_eq!(block[info.frame_bytes_in_block(t, fb).unwrap()], frame[..]);
    }
    // A corrupt body fails the load, and every later read, by name.
    let bad = QemFile::open(dir().join("bad-body-checksum.qem")).unwrap();
    let cache: BlockCache<usize, Vec<u8>, QemError> = BlockCache::new(1 << 20);
    let err = cache
        .get_or_load(&0, || bad.decode_block(0).map(Arc::new))
        .unwrap_err();
    assert!(matches!(err, QemError::BodyChecksum { block: 0 }));
}
