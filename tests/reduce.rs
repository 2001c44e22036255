//! Reductions equal brute-force sums over the decoded array: virtual images
//! (through the spatial-index plan for counts), centre of mass, mean and
//! maximum patterns, on every accepted conformance fixture and on generated
//! files with partial blocks and invalid pixels.

use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, Calibration, Content, CountDtype, ScaledRegion, WriteSpec,
};
use qemfs::qem::{Codec, QemFile};
use qemfs::reduce::geometry::{mask, Shape};
use qemfs::reduce::{Cpu, Image, MaxPattern, PixelSet, Reducer};
use serde_json::Value;

#[path = "support/float_extremes.rs"]
mod float_extremes;
use float_extremes::{exact_f32_sum, extreme_floats, same_sum};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/conformance/qem"
    ));
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("conformance manifest");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["expected"] == "accepted")
        .map(|e| dir.join(format!("{}.qem", e["name"].as_str().unwrap())))
        .collect()
}

/// Decoded values, frame-major, with invalid pixels read as 0.
fn dense(file: &QemFile) -> Vec<f64> {
    let mut bytes = vec![0u8; file.dense_bytes().unwrap()];
    file.read_all(&mut bytes).unwrap();
    let p_count = file.pixels();
    let valid = |p: usize| file.valid_mask().is_none_or(|v| v.is_valid(p));
    let e = file.decoded_dtype().size();
    (0..bytes.len() / e)
        .map(|i| {
            if !valid(i % p_count) {
                return 0.0;
            }
            let b = &bytes[i * e..(i + 1) * e];
            match (file.codec(), e) {
                (Codec::Integer, 1) => f64::from(b[0]),
                (Codec::Integer, _) => f64::from(u16::from_le_bytes([b[0], b[1]])),
                _ => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            }
        })
        .collect()
}

fn close(got: f64, want: f64, scale: f64) -> bool {
    if want.is_nan() || got.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got == want {
        return true;
    }
    (got - want).abs() <= 1e-6 * scale.max(1.0) + 1e-6 * want.abs()
}

/// Whether float32 sums of these terms can overflow.
fn overflows(terms: impl Iterator<Item = f64>) -> bool {
    terms.filter(|t| t.is_finite()).map(f64::abs).sum::<f64>() > f64::from(f32::MAX)
}

/// Every mask worth planning differently: a disk (tiles + residue), an
/// annulus to the edge (complement), everything, nothing, one pixel.
fn masks(file: &QemFile) -> Vec<PixelSet> {
    let [_, _, r, c] = file.shape();
    let centre = [(r as f64 - 1.0) / 2.0, (c as f64 - 1.0) / 2.0];
    let big = (r * r + c * c) as f64;
    vec![
        mask(
            [r, c],
            centre,
            Shape::Disk {
                radius: 0.3 * r.min(c) as f64,
            },
        ),
        mask(
            [r, c],
            centre,
            Shape::Annulus {
                inner: 1.0,
                outer: big,
            },
        ),
        PixelSet::new((0..(r * c) as u32).collect()),
        PixelSet::default(),
        PixelSet::new(vec![(r * c - 1) as u32]),
        // Most of every 8×8 tile: its sum less the pixels left out.
        PixelSet::new((0..(r * c) as u32).filter(|p| p % 5 != 0).collect()),
    ]
}

