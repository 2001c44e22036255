//! Encoding the count streams of one chunk, in parallel over pixel groups.

use rayon::prelude::*;

use super::body::Recycled;
use super::stream::{self, StreamScratch};
use super::ModelChoice;

/// Dense little-endian frames of one chunk, seen as `width` u16-valued
/// streams per frame (uint8 counts are widened; float32 frames are viewed as
/// two u16 lanes per pixel, low half first).
#[derive(Clone, Copy)]
pub(crate) struct Frames<'a> {
    pub bytes: &'a [u8],
    /// Two bytes per element (uint16 counts, float lanes) or one (uint8).
    pub wide: bool,
    /// Streams per frame.
    pub width: usize,
}

impl Frames<'_> {
    /// Element `p` of frame `frame` for `p` in `p0..p0 + n`, widened.
    #[inline]
    fn row(&self, frame: usize, p0: usize, n: usize, out: &mut [u16]) {
        let start = frame * self.width + p0;
        if self.wide {
            let row = &self.bytes[2 * start..2 * (start + n)];
            for (o, pair) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = u16::from_le_bytes([pair[0], pair[1]]);
            }
        } else {
            for (o, &b) in out.iter_mut().zip(&self.bytes[start..start + n]) {
                *o = u16::from(b);
            }
        }
    }

    /// Transposes frames `f0..f0 + m`, elements `p0..p0 + n` into `tile`,
    /// element `g` occupying `tile[g * stride..][..m]`.
    fn transpose(&self, f0: usize, m: usize, p0: usize, n: usize, tile: &mut [u16], stride: usize) {
        // Eight frames at a time, so each column receives one 16-byte store.
        let mut rows = [[0u16; GROUP]; 8];
        for i0 in (0..m).step_by(8) {
            let k = 8.min(m - i0);
            for (j, row) in rows.iter_mut().enumerate().take(k) {
                self.row(f0 + i0 + j, p0, n, &mut row[..n]);
            }
            for g in 0..n {
                let col = &mut tile[g * stride + i0..][..k];
                for (j, c) in col.iter_mut().enumerate() {
                    *c = rows[j][g];
                }
            }
        }
    }
}

/// Arrays 0–2 of a chunk: payload, stream offsets, selectors.
pub(crate) struct Streams {
    /// The payload in pieces (one per task, in stream order), handed to the
    /// body as they are rather than gathered into one buffer first.
    pub payload: Vec<Vec<u8>>,
    /// Bytes of the payload.
    pub payload_len: usize,
    pub offsets: Vec<u32>,
    pub selectors: Vec<u8>,
}

/// Pixels handled by one task: their transposed columns (64 × 512 × 2 bytes)
/// stay in the core's cache while each is encoded.
const GROUP: usize = 64;

/// Encodes the streams of `scans` frames cut into blocks of `block` frames;
/// stream `b * width + p` holds pixel `p` over block `b`.
///
/// Returns `None` when the payload would not fit the u32 offsets, which the
/// caller's chunk-size bound rules out.
pub(crate) fn encode_streams(
    src: Frames<'_>,
    scans: usize,
    block: usize,
    model: ModelChoice,
    recycled: &Recycled,
) -> Option<Streams> {
    let blocks = scans.div_ceil(block);
    let groups = src.width.div_ceil(GROUP);
    let parts: Vec<(Vec<u8>, Vec<u32>, Vec<u8>)> = (0..blocks * groups)
        .into_par_iter()
        .map_init(
            || (StreamScratch::default(), Vec::<u16>::new()),
            |(scratch, tile), task| {
                let (b, g) = (task / groups, task % groups);
                let f0 = b * block;
                let m = block.min(scans - f0);
                let p0 = g * GROUP;
                let n = GROUP.min(src.width - p0);
                // Padding the column stride keeps the 64 columns out of each
                // other's cache sets.
                let stride = m + 32;
                tile.resize(n * stride, 0);
                src.transpose(f0, m, p0, n, tile, stride);
                // No stream is longer than its literal form (2 bytes a
                // value): reserved at once, the buffer never grows.
                let mut bytes = recycled.take(2 * n * m);
                let mut lens = Vec::with_capacity(n);
                let mut sels = Vec::with_capacity(n);
                let columns: Vec<&[u16]> = tile.chunks_exact(stride).map(|c| &c[..m]).collect();
                for batch in columns.chunks(stream::BATCH) {
                    stream::encode_batch(batch, model, scratch, &mut bytes, &mut lens, &mut sels);
                }
                // Compressed counts are held until the body's thread writes
                // them: not with their literal-sized reservation.
                if bytes.capacity() > 2 * bytes.len() {
                    bytes.shrink_to_fit();
                }
                (bytes, lens, sels)
            },
        )
        .collect();
    let total: usize = parts.iter().map(|p| p.0.len()).sum();
    u32::try_from(total).ok()?;
    let streams = blocks * src.width;
    let mut out = Streams {
        payload: Vec::with_capacity(parts.len()),
        payload_len: total,
        offsets: Vec::with_capacity(streams + 1),
        selectors: Vec::with_capacity(streams),
    };
    let mut cursor = 0u32;
    out.offsets.push(0);
    for (bytes, lens, sels) in parts {
        out.payload.push(bytes);
        for len in lens {
            cursor += len;
            out.offsets.push(cursor);
        }
        out.selectors.extend_from_slice(&sels);
    }
    Some(out)
}
