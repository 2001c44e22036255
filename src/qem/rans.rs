//! The rANS decoder of §7.1, built for speed without giving up a single check.
//!
//! Each table gets a 1024-entry slot lookup (symbol, frequency and the slot's
//! offset from the symbol start, packed in a u32), so a step is one load, one
//! multiply and one add. Several independent streams are decoded in lockstep
//! to overlap their dependency chains.
//!
//! Renormalisation needs at most two bytes per step: the state is at least
//! 2^23 before a step, so `x >> 10 >= 2^13` and the new state is at least
//! `freq * 2^13 >= 2^13`; two bytes lift anything `>= 2^13` to `>= 2^29`.
//! One step therefore consumes at most 4 bytes (2 renormalisation + 2 escape),
//! and while at least 4 bytes remain the step needs no end-of-stream test.
//!
//! On x86_64 with AVX2 (detected at run time), 8 or 16 lanes run in the
//! 32-bit slots of AVX2 registers: while every lane's slot falls on symbol
//! 0 or 1 (most steps at low dose) the frequency comes from per-lane
//! constants, otherwise from a gather; each lane keeps a 12-byte window of
//! its stream, gathered anew only when some lane has used most of it. The
//! lanes' values of one step form a row, written either into per-stream
//! columns ([`decode_many`]) or straight into frame-major output
//! ([`decode_many_rows`]). Other targets use the scalar lanes; both give
//! the same values and faults (the careful decoder names any fault).

use std::sync::OnceLock;

use super::error::StreamFault;
use super::tables::{ESCAPE, FREQUENCIES, SCALE_BITS, STATE_LOWER, TABLES};

const SLOTS: usize = 1 << SCALE_BITS;
const SLOT_MASK: u32 = SLOTS as u32 - 1;
/// The state must lie in `[2^23, 2^31)` at the start.
const STATE_UPPER: u32 = 1 << 31;

/// Slot lookup of one table: bits 0..10 `slot - start`, 10..16 symbol,
/// 16..27 frequency.
pub(crate) type SlotTable = [u32; SLOTS];

/// Table index of the idle lane: frequency 1024 for symbol 0, so a step
/// leaves the state unchanged, never renormalises and yields 0. Lane groups
/// put it where a detector pixel has no rANS stream.
pub(crate) const IDLE_TABLE: usize = TABLES;

fn build_tables() -> Box<[SlotTable; TABLES + 1]> {
    let mut all = Box::new([[0u32; SLOTS]; TABLES + 1]);
    for (k, table) in all.iter_mut().take(TABLES).enumerate() {
        let mut start = 0usize;
        for (s, &f) in FREQUENCIES[k].iter().enumerate() {
            let f = usize::from(f);
            for (j, e) in table[start..start + f].iter_mut().enumerate() {
                *e = ((f as u32) << 16) | ((s as u32) << 10) | j as u32;
            }
            start += f;
        }
        debug_assert_eq!(start, SLOTS);
    }
    for (j, e) in all[IDLE_TABLE].iter_mut().enumerate() {
        *e = ((SLOTS as u32) << 16) | j as u32;
    }
    all
}

/// The slot lookups of all tables and the idle one, contiguous (table `k`
/// at `k * 1024`).
pub(crate) fn all_slot_tables() -> &'static [SlotTable; TABLES + 1] {
    static TABLES_CELL: OnceLock<Box<[SlotTable; TABLES + 1]>> = OnceLock::new();
    TABLES_CELL.get_or_init(build_tables)
}

/// The slot lookup of table `k` (`k < 64`).
pub fn slot_table(k: usize) -> &'static SlotTable {
    &all_slot_tables()[k]
}

/// One decoding step without end-of-stream tests: the caller guarantees
/// `i + 4 <= bytes.len()`, enough for two renormalisation bytes and an
/// escaped u16. Branch-free: the renormalisation shifts in 0, 1 or 2 bytes
/// read big-endian from `i`, and the escape word is always loaded and
/// selected.
#[inline(always)]
pub(crate) fn step(table: &SlotTable, bytes: &[u8], x: u32, i: usize) -> (u32, usize, u16) {
    let e = table[(x & SLOT_MASK) as usize];
    let y = (e >> 16) * (x >> SCALE_BITS) + (e & SLOT_MASK);
    let n = u32::from(y < STATE_LOWER) + u32::from(y < (1 << 15));
    // The 4 bytes from i hold the renormalisation bytes and, right after
    // them, the escape word: one load serves both.
    let b = &bytes[i..i + 4];
    let w = u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let y = (y << (8 * n)) | (w >> (32 - 8 * n)) as u32;
    let after = (w << (8 * n)) as u32;
    let escaped = (((after >> 24) & 0xff) | ((after >> 8) & 0xff00)) as u16;
    let j = i + n as usize;
    let sym = (e >> 10) & 63;
    if sym == ESCAPE as u32 {
        (y, j + 2, escaped)
    } else {
        (y, j, sym as u16)
    }
}

/// One stream being decoded.
struct Lane<'a> {
    table: &'static SlotTable,
    bytes: &'a [u8],
    x: u32,
    i: usize,
}

impl<'a> Lane<'a> {
    fn new(table: usize, bytes: &'a [u8]) -> Result<Self, StreamFault> {
        if table >= TABLES {
            return Err(StreamFault::UnknownSelector(table.min(255) as u8));
        }
        if bytes.len() < 4 {
            return Err(StreamFault::Length {
                selector: table as u8,
                len: bytes.len(),
            });
        }
        let x = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if !(STATE_LOWER..STATE_UPPER).contains(&x) {
            return Err(StreamFault::InitialState(x));
        }
        Ok(Lane {
            table: slot_table(table),
            bytes,
            x,
            i: 4,
        })
    }

    /// Steps that can run without testing for the end of the stream.
    #[inline(always)]
    fn safe_steps(&self) -> usize {
        (self.bytes.len() - self.i) / 4
    }