fn check(file: &QemFile, what: &str) {
    let n = file.frames();
    let p_count = file.pixels();
    let [_, _, _, columns] = file.shape();
    let values = dense(file);
    let exact = file.codec() != Codec::Float;
    let reducer = Reducer::new(file, &Cpu).unwrap();
    let masks = masks(file);
    let images = reducer.images(&masks).unwrap();
    for (k, (set, image)) in masks.iter().zip(&images).enumerate() {
        assert_eq!(image.len(), n, "{what}: mask {k}");
        for f in 0..n {
            let terms = set
                .pixels()
                .iter()
                .map(|&p| values[f * p_count + p as usize]);
            let want: f64 = terms.clone().sum();
            let scale: f64 = terms.map(f64::abs).sum();
            let got = image.get(f).unwrap();
            if file.codec() == Codec::Integer {
                let Image::U64(image) = image else {
                    panic!("{what}: counts give uint64 images, not {image:?}")
                };
                assert_eq!(image[f] as f64, want, "{what}: mask {k} frame {f}");
            } else if overflows(
                set.pixels()
                    .iter()
                    .map(|&p| values[f * p_count + p as usize]),
            ) {
                // float32 partial sums may overflow where binary64 does
                // not, depending on the order: nothing to compare.
            } else {
                // Scaled: calibrated once per frame; float: compensated.
                let tolerance = if exact { 1e-5 } else { 1.0 };
                assert!(
                    close(got, want, scale * tolerance),
                    "{what}: mask {k} frame {f}: {got} vs {want}"
                );
            }
        }
    }

    let full = reducer.full().unwrap();
    for f in 0..n {
        let frame = &values[f * p_count..(f + 1) * p_count];
        let total: f64 = frame.iter().sum();
        let row: f64 = frame
            .iter()
            .enumerate()
            .map(|(p, v)| (p / columns) as f64 * v)
            .sum();
        let col: f64 = frame
            .iter()
            .enumerate()
            .map(|(p, v)| (p % columns) as f64 * v)
            .sum();
        let (want_r, want_c) = if total == 0.0 {
            (f64::NAN, f64::NAN)
        } else {
            (row / total, col / total)
        };
        let tol = if file.codec() == Codec::Float {
            1e-3
        } else {
            1e-6
        };
        let reach = file.shape()[2].max(columns) as f64;
        if overflows(frame.iter().map(|v| v * reach)) {
            continue;
        }
        let (got_r, got_c) = (full.com[0].get(f).unwrap(), full.com[1].get(f).unwrap());
        if file.codec() == Codec::Integer {
            // Exact moments over the exact total, divided once in binary64.
            assert!(
                got_r.to_bits() == want_r.to_bits() && got_c.to_bits() == want_c.to_bits(),
                "{what}: com frame {f}: ({got_r}, {got_c}) vs ({want_r}, {want_c})"
            );
        }
        assert!(
            close(got_r, want_r, tol * columns as f64),
            "{what}: com row frame {f}: {got_r} vs {want_r}"
        );
        assert!(
            close(got_c, want_c, tol * columns as f64),
            "{what}: com column frame {f}: {got_c} vs {want_c}"
        );
    }
    for p in 0..p_count {
        let column = (0..n).map(|f| values[f * p_count + p]);
        let mean = column.clone().sum::<f64>() / n as f64;
        let scale = column.clone().map(f64::abs).sum::<f64>() / n as f64;
        let got = full.mean_dp.get(p).unwrap();
        if file.codec() == Codec::Integer {
            // The exact total divided once in binary64.
            assert_eq!(got, mean, "{what}: mean pixel {p}");
        }
        assert!(
            overflows(column.clone()) || close(got, mean, scale),
            "{what}: mean pixel {p}: {got} vs {mean}"
        );
        // NaN propagates through the maximum.
        let max = column.fold(f64::NEG_INFINITY, |m, v| {
            if m.is_nan() || v.is_nan() {
                f64::NAN
            } else {
                m.max(v)
            }
        });
        let got = match &full.max_dp {
            MaxPattern::U8(v) => f64::from(v[p]),
            MaxPattern::U16(v) => f64::from(v[p]),
            MaxPattern::F32(v) => f64::from(v[p]),
        };
        assert!(
            got == max as f32 as f64 || (got.is_nan() && max.is_nan()),
            "{what}: max pixel {p}: {got} vs {max}"
        );
    }
}

#[test]
fn every_accepted_fixture_reduces_like_brute_force() {
    let files = fixtures();
    assert!(files.len() >= 20, "fixtures missing");
    for path in files {
        let file = QemFile::open(&path).unwrap();
        // Non-finite float fixtures: compared by the rules above (NaN
        // propagates through the sums).
        check(&file, &path.display().to_string());
    }
}

