//! rANS encoder of the count streams (spec §7.1).
//!
//! The coder state lives in `[2^23, 2^31)` and is renormalised byte-wise. The
//! encoder walks the values backwards and emits bytes backwards, so the
//! output is built from the end of a scratch buffer and copied out once.

use crate::qem::tables::{ESCAPE, FREQUENCIES, SCALE_BITS, START, STATE_LOWER};

/// Most bytes one value can produce: two renormalisation bytes (frequency 1
/// needs the state below 2^21) plus a two-byte escape word.
const MAX_BYTES_PER_VALUE: usize = 4;

/// Reusable buffer for the backwards-built stream.
#[derive(Default)]
pub(crate) struct Scratch {
    buf: Vec<u8>,
}

/// Appends the rANS stream of `values` coded with table `table` to `out`;
/// returns the number of bytes appended.
pub(crate) fn encode(
    values: &[u16],
    table: usize,
    scratch: &mut Scratch,
    out: &mut Vec<u8>,
) -> usize {
    let freq = &FREQUENCIES[table];
    let start = &START[table];
    let need = values.len() * MAX_BYTES_PER_VALUE;
    if scratch.buf.len() < need {
        scratch.buf.resize(need, 0);
    }
    let buf = &mut scratch.buf[..need];
    let mut pos = need;
    let mut x: u32 = STATE_LOWER;
    for &v in values.iter().rev() {
        let s = usize::from(v).min(ESCAPE);
        if s == ESCAPE {
            // Built backwards: the high byte lands after the low byte.
            pos -= 2;
            buf[pos] = v as u8;
            buf[pos + 1] = (v >> 8) as u8;
        }
        let f = u32::from(freq[s]);
        // (L >> SCALE_BITS) << 8 = 2^21: past this bound one step would leave the state range.
        let x_max = f << (23 - SCALE_BITS + 8);
        while x >= x_max {
            pos -= 1;
            buf[pos] = x as u8;
            x >>= 8;
        }
        x = ((x / f) << SCALE_BITS) + (x % f) + u32::from(start[s]);
    }
    let before = out.len();
    out.extend_from_slice(&x.to_le_bytes());
    out.extend_from_slice(&buf[pos..]);
    out.len() - before
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

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
            proptest::prop_assert_eq!(decode(&out[1..], table, values.len()), Some(values));
        }
    }
}
