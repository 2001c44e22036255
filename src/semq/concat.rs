//! concat (spec 8): the union of disjoint parts of one state.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::encoding::{fill_u64_ids, fill_utf8_ids, Encoding, ImageBuilder};
use super::error::{Result, SemqError};
use super::ids::IdKind;

/// The head of one part in the k-way merge; ties go to the lower part
/// index, so a duplicate is reported on the later part.
struct Head<'a> {
    part: usize,
    row: usize,
    enc: &'a Encoding,
}

impl Head<'_> {
    fn cmp_id(&self, other: &Head<'_>) -> Ordering {
        match self.enc.id_kind() {
            IdKind::U64 => self.enc.u64_id(self.row).cmp(&other.enc.u64_id(other.row)),
            IdKind::Utf8 => self
                .enc
                .utf8_id_bytes(self.row)
                .cmp(&other.enc.utf8_id_bytes(other.row)),
        }
    }
}

impl PartialEq for Head<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head<'_> {}

impl Ord for Head<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.cmp_id(other).then(self.part.cmp(&other.part))
    }
}

impl PartialOrd for Head<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Merges `parts` (k ≥ 1) into one state. Every part must share the first
/// part's config, then id kind (Incompatible, `field` = part index) and
/// manifest section (InvalidInput, `field` = part index); an id in two
/// parts is InvalidInput with `field` = the part and `row` = the row index
/// within it of the later occurrence. Commutative and associative; the
/// empty state of the same config, kind and manifest is neutral.
pub fn concat(parts: &[Encoding]) -> Result<Encoding> {
    let Some(first) = parts.first() else {
        return Err(SemqError::invalid("concat needs at least one part"));
    };
    // Every part's config and kind first (Incompatible), then manifests
    // (InvalidInput): the spec names the first offending part for the
    // former and lists the manifest rule after it.
    for (k, p) in parts.iter().enumerate().skip(1) {
        if p.config() != first.config() {
            return Err(SemqError::incompatible(
                "parts have different configs",
                Some(k as u64),
            ));
        }
        if p.id_kind() != first.id_kind() {
            return Err(SemqError::incompatible(
                "parts have different id kinds",
                Some(k as u64),
            ));
        }
    }
    if let Some(k) = parts
        .iter()
        .position(|p| p.manifest_section() != first.manifest_section())
    {
        return Err(SemqError::invalid_at(
            "parts have different manifests",
            None,
            Some(k as u64),
        ));
    }

    let total: usize = parts.iter().map(Encoding::len).sum();
    let mut heap: BinaryHeap<Reverse<Head<'_>>> = parts
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.is_empty())
        .map(|(part, enc)| Reverse(Head { part, row: 0, enc }))
        .collect();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(total);
    let mut last: Option<(usize, usize)> = None;
    while let Some(Reverse(head)) = heap.pop() {
        if let Some((lp, lr)) = last {
            let prev = Head {
                part: lp,
                row: lr,
                enc: &parts[lp],
            };
            if prev.cmp_id(&head) == Ordering::Equal {
                return Err(SemqError::invalid_at(
                    "parts share an id",
                    Some(head.row as u64),
                    Some(head.part as u64),
                ));
            }
        }
        merged.push((head.part, head.row));
        last = Some((head.part, head.row));
        if head.row + 1 < head.enc.len() {
            heap.push(Reverse(Head {
                part: head.part,
                row: head.row + 1,
                enc: head.enc,
            }));
        }
    }

    let config = first.config();
    let kind = first.id_kind();
    let id_bytes: usize = match kind {
        IdKind::U64 => 0,
        IdKind::Utf8 => merged
            .iter()
            .map(|&(p, r)| parts[p].utf8_id_bytes(r).map_or(0, <[u8]>::len))
            .sum(),
    };
    let mut builder = ImageBuilder::new(
        config,
        kind,
        merged.len(),
        id_bytes,
        first.manifest().clone(),
    )?;
    match kind {
        IdKind::U64 => fill_u64_ids(
            builder.ids_mut(),
            merged.iter().map(|&(p, r)| parts[p].u64_id(r).unwrap_or(0)),
        ),
        IdKind::Utf8 => fill_utf8_ids(
            builder.ids_mut(),
            merged.len(),
            merged
                .iter()
                .map(|&(p, r)| parts[p].utf8_id_bytes(r).unwrap_or(&[])),
        ),
    }
    let bpv = config.bytes_per_vector();
    if bpv > 0 {
        for (dst, &(p, r)) in builder.rows_mut().chunks_exact_mut(bpv).zip(&merged) {
            if let Some(src) = parts[p].row(r) {
                dst.copy_from_slice(src);
            }
        }
    }
    Ok(builder.finish())
}
