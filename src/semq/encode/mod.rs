//! Encoding float32 vectors into a state (spec 6), decoding symbols into
//! representatives, and constructing a state from packed rows (spec 8).

mod orbit;
mod phase;
mod quant;

pub use orbit::Orbit;
pub use phase::Phase;
pub use quant::Quant;

use rayon::prelude::*;

use super::config::{Config, Operator};
use super::encoding::{fill_u64_ids, fill_utf8_ids, Encoding, ImageBuilder};
use super::error::{Result, SemqError};
use super::identity::ContentHasher;
use super::ids::{check_utf8_id, IdKind, IdList};
use super::manifest::Manifest;
use super::read::Progress;
use super::rows;

/// The operator of a config with its precomputed constants.
#[derive(Debug, Clone)]
pub enum Codec {
    Orbit(Orbit),
    Phase(Phase),
    Quant(Quant),
}

impl Codec {
    pub fn new(config: &Config) -> Codec {
        match config.operator() {
            Operator::Orbit => Codec::Orbit(Orbit::new(config)),
            Operator::Phase => Codec::Phase(Phase::new(config)),
            Operator::Quant => Codec::Quant(Quant::new(config)),
        }
    }

    /// Symbols of one admitted row.
    pub fn encode_row(&self, row: &[f32], symbols: &mut [u8]) {
        match self {
            Codec::Orbit(o) => o.encode_row(row, symbols),
            Codec::Phase(p) => p.encode_row(row, symbols),
            Codec::Quant(q) => q.encode_row(row, symbols),
        }
    }
}

/// Why a row was not admitted (spec 6, step 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowRejection {
    /// NaN or ±infinity at this coordinate.
    NotFinite(usize),
    NotUnitNorm,
}

/// Flushes |x| < 2^-126 to +0.0 into `out`, then checks finiteness and
/// the binary64 sum of squares against 1 ± 2^-10.
pub fn admit(row: &[f32], out: &mut [f32]) -> Result<(), RowRejection> {
    if !flush(row, out) {
        if let Some(i) = out.iter().position(|x| !x.is_finite()) {
            return Err(RowRejection::NotFinite(i));
        }
    }
    if unit_norm(sum_of_squares(out)) {
        Ok(())
    } else {
        Err(RowRejection::NotUnitNorm)
    }
}

/// Flushes |x| < 2^-126 to +0.0 in one branch-free pass; false when some
/// coordinate is not finite (its position is searched only then).
#[inline]
fn flush(row: &[f32], out: &mut [f32]) -> bool {
    let mut all_finite = true;
    for (o, &x) in out.iter_mut().zip(row) {
        *o = if x.abs() < f32::MIN_POSITIVE { 0.0 } else { x };
        all_finite &= x.is_finite();
    }
    all_finite
}

/// Σ x_i² in binary64, in index order: each square is exact, each
/// addition rounds, so the order is part of the rule.
#[inline]
fn sum_of_squares(row: &[f32]) -> f64 {
    let mut s = 0.0f64;
    for &x in row {
        let x = f64::from(x);
        s += x * x;
    }
    s
}

/// The same sums for GROUP rows at once. Each row keeps its own in-order
/// chain (identical results); running the chains side by side hides the
/// latency of the dependent additions.
#[inline]
fn sums_of_squares(rows: &[f32], dim: usize) -> [f64; GROUP] {
    let mut s = [0.0f64; GROUP];
    if rows.len() == GROUP * dim {
        let (a, rest) = rows.split_at(dim);
        let (b, rest) = rest.split_at(dim);
        let (c, d) = rest.split_at(dim);
        for i in 0..dim {
            let (xa, xb, xc, xd) = (
                f64::from(a[i]),
                f64::from(b[i]),
                f64::from(c[i]),
                f64::from(d[i]),
            );
            s[0] += xa * xa;
            s[1] += xb * xb;
            s[2] += xc * xc;
            s[3] += xd * xd;
        }
    } else {
        for (sum, row) in s.iter_mut().zip(rows.chunks_exact(dim)) {
            *sum = sum_of_squares(row);
        }
    }
    s
}

#[inline]
fn unit_norm(s: f64) -> bool {
    const TOL: f64 = 1.0 / 1024.0;
    (-TOL..=TOL).contains(&(s - 1.0))
}

