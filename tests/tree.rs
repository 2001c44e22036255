//! The virtual tree without FUSE: names, sizes and bytes of every node over
//! a folder of conformance fixtures, a corrupt file and ordinary files.

use std::fs;
use std::path::{Path, PathBuf};

use qemfs::npy;
use qemfs::tree::content::{read_all, read_in_pieces};
use qemfs::tree::{Node, Tree, TreeOptions};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance")
}

fn folder() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let q = fixtures().join("qem");
    for name in [
        "u16-invalid-mask-33x40",
        "u8-two-block-chunks",
        "f32-special-13x7",
        "scaled-two-regions-6x5",
    ] {
        fs::copy(
            q.join(format!("{name}.qem")),
            tmp.path().join(format!("{name}.qem")),
        )
        .unwrap();
    }
    fs::copy(
        q.join("bad-header-checksum.qem"),
        tmp.path().join("broken.qem"),
    )
    .unwrap();
    fs::create_dir(tmp.path().join("sub")).unwrap();
    fs::copy(
        fixtures().join("semq/files/utf8-escapes-quant.semq"),
        tmp.path().join("sub/emb.semq"),
    )
    .unwrap();
    fs::write(tmp.path().join("notes.txt"), b"plain file\n").unwrap();
    tmp
}

fn read(tree: &Tree, path: &str) -> Vec<u8> {
    match tree.resolve(path).unwrap_or_else(|e| panic!("{path}: {e}")) {
        Node::File(f, _) => read_all(f.as_ref()).unwrap_or_else(|e| panic!("{path}: {e}")),
        _ => panic!("{path} is not a file"),
    }
}

fn names(tree: &Tree, path: &str) -> Vec<String> {
    let node = tree.resolve(path).unwrap();
    tree.list(&node)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// Walks every node: listed sizes equal the bytes read, in one read and in
/// small pieces; every `.npy` header accounts for exactly its bytes.
fn check_all(tree: &Tree, path: &str, files: &mut usize) {
    let node = tree.resolve(path).unwrap();
    for (name, attr) in tree.list(&node).unwrap() {
        let child = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}/{name}")
        };
        if attr.is_dir {
            check_all(tree, &child, files);
            continue;
        }
        let bytes = read(tree, &child);
        assert_eq!(bytes.len() as u64, attr.size, "{child}");
        if let Node::File(f, _) = tree.resolve(&child).unwrap() {
            let pieces = read_in_pieces(f.as_ref(), 777).unwrap();
            assert_eq!(pieces, bytes, "{child} read in pieces");
        }
        if name.ends_with(".npy") {
            let h = npy::parse_header(&bytes).unwrap_or_else(|e| panic!("{child}: {e}"));
            h.check_file_len(bytes.len() as u64).unwrap();
        }
        *files += 1;
    }
}

#[test]
fn every_node_yields_exactly_its_size() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let mut files = 0;
    check_all(&tree, "", &mut files);
    assert!(files > 100, "{files}");
}

