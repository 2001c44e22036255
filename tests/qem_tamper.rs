//! Deliberately damaged files: a tampered spatial index, a flipped payload
//! bit, truncation, and random mutations, each rejected with the right error
//! and never a panic.

use std::path::Path;

use proptest::prelude::*;
use qemfs::qem::{ErrorKind, QemError, QemFile, StreamSite, Tile, ValidationLevel};

#[path = "support/reseal.rs"]
mod reseal;
use reseal::{array_count, array_offset, body_start, refresh_checksums, reseal_header};

fn fixture(name: &str) -> Vec<u8> {
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/qem"
    ));
    std::fs::read(dir.join(format!("{name}.qem"))).unwrap()
}

#[test]
fn tampered_spatial_index_fails_full_validation_only() {
    let original = fixture("u8-mixed-13x7");
    let words = array_offset(&original, 3);
    let mut bytes = original.clone();
    let at = body_start(&bytes) + words;
    bytes[at] ^= 1;
    let bytes = refresh_checksums(bytes, &original);
    let f = QemFile::from_bytes(bytes).unwrap();
    // The index is structurally sound, and upstream would accept it.
    f.validate(ValidationLevel::Quick).unwrap();
    let mut frame = vec![0u8; f.frame_bytes()];
    f.read_frame(0, &mut frame).unwrap();
    match f.validate(ValidationLevel::Full) {
        Err(QemError::SpatialIndex {
            chunk: 0,
            block: 0,
            field: 0,
            frame: 0,
            stored,
            computed,
        }) => assert_eq!(stored ^ 1, computed),
        other => panic!("expected a spatial index mismatch, got {other:?}"),
    }
    // Reading frame 0 decoded its whole block, which compared the block's
    // counts with its index: from then on the index is refused.
    assert!(matches!(
        f.block_index_verdict(0),
        Some(Err(QemError::SpatialIndex { .. }))
    ));
    assert!(matches!(
        f.spatial_sums(Tile::Px8, 0..1),
        Err(QemError::SpatialIndex { .. })
    ));
    // The counts themselves are sound and still served.
    let good = QemFile::from_bytes(original).unwrap();
    let mut want = vec![0u8; good.frame_bytes()];
    good.read_frame(0, &mut want).unwrap();
    assert_eq!(frame, want);
}

#[test]
fn a_tampered_index_is_never_served_once_checked_or_when_asked_to_verify() {
    let original = fixture("u8-mixed-13x7");
    let at = body_start(&original) + array_offset(&original, 3);
    let mut bytes = original.clone();
    bytes[at] ^= 1;
    let bytes = refresh_checksums(bytes, &original);
    let good = QemFile::from_bytes(original).unwrap();
    let want = good.spatial_sums(Tile::Px8, 0..1).unwrap();

    // By default a block nothing has decoded yet is trusted (the index is
    // there to avoid decoding)...
    let f = QemFile::from_bytes(bytes.clone()).unwrap();
    assert!(f.block_index_verdict(0).is_none());
    assert_eq!(f.spatial_sums(Tile::Px8, 0..1).unwrap()[0] ^ 1, want[0]);
    // ...and asked to verify, it decodes the block first and refuses.
    assert!(matches!(
        f.spatial_sums_checked(Tile::Px8, 0..1, true),
        Err(QemError::SpatialIndex { .. })
    ));
    assert!(f.spatial_sums(Tile::Px8, 0..1).is_err(), "remembered");

    // Every whole-block decode checks: codes, dense blocks, frame ranges.
    for decode in [
        |f: &QemFile| f.decode_block(0).map(|_| ()),
        |f: &QemFile| {
            let mut codes = vec![0u16; f.blocks()[0].frames * f.pixels()];
            f.decode_block_codes(0, &mut codes)
        },
        |f: &QemFile| {
            let mut out = vec![0u8; 2 * f.frame_bytes()];
            f.read_frames(1..3, &mut out)
        },
    ] {
        let f = QemFile::from_bytes(bytes.clone()).unwrap();
        decode(&f).unwrap();
        assert!(matches!(
            f.block_index_verdict(0),
            Some(Err(QemError::SpatialIndex { .. }))
        ));
    }
    // A sound file's blocks are found sound, and verified sums are exact.
    good.decode_block(0).unwrap();
    assert!(matches!(good.block_index_verdict(0), Some(Ok(()))));
    assert_eq!(
        good.spatial_sums_checked(Tile::Px8, 0..1, true).unwrap(),
        want
    );
}

