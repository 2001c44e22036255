//! The products a user sees, planned once for every backend: virtual
//! images, centre of mass, mean and maximum patterns (spec §13).
//!
//! For integer counts a mask is split into whole 32×32 and 8×8 tiles, whose
//! sums the spatial index already holds, and a residue of single pixels
//! that are decoded. Where the mask's complement leaves a smaller residue
//! (an annulus reaching the detector edge), the image is the frame total
//! minus the complement. Both are exact.

use std::ops::Range;

use rayon::prelude::*;

use super::accelerator::{Accelerator, PixelSet, ReduceError, Request, Values};
use crate::qem::{Codec, Dtype, QemFile, Region, Tile};

/// Masks per backend request (the CPU reference's limit; the GPU
/// backends take more).
const MASKS_PER_REQUEST: usize = 64;

/// Computes products of one file with one backend.
pub struct Reducer<'a> {
    file: &'a QemFile,
    accelerator: &'a dyn Accelerator,
    background: Option<Vec<f32>>,
    /// See [`Reducer::verify_index`].
    verify_index: bool,
}

/// The values of one product in the dtype it is served as: exact `u64`
/// sums of counts, `f64` where counts or scaled codes are divided or
/// calibrated (computed from exact integers and rounded once), compensated
/// `f32` for float32 measurements.
#[derive(Debug, Clone, PartialEq)]
pub enum Image {
    U64(Vec<u64>),
    F64(Vec<f64>),
    F32(Vec<f32>),
}