/// Dense uint16 counts whose frame sums exceed 2^24 (where float32 can no
/// longer hold every integer): every virtual image, the mean pattern and
/// the centre of mass equal plain u64 arithmetic exactly.
#[test]
fn counts_above_two_to_the_24_are_exact() {
    let shape = [3u64, 4, 40, 36];
    let (frames, p_count) = (12usize, 40 * 36);
    let mut next = seeded(0x5eed);
    // Odd values near the top of the range: float32 would round the sums.
    let values: Vec<u16> = (0..frames * p_count)
        .map(|_| 60001 + 2 * (next() % 2000) as u16)
        .collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    )
    .with_chunk_scans(5);
    let file = QemFile::from_bytes(encode_to_vec(spec, &bytes).unwrap()).unwrap();
    let reducer = Reducer::new(&file, &Cpu).unwrap();
    let masks = vec![
        PixelSet::new((0..p_count as u32).collect()),
        mask([40, 36], [19.5, 17.5], Shape::Disk { radius: 15.0 }),
        mask(
            [40, 36],
            [19.5, 17.5],
            Shape::Annulus {
                inner: 4.0,
                outer: 100.0,
            },
        ),
    ];
    let images = reducer.images(&masks).unwrap();
    for (set, image) in masks.iter().zip(&images) {
        let want: Vec<u64> = (0..frames)
            .map(|f| {
                set.pixels()
                    .iter()
                    .map(|&p| u64::from(values[f * p_count + p as usize]))
                    .sum()
            })
            .collect();
        assert!(want.iter().all(|&s| s > 1 << 24), "{want:?}");
        assert!(want.iter().any(|&s| s as f32 as u64 != s));
        assert_eq!(image, &Image::U64(want));
    }
    let full = reducer.full().unwrap();
    for p in 0..p_count {
        let s: u64 = (0..frames)
            .map(|f| u64::from(values[f * p_count + p]))
            .sum();
        assert_eq!(full.mean_dp.get(p), Some(s as f64 / frames as f64));
    }
    for f in 0..frames {
        let frame = &values[f * p_count..(f + 1) * p_count];
        let total: u64 = frame.iter().map(|&v| u64::from(v)).sum();
        let row: u64 = (0..p_count)
            .map(|p| (p / 36) as u64 * u64::from(frame[p]))
            .sum();
        assert_eq!(full.com[0].get(f), Some(row as f64 / total as f64));
    }
}

/// A seeded stream of u64 (rand's portable Xoshiro256++): the same values on every run.
fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    move || rng.next_u64()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn generated_counts_reduce_like_brute_force(
        sr in 1usize..9, sc in 1usize..70, r in 1usize..41, c in 1usize..41,
        chunk in 1u64..700, seed: u64, invalid_every in 0usize..9, wide: bool,
    ) {
        let shape = [sr as u64, sc as u64, r as u64, c as u64];
        let mut next = seeded(seed);
        let count = sr * sc * r * c;
        let dtype = if wide { CountDtype::U16 } else { CountDtype::U8 };
        let dense: Vec<u8> = (0..count)
            .flat_map(|i| {
                let v = next();
                let v = if i % 5 == 0 { v % 250 } else { v % 3 } as u16;
                if wide { v.to_le_bytes().to_vec() } else { vec![v as u8] }
            })
            .collect();
        let mut spec = WriteSpec::counts(
            shape,
            dtype,
            scientific_metadata(shape, &Calibration::default()).unwrap(),
        )
        .with_chunk_scans(chunk);
        if invalid_every > 0 {
            if let Content::Counts { valid, .. } = &mut spec.content {
                *valid = Some((0..r * c).map(|p| p % invalid_every != 1).collect());
            }
        }
        let file = QemFile::from_bytes(encode_to_vec(spec, &dense).unwrap()).unwrap();
        check(&file, "generated counts");
    }

    #[test]
    fn generated_floats_and_scaled_codes_reduce_like_brute_force(
        sr in 1usize..5, sc in 1usize..40, r in 1usize..20, c in 1usize..20, seed: u64,
    ) {
        let shape = [sr as u64, sc as u64, r as u64, c as u64];
        let mut next = seeded(seed);
        let count = sr * sc * r * c;
        let floats: Vec<u8> = (0..count)
            .flat_map(|_| ((next() % 20000) as f32 / 7.0 - 100.0).to_le_bytes())
            .collect();
        let spec = WriteSpec::float32(shape, scientific_metadata(shape, &Calibration::default()).unwrap());
        let file = QemFile::from_bytes(encode_to_vec(spec, &floats).unwrap()).unwrap();
        check(&file, "generated floats");

        let frames = (sr * sc) as u64;
        let split = frames / 2;
        let region = |first, stop, scale, offset| ScaledRegion {
            first_frame: first,
            stop_frame: stop,
            scale,
            offset,
            intensity_min: offset,
            intensity_max: offset + scale * 65535.0,
            extra: Default::default(),
        };
        let regions = if split > 0 {
            vec![region(0, split, 0.25, -3.0), region(split, frames, 1.5, 2.0)]
        } else {
            vec![region(0, frames, 0.5, 1.0)]
        };
        let codes: Vec<u8> = (0..count).flat_map(|_| ((next() % 900) as u16).to_le_bytes()).collect();
        let cal = Calibration {
            processing: vec![Calibration::scaled_quantization_record()],
            ..Default::default()
        };
        let spec = WriteSpec::scaled(shape, regions, scientific_metadata(shape, &cal).unwrap())
            .with_chunk_scans(split.max(1));
        let file = QemFile::from_bytes(encode_to_vec(spec, &codes).unwrap()).unwrap();
        check(&file, "generated scaled codes");
    }
}