#[test]
fn flipped_payload_bit() {
    let original = fixture("u16-allmodels-8x9");
    let start = body_start(&original);
    let payload = array_offset(&original, 0);
    // Stream 0 is rANS (table 0); flip a bit of its initial state's low byte.
    let mut bytes = original.clone();
    bytes[start + payload] ^= 0x10;

    // Checksums not updated: the body block is refused, by name.
    let f = QemFile::from_bytes(bytes.clone()).unwrap();
    let mut frame = vec![0u8; f.frame_bytes()];
    assert!(matches!(
        f.read_frame(3, &mut frame),
        Err(QemError::BodyChecksum { block: 0 })
    ));
    assert!(matches!(
        f.validate(ValidationLevel::Quick),
        Err(QemError::BodyChecksum { block: 0 })
    ));

    // Checksums updated: quick passes, decoding names the stream.
    let f = QemFile::from_bytes(refresh_checksums(bytes, &original)).unwrap();
    f.validate(ValidationLevel::Quick).unwrap();
    let site = StreamSite {
        chunk: 0,
        stream: 0,
    };
    let err = f.validate(ValidationLevel::Full).unwrap_err();
    assert!(
        matches!(&err, QemError::Stream { site: s, .. } if *s == site),
        "{err}"
    );
    assert!(err.to_string().contains("chunk 0 stream 0"), "{err}");
    assert!(
        matches!(f.read_frame(0, &mut frame), Err(QemError::Stream { site: s, .. }) if s == site)
    );
    assert!(matches!(f.decode_pixels(&[0]), Err(QemError::Stream { site: s, .. }) if s == site));
    // Another pixel's stream is intact and still readable on its own.
    f.decode_pixels(&[1]).unwrap();
}

#[test]
fn truncated_files() {
    let original = fixture("u8-worked-example");
    for cut in [1, 10, original.len() - 56] {
        let bytes = original[..original.len() - cut].to_vec();
        let err = QemFile::from_bytes(bytes).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::FileLength | ErrorKind::HeaderLength),
            "cut {cut}: {err}"
        );
    }
    let err = QemFile::from_bytes(original[..40].to_vec()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotQem);
    let err = QemFile::from_bytes(Vec::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotQem);
}

/// Exercises every read path; only panics matter here.
fn read_everything(bytes: Vec<u8>) {
    let Ok(f) = QemFile::from_bytes(bytes) else {
        return;
    };
    let _ = f.validate(ValidationLevel::Full);
    if let Some(n) = f.dense_bytes() {
        let mut out = vec![0u8; n];
        let _ = f.read_all(&mut out);
    }
    let mut frame = vec![0u8; f.frame_bytes()];
    let _ = f.read_frame(f.frames() - 1, &mut frame);
    let _ = f.decode_pixels(&[0, f.pixels() - 1]);
    let _ = f.spatial_sums(Tile::Px32, 0..f.frames());
    for b in 0..f.blocks().len() {
        let _ = f.decode_block(b);
    }
}