/// Rows handled together by one encoder step.
const GROUP: usize = 4;

/// Admits and encodes up to GROUP rows (consecutive in sorted order) into
/// `dst`; returns the first rejection as (index in the group, input index,
/// reason).
fn encode_group(
    codec: &Codec,
    config: &Config,
    vectors: &[f32],
    inputs: &[usize],
    flushed: &mut [f32],
    symbols: &mut [u8],
    dst: &mut [u8],
) -> Option<(usize, usize, RowRejection)> {
    let dim = config.dim() as usize;
    let bpv = config.bytes_per_vector();
    let mut finite = [true; GROUP];
    for ((f, &input), out) in finite
        .iter_mut()
        .zip(inputs)
        .zip(flushed.chunks_exact_mut(dim))
    {
        *f = flush(&vectors[input * dim..(input + 1) * dim], out);
    }
    let used = &flushed[..inputs.len() * dim];
    let sums = sums_of_squares(used, dim);
    for (r, (&input, row)) in inputs.iter().zip(used.chunks_exact(dim)).enumerate() {
        if !finite[r] {
            let c = row.iter().position(|x| !x.is_finite()).unwrap_or(0);
            return Some((r, input, RowRejection::NotFinite(c)));
        }
        if !unit_norm(sums[r]) {
            return Some((r, input, RowRejection::NotUnitNorm));
        }
        let out = &mut dst[r * bpv..(r + 1) * bpv];
        match codec {
            Codec::Quant(q) => q.encode_packed(row, out),
            _ => {
                codec.encode_row(row, symbols);
                rows::pack(config, symbols, out);
            }
        }
    }
    None
}

/// Rust never changes the rounding mode, but foreign code in the process
/// could; the encoder's bits depend on round-to-nearest (spec 6, step 1).
/// 1 + 0.75·ε rounds up only under nearest and upward, −1 − 0.75·ε rounds
/// away from zero only under nearest and downward: both hold only under
/// nearest. `black_box` keeps the sums from being folded at compile time.
fn rounding_is_to_nearest() -> bool {
    let one = std::hint::black_box(1.0f64);
    let tiny = std::hint::black_box(0.75 * f64::EPSILON);
    one + tiny == 1.0 + f64::EPSILON && -one - tiny == -1.0 - f64::EPSILON
}

/// The message of the one encode error that concerns the ids rather than
/// the vectors or the manifest (callers name the ids file for it).
pub const DUPLICATE_ID: &str = "duplicate id";

/// Validates the ids (spec 6, step 2) and returns the input indices in
/// sorted id order.
fn sorted_order(ids: &IdList) -> Result<Vec<usize>> {
    let duplicate = |later: usize| SemqError::invalid_at(DUPLICATE_ID, Some(later as u64), None);
    match ids {
        IdList::U64(v) => {
            // Sorting (id, input index) pairs keeps the keys next to each
            // other in memory; the index makes the unstable sort put equal
            // ids in input order, exactly as a stable sort would.
            let mut keyed: Vec<(u64, usize)> = v.iter().copied().zip(0..).collect();
            keyed.par_sort_unstable();
            if let Some(w) = keyed.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(duplicate(w[1].1));
            }
            Ok(keyed.into_iter().map(|(_, i)| i).collect())
        }
        IdList::Utf8(v) => {
            for (i, id) in v.iter().enumerate() {
                check_utf8_id(id)
                    .map_err(|f| SemqError::invalid_at(f.message(), Some(i as u64), None))?;
            }
            let mut order: Vec<usize> = (0..v.len()).collect();
            order.par_sort_by(|&a, &b| v[a].cmp(&v[b]));
            if let Some(w) = order.windows(2).find(|w| v[w[0]] == v[w[1]]) {
                return Err(duplicate(w[1]));
            }
            Ok(order)
        }
    }
}

fn row_error(input_index: usize, r: RowRejection) -> SemqError {
    match r {
        RowRejection::NotFinite(c) => SemqError::invalid_at(
            "vector has a NaN or infinite coordinate",
            Some(input_index as u64),
            Some(c as u64),
        ),
        RowRejection::NotUnitNorm => SemqError::invalid_at(
            "vector is not unit-norm (|sum of squares - 1| > 2^-10)",
            Some(input_index as u64),
            None,
        ),
    }
}

