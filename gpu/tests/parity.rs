//! The GPU backends against the CPU: decoded values of every block of every
//! accepted conformance fixture, the errors of every fixture the decoder
//! rejects, and reductions (masks, moments, pattern, background) on the
//! fixtures and on generated acquisitions (partial chunks and blocks,
//! invalid pixels, all three codecs), each checked against a float64/u64
//! reference computed here from the dense values and against the CPU
//! reference `qemfs::reduce::Cpu`.
//!
//! Needs a wgpu adapter; lavapipe (Mesa's software Vulkan) serves in CI. When
//! `CI` is set and no adapter exists, the tests fail; elsewhere they skip
//! with a message.
//!
//! Float products are compared with |gpu - reference| <= 1e-6 + 1e-6 * M,
//! where M is the sum of the magnitudes of the finite summed terms (float64): the
//! rtol = atol = 1e-6 of spec §13, taken relative to the magnitude of the
//! terms because a cancelling sum's own magnitude says nothing about the
//! rounding error of either order.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use qemfs::qem::write::{
    encode_to_vec, scientific_metadata, Calibration, Content, CountDtype, ScaledRegion, WriteSpec,
};
use qemfs::qem::{Codec, QemFile};
use qemfs::reduce::{Accelerator, Cpu, Partial, PixelSet, ReduceError, Request, Values};
use qemfs_gpu::{BlockDecoder, BlockValues, OpenError, Wgpu};
use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};
use serde_json::{Map, Value};

#[path = "../../tests/support/float_extremes.rs"]
mod float_extremes;
use float_extremes::{exact_f32_sum, extreme_floats, same_sum};

/// `QEMFS_GPU_BACKENDS` (scripts/gpu-device-check.sh) names the backends
/// that must be tested, comma-separated: `wgpu` (any adapter), `wgpu-hw`
/// (hardware adapters only), `cuda`. A named backend that cannot be opened
/// fails the tests. Unset: wgpu with any adapter, plus CUDA where the
/// feature is built and a device exists.
fn required() -> Option<Vec<String>> {
    std::env::var("QEMFS_GPU_BACKENDS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
}

/// The wgpu backend. Tests skip (with a message) only when no adapter
/// exists, `CI` is unset and wgpu is not required; an adapter that fails to
/// open (device or shader errors) always fails them.
fn gpu() -> Option<&'static Wgpu> {
    static GPU: OnceLock<Result<Wgpu, OpenError>> = OnceLock::new();
    let req = required();
    let wanted = req
        .as_ref()
        .is_none_or(|r| r.iter().any(|b| b.starts_with("wgpu")));
    if !wanted {
        return None;
    }
    let hardware = req
        .as_ref()
        .is_some_and(|r| r.iter().any(|b| b == "wgpu-hw"));
    let must = req.is_some() || std::env::var_os("CI").is_some();
    match GPU.get_or_init(|| {
        let g = Wgpu::new(!hardware);
        if let Ok(g) = &g {
            eprintln!("wgpu adapter: {}", g.describe());
        }
        g
    }) {
        Ok(g) => Some(g),
        Err(OpenError::NoAdapter(e)) if !must => {
            eprintln!("skipping: no wgpu adapter ({e})");
            None
        }
        Err(e) => panic!(
            "no usable wgpu adapter: {e} (in CI, install mesa-vulkan-drivers: scripts/setup.sh)"
        ),
    }
}

#[cfg(feature = "cuda")]
fn cuda() -> Option<&'static qemfs_gpu::Cuda> {
    static CUDA: OnceLock<Result<qemfs_gpu::Cuda, String>> = OnceLock::new();
    let must = required().is_some_and(|r| r.iter().any(|b| b == "cuda"));
    match CUDA.get_or_init(|| {
        let c = qemfs_gpu::Cuda::new();
        if let Ok(c) = &c {
            eprintln!("cuda device: {}", c.describe());
        }
        c
    }) {
        Ok(c) => Some(c),
        Err(e) if !must => {
            eprintln!("skipping CUDA: {e}");
            None
        }
        Err(e) => panic!("QEMFS_GPU_BACKENDS names cuda but it could not be opened: {e}"),
    }
}

/// The backends to test (see [`required`]).
fn backends() -> Vec<&'static dyn BlockDecoder> {
    let mut all: Vec<&'static dyn BlockDecoder> = Vec::new();
    if let Some(g) = gpu() {
        all.push(g);
    }
    #[cfg(feature = "cuda")]
    if let Some(c) = cuda() {
        all.push(c);
    }
    #[cfg(not(feature = "cuda"))]
    if required().is_some_and(|r| r.iter().any(|b| b == "cuda")) {
        panic!("QEMFS_GPU_BACKENDS names cuda but the cuda feature is not built");
    }
    all
}

fn fixtures() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/conformance/qem"
    ))
    .to_path_buf()
}

fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("manifest");
    let v: Value = serde_json::from_str(&text).expect("manifest JSON");
    v["entries"].as_array().expect("entries").clone()
}

fn accepted() -> Vec<(String, QemFile)> {
    manifest()
        .iter()
        .filter(|e| e["expected"] == "accepted")
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let f = QemFile::open(fixtures().join(format!("{name}.qem")))
                .unwrap_or_else(|err| panic!("{name}: {err}"));
            (name, f)
        })
        .collect()
}

