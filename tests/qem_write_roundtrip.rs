//! Files written with either model policy decode back to the input, with an
//! independent minimal decoder written from the specification (§6–§9).

use qemfs::qem::tables::{FREQUENCIES, START};
use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, Calibration, Content, CountDtype, ModelChoice,
    ScaledRegion, WriteSpec,
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

fn stream(sel: u8, b: &[u8], m: usize) -> Vec<u16> {
    let words = || b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    match sel {
        253 => {
            assert!(b.is_empty());
            vec![0; m]
        }
        255 => {
            assert_eq!(b.len(), 2);
            vec![u16::from_le_bytes([b[0], b[1]]); m]
        }
        254 => {
            assert_eq!(b.len(), 2 * m);
            words().collect()
        }
        252 => {
            assert!(b.len().is_multiple_of(2));
            let mut v = vec![0; m];
            let mut last = None;
            for e in words() {
                let p = usize::from(e >> 7);
                assert!(p < m && last.is_none_or(|l| l < p));
                last = Some(p);
                v[p] = (e & 127) + 1;
            }
            v
        }
        k @ 0..=63 => {
            let (f, c) = (&FREQUENCIES[usize::from(k)], &START[usize::from(k)]);
            let mut x = u32::from_le_bytes(b[..4].try_into().unwrap());
            assert!((1 << 23..1 << 31).contains(&x));
            let mut i = 4;
            let mut out = Vec::with_capacity(m);
            for _ in 0..m {
                let slot = x & 1023;
                let s = (0..33)
                    .find(|&s| u32::from(c[s]) <= slot && slot < u32::from(c[s] + f[s]))
                    .unwrap();
                x = u32::from(f[s]) * (x >> 10) + slot - u32::from(c[s]);
                while x < 1 << 23 {
                    x = (x << 8) | u32::from(b[i]);
                    i += 1;
                }
                if s == 32 {
                    out.push(u16::from_le_bytes([b[i], b[i + 1]]));
                    i += 2;
                } else {
                    out.push(s as u16);
                }
            }
            assert_eq!((x, i), (1 << 23, b.len()));
            out
        }
        other => panic!("selector {other}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Checks the envelope and checksums; returns the header and the body.
fn open(file: &[u8]) -> (Value, &[u8]) {
    assert_eq!(&file[..8], b"QEMDATA1");
    let n = u64::from_le_bytes(file[8..16].try_into().unwrap()) as usize;
    assert_eq!(
        u64::from_le_bytes(file[16..24].try_into().unwrap()) as usize,
        56 + n
    );
    assert_eq!(&file[24..56], Sha256::digest(&file[56..56 + n]).as_slice());
    let h: Value = serde_json::from_slice(&file[56..56 + n]).unwrap();
    let body = &file[56 + n..];
    assert_eq!(h["bytes"].as_u64().unwrap() as usize, body.len());
    let digests: Vec<String> = body
        .chunks(64 << 20)
        .map(|b| hex(&Sha256::digest(b)))
        .collect();
    assert_eq!(h["sha256"], serde_json::json!(digests));
    (h, body)
}

/// Decodes an integer or scaled file to its values (frame-major), checking
/// layout, alignment and, for the integer codec, the spatial index.
fn decode_counts(file: &[u8]) -> Vec<u16> {
    let (h, body) = open(file);
    let shape: Vec<usize> = h["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let (rows, cols) = (shape[2], shape[3]);
    let p_count = rows * cols;
    let mut out = vec![0u16; shape[0] * shape[1] * p_count];
    let valid: Option<Vec<bool>> = h["valid"].as_str().map(|hex| {
        (0..p_count)
            .map(|p| {
                u8::from_str_radix(&hex[p / 8 * 2..p / 8 * 2 + 2], 16).unwrap() & (0x80 >> (p % 8))
                    != 0
            })
            .collect()
    });
    let mut cursor = 0usize;
    let mut next_first = 0;
    for c in h["chunks"].as_array().unwrap() {
        let first = c["first"].as_u64().unwrap() as usize;
        let scans = c["scans"].as_u64().unwrap() as usize;
        assert_eq!(first, next_first);
        next_first += scans;
        let arrays: Vec<(usize, usize)> = c["arrays"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["offset"].as_u64().unwrap() as usize,
                    a["count"].as_u64().unwrap() as usize,
                )
            })
            .collect();
        let sizes = [1, 4, 1, 4, 8, 1];
        let mut spans = Vec::new();
        for (i, &(off, count)) in arrays.iter().enumerate() {
            assert_eq!(off, cursor.div_ceil(8) * 8);
            assert!(body[cursor..off].iter().all(|&b| b == 0));
            cursor = off + count * sizes[i];
            spans.push(&body[off..cursor]);
        }
        let blocks = scans.div_ceil(512);
        let offsets = u32s(spans[1]);
        assert_eq!(offsets.len(), blocks * p_count + 1);
        assert_eq!(*offsets.last().unwrap() as usize, spans[0].len());
        for b in 0..blocks {
            let m = 512.min(scans - 512 * b);
            for p in 0..p_count {
                let s = b * p_count + p;
                let bytes = &spans[0][offsets[s] as usize..offsets[s + 1] as usize];
                for (i, v) in stream(spans[2][s], bytes, m).into_iter().enumerate() {
                    out[(first + 512 * b + i) * p_count + p] = v;
                }
            }
        }
        if let Some(valid) = &valid {
            // Spatial index, recomputed by brute force from the decoded counts.
            let words = u32s(spans[3]);
            let word_offsets: Vec<u64> = spans[4]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let mut tiles = Vec::new();
            for size in [8, 32] {
                for tr in 0..rows.div_ceil(size) {
                    for tc in 0..cols.div_ceil(size) {
                        tiles.push((tr * size, tc * size, size));
                    }
                }
            }
            for b in 0..blocks {
                let m = 512.min(scans - 512 * b);
                for (t, &(r0, c0, size)) in tiles.iter().enumerate() {
                    let st = b * tiles.len() + t;
                    let width = u32::from(spans[5][st]);
                    let packed = &words[word_offsets[st] as usize..word_offsets[st + 1] as usize];
                    for i in 0..m {
                        let f = first + 512 * b + i;
                        let mut sum = 0u32;
                        for r in r0..(r0 + size).min(rows) {
                            for cc in c0..(c0 + size).min(cols) {
                                if valid[r * cols + cc] {
                                    sum += u32::from(out[f * p_count + r * cols + cc]);
                                }
                            }
                        }
                        let bit = i * width as usize;
                        let mut v = 0u64;
                        for k in 0..width as usize {
                            let pos = bit + k;
                            v |= u64::from((packed[pos / 32] >> (pos % 32)) & 1) << k;
                        }
                        assert_eq!(
                            v,
                            u64::from(sum),
                            "chunk at {first}, block {b}, field {t}, frame {i}"
                        );
                        assert!(width == 32 || sum < 1 << width);
                    }
                    assert_eq!(packed.len(), (m * width as usize).div_ceil(32));
                }
            }
        }
    }
    assert_eq!(cursor, body.len());
    assert_eq!(next_first, shape[0] * shape[1]);
    out
}

fn decode_float(file: &[u8]) -> Vec<u32> {
    let (h, body) = open(file);
    let shape: Vec<usize> = h["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let p_count = shape[2] * shape[3];
    let mut out = vec![0u32; shape[0] * shape[1] * p_count];
    let mut cursor = 0;
    for c in h["chunks"].as_array().unwrap() {
        let g = |k: &str| c[k].as_u64().unwrap() as usize;
        let (first, m) = (g("first"), g("scans"));
        assert_eq!(
            (g("payload_offset"), g("offset_offset"), g("model_offset")),
            (
                cursor,
                cursor + g("payload_bytes"),
                cursor + g("payload_bytes") + g("offset_bytes")
            )
        );
        let payload = &body[g("payload_offset")..g("payload_offset") + g("payload_bytes")];
        let offsets = u32s(&body[g("offset_offset")..g("offset_offset") + g("offset_bytes")]);
        let models = &body[g("model_offset")..g("model_offset") + g("model_bytes")];
        cursor = g("model_offset") + g("model_bytes");
        assert_eq!(offsets.len(), 2 * p_count + 1);
        for lane in 0..2 * p_count {
            let bytes = &payload[offsets[lane] as usize..offsets[lane + 1] as usize];
            assert!(bytes.len() <= 2 * m, "float lanes are at most 2m bytes");
            for (i, v) in stream(models[lane], bytes, m).into_iter().enumerate() {
                out[(first + i) * p_count + lane / 2] |= u32::from(v) << (16 * (lane % 2));
            }
        }
    }
    assert_eq!(cursor, body.len());
    let dense: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(h["logical_sha256"], hex(&Sha256::digest(&dense)));
    out
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Counts mixing every stream kind: dark, bright, constant, large, sparse.
fn counts(n: usize, p: usize, seed: u64, max: u16) -> Vec<u16> {
    let mut r = Rng(seed | 1);
    (0..n * p)
        .map(|i| {
            let x = r.next();
            let v = match (i % p) % 7 {
                0 => 0,
                1 => 9,
                2 => u16::from(x.is_multiple_of(50)),
                3 => (x % 40) as u16,
                4 => (x % 65536) as u16,
                5 => ((x % 3) * (x >> 20) % 3000) as u16,
                _ => (x % 5) as u16,
            };
            v.min(max)
        })
        .collect()
}

fn sm(shape: [u64; 4]) -> Value {
    scientific_metadata(shape, &Calibration::default()).unwrap()
}

#[test]
fn counts_round_trip_under_both_models() {
    for (shape, chunk, dtype) in [
        ([3, 401, 9, 10], 1024, CountDtype::U16),
        ([2, 300, 13, 7], 512, CountDtype::U8),
        ([1, 77, 33, 40], 10, CountDtype::U16),
        ([1, 1, 1, 1], 512, CountDtype::U8),
    ] {
        let (n, p) = (
            (shape[0] * shape[1]) as usize,
            (shape[2] * shape[3]) as usize,
        );
        let max = if dtype == CountDtype::U8 {
            255
        } else {
            u16::MAX
        };
        let values = counts(n, p, n as u64 * 31 + p as u64, max);
        let dense: Vec<u8> = match dtype {
            CountDtype::U8 => values.iter().map(|&v| v as u8).collect(),
            CountDtype::U16 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        let valid: Vec<bool> = (0..p).map(|i| i % 5 != 2).collect();
        for model in [ModelChoice::Reference, ModelChoice::Smallest] {
            let spec = WriteSpec {
                content: Content::Counts {
                    dtype,
                    valid: Some(valid.clone()),
                    metadata: Map::new(),
                },
                ..WriteSpec::counts(shape, dtype, sm(shape))
            }
            .with_chunk_scans(chunk)
            .with_model(model);
            let file = encode_to_vec(spec, &dense).unwrap();
            assert_eq!(decode_counts(&file), values, "{shape:?} {model:?}");
        }
    }
}

#[test]
fn floats_round_trip_bit_exactly() {
    let shape = [2, 45, 5, 6];
    let mut r = Rng(77);
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE / 4.0,
        f32::MAX,
        1.5,
    ];
    let bits: Vec<u32> = (0..90 * 30)
        .map(|i| match i % 4 {
            0 => specials[(r.next() % 7) as usize].to_bits(),
            1 => 0x7fc0_0000 | (r.next() as u32 & 0x3f_ffff),
            2 => (r.next() as u32) & 0x0000_00ff,
            _ => r.next() as u32,
        })
        .collect();
    let dense: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    for model in [ModelChoice::Reference, ModelChoice::Smallest] {
        for chunk in [7, 512] {
            let spec = WriteSpec::float32(shape, sm(shape))
                .with_chunk_scans(chunk)
                .with_model(model);
            let file = encode_to_vec(spec, &dense).unwrap();
            assert_eq!(decode_float(&file), bits, "{model:?}, chunks of {chunk}");
        }
    }
}

#[test]
fn scaled_codes_round_trip() {
    let shape = [3, 500, 4, 3];
    let values = counts(1500, 12, 5, u16::MAX);
    let dense: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let cal = Calibration {
        processing: vec![Calibration::scaled_quantization_record()],
        ..Calibration::default()
    };
    let region = |a, b| ScaledRegion {
        first_frame: a,
        stop_frame: b,
        scale: 0.5,
        offset: -1.0,
        intensity_min: -1.0,
        intensity_max: 32766.5,
        extra: Map::new(),
    };
    for model in [ModelChoice::Reference, ModelChoice::Smallest] {
        let spec = WriteSpec::scaled(
            shape,
            vec![region(0, 700), region(700, 1500)],
            scientific_metadata(shape, &cal).unwrap(),
        )
        .with_chunk_scans(1024)
        .with_model(model);
        let file = encode_to_vec(spec, &dense).unwrap();
        assert_eq!(decode_counts(&file), values);
    }
}
