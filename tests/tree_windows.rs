//! A block larger than the cache budget is served in cached windows
//! (issue 16): one 4 KiB read decodes one window, not the block, and a
//! sequential reader decodes each window once instead of the whole block
//! for every read.

use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec, Writer};
use qemfs::tree::{Node, Tree, TreeOptions};

/// 2048×2040 detector, 512 frames of uint16 zeros: one block of 4.28 GB,
/// a 22 MB file.
const SHAPE: [u64; 4] = [1, 512, 2048, 2040];
const FRAME: u64 = 2048 * 2040 * 2;

#[test]
fn a_block_larger_than_the_budget_is_read_in_cached_windows() {
    let dir = tempfile::tempdir().unwrap();
    let spec = WriteSpec::counts(
        SHAPE,
        CountDtype::U16,
        scientific_metadata(SHAPE, &Calibration::default()).unwrap(),
    );
    let mut w = Writer::create(dir.path().join("huge.qem"), spec).unwrap();
    // Untouched zero pages: never made resident.
    w.push(&vec![0u8; (512 * FRAME) as usize]).unwrap();
    w.finish().unwrap();

    let mut options = TreeOptions::default();
    options.cache_bytes = 256 << 20;
    let tree = Tree::new(dir.path(), &options);
    let Node::File(data, _) = tree.resolve("huge.qem/data.npy").unwrap() else {
        panic!("data.npy is a file")
    };
    let header = data.size() - 512 * FRAME;

    // One 4 KiB read in the middle of the block.
    let mut small = vec![0xffu8; 4096];
    let at = header + 300 * FRAME + 12345;
    assert_eq!(data.read_at(at, &mut small).unwrap(), 4096);
    assert!(small.iter().all(|&b| b == 0));
    let stats = tree.cache().stats();
    assert!(stats.bytes <= stats.budget, "{stats:?}");

    // 320 MiB read sequentially in 128 KiB pieces (2560 reads): served
    // from cached windows of at most a quarter of the budget, each
    // decoded once. (Misses also count readers and prefetchers waiting
    // for a window being decoded, so the hits are what is compared: before
    // windows, a block over the budget was never kept and every read
    // decoded it whole.)
    let before = tree.cache().stats();
    let mut buf = vec![0xffu8; 128 << 10];
    let (mut offset, mut reads) = (header, 0u64);
    while offset < header + (320 << 20) {
        let n = data.read_at(offset, &mut buf).unwrap();
        assert!(buf[..n].iter().all(|&b| b == 0), "at {offset}");
        offset += n as u64;
        reads += 1;
    }
    let after = tree.cache().stats();
    let hits = after.hits - before.hits;
    assert!(
        hits >= reads * 9 / 10,
        "{hits} of {reads} reads cached: {after:?}"
    );
    // Windows of 8 frames (64 MiB / 8.4 MB): 6 of them, a few more for
    // the prefetcher's look-ahead, were loaded. Idle block cursors (84 MB
    // each) are values of the same LRU: the small read's window, its
    // look-ahead and its cursor (at frame 304, of no use to a reader from
    // frame 0) go too. How many exactly depends on how the look-ahead and
    // the reader interleave (14 to 16 seen on 2 cores); a cache that
    // thrashed would evict about once per read (thousands), so the bound
    // is a few per window loaded.
    let windows = (320u64 << 20).div_ceil(8 * FRAME) + 2;
    assert!(
        after.evictions - before.evictions <= 4 * windows,
        "{windows} windows: {after:?}"
    );
    let stats = tree.cache().stats();
    assert!(stats.bytes <= stats.budget, "{stats:?}");
}
