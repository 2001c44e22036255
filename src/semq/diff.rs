//! Diff of two states (spec 9).

use std::cmp::Ordering;
use std::ops::Range;

use rayon::prelude::*;

use super::config::Config;
use super::encoding::Encoding;
use super::error::{Result, SemqError};
use super::identity::Digest32;
use super::ids::{Id, IdKind, IdRef};
use super::rows;

/// One manifest key whose value differs (None = absent on that side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestChange {
    pub key: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The report of `reference.diff(candidate)`. Lists are in id order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    pub config: Config,
    pub id_kind: IdKind,
    /// The reference's state id.
    pub reference_id: Digest32,
    /// The candidate's state id.
    pub candidate_id: Digest32,
    pub reference_content_digest: Digest32,
    pub candidate_content_digest: Digest32,
    /// Ids only in the candidate.
    pub added: Vec<Id>,
    /// Ids only in the reference.
    pub removed: Vec<Id>,
    /// Ids in both whose rows differ, with the number of differing symbols.
    pub changed: Vec<(Id, u64)>,
    pub n_unchanged: u64,
    /// Keys in bytewise order.
    pub manifest_changes: Vec<ManifestChange>,
}

impl Diff {
    /// Rows present on both sides.
    pub fn n_common(&self) -> u64 {
        self.n_unchanged + self.changed.len() as u64
    }

    /// True when nothing differs: no row and no manifest change.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.manifest_changes.is_empty()
    }

    /// True when the manifest change list names `encoder` or
    /// `encoder_revision`.
    pub fn changes_encoder(&self) -> bool {
        self.manifest_changes
            .iter()
            .any(|c| c.key == "encoder" || c.key == "encoder_revision")
    }
}

fn check_compatible(a: &Encoding, b: &Encoding) -> Result<()> {
    if a.config() != b.config() {
        return Err(SemqError::incompatible(
            "encodings have different configs",
            None,
        ));
    }
    if a.id_kind() != b.id_kind() {
        return Err(SemqError::incompatible(
            "encodings have different id kinds",
            None,
        ));
    }
    Ok(())
}

/// Merges the two manifests by key; equal values are omitted.
fn manifest_changes(reference: &Encoding, candidate: &Encoding) -> Vec<ManifestChange> {
    let (a, b) = (reference.manifest().pairs(), candidate.manifest().pairs());
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    loop {
        let order = match (a.get(i), b.get(j)) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.as_bytes().cmp(kb.as_bytes()),
        };
        match order {
            Ordering::Less => {
                if let Some((k, v)) = a.get(i) {
                    out.push(ManifestChange {
                        key: k.clone(),
                        before: Some(v.clone()),
                        after: None,
                    });
                }
                i += 1;
            }
            Ordering::Greater => {
                if let Some((k, v)) = b.get(j) {
                    out.push(ManifestChange {
                        key: k.clone(),
                        before: None,
                        after: Some(v.clone()),
                    });
                }
                j += 1;
            }
            Ordering::Equal => {
                if let (Some((k, va)), Some((_, vb))) = (a.get(i), b.get(j)) {
                    if va != vb {
                        out.push(ManifestChange {
                            key: k.clone(),
                            before: Some(va.clone()),
                            after: Some(vb.clone()),
                        });
                    }
                }
                i += 1;
                j += 1;
            }
        }
    }
    out
}

/// Compares id `i` of `a` with id `j` of `b` (same kind) without building
/// owned ids.
fn cmp_ids(a: &Encoding, i: usize, b: &Encoding, j: usize) -> Ordering {
    match a.id_kind() {
        IdKind::U64 => a.u64_id(i).cmp(&b.u64_id(j)),
        IdKind::Utf8 => a.utf8_id_bytes(i).cmp(&b.utf8_id_bytes(j)),
    }
}

/// Reference rows per parallel merge range.
const MERGE_RANGE_ROWS: usize = 1 << 16;

#[derive(Default)]
struct MergePart {
    added: Vec<Id>,
    removed: Vec<Id>,
    changed: Vec<(Id, u64)>,
    n_unchanged: u64,
}