const FUZZ_FIXTURES: [&str; 5] = [
    "u8-mixed-13x7",
    "u16-allmodels-8x9",
    "f32-special-13x7",
    "scaled-three-regions-9x9",
    "u8-sparse-17x9",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn mutated_bodies_never_panic(
        which in 0..FUZZ_FIXTURES.len(),
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..6),
    ) {
        let original = fixture(FUZZ_FIXTURES[which]);
        let start = body_start(&original);
        let mut bytes = original.clone();
        let body = bytes.len() - start;
        for (pos, val) in edits {
            bytes[start + pos as usize % body] = val;
        }
        read_everything(refresh_checksums(bytes, &original));
    }

    #[test]
    fn mutated_headers_never_panic(
        which in 0..FUZZ_FIXTURES.len(),
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = fixture(FUZZ_FIXTURES[which]);
        let start = body_start(&bytes);
        for (pos, val) in edits {
            // Digits and punctuation keep the JSON plausible.
            let pick = b"0123456789,:[]{}\" -9e.";
            bytes[56 + pos as usize % (start - 56)] = pick[usize::from(val) % pick.len()];
        }
        reseal_header(&mut bytes);
        read_everything(bytes);
    }
}

/// The packed index words of chunk 0 (array 3, u32 words): file offset
/// and bytes.
fn index_words(bytes: &[u8]) -> (usize, usize) {
    (
        body_start(bytes) + array_offset(bytes, 3),
        4 * array_count(bytes, 3),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// A forged index (two flipped bits: two disagreements, in any fields
    /// and frames) is named the same by a whole-block check and by a
    /// cursor reading one frame at a time; the cursor remembers it as soon
    /// as it reads the frame named, so that no index product is served
    /// from the block after that, however many frames remain.
    #[test]
    fn a_cursor_names_and_remembers_the_whole_blocks_first_disagreement_at_once(
        which in 0..2usize,
        bits in proptest::collection::vec(any::<u32>(), 2),
    ) {
        let name = ["u16-invalid-mask-33x40", "u8-mixed-13x7"][which];
        let original = fixture(name);
        let (at, len) = index_words(&original);
        let mut bytes = original.clone();
        for b in &bits {
            let bit = *b as usize % (8 * len);
            bytes[at + bit / 8] ^= 1 << (bit % 8);
        }
        let bytes = refresh_checksums(bytes, &original);
        let whole = QemFile::from_bytes(bytes.clone()).unwrap().validate(ValidationLevel::Full);
        // Flips of unused bits, or two flips of the same bit, forge nothing.
        let Err(whole @ QemError::SpatialIndex { frame, .. }) = whole else {
            return Err(TestCaseError::reject("no disagreement"));
        };
        let f = QemFile::from_bytes(bytes).unwrap();
        let mut cursor = f.block_cursor(0).unwrap();
        let mut out = vec![0u8; f.frame_bytes()];
        while cursor.next_frame() <= frame {
            prop_assert!(f.block_index_verdict(0).is_none(), "known before frame {frame} was read");
            prop_assert!(f.spatial_sums(Tile::Px8, 0..1).is_ok());
            cursor.read(&f, 1, &mut out).unwrap();
        }
        match f.block_index_verdict(0) {
            Some(Err(e)) => prop_assert_eq!(e.to_string(), whole.to_string()),
            other => prop_assert!(false, "after frame {frame}: {other:?}"),
        }
        prop_assert!(f.spatial_sums(Tile::Px8, 0..1).is_err());
    }
}

#[test]
fn a_file_changed_during_validation_is_reported_as_changed() {
    use qemfs::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec,
    };
    use qemfs::qem::{validate_path, ErrorKind, ValidationLevel};
    let shape = [16u64, 16, 64, 64];
    let dense: Vec<u8> = (0..16 * 16 * 64 * 64u32)
        .flat_map(|i| ((i.wrapping_mul(2_654_435_761) >> 28) as u16).to_le_bytes())
        .collect();
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moving.qem");
    std::fs::write(&path, encode_to_vec(spec, &dense).unwrap()).unwrap();
    assert!(validate_path(&path, ValidationLevel::Full).is_ok());

    // Touch the file while validations run: one that overlaps a touch
    // must say the file changed. On a loaded machine the toucher can be
    // descheduled for a whole (few-millisecond) validation, which then
    // rightly sees a stable file, so validation is repeated until one
    // overlaps; no attempt may fail any other way.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let done = AtomicBool::new(false);
    let touches = AtomicU64::new(0);
    let changed = std::thread::scope(|s| {
        s.spawn(|| {
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            while !done.load(Ordering::SeqCst) {
                let k = touches.fetch_add(1, Ordering::SeqCst) + 1;
                let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + k);
                file.set_modified(t).unwrap();
            }
        });
        let mut found = None;
        for _ in 0..200 {
            match validate_path(&path, ValidationLevel::Full) {
                Ok(_) => std::thread::yield_now(),
                Err(e) => {
                    found = Some(e);
                    break;
                }
            }
        }
        done.store(true, Ordering::SeqCst);
        found
    });
    let err = changed.expect("200 validations while the file was being touched all saw it stable");
    assert_eq!(err.kind(), ErrorKind::Changed, "{err}");
    assert!(err.to_string().contains("retry with a stable copy"));
}

