//! Floors: the envelope of variation seen in null rebuilds, and the gate
//! verdicts measured against it (spec 10).

mod json;

use std::collections::HashSet;

use super::config::Config;
use super::diff::Diff;
use super::error::{Result, SemqError};
use super::identity::Digest32;
use super::ids::{Id, IdKind};

/// A floor. Every value of this type satisfies the construction rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    config: Config,
    id_kind: IdKind,
    reference_id: Digest32,
    nulls: u64,
    changed_rows: u64,
    total_rows: u64,
    hamming: u64,
    max_hamming: Option<u64>,
    distinct_nulls: Option<u64>,
}

/// The fields of a floor before the construction rules are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloorFields {
    pub config: Config,
    pub id_kind: IdKind,
    pub reference_id: Digest32,
    pub nulls: u64,
    pub changed_rows: u64,
    pub total_rows: u64,
    pub hamming: u64,
    pub max_hamming: Option<u64>,
    pub distinct_nulls: Option<u64>,
}

impl Floor {
    /// Applies the construction rules in the order of spec 10
    /// (InvalidInput on the first violation).
    pub fn new(f: FloorFields) -> Result<Floor> {
        let units = f.config.units_per_row() as u64;
        let bad = |m: &str| Err(SemqError::invalid(m));
        if f.nulls < 1 {
            return bad("floor.nulls must be > 0");
        }
        if f.total_rows < 1 {
            return bad("floor.total_rows must be > 0");
        }
        if f.changed_rows > f.total_rows {
            return bad("floor.changed_rows exceeds total_rows");
        }
        if f.hamming > units {
            return bad("floor.hamming exceeds units_per_row");
        }
        if let Some(m) = f.max_hamming {
            if m < f.hamming {
                return bad("floor.max_hamming is below floor.hamming");
            }
            if m > units {
                return bad("floor.max_hamming exceeds units_per_row");
            }
        }
        if let Some(d) = f.distinct_nulls {
            if d < 1 {
                return bad("floor.distinct_nulls must be at least 1");
            }
            if d > f.nulls {
                return bad("floor.distinct_nulls exceeds floor.nulls");
            }
        }
        Ok(Floor {
            config: f.config,
            id_kind: f.id_kind,
            reference_id: f.reference_id,
            nulls: f.nulls,
            changed_rows: f.changed_rows,
            total_rows: f.total_rows,
            hamming: f.hamming,
            max_hamming: f.max_hamming,
            distinct_nulls: f.distinct_nulls,
        })
    }

    pub fn config(&self) -> Config {
        self.config
    }
    pub fn id_kind(&self) -> IdKind {
        self.id_kind
    }
    pub fn reference_id(&self) -> &Digest32 {
        &self.reference_id
    }
    pub fn nulls(&self) -> u64 {
        self.nulls
    }
    pub fn changed_rows(&self) -> u64 {
        self.changed_rows
    }
    pub fn total_rows(&self) -> u64 {
        self.total_rows
    }
    pub fn hamming(&self) -> u64 {
        self.hamming
    }
    pub fn max_hamming(&self) -> Option<u64> {
        self.max_hamming
    }
    pub fn distinct_nulls(&self) -> Option<u64> {
        self.distinct_nulls
    }

    /// The canonical floor JSON (one line, no trailing newline).
    pub fn to_json(&self) -> String {
        json::write(self)
    }

    /// The strict reader of spec 10.1; every violation is InvalidInput.
    pub fn from_json(text: &[u8]) -> Result<Floor> {
        json::read(text)
    }
}

/// The 99th percentile by nearest rank: the k-th smallest with
/// k = m − ⌊m/100⌋ (0 for no values).
pub(crate) fn p99(values: &[u64]) -> u64 {
    let m = values.len();
    if m == 0 {
        return 0;
    }
    let k = m - m / 100;
    let mut v = values.to_vec();
    let (_, kth, _) = v.select_nth_unstable(k - 1);
    *kth
}

fn hammings(d: &Diff) -> Vec<u64> {
    d.changed.iter().map(|(_, h)| *h).collect()
}

