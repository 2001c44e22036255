//! The spatial index checked by decodes of some of a block's pixels.
//!
//! A whole-block decode checks the block's index and remembers the verdict
//! (see `QemFile::block_index`). A decode of a pixel subset (a virtual
//! detector's pixels, every valid pixel for the moments and patterns,
//! [`QemFile::decode_pixels`]) checks what it can: every field (8×8 or
//! 32×32 tile) whose valid pixels were all decoded. A disagreement is
//! remembered as the block's verdict, so that no index product is served
//! from that block afterwards; agreement of every field (all valid pixels
//! decoded) is remembered as agreement. Fewer fields agreeing prove
//! nothing about the others, and leave the verdict unknown.

use std::sync::atomic::{AtomicU32, Ordering};

use super::file::QemFile;
use super::header::Codec;
use super::layout::BlockInfo;
use super::spatial;

/// Sums held by one check at most (4 bytes each): a block whose covered
/// fields need more is left unchecked rather than costing more memory
/// than its decode.
const MAX_SUMS: usize = 16 << 20;

/// Marks a field no check covers.
const UNCOVERED: u32 = u32::MAX;

/// The index fields a set of pixels covers (the same for every block).
pub struct IndexCoverage {
    /// Per field of a frame: its slot among the covered fields.
    slot: Vec<u32>,
    /// The covered fields, by slot.
    covered: Vec<usize>,
}

/// The per-field sums of one block's decoded pixels, added to by the tasks
/// that decode them (concurrently) and compared with the index at the end
/// ([`IndexCheck::finish`]).
pub struct IndexCheck<'a> {
    coverage: &'a IndexCoverage,
    info: BlockInfo,
    /// `sums[slot * m + k]`: frame `k` of the covered field in `slot`.
    sums: Vec<AtomicU32>,
}

impl QemFile {
    /// The index fields that decoding `pixels` covers: those whose valid
    /// pixels are all among them (integer codec; `None` when none is, or
    /// a pixel is out of range).
    pub fn index_coverage(&self, pixels: &[usize]) -> Option<IndexCoverage> {
        if self.codec() != Codec::Integer {
            return None;
        }
        let fields = self.spatial_fields();
        let (pixel_fields, valid) = self.index_inputs();
        let mut wanted = vec![false; self.pixels()];
        for &p in pixels {
            *wanted.get_mut(p)? = true;
        }
        // Valid pixels of each field that this decode leaves out.
        let mut left_out = vec![0u32; fields];
        for (p, &(f8, f32_)) in pixel_fields.iter().enumerate() {
            if valid.is_valid(p) && !wanted[p] {
                for f in [f8, f32_] {
                    *left_out.get_mut(f as usize)? += 1;
                }
            }
        }
        let covered: Vec<usize> = (0..fields).filter(|&t| left_out[t] == 0).collect();
        if covered.is_empty() {
            return None;
        }
        let mut slot = vec![UNCOVERED; fields];
        for (s, &t) in covered.iter().enumerate() {
            slot[t] = s as u32;
        }
        Some(IndexCoverage { slot, covered })
    }
}

impl IndexCoverage {
    /// A check of block `block`'s covered fields, unless its verdict is
    /// already known. Pass every decoded pixel of the set, once, with its
    /// values to [`IndexCheck::add`], then call [`IndexCheck::finish`]
    /// once all decoded cleanly.
    pub fn check(&self, file: &QemFile, block: usize) -> Option<IndexCheck<'_>> {
        if file.block_index_verdict(block).is_some() {
            return None;
        }
        let info = *file.blocks().get(block)?;
        let n = self.covered.len().checked_mul(info.frames)?;
        if n > MAX_SUMS {
            return None;
        }
        Some(IndexCheck {
            coverage: self,
            info,
            sums: (0..n).map(|_| AtomicU32::new(0)).collect(),
        })
    }
}

impl IndexCheck<'_> {
    /// Adds decoded pixels (each pixel once over all calls): `values` holds
    /// `m` counts per entry of `pixels`, pixel-major (as
    /// [`QemFile::decode_block_pixels`] returns them). Invalid pixels are
    /// skipped.
    pub fn add(&self, file: &QemFile, pixels: &[usize], values: &[u16]) {
        let m = self.info.frames;
        if m == 0 {
            return;
        }
        let (pixel_fields, valid) = file.index_inputs();
        let slot = &self.coverage.slot;
        // This group's sums per covered slot, added to the shared ones
        // once: a group of pixels touches few fields.
        let mut local: Vec<(u32, Vec<u32>)> = Vec::new();
        for (&p, col) in pixels.iter().zip(values.chunks_exact(m)) {
            let Some(&(f8, f32_)) = pixel_fields.get(p) else {
                continue;
            };
            if !valid.is_valid(p) {
                continue;
            }
            for f in [f8, f32_] {
                let s = slot.get(f as usize).copied().unwrap_or(UNCOVERED);
                if s == UNCOVERED {
                    continue;
                }
                let at = match local.iter().position(|(t, _)| *t == s) {
                    Some(at) => at,
                    None => {
                        local.push((s, vec![0u32; m]));
                        local.len() - 1
                    }
                };
                // At most 1024 u16 counts per field and frame: no overflow.
                for (acc, &v) in local[at].1.iter_mut().zip(col) {
                    *acc += u32::from(v);
                }
            }
        }
        for (s, sums) in local {
            let shared = &self.sums[s as usize * m..(s as usize + 1) * m];
            for (acc, v) in shared.iter().zip(sums) {
                acc.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// Compares the covered fields with the stored index and remembers a
    /// disagreement (or, when every field was covered, the agreement) as
    /// the block's verdict. Call it only when every pixel of the set was
    /// decoded and added.
    pub fn finish(self, file: &QemFile) {
        let info = self.info;
        let m = info.frames;
        let arrays = match file.spatial_arrays(info.chunk) {
            Ok(arrays) => arrays,
            Err(e) => return file.remember_index(&info, Err(e)),
        };
        let covered = &self.coverage.covered;
        let slot = &self.coverage.slot;
        let first = spatial::first_disagreement(
            covered.iter().copied(),
            m,
            |t, out| file.block_field(arrays, &info, t, out),
            |t, k| u64::from(self.sums[slot[t] as usize * m + k].load(Ordering::Relaxed)),
        );
        if let Some(d) = first {
            return file.remember_index(&info, Err(info.index_disagreement(d)));
        }
        if covered.len() == file.spatial_fields() {
            file.remember_index(&info, Ok(()));
        }
    }
}
