//! Rules of the spec that the shared fixtures do not pin down by
//! themselves: error precedence of encode and construct-from-rows, units()
//! of absent ids, measure's argument checks, reserved floor values.

use qemfs::semq::{self, floor, Config, Encoding, Floor, Id, IdKind, IdList, IdRef, Section};
use rand::{rngs::Xoshiro256PlusPlus, Rng, RngExt, SeedableRng};

const NONE: &[(&str, &str)] = &[];

#[test]
fn encode_reports_a_bad_row_before_a_bad_manifest() {
    let c = Config::quant(4, 4).unwrap();
    let err = semq::encode(
        c,
        &IdList::U64(vec![1]),
        &[f32::NAN, 1.0, 0.0, 0.0],
        &[("", "x")],
    )
    .unwrap_err();
    assert_eq!(
        (err.class(), err.row(), err.field()),
        ("InvalidInput", Some(0), Some(0))
    );
    let err = semq::encode(
        c,
        &IdList::U64(vec![1]),
        &[1.0, 0.0, 0.0, 0.0],
        &[("", "x")],
    )
    .unwrap_err();
    assert_eq!(
        (err.class(), err.row(), err.field()),
        ("InvalidInput", None, Some(0))
    );
}

#[test]
fn encode_checks_the_host_contract_first() {
    let c = Config::quant(4, 4).unwrap();
    let err = semq::encode(c, &IdList::U64(vec![1, 1]), &[1.0, 0.0, 0.0], NONE).unwrap_err();
    assert_eq!(
        (err.class(), err.row(), err.field()),
        ("InvalidInput", None, None)
    );
}

#[test]
fn subnormals_and_negative_zero_flush_to_positive_zero() {
    let c = Config::quant(4, 4).unwrap();
    let tiny = f32::from_bits(1);
    let e = semq::encode(c, &IdList::U64(vec![1]), &[1.0, -0.0, -tiny, tiny], NONE).unwrap();
    // Positive sign, bin 0, for all three: symbol 4.
    assert_eq!(e.symbols(0).unwrap(), vec![7, 4, 4, 4]);
    let e = semq::encode(
        c,
        &IdList::U64(vec![1]),
        &[-1.0, -f32::MIN_POSITIVE, 0.0, 0.0],
        NONE,
    )
    .unwrap();
    // FLT_MIN itself is kept: negative sign, bin 0.
    assert_eq!(e.symbols(0).unwrap(), vec![3, 0, 4, 4]);
}

#[test]
fn from_rows_checks_rows_then_ids_then_manifest() {
    let c = Config::quant(4, 3).unwrap();
    // Symbol 6 of alphabet 6 at unit 2, and a duplicate id: the row wins.
    let mut bad = [0u8; 2];
    semq::rows::pack(&c, &[0, 0, 6, 0], &mut bad);
    let rows = [[0u8, 0], bad].concat();
    let err = semq::from_rows(c, &IdList::U64(vec![5, 5]), &rows, &[("", "")]).unwrap_err();
    assert_eq!(
        (err.class(), err.row(), err.field()),
        ("InvalidInput", Some(1), Some(2))
    );
    // A set padding bit has no unit.
    let err = semq::from_rows(c, &IdList::U64(vec![5]), &[0, 0x10], NONE).unwrap_err();
    assert_eq!((err.row(), err.field()), (Some(0), None));
    let err = semq::from_rows(c, &IdList::U64(vec![5, 5]), &[0; 4], &[("", "")]).unwrap_err();
    assert_eq!((err.row(), err.field()), (Some(1), None));
    let err = semq::from_rows(
        c,
        &IdList::U64(vec![5, 6]),
        &[0; 4],
        &[("k", "v"), ("", "")],
    )
    .unwrap_err();
    assert_eq!((err.row(), err.field()), (None, Some(1)));
}

#[test]
fn rows_are_reordered_by_id() {
    let c = Config::orbit(2, 50).unwrap();
    let e = semq::from_rows(c, &IdList::U64(vec![9, 5, 3]), &[1, 1, 2, 2, 3, 3], NONE).unwrap();
    let ids: Vec<String> = e.ids().map(|i| i.to_string()).collect();
    assert_eq!(ids, ["3", "5", "9"]);
    assert_eq!(e.rows_section(), &[3, 3, 2, 2, 1, 1]);
    assert_eq!(e.get(IdRef::U64(5)), Some(&[2u8, 2][..]));
    assert_eq!(e.get(IdRef::U64(4)), None);
    assert_eq!(e.get(IdRef::Utf8("5")), None);
}

