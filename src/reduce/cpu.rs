//! The CPU reference implementation of [`Accelerator`].
//!
//! One block at a time, in parallel over fixed groups of pixels: each task
//! decodes its group's streams (all valid pixels for moments or a pattern,
//! else only the masks' pixels) and reduces them while they are in cache.
//! Partial results are merged in pixel order, so float results do not
//! depend on the number of threads.

use std::ops::Range;

use rayon::prelude::*;

use super::accelerator::{Accelerator, Moments, Partial, Pattern, ReduceError, Request, Values};
use super::neumaier::Neumaier;
use crate::qem::{Codec, PixelValues, QemError, QemFile};

mod whole;

/// Reductions on the CPU, in parallel with rayon.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

/// Pixels reduced by one task (fixed, for reproducible float sums).
const GROUP: usize = 256;

impl Accelerator for Cpu {
    fn name(&self) -> &str {
        "cpu"
    }

    fn reduce(
        &self,
        file: &QemFile,
        blocks: Range<usize>,
        request: &Request,
    ) -> Result<Partial, ReduceError> {
        let plan = Plan::new(file, &blocks, request)?;
        if file.codec() == Codec::Float {
            reduce_float(file, blocks, request, &plan)
        } else if request.masks.is_empty() && (request.moments || request.pattern) {
            whole::reduce(file, blocks, request, &plan)
        } else {
            reduce_exact(file, blocks, request, &plan)
        }
    }
}

/// What every block needs: the pixels to decode and, per decoded pixel,
/// its coordinates and the masks it belongs to.
struct Plan {
    /// Valid pixels to decode, ascending.
    pixels: Vec<usize>,
    /// Per entry of `pixels`: bit `i` set when it belongs to mask `i`.
    membership: Vec<u64>,
    columns: usize,
    frames: usize,
}

impl Plan {
    fn new(file: &QemFile, blocks: &Range<usize>, request: &Request) -> Result<Self, ReduceError> {
        let all = file.blocks();
        if blocks.start > blocks.end || blocks.end > all.len() {
            return Err(ReduceError::Unsupported(format!(
                "blocks {}..{} outside the file's {} blocks",
                blocks.start,
                blocks.end,
                all.len()
            )));
        }
        if request.masks.len() > 64 {
            return Err(ReduceError::Unsupported(
                "at most 64 masks per request".into(),
            ));
        }
        let p_count = file.pixels();
        if let Some(bg) = &request.background {
            if file.codec() != Codec::Float || bg.len() != p_count {
                return Err(ReduceError::Unsupported(
                    "a background plane needs the float codec and one value per detector pixel"
                        .into(),
                ));
            }
        }
        for mask in &request.masks {
            if let Some(&p) = mask.pixels().last() {
                if p as usize >= p_count {
                    return Err(ReduceError::Unsupported(format!(
                        "mask pixel {p} outside the detector's {p_count} pixels"
                    )));
                }
            }
        }
        let [_, _, _, columns] = file.shape();
        // Exact moments must fit u64: Σ index · value over a frame.
        if request.moments
            && (p_count as u128) * 65535 * (file.shape()[2].max(columns) as u128) >= 1 << 64
        {
            return Err(ReduceError::Unsupported(
                "detector too large for exact 64-bit moments".into(),
            ));
        }
        let valid = |p: usize| file.valid_mask().is_none_or(|v| v.is_valid(p));
        let mut membership = vec![0u64; p_count];
        for (i, mask) in request.masks.iter().enumerate() {
            for &p in mask.pixels() {
                membership[p as usize] |= 1 << i;
            }
        }
        let everything = request.moments || request.pattern;
        let (pixels, membership): (Vec<usize>, Vec<u64>) = (0..p_count)
            .filter(|&p| valid(p) && (everything || membership[p] != 0))
            .map(|p| (p, membership[p]))
            .unzip();
        let frames = all[blocks.clone()].iter().map(|b| b.frames).sum();
        Ok(Plan {
            pixels,
            membership,
            columns,
            frames,
        })
    }
}

