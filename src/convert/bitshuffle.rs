//! Decoding chunks of the HDF5 bitshuffle filter (id 32008), its blocks
//! stored as they are or with LZ4 or zstd, and of the plain HDF5 LZ4
//! filter (id 32004), in-process, so that no HDF5 plugin is needed at run
//! time. Both layouts are those of the filters' reference implementations
//! (the `bitshuffle` and `HDF5Plugin-LZ4` projects), which DECTRIS
//! detectors and `hdf5plugin` write.
//!
//! Bitshuffle chunk: `u64 BE` uncompressed bytes, `u32 BE` block bytes,
//! then per block of `block` elements a `u32 BE` compressed length and an
//! LZ4 block (or zstd frame); without compression, no header and the
//! blocks' bit planes as they are. A final shorter block holds the remaining elements rounded
//! down to a multiple of 8, and the last `n mod 8` elements follow as they
//! are. A decompressed block of `m` elements of `s` bytes is `8·s` bit
//! planes of `m/8` bytes: plane `8·b + k` holds bit `k` of byte `b` of every
//! element, element `i` at bit `i mod 8` of byte `i/8`.

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The big-endian u64 at byte `at` (a chunk header's decoded size).
pub(super) fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Transposes an 8×8 bit matrix held in a u64 (byte `r` = row `r`, bit `c`
/// = column `c`), by the three block swaps of Hacker's Delight §7-3.
fn transpose8(mut x: u64) -> u64 {
    let t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x ^= t ^ (t << 7);
    let t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x ^= t ^ (t << 14);
    let t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^ t ^ (t << 28)
}

/// Undoes the bit transposition of `m` elements (`m` a multiple of 8) in
/// two steps: for each byte `b` of the elements, the 8 planes of its bits
/// become that byte of every element, in element order (`bytes`, `m` bytes
/// per element byte: for each group of 8 elements the 8 plane bytes form
/// an 8×8 bit matrix whose transpose is byte `b` of those 8 elements);
/// then those bytes are interleaved into elements. The first step runs 32
/// groups at a time with AVX2 (and GFNI where the CPU has it) on x86-64.
fn bit_unshuffle(planes: &[u8], m: usize, elem: usize, bytes: &mut Vec<u8>, out: &mut [u8]) {
    let row = m / 8;
    if m == 0 {
        return;
    }
    if elem == 1 {
        // The element bytes are the output.
        untranspose_bits(planes, row, out);
        return;
    }
    bytes.resize(m * elem, 0);
    for (b, byte) in bytes.chunks_exact_mut(m).enumerate() {
        untranspose_bits(&planes[8 * b * row..][..8 * row], row, byte);
    }
    interleave(bytes, m, elem, out);
}

/// The element-order bytes of 8 bit planes of `row` bytes each:
/// `out[8j + e]` holds bit `e` of byte `j` of plane `k` as its bit `k`.
fn untranspose_bits(planes: &[u8], row: usize, out: &mut [u8]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        let gfni = is_x86_feature_detected!("gfni");
        // SAFETY: AVX2 (and GFNI when asked for) are present, checked above.
        done = unsafe { x86::untranspose_bits(planes, row, out, gfni) };
    }
    for j in done..row {
        let x = u64::from_le_bytes(std::array::from_fn(|k| planes[k * row + j]));
        out[8 * j..8 * j + 8].copy_from_slice(&transpose8(x).to_le_bytes());
    }
}

/// `out[i·elem + b] = bytes[b·m + i]`; the common sizes as whole-element
/// stores that the compiler vectorises.
fn interleave(bytes: &[u8], m: usize, elem: usize, out: &mut [u8]) {
    let byte = |b: usize| &bytes[b * m..][..m];
    match elem {
        2 => {
            for ((o, &lo), &hi) in out.chunks_exact_mut(2).zip(byte(0)).zip(byte(1)) {
                o.copy_from_slice(&u16::from_le_bytes([lo, hi]).to_le_bytes());
            }
        }
        4 => {
            let (b0, b1, b2, b3) = (byte(0), byte(1), byte(2), byte(3));
            for (i, o) in out.chunks_exact_mut(4).enumerate() {
                o.copy_from_slice(&[b0[i], b1[i], b2[i], b3[i]]);
            }
        }
        _ => {
            for (i, o) in out.chunks_exact_mut(elem).enumerate() {
                for (b, v) in o.iter_mut().enumerate() {
                    *v = bytes[b * m + i];
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Transposes the 8×8 bit matrix in each 64-bit lane of `x` (byte `r`
    /// = row `r`), as `super::transpose8` does one at a time.
    #[target_feature(enable = "avx2")]
    fn transpose8x4(mut x: __m256i) -> __m256i {
        macro_rules! swap {
            ($shift:literal, $mask:literal) => {
                let t = _mm256_and_si256(
                    _mm256_xor_si256(x, _mm256_srli_epi64::<$shift>(x)),
                    _mm256_set1_epi64x($mask),
                );
                x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64::<$shift>(t)));
            };
        }
        swap!(7, 0x00AA_00AA_00AA_00AA);
        swap!(14, 0x0000_CCCC_0000_CCCC);
        swap!(28, 0x0000_0000_F0F0_F0F0);
        x
    }

    /// The same with one GFNI instruction, for lanes whose rows are in
    /// reverse order (byte `r` = row `7 - r`): the affine transform of the
    /// bytes `1 << e` by the lane's matrix gives byte `e` of the transpose.
    #[target_feature(enable = "avx2,gfni")]
    fn transpose8x4_gfni(reversed: __m256i) -> __m256i {
        let units = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        _mm256_gf2p8affine_epi64_epi8::<0>(units, reversed)
    }

    /// `super::untranspose_bits` for the first multiple of 32 groups;
    /// returns how many groups it did.
    ///
    /// # Safety
    /// The CPU has AVX2, and GFNI when `gfni` is true.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn untranspose_bits(
        planes: &[u8],
        row: usize,
        out: &mut [u8],
        gfni: bool,
    ) -> usize {
        let whole = row / 32 * 32;
        assert!(planes.len() >= 8 * row && out.len() >= 8 * row);
        for j in (0..whole).step_by(32) {
            // SAFETY: j + 32 <= row, so each load reads inside plane k.
            let load =
                |k: usize| unsafe { _mm256_loadu_si256(planes.as_ptr().add(k * row + j).cast()) };
            // GFNI wants each lane's rows reversed: the planes in reverse order.
            let v: [__m256i; 8] = if gfni {
                std::array::from_fn(|k| load(7 - k))
            } else {
                std::array::from_fn(load)
            };
            // Bytes of planes (0,1), (2,3), ... side by side, then pairs of
            // those, then quads: 64-bit lanes holding one group's 8 plane
            // bytes each. Within each 128-bit half, unpacks keep the groups
            // in order, so vector `q` holds groups 2q, 2q + 1 of the half.
            let a = |p: usize, hi: bool| {
                if hi {
                    _mm256_unpackhi_epi8(v[2 * p], v[2 * p + 1])
                } else {
                    _mm256_unpacklo_epi8(v[2 * p], v[2 * p + 1])
                }
            };
            let (a_lo, a_hi): ([__m256i; 4], [__m256i; 4]) = (
                std::array::from_fn(|p| a(p, false)),
                std::array::from_fn(|p| a(p, true)),
            );
            let mut quads = [_mm256_setzero_si256(); 8];
            for (h, a) in [a_lo, a_hi].iter().enumerate() {
                let b = [
                    _mm256_unpacklo_epi16(a[0], a[1]),
                    _mm256_unpackhi_epi16(a[0], a[1]),
                    _mm256_unpacklo_epi16(a[2], a[3]),
                    _mm256_unpackhi_epi16(a[2], a[3]),
                ];
                for half in 0..2 {
                    quads[4 * h + 2 * half] = _mm256_unpacklo_epi32(b[half], b[2 + half]);
                    quads[4 * h + 2 * half + 1] = _mm256_unpackhi_epi32(b[half], b[2 + half]);
                }
            }
            for (q, &x) in quads.iter().enumerate() {
                let t = if gfni {
                    // SAFETY: the caller checked GFNI.
                    unsafe { transpose8x4_gfni(x) }
                } else {
                    transpose8x4(x)
                };
                // Groups j + 2q, j + 2q + 1 (low half), j + 16 + 2q, ... (high).
                for (half, group) in [(0, j + 2 * q), (1, j + 16 + 2 * q)] {
                    let part = if half == 0 {
                        _mm256_castsi256_si128(t)
                    } else {
                        _mm256_extracti128_si256::<1>(t)
                    };
                    // SAFETY: group + 2 <= row, so 16 bytes from 8 * group
                    // lie inside `out`.
                    unsafe { _mm_storeu_si128(out.as_mut_ptr().add(8 * group).cast(), part) };
                }
            }
        }
        whole
    }
}

/// How a bitshuffle chunk's blocks are stored (the filter's fifth
/// parameter: 0, 2 and 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockCodec {
    /// Bit planes as they are, with no chunk header; blocks of the size
    /// the filter's parameters give.
    None,
    /// A chunk header, then each block's bit planes as one LZ4 block.
    Lz4,
    /// A chunk header, then each block's bit planes as one zstd frame.
    Zstd,
}

/// Elements per block when the filter's parameters say 0: the
/// bitshuffle library's stable default, about 8 KiB of elements, a
/// multiple of 8, at least 128.
pub fn default_block(elem: usize) -> usize {
    (8192 / elem.max(1) / 8 * 8).max(128)
}

/// Decodes a bitshuffle-LZ4 chunk of `elem`-byte elements into `out`
/// (exactly the chunk's uncompressed size).
pub fn bitshuffle_lz4(chunk: &[u8], elem: usize, out: &mut [u8]) -> Result<(), String> {
    bitshuffle(chunk, elem, 0, BlockCodec::Lz4, out)
}

/// Decodes a bitshuffle chunk of `elem`-byte elements stored with `codec`
/// into `out` (exactly the chunk's decoded size). `block` (elements) is
/// used by [`BlockCodec::None`] only, whose chunks carry no header; 0
/// means [`default_block`].
pub fn bitshuffle(
    chunk: &[u8],
    elem: usize,
    block: usize,
    codec: BlockCodec,
    out: &mut [u8],
) -> Result<(), String> {
    let (block_bytes, mut pos) = if codec == BlockCodec::None {
        if chunk.len() != out.len() {
            return Err(format!(
                "chunk of {} bytes, where the dataset's chunk holds {}",
                chunk.len(),
                out.len()
            ));
        }
        let block = if block == 0 {
            default_block(elem)
        } else {
            block
        };
        (block.saturating_mul(elem), 0)
    } else {
        let total = be64(chunk, 0).ok_or("chunk shorter than its 12-byte header")?;
        if total != out.len() as u64 {
            return Err(format!(
                "chunk declares {total} bytes uncompressed, the dataset's chunk holds {}",
                out.len()
            ));
        }
        let bytes = be32(chunk, 8).ok_or("chunk shorter than its 12-byte header")? as usize;
        (bytes, 12)
    };
    if elem == 0
        || !block_bytes.is_multiple_of(elem)
        || !(block_bytes / elem).is_multiple_of(8)
        || block_bytes == 0
    {
        return Err(format!(
            "block size {block_bytes} bytes is not a multiple of 8 elements"
        ));
    }
    let block = block_bytes / elem;
    let n = out.len() / elem;
    let mut scratch = vec![0u8; block.min(n) * elem];
    let mut bytes = Vec::new();
    let mut done = 0usize;
    while n - done >= 8 {
        let m = if n - done >= block {
            block
        } else {
            (n - done) / 8 * 8
        };
        let planes = match codec {
            BlockCodec::None => {
                let data = &chunk[pos..pos + m * elem];
                pos += m * elem;
                data
            }
            BlockCodec::Lz4 | BlockCodec::Zstd => {
                let clen = be32(chunk, pos).ok_or("chunk ends inside a block header")? as usize;
                pos += 4;
                let data = chunk
                    .get(pos..pos + clen)
                    .ok_or("chunk ends inside a compressed block")?;
                let got = if codec == BlockCodec::Lz4 {
                    lz4_flex::block::decompress_into(data, &mut scratch[..m * elem])
                        .map_err(|e| format!("corrupt LZ4 block at byte {pos}: {e}"))?
                } else {
                    zstd::bulk::decompress_to_buffer(data, &mut scratch[..m * elem])
                        .map_err(|e| format!("corrupt zstd block at byte {pos}: {e}"))?
                };
                if got != m * elem {
                    return Err(format!(
                        "block at byte {pos} holds {got} bytes, not {}",
                        m * elem
                    ));
                }
                pos += clen;
                &scratch[..m * elem]
            }
        };
        bit_unshuffle(
            planes,
            m,
            elem,
            &mut bytes,
            &mut out[done * elem..(done + m) * elem],
        );
        done += m;
    }
    let rest = (n - done) * elem;
    let tail = chunk
        .get(pos..pos + rest)
        .ok_or("chunk ends before its last elements")?;
    out[done * elem..].copy_from_slice(tail);
    if pos + rest != chunk.len() {
        return Err(format!(
            "{} bytes after the chunk's data",
            chunk.len() - pos - rest
        ));
    }
    Ok(())
}

/// Decodes a chunk of the HDF5 LZ4 filter: `u64 BE` uncompressed bytes,
/// `u32 BE` block bytes, then per block a `u32 BE` compressed length and
/// an LZ4 block (stored as is when that length equals the block's).
pub fn hdf5_lz4(chunk: &[u8], out: &mut [u8]) -> Result<(), String> {
    let total = be64(chunk, 0).ok_or("chunk shorter than its 12-byte header")?;
    let block = be32(chunk, 8).ok_or("chunk shorter than its 12-byte header")? as usize;
    if total != out.len() as u64 {
        return Err(format!(
            "chunk declares {total} bytes uncompressed, the dataset's chunk holds {}",
            out.len()
        ));
    }
    let block = if block == 0 { out.len() } else { block };
    let mut pos = 12;
    for piece in out.chunks_mut(block) {
        let clen = be32(chunk, pos).ok_or("chunk ends inside a block header")? as usize;
        pos += 4;
        let data = chunk
            .get(pos..pos + clen)
            .ok_or("chunk ends inside an LZ4 block")?;
        if clen == piece.len() {
            piece.copy_from_slice(data);
        } else {
            let got = lz4_flex::block::decompress_into(data, piece)
                .map_err(|e| format!("corrupt LZ4 block at byte {pos}: {e}"))?;
            if got != piece.len() {
                return Err(format!(
                    "LZ4 block at byte {pos} holds {got} bytes, not {}",
                    piece.len()
                ));
            }
        }
        pos += clen;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit planes of `values` as the filter lays them out.
    fn shuffle(values: &[u16]) -> Vec<u8> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        shuffle_bytes(&bytes, 2)
    }

    /// Bit planes of the `elem`-byte elements in `bytes` as the filter lays
    /// them out (independent of the decoder: one bit at a time from the
    /// definition).
    fn shuffle_bytes(bytes: &[u8], elem: usize) -> Vec<u8> {
        let m = bytes.len() / elem;
        let mut planes = vec![0u8; bytes.len()];
        for i in 0..m {
            for b in 0..elem {
                for k in 0..8 {
                    if bytes[i * elem + b] >> k & 1 == 1 {
                        planes[(8 * b + k) * (m / 8) + i / 8] |= 1 << (i % 8);
                    }
                }
            }
        }
        planes
    }

    #[test]
    fn unshuffle_inverts_the_planes_for_every_element_size() {
        for elem in [1, 2, 3, 4, 8] {
            // Up to 31 groups (scalar only), 32 and more (vector and scalar
            // tails), and a whole default 8 KiB block.
            for m in [0, 8, 24, 64, 256, 264, 8 * 70, 4096 / elem * 8] {
                let bytes: Vec<u8> = (0..m * elem)
                    .map(|i| ((i as u32).wrapping_mul(2654435761) >> 13) as u8)
                    .collect();
                let mut out = vec![0u8; bytes.len()];
                bit_unshuffle(
                    &shuffle_bytes(&bytes, elem),
                    m,
                    elem,
                    &mut Vec::new(),
                    &mut out,
                );
                assert_eq!(out, bytes, "{elem}-byte elements, {m} of them");
            }
        }
    }

    /// Every x86 path of the bit step gives what the scalar one gives, on
    /// whatever vectors the CPU has; says which ran.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_bit_steps_equal_the_scalar_one() {
        let row = 32 * 5 + 7;
        let planes: Vec<u8> = (0..8 * row)
            .map(|i| ((i as u32).wrapping_mul(2246822519) >> 11) as u8)
            .collect();
        let mut want = vec![0u8; 8 * row];
        for (j, o) in want.chunks_exact_mut(8).enumerate() {
            let x = u64::from_le_bytes(std::array::from_fn(|k| planes[k * row + j]));
            o.copy_from_slice(&transpose8(x).to_le_bytes());
        }
        let mut ran = Vec::new();
        for (name, gfni, present) in [
            ("avx2", false, is_x86_feature_detected!("avx2")),
            (
                "avx2+gfni",
                true,
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("gfni"),
            ),
        ] {
            if !present {
                eprintln!("bitshuffle: no {name} on this CPU, path not tested");
                continue;
            }
            let mut got = vec![0u8; 8 * row];
            // SAFETY: the features were checked above.
            let done = unsafe { x86::untranspose_bits(&planes, row, &mut got, gfni) };
            assert_eq!(done, 32 * 5);
            assert_eq!(got[..8 * done], want[..8 * done], "{name}");
            ran.push(name);
        }
        eprintln!("bitshuffle bit step paths tested: {ran:?}");
    }

    #[test]
    fn transpose8_swaps_rows_and_columns() {
        for seed in [1u64, 0x0123_4567_89ab_cdef, u64::MAX, 1 << 63] {
            let t = transpose8(seed);
            for r in 0..8 {
                for c in 0..8 {
                    assert_eq!(seed >> (8 * r + c) & 1, t >> (8 * c + r) & 1);
                }
            }
        }
    }

    #[test]
    fn a_chunk_of_blocks_and_leftovers_decodes() {
        let values: Vec<u16> = (0..45u32)
            .map(|i| ((i * 2654435761u32) >> 16) as u16)
            .collect();
        // Blocks of 16 elements: 16, 16, then 8 (13 rounded down), then 5 as they are.
        let mut chunk = Vec::new();
        chunk.extend_from_slice(&(90u64).to_be_bytes());
        chunk.extend_from_slice(&(32u32).to_be_bytes());
        for range in [0..16, 16..32, 32..40] {
            let planes = shuffle(&values[range]);
            let mut block = vec![0u8; lz4_flex::block::get_maximum_output_size(planes.len())];
            let n = lz4_flex::block::compress_into(&planes, &mut block).unwrap();
            block.truncate(n);
            chunk.extend_from_slice(&(block.len() as u32).to_be_bytes());
            chunk.extend_from_slice(&block);
        }
        chunk.extend(values[40..].iter().flat_map(|v| v.to_le_bytes()));
        let mut out = vec![0u8; 90];
        bitshuffle_lz4(&chunk, 2, &mut out).unwrap();
        let want: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(out, want);
        // Damage is reported, never a panic.
        for cut in [0, 5, 13, 20, chunk.len() - 1] {
            assert!(bitshuffle_lz4(&chunk[..cut], 2, &mut out).is_err());
        }
        let mut bad = chunk.clone();
        bad[17] ^= 0xff;
        let _ = bitshuffle_lz4(&bad, 2, &mut out);
    }

    /// The same blocks stored as they are (no header, the block size from
    /// the filter's parameters) and as zstd frames.
    #[test]
    fn uncompressed_and_zstd_blocks_decode() {
        let values: Vec<u16> = (0..45u32)
            .map(|i| ((i * 2246822519u32) >> 16) as u16)
            .collect();
        let want: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let blocks = [0..16, 16..32, 32..40];
        let tail = values[40..].iter().flat_map(|v| v.to_le_bytes());
        let mut plain: Vec<u8> = blocks
            .iter()
            .flat_map(|r| shuffle(&values[r.clone()]))
            .collect();
        plain.extend(tail.clone());
        let mut zstd_chunk = Vec::new();
        zstd_chunk.extend_from_slice(&(90u64).to_be_bytes());
        zstd_chunk.extend_from_slice(&(32u32).to_be_bytes());
        for r in blocks {
            let frame = zstd::bulk::compress(&shuffle(&values[r]), 3).unwrap();
            zstd_chunk.extend_from_slice(&(frame.len() as u32).to_be_bytes());
            zstd_chunk.extend_from_slice(&frame);
        }
        zstd_chunk.extend(tail);
        let mut out = vec![0u8; 90];
        bitshuffle(&plain, 2, 16, BlockCodec::None, &mut out).unwrap();
        assert_eq!(out, want);
        bitshuffle(&zstd_chunk, 2, 0, BlockCodec::Zstd, &mut out).unwrap();
        assert_eq!(out, want);
        // A stored chunk of another size, a block size not a multiple of 8.
        assert!(bitshuffle(&plain[1..], 2, 16, BlockCodec::None, &mut out).is_err());
        assert!(bitshuffle(&plain, 2, 12, BlockCodec::None, &mut out).is_err());
        for cut in [0, 13, 20, zstd_chunk.len() - 1] {
            assert!(bitshuffle(&zstd_chunk[..cut], 2, 0, BlockCodec::Zstd, &mut out).is_err());
        }
    }

    #[test]
    fn the_default_block_is_8_kib_of_elements_a_multiple_of_8_at_least_128() {
        assert_eq!(default_block(1), 8192);
        assert_eq!(default_block(2), 4096);
        assert_eq!(default_block(3), 2728);
        assert_eq!(default_block(8), 1024);
        assert_eq!(default_block(128), 128);
    }
}