#[test]
fn containers_show_the_decoded_data() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    assert_eq!(
        names(&tree, ""),
        vec![
            "broken.qem",
            "f32-special-13x7.qem",
            "notes.txt",
            "scaled-two-regions-6x5.qem",
            "sub",
            "u16-invalid-mask-33x40.qem",
            "u8-two-block-chunks.qem",
        ]
    );
    let q = fixtures().join("qem");
    for name in [
        "u16-invalid-mask-33x40",
        "u8-two-block-chunks",
        "f32-special-13x7",
        "scaled-two-regions-6x5",
    ] {
        let want = fs::read(q.join(format!("{name}.npy"))).unwrap();
        let wh = npy::parse_header(&want).unwrap();
        let got = read(&tree, &format!("{name}.qem/data.npy"));
        let gh = npy::parse_header(&got).unwrap();
        assert_eq!((gh.dtype, &gh.shape), (wh.dtype, &wh.shape), "{name}");
        assert_eq!(&got[gh.data_offset..], &want[wh.data_offset..], "{name}");
        assert_eq!(
            read(&tree, &format!("{name}.qem/raw.qem")),
            fs::read(q.join(format!("{name}.qem"))).unwrap()
        );
        // One frame in the middle, as .npy and as TIFF pixels.
        let [r, c, dr, dc] = [wh.shape[0], wh.shape[1], wh.shape[2], wh.shape[3]];
        let (row, col) = (r / 2, c / 2);
        let fb = dr * dc * wh.dtype.size();
        let at = wh.data_offset + (row * c + col) * fb;
        let w = |n: usize| (n - 1).to_string().len();
        let frame = read(
            &tree,
            &format!(
                "{name}.qem/frames/{row:0rw$}/{col:0cw$}.npy",
                rw = w(r),
                cw = w(c)
            ),
        );
        let fh = npy::parse_header(&frame).unwrap();
        assert_eq!(fh.shape, vec![dr, dc]);
        assert_eq!(&frame[fh.data_offset..], &want[at..at + fb]);
        let tiff = read(
            &tree,
            &format!(
                "{name}.qem/frames/{row:0rw$}/{col:0cw$}.tiff",
                rw = w(r),
                cw = w(c)
            ),
        );
        assert!(tiff.windows(fb).any(|x| x == &want[at..at + fb]));
        // Digests.
        let entry = manifest_entry(name);
        assert_eq!(
            String::from_utf8(read(&tree, &format!("{name}.qem/logical_sha256"))).unwrap(),
            format!("{}\n", entry["dense_sha256"].as_str().unwrap())
        );
        assert_eq!(
            String::from_utf8(read(&tree, &format!("{name}.qem/sha256"))).unwrap(),
            format!("{}\n", entry["qem_sha256"].as_str().unwrap())
        );
        let info: Value =
            serde_json::from_slice(&read(&tree, &format!("{name}.qem/info.json"))).unwrap();
        assert_eq!(info["summary"]["shape"], serde_json::json!(wh.shape));
    }
    let codes = read(&tree, "scaled-two-regions-6x5.qem/codes.npy");
    let want = fs::read(q.join("scaled-two-regions-6x5.codes.npy")).unwrap();
    let (ch, wh) = (
        npy::parse_header(&codes).unwrap(),
        npy::parse_header(&want).unwrap(),
    );
    assert_eq!(&codes[ch.data_offset..], &want[wh.data_offset..]);
}

fn manifest_entry(name: &str) -> Value {
    let m: Value =
        serde_json::from_slice(&fs::read(fixtures().join("qem/manifest.json")).unwrap()).unwrap();
    m["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap()
        .clone()
}

#[test]
fn scan_sums_come_from_the_index_and_exclude_invalid_pixels() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let name = "u16-invalid-mask-33x40";
    let sums = read(&tree, &format!("{name}.qem/virtual/sum.npy"));
    let h = npy::parse_header(&sums).unwrap();
    assert_eq!((h.dtype, h.shape.clone()), (npy::DType::U64, vec![2, 3]));
    let data = fs::read(fixtures().join(format!("qem/{name}.npy"))).unwrap();
    let dh = npy::parse_header(&data).unwrap();
    let file = qemfs::qem::QemFile::open(fixtures().join(format!("qem/{name}.qem"))).unwrap();
    let mask = file.valid_mask().unwrap();
    let p = 33 * 40;
    for f in 0..6 {
        let want: u64 = (0..p)
            .filter(|&i| mask.is_valid(i))
            .map(|i| {
                let at = dh.data_offset + 2 * (f * p + i);
                u64::from(u16::from_le_bytes([data[at], data[at + 1]]))
            })
            .sum();
        let at = h.data_offset + 8 * f;
        assert_eq!(
            u64::from_le_bytes(sums[at..at + 8].try_into().unwrap()),
            want
        );
    }
    let png = read(&tree, &format!("{name}.qem/virtual/sum.png"));
    assert_eq!(&png[..4], b"\x89PNG");
}

#[test]
fn semq_containers_show_ids_symbols_and_digests() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let e = qemfs::semq::Encoding::open(dir.path().join("sub/emb.semq")).unwrap();
    assert_eq!(
        String::from_utf8(read(&tree, "sub/emb.semq/state_id")).unwrap(),
        format!("{}\n", qemfs::semq::to_hex(e.state_id()))
    );
    let ids = String::from_utf8(read(&tree, "sub/emb.semq/ids.txt")).unwrap();
    assert_eq!(ids.lines().count(), e.len());
    assert!(!ids.contains('\u{1}'), "control characters are escaped");
    let symbols = read(&tree, "sub/emb.semq/symbols.npy");
    let h = npy::parse_header(&symbols).unwrap();
    assert_eq!(&symbols[h.data_offset..], &e.unpack()[..]);
    let info: Value = serde_json::from_slice(&read(&tree, "sub/emb.semq/info.json")).unwrap();
    assert_eq!(info["n"], e.len());
    assert_eq!(read(&tree, "sub/emb.semq/rows.bin"), e.rows_section());
}

