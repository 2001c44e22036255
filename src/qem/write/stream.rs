//! One count stream (spec §7): choosing its model and encoding it.
//!
//! Both policies start from one pass over the values (a 33-bin histogram of
//! `min(v, 32)`, the maximum, the number of nonzero values). From it the
//! size of every form that needs no encoding is known exactly (zeros,
//! constant, literal, sparse), and the size of each rANS table can be bounded
//! tightly, so rANS streams are only encoded when they can win.

use std::sync::OnceLock;

use super::rans::{self, Scratch};
use super::ModelChoice;
use crate::qem::tables::{ESCAPE, FREQUENCIES, SYMBOLS, TABLES};

/// Selector of a stream holding only zeros (no bytes).
pub const ZEROS: u8 = 253;
/// Selector of a stream holding one repeated value (one u16).
pub const CONSTANT: u8 = 255;
/// Selector of a stream stored verbatim (`m` u16).
pub const LITERAL: u8 = 254;
/// Selector of a stream of (position, value) events for values 1..=128.
pub const SPARSE: u8 = 252;

/// Largest value the sparse form can carry (7-bit value field, offset by one).
const SPARSE_MAX: u16 = 128;

/// What one pass over a stream tells.
pub(crate) struct Summary {
    pub hist: [u32; SYMBOLS],
    pub max: u16,
    pub min: u16,
}

impl Summary {
    pub fn of(values: &[u16]) -> Summary {
        // Four interleaved histograms: runs of equal values (mostly zeros)
        // would otherwise serialise on one counter.
        let mut parts = [[0u32; SYMBOLS]; 4];
        let mut quads = values.chunks_exact(4);
        for q in &mut quads {
            for (part, &v) in parts.iter_mut().zip(q) {
                part[usize::from(v).min(ESCAPE)] += 1;
            }
        }
        for &v in quads.remainder() {
            parts[0][usize::from(v).min(ESCAPE)] += 1;
        }
        let mut hist = [0u32; SYMBOLS];
        for part in &parts {
            for (h, p) in hist.iter_mut().zip(part) {
                *h += p;
            }
        }
        // Separate passes so the compiler can vectorise them.
        let max = values.iter().copied().max().unwrap_or(0);
        let min = values.iter().copied().min().unwrap_or(0);
        Summary { hist, max, min }
    }

    fn nonzero(&self, m: usize) -> usize {
        m - self.hist[0] as usize
    }

    /// Bytes of the sparse form, when the values allow it.
    fn sparse_len(&self, m: usize) -> Option<usize> {
        (self.max <= SPARSE_MAX).then(|| 2 * self.nonzero(m))
    }

    /// Information content in bits of the stream under table `k`, escape words excluded.
    fn bits(&self, k: usize) -> f64 {
        let cost = costs();
        self.hist
            .iter()
            .zip(cost[k].iter())
            .filter(|(&h, _)| h != 0)
            .map(|(&h, &c)| f64::from(h) * c)
            .sum()
    }

    /// A size no rANS stream with table `k` can undercut.
    ///
    /// The final state carries at most 31 bits, the initial state 23, and
    /// every coding step loses less than 2^-13 of a bit to integer rounding,
    /// so the renormalisation bytes number at least `(bits - 8 - 0.1·m/512) / 8`.
    /// One byte of slack more keeps the bound safe against float summation error.
    fn rans_lower_bound(&self, k: usize, m: usize) -> usize {
        let bits = self.bits(k) - 8.0 - (m as f64) * 1.5e-4;
        let renorm = (bits / 8.0).ceil().max(0.0) as usize;
        4 + 2 * self.hist[ESCAPE] as usize + renorm.saturating_sub(1)
    }

    /// The rANS size estimate used to rank tables.
    fn rans_estimate(&self, bits: f64) -> f64 {
        4.0 + 2.0 * f64::from(self.hist[ESCAPE]) + bits / 8.0
    }
}

/// `-log2(freq / 1024)` for every table and symbol.
fn costs() -> &'static [[f64; SYMBOLS]; TABLES] {
    static COSTS: OnceLock<[[f64; SYMBOLS]; TABLES]> = OnceLock::new();
    COSTS.get_or_init(|| {
        let mut c = [[0.0; SYMBOLS]; TABLES];
        for (row, freq) in c.iter_mut().zip(FREQUENCIES.iter()) {
            for (cell, &f) in row.iter_mut().zip(freq.iter()) {
                *cell = (1024.0 / f64::from(f)).log2();
            }
        }
        c
    })
}