fn builder_for(config: Config, ids: &IdList, manifest: Manifest) -> Result<ImageBuilder> {
    let id_bytes: usize = match ids {
        IdList::U64(_) => 0,
        IdList::Utf8(v) => v.iter().map(Vec::len).sum(),
    };
    ImageBuilder::new(config, ids.kind(), ids.len(), id_bytes, manifest)
}

fn fill_ids(builder: &mut ImageBuilder, ids: &IdList, order: &[usize]) {
    match ids {
        IdList::U64(v) => fill_u64_ids(builder.ids_mut(), order.iter().map(|&i| v[i])),
        IdList::Utf8(v) => fill_utf8_ids(
            builder.ids_mut(),
            order.len(),
            order.iter().map(|&i| v[i].as_slice()),
        ),
    }
}

/// Encodes `vectors` (ids.len() × dim binary32 values, row i belongs to
/// input id i) under `config` with the manifest `pairs` (caller order).
///
/// Checks run in the order of spec 6 and the first failure wins: ids,
/// then rows in sorted id order (`row` = input index), then the manifest.
/// The result does not depend on the input order of the (id, vector) pairs.
pub fn encode<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    config: Config,
    ids: &IdList,
    vectors: &[f32],
    pairs: &[(K, V)],
) -> Result<Encoding> {
    encode_with_progress(config, ids, vectors, pairs, &|_, _| {})
}

/// [`encode`], reporting (rows encoded, rows) after each block of rows.
pub fn encode_with_progress<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    config: Config,
    ids: &IdList,
    vectors: &[f32],
    pairs: &[(K, V)],
    progress: Progress<'_>,
) -> Result<Encoding> {
    let dim = config.dim() as usize;
    let n = ids.len();
    if n.checked_mul(dim) != Some(vectors.len()) {
        return Err(SemqError::invalid("vectors must hold n × dim values"));
    }
    if !rounding_is_to_nearest() {
        return Err(SemqError::Unsupported {
            operation: "encode needs the round-to-nearest floating-point mode".into(),
        });
    }
    let order = sorted_order(ids)?;
    let manifest = Manifest::from_pairs(pairs);
    // Rows are encoded straight into the image; a bad manifest must still
    // be reported after the rows, so the space is sized with an empty one.
    let mut builder = builder_for(config, ids, manifest.as_ref().cloned().unwrap_or_default())?;
    fill_ids(&mut builder, ids, &order);

    let codec = Codec::new(&config);
    let bpv = config.bytes_per_vector();
    if bpv == 0 || n == 0 {
        manifest?;
        return Ok(builder.finish());
    }
    // Rows are encoded block by block in sorted order; while one block is
    // encoded (on every core), the previous one is hashed, so the single
    // SHA-256 stream of the content digest costs no extra wall time.
    let (prefix, rows_region) = builder.content_parts_mut();
    let mut hasher = ContentHasher::new();
    hasher.update(prefix);
    let mut hashed_upto: Option<&[u8]> = None;
    let block_rows = (BLOCK_BYTES / bpv).max(GROUP);
    let mut rows_done = 0u64;
    for (dst, inputs) in rows_region
        .chunks_mut(block_rows * bpv)
        .zip(order.chunks(block_rows))
    {
        let previous = hashed_upto.take();
        let (first_error, ()) = rayon::join(
            || encode_block(&codec, &config, vectors, inputs, dst),
            || {
                if let Some(p) = previous {
                    hasher.update(p);
                }
            },
        );
        // Blocks go in sorted order, so the first failing block holds the
        // smallest failing id.
        if let Some((_, input, why)) = first_error {
            return Err(row_error(input, why));
        }
        rows_done += inputs.len() as u64;
        progress(rows_done, n as u64);
        hashed_upto = Some(dst);
    }
    if let Some(p) = hashed_upto {
        hasher.update(p);
    }
    let content = hasher.finish();
    manifest?;
    Ok(builder.finish_with_content_digest(content))
}

/// Packed bytes per pipeline block: large enough to keep both cores busy,
/// small enough that the last block's hash is a short tail.
const BLOCK_BYTES: usize = 4 << 20;