#[test]
fn broken_files_show_their_reason_and_do_not_hide_neighbours() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    assert_eq!(names(&tree, "broken.qem"), vec!["ERROR.txt"]);
    let text = String::from_utf8(read(&tree, "broken.qem/ERROR.txt")).unwrap();
    assert!(
        text.contains("broken.qem") && text.contains("checksum"),
        "{text}"
    );
    assert_eq!(read(&tree, "notes.txt"), b"plain file\n");
    assert!(tree.resolve("nope.qem").is_err());
    assert!(tree.resolve("notes.txt/x").is_err());
    assert!(tree
        .resolve("u8-two-block-chunks.qem/frames/9/0.npy")
        .is_err());
}

#[test]
fn changed_and_removed_sources_are_noticed() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let path = dir.path().join("u8-two-block-chunks.qem");
    let before = read(&tree, "u8-two-block-chunks.qem/logical_sha256");
    // Replace the file with another acquisition under the same name.
    fs::remove_file(&path).unwrap();
    fs::copy(fixtures().join("qem/u8-mixed-13x7.qem"), &path).unwrap();
    let after = read(&tree, "u8-two-block-chunks.qem/logical_sha256");
    assert_ne!(before, after);
    assert_eq!(
        String::from_utf8(after).unwrap(),
        format!(
            "{}\n",
            manifest_entry("u8-mixed-13x7")["dense_sha256"]
                .as_str()
                .unwrap()
        )
    );
    fs::remove_file(&path).unwrap();
    assert!(tree.resolve("u8-two-block-chunks.qem").is_err());
    assert!(!names(&tree, "").contains(&"u8-two-block-chunks.qem".to_string()));
}

/// A 40×100 scan of 8×8 uint16 frames in 512-scan chunks: eight blocks of
/// varied small counts. Returns the array written.
fn many_blocks_file(path: &std::path::Path) -> Vec<u8> {
    use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec};
    let shape = [40u64, 100, 8, 8];
    let sm = scientific_metadata(shape, &Calibration::default()).unwrap();
    let frames = (shape[0] * shape[1]) as usize;
    let dense: Vec<u8> = (0..frames * 64)
        .flat_map(|i| (((i * 2654435761usize) >> 7) as u16 % 9).to_le_bytes())
        .collect();
    qemfs::qem::write::write_file(
        path,
        WriteSpec::counts(shape, CountDtype::U16, sm).with_chunk_scans(512),
        &dense,
    )
    .unwrap();
    dense
}

/// Sequential readers trigger prefetches of the next block while other
/// readers decode: this once deadlocked (a rayon worker waiting on a block
/// its own join was decoding). Many small reads over many blocks, with a
/// watchdog.
#[test]
fn concurrent_sequential_reads_with_prefetch_finish() {
    let dir = tempfile::tempdir().unwrap();
    let dense = many_blocks_file(&dir.path().join("many-blocks.qem"));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let root = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let mut options = TreeOptions::default();
        options.cache_bytes = 1 << 16;
        let tree = std::sync::Arc::new(Tree::new(&root, &options));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let tree = tree.clone();
                std::thread::spawn(move || {
                    let Node::File(f, _) = tree.resolve("many-blocks.qem/data.npy").unwrap() else {
                        panic!("not a file")
                    };
                    let mut out = Vec::new();
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let n = f.read_at(out.len() as u64, &mut buf).unwrap();
                        if n == 0 {
                            break;
                        }
                        out.extend_from_slice(&buf[..n]);
                    }
                    out
                })
            })
            .collect();
        let outs: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let _ = done_tx.send(outs);
    });
    let outs = done_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("readers finished (no deadlock)");
    for out in outs {
        assert_eq!(npy_data_of(&out), &dense[..]);
    }
}

fn npy_data_of(bytes: &[u8]) -> &[u8] {
    let h = npy::parse_header(bytes).unwrap();
    &bytes[h.data_offset..]
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data")
}

