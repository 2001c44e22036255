//! The writer's public behaviour: publication, streaming, errors, model choice.

use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, write_file, Calibration, Content, CountDtype, DetectorUnit,
    ModelChoice, ScaledRegion, WriteError, WriteSpec, Writer,
};
use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};
use serde_json::{json, Map, Value};

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn counts_spec(shape: [u64; 4]) -> WriteSpec {
    WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    )
}

/// Deterministic low-dose frames with a brighter centre.
fn frames(shape: [u64; 4], seed: u64) -> Vec<u16> {
    let (n, r, c) = (
        (shape[0] * shape[1]) as usize,
        shape[2] as usize,
        shape[3] as usize,
    );
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * r * c);
    for _ in 0..n {
        for y in 0..r {
            for z in 0..c {
                let x = rng.next_u64();
                let centre = (2 * y).abs_diff(r) + (2 * z).abs_diff(c) < r.min(c) / 2;
                out.push(if centre {
                    (x % 40) as u16
                } else {
                    u16::from(x.is_multiple_of(23))
                });
            }
        }
    }
    out
}

fn le(values: &[u16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn existing_target_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.qem");
    std::fs::write(&path, b"precious").unwrap();
    let shape = [1, 2, 2, 3];
    let err = Writer::create(&path, counts_spec(shape)).err().unwrap();
    assert!(matches!(err, WriteError::TargetExists { .. }));
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    assert_eq!(entries(dir.path()), ["a.qem"]);
}

#[test]
fn target_created_meanwhile_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.qem");
    let shape = [1, 2, 2, 3];
    let mut w = Writer::create(&path, counts_spec(shape)).unwrap();
    w.push_u16(&frames(shape, 1)).unwrap();
    std::fs::write(&path, b"someone else's").unwrap();
    assert!(matches!(w.finish(), Err(WriteError::TargetExists { .. })));
    assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
    assert_eq!(entries(dir.path()), ["b.qem"]);
}

#[test]
fn no_temporary_file_remains() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [2, 3, 9, 9];
    let data = frames(shape, 2);
    // Success.
    write_file(dir.path().join("ok.qem"), counts_spec(shape), &le(&data)).unwrap();
    assert_eq!(entries(dir.path()), ["ok.qem"]);
    // Too few frames: finish fails.
    let mut w = Writer::create(dir.path().join("short.qem"), counts_spec(shape)).unwrap();
    w.push_u16(&data[..data.len() - 1]).unwrap();
    assert!(matches!(w.finish(), Err(WriteError::Incomplete { .. })));
    // Abandoned writer.
    let mut w = Writer::create(dir.path().join("dropped.qem"), counts_spec(shape)).unwrap();
    w.push_u16(&data[..100]).unwrap();
    drop(w);
    // Too many frames.
    let mut w = Writer::create(dir.path().join("long.qem"), counts_spec(shape)).unwrap();
    w.push_u16(&data).unwrap();
    assert!(matches!(
        w.push_u16(&[0]),
        Err(WriteError::TooMuchData { .. })
    ));
    drop(w);
    assert_eq!(entries(dir.path()), ["ok.qem"]);
}