/// Encodes one block of rows (consecutive in sorted order) in parallel;
/// returns the first rejection in sorted order as (position in the block,
/// input index, reason).
fn encode_block(
    codec: &Codec,
    config: &Config,
    vectors: &[f32],
    inputs: &[usize],
    dst: &mut [u8],
) -> Option<(usize, usize, RowRejection)> {
    let dim = config.dim() as usize;
    let bpv = config.bytes_per_vector();
    let units = config.units_per_row();
    dst.par_chunks_mut(GROUP * bpv)
        .with_min_len(16)
        .zip(inputs.par_chunks(GROUP))
        .enumerate()
        .map_init(
            || (vec![0f32; GROUP * dim], vec![0u8; units]),
            |(flushed, symbols), (g, (dst, group))| {
                // Rows are gathered from the input in id order, i.e. from
                // scattered places: ask for a later group's rows now so that
                // they arrive while this group is encoded.
                let ahead = (g + PREFETCH_GROUPS) * GROUP;
                for &input in inputs
                    .get(ahead..(ahead + GROUP).min(inputs.len()))
                    .unwrap_or(&[])
                {
                    prefetch(vectors.get(input * dim..(input + 1) * dim).unwrap_or(&[]));
                }
                encode_group(codec, config, vectors, group, flushed, symbols, dst)
                    .map(|(r, input, why)| (g * GROUP + r, input, why))
            },
        )
        .flatten()
        .min_by_key(|(pos, _, _)| *pos)
}

/// How many groups ahead input rows are prefetched.
const PREFETCH_GROUPS: usize = 2;

/// Hints the CPU to bring `data` into the cache.
#[inline]
fn prefetch(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in data.chunks(16) {
        // SAFETY: PREFETCHT0 is part of SSE, which every x86-64 CPU has; a
        // prefetch never faults and has no architectural effect, and the
        // pointer comes from a live slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Builds a state from caller-supplied packed rows (`rows` = ids.len() ×
/// bytes_per_vector bytes, row i belongs to input id i). Checks, in order:
/// row count, canonical rows (`field` = first bad unit, absent for a
/// padding bit), ids, manifest (spec 8).
pub fn from_rows<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    config: Config,
    ids: &IdList,
    rows_in: &[u8],
    pairs: &[(K, V)],
) -> Result<Encoding> {
    let bpv = config.bytes_per_vector();
    let n = ids.len();
    if n.checked_mul(bpv) != Some(rows_in.len()) {
        return Err(SemqError::invalid(
            "rows must hold n × bytes_per_vector bytes",
        ));
    }
    if bpv > 0 {
        for (i, row) in rows_in.chunks_exact(bpv).enumerate() {
            if let Err(f) = rows::check_canonical(&config, row) {
                return Err(SemqError::invalid_at(
                    "row is not canonical",
                    Some(i as u64),
                    f.unit.map(|u| u as u64),
                ));
            }
        }
    }
    let order = sorted_order(ids)?;
    let manifest = Manifest::from_pairs(pairs)?;
    let mut builder = builder_for(config, ids, manifest)?;
    fill_ids(&mut builder, ids, &order);
    if bpv > 0 {
        for (dst, &input) in builder.rows_mut().chunks_exact_mut(bpv).zip(&order) {
            dst.copy_from_slice(&rows_in[input * bpv..(input + 1) * bpv]);
        }
    }
    Ok(builder.finish())
}

/// Builds a state from packed symbols (one byte per unit).
pub fn from_symbols<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    config: Config,
    ids: &IdList,
    symbols: &[u8],
    pairs: &[(K, V)],
) -> Result<Encoding> {
    let units = config.units_per_row();
    if ids.len().checked_mul(units) != Some(symbols.len()) {
        return Err(SemqError::invalid(
            "symbols must hold n × units_per_row values",
        ));
    }
    let alphabet = config.alphabet();
    if let Some(p) = symbols.iter().position(|&s| u32::from(s) >= alphabet) {
        return Err(SemqError::invalid_at(
            "symbol is outside the alphabet",
            Some((p / units.max(1)) as u64),
            Some((p % units.max(1)) as u64),
        ));
    }
    let bpv = config.bytes_per_vector();
    let mut packed = vec![0u8; ids.len() * bpv];
    if units > 0 {
        for (src, dst) in symbols
            .chunks_exact(units)
            .zip(packed.chunks_exact_mut(bpv))
        {
            rows::pack(&config, src, dst);
        }
    }
    from_rows(config, ids, &packed, pairs)
}