/// The values of a uint64 `.npy` (the dtype checked).
fn u64s(bytes: &[u8]) -> Vec<u64> {
    assert_eq!(npy::parse_header(bytes).unwrap().dtype, npy::DType::U64);
    npy_data_of(bytes)
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The values of a float64 `.npy` (the dtype checked).
fn f64s(bytes: &[u8]) -> Vec<f64> {
    assert_eq!(npy::parse_header(bytes).unwrap().dtype, npy::DType::F64);
    npy_data_of(bytes)
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Per frame, the sum of counts at valid pixels with `lo ≤ d² ≤ hi`
/// about `c` (the example marks a hot pixel invalid).
fn ring_sums(counts: &[u16], det: usize, c: [f64; 2], lo: f64, hi: f64) -> Vec<u64> {
    let file = qemfs::qem::QemFile::open(examples().join("scan-u16.qem")).unwrap();
    let valid = file.valid_mask().unwrap();
    counts
        .chunks_exact(det * det)
        .map(|frame| {
            let mut s = 0u64;
            for (p, &v) in frame.iter().enumerate() {
                let (dy, dx) = ((p / det) as f64 - c[0], (p % det) as f64 - c[1]);
                let d2 = dy * dy + dx * dx;
                if lo <= d2 && d2 <= hi && valid.is_valid(p) {
                    s += u64::from(v);
                }
            }
            s
        })
        .collect()
}

#[test]
fn virtual_detectors_follow_the_geometry_they_report() {
    let tree = Tree::new(examples(), &TreeOptions::default());
    let counts: Vec<u16> = npy_data_of(&read(&tree, "scan-u16.qem/data.npy"))
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let det = 64;
    let doc: Value =
        serde_json::from_slice(&read(&tree, "scan-u16.qem/virtual/detectors.json")).unwrap();
    // The generator's disk: centre near (31.5, 31.5), radius 10.24.
    assert_eq!(doc["bright_field_disk"]["method"], "found");
    let c = [
        doc["center"][0].as_f64().unwrap(),
        doc["center"][1].as_f64().unwrap(),
    ];
    let r = doc["bright_field_radius"].as_f64().unwrap();
    assert!(
        (c[0] - 31.5).abs() < 1.0 && (c[1] - 31.5).abs() < 1.0,
        "{c:?}"
    );
    assert!((r - 10.24).abs() < 0.5, "{r}");
    let bf = u64s(&read(&tree, "scan-u16.qem/virtual/bf.npy"));
    assert_eq!(bf, ring_sums(&counts, det, c, f64::NEG_INFINITY, r * r));
    for name in ["abf", "adf", "haadf"] {
        let ring = &doc["detectors"][name];
        let (ri, ro) = (
            ring["inner_radius"].as_f64().unwrap(),
            ring["outer_radius"].as_f64().unwrap(),
        );
        let got = u64s(&read(&tree, &format!("scan-u16.qem/virtual/{name}.npy")));
        assert_eq!(got, ring_sums(&counts, det, c, ri * ri, ro * ro), "{name}");
    }
    // Custom detectors are served on lookup, not listed.
    let disk = u64s(&read(&tree, "scan-u16.qem/virtual/disk-20-40.5-7.npy"));
    assert_eq!(
        disk,
        ring_sums(&counts, det, [20.0, 40.5], f64::NEG_INFINITY, 49.0)
    );
    let ring = u64s(&read(
        &tree,
        "scan-u16.qem/virtual/annulus-31.5-31.5-12-99.npy",
    ));
    assert_eq!(
        ring,
        ring_sums(&counts, det, [31.5, 31.5], 144.0, 99.0 * 99.0)
    );
    assert!(!names(&tree, "scan-u16.qem/virtual")
        .iter()
        .any(|n| n.starts_with("disk-")));
    assert!(tree.resolve("scan-u16.qem/virtual/disk-1-2.npy").is_err());

    // Centre of mass: the generator moves the disk by 1.5 sin(0.4 row)
    // along detector rows; mean-subtracted values follow that.
    let com_row = f64s(&read(&tree, "scan-u16.qem/virtual/com_row.npy"));
    let file = qemfs::qem::QemFile::open(examples().join("scan-u16.qem")).unwrap();
    let valid = file.valid_mask().unwrap();
    let mut want = Vec::new();
    for frame in counts.chunks_exact(det * det) {
        let total: u64 = frame
            .iter()
            .enumerate()
            .filter(|&(p, _)| valid.is_valid(p))
            .map(|(_, &v)| u64::from(v))
            .sum();
        let moment: u64 = frame
            .iter()
            .enumerate()
            .filter(|&(p, _)| valid.is_valid(p))
            .map(|(p, &v)| (p / det) as u64 * u64::from(v))
            .sum();
        want.push(moment as f64 / total as f64);
    }
    let mean = want.iter().sum::<f64>() / want.len() as f64;
    for (f, (&got, w)) in com_row.iter().zip(&want).enumerate() {
        assert!(
            (got - (w - mean)).abs() < 1e-12,
            "frame {f}: {got} vs {}",
            w - mean
        );
    }
    let mean_dp = f64s(&read(&tree, "scan-u16.qem/virtual/mean_dp.npy"));
    let frames = counts.len() / (det * det);
    for p in (0..det * det).filter(|&p| valid.is_valid(p)).step_by(97) {
        let s: u64 = (0..frames)
            .map(|f| u64::from(counts[f * det * det + p]))
            .sum();
        assert_eq!(mean_dp[p], s as f64 / frames as f64);
    }
}

#[test]
fn given_geometry_is_used_and_reported() {
    let mut options = TreeOptions::default();
    options.detectors.center = Some([10.0, 12.0]);
    options.detectors.bf_radius = Some(4.0);
    options.detectors.adf = Some([5.0, 6.0]);
    let tree = Tree::new(examples(), &options);
    let doc: Value =
        serde_json::from_slice(&read(&tree, "scan-u16.qem/virtual/detectors.json")).unwrap();
    assert_eq!(doc["bright_field_disk"]["method"], "given");
    assert_eq!(doc["detectors"]["adf"]["inner_radius"], 5.0);
    assert_eq!(doc["detectors"]["abf"]["outer_radius"], 4.0);
    let counts: Vec<u16> = npy_data_of(&read(&tree, "scan-u16.qem/data.npy"))
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let bf = u64s(&read(&tree, "scan-u16.qem/virtual/bf.npy"));
    assert_eq!(
        bf,
        ring_sums(&counts, 64, [10.0, 12.0], f64::NEG_INFINITY, 16.0)
    );
}

#[test]
fn a_source_truncated_while_open_gives_an_error_not_a_crash() {
    qemfs::mapguard::install();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.qem");
    fs::copy(examples().join("scan-u16.qem"), &path).unwrap();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let Node::File(data, _) = tree.resolve("big.qem/data.npy").unwrap() else {
        panic!("data.npy is a file")
    };
    let Node::File(bf, _) = tree.resolve("big.qem/virtual/bf.npy").unwrap() else {
        panic!("bf.npy is a file")
    };
    let mut buf = vec![0u8; 1 << 16];
    assert!(data.read_at(0, &mut buf).is_ok());
    let len = fs::metadata(&path).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    // Blocks in the truncated part: an error, never garbage or a crash.
    let last = data.size() - 4096;
    let got = data.read_at(last, &mut buf);
    assert!(got.is_err(), "{got:?}");
    assert!(bf.read_at(0, &mut buf).is_err());
    // The tree notices the change and shows the file as it is now.
    let node = tree.resolve("big.qem").unwrap();
    let names: Vec<String> = tree
        .list(&node)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["ERROR.txt"]);
}

#[test]
fn mask_npy_is_the_validity_mask_and_info_counts_valid_pixels() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let name = "u16-invalid-mask-33x40";
    let entry = manifest_entry(name);
    // The manifest's mask: hex, one bit per pixel, most significant first.
    let hex = entry["valid"].as_str().unwrap();
    let bits: Vec<u8> = (0..33 * 40)
        .map(|p| {
            let byte = u8::from_str_radix(&hex[p / 8 * 2..p / 8 * 2 + 2], 16).unwrap();
            (byte >> (7 - p % 8)) & 1
        })
        .collect();
    let mask = read(&tree, &format!("{name}.qem/mask.npy"));
    let h = npy::parse_header(&mask).unwrap();
    assert_eq!((h.dtype, h.shape.clone()), (npy::DType::Bool, vec![33, 40]));
    assert_eq!(&mask[h.data_offset..], &bits[..]);
    assert!(names(&tree, &format!("{name}.qem")).contains(&"mask.npy".to_string()));

    let info: Value =
        serde_json::from_slice(&read(&tree, &format!("{name}.qem/info.json"))).unwrap();
    let invalid = entry["invalid_pixels"].as_u64().unwrap();
    assert_eq!(info["summary"]["valid_pixels"], 33 * 40 - invalid);
    assert_eq!(info["summary"]["invalid_pixels"], invalid);
    // Codecs without a mask have no mask.npy and no count.
    for other in ["f32-special-13x7", "scaled-two-regions-6x5"] {
        assert!(!names(&tree, &format!("{other}.qem")).contains(&"mask.npy".to_string()));
        let info: Value =
            serde_json::from_slice(&read(&tree, &format!("{other}.qem/info.json"))).unwrap();
        assert_eq!(info["summary"]["valid_pixels"], Value::Null);
    }
}