/// The masks a pixel belongs to: the set bits of its membership word,
/// lowest first.
fn set_bits(mut bits: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            i
        })
    })
}

/// The partial result of either kind: the products `request` asked for,
/// each wrapped by `values`.
fn partial<T>(
    request: &Request,
    masks: Vec<Vec<T>>,
    [total, row, column]: [Vec<T>; 3],
    [sum, max]: [Vec<T>; 2],
    values: fn(Vec<T>) -> Values,
) -> Partial {
    Partial {
        masks: masks.into_iter().map(values).collect(),
        moments: request.moments.then(|| Moments {
            total: values(total),
            row: values(row),
            column: values(column),
        }),
        pattern: request.pattern.then(|| Pattern {
            sum: values(sum),
            max: values(max),
        }),
    }
}

/// Integer counts and scaled codes: exact u64 sums.
fn reduce_exact(
    file: &QemFile,
    blocks: Range<usize>,
    request: &Request,
    plan: &Plan,
) -> Result<Partial, ReduceError> {
    let masks = request.masks.len();
    let p_count = file.pixels();
    let mut mask_sums = vec![Vec::with_capacity(plan.frames); masks];
    let mut moments = [(); 3].map(|_| Vec::with_capacity(plan.frames));
    // Pattern sum and maximum per entry of `plan.pixels`, each group's
    // entries updated by the task that decodes the group.
    let mut pattern = vec![(0u64, 0u64); plan.pixels.len()];
    // The index fields these pixels cover are checked on the way, so that
    // no index product is served from a block found to disagree.
    let coverage = file.index_coverage(&plan.pixels);
    for b in blocks {
        let m = file.blocks()[b].frames;
        let check = coverage.as_ref().and_then(|c| c.check(file, b));
        // Each task decodes one group of pixels and reduces it while the
        // values are in cache; the block is never laid out whole.
        let parts = plan
            .pixels
            .par_chunks(GROUP)
            .zip(plan.membership.par_chunks(GROUP))
            .zip(pattern.par_chunks_mut(GROUP))
            .map(|((pixels, member), pattern)| {
                let decoded = file.decode_block_pixels(b, pixels)?;
                let PixelValues::U16(cols) = decoded.values else {
                    unreachable!("integer codecs decode to u16");
                };
                if let Some(check) = &check {
                    check.add(file, pixels, &cols);
                }
                // Mask sums, then total/row/column, each `m` per frame.
                let mut sums = vec![0u64; masks * m];
                let mut mom = vec![0u64; if request.moments { 3 * m } else { 0 }];
                for (((col, &p), &bits), (sum, max)) in cols
                    .chunks_exact(m.max(1))
                    .zip(pixels)
                    .zip(member)
                    .zip(pattern.iter_mut())
                {
                    for i in set_bits(bits) {
                        for (s, &v) in sums[i * m..(i + 1) * m].iter_mut().zip(col) {
                            *s += u64::from(v);
                        }
                    }
                    if request.moments {
                        let (r, c) = ((p / plan.columns) as u64, (p % plan.columns) as u64);
                        let (total, rest) = mom.split_at_mut(m);
                        let (row, column) = rest.split_at_mut(m);
                        for (t, &v) in col.iter().enumerate() {
                            let v = u64::from(v);
                            total[t] += v;
                            row[t] += r * v;
                            column[t] += c * v;
                        }
                    }
                    if request.pattern {
                        *sum += col.iter().map(|&v| u64::from(v)).sum::<u64>();
                        *max = (*max).max(u64::from(col.iter().copied().max().unwrap_or(0)));
                    }
                }
                Ok((sums, mom))
            })
            .collect::<Result<Vec<_>, QemError>>()?;
        if let Some(check) = check {
            check.finish(file);
        }
        let mut sums = vec![0u64; masks * m];
        let mut mom = vec![0u64; if request.moments { 3 * m } else { 0 }];
        for (s, mo) in parts {
            sums.iter_mut().zip(s).for_each(|(a, b)| *a += b);
            mom.iter_mut().zip(mo).for_each(|(a, b)| *a += b);
        }
        for (i, acc) in mask_sums.iter_mut().enumerate() {
            acc.extend_from_slice(&sums[i * m..(i + 1) * m]);
        }
        if request.moments {
            for (k, acc) in moments.iter_mut().enumerate() {
                acc.extend_from_slice(&mom[k * m..(k + 1) * m]);
            }
        }
    }
    // `plan.pixels` are the valid pixels; invalid ones stay 0.
    let mut pattern_sum = vec![0u64; if request.pattern { p_count } else { 0 }];
    let mut pattern_max = pattern_sum.clone();
    if request.pattern {
        for (&p, &(sum, max)) in plan.pixels.iter().zip(&pattern) {
            (pattern_sum[p], pattern_max[p]) = (sum, max);
        }
    }
    Ok(partial(
        request,
        mask_sums,
        moments,
        [pattern_sum, pattern_max],
        Values::Exact,
    ))
}

