//! Diff of two states (spec 9).

use std::cmp::Ordering;

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

fn owned_id(e: &Encoding, i: usize) -> Id {
    e.id(i).map(|r| r.to_owned()).unwrap_or(Id::U64(0))
}

impl Encoding {
    /// `self.diff(candidate)`: requires equal configs, then equal id kinds
    /// (Incompatible otherwise). Equal content digests skip the row scan.
    pub fn diff(&self, candidate: &Encoding) -> Result<Diff> {
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
        let (na, nb) = (self.len(), candidate.len());
        let (mut i, mut j) = (0usize, 0usize);
        while i < na || j < nb {
            let order = if i == na {
                Ordering::Greater
            } else if j == nb {
                Ordering::Less
            } else {
                cmp_ids(self, i, candidate, j)
            };
            match order {
                Ordering::Less => {
                    d.removed.push(owned_id(self, i));
                    i += 1;
                }
                Ordering::Greater => {
                    d.added.push(owned_id(candidate, j));
                    j += 1;
                }
                Ordering::Equal => {
                    let (ra, rb) = (self.row(i).unwrap_or(&[]), candidate.row(j).unwrap_or(&[]));
                    if ra == rb {
                        d.n_unchanged += 1;
                    } else {
                        d.changed
                            .push((owned_id(self, i), rows::hamming(&config, ra, rb)));
                    }
                    i += 1;
                    j += 1;
                }
            }
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