#[test]
fn previews_are_enlarged_copies_of_their_images() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let base = "u16-invalid-mask-33x40.qem/virtual";
    let npy_bytes = read(&tree, &format!("{base}/bf.npy"));
    let h = npy::parse_header(&npy_bytes).unwrap();
    // bf.npy of counts is uint64 (exact sums); the preview shows them as f32.
    assert_eq!(h.dtype, npy::DType::U64);
    let values: Vec<f32> = npy_bytes[h.data_offset..]
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as f32)
        .collect();
    let (rows, columns) = (h.shape[0], h.shape[1]);
    let png_bytes = read(&tree, &format!("{base}/bf.png"));
    let mut reader = png::Decoder::new(std::io::Cursor::new(png_bytes))
        .read_info()
        .unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    let (w, h) = (info.width as usize, info.height as usize);
    assert!(w.max(h) >= 256, "{h}x{w}");
    let k = h / rows;
    assert_eq!((h, w), (rows * k, columns * k));
    let gray = qemfs::export::png::auto_contrast(&values);
    for y in 0..h {
        for x in 0..w {
            assert_eq!(pixels[y * w + x], gray[y / k * columns + x / k]);
        }
    }
}

#[test]
fn data_tiff_pages_are_the_frames_in_any_read_size() {
    let dir = folder();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let name = "u16-invalid-mask-33x40";
    let Node::File(content, _) = tree.resolve(&format!("{name}.qem/data.tiff")).unwrap() else {
        panic!("data.tiff is not a file");
    };
    let whole = read_all(content.as_ref()).unwrap();
    assert_eq!(whole.len() as u64, content.size());
    // Reads of odd sizes at odd offsets give the same bytes.
    for step in [1usize, 7, 4093] {
        let mut at = 0;
        while at < whole.len() {
            let mut buf = vec![0u8; step];
            let n = content.read_at(at as u64, &mut buf).unwrap();
            assert!(n > 0);
            assert_eq!(&buf[..n], &whole[at..at + n], "step {step} at {at}");
            at += n;
        }
    }
    let npy_bytes = fs::read(fixtures().join(format!("qem/{name}.npy"))).unwrap();
    let h = npy::parse_header(&npy_bytes).unwrap();
    let frame_bytes = 33 * 40 * 2;
    let mut decoder = tiff::decoder::Decoder::new(std::io::Cursor::new(&whole)).unwrap();
    for f in 0..6 {
        let tiff::decoder::DecodingResult::U16(page) = decoder.read_image().unwrap() else {
            panic!("page {f} is not uint16");
        };
        let page: Vec<u8> = page.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            page,
            &npy_bytes[h.data_offset + f * frame_bytes..][..frame_bytes]
        );
        if f < 5 {
            decoder.next_image().unwrap();
        }
    }
    assert!(!decoder.more_images());
}