impl Image {
    pub fn len(&self) -> usize {
        match self {
            Image::U64(v) => v.len(),
            Image::F64(v) => v.len(),
            Image::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` in binary64 (exact for every variant up to 2^53).
    pub fn get(&self, i: usize) -> Option<f64> {
        match self {
            Image::U64(v) => v.get(i).map(|&x| x as f64),
            Image::F64(v) => v.get(i).copied(),
            Image::F32(v) => v.get(i).map(|&x| f64::from(x)),
        }
    }

    /// The element type of the values.
    pub fn kind(&self) -> ImageKind {
        match self {
            Image::U64(_) => ImageKind::U64,
            Image::F64(_) => ImageKind::F64,
            Image::F32(_) => ImageKind::F32,
        }
    }

    /// Every value in binary64.
    pub fn to_f64(&self) -> Vec<f64> {
        (0..self.len()).filter_map(|i| self.get(i)).collect()
    }

    /// Little-endian bytes of the values, as an `.npy` body holds them.
    pub fn le_bytes(&self) -> Vec<u8> {
        match self {
            Image::U64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Image::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Image::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// The kind of [`Image`] a file's products have: `[images, means]`, the
/// first for masked sums, the second for centre of mass and mean pattern.
/// Known from the codec alone, so sizes are known before any decoding.
pub fn image_kinds(codec: Codec) -> [ImageKind; 2] {
    match codec {
        Codec::Integer => [ImageKind::U64, ImageKind::F64],
        Codec::Scaled => [ImageKind::F64, ImageKind::F64],
        Codec::Float => [ImageKind::F32, ImageKind::F32],
    }
}

/// The element type of an [`Image`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    U64,
    F64,
    F32,
}

/// The products that need every pixel of every frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Full {
    /// Absolute centre of mass per frame, `[row, column]`; NaN where the
    /// frame's total is 0 or not finite.
    pub com: [Image; 2],
    pub mean_dp: Image,
    pub max_dp: MaxPattern,
}

/// The maximum pattern in the decoded dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum MaxPattern {
    U8(Vec<u8>),
    U16(Vec<u16>),
    F32(Vec<f32>),
}

/// How one mask is computed from tiles and decoded pixels.
struct TilePlan {
    tiles32: Vec<usize>,
    tiles8: Vec<usize>,
    /// Decoded pixels added to the tiles' sums: the wanted pixels of the
    /// 8×8 tiles partly wanted, where they are the fewer.
    plus: PixelSet,
    /// Decoded pixels taken from the tiles' sums: the unwanted pixels of
    /// the 8×8 tiles partly wanted, where those are the fewer (such a tile
    /// is in `tiles8`). A ring's edge then decodes at most half of each
    /// tile it crosses.
    minus: PixelSet,
    /// The image is the frame total minus this plan's sum.
    complement: bool,
}

impl TilePlan {
    fn residue(&self) -> usize {
        self.plus.len() + self.minus.len()
    }
}

/// The detector pixels of tile `i` (in tile-row order) of size `tile`.
fn tile_pixels(
    tile: Tile,
    i: usize,
    rows: usize,
    columns: usize,
) -> impl Iterator<Item = usize> + Clone {
    let e = tile.edge();
    let (_, gc) = tile.grid(rows, columns);
    let (r0, c0) = ((i / gc) * e, (i % gc) * e);
    (r0..(r0 + e).min(rows))
        .flat_map(move |r| (c0..(c0 + e).min(columns)).map(move |c| r * columns + c))
}

impl<'a> Reducer<'a> {
    /// A reducer for `file`; reads the float codec's saved mean-dark plane,
    /// which every product subtracts once.
    pub fn new(file: &'a QemFile, accelerator: &'a dyn Accelerator) -> Result<Self, ReduceError> {
        Ok(Reducer {
            file,
            accelerator,
            background: background_plane(file)?,
            verify_index: false,
        })
    }

    /// Whether products from the spatial index decode and check each
    /// block they use first ([`QemFile::spatial_sums_checked`]); see
    /// [`crate::reduce::geometry::DetectorOptions::verify_index`] for the
    /// default.
    pub fn verify_index(mut self, on: bool) -> Self {
        self.verify_index = on;
        self
    }

    pub fn file(&self) -> &QemFile {
        self.file
    }

    pub fn accelerator(&self) -> &dyn Accelerator {
        self.accelerator
    }

    /// Whether products subtract a saved background plane.
    pub fn has_background(&self) -> bool {
        self.background.is_some()
    }

    /// Whether detector pixel `p` is valid (invalid pixels read as 0).
    pub fn is_valid(&self, p: usize) -> bool {
        self.file.valid_mask().is_none_or(|v| v.is_valid(p))
    }

    /// `[rows, columns]` of the detector.
    pub fn detector(&self) -> [usize; 2] {
        let [_, _, r, c] = self.file.shape();
        [r, c]
    }

    fn request(&self, masks: Vec<PixelSet>, moments: bool, pattern: bool) -> Request {
        Request {
            masks,
            moments,
            pattern,
            background: self.background.clone(),
        }
    }

    /// Virtual images: per mask, one value per frame (exact `u64` for
    /// counts, `f64` for scaled codes, compensated `f32` for floats).
    pub fn images(&self, masks: &[PixelSet]) -> Result<Vec<Image>, ReduceError> {
        // Backends take at most MASKS_PER_REQUEST masks at a time.
        let mut out = Vec::with_capacity(masks.len());
        for group in masks.chunks(MASKS_PER_REQUEST) {
            out.extend(self.images_at_once(group)?);
        }
        Ok(out)
    }

    /// The centre of mass inside `mask`, relative to `center`: per frame
    /// `[Σ (row − cy)·I / Σ I, Σ (column − cx)·I / Σ I]` over the mask's
    /// valid pixels; NaN where the masked total is 0 or not finite.
    ///
    /// The moments come from masked sums, like any virtual detector, on
    /// every backend: `Σ row·I = Σ_b 2^b · S_b`, where `S_b` sums the mask's
    /// pixels whose row has bit `b` set (and likewise for columns). That is
    /// `1 + ⌈log2 rows⌉ + ⌈log2 columns⌉` sums in one request, so each
    /// pixel of the mask is decoded once and whole tiles of the bit planes
    /// (stripes 8 and 32 pixels wide) come from the spatial index. Counts
    /// combine exactly in integers and are divided once in binary64; float
    /// images (compensated float32 sums) combine in binary64 and are rounded
    /// back to float32 once.
    pub fn masked_com(&self, mask: &PixelSet, center: [f64; 2]) -> Result<[Image; 2], ReduceError> {
        let [rows, columns] = self.detector();
        let columns = columns.max(1);
        let bits = |n: usize| (usize::BITS - n.saturating_sub(1).leading_zeros()) as usize;
        let (row_bits, col_bits) = (bits(rows), bits(columns));
        let plane = |coordinate: &dyn Fn(usize) -> usize, b: usize| {
            PixelSet::new(
                mask.pixels()
                    .iter()
                    .copied()
                    .filter(|&p| coordinate(p as usize) >> b & 1 == 1)
                    .collect(),
            )
        };
        let mut sets = vec![mask.clone()];
        sets.extend((0..row_bits).map(|b| plane(&|p| p / columns, b)));
        sets.extend((0..col_bits).map(|b| plane(&|p| p % columns, b)));
        let images = self.images(&sets)?;
        let (total, planes) = images
            .split_first()
            .ok_or_else(|| mismatch(self.accelerator))?;
        let (by_row, by_col) = planes.split_at(row_bits);
        let n = self.file.frames();
        let com = |planes: &[Image], origin: f64| -> Image {
            let at = |f: usize| -> f64 {
                if let Image::U64(t) = total {
                    let moment: Option<u128> =
                        planes
                            .iter()
                            .enumerate()
                            .try_fold(0u128, |m, (b, image)| match image {
                                Image::U64(v) => Some(m + (u128::from(v[f]) << b)),
                                _ => None,
                            });
                    return match moment {
                        Some(_) if t[f] == 0 => f64::NAN,
                        Some(m) => m as f64 / t[f] as f64 - origin,
                        None => f64::NAN,
                    };
                }
                let t = total.get(f).unwrap_or(f64::NAN);
                let m: f64 = planes
                    .iter()
                    .enumerate()
                    .map(|(b, image)| (1u64 << b) as f64 * image.get(f).unwrap_or(f64::NAN))
                    .sum();
                if t == 0.0 || !t.is_finite() || !m.is_finite() {
                    f64::NAN
                } else {
                    m / t - origin
                }
            };
            match total {
                Image::F32(_) => Image::F32((0..n).map(|f| at(f) as f32).collect()),
                _ => Image::F64((0..n).map(at).collect()),
            }
        };
        Ok([com(by_row, center[0]), com(by_col, center[1])])
    }

    fn images_at_once(&self, masks: &[PixelSet]) -> Result<Vec<Image>, ReduceError> {
        let blocks = 0..self.file.blocks().len();
        match self.file.codec() {
            Codec::Integer => self.integer_images(masks),
            Codec::Float => {
                let out = self.accelerator.reduce(
                    self.file,
                    blocks,
                    &self.request(masks.to_vec(), false, false),
                )?;
                out.masks
                    .into_iter()
                    .map(|v| match v {
                        Values::Float(v) => Ok(Image::F32(v)),
                        Values::Exact(_) => Err(mismatch(self.accelerator)),
                    })
                    .collect()
            }
            Codec::Scaled => {
                let out = self.accelerator.reduce(
                    self.file,
                    blocks,
                    &self.request(masks.to_vec(), false, false),
                )?;
                let regions = self.regions()?;
                out.masks
                    .into_iter()
                    .zip(masks)
                    .map(|(v, mask)| {
                        let Values::Exact(sums) = v else {
                            return Err(mismatch(self.accelerator));
                        };
                        let n = mask.len() as u64;
                        Ok(Image::F64(
                            per_frame(regions, sums.len())
                                .zip(sums)
                                .map(|(region, s)| region.sum_value(s, n))
                                .collect(),
                        ))
                    })
                    .collect()
            }
        }
    }

    fn regions(&self) -> Result<&[Region], ReduceError> {
        self.file
            .calibration()
            .map(|c| c.regions.as_slice())
            .ok_or_else(|| ReduceError::Unsupported("scaled file without calibration".into()))
    }

    fn plan(&self, wanted: &[bool]) -> TilePlan {
        let [_, _, rows, columns] = self.file.shape();
        let mut covered = vec![false; wanted.len()];
        let mut take = |tile: Tile| -> Vec<usize> {
            let (gr, gc) = tile.grid(rows, columns);
            let mut taken = Vec::new();
            for i in 0..gr * gc {
                let pixels = tile_pixels(tile, i, rows, columns);
                let (mut any, mut all) = (false, true);
                for p in pixels.clone() {
                    if covered[p] {
                        all = false;
                        break;
                    }
                    if wanted[p] {
                        any = true;
                    } else if self.is_valid(p) {
                        all = false;
                        break;
                    }
                }
                if any && all {
                    pixels.for_each(|p| covered[p] = true);
                    taken.push(i);
                }
            }
            taken
        };
        let tiles32 = take(Tile::Px32);
        let mut tiles8 = take(Tile::Px8);
        // The 8×8 tiles left partly wanted (none straddles a 32×32 tile
        // taken whole): their wanted pixels, or the tile's sum less its
        // other valid pixels, whichever decodes fewer.
        let (mut plus, mut minus) = (Vec::new(), Vec::new());
        let (gr, gc) = Tile::Px8.grid(rows, columns);
        for i in 0..gr * gc {
            let (mut inside, mut outside) = (Vec::new(), Vec::new());
            for p in tile_pixels(Tile::Px8, i, rows, columns) {
                if covered[p] {
                    continue;
                }
                if wanted[p] {
                    inside.push(p as u32);
                } else if self.is_valid(p) {
                    outside.push(p as u32);
                }
            }
            if inside.is_empty() {
                continue;
            }
            if outside.len() < inside.len() {
                tiles8.push(i);
                minus.extend(outside);
            } else {
                plus.extend(inside);
            }
        }
        TilePlan {
            tiles32,
            tiles8,
            plus: PixelSet::new(plus),
            minus: PixelSet::new(minus),
            complement: false,
        }
    }

    fn integer_images(&self, masks: &[PixelSet]) -> Result<Vec<Image>, ReduceError> {
        let p_count = self.file.pixels();
        let plans: Vec<TilePlan> = masks
            .iter()
            .map(|mask| {
                let bits = mask.bitmap(p_count);
                let wanted: Vec<bool> = (0..p_count)
                    .map(|p| bits[p] == 1 && self.is_valid(p))
                    .collect();
                let direct = self.plan(&wanted);
                let others: Vec<bool> = (0..p_count)
                    .map(|p| !wanted[p] && self.is_valid(p))
                    .collect();
                let mut complement = self.plan(&others);
                complement.complement = true;
                if complement.residue() < direct.residue() {
                    complement
                } else {
                    direct
                }
            })
            .collect();
        let n = self.file.frames();
        // Per plan, the sums of its `plus` then its `minus` pixels.
        let residues: Vec<PixelSet> = plans
            .iter()
            .flat_map(|p| [p.plus.clone(), p.minus.clone()])
            .collect();
        let mut decoded: Vec<Vec<u64>> = Vec::with_capacity(residues.len());
        for group in residues.chunks(MASKS_PER_REQUEST) {
            if group.iter().all(PixelSet::is_empty) {
                decoded.extend(group.iter().map(|_| vec![0u64; n]));
                continue;
            }
            let out = self.accelerator.reduce(
                self.file,
                0..self.file.blocks().len(),
                &self.request(group.to_vec(), false, false),
            )?;
            for v in out.masks {
                match v {
                    Values::Exact(v) if v.len() == n => decoded.push(v),
                    _ => return Err(mismatch(self.accelerator)),
                }
            }
        }
        if decoded.len() != residues.len() {
            return Err(mismatch(self.accelerator));
        }
        let [_, _, rows, columns] = self.file.shape();
        let all32: Vec<usize> = {
            let (a, b) = Tile::Px32.grid(rows, columns);
            (0..a * b).collect()
        };
        let any_complement = plans.iter().any(|p| p.complement);
        // Each block's tile sums are gathered apart, so blocks go in
        // parallel: on one thread this was the tail of every image, after
        // the residue's decode.
        let per_block = |block: &crate::qem::BlockInfo| -> Result<Vec<Vec<u64>>, ReduceError> {
            let (b, verify) = (block.index, self.verify_index);
            let mut total = vec![0u64; if any_complement { block.frames } else { 0 }];
            if any_complement {
                self.file
                    .add_tile_sums(Tile::Px32, &all32, b, verify, &mut total)?;
            }
            plans
                .iter()
                .zip(decoded.chunks_exact(2))
                .map(|(plan, residue)| {
                    let frames = block.frame_range();
                    let mut part = residue[0][frames.clone()].to_vec();
                    self.file
                        .add_tile_sums(Tile::Px32, &plan.tiles32, b, verify, &mut part)?;
                    self.file
                        .add_tile_sums(Tile::Px8, &plan.tiles8, b, verify, &mut part)?;
                    for (k, (value, &less)) in part.iter_mut().zip(&residue[1][frames]).enumerate() {
                        *value = value.checked_sub(less).ok_or_else(|| {
                            ReduceError::Unsupported(format!(
                                "frame {}: an 8×8 tile sum of the spatial index is below the sum of some of its pixels",
                                block.first_frame + k
                            ))
                        })?;
                    }
                    if plan.complement {
                        for (k, (value, &all)) in part.iter_mut().zip(&total).enumerate() {
                            *value = all.checked_sub(*value).ok_or_else(|| {
                                ReduceError::Unsupported(format!(
                                    "frame {}: the spatial index total is below the sum of its parts",
                                    block.first_frame + k
                                ))
                            })?;
                        }
                    }
                    Ok(part)
                })
                .collect()
        };
        // The first block's error in file order, whichever thread met it.
        let blocks: Vec<Result<Vec<Vec<u64>>, ReduceError>> =
            self.file.blocks().par_iter().map(per_block).collect();
        let blocks: Vec<Vec<Vec<u64>>> = blocks.into_iter().collect::<Result<_, _>>()?;
        let mut images = vec![Vec::with_capacity(n); masks.len()];
        for block in blocks {
            for (image, part) in images.iter_mut().zip(block) {
                image.extend_from_slice(&part);
            }
        }
        Ok(images.into_iter().map(Image::U64).collect())
    }

    /// The mean pattern (background subtracted) over up to `max_blocks`
    /// blocks spread evenly through the file, and the frames it covers.
    pub fn sample_pattern(&self, max_blocks: usize) -> Result<(Vec<f64>, usize), ReduceError> {
        let count = self.file.blocks().len();
        let take = max_blocks.clamp(1, count.max(1)).min(count);
        let mut chosen: Vec<usize> = (0..take).map(|i| i * count / take).collect();
        chosen.dedup();
        let mut sum = vec![0f64; self.file.pixels()];
        let mut frames = 0;
        // The blocks are reduced at once (one block spread over the threads
        // left them half idle between its parts), then summed in file
        // order, so the pattern does not depend on which finished first.
        let request = self.request(Vec::new(), false, true);
        let reduced: Vec<_> = chosen
            .par_iter()
            .map(|&b| self.accelerator.reduce(self.file, b..b + 1, &request))
            .collect();
        for (b, out) in chosen.into_iter().zip(reduced) {
            let block = &self.file.blocks()[b];
            frames += block.frames;
            let pattern = out?.pattern.ok_or_else(|| mismatch(self.accelerator))?;
            let region = match self.file.codec() {
                Codec::Scaled => Some(region_of(self.regions()?, block.first_frame)?),
                _ => None,
            };
            match pattern.sum {
                Values::Exact(v) if v.len() == sum.len() => {
                    for (s, v) in sum.iter_mut().zip(v) {
                        *s += match region {
                            Some(r) => r.scale * v as f64 + r.offset * block.frames as f64,
                            None => v as f64,
                        };
                    }
                }
                Values::Float(v) if v.len() == sum.len() => {
                    sum.iter_mut().zip(v).for_each(|(s, v)| *s += f64::from(v));
                }
                _ => return Err(mismatch(self.accelerator)),
            }
        }
        if frames > 0 {
            sum.iter_mut().for_each(|s| *s /= frames as f64);
        }
        Ok((sum, frames))
    }

    /// Total, row and column moments, pattern sum and maximum of a
    /// full-pass result, all of the kind `pick` accepts.
    fn full_parts<T>(
        &self,
        out: super::Partial,
        pick: fn(Values) -> Option<Vec<T>>,
    ) -> Result<[Vec<T>; 5], ReduceError> {
        let (Some(m), Some(p)) = (out.moments, out.pattern) else {
            return Err(mismatch(self.accelerator));
        };
        let parts = [m.total, m.row, m.column, p.sum, p.max].map(pick);
        match parts {
            [Some(a), Some(b), Some(c), Some(d), Some(e)] => Ok([a, b, c, d, e]),
            _ => Err(mismatch(self.accelerator)),
        }
    }

    /// Centre of mass, mean and maximum pattern: one pass over every block
    /// (per calibration region for scaled codes).
    pub fn full(&self) -> Result<Full, ReduceError> {
        let file = self.file;
        let n = file.frames();
        let p_count = file.pixels();
        let [_, _, _, columns] = file.shape();
        let all = 0..file.blocks().len();
        let request = self.request(Vec::new(), true, true);
        match file.codec() {
            Codec::Integer => {
                let out = self.accelerator.reduce(file, all, &request)?;
                let [total, row, column, sum, max] = self.full_parts(out, Values::exact)?;
                check_lengths(self.accelerator, &[(&total, n), (&sum, p_count)])?;
                let com = |m: &[u64]| -> Image {
                    Image::F64(
                        m.iter()
                            .zip(&total)
                            .map(|(&m, &t)| {
                                if t == 0 {
                                    f64::NAN
                                } else {
                                    m as f64 / t as f64
                                }
                            })
                            .collect(),
                    )
                };
                let max_dp = match file.decoded_dtype() {
                    Dtype::U8 => MaxPattern::U8(max.iter().map(|&v| v.min(255) as u8).collect()),
                    _ => MaxPattern::U16(max.iter().map(|&v| v.min(65535) as u16).collect()),
                };
                Ok(Full {
                    com: [com(&row), com(&column)],
                    mean_dp: Image::F64(sum.iter().map(|&s| s as f64 / n as f64).collect()),
                    max_dp,
                })
            }
            Codec::Float => {
                let out = self.accelerator.reduce(file, all, &request)?;
                let [total, row, column, sum, max] = self.full_parts(out, Values::float)?;
                check_lengths(self.accelerator, &[(&total, n), (&sum, p_count)])?;
                let com = |m: &[f32]| -> Image {
                    Image::F32(
                        m.iter()
                            .zip(&total)
                            .map(|(&m, &t)| {
                                if t == 0.0 || !t.is_finite() || !m.is_finite() {
                                    f32::NAN
                                } else {
                                    m / t
                                }
                            })
                            .collect(),
                    )
                };
                Ok(Full {
                    com: [com(&row), com(&column)],
                    mean_dp: Image::F32(
                        sum.iter()
                            .map(|&s| (f64::from(s) / n as f64) as f32)
                            .collect(),
                    ),
                    max_dp: MaxPattern::F32(max),
                })
            }
            Codec::Scaled => self.scaled_full(columns),
        }
    }

    /// Scaled codes: exact code moments and sums per calibration region,
    /// calibrated once (`value = scale · code + offset` summed over pixels
    /// or frames is `scale · Σcode + offset · count`).
    fn scaled_full(&self, columns: usize) -> Result<Full, ReduceError> {
        let file = self.file;
        let n = file.frames();
        let p_count = file.pixels();
        let sum_rows: f64 = (0..p_count).map(|p| (p / columns) as f64).sum();
        let sum_columns: f64 = (0..p_count).map(|p| (p % columns) as f64).sum();
        let mut com = [Vec::with_capacity(n), Vec::with_capacity(n)];
        let mut mean = vec![0f64; p_count];
        let mut max = vec![f32::NEG_INFINITY; p_count];
        for region in self.regions()? {
            let blocks = blocks_of(file, region.first_frame..region.stop_frame);
            if blocks.is_empty() {
                continue;
            }
            let out =
                self.accelerator
                    .reduce(file, blocks, &self.request(Vec::new(), true, true))?;
            let [total, row, column, sum, top] = self.full_parts(out, Values::exact)?;
            let m = region.stop_frame - region.first_frame;
            check_lengths(self.accelerator, &[(&total, m), (&sum, p_count)])?;
            let (s, o) = (region.scale, region.offset);
            for k in 0..m {
                let t = s * total[k] as f64 + o * p_count as f64;
                let c = |moment: u64, index_sum: f64| {
                    if t == 0.0 || !t.is_finite() {
                        f64::NAN
                    } else {
                        (s * moment as f64 + o * index_sum) / t
                    }
                };
                com[0].push(c(row[k], sum_rows));
                com[1].push(c(column[k], sum_columns));
            }
            for q in 0..p_count {
                mean[q] += s * sum[q] as f64 + o * m as f64;
                max[q] = max[q].max(region.value(top[q].min(65535) as u16));
            }
        }
        let [row, column] = com;
        Ok(Full {
            com: [Image::F64(row), Image::F64(column)],
            mean_dp: Image::F64(mean.iter().map(|&v| v / n as f64).collect()),
            max_dp: MaxPattern::F32(max),
        })
    }
}

/// Subtracts the mean of the finite values (in binary64; float32 images
/// are rounded back once): the DPC convention for centre-of-mass images.
/// NaN stays NaN.
pub fn mean_subtracted(image: &Image) -> Image {
    let values = image.to_f64();
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return image.clone();
    }
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    let centred = values.iter().map(|&v| v - mean);
    match image {
        Image::F32(_) => Image::F32(centred.map(|v| v as f32).collect()),
        _ => Image::F64(centred.collect()),
    }
}

fn mismatch(accelerator: &dyn Accelerator) -> ReduceError {
    ReduceError::Backend {
        backend: "reduce",
        reason: format!(
            "the {} backend returned results of the wrong kind or length",
            accelerator.name()
        ),
    }
}

fn check_lengths<T>(
    accelerator: &dyn Accelerator,
    pairs: &[(&Vec<T>, usize)],
) -> Result<(), ReduceError> {
    if pairs.iter().all(|(v, n)| v.len() == *n) {
        Ok(())
    } else {
        Err(mismatch(accelerator))
    }
}

/// The regions of consecutive frames, one per frame.
fn per_frame(regions: &[Region], frames: usize) -> impl Iterator<Item = &Region> {
    regions
        .iter()
        .flat_map(|r| std::iter::repeat_n(r, r.stop_frame - r.first_frame))
        .take(frames)
}

fn region_of(regions: &[Region], frame: usize) -> Result<&Region, ReduceError> {
    regions
        .iter()
        .find(|r| r.first_frame <= frame && frame < r.stop_frame)
        .ok_or_else(|| ReduceError::Unsupported(format!("frame {frame} is in no region")))
}

/// The blocks whose frames lie in `frames` (regions hold whole chunks).
fn blocks_of(file: &QemFile, frames: Range<usize>) -> Range<usize> {
    let blocks = file.blocks();
    let first = blocks.partition_point(|b| b.first_frame < frames.start);
    let end = blocks.partition_point(|b| b.first_frame < frames.end);
    first..end
}

/// The float codec's saved mean-dark plane (`empad.background`), if any.
fn background_plane(file: &QemFile) -> Result<Option<Vec<f32>>, ReduceError> {
    if file.codec() != Codec::Float {
        return Ok(None);
    }
    let Some(recipe) = file
        .header()
        .empad
        .as_ref()
        .and_then(|e| e.get("background"))
    else {
        return Ok(None);
    };
    let bad = |why: &str| ReduceError::Unsupported(format!("empad.background: {why}"));
    let text = recipe
        .get("values_float32_le")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("values_float32_le is missing or not a string"))?;
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| bad(&format!("values_float32_le is not base64: {e}")))?;
    if bytes.len() != 4 * file.pixels() {
        return Err(bad(&format!(
            "the plane has {} bytes, the detector needs {}",
            bytes.len(),
            4 * file.pixels()
        )));
    }
    Ok(Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec,
    };
    use crate::reduce::geometry::{mask, Shape};
    use crate::reduce::Cpu;

    #[test]
    fn counts_use_whole_tiles_and_complements() {
        let shape = [1u64, 2, 64, 64];
        let spec = WriteSpec::counts(
            shape,
            CountDtype::U8,
            scientific_metadata(shape, &Calibration::default()).unwrap(),
        );
        let file = QemFile::from_bytes(encode_to_vec(spec, &[1u8; 2 * 4096]).unwrap()).unwrap();
        let reducer = Reducer::new(&file, &Cpu).unwrap();
        let wanted = |set: &PixelSet| {
            let bits = set.bitmap(4096);
            bits.iter().map(|&b| b == 1).collect::<Vec<bool>>()
        };
        let disk = mask([64, 64], [31.5, 31.5], Shape::Disk { radius: 30.0 });
        let plan = reducer.plan(&wanted(&disk));
        assert!(plan.tiles32.is_empty() && plan.tiles8.len() > 20);
        // Each 8×8 tile the disk's edge crosses decodes its pixels inside
        // or those outside, whichever are fewer: at most half of it.
        let inside = wanted(&disk);
        let crossed = (0..64)
            .filter(|&t| {
                let n = tile_pixels(Tile::Px8, t, 64, 64)
                    .filter(|&p| inside[p])
                    .count();
                n > 0 && n < 64
            })
            .count();
        assert!(!plan.plus.is_empty() && !plan.minus.is_empty());
        assert!(
            plan.residue() <= 32 * crossed,
            "{} {crossed}",
            plan.residue()
        );
        let everything = PixelSet::new((0..4096).collect());
        let plan = reducer.plan(&wanted(&everything));
        assert_eq!((plan.tiles32.len(), plan.residue()), (4, 0));
        let ring = mask(
            [64, 64],
            [31.5, 31.5],
            Shape::Annulus {
                inner: 3.0,
                outer: 99.0,
            },
        );
        let images = reducer.images(&[ring.clone(), disk.clone()]).unwrap();
        assert_eq!(images[0], Image::U64(vec![ring.len() as u64; 2]));
        assert_eq!(images[1], Image::U64(vec![disk.len() as u64; 2]));
    }
}