    /// One step; the caller guarantees `i + 4 <= len`.
    #[inline(always)]
    fn step_fast(&mut self) -> u16 {
        let (x, i, v) = step(self.table, self.bytes, self.x, self.i);
        self.x = x;
        self.i = i;
        v
    }

    /// One step with every end-of-stream test of the reference decoder.
    fn step_careful(&mut self) -> Result<u16, StreamFault> {
        let e = self.table[(self.x & SLOT_MASK) as usize];
        let mut x = (e >> 16) * (self.x >> SCALE_BITS) + (e & SLOT_MASK);
        while x < STATE_LOWER {
            let b = *self.bytes.get(self.i).ok_or(StreamFault::Truncated)?;
            x = (x << 8) | u32::from(b);
            self.i += 1;
        }
        self.x = x;
        let sym = (e >> 10) & 63;
        if sym as usize == ESCAPE {
            let b = self
                .bytes
                .get(self.i..self.i + 2)
                .ok_or(StreamFault::TruncatedEscape)?;
            self.i += 2;
            Ok(u16::from_le_bytes([b[0], b[1]]))
        } else {
            Ok(sym as u16)
        }
    }

    fn run(&mut self, out: &mut [u16]) -> Result<(), StreamFault> {
        let mut done = 0;
        while done < out.len() {
            let steps = self.safe_steps().min(out.len() - done);
            if steps == 0 {
                out[done] = self.step_careful()?;
                done += 1;
                continue;
            }
            for o in &mut out[done..done + steps] {
                *o = self.step_fast();
            }
            done += steps;
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), StreamFault> {
        if self.x != STATE_LOWER || self.i != self.bytes.len() {
            return Err(StreamFault::FinalState {
                state: self.x,
                unread: self.bytes.len().saturating_sub(self.i),
            });
        }
        Ok(())
    }
}

/// The checks a stream passes before its first step (known table, at
/// least the 4 state bytes, state in `[2^23, 2^31)`); returns the state.
pub(crate) fn initial_state(table: usize, bytes: &[u8]) -> Result<u32, StreamFault> {
    Lane::new(table, bytes).map(|lane| lane.x)
}

/// Decodes one rANS stream with table `table` (`< 64`) into `out`
/// (`out.len()` = the stream's value count).
pub fn decode(table: usize, bytes: &[u8], out: &mut [u16]) -> Result<(), StreamFault> {
    decode_many([(table, bytes)], [out]).map_err(|(_, f)| f)
}

/// The reference procedure, step by step with every test; used to name the
/// exact fault of a stream that the fast path found invalid.
pub(crate) fn decode_careful(
    table: usize,
    bytes: &[u8],
    out: &mut [u16],
) -> Result<(), StreamFault> {
    let mut lane = Lane::new(table, bytes)?;
    lane.run(out)?;
    lane.finish()
}

/// Whether 8- and 16-lane groups run on SIMD lanes here (else they run on
/// scalar lanes, which gain nothing from more than 4).
pub(crate) fn simd_lanes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Zero bytes appended to each stream's copy so that the fast path can run
/// at least `PAD / 4` steps between end-of-buffer tests, however few bytes
/// a low-entropy stream consumes per step.
const PAD: usize = 256;

/// Decodes `N` rANS streams of equal value count in lockstep.
///
/// The `N` dependency chains overlap (see `Lockstep` below). A valid stream
/// never reads past its end, so reading into the padding means the stream
/// is invalid: then every lane is decoded again by the careful reference
/// procedure, which names the fault. On failure, the index of the
/// failing stream comes with the fault.
pub fn decode_many<const N: usize>(
    streams: [(usize, &[u8]); N],
    outs: [&mut [u16]; N],
) -> Result<(), (usize, StreamFault)> {
    let m = outs[0].len();
    assert!(
        outs.iter().all(|o| o.len() == m),
        "lockstep outputs differ in length"
    );
    let mut run = Lockstep::new(&streams)?;
    let mut outs = outs;
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    let mut tile: Vec<u16> = Vec::new();
    while done < m {
        let steps = run.safe_steps(m - done);
        if steps == 0 {
            break;
        }
        let range = done..done + steps;
        #[cfg(target_arch = "x86_64")]
        if run.simd() {
            simd::run::<N>(
                run.ks,
                &run.buf,
                &mut run.x,
                &mut run.pos,
                &mut outs,
                range,
                &mut tile,
            );
            done += steps;
            continue;
        }
        let Lockstep {
            tables,
            buf,
            x,
            pos,
            ..
        } = &mut run;
        if let Ok(four) = <&mut [&mut [u16]; 4]>::try_from(&mut outs[..]) {
            run4(tables, buf, x, pos, four, range);
        } else {
            // Indexing by lane keeps small N in registers once unrolled.
            #[allow(clippy::needless_range_loop)]
            for t in range {
                for j in 0..N {
                    let (y, i, v) = step(tables[j], buf, x[j], pos[j]);
                    x[j] = y;
                    pos[j] = i;
                    outs[j][t] = v;
                }
            }
        }
        done += steps;
    }
    if !run.clean(done, m) {
        #[cfg(test)]
        tests::FALLBACKS.with(|f| f.set(f.get() + 1));
        for (j, ((table, b), out)) in streams.into_iter().zip(outs.iter_mut()).enumerate() {
            decode_careful(table, b, out).map_err(|f| (j, f))?;
        }
    }
    Ok(())
}

/// Decodes `N` rANS streams of `m` values each in lockstep, as
/// [`decode_many`] does, but frame-major: value `t` of stream `j` goes to
/// `out[t * stride + j]`. This is the order of decoded frames, so a block
/// decoded this way needs no transposition; where the SIMD lanes run,
/// their rows are written there directly.
pub fn decode_many_rows<const N: usize>(
    streams: [(usize, &[u8]); N],
    m: usize,
    out: &mut [u16],
    stride: usize,
) -> Result<(), (usize, StreamFault)> {
    assert!(
        stride >= N && (m == 0 || (m - 1) * stride + N <= out.len()),
        "row output too small"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let mut run = Lockstep::new(&streams)?;
        if run.simd() {
            let mut done = 0;
            while done < m {
                let steps = run.safe_steps(m - done);
                if steps == 0 {
                    break;
                }
                let rows = &mut out[done * stride..];
                simd::run_rows::<N>(
                    run.ks,
                    &run.buf,
                    &mut run.x,
                    &mut run.pos,
                    rows,
                    stride,
                    steps,
                );
                done += steps;
            }
            if run.clean(done, m) {
                return Ok(());
            }
        }
    }
    // Without SIMD lanes, or to name the fault of an invalid stream:
    // stream by stream, then interleaved.
    let mut cols = vec![0u16; N * m];
    {
        let mut it = cols.chunks_exact_mut(m.max(1));
        let outs: [&mut [u16]; N] = std::array::from_fn(|_| match it.next() {
            Some(c) => &mut c[..m],
            None => &mut [],
        });
        decode_many(streams, outs)?;
    }
    for (j, col) in cols.chunks_exact(m.max(1)).enumerate().take(N) {
        for (t, &v) in col[..m].iter().enumerate() {
            out[t * stride + j] = v;
        }
    }
    Ok(())
}

/// `N` streams ready to be decoded in lockstep: each is copied into one
/// buffer with `PAD` zero bytes after it; the lanes' states live in local
/// arrays (registers once unrolled), so no step tests for the end of its
/// stream.
struct Lockstep<const N: usize> {
    ks: [usize; N],
    tables: [&'static SlotTable; N],
    buf: Vec<u8>,
    ends: [usize; N],
    x: [u32; N],
    pos: [usize; N],
}

impl<const N: usize> Lockstep<N> {
    fn new(streams: &[(usize, &[u8]); N]) -> Result<Self, (usize, StreamFault)> {
        let total: usize = streams.iter().map(|(_, b)| b.len() + PAD).sum();
        let mut run = Lockstep {
            ks: [0; N],
            tables: [slot_table(0); N],
            buf: Vec::with_capacity(total),
            ends: [0; N],
            x: [0; N],
            pos: [0; N],
        };
        for (j, &(table, b)) in streams.iter().enumerate() {
            let lane = Lane::new(table, b).map_err(|f| (j, f))?;
            run.ks[j] = table;
            run.tables[j] = lane.table;
            run.x[j] = lane.x;
            run.pos[j] = run.buf.len() + 4;
            run.buf.extend_from_slice(b);
            run.ends[j] = run.buf.len();
            run.buf.resize(run.buf.len() + PAD, 0);
        }
        Ok(run)
    }