/// What a read answers with through `held_at` (lent from a held window,
/// as the mount replies) or, where that declines, `read_at`.
fn lent_or_copied(f: &dyn qemfs::tree::Content, offset: u64, len: usize) -> (Vec<u8>, bool) {
    let len = len.min(f.size().saturating_sub(offset) as usize);
    if let Some(held) = f.held_at(offset, len).unwrap() {
        assert_eq!(held.len(), len, "lent {} of {len} at {offset}", held.len());
        return (held.to_vec(), true);
    }
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(offset + done as u64, &mut buf[done..]).unwrap();
        assert!(n > 0);
        done += n;
    }
    (buf, false)
}

/// Reads of `data.npy` lent from the cached window that holds them (the
/// mount's zero-copy reply) give the bytes a copying read gives, at block
/// edges, across them, in the header and at the end; a float file read
/// that way end to end still has its whole-array checksum checked.
#[test]
fn reads_lent_from_held_windows_match_copied_reads() {
    let dir = tempfile::tempdir().unwrap();
    let dense = many_blocks_file(&dir.path().join("blocks.qem"));
    fs::copy(
        examples().join("empad-f32.qem"),
        dir.path().join("float.qem"),
    )
    .unwrap();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let file = |p: &str| match tree.resolve(p).unwrap() {
        Node::File(f, _) => f,
        _ => panic!("{p} is not a file"),
    };

    let data = file("blocks.qem/data.npy");
    let header = data.size() - dense.len() as u64;
    let block = 512 * 128u64;
    let mut lent = 0;
    for (offset, len, must_lend) in [
        (0, 100, false),
        (header - 10, 4096, false),
        (header, 4096, true),
        (header + 1000, 60000, true),
        (header + block - 100, 4096, false),
        (header + block, block as usize, true),
        (header + 3 * block + 7, 1 << 20, false),
        (data.size() - 50, 4096, true),
    ] {
        let (got, was_lent) = lent_or_copied(data.as_ref(), offset, len);
        let start = (offset - header.min(offset)) as usize;
        if offset >= header {
            assert_eq!(got, dense[start..start + got.len()], "at {offset}");
        }
        let mut copied = vec![0u8; got.len()];
        assert_eq!(data.read_at(offset, &mut copied).unwrap(), got.len());
        assert_eq!(got, copied, "at {offset} (+{len})");
        assert!(
            was_lent || !must_lend,
            "{offset} +{len} was copied, not lent"
        );
        lent += usize::from(was_lent);
    }
    assert_eq!(lent, 4);

    // The float file end to end in 4 KiB reads, lent where they can be.
    let data = file("float.qem/data.npy");
    let whole = read_all(data.as_ref()).unwrap();
    let fresh = Tree::new(dir.path(), &TreeOptions::default());
    let Node::File(data, _) = fresh.resolve("float.qem/data.npy").unwrap() else {
        panic!("not a file")
    };
    let (mut out, mut lent) = (Vec::new(), 0);
    while (out.len() as u64) < data.size() {
        let (bytes, was_lent) = lent_or_copied(data.as_ref(), out.len() as u64, 4096);
        lent += usize::from(was_lent);
        out.extend(bytes);
    }
    assert_eq!(out, whole);
    assert!(lent > 0, "no read of the float file was lent");
    assert_eq!(
        read(&fresh, "float.qem/logical_sha256"),
        read(&tree, "float.qem/logical_sha256")
    );
}