/// The state with no rows of this config, id kind and manifest (the
/// neutral element of concat).
pub fn empty(config: Config, kind: IdKind, manifest: Manifest) -> Result<Encoding> {
    Ok(ImageBuilder::new(config, kind, 0, 0, manifest)?.finish())
}

impl Encoding {
    /// Representatives of every unit (decode), n × dim binary32 values in
    /// sorted id order. Not normalized; outside the byte contract.
    pub fn decode(&self) -> Vec<f32> {
        self.decode_rows(0..self.len())
    }

    /// Representatives of the rows at sorted indices `rows` (clamped to
    /// the Encoding), rows.len() × dim binary32 values.
    pub fn decode_rows(&self, rows: std::ops::Range<usize>) -> Vec<f32> {
        let config = self.config();
        let dim = config.dim() as usize;
        let units = config.units_per_row();
        let end = rows.end.min(self.len());
        let start = rows.start.min(end);
        let mut symbols = vec![0u8; units];
        let mut out = vec![0f32; (end - start) * dim];
        let table = Representatives::new(&config);
        for (i, dst) in (start..end).zip(out.chunks_exact_mut(dim)) {
            if let Some(row) = self.row(i) {
                rows::unpack(&config, row, &mut symbols);
                table.fill(&symbols, dst);
            }
        }
        out
    }
}

/// One representative per symbol, computed once per decode.
enum Representatives {
    /// One value per coordinate (quant, orbit).
    Scalar(Vec<f32>),
    /// One (x, y) pair per coordinate pair (phase).
    Pair(Vec<(f32, f32)>),
}

impl Representatives {
    fn new(config: &Config) -> Representatives {
        let symbols = 0..config.alphabet();
        match Codec::new(config) {
            Codec::Quant(q) => {
                Representatives::Scalar(symbols.map(|s| q.representative(s as u8)).collect())
            }
            Codec::Orbit(o) => {
                Representatives::Scalar(symbols.map(|s| o.representative(s as u8)).collect())
            }
            Codec::Phase(p) => Representatives::Pair(p.representatives()),
        }
    }

    fn fill(&self, symbols: &[u8], out: &mut [f32]) {
        match self {
            Representatives::Scalar(t) => {
                for (o, &s) in out.iter_mut().zip(symbols) {
                    *o = t.get(usize::from(s)).copied().unwrap_or(0.0);
                }
            }
            Representatives::Pair(t) => {
                for (pair, &s) in out.chunks_exact_mut(2).zip(symbols) {
                    let (x, y) = t.get(usize::from(s)).copied().unwrap_or((0.0, 0.0));
                    pair[0] = x;
                    pair[1] = y;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_follows_the_spec_order() {
        let mut out = [0f32; 4];
        assert_eq!(admit(&[1.0, 2f32.powi(-5), 0.0, 0.0], &mut out), Ok(()));
        assert_eq!(
            admit(&[1.0, f32::from_bits(0x3d01_6f00), 0.0, 0.0], &mut out),
            Err(RowRejection::NotUnitNorm)
        );
        // A NaN is reported with its coordinate even when the norm is bad.
        assert_eq!(
            admit(&[5.0, 0.0, f32::NAN, f32::INFINITY], &mut out),
            Err(RowRejection::NotFinite(2))
        );
        assert_eq!(
            admit(&[f32::from_bits(1), -0.0, 1.0, 0.0], &mut out),
            Ok(())
        );
        assert_eq!(out.map(f32::to_bits), [0, 0, 1.0f32.to_bits(), 0]);
    }

    #[test]
    fn grouped_sums_equal_single_sums() {
        let dim = 37;
        let rows: Vec<f32> = (0..GROUP * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 997.0 - 0.5)
            .collect();
        let grouped = sums_of_squares(&rows, dim);
        for (r, row) in rows.chunks_exact(dim).enumerate() {
            assert_eq!(grouped[r].to_bits(), sum_of_squares(row).to_bits());
        }
        let partial = sums_of_squares(&rows[..2 * dim], dim);
        assert_eq!(
            partial[1].to_bits(),
            sum_of_squares(&rows[dim..2 * dim]).to_bits()
        );
    }

    #[test]
    fn rounding_mode_is_nearest_here() {
        assert!(rounding_is_to_nearest());
    }
}