#[test]
fn every_sound_counts_file_decodes_with_its_index_found_sound() {
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/qem"
    ));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut checked = 0;
    for e in manifest["entries"].as_array().unwrap() {
        if e["expected"] != "accepted" {
            continue;
        }
        let f = QemFile::from_bytes(fixture(e["name"].as_str().unwrap())).unwrap();
        if f.codec() != qemfs::qem::Codec::Integer {
            continue;
        }
        for b in 0..f.blocks().len() {
            f.decode_block(b).unwrap();
            assert!(
                matches!(f.block_index_verdict(b), Some(Ok(()))),
                "{} block {b}: {:?}",
                e["name"],
                f.block_index_verdict(b)
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} counts fixtures");
}

/// Full validation on `threads` threads of a fresh reader of `bytes`: the
/// report, or the error's text.
fn validated(bytes: &[u8], threads: usize) -> Result<qemfs::qem::ValidationReport, String> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        QemFile::from_bytes(bytes.to_vec())
            .and_then(|f| f.validate(ValidationLevel::Full))
            .map_err(|e| e.to_string())
    })
}

/// With more than one thread, full validation decodes while the body's
/// checksums are computed (from bytes not yet verified); its verdict must be
/// the one validating in order gives, for every kind of damage.
#[test]
fn validating_while_hashing_gives_the_sequential_verdict() {
    use qemfs::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec,
    };
    use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};

    let shape = [20u64, 40, 24, 24];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let dense: Vec<u8> = (0..shape.iter().product::<u64>())
        .flat_map(|_| ((rng.next_u64() % 9) as u16 * 3).to_le_bytes())
        .collect();
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let original = encode_to_vec(spec, &dense).unwrap();
    let start = body_start(&original);
    // The overlap only runs where the body outweighs the header.
    assert!(16 * (start - 56) < original.len() - start, "{start}");

    let payload = array_offset(&original, 0);
    let offsets = array_offset(&original, 1);
    let index = array_offset(&original, 3);
    let flip = |at: usize, refresh: bool| {
        let mut bytes = original.clone();
        bytes[start + at] ^= 0x10;
        if refresh {
            refresh_checksums(bytes, &original)
        } else {
            bytes
        }
    };
    let cases = [
        ("valid", original.clone()),
        ("payload, checksum stale", flip(payload + 100, false)),
        ("payload", flip(payload + 100, true)),
        ("stream offsets", flip(offsets + 4 * 37 + 1, true)),
        ("spatial index", flip(index + 8, true)),
    ];
    for (what, bytes) in &cases {
        let sequential = validated(bytes, 1);
        let overlapped = validated(bytes, 2);
        assert_eq!(overlapped, sequential, "{what}");
        match *what {
            "valid" => assert!(sequential.is_ok()),
            "payload, checksum stale" => {
                assert!(sequential.unwrap_err().contains("checksum"), "{what}")
            }
            _ => assert!(sequential.is_err(), "{what}"),
        }
    }
}