    /// How many of the `left` steps every lane can take before the next
    /// end-of-buffer test: lane j's buffer ends PAD bytes after its stream;
    /// one step reads at most 4 bytes, and 12 more are kept for the SIMD
    /// path's prefetch of the coming renormalisation bytes.
    fn safe_steps(&self, left: usize) -> usize {
        (0..N).fold(left, |steps, j| {
            steps.min((self.ends[j] + PAD).saturating_sub(self.pos[j] + 12) / 4)
        })
    }

    /// Whether the lanes run in SIMD registers here.
    #[cfg(target_arch = "x86_64")]
    fn simd(&self) -> bool {
        (N == 8 || N == 16) && simd::available() && self.buf.len() <= i32::MAX as usize
    }

    /// Whether all `m` steps ran and every stream ended exactly (a valid
    /// stream never reads into its padding).
    fn clean(&self, done: usize, m: usize) -> bool {
        done == m && (0..N).all(|j| self.pos[j] == self.ends[j] && self.x[j] == STATE_LOWER)
    }
}

/// The lockstep loop for four lanes, written out so that the four states
/// and positions stay in registers (a loop over lanes kept them in memory).
#[inline(always)]
fn run4<const N: usize>(
    tables: &[&SlotTable; N],
    buf: &[u8],
    x: &mut [u32; N],
    pos: &mut [usize; N],
    outs: &mut [&mut [u16]; 4],
    range: std::ops::Range<usize>,
) {
    let [o0, o1, o2, o3] = outs;
    let (o0, o1, o2, o3) = (
        &mut o0[range.clone()],
        &mut o1[range.clone()],
        &mut o2[range.clone()],
        &mut o3[range],
    );
    let (t0, t1, t2, t3) = (tables[0], tables[1], tables[2], tables[3]);
    let (mut x0, mut x1, mut x2, mut x3) = (x[0], x[1], x[2], x[3]);
    let (mut p0, mut p1, mut p2, mut p3) = (pos[0], pos[1], pos[2], pos[3]);
    for (((v0, v1), v2), v3) in o0
        .iter_mut()
        .zip(o1.iter_mut())
        .zip(o2.iter_mut())
        .zip(o3.iter_mut())
    {
        let (a, i, v) = step(t0, buf, x0, p0);
        (x0, p0, *v0) = (a, i, v);
        let (a, i, v) = step(t1, buf, x1, p1);
        (x1, p1, *v1) = (a, i, v);
        let (a, i, v) = step(t2, buf, x2, p2);
        (x2, p2, *v2) = (a, i, v);
        let (a, i, v) = step(t3, buf, x3, p3);
        (x3, p3, *v3) = (a, i, v);
    }
    (x[0], x[1], x[2], x[3]) = (x0, x1, x2, x3);
    (pos[0], pos[1], pos[2], pos[3]) = (p0, p1, p2, p3);
}

/// Eight or sixteen lanes in the 32-bit slots of one or two AVX2
/// registers: table entries (for symbols above 1) and the stream bytes are
/// fetched with gathers, so a step of all lanes costs about as much as one
/// scalar step. Same arithmetic as [`step`]; escapes (rare) are finished in
/// scalar code.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{all_slot_tables, ESCAPE, FREQUENCIES, SCALE_BITS, SLOTS, SLOT_MASK, STATE_LOWER};