/// The reference writer's table for a stream (spec §7.2 step 2).
pub(crate) fn reference_table(summary: &Summary, m: usize) -> usize {
    let capped_sum: u64 = summary
        .hist
        .iter()
        .enumerate()
        .map(|(s, &h)| s as u64 * u64::from(h))
        .sum();
    let mean = (capped_sum as f64 / m as f64).max(0.002);
    let k = ((mean / 0.002).ln() * 63.0 / 16000f64.ln()).round_ties_even();
    k.clamp(0.0, 63.0) as usize
}

/// Scratch space reused across streams by one worker (avoids per-stream allocation).
#[derive(Default)]
pub struct StreamScratch {
    rans: Scratch,
    rans2: Scratch,
    a: Vec<u8>,
    b: Vec<u8>,
    c: Vec<u8>,
}

/// Appends the encoding of the count stream `values` to `out` and returns its model selector.
pub fn encode(
    values: &[u16],
    choice: ModelChoice,
    scratch: &mut StreamScratch,
    out: &mut Vec<u8>,
) -> u8 {
    let m = values.len();
    let summary = Summary::of(values);
    if m == 0 || summary.min == summary.max {
        return encode_uniform(values, out);
    }
    match choice {
        ModelChoice::Reference => encode_reference(values, &summary, scratch, out),
        ModelChoice::Smallest => encode_smallest(values, &summary, scratch, out),
    }
}

fn encode_uniform(values: &[u16], out: &mut Vec<u8>) -> u8 {
    match values.first() {
        None | Some(0) => ZEROS,
        Some(&v) => {
            out.extend_from_slice(&v.to_le_bytes());
            CONSTANT
        }
    }
}

fn write_literal(values: &[u16], out: &mut Vec<u8>) {
    out.reserve(2 * values.len());
    for &v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn write_sparse(values: &[u16], out: &mut Vec<u8>) {
    for (i, &v) in values.iter().enumerate() {
        if v != 0 {
            let event = ((i as u16) << 7) | (v - 1);
            out.extend_from_slice(&event.to_le_bytes());
        }
    }
}

/// A decided form: selector and, for rANS, the stream in a scratch buffer.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    Literal,
    Sparse,
    Rans(usize),
}

/// Spec §7.2 steps 2–4, skipping the rANS pass when the sparse form is
/// certain to beat it.
fn encode_reference(
    values: &[u16],
    summary: &Summary,
    scratch: &mut StreamScratch,
    out: &mut Vec<u8>,
) -> u8 {
    let m = values.len();
    let k = reference_table(summary, m);
    let sparse = summary.sparse_len(m);
    if let Some(len) = sparse {
        if len < 2 * m && len < summary.rans_lower_bound(k, m) {
            write_sparse(values, out);
            return SPARSE;
        }
    }
    scratch.a.clear();
    let mut len = rans::encode(values, k, &mut scratch.rans, &mut scratch.a);
    let mut form = Form::Rans(k);
    if len >= 2 * m {
        form = Form::Literal;
        len = 2 * m;
    }
    if let Some(s) = sparse {
        if s < len {
            form = Form::Sparse;
        }
    }
    emit(form, values, &scratch.a, out)
}

fn emit(form: Form, values: &[u16], rans_bytes: &[u8], out: &mut Vec<u8>) -> u8 {
    match form {
        Form::Literal => {
            write_literal(values, out);
            LITERAL
        }
        Form::Sparse => {
            write_sparse(values, out);
            SPARSE
        }
        Form::Rans(k) => {
            out.extend_from_slice(rans_bytes);
            k as u8
        }
    }
}