/// The CPU's stored values of one block, frame-major.
fn cpu_block(f: &QemFile, b: usize) -> Result<BlockValues, String> {
    let info = f.blocks()[b];
    if f.codec() == Codec::Float {
        let bytes = f.decode_block(b).map_err(|e| e.to_string())?;
        Ok(BlockValues::FloatBits(
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    } else {
        let mut out = vec![0u16; info.frames * f.pixels()];
        f.decode_block_codes(b, &mut out)
            .map_err(|e| e.to_string())?;
        Ok(BlockValues::Codes(out))
    }
}

#[test]
fn decoded_values_of_every_accepted_fixture_equal_the_cpu() {
    for gpu in backends() {
        let all = accepted();
        assert!(all.len() >= 21, "{} accepted fixtures", all.len());
        for (name, f) in &all {
            for b in 0..f.blocks().len() {
                let want = cpu_block(f, b).unwrap();
                let got = gpu
                    .decode_block(f, b)
                    .unwrap_or_else(|e| panic!("{name} block {b}: {e}"));
                assert!(got == want, "{name} block {b}: GPU values differ");
            }
            gpu.decode_blocks(f, 0..f.blocks().len())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

/// Every fixture that opens but fails to decode fails on the GPU with the
/// CPU's error, naming the same chunk and stream, in `decode_block` and in
/// `reduce`.
#[test]
fn undecodable_fixtures_fail_with_the_cpu_error() {
    for gpu in backends() {
        let mut seen = Vec::new();
        for e in manifest().iter().filter(|e| e["expected"] == "rejected") {
            let name = e["name"].as_str().unwrap();
            let Ok(f) = QemFile::open(fixtures().join(format!("{name}.qem"))) else {
                continue;
            };
            let mut cpu_first = None;
            for b in 0..f.blocks().len() {
                let cpu = cpu_block(&f, b);
                let got = gpu.decode_block(&f, b).map_err(|e| e.to_string());
                match (&cpu, &got) {
                    (Ok(c), Ok(g)) => assert!(c == g, "{name} block {b}: values differ"),
                    (Err(c), Err(g)) => {
                        assert_eq!(g, c, "{name} block {b}")
                    }
                    _ => panic!("{name} block {b}: CPU {:?}, GPU {:?}", cpu.err(), got.err()),
                }
                if let (None, Err(c)) = (&cpu_first, cpu) {
                    cpu_first = Some(c);
                }
            }
            if let Some(c) = cpu_first {
                let request = Request {
                    masks: vec![PixelSet::new((0..f.pixels() as u32).collect())],
                    moments: true,
                    pattern: true,
                    background: None,
                };
                let err = gpu
                    .reduce(&f, 0..f.blocks().len(), &request)
                    .expect_err(name);
                assert!(matches!(err, ReduceError::Decode(_)), "{name}: {err}");
                assert_eq!(err.to_string(), c, "{name}");
                let err = gpu.decode_blocks(&f, 0..f.blocks().len()).expect_err(name);
                assert_eq!(err.to_string(), c, "{name}");
                seen.push(name.to_string());
            }
            // Only the odd pixels: gathered (not consecutive) streams; the
            // GPU fails exactly when the CPU does, with its error.
            let odd = Request {
                masks: vec![PixelSet::new(
                    (0..f.pixels() as u32).filter(|p| p % 2 == 1).collect(),
                )],
                ..Request::default()
            };
            let n = f.blocks().len();
            match (gpu.reduce(&f, 0..n, &odd), Cpu.reduce(&f, 0..n, &odd)) {
                (Ok(g), Ok(c)) => assert!(f.codec() == Codec::Float || g == c, "{name}"),
                (Err(g), Err(c)) => assert_eq!(g.to_string(), c.to_string(), "{name}"),
                (g, c) => panic!("{name}: GPU {:?}, CPU {:?}", g.err(), c.err()),
            }
        }
        for must in [
            "bad-rans-final-state",
            "bad-rans-initial-state",
            "bad-rans-trailing-byte",
            "bad-sparse-order",
            "bad-value-exceeds-uint8",
        ] {
            assert!(
                seen.iter().any(|s| s == must),
                "{must} not exercised: {seen:?}"
            );
        }
    }
}

// ----- reductions against an independent reference ---------------------------

/// Stored values of a whole file, frame-major, as f64 (floats: the float32
/// value after background subtraction in float32) and, for integers, u64.
struct Dense {
    pixels: usize,
    columns: usize,
    exact: Option<Vec<u64>>,
    float: Option<Vec<f32>>,
    valid: Vec<bool>,
}

fn dense(f: &QemFile, background: Option<&[f32]>) -> Dense {
    let n = f.frames();
    let p = f.pixels();
    let valid = (0..p)
        .map(|q| f.valid_mask().is_none_or(|v| v.is_valid(q)))
        .collect();
    let [_, _, _, columns] = f.shape();
    if f.codec() == Codec::Float {
        let mut bytes = vec![0u8; n * p * 4];
        f.read_all(&mut bytes).unwrap();
        let v = bytes
            .chunks_exact(4)
            .enumerate()
            .map(|(i, c)| {
                let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                background.map_or(x, |bg| x - bg[i % p])
            })
            .collect();
        Dense {
            pixels: p,
            columns,
            exact: None,
            float: Some(v),
            valid,
        }
    } else {
        let mut codes = vec![0u16; n * p];
        f.read_all_codes(&mut codes).unwrap();
        Dense {
            pixels: p,
            columns,
            exact: Some(codes.iter().map(|&c| u64::from(c)).collect()),
            float: None,
            valid,
        }
    }
}

/// A reference product: exact values, or float64 sums with the magnitude
/// of their terms.
enum Want {
    Exact(Vec<u64>),
    Float(Vec<(f64, f64)>),
}

fn weighted(
    d: &Dense,
    frames: std::ops::Range<usize>,
    pixels: &[u32],
    w: impl Fn(usize) -> u64,
) -> Want {
    let pixels: Vec<usize> = pixels
        .iter()
        .map(|&p| p as usize)
        .filter(|&p| d.valid[p])
        .collect();
    if let Some(v) = &d.exact {
        Want::Exact(
            frames
                .map(|t| pixels.iter().map(|&p| w(p) * v[t * d.pixels + p]).sum())
                .collect(),
        )
    } else {
        let v = d.float.as_ref().unwrap();
        Want::Float(
            frames
                .map(|t| {
                    let mut s = 0f64;
                    let mut mag = 0f64;
                    for &p in &pixels {
                        let term = f64::from(w(p) as f32 * v[t * d.pixels + p]);
                        s += term;
                        if term.is_finite() {
                            mag += term.abs();
                        }
                    }
                    (s, mag)
                })
                .collect(),
        )
    }
}

/// `mag` is the sum of the magnitudes of the finite terms.
fn close(got: f32, want: f64, mag: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if mag > f64::from(f32::MAX) {
        // float32 partial sums may overflow where float64 does not.
        return !got.is_finite() || (f64::from(got) - want).abs() <= 1e-6 * mag;
    }
    if want.is_infinite() {
        return f64::from(got) == want;
    }
    (f64::from(got) - want).abs() <= 1e-6 + 1e-6 * mag
}

fn check(what: &str, got: &Values, want: &Want) {
    match (got, want) {
        (Values::Exact(g), Want::Exact(w)) => assert_eq!(g, w, "{what}"),
        (Values::Float(g), Want::Float(w)) => {
            assert_eq!(g.len(), w.len(), "{what}: length");
            for (i, (&a, &(b, mag))) in g.iter().zip(w).enumerate() {
                assert!(
                    close(a, b, mag),
                    "{what}[{i}]: GPU {a}, reference {b} (magnitude {mag})"
                );
            }
        }
        _ => panic!("{what}: value kinds differ"),
    }
}

/// Checks a GPU partial against the reference computed from the dense
/// values, for blocks `blocks`.
fn check_partial(
    name: &str,
    f: &QemFile,
    blocks: std::ops::Range<usize>,
    req: &Request,
    got: &Partial,
) {
    let d = dense(f, req.background.as_deref());
    let frames = if blocks.is_empty() {
        0..0
    } else {
        f.blocks()[blocks.start].first_frame..f.blocks()[blocks.end - 1].frame_range().end
    };
    assert_eq!(got.masks.len(), req.masks.len(), "{name}");
    for (k, set) in req.masks.iter().enumerate() {
        check(
            &format!("{name} mask {k}"),
            &got.masks[k],
            &weighted(&d, frames.clone(), set.pixels(), |_| 1),
        );
    }
    let all: Vec<u32> = (0..d.pixels as u32).collect();
    match (&got.moments, req.moments) {
        (Some(m), true) => {
            check(
                &format!("{name} total"),
                &m.total,
                &weighted(&d, frames.clone(), &all, |_| 1),
            );
            let c = d.columns;
            check(
                &format!("{name} row"),
                &m.row,
                &weighted(&d, frames.clone(), &all, |p| (p / c) as u64),
            );
            check(
                &format!("{name} column"),
                &m.column,
                &weighted(&d, frames.clone(), &all, |p| (p % c) as u64),
            );
        }
        (None, false) => {}
        _ => panic!("{name}: moments presence"),
    }
    match (&got.pattern, req.pattern) {
        (Some(pat), true) => {
            if let Some(v) = &d.exact {
                let sum: Vec<u64> = (0..d.pixels)
                    .map(|p| {
                        if d.valid[p] {
                            frames.clone().map(|t| v[t * d.pixels + p]).sum()
                        } else {
                            0
                        }
                    })
                    .collect();
                let max: Vec<u64> = (0..d.pixels)
                    .map(|p| {
                        if d.valid[p] {
                            frames
                                .clone()
                                .map(|t| v[t * d.pixels + p])
                                .max()
                                .unwrap_or(0)
                        } else {
                            0
                        }
                    })
                    .collect();
                check(&format!("{name} pattern sum"), &pat.sum, &Want::Exact(sum));
                check(&format!("{name} pattern max"), &pat.max, &Want::Exact(max));
            } else {
                let v = d.float.as_ref().unwrap();
                let sum: Vec<(f64, f64)> = (0..d.pixels)
                    .map(|p| {
                        let terms = frames.clone().map(|t| f64::from(v[t * d.pixels + p]));
                        (
                            terms.clone().sum(),
                            terms.filter(|x| x.is_finite()).map(f64::abs).sum(),
                        )
                    })
                    .collect();
                check(&format!("{name} pattern sum"), &pat.sum, &Want::Float(sum));
                let Values::Float(gmax) = &pat.max else {
                    panic!("{name}: float max")
                };
                for p in 0..d.pixels {
                    let vals: Vec<f32> = frames.clone().map(|t| v[t * d.pixels + p]).collect();
                    let g = gmax[p];
                    if vals.iter().any(|x| x.is_nan()) {
                        assert!(g.is_nan(), "{name} pattern max[{p}]: {g}, want NaN");
                    } else {
                        // Over no frames the maximum is 0 (the CPU reference's convention).
                        let w = if vals.is_empty() {
                            0.0
                        } else {
                            vals.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                        };
                        assert!(g == w, "{name} pattern max[{p}]: {g}, want {w}");
                    }
                }
            }
        }
        (None, false) => {}
        _ => panic!("{name}: pattern presence"),
    }
}

/// The frames of `blocks`.
fn frames_of(f: &QemFile, blocks: &std::ops::Range<usize>) -> std::ops::Range<usize> {
    if blocks.is_empty() {
        0..0
    } else {
        f.blocks()[blocks.start].first_frame..f.blocks()[blocks.end - 1].frame_range().end
    }
}

/// The GPU's partial against the CPU reference [`Cpu`]: integer products
/// equal, float sums within the tolerance (magnitudes of the terms from
/// the dense values), float pattern maxima equal.
fn check_against_cpu(
    name: &str,
    f: &QemFile,
    blocks: std::ops::Range<usize>,
    req: &Request,
    got: &Partial,
) {
    let cpu = Cpu
        .reduce(f, blocks.clone(), req)
        .unwrap_or_else(|e| panic!("{name}: CPU: {e}"));
    if f.codec() != Codec::Float {
        assert!(got == &cpu, "{name}: GPU and CPU partials differ");
        return;
    }
    let d = dense(f, req.background.as_deref());
    let frames = frames_of(f, &blocks);
    let all: Vec<u32> = (0..d.pixels as u32).collect();
    let c = d.columns;
    let mut pairs: Vec<(String, &Values, &Values, Want)> = Vec::new();
    assert_eq!(got.masks.len(), cpu.masks.len(), "{name}");
    for (k, set) in req.masks.iter().enumerate() {
        let want = weighted(&d, frames.clone(), set.pixels(), |_| 1);
        pairs.push((format!("mask {k}"), &got.masks[k], &cpu.masks[k], want));
    }
    match (&got.moments, &cpu.moments) {
        (Some(g), Some(p)) => {
            let total = weighted(&d, frames.clone(), &all, |_| 1);
            let row = weighted(&d, frames.clone(), &all, |p| (p / c) as u64);
            let column = weighted(&d, frames.clone(), &all, |p| (p % c) as u64);
            pairs.push(("total".into(), &g.total, &p.total, total));
            pairs.push(("row".into(), &g.row, &p.row, row));
            pairs.push(("column".into(), &g.column, &p.column, column));
        }
        (None, None) => {}
        _ => panic!("{name}: moments presence differs from the CPU"),
    }
    match (&got.pattern, &cpu.pattern) {
        (Some(g), Some(p)) => {
            pairs.push((
                "pattern sum".into(),
                &g.sum,
                &p.sum,
                pattern_sum_want(&d, frames.clone()),
            ));
            let (Values::Float(a), Values::Float(b)) = (&g.max, &p.max) else {
                panic!("{name}: float pattern maxima")
            };
            assert_eq!(a.len(), b.len(), "{name}");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    x == y || (x.is_nan() && y.is_nan()),
                    "{name} pattern max[{i}]: GPU {x}, CPU {y}"
                );
            }
        }
        (None, None) => {}
        _ => panic!("{name}: pattern presence differs from the CPU"),
    }
    for (what, g, p, want) in pairs {
        let (Values::Float(g), Values::Float(p), Want::Float(w)) = (g, p, &want) else {
            panic!("{name} {what}: value kinds")
        };
        assert_eq!(g.len(), p.len(), "{name} {what}");
        for i in 0..g.len() {
            let (x, y, mag) = (g[i], p[i], w[i].1);
            let ok = if mag > f64::from(f32::MAX) && !(x.is_finite() && y.is_finite()) {
                // Overflowing float32 partial sums depend on the order.
                true
            } else if y.is_nan() {
                x.is_nan()
            } else {
                close(x, f64::from(y), mag)
            };
            assert!(ok, "{name} {what}[{i}]: GPU {x}, CPU {y} (magnitude {mag})");
        }
    }
}

/// Per pixel: the float64 sum over `frames` and the magnitude of its
/// finite terms.
fn pattern_sum_want(d: &Dense, frames: std::ops::Range<usize>) -> Want {
    let v = d.float.as_ref().expect("float values");
    Want::Float(
        (0..d.pixels)
            .map(|p| {
                let terms = frames.clone().map(|t| f64::from(v[t * d.pixels + p]));
                (
                    terms.clone().sum(),
                    terms.filter(|x| x.is_finite()).map(f64::abs).sum(),
                )
            })
            .collect(),
    )
}

/// A disk of radius `r` around the detector centre.
fn disk(rows: usize, cols: usize, r: f64) -> PixelSet {
    let (cr, cc) = ((rows as f64 - 1.0) / 2.0, (cols as f64 - 1.0) / 2.0);
    PixelSet::new(
        (0..rows * cols)
            .filter(|&p| {
                let (y, x) = ((p / cols) as f64 - cr, (p % cols) as f64 - cc);
                y * y + x * x <= r * r
            })
            .map(|p| p as u32)
            .collect(),
    )
}

#[test]
fn reductions_of_every_accepted_fixture_match_the_reference() {
    for gpu in backends() {
        for (name, f) in accepted() {
            let [_, _, rows, cols] = f.shape();
            let background = (f.codec() == Codec::Float).then(|| {
                (0..f.pixels())
                    .map(|p| (p % 7) as f32 * 0.25 - 0.5)
                    .collect::<Vec<f32>>()
            });
            for bg in [None, background] {
                let req = Request {
                    masks: vec![
                        disk(rows, cols, rows.min(cols) as f64 / 3.0),
                        PixelSet::new((0..f.pixels() as u32).step_by(3).collect()),
                        PixelSet::default(),
                    ],
                    moments: true,
                    pattern: true,
                    background: bg,
                };
                let n = f.blocks().len();
                for blocks in [0..n, n / 2..n, 0..0] {
                    let got = gpu
                        .reduce(&f, blocks.clone(), &req)
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    check_partial(&name, &f, blocks.clone(), &req, &got);
                    check_against_cpu(&name, &f, blocks, &req, &got);
                }
            }
        }
    }
}

// ----- generated acquisitions -------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Kind {
    U8,
    U16,
    Float,
    Scaled,
}

fn sm(shape: [u64; 4], scaled: bool) -> Value {
    let cal = if scaled {
        Calibration {
            processing: vec![Calibration::scaled_quantization_record()],
            ..Calibration::default()
        }
    } else {
        Calibration::default()
    };
    scientific_metadata(shape, &cal).unwrap()
}

/// Writes an acquisition with the core writer and opens it.
fn generate(
    kind: Kind,
    shape: [u64; 4],
    chunk: Option<u64>,
    values: &[u32],
    valid: Option<Vec<bool>>,
) -> QemFile {
    let n = shape[0] * shape[1];
    let (spec, dense): (WriteSpec, Vec<u8>) = match kind {
        Kind::U8 | Kind::U16 => {
            let dtype = if matches!(kind, Kind::U8) {
                CountDtype::U8
            } else {
                CountDtype::U16
            };
            let dense = match kind {
                Kind::U8 => values.iter().map(|&v| v as u8).collect(),
                _ => values
                    .iter()
                    .flat_map(|&v| (v as u16).to_le_bytes())
                    .collect(),
            };
            let spec = WriteSpec {
                content: Content::Counts {
                    dtype,
                    valid,
                    metadata: Map::new(),
                },
                ..WriteSpec::counts(shape, dtype, sm(shape, false))
            };
            (spec, dense)
        }
        Kind::Float => (
            WriteSpec::float32(shape, sm(shape, false)),
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        Kind::Scaled => {
            let region = ScaledRegion {
                first_frame: 0,
                stop_frame: n,
                scale: 0.5,
                offset: -3.0,
                intensity_min: -3.0,
                intensity_max: 32764.5,
                extra: Map::new(),
            };
            (
                WriteSpec::scaled(shape, vec![region], sm(shape, true)),
                values
                    .iter()
                    .flat_map(|&v| (v as u16).to_le_bytes())
                    .collect(),
            )
        }
    };
    let spec = match chunk {
        Some(c) => spec.with_chunk_scans(c),
        None => spec,
    };
    let bytes = encode_to_vec(spec, &dense).unwrap();
    QemFile::from_bytes(bytes).unwrap()
}

/// Values of one pixel's stream: dark, sparse, bright, large or float.
fn value(kind: Kind, class: u8, x: u64) -> u32 {
    let count = match class % 5 {
        0 => 0,
        1 => u64::from(x.is_multiple_of(23)),
        2 => x % 40,
        3 => x % 300,
        _ => x % 65536,
    };
    match kind {
        Kind::U8 => (count % 256) as u32,
        Kind::U16 | Kind::Scaled => count as u32,
        Kind::Float => {
            let f = match class % 5 {
                0 => 0.0f32,
                1 => (x % 7) as f32 * 0.125,
                2 => (x % 1000) as f32 * 0.37 - 100.0,
                3 => f32::from_bits(0x3f80_0000 | (x as u32 & 0x7f_ffff)),
                _ => ((x % 2001) as f32 - 1000.0) * 3.5e-3,
            };
            f.to_bits()
        }
    }
}

/// A seeded stream of u64 (rand's portable Xoshiro256++): the same values on every run.
fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    move || rng.next_u64()
}

fn kind_strategy() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::U8),
        Just(Kind::U16),
        Just(Kind::Float),
        Just(Kind::Scaled)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any acquisition (partial chunks and blocks, invalid pixels, all
    /// codecs), any block range, masks, moments, pattern and (float)
    /// background: the GPU equals the reference, and its decoded blocks the CPU's.
    #[test]
    fn generated_acquisitions_reduce_like_the_reference(
        kind in kind_strategy(),
        scan in (1u64..3, 1u64..700),
        det in (1u64..12, 1u64..12),
        chunk in prop_oneof![1u64..40, 500u64..=1024],
        seed in any::<u64>(),
        with_invalid in any::<bool>(),
        masks in 0usize..4,
        moments in any::<bool>(),
        pattern in any::<bool>(),
        with_background in any::<bool>(),
        range in (0.0f64..1.0, 0.0f64..1.0),
    ) {
        for gpu in backends() {
        let shape = [scan.0, scan.1, det.0, det.1];
        let n = (scan.0 * scan.1) as usize;
        let p = (det.0 * det.1) as usize;
        let chunk = match kind {
            Kind::Float => chunk.min(512),
            _ => chunk,
        };
        let mut rnd = seeded(seed);
        let classes: Vec<u8> = (0..p).map(|_| (rnd() % 5) as u8).collect();
        let values: Vec<u32> = (0..n * p).map(|i| value(kind, classes[i % p], rnd())).collect();
        let valid = (with_invalid && matches!(kind, Kind::U8 | Kind::U16))
            .then(|| (0..p).map(|_| !rnd().is_multiple_of(4)).collect::<Vec<bool>>());
        let f = generate(kind, shape, Some(chunk), &values, valid);
        for b in 0..f.blocks().len() {
            let got = gpu.decode_block(&f, b).unwrap();
            prop_assert!(got == cpu_block(&f, b).unwrap(), "block {} decoded differently", b);
        }
        let nb = f.blocks().len();
        let (a, z) = ((range.0 * nb as f64) as usize, (range.1 * nb as f64) as usize);
        let blocks = a.min(z)..a.max(z).max(a.min(z) + 1).min(nb);
        let req = Request {
            masks: (0..masks)
                .map(|_| PixelSet::new((0..p as u32).filter(|_| rnd().is_multiple_of(3)).collect()))
                .collect(),
            moments,
            pattern,
            background: (with_background && matches!(kind, Kind::Float))
                .then(|| (0..p).map(|_| (rnd() % 100) as f32 * 0.01).collect()),
        };
        let got = gpu.reduce(&f, blocks.clone(), &req).unwrap();
        check_partial("generated", &f, blocks.clone(), &req, &got);
        check_against_cpu("generated", &f, blocks, &req, &got);
        }
    }
}

/// Non-finite floats: selected NaN and infinities propagate into sums,
/// unselected ones do not; the pattern maximum is NaN where any value is.
#[test]
fn non_finite_floats_propagate_only_where_selected() {
    for gpu in backends() {
        let shape = [1, 20, 3, 4];
        let mut values: Vec<u32> = (0..20 * 12).map(|i| (i as f32 * 0.5).to_bits()).collect();
        values[12 + 1] = f32::NAN.to_bits(); // frame 1, pixel 1
        values[2 * 12 + 5] = f32::INFINITY.to_bits(); // frame 2, pixel 5
        values[3 * 12 + 5] = f32::NEG_INFINITY.to_bits(); // frame 3, pixel 5
        values[3 * 12 + 6] = f32::NEG_INFINITY.to_bits(); // frame 3, pixel 6
        let f = generate(Kind::Float, shape, None, &values, None);
        let req = Request {
            masks: vec![PixelSet::new(vec![1, 5]), PixelSet::new(vec![0, 2, 3])],
            moments: true,
            pattern: true,
            background: None,
        };
        let got = gpu.reduce(&f, 0..f.blocks().len(), &req).unwrap();
        check_partial("non-finite", &f, 0..f.blocks().len(), &req, &got);
        check_against_cpu("non-finite", &f, 0..f.blocks().len(), &req, &got);
        let Values::Float(m0) = &got.masks[0] else {
            panic!()
        };
        assert!(m0[1].is_nan() && m0[2] == f32::INFINITY && m0[3] == f32::NEG_INFINITY);
        let Values::Float(m1) = &got.masks[1] else {
            panic!()
        };
        assert!(m1.iter().all(|v| v.is_finite()));
    }
}

/// A detector wider than one pass (the scratch buffer holds 8 Mi values):
/// the per-frame sums and the pattern add up across passes.
#[test]
fn blocks_larger_than_the_scratch_buffer_are_reduced_in_passes() {
    for gpu in backends() {
        // Chunks of 409 frames (the float bound for 20480 pixels) x 2 lanes:
        // 16.4 Mi lane values per block, two passes.
        let shape = [1, 512, 128, 160];
        let p = 128 * 160;
        let mut rnd = seeded(99);
        let values: Vec<u32> = (0..512 * p)
            .map(|i| {
                if i % 11 == 0 {
                    (rnd() % 50) as f32 * 0.5
                } else {
                    0.0
                }
                .to_bits()
            })
            .collect();
        let f = generate(Kind::Float, shape, None, &values, None);
        assert_eq!(f.blocks()[0].frames, 409);
        let req = Request {
            masks: vec![disk(128, 160, 40.0)],
            moments: true,
            pattern: true,
            background: None,
        };
        let got = gpu.reduce(&f, 0..2, &req).unwrap();
        check_partial("wide", &f, 0..2, &req, &got);
        check_against_cpu("wide", &f, 0..2, &req, &got);
        assert!(gpu.decode_block(&f, 0).unwrap() == cpu_block(&f, 0).unwrap());
    }
}

#[test]
fn requests_the_backend_cannot_serve_are_refused() {
    for gpu in backends() {
        let f = generate(Kind::U16, [1, 3, 2, 2], None, &[1; 12], None);
        let bad_mask = Request {
            masks: vec![PixelSet::new(vec![4])],
            ..Request::default()
        };
        assert!(matches!(
            gpu.reduce(&f, 0..1, &bad_mask),
            Err(ReduceError::Unsupported(_))
        ));
        let background = Request {
            background: Some(vec![0.0; 4]),
            ..Request::default()
        };
        assert!(matches!(
            gpu.reduce(&f, 0..1, &background),
            Err(ReduceError::Unsupported(_))
        ));
        assert!(gpu.reduce(&f, 0..2, &Request::default()).is_err());
    }
}

/// Kahan compensation survives the shader compiler: 16384 followed by 511
/// values of 0.1 sums to 16435.1000 compensated, while plain float32
/// summation loses about 0.2 (each 0.1 rounds to a multiple of 2^-9).
#[test]
fn float_sums_are_compensated() {
    for gpu in backends() {
        let values: Vec<u32> = (0..512)
            .map(|t| if t == 0 { 16384.0f32 } else { 0.1 }.to_bits())
            .collect();
        let f = generate(Kind::Float, [1, 512, 1, 1], None, &values, None);
        let req = Request {
            pattern: true,
            ..Request::default()
        };
        let got = gpu.reduce(&f, 0..f.blocks().len(), &req).unwrap();
        let exact = 16384.0 + 511.0 * f64::from(0.1f32);
        let plain = (1..512).fold(16384.0f32, |s, _| s + 0.1);
        assert!(
            (f64::from(plain) - exact).abs() > 0.1,
            "plain float32 sum {plain}"
        );
        let Some(Values::Float(sum)) = got.pattern.map(|p| p.sum) else {
            panic!("pattern")
        };
        assert!(
            (f64::from(sum[0]) - exact).abs() < 2e-3,
            "GPU sum {}, exact {exact}",
            sum[0]
        );
    }
}

/// Counts whose frame sums exceed 2^24: the virtual images a GPU backend
/// computes through the planner are uint64 and equal plain u64 sums, the
/// mean pattern and centre of mass equal the exact totals divided once in
/// binary64, and all of them equal the CPU's bit for bit.
#[test]
fn count_images_above_two_to_the_24_are_exact_on_the_gpu() {
    use qemfs::reduce::geometry::{mask, Shape};
    use qemfs::reduce::{Image, Reducer};
    for gpu in backends() {
        let (frames, rows, columns) = (10usize, 40usize, 36usize);
        let p_count = rows * columns;
        let mut rnd = seeded(0x2424);
        let values: Vec<u32> = (0..frames * p_count)
            .map(|_| 60001 + 2 * (rnd() % 2000) as u32)
            .collect();
        let f = generate(
            Kind::U16,
            [2, 5, rows as u64, columns as u64],
            Some(3),
            &values,
            None,
        );
        let masks = [
            PixelSet::new((0..p_count as u32).collect()),
            mask([rows, columns], [19.5, 17.5], Shape::Disk { radius: 15.0 }),
            mask(
                [rows, columns],
                [19.5, 17.5],
                Shape::Annulus {
                    inner: 4.0,
                    outer: 100.0,
                },
            ),
        ];
        let on_gpu = Reducer::new(&f, gpu as &dyn Accelerator).unwrap();
        let on_cpu = Reducer::new(&f, &Cpu).unwrap();
        let images = on_gpu.images(&masks).unwrap();
        for (set, image) in masks.iter().zip(&images) {
            let want: Vec<u64> = (0..frames)
                .map(|t| {
                    set.pixels()
                        .iter()
                        .map(|&p| u64::from(values[t * p_count + p as usize]))
                        .sum()
                })
                .collect();
            assert!(want.iter().any(|&s| s > 1 << 24 && s as f32 as u64 != s));
            assert_eq!(image, &Image::U64(want), "{}", gpu.name());
        }
        assert_eq!(images, on_cpu.images(&masks).unwrap());
        let full = on_gpu.full().unwrap();
        for p in 0..p_count {
            let s: u64 = (0..frames)
                .map(|t| u64::from(values[t * p_count + p]))
                .sum();
            assert_eq!(full.mean_dp.get(p), Some(s as f64 / frames as f64));
        }
        for t in 0..frames {
            let frame = &values[t * p_count..(t + 1) * p_count];
            let total: u64 = frame.iter().map(|&v| u64::from(v)).sum();
            let col: u64 = (0..p_count)
                .map(|p| (p % columns) as u64 * u64::from(frame[p]))
                .sum();
            assert_eq!(full.com[1].get(t), Some(col as f64 / total as f64));
        }
        assert_eq!(full, on_cpu.full().unwrap());
    }
}

/// ±FLT_MAX beside ordinary values, infinities and NaN: every mask sum and
/// the pattern sum equal the exact reference (rounded once to float32) and
/// the CPU's bit for bit; sums that overflow are ±inf, never NaN.
#[test]
fn float_extremes_match_the_exact_reference_and_the_cpu() {
    for gpu in backends() {
        let (shape, values) = extreme_floats();
        let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        let f = generate(Kind::Float, shape.map(|s| s as u64), None, &bits, None);
        let (frames, p) = (24, 64);
        let req = Request {
            masks: vec![
                PixelSet::new((0..64).collect()),
                disk(8, 8, 2.5),
                PixelSet::new(vec![9, 10, 27, 36, 54]),
                PixelSet::new((0..64).filter(|q| q % 3 != 0).collect()),
            ],
            moments: true,
            pattern: true,
            background: None,
        };
        let all = 0..f.blocks().len();
        let got = gpu.reduce(&f, all.clone(), &req).unwrap();
        let cpu = Cpu.reduce(&f, all, &req).unwrap();
        // Bit for bit (NaN equal to NaN).
        let same = |a: &Values, b: &Values| match (a, b) {
            (Values::Float(a), Values::Float(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
            }
            _ => false,
        };
        for (k, (a, b)) in got.masks.iter().zip(&cpu.masks).enumerate() {
            assert!(same(a, b), "{}: mask {k}: {a:?} vs {b:?}", gpu.name());
        }
        let sums = |part: &Partial| part.pattern.as_ref().map(|p| p.sum.clone());
        let (a, b) = (sums(&got).unwrap(), sums(&cpu).unwrap());
        assert!(same(&a, &b), "{}: pattern sum: {a:?} vs {b:?}", gpu.name());
        for (k, (set, v)) in req.masks.iter().zip(&got.masks).enumerate() {
            let Values::Float(v) = v else { panic!() };
            for t in 0..frames {
                let terms: Vec<f32> = set
                    .pixels()
                    .iter()
                    .map(|&q| values[t * p + q as usize])
                    .collect();
                let want = exact_f32_sum(terms.iter().copied());
                assert!(
                    same_sum(v[t], want, &terms),
                    "{}: mask {k} frame {t}: {} vs {want}",
                    gpu.name(),
                    v[t]
                );
            }
        }
        let Some(Values::Float(sum)) = sums(&got) else {
            panic!()
        };
        for q in 0..p {
            let terms: Vec<f32> = (0..frames).map(|t| values[t * p + q]).collect();
            let want = exact_f32_sum(terms.iter().copied());
            assert!(
                same_sum(sum[q], want, &terms),
                "pixel {q}: {} vs {want}",
                sum[q]
            );
        }
        // The moments' totals are the whole-detector masks.
        let total = got.moments.as_ref().map(|m| m.total.clone()).unwrap();
        assert!(same(&total, &got.masks[0]));
    }
}

/// The masked centre of mass is planned as row and column mask sums, so a
/// GPU backend gives the CPU's values exactly for counts, and a float64
/// reference's.
#[test]
fn masked_centre_of_mass_equals_the_cpu_and_a_reference() {
    use qemfs::reduce::geometry::{mask, Shape};
    use qemfs::reduce::Reducer;
    for gpu in backends() {
        let (frames, rows, columns) = (12usize, 30usize, 34usize);
        let p_count = rows * columns;
        let mut rnd = seeded(0xc0c0);
        let values: Vec<u32> = (0..frames * p_count)
            .map(|_| (rnd() % 900) as u32)
            .collect();
        let f = generate(
            Kind::U16,
            [3, 4, rows as u64, columns as u64],
            Some(5),
            &values,
            None,
        );
        let center = [14.5, 16.0];
        // 2·21 + 1 rows and columns: more masks than one CPU request holds.
        let set = mask([rows, columns], center, Shape::Disk { radius: 21.0 });
        let got = Reducer::new(&f, gpu as &dyn Accelerator)
            .unwrap()
            .masked_com(&set, center)
            .unwrap();
        let cpu = Reducer::new(&f, &Cpu)
            .unwrap()
            .masked_com(&set, center)
            .unwrap();
        assert_eq!(got, cpu, "{}", gpu.name());
        for t in 0..frames {
            let (mut total, mut mr, mut mc) = (0f64, 0f64, 0f64);
            for &p in set.pixels() {
                let v = f64::from(values[t * p_count + p as usize]);
                total += v;
                mr += ((p as usize / columns) as f64 - center[0]) * v;
                mc += ((p as usize % columns) as f64 - center[1]) * v;
            }
            let (r, c) = (got[0].get(t).unwrap(), got[1].get(t).unwrap());
            assert!((r - mr / total).abs() < 1e-12 && (c - mc / total).abs() < 1e-12);
        }
    }
}