    /// AVX2 and wider: the library's vector width
    /// ([`crate::qem::lanes::width`]).
    pub fn available() -> bool {
        crate::qem::lanes::width() >= crate::qem::lanes::Width::Avx2
    }

    /// Runs the steps `range` as [`run_rows`] does, the values going to
    /// `outs[j][range]` through the row-major `tile`.
    pub fn run<const L: usize>(
        ks: [usize; L],
        buf: &[u8],
        x: &mut [u32; L],
        pos: &mut [usize; L],
        outs: &mut [&mut [u16]; L],
        range: Range<usize>,
        tile: &mut Vec<u16>,
    ) {
        let n = range.len();
        assert!(outs.iter().all(|o| o.len() >= range.end));
        tile.clear();
        tile.resize(L * n, 0);
        run_rows::<L>(ks, buf, x, pos, tile, L, n);
        transpose_out::<L>(tile, outs, range);
    }

    /// Runs `n` steps of `L` lanes (8 or 16), writing the values of step t
    /// to `rows[t * stride..][..L]`. Every lane must have at least
    /// `4 * n + 12` bytes of `buf` from `pos[j]` on (one step consumes at
    /// most 4, and a 12-byte window is prefetched), tables `ks[j] < 64`,
    /// and `buf.len() <= i32::MAX` (all asserted).
    pub fn run_rows<const L: usize>(
        ks: [usize; L],
        buf: &[u8],
        x: &mut [u32; L],
        pos: &mut [usize; L],
        rows: &mut [u16],
        stride: usize,
        n: usize,
    ) {
        assert!(L == 8 || L == 16);
        assert!(available() && buf.len() <= i32::MAX as usize);
        for j in 0..L {
            assert!(ks[j] < super::TABLES && pos[j] + 4 * n + 12 <= buf.len());
        }
        // SAFETY: AVX2 is present and the asserts above are the bounds
        // `kernel` relies on; the rows are bound-checked slices.
        unsafe { kernel::<L>(&ks, buf, x, pos, rows, stride, n) };
    }

    /// Writes the row-major `tile` (one row of `L` lane values per step)
    /// into the lanes' outputs at `range`: 8×8 blocks are transposed in
    /// SSE2 registers (24 shuffles for 64 values instead of 64 scalar
    /// loads and stores), each column stored as one 16-byte write, and the
    /// last `range.len() % 8` rows are copied one by one.
    fn transpose_out<const L: usize>(
        tile: &[u16],
        outs: &mut [&mut [u16]; L],
        range: Range<usize>,
    ) {
        let n = range.len();
        assert!(tile.len() == L * n && L.is_multiple_of(8));
        let full = n - n % 8;
        for g in 0..L / 8 {
            for t in (0..full).step_by(8) {
                // SAFETY: SSE2 is part of x86_64. Row t + i of the tile
                // starts at (t + i) * L, and lanes 8g..8g + 8 lie within
                // it (t + 8 <= n, asserted tile length); each output
                // store writes outs[8g + j][range.start + t..][..8],
                // inside the output since t + 8 <= n and
                // range.end <= len (asserted by `run`).
                unsafe {
                    let row = |i: usize| {
                        _mm_loadu_si128(tile.as_ptr().add((t + i) * L + 8 * g) as *const __m128i)
                    };
                    let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                    let (r4, r5, r6, r7) = (row(4), row(5), row(6), row(7));
                    let t0 = _mm_unpacklo_epi16(r0, r1);
                    let t1 = _mm_unpackhi_epi16(r0, r1);
                    let t2 = _mm_unpacklo_epi16(r2, r3);
                    let t3 = _mm_unpackhi_epi16(r2, r3);
                    let t4 = _mm_unpacklo_epi16(r4, r5);
                    let t5 = _mm_unpackhi_epi16(r4, r5);
                    let t6 = _mm_unpacklo_epi16(r6, r7);
                    let t7 = _mm_unpackhi_epi16(r6, r7);
                    // u_k holds lanes 2k and 2k + 1 of rows 0..4 (low
                    // half of the final columns) or of rows 4..8.
                    let u0 = _mm_unpacklo_epi32(t0, t2);
                    let u1 = _mm_unpackhi_epi32(t0, t2);
                    let u2 = _mm_unpacklo_epi32(t1, t3);
                    let u3 = _mm_unpackhi_epi32(t1, t3);
                    let u4 = _mm_unpacklo_epi32(t4, t6);
                    let u5 = _mm_unpackhi_epi32(t4, t6);
                    let u6 = _mm_unpacklo_epi32(t5, t7);
                    let u7 = _mm_unpackhi_epi32(t5, t7);
                    let cols = [
                        _mm_unpacklo_epi64(u0, u4),
                        _mm_unpackhi_epi64(u0, u4),
                        _mm_unpacklo_epi64(u1, u5),
                        _mm_unpackhi_epi64(u1, u5),
                        _mm_unpacklo_epi64(u2, u6),
                        _mm_unpackhi_epi64(u2, u6),
                        _mm_unpacklo_epi64(u3, u7),
                        _mm_unpackhi_epi64(u3, u7),
                    ];
                    for (j, c) in cols.into_iter().enumerate() {
                        let out = &mut outs[8 * g + j][range.start + t..range.start + t + 8];
                        _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, c);
                    }
                }
            }
        }
        for (j, out) in outs.iter_mut().enumerate() {
            for (o, row) in out[range.start + full..range.end]
                .iter_mut()
                .zip(tile[full * L..].chunks_exact(L))
            {
                *o = row[j];
            }
        }
    }