/// The CPU backend, counting the runs of blocks it is asked to reduce.
struct Counting {
    calls: std::sync::atomic::AtomicUsize,
}

impl qemfs::reduce::Accelerator for Counting {
    fn name(&self) -> &str {
        "counting"
    }

    fn reduce(
        &self,
        file: &qemfs::qem::QemFile,
        blocks: std::ops::Range<usize>,
        request: &qemfs::reduce::Request,
    ) -> Result<qemfs::reduce::Partial, qemfs::reduce::ReduceError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        qemfs::reduce::Cpu.reduce(file, blocks, request)
    }
}

/// Under a budget smaller than any image, an image read piece by piece is
/// computed once for its first piece, not again for every later piece, nor
/// for its `.tiff` and `.png`; and every byte is the one a tree with room
/// to spare serves.
#[test]
fn images_larger_than_the_budget_are_computed_once_for_all_their_files() {
    use std::sync::atomic::Ordering::SeqCst;
    let counting = std::sync::Arc::new(Counting {
        calls: Default::default(),
    });
    let mut small = TreeOptions::default();
    small.cache_bytes = 64;
    small.accelerator = counting.clone();
    let tiny = Tree::new(examples(), &small);
    let roomy = Tree::new(examples(), &TreeOptions::default());
    // Files whose images are all made by the backend (counts can be
    // summed from the spatial index without it).
    for file in ["empad-f32.qem", "derived-scaled.qem"] {
        for group in [
            &["bf.npy", "bf.tiff", "bf.png"][..],
            &["idpc.npy", "idpc.tiff", "idpc.png"],
            &["com_col.tiff", "com_col.npy"],
            &["disk-8-9-3.npy", "disk-8-9-3.png"],
        ] {
            let before = counting.calls.load(SeqCst);
            let mut after_first_piece = None;
            for name in group {
                let path = format!("{file}/virtual/{name}");
                let Node::File(f, _) = tiny.resolve(&path).unwrap() else {
                    panic!("{path} is not a file")
                };
                // A piece that ends inside the header (or, for a `.png`
                // after its image, its signature) computes nothing.
                let calls = counting.calls.load(SeqCst);
                let mut head = [0u8; 10];
                assert_eq!(f.read_at(0, &mut head).unwrap(), 10);
                assert_eq!(counting.calls.load(SeqCst), calls, "{path}: header");
                // A piece past any header.
                let mut buf = [0u8; 100];
                f.read_at(f.size() / 2, &mut buf).unwrap();
                let first = *after_first_piece.get_or_insert(counting.calls.load(SeqCst));
                assert!(first > before, "{path}: computed by the backend");
                let bytes = read_in_pieces(f.as_ref(), 100).unwrap();
                assert_eq!(bytes, read(&roomy, &path), "{path}");
                assert_eq!(head, bytes[..10], "{path}");
                assert_eq!(counting.calls.load(SeqCst), first, "{path}: computed again");
            }
        }
    }
}