#[test]
fn units_of_an_absent_or_foreign_id_are_invalid_input() {
    let c = Config::orbit(2, 50).unwrap();
    let a = semq::from_rows(c, &IdList::U64(vec![1, 2]), &[1, 1, 2, 2], NONE).unwrap();
    let b = semq::from_rows(c, &IdList::U64(vec![2, 3]), &[2, 3, 3, 3], NONE).unwrap();
    assert_eq!(a.units(&b, IdRef::U64(2)).unwrap(), vec![(1, 2, 3)]);
    for id in [IdRef::U64(1), IdRef::U64(3), IdRef::Utf8("2")] {
        assert_eq!(a.units(&b, id).unwrap_err().class(), "InvalidInput");
    }
}

#[test]
fn measure_checks_its_nulls_in_order() {
    let c = Config::orbit(2, 50).unwrap();
    let base = semq::from_rows(c, &IdList::U64(vec![1, 2]), &[1, 1, 2, 2], NONE).unwrap();
    let null = semq::from_rows(c, &IdList::U64(vec![1, 2]), &[1, 1, 2, 3], NONE).unwrap();
    let other_ref = semq::from_rows(c, &IdList::U64(vec![1, 2]), &[1, 1, 2, 4], NONE).unwrap();
    assert_eq!(
        floor::measure(&[], false).unwrap_err().class(),
        "InvalidInput"
    );
    let d0 = base.diff(&null).unwrap();
    let d1 = other_ref.diff(&null).unwrap();
    let err = floor::measure(&[d0.clone(), d1], false).unwrap_err();
    assert_eq!((err.class(), err.field()), ("Incompatible", Some(1)));
    let empty = semq::encode::empty(c, IdKind::U64, semq::Manifest::empty()).unwrap();
    let err = floor::measure(&[empty.diff(&empty).unwrap()], false).unwrap_err();
    assert_eq!((err.class(), err.field()), ("InvalidInput", Some(0)));
    let f = floor::measure(std::slice::from_ref(&d0), true).unwrap();
    assert_eq!(
        (
            f.changed_rows(),
            f.total_rows(),
            f.hamming(),
            f.max_hamming()
        ),
        (1, 2, 1, Some(1))
    );
    assert_eq!(f.distinct_nulls(), Some(1));
    // Without the per-row option neither per-row field is recorded.
    let f = floor::measure(&[d0.clone(), d0], false).unwrap();
    assert_eq!(
        (f.nulls(), f.max_hamming(), f.distinct_nulls()),
        (2, None, None)
    );
}

#[test]
fn the_gate_ignores_added_rows_and_other_manifest_keys() {
    let c = Config::orbit(2, 50).unwrap();
    let base = semq::from_rows(
        c,
        &IdList::U64(vec![1, 2]),
        &[1, 1, 2, 2],
        &[("encoder", "e")],
    )
    .unwrap();
    let null = semq::from_rows(
        c,
        &IdList::U64(vec![1, 2]),
        &[1, 1, 2, 3],
        &[("encoder", "e")],
    )
    .unwrap();
    let f = floor::measure(&[base.diff(&null).unwrap()], true).unwrap();
    let cand = semq::from_rows(
        c,
        &IdList::U64(vec![1, 2, 7]),
        &[1, 1, 2, 3, 5, 5],
        &[("encoder", "e"), ("note", "x")],
    )
    .unwrap();
    let v = floor::evaluate(&base.diff(&cand).unwrap(), &f, true).unwrap();
    assert!(v.passed, "{v:?}");
    let renamed = semq::from_rows(
        c,
        &IdList::U64(vec![1, 2]),
        &[1, 1, 2, 2],
        &[("encoder", "f")],
    )
    .unwrap();
    let v = floor::evaluate(&base.diff(&renamed).unwrap(), &f, false).unwrap();
    assert_eq!(v.reasons, [semq::Reason::Encoder]);
    assert_eq!(v.rows, Vec::<Id>::new());
}

#[test]
fn floor_json_keeps_counts_above_2_pow_53_exact() {
    let text = br#"{"version":"semq-floor/1","config":{"operator":"quant","dim":16,"bins":4,"rule_revision":0},"id_kind":"u64","reference_id":"69eb229d3dffb2ec1d76c0240d150ec35619a3d2be36f69176dc4f48af5c0a9c","nulls":9007199254740993,"changed_rows":9007199254740993,"total_rows":18446744073709551615,"hamming":1}"#;
    let f = Floor::from_json(text).unwrap();
    assert_eq!(f.nulls(), 9_007_199_254_740_993);
    assert_eq!(f.total_rows(), u64::MAX);
    assert_eq!(f.to_json().as_bytes(), &text[..]);
}