    /// # Safety
    /// AVX2 must be available; `L` is 8 or 16; `ks[j] < 64`;
    /// `buf.len() <= i32::MAX`; `pos[j] + 4 * n + 12 <= buf.len()` for
    /// every lane. The values of step t go to `rows[t * stride..][..L]`
    /// (a bound-checked slice).
    #[target_feature(enable = "avx2")]
    unsafe fn kernel<const L: usize>(
        ks: &[usize; L],
        buf: &[u8],
        x: &mut [u32; L],
        pos: &mut [usize; L],
        rows: &mut [u16],
        stride: usize,
        n: usize,
    ) {
        const MAXV: usize = 2;
        let nv = L / 8;
        let table = all_slot_tables().as_ptr() as *const i32;
        let bytes = buf.as_ptr() as *const i32;
        let mut lanes = [0i32; 16];
        for (l, &k) in lanes.iter_mut().zip(ks.iter()) {
            *l = (k * SLOTS) as i32;
        }
        let mut base = [_mm256_setzero_si256(); MAXV];
        let mut vx = [_mm256_setzero_si256(); MAXV];
        let mut vp = [_mm256_setzero_si256(); MAXV];
        for v in 0..nv {
            base[v] = _mm256_loadu_si256(lanes[8 * v..].as_ptr() as *const __m256i);
            vx[v] = _mm256_loadu_si256(x[8 * v..].as_ptr() as *const __m256i);
        }
        for (l, &p) in lanes.iter_mut().zip(pos.iter()) {
            *l = p as i32;
        }
        for v in 0..nv {
            vp[v] = _mm256_loadu_si256(lanes[8 * v..].as_ptr() as *const __m256i);
        }
        // Per lane: start of symbol 1 (= freq of 0), its frequency, and the
        // start of symbol 2, minus one for `>=` compares.
        let mut c1 = [_mm256_setzero_si256(); MAXV];
        let mut c1m1 = [_mm256_setzero_si256(); MAXV];
        let mut c2m1 = [_mm256_setzero_si256(); MAXV];
        let mut f0 = [_mm256_setzero_si256(); MAXV];
        let mut f1 = [_mm256_setzero_si256(); MAXV];
        for v in 0..nv {
            let lane = |j: usize, f: fn(usize) -> i32| f(ks[8 * v + j]);
            let vec = |f: fn(usize) -> i32| {
                _mm256_setr_epi32(
                    lane(0, f),
                    lane(1, f),
                    lane(2, f),
                    lane(3, f),
                    lane(4, f),
                    lane(5, f),
                    lane(6, f),
                    lane(7, f),
                )
            };
            f0[v] = vec(|k| i32::from(FREQUENCIES[k][0]));
            f1[v] = vec(|k| i32::from(FREQUENCIES[k][1]));
            c1[v] = f0[v];
            c1m1[v] = vec(|k| i32::from(FREQUENCIES[k][0]) - 1);
            c2m1[v] = vec(|k| i32::from(FREQUENCIES[k][0] + FREQUENCIES[k][1]) - 1);
        }
        let mask = _mm256_set1_epi32(SLOT_MASK as i32);
        let lower = _mm256_set1_epi32(STATE_LOWER as i32);
        let lower2 = _mm256_set1_epi32(1 << 15);
        let c32 = _mm256_set1_epi32(32);
        let sym_mask = _mm256_set1_epi32(63);
        let escape = _mm256_set1_epi32(ESCAPE as i32);
        let bswap = _mm256_setr_epi8(
            3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10,
            9, 8, 15, 14, 13, 12,
        );
        // Each lane's next bytes, big-endian, in a 12-byte window of
        // three words a, b, c: a holds the renormalisation bytes of the
        // coming step, and a step shifts its n bytes out of the window.
        // The window is refilled by three gathers only once some lane has
        // used more than 8 of its bytes (so a keeps at least 4 valid):
        // at low dose a lane renormalises every few dozen steps, so the
        // gathers, slow and otherwise on the state's dependency chain,
        // leave the common step.
        // SAFETY: every fetch reads 4 bytes at a lane's position plus at
        // most 8, after k of the n steps (k <= n): at most pos + 4k + 12
        // <= pos + 4n + 12 <= buf.len() (asserted by `run`), as a step
        // advances by at most 4.
        let fetch = |p: __m256i| _mm256_shuffle_epi8(_mm256_i32gather_epi32::<1>(bytes, p), bswap);
        let c4 = _mm256_set1_epi32(4);
        let c8 = _mm256_set1_epi32(8);
        let refill = |p: __m256i| {
            let limit = _mm256_add_epi32(p, c8);
            (
                fetch(p),
                fetch(_mm256_add_epi32(p, c4)),
                fetch(limit),
                limit,
            )
        };
        let mut wa = [_mm256_setzero_si256(); MAXV];
        let mut wb = [_mm256_setzero_si256(); MAXV];
        let mut wc = [_mm256_setzero_si256(); MAXV];
        let mut limit = [_mm256_setzero_si256(); MAXV];
        for v in 0..nv {
            (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
        }
        // Each step handles every register of lanes at once, with one
        // branch per decision for all of them, so that with 16 lanes two
        // independent dependency chains are in flight between branches.
        let mut y = [_mm256_setzero_si256(); MAXV];
        let mut vals = [_mm256_setzero_si256(); MAXV];
        for t in 0..n {
            let row = &mut rows[t * stride..t * stride + L];
            let mut slot = [_mm256_setzero_si256(); MAXV];
            let mut hi = [_mm256_setzero_si256(); MAXV];
            let mut any_ge2 = _mm256_setzero_si256();
            for v in 0..nv {
                slot[v] = _mm256_and_si256(vx[v], mask);
                hi[v] = _mm256_srli_epi32::<{ SCALE_BITS as i32 }>(vx[v]);
                any_ge2 = _mm256_or_si256(any_ge2, _mm256_cmpgt_epi32(slot[v], c2m1[v]));
            }
            // Only a table lookup can yield the escape symbol.
            let mut any_esc = _mm256_setzero_si256();
            if _mm256_testz_si256(any_ge2, any_ge2) != 0 {
                // Every lane's symbol is 0 or 1 (the common case at low
                // dose): the frequency and start come from two per-lane
                // constants, without a table load.
                for v in 0..nv {
                    let ge1 = _mm256_cmpgt_epi32(slot[v], c1m1[v]);
                    let f = _mm256_blendv_epi8(f0[v], f1[v], ge1);
                    y[v] = _mm256_add_epi32(
                        _mm256_mullo_epi32(f, hi[v]),
                        _mm256_sub_epi32(slot[v], _mm256_and_si256(ge1, c1[v])),
                    );
                    vals[v] = _mm256_srli_epi32::<31>(ge1);
                }
            } else {
                for v in 0..nv {
                    // SAFETY: base + slot <= 63 * 1024 + 1023 < 64 * 1024
                    // entries.
                    let e = _mm256_i32gather_epi32::<4>(table, _mm256_add_epi32(base[v], slot[v]));
                    let f = _mm256_srli_epi32::<16>(e);
                    y[v] =
                        _mm256_add_epi32(_mm256_mullo_epi32(f, hi[v]), _mm256_and_si256(e, mask));
                    vals[v] = _mm256_and_si256(_mm256_srli_epi32::<10>(e), sym_mask);
                    any_esc = _mm256_or_si256(any_esc, _mm256_cmpeq_epi32(vals[v], escape));
                }
            }
            let mut any_spent = _mm256_setzero_si256();
            for v in 0..nv {
                // y < 2^31, so signed compares are exact; n = bytes to
                // shift in (0, 1 or 2).
                let n = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_add_epi32(
                        _mm256_cmpgt_epi32(lower, y[v]),
                        _mm256_cmpgt_epi32(lower2, y[v]),
                    ),
                );
                let sh = _mm256_slli_epi32::<3>(n);
                let rsh = _mm256_sub_epi32(c32, sh);
                // Branch-free (some lane renormalises at most steps):
                // shifts by 32 give 0 in AVX2, as wanted when n = 0.
                let shift_in = |hi: __m256i, lo: __m256i| {
                    _mm256_or_si256(_mm256_sllv_epi32(hi, sh), _mm256_srlv_epi32(lo, rsh))
                };
                vx[v] = shift_in(y[v], wa[v]);
                wa[v] = shift_in(wa[v], wb[v]);
                wb[v] = shift_in(wb[v], wc[v]);
                wc[v] = _mm256_sllv_epi32(wc[v], sh);
                vp[v] = _mm256_add_epi32(vp[v], n);
                any_spent = _mm256_or_si256(any_spent, _mm256_cmpgt_epi32(vp[v], limit[v]));
            }
            if _mm256_testz_si256(any_spent, any_spent) == 0 {
                for v in 0..nv {
                    (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
                }
            }
            if _mm256_testz_si256(any_esc, any_esc) == 0 {
                for v in 0..nv {
                    let esc = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(
                        vals[v], escape,
                    )));
                    if esc == 0 {
                        continue;
                    }
                    let mut val = [0i32; 8];
                    let mut at = [0i32; 8];
                    _mm256_storeu_si256(val.as_mut_ptr() as *mut __m256i, vals[v]);
                    _mm256_storeu_si256(at.as_mut_ptr() as *mut __m256i, vp[v]);
                    for j in 0..8 {
                        if esc & (1 << j) != 0 {
                            let p = at[j] as usize;
                            val[j] = i32::from(u16::from_le_bytes([buf[p], buf[p + 1]]));
                            at[j] += 2;
                        }
                    }
                    vals[v] = _mm256_loadu_si256(val.as_ptr() as *const __m256i);
                    vp[v] = _mm256_loadu_si256(at.as_ptr() as *const __m256i);
                    (wa[v], wb[v], wc[v], limit[v]) = refill(vp[v]);
                }
            }
            if nv == 2 {
                // Values are below 2^16: one pack gives the 16 lanes as
                // quarters (0-3, 8-11, 4-7, 12-15), put in order by one
                // permutation, and one store.
                let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(
                    vals[0], vals[1],
                ));
                _mm256_storeu_si256(row[..16].as_mut_ptr() as *mut __m256i, packed);
            } else {
                let packed =
                    _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(vals[0], vals[0]));
                _mm_storeu_si128(
                    row[..8].as_mut_ptr() as *mut __m128i,
                    _mm256_castsi256_si128(packed),
                );
            }
        }
        for v in 0..nv {
            _mm256_storeu_si256(x[8 * v..].as_mut_ptr() as *mut __m256i, vx[v]);
            _mm256_storeu_si256(lanes[8 * v..].as_mut_ptr() as *mut __m256i, vp[v]);
        }
        for (p, &l) in pos.iter_mut().zip(lanes.iter()) {
            *p = l as usize;
        }
    }
}

