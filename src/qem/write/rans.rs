//! rANS encoder of the count streams (spec §7.1).
//!
//! The coder state lives in `[2^23, 2^31)` and is renormalised byte-wise. The
//! encoder walks the values backwards and emits bytes backwards, so the
//! output is built from the end of a scratch buffer and copied out once.

use std::sync::OnceLock;

use crate::qem::tables::{ESCAPE, FREQUENCIES, SCALE_BITS, START, STATE_LOWER, SYMBOLS, TABLES};

/// Most bytes one value can produce: two renormalisation bytes (frequency 1
/// needs the state below 2^21) plus a two-byte escape word.
const MAX_BYTES_PER_VALUE: usize = 4;

/// Shift of the fixed-point reciprocals.
const RECIPROCAL_SHIFT: u32 = 41;

/// Per-symbol encoder constants: the division by the frequency is done as a
/// multiplication by a rounded-up reciprocal, because a hardware division
/// per value would dominate the encoder's time. With `r = ceil(2^41 / f)`,
/// `r·f = 2^41 + e` with `e < f ≤ 2^10`, so for a state `x < 2^31` the error
/// `x·e / 2^41` stays below 1 part in `f` and `floor(x·r / 2^41) = floor(x / f)`.
#[derive(Clone, Copy, Default)]
struct Symbol {
    reciprocal: u64,
    freq: u32,
    start: u32,
    /// States at or above this must shed a byte before coding the symbol.
    x_max: u32,
}

fn symbols() -> &'static [[Symbol; SYMBOLS]; TABLES] {
    static SYMS: OnceLock<[[Symbol; SYMBOLS]; TABLES]> = OnceLock::new();
    SYMS.get_or_init(|| {
        let mut t = [[Symbol::default(); SYMBOLS]; TABLES];
        for (k, row) in t.iter_mut().enumerate() {
            for (s, sym) in row.iter_mut().enumerate() {
                let f = u32::from(FREQUENCIES[k][s]);
                *sym = Symbol {
                    reciprocal: (1u64 << RECIPROCAL_SHIFT).div_ceil(u64::from(f)),
                    freq: f,
                    start: u32::from(START[k][s]),
                    // (L >> SCALE_BITS) << 8 = 2^21: past this bound one step would leave the state range.
                    x_max: f << (23 - SCALE_BITS + 8),
                };
            }
        }
        t
    })
}

/// Reusable buffer for the backwards-built stream.
#[derive(Default)]
pub(crate) struct Scratch {
    buf: Vec<u8>,
}

/// One encoder state writing backwards into a scratch buffer.
struct Lane<'a> {
    syms: &'a [Symbol; SYMBOLS],
    buf: &'a mut [u8],
    pos: usize,
    x: u32,
}