#[test]
fn float_extremes_match_an_exact_reference() {
    let (shape, values) = extreme_floats();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let shape64 = shape.map(|s| s as u64);
    let spec = WriteSpec::float32(
        shape64,
        scientific_metadata(shape64, &Calibration::default()).unwrap(),
    );
    let file = QemFile::from_bytes(encode_to_vec(spec, &bytes).unwrap()).unwrap();
    let reducer = Reducer::new(&file, &Cpu).unwrap();
    let (frames, p) = (24, 64);
    let masks = vec![
        PixelSet::new((0..64).collect()),
        mask([8, 8], [3.5, 3.5], Shape::Disk { radius: 2.5 }),
        mask(
            [8, 8],
            [3.5, 3.5],
            Shape::Annulus {
                inner: 2.0,
                outer: 9.0,
            },
        ),
        PixelSet::new(vec![9, 10, 27, 36, 54]),
    ];
    let images = reducer.images(&masks).unwrap();
    let mut seen = [false; 3]; // an overflow, a NaN, a cancelled FLT_MAX
    for (k, (set, image)) in masks.iter().zip(&images).enumerate() {
        let Image::F32(image) = image else {
            panic!("float images are float32")
        };
        for f in 0..frames {
            let terms: Vec<f32> = set
                .pixels()
                .iter()
                .map(|&q| values[f * p + q as usize])
                .collect();
            let want = exact_f32_sum(terms.iter().copied());
            assert!(
                same_sum(image[f], want, &terms),
                "mask {k} frame {f}: {} vs {want}",
                image[f]
            );
            seen[0] |= want == f32::INFINITY && terms.iter().all(|v| v.is_finite());
            seen[1] |= want.is_nan();
            seen[2] |= f == 2 && terms.contains(&f32::MAX) && terms.contains(&-6.03);
        }
    }
    assert_eq!(seen, [true; 3], "the fixture exercises every case");
    let full = reducer.full().unwrap();
    let Image::F32(mean) = &full.mean_dp else {
        panic!("float mean is float32")
    };
    for q in 0..p {
        let terms: Vec<f32> = (0..frames).map(|f| values[f * p + q]).collect();
        // The documented rule: the float32 sum, divided once in binary64.
        let sum = exact_f32_sum(terms.iter().copied());
        let want = (f64::from(sum) / frames as f64) as f32;
        assert!(
            same_sum(mean[q], want, &terms),
            "mean pixel {q}: {} vs {want}",
            mean[q]
        );
    }
    // Pixel 27 holds +FLT_MAX twice and -FLT_MAX once: its sum is back in
    // range (FLT_MAX), whatever order the backend adds in.
    assert_eq!(mean[27], (f64::from(f32::MAX) / frames as f64) as f32);
}
