//! Decoding chunks of the HDF5 bitshuffle filter (id 32008) with LZ4, and
//! of the plain HDF5 LZ4 filter (id 32004), in-process, so that no HDF5
//! plugin is needed at run time. Both layouts are those of the filters'
//! reference implementations (the `bitshuffle` and `HDF5Plugin-LZ4`
//! projects), which DECTRIS detectors write.
//!
//! Bitshuffle chunk: `u64 BE` uncompressed bytes, `u32 BE` block bytes,
//! then per block of `block` elements a `u32 BE` compressed length and an
//! LZ4 block; a final shorter block holds the remaining elements rounded
//! down to a multiple of 8, and the last `n mod 8` elements follow as they
//! are. A decompressed block of `m` elements of `s` bytes is `8·s` bit
//! planes of `m/8` bytes: plane `8·b + k` holds bit `k` of byte `b` of every
//! element, element `i` at bit `i mod 8` of byte `i/8`.

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
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

/// Undoes the bit transposition of `m` elements (`m` a multiple of 8): for
/// each byte `b` of the elements and each group of 8 elements, the 8 plane
/// bytes (bits `k = 0..8`) form an 8×8 bit matrix whose transpose is byte
/// `b` of those 8 elements.
fn bit_unshuffle(planes: &[u8], m: usize, elem: usize, out: &mut [u8]) {
    let row = m / 8;
    for b in 0..elem {
        let plane = |k: usize| &planes[(8 * b + k) * row..][..row];
        let rows: [&[u8]; 8] = std::array::from_fn(plane);
        for j in 0..row {
            let x = u64::from_le_bytes(std::array::from_fn(|k| rows[k][j]));
            for (e, byte) in transpose8(x).to_le_bytes().into_iter().enumerate() {
                out[(8 * j + e) * elem + b] = byte;
            }
        }
    }
}

/// Decodes a bitshuffle-LZ4 chunk of `elem`-byte elements into `out`
/// (exactly the chunk's uncompressed size).
pub fn bitshuffle_lz4(chunk: &[u8], elem: usize, out: &mut [u8]) -> Result<(), String> {
    let total = be64(chunk, 0).ok_or("chunk shorter than its 12-byte header")?;
    let block_bytes = be32(chunk, 8).ok_or("chunk shorter than its 12-byte header")? as usize;
    if total != out.len() as u64 {
        return Err(format!(
            "chunk declares {total} bytes uncompressed, the dataset's chunk holds {}",
            out.len()
        ));
    }
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
    let mut scratch = vec![0u8; block * elem];
    let (mut pos, mut done) = (12usize, 0usize);
    while n - done >= 8 {
        let m = if n - done >= block {
            block
        } else {
            (n - done) / 8 * 8
        };
        let clen = be32(chunk, pos).ok_or("chunk ends inside a block header")? as usize;
        pos += 4;
        let data = chunk
            .get(pos..pos + clen)
            .ok_or("chunk ends inside an LZ4 block")?;
        let got = lz4_flex::block::decompress_into(data, &mut scratch[..m * elem])
            .map_err(|e| format!("corrupt LZ4 block at byte {pos}: {e}"))?;
        if got != m * elem {
            return Err(format!(
                "LZ4 block at byte {pos} holds {got} bytes, not {}",
                m * elem
            ));
        }
        bit_unshuffle(
            &scratch[..m * elem],
            m,
            elem,
            &mut out[done * elem..(done + m) * elem],
        );
        pos += clen;
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
            for m in [0, 8, 24, 64] {
                let bytes: Vec<u8> = (0..m * elem)
                    .map(|i| ((i as u32).wrapping_mul(2654435761) >> 13) as u8)
                    .collect();
                let mut out = vec![0u8; bytes.len()];
                bit_unshuffle(&shuffle_bytes(&bytes, elem), m, elem, &mut out);
                assert_eq!(out, bytes, "{elem}-byte elements, {m} of them");
            }
        }
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
}