impl<'a> Lane<'a> {
    fn new(table: usize, m: usize, scratch: &'a mut Scratch) -> Lane<'a> {
        // Two spare bytes in front let renormalisation store both of its
        // possible bytes unconditionally.
        let need = 2 + m * MAX_BYTES_PER_VALUE;
        if scratch.buf.len() < need {
            scratch.buf.resize(need, 0);
        }
        Lane {
            syms: &symbols()[table],
            buf: &mut scratch.buf[..need],
            pos: need,
            x: STATE_LOWER,
        }
    }

    #[inline(always)]
    fn put(&mut self, v: u16) {
        let s = usize::from(v).min(ESCAPE);
        if s == ESCAPE {
            // Built backwards: the high byte lands after the low byte.
            self.pos -= 2;
            self.buf[self.pos] = v as u8;
            self.buf[self.pos + 1] = (v >> 8) as u8;
        }
        let sym = &self.syms[s];
        // At most two bytes leave (x < 2^31, x_max ≥ 2^21); counting them
        // instead of looping avoids a badly predicted branch.
        let x = self.x;
        let x_max = u64::from(sym.x_max);
        let n = usize::from(u64::from(x) >= x_max) + usize::from(u64::from(x) >= x_max << 8);
        self.buf[self.pos - 1] = x as u8;
        self.buf[self.pos - 2] = (x >> 8) as u8;
        self.pos -= n;
        let x = x >> (8 * n);
        let q = ((u128::from(x) * u128::from(sym.reciprocal)) >> RECIPROCAL_SHIFT) as u32;
        self.x = (q << SCALE_BITS) + (x - q * sym.freq) + sym.start;
    }

    fn finish(self, out: &mut Vec<u8>) -> usize {
        let before = out.len();
        out.extend_from_slice(&self.x.to_le_bytes());
        out.extend_from_slice(&self.buf[self.pos..]);
        out.len() - before
    }
}

/// Appends the rANS stream of `values` coded with table `table` to `out`;
/// returns the number of bytes appended.
pub(crate) fn encode(
    values: &[u16],
    table: usize,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> usize {
    let mut lane = Lane::new(table, values.len(), scratch);
    for &v in values.iter().rev() {
        lane.put(v);
    }
    lane.finish(out)
}

/// Several trials, each `(values, table)` into the matching scratch and
/// output slot (cleared first). Trials run in pairs: the two coder states
/// form independent dependency chains that the CPU overlaps, so a pair
/// costs little more than one. Paired `values` must have one length.
pub(crate) fn encode_interleaved(
    jobs: &[(&[u16], usize)],
    scratch: &mut [Scratch],
    outs: &mut [Vec<u8>],
) {
    // Up to four at a time, as locals the compiler keeps in registers; a loop
    // over a slice of lanes would keep the states in memory, on the critical path.
    let mut slots = scratch.iter_mut().zip(outs.iter_mut());
    let mut rest = jobs;
    while !rest.is_empty() {
        let take = match rest.len() {
            1 => 1,
            2 | 3 => 2,
            _ => 4,
        };
        let (now, later) = rest.split_at(take);
        rest = later;
        if let [(values, k)] = *now {
            let Some((s, o)) = slots.next() else { return };
            o.clear();
            encode(values, k, s, o);
            continue;
        }
        let m = now.iter().map(|j| j.0.len()).min().unwrap_or(0);
        let mut lanes = Vec::with_capacity(4);
        let mut targets = Vec::with_capacity(4);
        for &(values, k) in now {
            let Some((s, o)) = slots.next() else { return };
            lanes.push((Lane::new(k, m, s), &values[..m]));
            targets.push(o);
        }
        let done = match lanes.len() {
            4 => {
                let mut it = lanes.into_iter();
                let (Some((a, va)), Some((b, vb)), Some((c, vc)), Some((d, vd))) =
                    (it.next(), it.next(), it.next(), it.next())
                else {
                    return;
                };
                let (a, b, c, d) = run4([a, b, c, d], [va, vb, vc, vd]);
                vec![a, b, c, d]
            }
            2 => {
                let mut it = lanes.into_iter();
                let (Some((mut a, va)), Some((mut b, vb))) = (it.next(), it.next()) else {
                    return;
                };
                for (&x, &y) in va.iter().rev().zip(vb.iter().rev()) {
                    a.put(x);
                    b.put(y);
                }
                vec![a, b]
            }
            _ => lanes
                .into_iter()
                .map(|(mut a, va)| {
                    for &x in va.iter().rev() {
                        a.put(x);
                    }
                    a
                })
                .collect(),
        };
        for (lane, out) in done.into_iter().zip(targets) {
            out.clear();
            lane.finish(out);
        }
    }
}

fn run4<'a>(lanes: [Lane<'a>; 4], values: [&[u16]; 4]) -> (Lane<'a>, Lane<'a>, Lane<'a>, Lane<'a>) {
    let [mut a, mut b, mut c, mut d] = lanes;
    let [va, vb, vc, vd] = values;
    let m = va.len().min(vb.len()).min(vc.len()).min(vd.len());
    for i in (0..m).rev() {
        a.put(va[i]);
        b.put(vb[i]);
        c.put(vc[i]);
        d.put(vd[i]);
    }
    (a, b, c, d)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::qem::checksum::hex;

    /// Independent decoder of §7.1, used to check that the encoder is its inverse.
    pub(crate) fn decode(bytes: &[u8], table: usize, m: usize) -> Option<Vec<u16>> {
        let freq = &FREQUENCIES[table];
        let start = &START[table];
        if bytes.len() < 4 {
            return None;
        }
        let mut x = u32::from_le_bytes(bytes[..4].try_into().ok()?);
        if !(STATE_LOWER..1 << 31).contains(&x) {
            return None;
        }
        let mut i = 4;
        let mut out = Vec::with_capacity(m);
        for _ in 0..m {
            let slot = x & 1023;
            let s = (0..33).find(|&s| {
                u32::from(start[s]) <= slot && slot < u32::from(start[s]) + u32::from(freq[s])
            })?;
            x = u32::from(freq[s]) * (x >> 10) + slot - u32::from(start[s]);
            while x < STATE_LOWER {
                x = (x << 8) | u32::from(*bytes.get(i)?);
                i += 1;
            }
            if s == 32 {
                let lo = *bytes.get(i)?;
                let hi = *bytes.get(i + 1)?;
                i += 2;
                out.push(u16::from_le_bytes([lo, hi]));
            } else {
                out.push(s as u16);
            }
        }
        (x == STATE_LOWER && i == bytes.len()).then_some(out)
    }

    /// The reciprocal division is exact at the edges of every state range it meets.
    #[test]
    fn reciprocal_division_is_exact() {
        for f in 1u32..=1024 {
            let m = (1u64 << RECIPROCAL_SHIFT).div_ceil(u64::from(f));
            let mut xs: Vec<u32> = (0..2048).chain((1 << 31) - 2048..1 << 31).collect();
            xs.extend(
                (1..=(1u32 << 21))
                    .step_by(4099)
                    .map(|q| q * f)
                    .filter(|&x| x < 1 << 31)
                    .flat_map(|x| [x - 1, x]),
            );
            for x in xs {
                let q = (u128::from(x) * u128::from(m)) >> RECIPROCAL_SHIFT;
                assert_eq!(q as u32, x / f, "{x} / {f}");
            }
        }
    }

    #[test]
    fn spec_vector_table_40() {
        let mut out = Vec::new();
        encode(
            &[0, 3, 1, 0, 40, 2, 0, 0],
            40,
            &mut Scratch::default(),
            &mut out,
        );
        assert_eq!(hex(&out), "f2441575ff382800");
    }

    #[test]
    fn spec_vector_table_63() {
        let mut out = Vec::new();
        encode(&[1000, 2, 0, 65535], 63, &mut Scratch::default(), &mut out);
        assert_eq!(hex(&out), "6aca051fe80300e0ffff");
    }

    proptest::proptest! {
        #[test]
        fn decodes_back(values in proptest::collection::vec(
            proptest::prop_oneof![0u16..40, proptest::num::u16::ANY], 0..600),
            table in 0usize..64) {
            let mut out = vec![0xAA];
            let n = encode(&values, table, &mut Scratch::default(), &mut out);
            proptest::prop_assert_eq!(n, out.len() - 1);
            proptest::prop_assert_eq!(decode(&out[1..], table, values.len()), Some(values.clone()));
            let other = 63 - table;
            let mut reversed = values.clone();
            reversed.reverse();
            let mut scratch = vec![Scratch::default(), Scratch::default()];
            let mut outs = vec![Vec::new(), Vec::new()];
            encode_interleaved(&[(&values, table), (&reversed, other)], &mut scratch, &mut outs);
            proptest::prop_assert_eq!(&outs[0], &out[1..].to_vec());
            let mut single = Vec::new();
            encode(&reversed, other, &mut Scratch::default(), &mut single);
            proptest::prop_assert_eq!(&outs[1], &single);
        }
    }
}
