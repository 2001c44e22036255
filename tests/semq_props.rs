//! Property tests of the `.semq` library: write → read round trip, the
//! concat laws, empty self-diffs, floors that admit their own nulls,
//! input-order independence of encode, and a reader that never panics.

use rand::{rngs::Xoshiro256PlusPlus, RngExt, SeedableRng};
use std::collections::BTreeSet;

use proptest::prelude::*;
use qemfs::semq::{self, concat::concat, floor, Config, Encoding, IdList, Operator};

fn config_strategy() -> impl Strategy<Value = Config> {
    prop_oneof![
        (1u32..24, 2u32..=64).prop_map(|(d, b)| Config::quant(d, b).unwrap()),
        (1u32..6, 2u32..=256).prop_map(|(q, s)| Config::phase(4 * q, s).unwrap()),
        (1u32..8, 17u32..=256).prop_map(|(h, s)| Config::phase(2 * h, s).unwrap()),
        (1u32..24, 1u32..=1000).prop_map(|(d, s)| Config::orbit(d, s).unwrap()),
    ]
}

fn ids_strategy(max: usize) -> impl Strategy<Value = IdList> {
    prop_oneof![
        proptest::collection::btree_set(any::<u64>(), 0..max)
            .prop_map(|s| IdList::U64(s.into_iter().rev().collect())),
        proptest::collection::btree_set("[a-c\u{e9}\u{ff61}\u{10000}\t]{1,5}", 0..max)
            .prop_map(|s| IdList::Utf8(s.into_iter().rev().map(String::into_bytes).collect())),
    ]
}

/// A config, ids, one row of symbols per id and a manifest.
fn state_strategy() -> impl Strategy<Value = (Config, IdList, Vec<u8>, Vec<(String, String)>)> {
    (config_strategy(), ids_strategy(24)).prop_flat_map(|(config, ids)| {
        let len = ids.len() * config.units_per_row();
        let alphabet = config.alphabet();
        (
            Just(config),
            Just(ids),
            proptest::collection::vec(0..alphabet, len)
                .prop_map(|v| v.into_iter().map(|s| s as u8).collect()),
            proptest::collection::btree_map("[a-z_]{1,8}", "[ -~\u{e9}]{0,8}", 0..4)
                .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
        )
    })
}

fn build(config: Config, ids: &IdList, symbols: &[u8], manifest: &[(String, String)]) -> Encoding {
    semq::from_symbols(config, ids, symbols, manifest).expect("valid state")
}

