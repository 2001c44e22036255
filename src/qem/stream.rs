//! Count streams (§7): the selector byte picks zeros, constant, literal,
//! sparse or rANS with one of 64 tables. Also the stream table of a chunk
//! (payload, u32 offsets, selectors) and the decoding of many streams of one
//! block into a pixel-major buffer.

use super::error::StreamFault;
use super::rans;

/// Selector of a stream of (position, value) events for values 1..=128.
pub const SPARSE: u8 = 252;
/// Selector of a stream holding only zeros (no bytes).
pub const ZEROS: u8 = 253;
/// Selector of a stream stored verbatim (`m` u16).
pub const LITERAL: u8 = 254;
/// Selector of a stream holding one repeated value (one u16).
pub const CONSTANT: u8 = 255;
/// rANS selectors are `0..RANS_TABLES`.
pub(crate) const RANS_TABLES: u8 = 64;

/// Length rules of a stream of `m` values. `float` adds the float codec's
/// extra bounds (rANS and sparse at most `2m` bytes).
pub(crate) fn check_length(
    selector: u8,
    len: usize,
    m: usize,
    float: bool,
) -> Result<(), StreamFault> {
    let ok = match selector {
        ZEROS => len == 0,
        CONSTANT => len == 2,
        LITERAL => Some(len) == m.checked_mul(2),
        SPARSE => len.is_multiple_of(2) && (!float || len <= 2 * m),
        s if s < RANS_TABLES => len >= 4 && (!float || len <= 2 * m),
        s => return Err(StreamFault::UnknownSelector(s)),
    };
    if ok {
        Ok(())
    } else {
        Err(StreamFault::Length { selector, len })
    }
}

/// Decodes one stream into `out` (`out.len()` values). The length rules of
/// the integer codec are applied; callers add the float bounds.
pub fn decode(selector: u8, bytes: &[u8], out: &mut [u16]) -> Result<(), StreamFault> {
    check_length(selector, bytes.len(), out.len(), false)?;
    match selector {
        ZEROS => out.fill(0),
        CONSTANT => out.fill(u16::from_le_bytes([bytes[0], bytes[1]])),
        LITERAL => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = u16::from_le_bytes([b[0], b[1]]);
            }
        }
        SPARSE => {
            out.fill(0);
            let mut next = 0usize;
            for b in bytes.chunks_exact(2) {
                let e = u16::from_le_bytes([b[0], b[1]]);
                let position = usize::from(e >> 7);
                if position < next || position >= out.len() {
                    return Err(StreamFault::SparsePosition { position });
                }
                out[position] = (e & 127) + 1;
                next = position + 1;
            }
        }
        table => rans::decode(usize::from(table), bytes, out)?,
    }
    Ok(())
}

/// A chunk's streams: payload, `count + 1` u32 offsets and `count`
/// selectors, all already bound-checked against the body and integrity
/// verified.
#[derive(Clone, Copy)]
pub(crate) struct StreamTable<'a> {
    pub payload: &'a [u8],
    pub offsets: &'a [u8],
    pub selectors: &'a [u8],
    /// Float codec rules (lengths at most `2m`, offsets may end before the
    /// end of the payload).
    pub float: bool,
}

impl<'a> StreamTable<'a> {
    pub fn count(&self) -> usize {
        self.selectors.len()
    }