/// The first candidate index whose id is not below reference id `i`.
fn lower_bound(candidate: &Encoding, reference: &Encoding, i: usize) -> usize {
    let (mut lo, mut hi) = (0usize, candidate.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if cmp_ids(candidate, mid, reference, i) == Ordering::Less {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The sequential merge of reference rows `a` with candidate rows `b`.
fn merge_range(
    reference: &Encoding,
    candidate: &Encoding,
    config: &Config,
    a: Range<usize>,
    b: Range<usize>,
) -> MergePart {
    let mut p = MergePart::default();
    let (mut i, mut j) = (a.start, b.start);
    while i < a.end || j < b.end {
        let order = if i == a.end {
            Ordering::Greater
        } else if j == b.end {
            Ordering::Less
        } else {
            cmp_ids(reference, i, candidate, j)
        };
        match order {
            Ordering::Less => {
                p.removed.push(owned_id(reference, i));
                i += 1;
            }
            Ordering::Greater => {
                p.added.push(owned_id(candidate, j));
                j += 1;
            }
            Ordering::Equal => {
                let (ra, rb) = (
                    reference.row(i).unwrap_or(&[]),
                    candidate.row(j).unwrap_or(&[]),
                );
                if ra == rb {
                    p.n_unchanged += 1;
                } else {
                    p.changed
                        .push((owned_id(reference, i), rows::hamming(config, ra, rb)));
                }
                i += 1;
                j += 1;
            }
        }
    }
    p
}

fn owned_id(e: &Encoding, i: usize) -> Id {
    e.id(i).map(|r| r.to_owned()).unwrap_or(Id::U64(0))
}

impl Encoding {
    /// `self.diff(candidate)`: requires equal configs, then equal id kinds
    /// (Incompatible otherwise). Equal content digests skip the row scan.
    pub fn diff(&self, candidate: &Encoding) -> Result<Diff> {
        self.diff_in_ranges(candidate, MERGE_RANGE_ROWS)
    }

    fn diff_in_ranges(&self, candidate: &Encoding, range_rows: usize) -> Result<Diff> {
        let range_rows = range_rows.max(1);
        check_compatible(self, candidate)?;
        let config = self.config();
        let mut d = Diff {
            config,
            id_kind: self.id_kind(),
            reference_id: *self.state_id(),
            candidate_id: *candidate.state_id(),
            reference_content_digest: *self.content_digest(),
            candidate_content_digest: *candidate.content_digest(),
            added: Vec::new(),
            removed: Vec::new(),
            changed: Vec::new(),
            n_unchanged: 0,
            manifest_changes: manifest_changes(self, candidate),
        };
        if self.content_digest() == candidate.content_digest() {
            d.n_unchanged = self.len() as u64;
            return Ok(d);
        }
        // The merge is split into ranges of reference rows; each range
        // takes the candidate rows from the lower bound of its first id to
        // the lower bound of the next range's first id, so the ranges
        // partition both sides and their results concatenate in id order.
        let (na, nb) = (self.len(), candidate.len());
        let ranges = na.div_ceil(range_rows).max(1);
        let bound = |k: usize| -> (usize, usize) {
            if k == 0 {
                (0, 0)
            } else if k >= ranges {
                (na, nb)
            } else {
                let i = k * range_rows;
                (i, lower_bound(candidate, self, i))
            }
        };
        let parts: Vec<MergePart> = (0..ranges)
            .into_par_iter()
            .map(|k| {
                let (i0, j0) = bound(k);
                let (i1, j1) = bound(k + 1);
                merge_range(self, candidate, &config, i0..i1, j0..j1)
            })
            .collect();
        for p in parts {
            d.added.extend(p.added);
            d.removed.extend(p.removed);
            d.changed.extend(p.changed);
            d.n_unchanged += p.n_unchanged;
        }
        Ok(d)
    }

    /// For an id present on both sides: every differing unit as
    /// (unit index, reference symbol, candidate symbol), in unit order.
    pub fn units(&self, candidate: &Encoding, id: IdRef<'_>) -> Result<Vec<(usize, u8, u8)>> {
        check_compatible(self, candidate)?;
        let absent = || SemqError::invalid("id is absent from one side of the diff");
        let a = self
            .find(id)
            .and_then(|i| self.symbols(i))
            .ok_or_else(absent)?;
        let b = candidate
            .find(id)
            .and_then(|j| candidate.symbols(j))
            .ok_or_else(absent)?;
        Ok(a.iter()
            .zip(&b)
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .map(|(u, (x, y))| (u, *x, *y))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::semq::{from_symbols, Config, IdList};

    #[test]
    fn ranged_merge_equals_one_merge() {
        let config = Config::quant(8, 4).unwrap();
        let a_ids: Vec<u64> = (0..1000u64).map(|i| i * 3).collect();
        let b_ids: Vec<u64> = (0..1000u64)
            .map(|i| i * 3 + u64::from(i % 7 == 0))
            .collect();
        let a_sym: Vec<u8> = (0..8000u32).map(|i| (i % 8) as u8).collect();
        let b_sym: Vec<u8> = (0..8000u32)
            .map(|i| ((i % 8) as u8 + u8::from(i % 37 == 0)) % 8)
            .collect();
        let none: &[(&str, &str)] = &[];
        let a = from_symbols(config, &IdList::U64(a_ids), &a_sym, none).unwrap();
        let b = from_symbols(config, &IdList::U64(b_ids), &b_sym, none).unwrap();
        let whole = a.diff_in_ranges(&b, usize::MAX).unwrap();
        assert!(!whole.added.is_empty() && !whole.removed.is_empty() && !whole.changed.is_empty());
        for range in [1, 2, 7, 64, 999, 1000, 1001] {
            assert_eq!(a.diff_in_ranges(&b, range).unwrap(), whole, "range {range}");
            let back = b.diff_in_ranges(&a, range).unwrap();
            assert_eq!(back.added, whole.removed);
            assert_eq!(back.removed, whole.added);
        }
    }
}
