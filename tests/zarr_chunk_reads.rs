//! Chunk files of `data.zarr/data` read through the filesystem core as the
//! kernel reads them (1 MiB requests, and odd sizes that straddle cached
//! windows): every byte equals the same scan positions of `data.npy`, edge
//! chunks padded with zeros, and a request inside one cached window is
//! answered from that window without a copy; readers at once under a tiny
//! budget still get exact bytes.

use std::ffi::OsStr;
use std::sync::Arc;

use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec, Writer};
use qemfs::tree::content::read_all;
use qemfs::tree::filesystem::{Filesystem, ReadBytes};
use qemfs::tree::{Node, Tree, TreeOptions};

const DETECTOR: u64 = 32;
const FRAME: usize = (DETECTOR * DETECTOR * 2) as usize;

/// A uint16 file of `rows`×`columns` scan positions with distinct values
/// per frame and pixel.
fn write(dir: &std::path::Path, name: &str, rows: u64, columns: u64) {
    let shape = [rows, columns, DETECTOR, DETECTOR];
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let mut w = Writer::create(dir.join(name), spec).unwrap();
    let pixels = (DETECTOR * DETECTOR) as usize;
    let values: Vec<u16> = (0..(rows * columns) as usize * pixels)
        .map(|i| ((i / pixels) * 7 + (i % pixels) % 5) as u16)
        .collect();
    w.push_u16(&values).unwrap();
    w.finish().unwrap();
}

fn walk(fs: &Filesystem, path: &str) -> (u64, u64) {
    let mut ino = 1;
    let mut size = 0;
    for part in path.split('/') {
        let (i, attr) = fs.lookup(ino, OsStr::new(part)).unwrap();
        (ino, size) = (i, attr.size);
    }
    (ino, size)
}

/// Reads every chunk of `name` in requests of `piece` bytes and checks
/// it against `data.npy`; returns how many requests were answered from a
/// cached window directly.
fn check_chunks(fs: &Filesystem, tree: &Tree, name: &str, piece: u32) -> usize {
    let Node::File(npy, _) = tree.resolve(&format!("{name}/data.npy")).unwrap() else {
        panic!("data.npy is a file")
    };
    let npy = read_all(npy.as_ref()).unwrap();
    let Node::File(meta, _) = tree
        .resolve(&format!("{name}/data.zarr/data/zarr.json"))
        .unwrap()
    else {
        panic!("zarr.json is a file")
    };
    let meta: serde_json::Value =
        serde_json::from_slice(&read_all(meta.as_ref()).unwrap()).unwrap();
    let shape: Vec<usize> = serde_json::from_value(meta["shape"].clone()).unwrap();
    let chunk: Vec<usize> =
        serde_json::from_value(meta["chunk_grid"]["configuration"]["chunk_shape"].clone()).unwrap();
    let array = &npy[npy.len() - shape[0] * shape[1] * FRAME..];
    let mut shared = 0;
    for i in 0..shape[0].div_ceil(chunk[0]) {
        for j in 0..shape[1].div_ceil(chunk[1]) {
            let mut expected = vec![0u8; chunk[0] * chunk[1] * FRAME];
            for r in 0..chunk[0] {
                for c in 0..chunk[1] {
                    let (row, column) = (i * chunk[0] + r, j * chunk[1] + c);
                    if row < shape[0] && column < shape[1] {
                        let from = (row * shape[1] + column) * FRAME;
                        let to = (r * chunk[1] + c) * FRAME;
                        expected[to..to + FRAME].copy_from_slice(&array[from..from + FRAME]);
                    }
                }
            }
            let (ino, size) = walk(fs, &format!("{name}/data.zarr/data/{i}.{j}.0.0"));
            assert_eq!(size as usize, expected.len(), "chunk {i}.{j} of {name}");
            let fh = fs.open(ino, true).unwrap();
            let file = fs.file(fh).unwrap();
            let mut got = Vec::new();
            loop {
                let bytes = file.read_bytes(got.len() as u64, piece).unwrap();
                if bytes.is_empty() {
                    break;
                }
                shared += matches!(bytes, ReadBytes::Held(_)) as usize;
                got.extend_from_slice(&bytes);
            }
            fs.release(fh);
            assert!(
                got == expected,
                "chunk {i}.{j} of {name}, {piece}-byte reads"
            );
        }
    }
    shared
}

#[test]
fn chunk_reads_equal_the_array_and_whole_block_chunks_are_not_copied() {
    let dir = tempfile::tempdir().unwrap();
    // 8×128 scan: chunks of 4 rows × 128 columns, one 512-scan block each.
    write(dir.path(), "aligned.qem", 8, 128);
    // 7×100: chunks of 5 rows × 100 columns straddle blocks, and the last
    // one is padded past the scan's edge.
    write(dir.path(), "straddling.qem", 7, 100);
    let tree = Arc::new(Tree::new(dir.path(), &TreeOptions::default()));
    let fs = Filesystem::new(Arc::clone(&tree), Vec::new());

    // Kernel-sized requests inside one block: all answered from the cache.
    let requests = 2 * (4 * 128 * FRAME) / (1 << 20);
    assert_eq!(check_chunks(&fs, &tree, "aligned.qem", 1 << 20), requests);
    // Odd sizes straddle windows: copied, and still exact.
    check_chunks(&fs, &tree, "aligned.qem", 777_777);
    check_chunks(&fs, &tree, "straddling.qem", 1 << 20);
    check_chunks(&fs, &tree, "straddling.qem", 100_003);
}

/// Four readers at once, each reading every chunk in 256 KiB requests,
/// under a budget of two blocks: blocks are evicted between a chunk's
/// requests, taken back while still in memory, and their buffers reused
/// for other blocks' decodes; every reader still gets exactly the array.
#[test]
fn chunks_read_at_once_under_a_tiny_budget_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    // 32×128 scan: eight chunks of one 1 MiB block each.
    write(dir.path(), "many.qem", 32, 128);
    let mut options = TreeOptions::default();
    options.cache_bytes = 2 << 20;
    let tree = Arc::new(Tree::new(dir.path(), &options));
    let fs = Filesystem::new(Arc::clone(&tree), Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| check_chunks(&fs, &tree, "many.qem", 256 << 10));
        }
    });
    let stats = tree.cache().stats();
    assert!(stats.evictions > 0, "the budget was too large to evict");
}