/// Writes `sound.qem`, a 16 × 16 scan of 64 × 64 counts (a bright disk of
/// radius 10 at the centre), and `damaged.qem`, the same with one body
/// byte flipped, into `dir`; returns the counts. Large enough that its
/// first reads are served while the body checksum is computed beside them.
fn sound_and_damaged(dir: &std::path::Path) -> Vec<u16> {
    use qemfs::qem::write::{
        encode_to_vec, scientific_metadata, Calibration, CountDtype, WriteSpec,
    };
    let (scan, det) = (16usize, 64usize);
    let shape = [scan as u64, scan as u64, det as u64, det as u64];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut values = Vec::with_capacity(scan * scan * det * det);
    for _ in 0..scan * scan {
        for r in 0..det {
            for c in 0..det {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let d2 = (r as i64 - 32).pow(2) + (c as i64 - 32).pow(2);
                let level = if d2 <= 100 { 8 } else { 1 };
                values.push((state % (2 * level + 1)) as u16);
            }
        }
    }
    let dense: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U16,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let sound = encode_to_vec(spec, &dense).unwrap();
    fs::write(dir.join("sound.qem"), &sound).unwrap();
    let mut damaged = sound.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x10;
    fs::write(dir.join("damaged.qem"), &damaged).unwrap();
    values
}

/// The first virtual products of a file are made while the body checksum
/// is computed beside them (`QemFile::beside_checksums`): with a sound
/// body they equal a sum over the dense array; with one flipped body
/// byte, every product fails with the checksum error, whatever the
/// speculative pass found, and a second read fails again (nothing was
/// kept).
#[test]
fn first_products_wait_for_the_body_checksum() {
    let det = 64usize;
    let dir = tempfile::tempdir().unwrap();
    let values = sound_and_damaged(dir.path());

    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let disk = read(&tree, "sound.qem/virtual/disk-32-32-10.npy");
    let header = npy::parse_header(&disk).unwrap();
    let got: Vec<u64> = disk[header.data_offset..]
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want: Vec<u64> = values
        .chunks_exact(det * det)
        .map(|frame| {
            let inside =
                |p: usize| (p / det).abs_diff(32).pow(2) + (p % det).abs_diff(32).pow(2) <= 100;
            (0..det * det)
                .filter(|&p| inside(p))
                .map(|p| u64::from(frame[p]))
                .sum()
        })
        .collect();
    assert_eq!(got, want);

    for product in [
        "virtual/detectors.json",
        "virtual/bf.npy",
        "virtual/disk-32-32-10.npy",
        "virtual/com_row.npy",
        "virtual/sum.npy",
    ] {
        fails_twice_with_the_checksum_error(&tree, &format!("damaged.qem/{product}"));
    }
}

/// A chunk's first block decode runs beside its body checksums
/// (`QemFile::beside_chunk_checks`): the array and its Zarr chunks read
/// from a sound body equal the counts; from a damaged one, every read
/// fails with the checksum error, twice (the speculative decode was not
/// kept).
#[test]
fn first_block_decodes_wait_for_the_body_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let values = sound_and_damaged(dir.path());
    let dense: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tree = Tree::new(dir.path(), &TreeOptions::default());
    let array = read(&tree, "sound.qem/data.npy");
    let header = npy::parse_header(&array).unwrap();
    assert_eq!(&array[header.data_offset..], &dense[..]);
    let chunk = read(&tree, "sound.qem/data.zarr/data/0.0.0.0");
    assert_eq!(chunk, dense[..chunk.len()]);

    for path in ["damaged.qem/data.zarr/data/0.0.0.0", "damaged.qem/data.npy"] {
        fails_twice_with_the_checksum_error(&tree, path);
    }
}

/// Reading `path` whole fails with the body checksum error, and again
/// on a second read (nothing from the damaged body was kept).
fn fails_twice_with_the_checksum_error(tree: &Tree, path: &str) {
    for attempt in 0..2 {
        let Node::File(f, _) = tree.resolve(path).unwrap() else {
            panic!("{path} is not a file");
        };
        let err = read_all(f.as_ref())
            .err()
            .unwrap_or_else(|| panic!("{path} was served from a damaged body"));
        assert!(
            err.to_string().contains("body checksum mismatch"),
            "{path}, read {attempt}: {err}"
        );
    }
}