/// Encoder of §7.1, used by the decoders' tests to make streams (the
/// writer has its own, in `qem::write::rans`; benchmarks take their streams
/// from files the writer made).
#[cfg(test)]
pub(crate) fn encode(table: usize, values: &[u16]) -> Vec<u8> {
    use super::tables::SYMBOLS;
    let freq = &FREQUENCIES[table];
    let mut start = [0u32; SYMBOLS];
    let mut acc = 0u32;
    for s in 0..SYMBOLS {
        start[s] = acc;
        acc += u32::from(freq[s]);
    }
    let mut x: u32 = STATE_LOWER;
    let mut out = Vec::with_capacity(values.len() + 8);
    for &v in values.iter().rev() {
        let s = usize::from(v.min(ESCAPE as u16));
        if s == ESCAPE {
            out.push((v >> 8) as u8);
            out.push(v as u8);
        }
        let f = u32::from(freq[s]);
        while x >= f << 21 {
            out.push(x as u8);
            x >>= 8;
        }
        x = ((x / f) << SCALE_BITS) + (x % f) + start[s];
    }
    let mut stream = x.to_le_bytes().to_vec();
    stream.extend(out.iter().rev());
    stream
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    thread_local! {
        /// Times `decode_many` fell back to the careful decoder.
        pub(super) static FALLBACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Marsaglia's xorshift64 from `seed`: a seeded stream of test values
    /// for these tests and the stream decoder's.
    pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn spec_vectors() {
        let mut out = [0u16; 8];
        decode(40, &unhex("f2441575ff382800"), &mut out).unwrap();
        assert_eq!(out, [0, 3, 1, 0, 40, 2, 0, 0]);
        let mut out = [0u16; 4];
        decode(63, &unhex("6aca051fe80300e0ffff"), &mut out).unwrap();
        assert_eq!(out, [1000, 2, 0, 65535]);
        assert_eq!(
            encode(40, &[0, 3, 1, 0, 40, 2, 0, 0]),
            unhex("f2441575ff382800")
        );
        assert_eq!(
            encode(63, &[1000, 2, 0, 65535]),
            unhex("6aca051fe80300e0ffff")
        );
    }

    #[test]
    fn faults() {
        let good = unhex("6aca051fe80300e0ffff");
        let mut out = [0u16; 4];
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(
            decode(63, &trailing, &mut out),
            Err(StreamFault::FinalState { unread: 1, .. })
        ));
        assert!(matches!(
            decode(63, &good[..good.len() - 1], &mut out),
            Err(StreamFault::TruncatedEscape | StreamFault::Truncated)
        ));
        assert!(matches!(
            decode(63, &[0, 0, 0x7f, 0], &mut out),
            Err(StreamFault::InitialState(_))
        ));
        assert!(matches!(
            decode(63, &[0, 0, 0, 0x80], &mut out),
            Err(StreamFault::InitialState(_))
        ));
        assert!(matches!(
            decode(63, &[0, 0, 0x80], &mut out),
            Err(StreamFault::Length { .. })
        ));
        assert!(matches!(
            decode(64, &good, &mut out),
            Err(StreamFault::UnknownSelector(64))
        ));
    }

    #[test]
    fn fast_path_agrees_with_the_reference_procedure_on_damaged_streams() {
        let mut rnd = xorshift(0x9abc_def0);
        for round in 0..2000 {
            let m = 1 + (rnd() % 300) as usize;
            let v: Vec<u16> = (0..m)
                .map(|_| match rnd() % 30 {
                    0 => (rnd() % 65536) as u16,
                    1..=4 => (rnd() % 40) as u16,
                    _ => (rnd() % 2) as u16,
                })
                .collect();
            let table = round % 64;
            let mut bytes = encode(table, &v);
            match rnd() % 4 {
                0 => {
                    let k = (rnd() as usize) % bytes.len();
                    bytes[k] ^= 1 << (rnd() % 8);
                }
                1 => {
                    bytes.truncate((rnd() as usize) % bytes.len());
                }
                2 => bytes.push(rnd() as u8),
                _ => {}
            }
            let (mut fast, mut careful) = (vec![0u16; m], vec![0u16; m]);
            let a = decode(table, &bytes, &mut fast);
            let b = decode_careful(table, &bytes, &mut careful);
            assert_eq!(a, b, "round {round}");
            if a.is_ok() {
                assert_eq!(fast, careful);
            }
        }
    }

    #[test]
    fn lockstep_matches_single() {
        let mut rnd = xorshift(0x1234_5678);
        for round in 0..50 {
            let m = 1 + (rnd() % 600) as usize;
            let mut data = Vec::new();
            let mut enc = Vec::new();
            for j in 0..4 {
                let v: Vec<u16> = (0..m)
                    .map(|_| match rnd() % 20 {
                        0 => (rnd() % 65536) as u16,
                        1..=5 => (rnd() % 40) as u16,
                        _ => (rnd() % 3) as u16,
                    })
                    .collect();
                let table = ((round * 7 + j * 13) % 64) as usize;
                enc.push((table, encode(table, &v)));
                data.push(v);
            }
            let mut outs = vec![vec![0u16; m]; 4];
            let [a, b, c, d] = &mut outs[..] else {
                unreachable!()
            };
            decode_many(
                [
                    (enc[0].0, &enc[0].1[..]),
                    (enc[1].0, &enc[1].1[..]),
                    (enc[2].0, &enc[2].1[..]),
                    (enc[3].0, &enc[3].1[..]),
                ],
                [a, b, c, d],
            )
            .unwrap();
            assert_eq!(outs, data);
            for (j, (t, e)) in enc.iter().enumerate() {
                let mut one = vec![0u16; m];
                decode(*t, e, &mut one).unwrap();
                assert_eq!(one, data[j]);
            }
        }
    }

    /// The spec's decoder pseudo-code, literally (§7.1), with a linear
    /// symbol search: the reference the fast paths (here and the lane
    /// kernels of `frame_major`) are held to.
    pub(crate) fn reference(table: usize, b: &[u8], m: usize) -> Result<Vec<u16>, ()> {
        if table >= TABLES || b.len() < 4 {
            return Err(());
        }
        let freq = &FREQUENCIES[table];
        let mut x = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if !(STATE_LOWER..STATE_UPPER).contains(&x) {
            return Err(());
        }
        let mut i = 4;
        let mut out = Vec::with_capacity(m);
        for _ in 0..m {
            let slot = x & 1023;
            let (mut s, mut start) = (0usize, 0u32);
            while start + u32::from(freq[s]) <= slot {
                start += u32::from(freq[s]);
                s += 1;
            }
            x = u32::from(freq[s]) * (x >> 10) + slot - start;
            while x < STATE_LOWER {
                x = (x << 8) | u32::from(*b.get(i).ok_or(())?);
                i += 1;
            }
            if s == ESCAPE {
                let w = b.get(i..i + 2).ok_or(())?;
                out.push(u16::from_le_bytes([w[0], w[1]]));
                i += 2;
            } else {
                out.push(s as u16);
            }
        }
        if x != STATE_LOWER || i != b.len() {
            return Err(());
        }
        Ok(out)
    }

    /// Values of a stream: mostly 0 and 1, some small, a few escapes.
    fn values(m: usize) -> impl proptest::strategy::Strategy<Value = Vec<u16>> {
        use proptest::prelude::*;
        proptest::collection::vec(
            prop_oneof![
                12 => 0u16..2,
                4 => 0u16..40,
                1 => any::<u16>(),
            ],
            m,
        )
    }

    /// One stream: table, values, and a damage (none, bit flip, cut,
    /// extra byte) applied to its encoding.
    fn lane_case() -> impl proptest::strategy::Strategy<Value = (usize, u8, u32, u8)> {
        use proptest::prelude::*;
        (0usize..TABLES, 0u8..8, any::<u32>(), any::<u8>())
    }

    fn damage(bytes: &mut Vec<u8>, kind: u8, at: u32, byte: u8) {
        let at = at as usize;
        match kind {
            0 if !bytes.is_empty() => {
                let k = at % bytes.len();
                bytes[k] ^= 1 << (byte % 8);
            }
            1 => bytes.truncate(at % (bytes.len() + 1)),
            2 => bytes.push(byte),
            3 => bytes.insert(at % (bytes.len() + 1), byte),
            _ => {}
        }
    }

    fn check_lockstep<const N: usize>(
        m: usize,
        cases: &[(usize, u8, u32, u8)],
        vals: &[Vec<u16>],
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        use proptest::prelude::*;
        let mut enc = Vec::new();
        for (j, &(table, kind, at, byte)) in cases.iter().take(N).enumerate() {
            let mut bytes = encode(table, &vals[j][..m]);
            damage(&mut bytes, kind, at, byte);
            enc.push((table, bytes));
        }
        let mut outs = vec![vec![0u16; m]; N];
        let ins: [(usize, &[u8]); N] = std::array::from_fn(|j| (enc[j].0, &enc[j].1[..]));
        let before = FALLBACKS.with(|f| f.get());
        let got = {
            let mut it = outs.iter_mut();
            let o: [&mut [u16]; N] = std::array::from_fn(|_| &mut it.next().unwrap()[..]);
            decode_many(ins, o)
        };
        let want: Vec<_> = enc.iter().map(|(t, b)| reference(*t, b, m)).collect();
        if want.iter().all(|w| w.is_ok()) {
            // Valid streams are decoded by the fast path alone: its
            // values, not the fallback's, are the ones checked.
            prop_assert_eq!(FALLBACKS.with(|f| f.get()), before);
        }
        match got {
            Ok(()) =>
            {
                #[allow(clippy::needless_range_loop)]
                for j in 0..N {
                    prop_assert_eq!(&want[j], &Ok(outs[j].clone()), "lane {}", j);
                }
            }
            Err((j, fault)) => {
                // A failing lane is named, with the careful decoder's
                // fault, and at least that lane is invalid.
                prop_assert!(want[j].is_err(), "lane {} refused: {:?}", j, fault);
                let mut one = vec![0u16; m];
                prop_assert_eq!(decode_careful(enc[j].0, &enc[j].1, &mut one), Err(fault));
            }
        }
        // Frame-major output, with a stride wider than the group: the same
        // values, interleaved, or the same refusal.
        let stride = N + 3;
        let mut rows = vec![u16::MAX; m * stride];
        let ins: [(usize, &[u8]); N] = std::array::from_fn(|j| (enc[j].0, &enc[j].1[..]));
        match (decode_many_rows(ins, m, &mut rows, stride), &got) {
            (Ok(()), Ok(())) => {
                for t in 0..m {
                    let want_row: Vec<u16> = (0..N).map(|j| outs[j][t]).collect();
                    prop_assert_eq!(&rows[t * stride..t * stride + N], &want_row[..]);
                    prop_assert!(rows[t * stride + N..(t + 1) * stride]
                        .iter()
                        .all(|&v| v == u16::MAX));
                }
            }
            (Err(a), Err(b)) => prop_assert_eq!(&a, b),
            (a, b) => prop_assert!(false, "rows {:?} vs columns {:?}", a, b),
        }
        // One stream at a time agrees too.
        for (j, (t, b)) in enc.iter().enumerate() {
            let mut one = vec![0u16; m];
            let r = decode(*t, b, &mut one);
            prop_assert_eq!(r.is_ok(), want[j].is_ok());
            if r.is_ok() {
                prop_assert_eq!(&want[j], &Ok(one));
            }
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 300, ..proptest::prelude::ProptestConfig::default()
        })]

        /// Fast decoders (1, 4, 8 and 16 lanes; AVX2 where present) equal
        /// the spec's pseudo-code on valid and damaged streams of every
        /// table: same values, or a refusal where the reference refuses.
        #[test]
        fn fast_decoders_equal_the_reference(
            m in 1usize..=512,
            cases in proptest::collection::vec(lane_case(), 16),
            vals in proptest::collection::vec(values(512), 16),
            damaged in proptest::bool::ANY,
        ) {
            let mut cases = cases;
            if !damaged {
                for c in &mut cases {
                    c.1 = 7;
                }
            }
            check_lockstep::<1>(m, &cases, &vals)?;
            check_lockstep::<4>(m, &cases, &vals)?;
            check_lockstep::<8>(m, &cases, &vals)?;
            check_lockstep::<16>(m, &cases, &vals)?;
        }
    }
}