#[test]
fn file_and_memory_outputs_agree_and_are_well_formed() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [13, 200, 7, 5];
    let data = le(&frames(shape, 3));
    let path = dir.path().join("x.qem");
    let spec = counts_spec(shape).with_chunk_scans(1000);
    let summary = write_file(&path, spec.clone(), &data).unwrap();
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file, encode_to_vec(spec, &data).unwrap());
    assert_eq!(file.len() as u64, summary.file_bytes);
    // Envelope (spec §2).
    assert_eq!(&file[..8], b"QEMDATA1");
    let n = u64::from_le_bytes(file[8..16].try_into().unwrap());
    assert_eq!(u64::from_le_bytes(file[16..24].try_into().unwrap()), 56 + n);
    use sha2::Digest;
    let header = &file[56..56 + n as usize];
    assert_eq!(&file[24..56], sha2::Sha256::digest(header).as_slice());
    let h: Value = serde_json::from_slice(header).unwrap();
    assert_eq!(h["bytes"], json!(file.len() as u64 - 56 - n));
    let chunks: Vec<(u64, u64)> = h["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["first"].as_u64().unwrap(), c["scans"].as_u64().unwrap()))
        .collect();
    assert_eq!(chunks, [(0, 1000), (1000, 1000), (2000, 600)]);
    // Every array starts 8-aligned and the last one ends the body.
    let mut cursor = 0u64;
    for c in h["chunks"].as_array().unwrap() {
        for a in c["arrays"].as_array().unwrap() {
            let off = a["offset"].as_u64().unwrap();
            assert_eq!(off, cursor.div_ceil(8) * 8);
            let elem = [1, 4, 1, 4, 8, 1][c["arrays"]
                .as_array()
                .unwrap()
                .iter()
                .position(|x| x == a)
                .unwrap()];
            cursor = off + elem * a["count"].as_u64().unwrap();
        }
    }
    assert_eq!(cursor, h["bytes"].as_u64().unwrap());
}

#[test]
fn smallest_is_never_larger_than_reference() {
    for (shape, seed) in [
        ([4, 300, 9, 9], 5),
        ([2, 50, 16, 16], 6),
        ([1, 513, 3, 3], 7),
    ] {
        let data = le(&frames(shape, seed));
        let reference =
            encode_to_vec(counts_spec(shape).with_model(ModelChoice::Reference), &data).unwrap();
        let smallest =
            encode_to_vec(counts_spec(shape).with_model(ModelChoice::Smallest), &data).unwrap();
        assert!(
            smallest.len() <= reference.len(),
            "{shape:?}: {} > {}",
            smallest.len(),
            reference.len()
        );
    }
}

#[test]
fn caller_input_errors() {
    let shape = [1, 2, 2, 3];
    let sm = scientific_metadata(shape, &Calibration::default()).unwrap();
    let err = |spec: WriteSpec| Writer::in_memory(spec).err().unwrap();
    // Shape.
    let bad = [1, 0, 2, 3];
    assert!(matches!(
        err(WriteSpec::counts(bad, CountDtype::U8, sm.clone())),
        WriteError::Shape { .. }
    ));
    let huge = [1, 1, 1 << 24, 1];
    assert!(matches!(
        err(WriteSpec::counts(huge, CountDtype::U8, sm.clone())),
        WriteError::Shape { .. }
    ));
    // Metadata disagreeing with the shape.
    let mut s = counts_spec(shape);
    s.shape = [1, 2, 2, 4];
    assert!(matches!(err(s), WriteError::Metadata { .. }));
    // Mask length.
    let mut s = counts_spec(shape);
    if let Content::Counts { valid, .. } = &mut s.content {
        *valid = Some(vec![true; 5]);
    }
    assert!(matches!(
        err(s),
        WriteError::ValidMask {
            got: 5,
            expected: 6
        }
    ));
    // Chunk lengths.
    assert!(matches!(
        err(counts_spec(shape).with_chunk_scans(0)),
        WriteError::ChunkScans { .. }
    ));
    assert!(matches!(
        err(counts_spec(shape).with_chunk_scans(1025)),
        WriteError::ChunkScans { .. }
    ));
    let fs = WriteSpec::float32(
        [1, 1, 1024, 1024],
        scientific_metadata([1, 1, 1024, 1024], &Calibration::default()).unwrap(),
    );
    assert!(matches!(
        err(fs.with_chunk_scans(9)),
        WriteError::ChunkScans { .. }
    ));
    // A shape the format cannot hold: refused before anything its size is
    // made. A detector whose validity mask alone outgrows the header (its
    // mask as JSON booleans took 8.6 GB, the whole conversion 19 GB and
    // 37 s), and a scan whose chunk list alone does.
    let shape_refused = |shape| match err(counts_spec(shape)) {
        WriteError::Shape { reason, .. } => reason,
        other => panic!("{other}"),
    };
    let reason = shape_refused([1, 1, 16384, 16384]);
    assert!(reason.contains("validity mask"), "{reason}");
    let reason = shape_refused([1 << 16, 1 << 16, 1, 1]);
    assert!(reason.contains("8388608 chunks"), "{reason}");
    // Writer-owned members cannot be supplied.
    let mut s = counts_spec(shape);
    s.extra.insert("bytes".into(), json!(1));
    assert!(matches!(err(s), WriteError::ReservedMember(_)));
    // Header over 16 MiB: refused before any encoding...
    let mut s = counts_spec(shape);
    s.extra
        .insert("x_big".into(), Value::String("a".repeat(17 << 20)));
    assert!(matches!(err(s), WriteError::HeaderTooLarge(_)));
    // ...or at the end, when the chunk list tips it over.
    let mut s = counts_spec(shape).with_chunk_scans(1);
    s.extra
        .insert("x_big".into(), Value::String("a".repeat((16 << 20) - 1000)));
    let mut w = Writer::in_memory(s).unwrap();
    w.push(&[0; 24]).unwrap();
    assert!(matches!(
        w.finish_to_vec(),
        Err(WriteError::HeaderTooLarge(_))
    ));
    // Non-finite calibration.
    let cal = Calibration {
        voltage_kv: Some(f64::NAN),
        ..Calibration::default()
    };
    assert!(scientific_metadata(shape, &cal).is_err());
    // Wrong number of bytes.
    let mut w = Writer::in_memory(counts_spec(shape)).unwrap();
    assert!(matches!(
        w.push(&[0; 25]),
        Err(WriteError::TooMuchData { .. })
    ));
}