/// Splits the ids and rows of a state into `k` disjoint parts by a mask.
fn split(
    config: Config,
    ids: &IdList,
    symbols: &[u8],
    assign: &[usize],
    k: usize,
) -> Vec<(IdList, Vec<u8>)> {
    let units = config.units_per_row();
    let mut parts: Vec<(IdList, Vec<u8>)> = (0..k)
        .map(|_| match ids {
            IdList::U64(_) => (IdList::U64(vec![]), vec![]),
            IdList::Utf8(_) => (IdList::Utf8(vec![]), vec![]),
        })
        .collect();
    for i in 0..ids.len() {
        let p = assign.get(i).copied().unwrap_or(0) % k;
        let (pids, psyms) = &mut parts[p];
        match (ids, pids) {
            (IdList::U64(all), IdList::U64(mine)) => mine.push(all[i]),
            (IdList::Utf8(all), IdList::Utf8(mine)) => mine.push(all[i].clone()),
            _ => unreachable!("parts share the kind of the whole"),
        }
        psyms.extend_from_slice(&symbols[i * units..(i + 1) * units]);
    }
    parts
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_round_trips((config, ids, symbols, manifest) in state_strategy()) {
        let e = build(config, &ids, &symbols, &manifest);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.semq");
        e.write(&path).unwrap();
        // Publishing never replaces an existing file.
        prop_assert!(e.write(&path).is_err());
        let back = Encoding::open(&path).unwrap();
        prop_assert_eq!(back.image(), e.image());
        prop_assert_eq!(back.state_id(), e.state_id());
        prop_assert_eq!(back.content_digest(), e.content_digest());
        prop_assert_eq!(back.manifest(), e.manifest());
        prop_assert_eq!(back.unpack(), e.unpack());
        prop_assert_eq!(Encoding::from_slice(e.image()).unwrap(), e.clone());
        // Only the final file is left in the directory.
        prop_assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // Every id is found at its sorted index.
        for i in 0..e.len() {
            let id = e.id(i).unwrap();
            prop_assert_eq!(e.find(id), Some(i));
        }
    }

    #[test]
    fn concat_laws((config, ids, symbols, manifest) in state_strategy(),
                   assign in proptest::collection::vec(0usize..3, 24)) {
        let whole = build(config, &ids, &symbols, &manifest);
        let parts: Vec<Encoding> = split(config, &ids, &symbols, &assign, 3)
            .iter()
            .map(|(i, s)| build(config, i, s, &manifest))
            .collect();
        let (a, b, c) = (&parts[0], &parts[1], &parts[2]);
        let abc = concat(&parts).unwrap();
        prop_assert_eq!(abc.image(), whole.image());
        // Commutative.
        prop_assert_eq!(concat(&[c.clone(), a.clone(), b.clone()]).unwrap(), whole.clone());
        // Associative.
        let left = concat(&[concat(&[a.clone(), b.clone()]).unwrap(), c.clone()]).unwrap();
        let right = concat(&[a.clone(), concat(&[b.clone(), c.clone()]).unwrap()]).unwrap();
        prop_assert_eq!(&left, &right);
        prop_assert_eq!(&left, &whole);
        // The empty state of the same config, kind and manifest is neutral.
        let empty = build(config, &ids.clone().emptied(), &[], &manifest);
        prop_assert_eq!(concat(&[empty.clone(), whole.clone(), empty]).unwrap(), whole.clone());
        // A part given twice shares its ids (unless it is empty).
        if !a.is_empty() {
            let err = concat(&[a.clone(), a.clone()]).unwrap_err();
            prop_assert_eq!(err.class(), "InvalidInput");
            prop_assert_eq!(err.field(), Some(1));
        }
    }

    #[test]
    fn diff_with_itself_is_empty((config, ids, symbols, manifest) in state_strategy()) {
        let e = build(config, &ids, &symbols, &manifest);
        let d = e.diff(&e).unwrap();
        prop_assert!(d.is_empty());
        prop_assert_eq!(d.n_unchanged, e.len() as u64);
        prop_assert_eq!(d.reference_id, d.candidate_id);
    }

    #[test]
    fn diff_counts_symbol_changes((config, ids, symbols, manifest) in state_strategy(),
                                  edits in proptest::collection::vec((any::<usize>(), any::<u32>()), 0..12)) {
        let mut changed = symbols.clone();
        for (pos, v) in &edits {
            if !changed.is_empty() {
                let p = pos % changed.len();
                changed[p] = (*v % config.alphabet()) as u8;
            }
        }
        let a = build(config, &ids, &symbols, &manifest);
        let b = build(config, &ids, &changed, &manifest);
        let d = a.diff(&b).unwrap();
        let units = config.units_per_row();
        let expected: usize = symbols.iter().zip(&changed).filter(|(x, y)| x != y).count();
        let total: u64 = d.changed.iter().map(|(_, h)| *h).sum();
        prop_assert_eq!(total, expected as u64);
        prop_assert_eq!(d.n_common(), ids.len() as u64);
        for (id, h) in &d.changed {
            let u = a.units(&b, id.as_ref()).unwrap();
            prop_assert_eq!(u.len() as u64, *h);
            prop_assert!(u.iter().all(|(unit, x, y)| *unit < units && x != y));
        }
    }

    #[test]
    fn a_floor_admits_every_null_it_was_measured_from(
        (config, ids, symbols, manifest) in state_strategy(),
        nulls in proptest::collection::vec(proptest::collection::vec((any::<usize>(), any::<u32>()), 0..6), 1..5),
        per_row in any::<bool>(),
    ) {
        prop_assume!(!ids.is_empty());
        let reference = build(config, &ids, &symbols, &manifest);
        let diffs: Vec<_> = nulls
            .iter()
            .map(|edits| {
                let mut s = symbols.clone();
                for (pos, v) in edits {
                    let p = pos % s.len();
                    s[p] = (*v % config.alphabet()) as u8;
                }
                reference.diff(&build(config, &ids, &s, &manifest)).unwrap()
            })
            .collect();
        let f = floor::measure(&diffs, per_row).unwrap();
        prop_assert_eq!(semq::Floor::from_json(f.to_json().as_bytes()).unwrap(), f.clone());
        for d in &diffs {
            prop_assert!(floor::within(d, &f).unwrap());
            prop_assert!(floor::evaluate(d, &f, per_row).unwrap().passed);
        }
    }

    #[test]
    fn encode_ignores_input_order(dim in 1u32..12, bins in 2u32..=64, op in 0u8..3,
                                  seeds in proptest::collection::btree_set(any::<u64>(), 1..16),
                                  rotate in any::<usize>()) {
        let config = match op {
            0 => Config::new(Operator::Quant, dim, bins).unwrap(),
            1 => Config::new(Operator::Phase, 4 * dim, bins).unwrap(),
            _ => Config::new(Operator::Orbit, dim, bins).unwrap(),
        };
        let d = config.dim() as usize;
        let ids: Vec<u64> = seeds.iter().copied().collect();
        let mut vectors = Vec::with_capacity(ids.len() * d);
        for &seed in &ids {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
            let v: Vec<f64> = (0..d).map(|_| rng.random::<f64>() - 0.5).collect();
            let n = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-9);
            vectors.extend(v.iter().map(|x| (x / n) as f32));
        }
        let pairs = [("encoder", "prop")];
        let straight = semq::encode(config, &IdList::U64(ids.clone()), &vectors, &pairs);
        let k = rotate % ids.len();
        let mut rids = ids.clone();
        rids.rotate_left(k);
        let mut rvec = vectors.clone();
        rvec.rotate_left(k * d);
        let rotated = semq::encode(config, &IdList::U64(rids), &rvec, &pairs);
        match (straight, rotated) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a.image(), b.image()),
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "outcomes differ: {:?} / {:?}", a.is_ok(), b.is_ok()),
        }
    }

    #[test]
    fn reader_never_panics_on_damaged_images((config, ids, symbols, manifest) in state_strategy(),
                                             flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
                                             cut in any::<usize>()) {
        let e = build(config, &ids, &symbols, &manifest);
        let mut bytes = e.image().to_vec();
        for (pos, v) in &flips {
            let p = pos % bytes.len();
            bytes[p] ^= v | 1;
        }
        let _ = Encoding::from_slice(&bytes);
        let _ = Encoding::from_slice(&bytes[..cut % (bytes.len() + 1)]);
    }

    #[test]
    fn floor_reader_never_panics(text in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = semq::Floor::from_json(&text);
    }
}

trait Emptied {
    fn emptied(self) -> IdList;
}

impl Emptied for IdList {
    /// An empty list of the same kind.
    fn emptied(self) -> IdList {
        match self {
            IdList::U64(_) => IdList::U64(vec![]),
            IdList::Utf8(_) => IdList::Utf8(vec![]),
        }
    }
}

#[test]
fn utf8_ids_sort_bytewise_in_files() {
    let config = Config::quant(4, 4).unwrap();
    let ids = IdList::Utf8(vec![
        "\u{10000}".into(),
        "\u{ff61}".into(),
        "b".into(),
        "a".into(),
    ]);
    let e = semq::from_symbols(config, &ids, &[0u8; 16], &[] as &[(&str, &str)]).unwrap();
    let order: Vec<String> = e.ids().map(|i| i.to_string()).collect();
    assert_eq!(order, ["a", "b", "\u{ff61}", "\u{10000}"]);
    let set: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(set.len(), 4);
}