#[test]
fn reader_reports_sections_for_hand_made_images() {
    let c = Config::quant(4, 4).unwrap();
    let e = semq::from_rows(c, &IdList::U64(vec![1, 2]), &[0, 0, 1, 0], NONE).unwrap();
    let good = e.image().to_vec();
    // Swap the two ids: sorted order broken, digests stale; ids come first.
    let mut bad = good.clone();
    bad[28..36].copy_from_slice(&2u64.to_le_bytes());
    bad[36..44].copy_from_slice(&1u64.to_le_bytes());
    assert_eq!(
        Encoding::from_slice(&bad).unwrap_err().section(),
        Some(Section::Ids)
    );
    // n = 2^64 - 1: rows_len overflows (sizes).
    let mut bad = good.clone();
    bad[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        Encoding::from_slice(&bad).unwrap_err().section(),
        Some(Section::Sizes)
    );
    // Any buffer under 96 bytes is a framing error, whatever it holds.
    assert_eq!(
        Encoding::from_slice(&good[..95]).unwrap_err().section(),
        Some(Section::Framing)
    );
    assert_eq!(Encoding::from_slice(&good).unwrap(), e);
}

/// Deterministic unit vectors (seeded Xoshiro256++, normalized in binary64).
fn unit_rows(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let v: Vec<f64> = (0..dim).map(|_| rng.random::<f64>() - 0.5).collect();
        let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        out.extend(v.iter().map(|a| (a / norm) as f32));
    }
    out
}

#[test]
fn encoding_many_blocks_matches_building_from_the_same_symbols() {
    // 4096 × 7 bits = 3584 bytes per row: a 4 MiB block holds ~1170 rows,
    // so 3000 rows span three pipeline blocks.
    let (n, dim) = (3000usize, 4096usize);
    let c = Config::quant(dim as u32, 64).unwrap();
    let vectors = unit_rows(n, dim, 7);
    let ids: Vec<u64> = (0..n as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let e = semq::encode(c, &IdList::U64(ids.clone()), &vectors, &[("encoder", "t")]).unwrap();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    let rebuilt =
        semq::from_symbols(c, &IdList::U64(sorted), &e.unpack(), &[("encoder", "t")]).unwrap();
    assert_eq!(rebuilt.image(), e.image());

    // Bad rows in the second and third block: the smaller id is reported.
    let order = {
        let mut o: Vec<usize> = (0..n).collect();
        o.sort_by_key(|&i| ids[i]);
        o
    };
    let (second, third) = (order[1500], order[2900]);
    let mut bad = vectors.clone();
    bad[third * dim] = f32::INFINITY;
    bad[second * dim + 3] = 2.0;
    let err = semq::encode(c, &IdList::U64(ids), &bad, NONE).unwrap_err();
    assert_eq!((err.row(), err.field()), (Some(second as u64), None));
}

#[test]
fn reader_survives_damaged_fixture_files() {
    let root = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/semq"
    ));
    let mut files = Vec::new();
    for dir in ["files", "diff", "corrupt", "concat", "floor"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "semq") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 50);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next_u64();
    for path in files {
        let good = std::fs::read(&path).unwrap();
        if good.is_empty() {
            continue;
        }
        for _ in 0..40 {
            let mut bytes = good.clone();
            let flips = 1 + next() % 3;
            for _ in 0..flips {
                // Mostly the header and section boundaries, sometimes anywhere.
                let p = if next() % 2 == 0 {
                    next() as usize % bytes.len().min(64)
                } else {
                    next() as usize % bytes.len()
                };
                bytes[p] ^= (next() as u8) | 1;
            }
            let cut = if next() % 4 == 0 {
                next() as usize % (bytes.len() + 1)
            } else {
                bytes.len()
            };
            let bytes = &bytes[..cut];
            if let Ok(e) = Encoding::from_slice(bytes) {
                // Whatever is accepted is a complete, self-consistent image.
                assert_eq!(e.image(), bytes, "{}", path.display());
                assert_eq!(Encoding::from_slice(e.image()).unwrap(), e);
            }
        }
    }
}

#[test]
fn progress_reaches_the_total() {
    use std::sync::Mutex;
    let (n, dim) = (3000usize, 4096usize);
    let c = Config::quant(dim as u32, 64).unwrap();
    let ids: Vec<u64> = (0..n as u64).collect();
    let seen = Mutex::new(Vec::new());
    let record = |done: u64, total: u64| seen.lock().unwrap().push((done, total));
    let e = semq::encode_with_progress(c, &IdList::U64(ids), &unit_rows(n, dim, 3), NONE, &record)
        .unwrap();
    let reports = std::mem::take(&mut *seen.lock().unwrap());
    assert!(reports.len() >= 2, "{reports:?}");
    assert!(reports.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(reports.last(), Some(&(n as u64, n as u64)));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.semq");
    e.write(&path).unwrap();
    let back = Encoding::open_with_progress(&path, &record).unwrap();
    assert_eq!(back, e);
    let reports = seen.into_inner().unwrap();
    let s_len = (e.image().len() - 6 - 64 - e.manifest_section().len()) as u64;
    assert!(!reports.is_empty());
    assert_eq!(reports.last(), Some(&(s_len, s_len)));
}