/// Measures a floor from null diffs (reference.diff(null_i)); `per_row`
/// also records max_hamming and distinct_nulls.
pub fn measure(nulls: &[Diff], per_row: bool) -> Result<Floor> {
    let Some(first) = nulls.first() else {
        return Err(SemqError::invalid("a floor needs at least one null diff"));
    };
    for (i, d) in nulls.iter().enumerate() {
        let field = Some(i as u64);
        if d.config != first.config {
            return Err(SemqError::incompatible(
                "null diffs have different configs",
                field,
            ));
        }
        if d.id_kind != first.id_kind {
            return Err(SemqError::incompatible(
                "null diffs have different id kinds",
                field,
            ));
        }
        if d.reference_id != first.reference_id {
            return Err(SemqError::incompatible(
                "null diffs have different references",
                field,
            ));
        }
        if d.n_common() == 0 {
            return Err(SemqError::invalid_at(
                "null diff has no common rows",
                None,
                field,
            ));
        }
        if !d.added.is_empty() || !d.removed.is_empty() {
            return Err(SemqError::invalid_at(
                "null diff adds or removes rows",
                None,
                field,
            ));
        }
        if d.changes_encoder() {
            return Err(SemqError::invalid_at(
                "null diff changes encoder or encoder_revision",
                None,
                field,
            ));
        }
    }
    // The largest changed/common ratio, compared exactly; ties keep the
    // earliest null.
    let (mut changed_rows, mut total_rows) = (first.changed.len() as u64, first.n_common());
    for d in &nulls[1..] {
        let (c, t) = (d.changed.len() as u64, d.n_common());
        if u128::from(c) * u128::from(total_rows) > u128::from(changed_rows) * u128::from(t) {
            changed_rows = c;
            total_rows = t;
        }
    }
    let hamming = nulls.iter().map(|d| p99(&hammings(d))).max().unwrap_or(0);
    let (max_hamming, distinct_nulls) = if per_row {
        let max = nulls
            .iter()
            .flat_map(|d| d.changed.iter().map(|(_, h)| *h))
            .max()
            .unwrap_or(0);
        let distinct: HashSet<&Digest32> =
            nulls.iter().map(|d| &d.candidate_content_digest).collect();
        (Some(max), Some(distinct.len() as u64))
    } else {
        (None, None)
    };
    Floor::new(FloorFields {
        config: first.config,
        id_kind: first.id_kind,
        reference_id: first.reference_id,
        nulls: nulls.len() as u64,
        changed_rows,
        total_rows,
        hamming,
        max_hamming,
        distinct_nulls,
    })
}

/// A reason a candidate fails a floor, in the fixed reporting order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    NoCommonRows,
    RemovedRows,
    ChangedRatio,
    Hamming,
    Encoder,
    RowAboveMax,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::NoCommonRows => "no_common_rows",
            Reason::RemovedRows => "removed_rows",
            Reason::ChangedRatio => "changed_ratio",
            Reason::Hamming => "hamming",
            Reason::Encoder => "encoder",
            Reason::RowAboveMax => "row_above_max",
        }
    }
}

/// The outcome of [`evaluate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// No reason at all.
    pub passed: bool,
    pub reasons: Vec<Reason>,
    /// Changed rows above max_hamming, in id order (per-row check only).
    pub rows: Vec<Id>,
}

impl Verdict {
    /// The base verdict: no reason among the five base checks.
    pub fn within(&self) -> bool {
        !self.reasons.iter().any(|r| *r != Reason::RowAboveMax)
    }
}

fn check_context(diff: &Diff, floor: &Floor, per_row: bool) -> Result<()> {
    if floor.config != diff.config {
        return Err(SemqError::incompatible(
            "floor was measured under another config",
            None,
        ));
    }
    if floor.id_kind != diff.id_kind {
        return Err(SemqError::incompatible(
            "floor was measured for another id kind",
            None,
        ));
    }
    if floor.reference_id != diff.reference_id {
        return Err(SemqError::incompatible(
            "floor was measured against another reference",
            None,
        ));
    }
    if per_row && floor.max_hamming.is_none() {
        return Err(SemqError::incompatible(
            "floor has no max_hamming for the per-row check",
            None,
        ));
    }
    Ok(())
}

/// Evaluates every check (not only the first failing one); reasons come
/// in the order of spec 10. Without `per_row`, passed = within.
pub fn evaluate(diff: &Diff, floor: &Floor, per_row: bool) -> Result<Verdict> {
    check_context(diff, floor, per_row)?;
    let n_common = diff.n_common();
    let changed = diff.changed.len() as u64;
    let mut reasons = Vec::new();
    if n_common == 0 {
        reasons.push(Reason::NoCommonRows);
    }
    if !diff.removed.is_empty() {
        reasons.push(Reason::RemovedRows);
    }
    if u128::from(changed) * u128::from(floor.total_rows)
        > u128::from(floor.changed_rows) * u128::from(n_common)
    {
        reasons.push(Reason::ChangedRatio);
    }
    if p99(&hammings(diff)) > floor.hamming {
        reasons.push(Reason::Hamming);
    }
    if diff.changes_encoder() {
        reasons.push(Reason::Encoder);
    }
    let mut rows = Vec::new();
    if per_row {
        let max = floor.max_hamming.unwrap_or(u64::MAX);
        rows = diff
            .changed
            .iter()
            .filter(|(_, h)| *h > max)
            .map(|(id, _)| id.clone())
            .collect();
        if !rows.is_empty() {
            reasons.push(Reason::RowAboveMax);
        }
    }
    Ok(Verdict {
        passed: reasons.is_empty(),
        reasons,
        rows,
    })
}

/// The base verdict (checks 1–5).
pub fn within(diff: &Diff, floor: &Floor) -> Result<bool> {
    Ok(evaluate(diff, floor, false)?.passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_nearest_rank() {
        assert_eq!(p99(&[]), 0);
        assert_eq!(p99(&[3, 1, 2]), 3);
        let mut v: Vec<u64> = (0..100).collect();
        assert_eq!(p99(&v), 98);
        v.extend(100..199);
        assert_eq!(p99(&v), 197);
        v.push(199);
        assert_eq!(p99(&v), 197);
    }
}