    fn offset(&self, s: usize) -> usize {
        let b = &self.offsets[4 * s..4 * s + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
    }

    /// Checks the offsets array: starts at 0, nondecreasing, ends at the
    /// payload size (integer/scaled) or within it (float).
    pub fn check_offsets(&self) -> Result<(), String> {
        let n = self.count();
        if self.offsets.len() != 4 * (n + 1) {
            return Err("offset array has the wrong size".into());
        }
        if self.offset(0) != 0 {
            return Err(format!("first offset is {}, not 0", self.offset(0)));
        }
        let mut prev = 0;
        for s in 1..=n {
            let o = self.offset(s);
            if o < prev {
                return Err(format!("offset {s} ({o}) decreases from {prev}"));
            }
            prev = o;
        }
        let ok = if self.float {
            prev <= self.payload.len()
        } else {
            prev == self.payload.len()
        };
        if !ok {
            return Err(format!(
                "last offset {prev} does not match the payload size {}",
                self.payload.len()
            ));
        }
        Ok(())
    }

    /// Payload byte range of stream `s`; offsets must have been checked.
    pub fn span(&self, s: usize) -> (usize, usize) {
        (self.offset(s), self.offset(s + 1))
    }

    /// Selector and bytes of stream `s`; offsets must have been checked.
    pub fn stream(&self, s: usize) -> (u8, &'a [u8]) {
        let (a, b) = (self.offset(s), self.offset(s + 1));
        (self.selectors[s], &self.payload[a..b])
    }

    /// Decodes streams `first..first + out.len() / m` into `out`,
    /// stream-major (`m` values per stream). rANS streams are decoded
    /// [`LOCKSTEP`] (or 4) at a time. A failure names the stream (chunk-relative).
    pub fn decode_range(
        &self,
        first: usize,
        m: usize,
        out: &mut [u16],
    ) -> Result<(), (usize, StreamFault)> {
        self.decode_streams(first.., m, out)
    }

    /// Decodes the streams `streams` yields (as many as `out` has room for,
    /// `m` values each) into `out`, stream-major, as
    /// [`decode_range`](Self::decode_range) does for consecutive streams.
    pub fn decode_streams(
        &self,
        streams: impl IntoIterator<Item = usize>,
        m: usize,
        out: &mut [u16],
    ) -> Result<(), (usize, StreamFault)> {
        if m == 0 {
            return Ok(());
        }
        let simd = rans::simd_lanes();
        let lanes = if simd { LOCKSTEP } else { 4 };
        let mut pending: Vec<(usize, usize, &[u8], &mut [u16])> = Vec::with_capacity(LOCKSTEP);
        for (s, col) in streams.into_iter().zip(out.chunks_exact_mut(m)) {
            let (sel, bytes) = self.stream(s);
            check_length(sel, bytes.len(), m, self.float).map_err(|f| (s, f))?;
            if sel < RANS_TABLES {
                pending.push((s, usize::from(sel), bytes, col));
                if pending.len() == lanes {
                    if simd {
                        decode_group::<LOCKSTEP>(&mut pending, &mut [])?;
                    } else {
                        decode_group::<4>(&mut pending, &mut [])?;
                    }
                }
            } else {
                decode(sel, bytes, col).map_err(|f| (s, f))?;
            }
        }
        // The rest: a padded 8-lane group when that beats one at a time
        // (the extra lanes repeat a stream into a scratch column).
        if simd && pending.len() > 8 {
            let mut spare = vec![vec![0u16; m]; LOCKSTEP - pending.len()];
            decode_group::<LOCKSTEP>(&mut pending, &mut spare)?;
        } else if simd && pending.len() >= 4 {
            let mut spare = vec![vec![0u16; m]; 8 - pending.len()];
            decode_group::<8>(&mut pending, &mut spare)?;
        }
        for (s, table, bytes, col) in pending.drain(..) {
            rans::decode(table, bytes, col).map_err(|f| (s, f))?;
        }
        Ok(())
    }
}

/// Streams decoded in lockstep by `StreamTable::decode_range` where
/// SIMD lanes are available (else 4).
pub(crate) const LOCKSTEP: usize = 16;

/// Decodes the pending streams in one `N`-lane group; when there are fewer
/// than `N`, the missing lanes repeat the last stream into `spare` columns.
fn decode_group<const N: usize>(
    pending: &mut Vec<(usize, usize, &[u8], &mut [u16])>,
    spare: &mut [Vec<u16>],
) -> Result<(), (usize, StreamFault)> {
    let k = pending.len();
    debug_assert!(k > 0 && k + spare.len() == N);
    let mut sites = [0usize; N];
    let mut streams: [(usize, &[u8]); N] = [(0, &[]); N];
    let mut outs: [&mut [u16]; N] = std::array::from_fn(|_| Default::default());
    for (j, (s, table, bytes, col)) in pending.drain(..).enumerate() {
        sites[j] = s;
        streams[j] = (table, bytes);
        outs[j] = col;
    }
    for (j, col) in (k..N).zip(spare.iter_mut()) {
        sites[j] = sites[k - 1];
        streams[j] = streams[k - 1];
        outs[j] = col;
    }
    rans::decode_many(streams, outs).map_err(|(j, f)| (sites[j], f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_of_the_spec() {
        let mut out = [9u16; 32];
        decode(SPARSE, &[0x84, 0x01], &mut out).unwrap();
        let mut want = [0u16; 32];
        want[3] = 5;
        assert_eq!(out, want);
        decode(SPARSE, &[], &mut out).unwrap();
        assert_eq!(out, [0; 32]);
        // Positions must increase strictly.
        assert!(matches!(
            decode(SPARSE, &[0x84, 0x01, 0x84, 0x01], &mut out),
            Err(StreamFault::SparsePosition { position: 3 })
        ));
        let mut out = [0u16; 2];
        assert!(decode(SPARSE, &[0x00, 0x01], &mut out).is_err());
        decode(CONSTANT, &[0, 0], &mut out).unwrap();
        decode(LITERAL, &[1, 0, 2, 0], &mut out).unwrap();
        assert_eq!(out, [1, 2]);
        assert!(matches!(
            decode(100, &[], &mut out),
            Err(StreamFault::UnknownSelector(100))
        ));
        assert!(matches!(
            decode(ZEROS, &[0], &mut out),
            Err(StreamFault::Length { .. })
        ));
        assert!(check_length(5, 6, 2, true).is_err());
        assert!(check_length(5, 6, 2, false).is_ok());
    }

    /// Grouped decoding (16 or 4 lanes, padded remainders, other
    /// selectors in between) equals decoding stream by stream, for every
    /// count of rANS streams in a range, valid or with one damaged stream.
    #[test]
    fn decode_range_equals_stream_by_stream() {
        let mut rnd = crate::qem::rans::tests::xorshift(0x5eed_1234);
        for round in 0..120 {
            let m = 1 + (rnd() % 64) as usize;
            let count = round % 40;
            let mut payload = Vec::new();
            let mut offsets = vec![0u32];
            let mut selectors = Vec::new();
            for _ in 0..count {
                let v: Vec<u16> = (0..m)
                    .map(|_| match rnd() % 20 {
                        0 => (rnd() % 300) as u16,
                        1..=4 => (rnd() % 5) as u16,
                        _ => 0,
                    })
                    .collect();
                let (sel, bytes) = match rnd() % 8 {
                    0 => (ZEROS, Vec::new()),
                    1 => (LITERAL, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                    _ => {
                        let k = (rnd() % 64) as usize;
                        (k as u8, rans::encode(k, &v))
                    }
                };
                payload.extend_from_slice(&bytes);
                offsets.push(payload.len() as u32);
                selectors.push(sel);
            }
            if round % 3 == 0 && !payload.is_empty() {
                let k = (rnd() as usize) % payload.len();
                payload[k] ^= 1 << (rnd() % 8);
            }
            let offsets: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
            let table = StreamTable {
                payload: &payload,
                offsets: &offsets,
                selectors: &selectors,
                float: false,
            };
            table.check_offsets().unwrap();
            let mut want = vec![0u16; count * m];
            let mut first_fault = None;
            for (j, col) in want.chunks_exact_mut(m).enumerate() {
                let (sel, bytes) = table.stream(j);
                if let Err(f) = decode(sel, bytes, col) {
                    first_fault.get_or_insert((j, f));
                }
            }
            let mut got = vec![0u16; count * m];
            match table.decode_range(0, m, &mut got) {
                Ok(()) => {
                    assert_eq!(first_fault, None, "round {round}");
                    assert_eq!(got, want, "round {round}");
                }
                Err((j, f)) => {
                    // A damaged stream is named with its own fault.
                    let (sel, bytes) = table.stream(j);
                    let mut col = vec![0u16; m];
                    assert_eq!(decode(sel, bytes, &mut col), Err(f), "round {round}");
                }
            }
        }
    }
}