/// The smallest of literal, sparse and the rANS tables, never larger than
/// the reference choice.
fn encode_smallest(
    values: &[u16],
    summary: &Summary,
    scratch: &mut StreamScratch,
    out: &mut Vec<u8>,
) -> u8 {
    let m = values.len();
    // Best so far; `scratch.a` holds its bytes when it is a rANS form.
    let mut best = Form::Literal;
    let mut best_len = 2 * m;
    if let Some(s) = summary.sparse_len(m) {
        if s < best_len {
            best = Form::Sparse;
            best_len = s;
        }
    }

    // Rank the tables by estimated size.
    let mut first = (f64::INFINITY, 0usize);
    let mut second = (f64::INFINITY, 0usize);
    let present: Vec<(f64, usize)> = summary
        .hist
        .iter()
        .enumerate()
        .filter(|(_, &h)| h != 0)
        .map(|(s, &h)| (f64::from(h), s))
        .collect();
    let cost = costs();
    for (k, row) in cost.iter().enumerate() {
        let bits: f64 = present.iter().map(|&(h, s)| h * row[s]).sum();
        let est = summary.rans_estimate(bits);
        if est < first.0 {
            second = first;
            first = (est, k);
        } else if est < second.0 {
            second = (est, k);
        }
    }
    let reference = reference_table(summary, m);
    let lb_reference = summary.rans_lower_bound(reference, m);
    // Tables worth encoding now: the best estimate, a close second, and the
    // reference table unless the best estimate is clearly ahead of it.
    let mut tables: Vec<usize> = Vec::with_capacity(3);
    let mut consider = |k: usize| {
        if !tables.contains(&k) && summary.rans_lower_bound(k, m) < best_len {
            tables.push(k);
        }
    };
    consider(first.1);
    if second.0 <= first.0 + 1.0 {
        consider(second.1);
    }
    if (lb_reference as f64) <= first.0 + 2.0 {
        consider(reference);
    }
    let keep = |k: usize,
                len: usize,
                bytes: &mut Vec<u8>,
                best: &mut Form,
                best_len: &mut usize,
                a: &mut Vec<u8>| {
        if len < *best_len {
            *best_len = len;
            *best = Form::Rans(k);
            std::mem::swap(a, bytes);
        }
    };
    let mut encoded = Vec::with_capacity(3);
    for pair in tables.chunks(2) {
        scratch.b.clear();
        scratch.c.clear();
        if let [k0, k1] = *pair {
            let [l0, l1] = rans::encode_pair(
                values,
                [k0, k1],
                [&mut scratch.rans, &mut scratch.rans2],
                [&mut scratch.b, &mut scratch.c],
            );
            keep(
                k0,
                l0,
                &mut scratch.b,
                &mut best,
                &mut best_len,
                &mut scratch.a,
            );
            keep(
                k1,
                l1,
                &mut scratch.c,
                &mut best,
                &mut best_len,
                &mut scratch.a,
            );
        } else {
            let l0 = rans::encode(values, pair[0], &mut scratch.rans, &mut scratch.b);
            keep(
                pair[0],
                l0,
                &mut scratch.b,
                &mut best,
                &mut best_len,
                &mut scratch.a,
            );
        }
        encoded.extend_from_slice(pair);
    }
    // Never larger than the reference choice: its table is encoded whenever
    // it could still be smaller than what was found.
    if !encoded.contains(&reference) && lb_reference < best_len {
        scratch.b.clear();
        let len = rans::encode(values, reference, &mut scratch.rans, &mut scratch.b);
        keep(
            reference,
            len,
            &mut scratch.b,
            &mut best,
            &mut best_len,
            &mut scratch.a,
        );
    }
    emit(best, values, &scratch.a, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qem::write::rans::tests::decode;
    use proptest::prelude::*;

    fn enc(values: &[u16], choice: ModelChoice) -> (u8, Vec<u8>) {
        let mut out = Vec::new();
        let sel = encode(values, choice, &mut StreamScratch::default(), &mut out);
        (sel, out)
    }

    /// Independent decoder of every form (spec §7), for checking.
    fn decode_any(sel: u8, bytes: &[u8], m: usize) -> Option<Vec<u16>> {
        let words = || -> Vec<u16> {
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        };
        match sel {
            ZEROS => bytes.is_empty().then(|| vec![0; m]),
            CONSTANT => (bytes.len() == 2).then(|| vec![words()[0]; m]),
            LITERAL => (bytes.len() == 2 * m).then(words),
            SPARSE => {
                let mut v = vec![0u16; m];
                let mut last: Option<usize> = None;
                for e in words() {
                    let p = usize::from(e >> 7);
                    if p >= m || last.is_some_and(|l| l >= p) {
                        return None;
                    }
                    last = Some(p);
                    v[p] = (e & 127) + 1;
                }
                bytes.len().is_multiple_of(2).then_some(v)
            }
            k if usize::from(k) < TABLES => decode(bytes, usize::from(k), m),
            _ => None,
        }
    }

    /// Spec §7.2 written out literally, as the yardstick for both policies.
    fn reference_literal(v: &[u16]) -> (u8, Vec<u8>) {
        let m = v.len();
        if v.iter().all(|&x| x == v[0]) {
            return if v[0] == 0 {
                (ZEROS, vec![])
            } else {
                (CONSTANT, v[0].to_le_bytes().to_vec())
            };
        }
        let sum: u64 = v.iter().map(|&x| u64::from(x.min(32))).sum();
        let mean = (sum as f64 / m as f64).max(0.002);
        let k = ((mean / 0.002).ln() * 63.0 / 16000f64.ln())
            .round_ties_even()
            .clamp(0.0, 63.0) as usize;
        let mut bytes = Vec::new();
        rans::encode(v, k, &mut Scratch::default(), &mut bytes);
        let mut sel = k as u8;
        if bytes.len() >= 2 * m {
            sel = LITERAL;
            bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        }
        let nnz = v.iter().filter(|&&x| x != 0).count();
        if *v.iter().max().unwrap() <= 128 && 2 * nnz < bytes.len() {
            sel = SPARSE;
            bytes.clear();
            write_sparse(v, &mut bytes);
        }
        (sel, bytes)
    }

    #[test]
    fn spec_vector_sparse() {
        let mut v = vec![0u16; 32];
        v[3] = 5;
        let (sel, bytes) = enc(&v, ModelChoice::Reference);
        assert_eq!(sel, SPARSE);
        assert_eq!(bytes, [0x84, 0x01]);
    }

    #[test]
    fn worked_example_streams() {
        assert_eq!(
            enc(&[1, 2], ModelChoice::Reference),
            (LITERAL, vec![1, 0, 2, 0])
        );
        assert_eq!(enc(&[7, 7], ModelChoice::Reference), (CONSTANT, vec![7, 0]));
        assert_eq!(enc(&[0, 0], ModelChoice::Reference), (ZEROS, vec![]));
        assert_eq!(
            enc(&[200, 0], ModelChoice::Reference),
            (LITERAL, vec![200, 0, 0, 0])
        );
    }

    /// A stream whose histogram the reference heuristic misjudges: one value
    /// of 31 among many zeros and ones raises the mean but the escape-free
    /// low tables still code the zeros and ones cheaply.
    #[test]
    fn smallest_beats_reference_on_a_skewed_stream() {
        let mut v: Vec<u16> = (0..512).map(|i| u16::from(i % 3 == 0)).collect();
        v[100] = 300;
        v[200] = 31;
        let (rs, rb) = enc(&v, ModelChoice::Reference);
        let (ss, sb) = enc(&v, ModelChoice::Smallest);
        assert_eq!(
            (rs, &rb),
            (reference_literal(&v).0, &reference_literal(&v).1)
        );
        assert!(
            sb.len() < rb.len(),
            "smallest {} (selector {ss}) vs reference {} (selector {rs})",
            sb.len(),
            rb.len()
        );
        assert_eq!(decode_any(ss, &sb, v.len()), Some(v));
    }

    fn streams() -> impl Strategy<Value = Vec<u16>> {
        let small = prop_oneof![Just(0u16), 0u16..4, 0u16..40, 0u16..=128, any::<u16>()];
        (small.clone(), small, 1usize..=512, any::<u64>()).prop_map(|(a, b, m, seed)| {
            // Mixtures of two value distributions, so histograms vary widely.
            let mut x = seed | 1;
            (0..m)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let pick = if x % 5 == 0 { b } else { a };
                    if pick == 0 {
                        0
                    } else {
                        (x >> 20) as u16 % pick.max(1)
                    }
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn reference_matches_the_spec_procedure(v in streams()) {
            prop_assert_eq!(enc(&v, ModelChoice::Reference), reference_literal(&v));
        }

        #[test]
        fn smallest_is_never_larger_and_decodes(v in streams()) {
            let (rs, rb) = enc(&v, ModelChoice::Reference);
            let (ss, sb) = enc(&v, ModelChoice::Smallest);
            prop_assert!(sb.len() <= rb.len(), "smallest {} > reference {}", sb.len(), rb.len());
            prop_assert_eq!(decode_any(ss, &sb, v.len()), Some(v.clone()));
            prop_assert_eq!(decode_any(rs, &rb, v.len()), Some(v.clone()));
        }

        #[test]
        fn smallest_is_the_best_table(v in streams()) {
            // Exhaustive search over every form: ours may miss the optimum by a
            // byte or two of estimation error, never more than 0.5%.
            let (_, sb) = enc(&v, ModelChoice::Smallest);
            let m = v.len();
            let s = Summary::of(&v);
            let mut best = if s.min == s.max { if s.max == 0 { 0 } else { 2 } } else { 2 * m };
            if let Some(l) = s.sparse_len(m) { best = best.min(l); }
            if s.min != s.max {
                for k in 0..TABLES {
                    let mut out = Vec::new();
                    best = best.min(rans::encode(&v, k, &mut Scratch::default(), &mut out));
                }
            }
            prop_assert!(sb.len() <= best + 2 && sb.len() as f64 <= best as f64 * 1.005 + 2.0,
                "ours {} exhaustive {}", sb.len(), best);
        }

        #[test]
        fn lower_bound_holds(v in streams(), k in 0usize..64) {
            let s = Summary::of(&v);
            let mut out = Vec::new();
            let len = rans::encode(&v, k, &mut Scratch::default(), &mut out);
            prop_assert!(s.rans_lower_bound(k, v.len()) <= len);
        }
    }
}