fn scaled_sm(shape: [u64; 4]) -> Value {
    let cal = Calibration {
        processing: vec![Calibration::scaled_quantization_record()],
        ..Calibration::default()
    };
    scientific_metadata(shape, &cal).unwrap()
}

fn region(first: u64, stop: u64, scale: f64) -> ScaledRegion {
    ScaledRegion {
        first_frame: first,
        stop_frame: stop,
        scale,
        offset: 0.0,
        intensity_min: 0.0,
        intensity_max: 1.0,
        extra: Map::new(),
    }
}

#[test]
fn scaled_regions_are_checked_and_bound_chunks() {
    let shape = [1, 30, 2, 2];
    let err =
        |regions| Writer::in_memory(WriteSpec::scaled(shape, regions, scaled_sm(shape))).err();
    assert!(matches!(err(vec![]), Some(WriteError::Regions(_))));
    assert!(matches!(
        err(vec![region(0, 10, 1.0), region(11, 30, 1.0)]),
        Some(WriteError::Regions(_))
    ));
    assert!(matches!(
        err(vec![region(0, 29, 1.0)]),
        Some(WriteError::Regions(_))
    ));
    assert!(matches!(
        err(vec![region(0, 30, 0.0)]),
        Some(WriteError::Regions(_))
    ));
    assert!(matches!(
        err(vec![region(0, 30, f64::INFINITY)]),
        Some(WriteError::Regions(_))
    ));
    // Without the quantisation record the metadata is refused.
    let plain = scientific_metadata(shape, &Calibration::default()).unwrap();
    assert!(matches!(
        Writer::in_memory(WriteSpec::scaled(shape, vec![region(0, 30, 1.0)], plain)).err(),
        Some(WriteError::Metadata { .. })
    ));
    let spec = WriteSpec::scaled(
        shape,
        vec![region(0, 7, 1.0), region(7, 30, 2.0)],
        scaled_sm(shape),
    )
    .with_chunk_scans(10);
    let file = encode_to_vec(spec, &vec![3u8; 30 * 4 * 2]).unwrap();
    let n = u64::from_le_bytes(file[8..16].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&file[56..56 + n]).unwrap();
    let chunks: Vec<(u64, u64, u64)> = h["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["first"].as_u64().unwrap(),
                c["scans"].as_u64().unwrap(),
                c["region"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(chunks, [(0, 7, 0), (7, 10, 1), (17, 10, 1), (27, 3, 1)]);
    assert!(h.get("metadata").is_none());
}

#[test]
fn calibrated_metadata_matches_the_reference_form() {
    // The scientific metadata of fixture u8-mixed-13x7, rebuilt from its calibration.
    let shape = [3, 5, 13, 7];
    let mut source = Map::new();
    source.insert("data_origin".into(), "deterministic synthetic".into());
    let cal = Calibration {
        scan_sampling_angstrom: Some([0.4, 0.6]),
        detector_sampling: Some(([0.02, 0.03], DetectorUnit::InverseAngstrom)),
        voltage_kv: Some(300.0),
        source_metadata: source,
        ..Calibration::default()
    };
    let ours = scientific_metadata(shape, &cal).unwrap();
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance/qem");
    let file = std::fs::read(dir.join("u8-mixed-13x7.qem")).unwrap();
    let n = u64::from_le_bytes(file[8..16].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&file[56..56 + n]).unwrap();
    assert_eq!(
        qemfs::qem::write::to_canonical_json(&ours).unwrap(),
        qemfs::qem::write::to_canonical_json(&h["scientific_metadata"]).unwrap()
    );
}

/// Header text and body of a `.qem` file's bytes.
fn header_and_body(file: &[u8]) -> (&[u8], &[u8]) {
    let n = u64::from_le_bytes(file[8..16].try_into().unwrap()) as usize;
    (&file[56..56 + n], &file[56 + n..])
}

/// A large array written with the default policy leaves room for its header
/// before the body (so the body is written once, not moved): the canonical
/// header followed by spaces, 4 KiB-aligned, the same bytes in memory and on
/// disk, a valid file that decodes to the input, and larger than the
/// reference policy's file by no more than those spaces; the reference
/// policy keeps the exact header.
#[test]
fn a_large_arrays_header_fills_the_room_before_its_body() {
    use qemfs::qem::{QemFile, ValidationLevel};
    let shape = [32, 64, 128, 128]; // 64 MiB of uint16
    let values = frames(shape, 11);
    let data = le(&values);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.qem");
    let spec = counts_spec(shape);
    let summary = write_file(&path, spec.clone(), &data).unwrap();
    let file = std::fs::read(&path).unwrap();
    assert!(
        file == encode_to_vec(spec, &data).unwrap(),
        "file and memory differ"
    );
    assert_eq!(summary.file_bytes, file.len() as u64);
    let (header, body) = header_and_body(&file);
    assert_eq!(
        (56 + header.len()) % 4096,
        0,
        "the body starts on a 4 KiB boundary"
    );
    let text = std::str::from_utf8(header).unwrap();
    let exact = text.trim_end_matches(' ');
    assert!(exact.len() < text.len(), "no room was left");
    let parsed: Value = serde_json::from_str(exact).unwrap();
    assert_eq!(
        qemfs::qem::write::to_canonical_json(&parsed).unwrap(),
        exact
    );
    assert_eq!(parsed["bytes"], json!(body.len()));

    let opened = QemFile::open(&path).unwrap();
    opened.validate(ValidationLevel::Full).unwrap();
    let mut decoded = vec![0u8; data.len()];
    opened.read_all(&mut decoded).unwrap();
    assert!(decoded == data, "decoded values differ");

    let padding = text.len() - exact.len();
    let reference =
        encode_to_vec(counts_spec(shape).with_model(ModelChoice::Reference), &data).unwrap();
    let (reference_header, reference_body) = header_and_body(&reference);
    assert!(body.len() <= reference_body.len());
    assert!(file.len() <= reference.len() + padding);
    assert_ne!(
        reference_header.last(),
        Some(&b' '),
        "the reference policy's header was padded"
    );
}
