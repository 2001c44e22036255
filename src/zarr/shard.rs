//! Shards of a written Zarr store: how many inner chunks (one block's worth
//! of frames each, see `super::layout::chunk_shape`) go into one shard
//! file of the v3 `sharding_indexed` codec.
//!
//! Object stores and cluster file systems pay per file: a 128×128 scan in
//! 512-frame chunks is 32 files, a 1024×1024 scan 2048, each a request and
//! an inode. A shard groups inner chunks into one file with an index, so a
//! reader still fetches a single chunk by a byte range.

/// Decoded size of a shard when the user does not say. Measured on a
/// 128×128 × 128×128 uint16 scan (figures in benches/RESULTS.md): the write rate
/// does not depend on it; 64 MiB cuts the files of `data` from 33 to 9
/// while zarr-python's whole-array read stays near the unsharded rate,
/// where 128 and 256 MiB shards (5 and 3 files) read it up to 2× slower,
/// fewer shards giving its decoder less to run in parallel.
pub const DEFAULT_SHARD_MIB: u64 = 64;

/// The scan part `[rows, columns]` of the shard shape for a scan of
/// `rows × columns` positions in inner chunks of `chunk` scan positions,
/// `frame_bytes` decoded bytes per position, and shards of about
/// `target_bytes` decoded bytes; `None` when a shard would hold a single
/// inner chunk (sharding would only add an index).
///
/// A shard is a multiple of the inner chunk in both scan axes and always
/// holds one contiguous run of frames: whole scan rows (the columns padded
/// up to a whole number of chunks) when one such row fits in the target,
/// else consecutive chunks of one row.
pub(crate) fn scan_shard(
    rows: usize,
    columns: usize,
    chunk: [usize; 2],
    frame_bytes: usize,
    target_bytes: u64,
) -> Option<[usize; 2]> {
    let [chunk_rows, chunk_columns] = chunk.map(|c| c.max(1));
    let padded_columns = columns.div_ceil(chunk_columns) * chunk_columns;
    let padded_rows = rows.div_ceil(chunk_rows) * chunk_rows;
    let chunk_bytes = (chunk_rows * chunk_columns * frame_bytes).max(1) as u64;
    let row_band_bytes = (chunk_rows * padded_columns * frame_bytes).max(1) as u64;
    let shard = if row_band_bytes <= target_bytes {
        let bands = (target_bytes / row_band_bytes) as usize;
        [(bands * chunk_rows).min(padded_rows), padded_columns]
    } else {
        let chunks = (target_bytes / chunk_bytes).max(1) as usize;
        [chunk_rows, (chunks * chunk_columns).min(padded_columns)]
    };
    let inner = (shard[0] / chunk_rows) * (shard[1] / chunk_columns);
    (inner > 1).then_some(shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn whole_rows_group_into_shards_of_the_target_size() {
        // 128 columns, 512-frame chunks (4 rows), 32 KiB frames: 16 MiB chunks.
        let s = scan_shard(128, 128, [4, 128], 32768, 128 * MIB).unwrap();
        assert_eq!(s, [32, 128]);
        // Never taller than the scan, rounded up to whole chunks.
        assert_eq!(
            scan_shard(10, 128, [4, 128], 32768, 1 << 40),
            Some([12, 128])
        );
    }

    #[test]
    fn long_rows_shard_within_a_row_or_across_padded_rows() {
        // 1000 columns in chunks of 512 frames: a padded row is 1024 frames.
        assert_eq!(
            scan_shard(8, 1000, [1, 512], 1024, 4 * MIB),
            Some([4, 1024])
        );
        // A row larger than the target: consecutive chunks of one row.
        assert_eq!(
            scan_shard(8, 4096, [1, 512], 65536, 64 * MIB),
            Some([1, 1024])
        );
    }

    #[test]
    fn a_shard_of_one_chunk_is_no_shard() {
        assert_eq!(scan_shard(128, 128, [4, 128], 32768, 16 * MIB), None);
        assert_eq!(scan_shard(4, 128, [4, 128], 32768, 1 << 40), None);
        assert_eq!(scan_shard(128, 128, [4, 128], 32768, 0), None);
    }
}