/// Float32 measurements: compensated float32 sums, background subtracted
/// per value first.
fn reduce_float(
    file: &QemFile,
    blocks: Range<usize>,
    request: &Request,
    plan: &Plan,
) -> Result<Partial, ReduceError> {
    let masks = request.masks.len();
    let p_count = file.pixels();
    let mut mask_sums = vec![Vec::with_capacity(plan.frames); masks];
    let mut moments = [(); 3].map(|_| Vec::with_capacity(plan.frames));
    // Per entry of `plan.pixels`: compensated sum, maximum, whether a
    // value was seen. Each pixel's values are added in frame order by the
    // task that decodes its group, so results do not depend on the number
    // of threads.
    let mut pattern = vec![(Neumaier::default(), 0f32, false); plan.pixels.len()];
    let background = request.background.as_deref();
    let value = |bits: u32, p: usize| {
        let v = f32::from_bits(bits);
        background.map_or(v, |bg| v - bg[p])
    };
    for b in blocks {
        let m = file.blocks()[b].frames;
        // As for counts: each task decodes one group and reduces it.
        let parts = plan
            .pixels
            .par_chunks(GROUP)
            .zip(plan.membership.par_chunks(GROUP))
            .zip(pattern.par_chunks_mut(GROUP))
            .map(|((pixels, member), pattern)| {
                let decoded = file.decode_block_pixels(b, pixels)?;
                let PixelValues::F32Bits(cols) = decoded.values else {
                    unreachable!("the float codec decodes to bits");
                };
                let mut sums = vec![Neumaier::default(); masks * m];
                let mut mom = vec![Neumaier::default(); if request.moments { 3 * m } else { 0 }];
                for (((col, &p), &bits), (sum, max, seen)) in cols
                    .chunks_exact(m.max(1))
                    .zip(pixels)
                    .zip(member)
                    .zip(pattern.iter_mut())
                {
                    for i in set_bits(bits) {
                        for (s, &v) in sums[i * m..(i + 1) * m].iter_mut().zip(col) {
                            s.add(value(v, p));
                        }
                    }
                    if request.moments {
                        let (r, c) = ((p / plan.columns) as f32, (p % plan.columns) as f32);
                        let (total, rest) = mom.split_at_mut(m);
                        let (row, column) = rest.split_at_mut(m);
                        for (t, &v) in col.iter().enumerate() {
                            let v = value(v, p);
                            total[t].add(v);
                            row[t].add(r * v);
                            column[t].add(c * v);
                        }
                    }
                    if request.pattern {
                        for &v in col {
                            let v = value(v, p);
                            sum.add(v);
                            *max = nan_max(*max, v, *seen);
                            *seen = true;
                        }
                    }
                }
                Ok((sums, mom))
            })
            .collect::<Result<Vec<_>, QemError>>()?;
        let mut sums = vec![Neumaier::default(); masks * m];
        let mut mom = vec![Neumaier::default(); if request.moments { 3 * m } else { 0 }];
        for (s, mo) in parts {
            sums.iter_mut().zip(s).for_each(|(a, b)| a.merge(b));
            mom.iter_mut().zip(mo).for_each(|(a, b)| a.merge(b));
        }
        for (i, acc) in mask_sums.iter_mut().enumerate() {
            acc.extend(sums[i * m..(i + 1) * m].iter().map(Neumaier::value));
        }
        if request.moments {
            for (k, acc) in moments.iter_mut().enumerate() {
                acc.extend(mom[k * m..(k + 1) * m].iter().map(Neumaier::value));
            }
        }
    }
    let mut pattern_sum = vec![0f32; if request.pattern { p_count } else { 0 }];
    let mut pattern_max = pattern_sum.clone();
    if request.pattern {
        for (&p, (sum, max, _)) in plan.pixels.iter().zip(&pattern) {
            pattern_sum[p] = sum.value();
            pattern_max[p] = *max;
        }
    }
    Ok(partial(
        request,
        mask_sums,
        moments,
        [pattern_sum, pattern_max],
        Values::Float,
    ))
}

