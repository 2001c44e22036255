//! Memory follows the window budget, not the detector size a file declares
//! (issue 16): a valid, tiny file whose one block decodes to 4.28 GB
//! (2048×2040 detector, 512 frames of uint16 zeros) is validated, hashed,
//! converted and read whole by `qem cat` under a 2 GiB address-space limit.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec, Writer};
use sha2::{Digest, Sha256};

const SHAPE: [u64; 4] = [1, 512, 2048, 2040];
const DENSE: usize = 512 * 2048 * 2040 * 2;
/// `prlimit --as`: 2 GiB of address space.
const LIMIT: &str = "--as=2147483648";

/// The file, by our writer: every stream is the zeros form, so it is small.
fn write_huge(path: &Path) {
    let spec = WriteSpec::counts(
        SHAPE,
        CountDtype::U16,
        scientific_metadata(SHAPE, &Calibration::default()).unwrap(),
    );
    let mut w = Writer::create(path, spec).unwrap();
    // Untouched zero pages: the writer reads them without making them
    // resident.
    let zeros = vec![0u8; DENSE];
    w.push(&zeros).unwrap();
    w.finish().unwrap();
    assert!(std::fs::metadata(path).unwrap().len() < 64 << 20);
}

/// `qem ARGS` under the address-space limit, its stdout streamed to `sink`.
fn limited(args: &[&str], mut sink: impl FnMut(&[u8])) -> (bool, String) {
    let qem = assert_cmd::cargo::cargo_bin("qem");
    let mut child = Command::new("prlimit")
        .arg(LIMIT)
        .arg(qem)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) runs");
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        sink(&buf[..n]);
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), stderr)
}

#[test]
fn a_huge_block_is_validated_hashed_converted_and_read_within_2_gib() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.qem");
    write_huge(&path);
    let file = path.to_str().unwrap();

    let mut said = Vec::new();
    let (ok, err) = limited(&["validate", file], |b| said.extend_from_slice(b));
    assert!(ok, "validate: {err}");
    assert_eq!(String::from_utf8_lossy(&said), format!("{file}: OK\n"));

    // The digest of 4.28 GB of zero bytes, computed here.
    let mut zeros = Sha256::new();
    let block = vec![0u8; 1 << 24];
    for _ in 0..DENSE / block.len() {
        zeros.update(&block);
    }
    let want: String = zeros
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut said = Vec::new();
    let (ok, err) = limited(&["hash", file], |b| said.extend_from_slice(b));
    assert!(ok, "hash: {err}");
    assert_eq!(String::from_utf8_lossy(&said), format!("{want}  {file}\n"));

    // Re-encoded through the windowed .qem source: the same array.
    let copy = dir.path().join("copy.qem");
    let copy = copy.to_str().unwrap();
    let (ok, err) = limited(&["convert", file, copy], |_| {});
    assert!(ok, "convert: {err}");
    let mut said = Vec::new();
    let (ok, err) = limited(&["hash", copy], |b| said.extend_from_slice(b));
    assert!(ok, "hash of the copy: {err}");
    assert_eq!(String::from_utf8_lossy(&said), format!("{want}  {copy}\n"));
    // A chunk length chosen past the ceiling (512 of these frames: 4.28 GB
    // held while the chunk is written) is refused up front, naming the
    // most that fit, and nothing is written.
    let wide = dir.path().join("wide.qem");
    let (ok, err) = limited(
        &[
            "convert",
            file,
            wide.to_str().unwrap(),
            "--chunk-scans",
            "512",
        ],
        |_| {},
    );
    assert!(!ok && err.contains("at most 128 scans fit"), "{err}");
    assert!(!wide.exists());

    // As a Zarr store, chunks written from bounded windows of the block,
    // and back: the same array.
    let store = dir.path().join("huge.zarr");
    let store = store.to_str().unwrap();
    let (ok, err) = limited(&["convert", file, store], |_| {});
    assert!(ok, "convert to .zarr: {err}");
    let back = dir.path().join("back.qem");
    let back = back.to_str().unwrap();
    let (ok, err) = limited(&["convert", store, back], |_| {});
    assert!(ok, "convert from .zarr: {err}");
    let mut said = Vec::new();
    let (ok, err) = limited(&["hash", back], |b| said.extend_from_slice(b));
    assert!(ok, "hash of the Zarr round trip: {err}");
    assert_eq!(String::from_utf8_lossy(&said), format!("{want}  {back}\n"));

    // data.npy whole: an npy header of the declared shape, then every
    // decoded byte, all zero.
    let (mut head, mut total, mut nonzero) = (Vec::new(), 0usize, 0usize);
    let (ok, err) = limited(&["cat", file, "data.npy"], |b| {
        if head.len() < 256 {
            head.extend_from_slice(&b[..b.len().min(256)]);
        }
        total += b.len();
        nonzero += b.iter().filter(|&&x| x != 0).count();
    });
    assert!(ok, "cat: {err}");
    let header_len = 10 + usize::from(u16::from_le_bytes([head[8], head[9]]));
    let header = String::from_utf8_lossy(&head[10..header_len.min(head.len())]).into_owned();
    assert!(head.starts_with(b"\x93NUMPY"), "{header}");
    assert!(header.contains("'descr': '<u2'"), "{header}");
    assert!(header.contains("'shape': (1, 512, 2048, 2040)"), "{header}");
    assert_eq!(total, header_len + DENSE);
    // The header's own bytes are not zero; every decoded one is.
    let header_nonzero = head[..header_len].iter().filter(|&&x| x != 0).count();
    assert_eq!(nonzero, header_nonzero);
}

/// `qem ls` pages through a folder as the mount's readdir does: `frames/`
/// of a 10 M-row scan is listed under the same limit, at a peak RSS of
/// 165 MB. Listed whole it peaked at 1.95 GB and aborted under the limit.
#[test]
fn a_huge_frames_folder_is_listed_within_the_limit() {
    use qemfs::qem::write::encode_to_vec;
    const ROWS: usize = 10_000_000;
    let shape = [ROWS as u64, 1, 1, 2];
    let spec = WriteSpec::counts(
        shape,
        CountDtype::U8,
        scientific_metadata(shape, &Calibration::default()).unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tall.qem");
    std::fs::write(&path, encode_to_vec(spec, &vec![0u8; ROWS * 2]).unwrap()).unwrap();
    if let Ok(keep) = std::env::var("QEMFS_KEEP_TALL") {
        std::fs::copy(&path, keep).unwrap();
    }
    let (mut lines, mut last) = (0usize, Vec::new());
    let (ok, err) = limited(&["ls", path.to_str().unwrap(), "frames"], |b| {
        lines += b.iter().filter(|&&c| c == b'\n').count();
        last.extend_from_slice(b);
        let keep = last.len().saturating_sub(64);
        last.drain(..keep);
    });
    assert!(ok, "ls: {err}");
    assert_eq!(lines, ROWS);
    assert!(
        last.ends_with(b"9999999/\n"),
        "{}",
        String::from_utf8_lossy(&last)
    );
}