/// The maximum with NaN propagating as the canonical quiet NaN (payloads
/// differ between backends; the GPU kernels keep only a NaN flag); the
/// first value seen replaces the initial 0 (a pattern of negative values
/// keeps its maximum).
fn nan_max(current: f32, v: f32, seen: bool) -> f32 {
    if v.is_nan() || (seen && current.is_nan()) {
        return f32::NAN;
    }
    if !seen {
        return v;
    }
    current.max(v)
}

/// Plain references for tests and other backends: products of `request`
/// computed one value at a time from the dense decoded array.
#[cfg(test)]
pub(crate) fn dense_reference(file: &QemFile, request: &Request) -> (Vec<Vec<f64>>, Vec<f64>) {
    let n = file.frames();
    let p_count = file.pixels();
    let mut dense = vec![0u8; file.dense_bytes().unwrap_or(0)];
    file.read_all(&mut dense).expect("decodes");
    let e = file.decoded_dtype().size();
    let at = |f: usize, p: usize| -> f64 {
        let o = (f * p_count + p) * e;
        match file.codec() {
            Codec::Integer if e == 1 => f64::from(dense[o]),
            Codec::Integer => f64::from(u16::from_le_bytes([dense[o], dense[o + 1]])),
            _ => f64::from(f32::from_le_bytes(dense[o..o + 4].try_into().unwrap())),
        }
    };
    let valid = |p: usize| file.valid_mask().is_none_or(|v| v.is_valid(p));
    let masks = request
        .masks
        .iter()
        .map(|m| {
            (0..n)
                .map(|f| {
                    m.pixels()
                        .iter()
                        .filter(|&&p| valid(p as usize))
                        .map(|&p| at(f, p as usize))
                        .sum()
                })
                .collect()
        })
        .collect();
    let totals = (0..n)
        .map(|f| (0..p_count).filter(|&p| valid(p)).map(|p| at(f, p)).sum())
        .collect();
    (masks, totals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, Content, CountDtype, WriteSpec,
    };
    use crate::reduce::PixelSet;
    use rand::{rngs::Xoshiro256PlusPlus, Rng, SeedableRng};

    /// Sparse counts with some large values, chunks of 300 scans (so the
    /// last block is partial), and every fifth pixel invalid.
    fn counts_file(shape: [usize; 4], seed: u64) -> QemFile {
        let [sr, sc, r, c] = shape;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let dense: Vec<u8> = (0..sr * sc * r * c)
            .flat_map(|i| {
                let v = rng.next_u64();
                let v = if i % 7 == 0 { v % 3000 } else { v % 4 } as u16;
                v.to_le_bytes()
            })
            .collect();
        let shape = shape.map(|s| s as u64);
        let mut spec = WriteSpec::counts(
            shape,
            CountDtype::U16,
            scientific_metadata(shape, &Calibration::default()).unwrap(),
        )
        .with_chunk_scans(300);
        if let Content::Counts { valid, .. } = &mut spec.content {
            *valid = Some((0..r * c).map(|p| p % 5 != 3).collect());
        }
        QemFile::from_bytes(encode_to_vec(spec, &dense).unwrap()).unwrap()
    }

    /// Requests without masks decode whole blocks (module `whole`), those
    /// with masks pixel groups: the same moments and patterns, through
    /// blocks decoded several at once and one spread over the threads,
    /// invalid pixels, and a detector of more rows than one band of u32
    /// column sums holds.
    #[test]
    fn patterns_and_moments_of_whole_blocks_equal_the_pixel_groups() {
        for shape in [[23, 29, 10, 13], [3, 700, 16, 16], [1, 301, 65_537, 2]] {
            let file = counts_file(shape, 9);
            let blocks = 0..file.blocks().len();
            let whole = Request {
                masks: Vec::new(),
                moments: true,
                pattern: true,
                background: None,
            };
            let grouped = Request {
                masks: vec![PixelSet::new(vec![0])],
                ..whole.clone()
            };
            let a = Cpu.reduce(&file, blocks.clone(), &whole).unwrap();
            let b = Cpu.reduce(&file, blocks, &grouped).unwrap();
            let values = |p: &Partial| {
                let (m, q) = (p.moments.as_ref().unwrap(), p.pattern.as_ref().unwrap());
                [&m.total, &m.row, &m.column, &q.sum, &q.max].map(|v| match v {
                    Values::Exact(v) => v.clone(),
                    Values::Float(_) => panic!("exact values expected"),
                })
            };
            let (a, b) = (values(&a), values(&b));
            assert!(a[0].iter().any(|&t| t > 0), "{shape:?}: nothing summed");
            for (k, (a, b)) in ["total", "row", "column", "sum", "max"]
                .iter()
                .zip(a.iter().zip(&b))
            {
                assert!(a == b, "{shape:?}: {k} differs");
            }
        }
    }

    /// A pattern sum beyond u32: more frames of the largest count than a
    /// u32 sum holds, with the blocks decoded several at once and the
    /// last ones spread over the threads.
    #[test]
    fn pattern_sums_beyond_u32_are_exact() {
        let frames = (1usize << 16) + 300;
        let shape = [1, frames as u64, 1, 2];
        let dense = vec![0xFFu8; frames * 2 * 2];
        let spec = WriteSpec::counts(
            shape,
            CountDtype::U16,
            scientific_metadata(shape, &Calibration::default()).unwrap(),
        );
        let file = QemFile::from_bytes(encode_to_vec(spec, &dense).unwrap()).unwrap();
        let request = Request {
            masks: Vec::new(),
            moments: true,
            pattern: true,
            background: None,
        };
        let out = Cpu.reduce(&file, 0..file.blocks().len(), &request).unwrap();
        let pattern = out.pattern.unwrap();
        let (Values::Exact(sum), Values::Exact(max)) = (&pattern.sum, &pattern.max) else {
            panic!("exact values expected")
        };
        assert_eq!(sum, &vec![frames as u64 * 65535; 2]);
        assert_eq!(max, &vec![65535; 2]);
        let Values::Exact(total) = &out.moments.unwrap().total else {
            panic!("exact values expected")
        };
        assert_eq!(total, &vec![2 * 65535; frames]);
    }

    #[test]
    fn exact_sums_equal_a_dense_reference() {
        let file = counts_file([23, 29, 10, 13], 7);
        let request = Request {
            masks: vec![
                PixelSet::new(vec![0, 5, 17, 129]),
                PixelSet::new((0..130).collect()),
                PixelSet::default(),
            ],
            moments: true,
            pattern: true,
            background: None,
        };
        let out = Cpu.reduce(&file, 0..file.blocks().len(), &request).unwrap();
        let (masks, totals) = dense_reference(&file, &request);
        for (got, want) in out.masks.iter().zip(&masks) {
            let Values::Exact(got) = got else { panic!() };
            let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
            assert_eq!(&got, want);
        }
        let Values::Exact(total) = &out.moments.as_ref().unwrap().total else {
            panic!()
        };
        let total: Vec<f64> = total.iter().map(|&v| v as f64).collect();
        assert_eq!(total, totals);
    }
}
