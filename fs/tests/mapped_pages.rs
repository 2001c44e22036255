//! The daemon's resident memory does not grow with how much of its source
//! files it has read: a source is memory-mapped, and the pages a decode
//! read are let go after it (they stay in the page cache). Reading a
//! 67 MB `.qem` whole, then every virtual image of it, or the whole
//! `vectors.npy` of an 11 MB `.semq`, leaves far less than that of either
//! mapped in the daemon.

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use common::{
    can_mount, daemon_pid, mount, qemfs, run, source_and_mountpoint, text, unmount, UnmountOnDrop,
};
use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec, Writer};

const SHAPE: [u64; 4] = [16, 32, 256, 256];

/// Resident file-backed pages of `pid` (`RssFile`), in KiB.
fn rss_file_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A `.semq` of 65,536 vectors of 256 coordinates at 16 bins (4 bits a
/// coordinate), made by `semq encode`.
fn write_semq(dir: &Path, out: &Path) {
    let (n, dim) = (65_536usize, 256usize);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut vectors = Vec::with_capacity(4 * n * dim);
    for _ in 0..n {
        // Unit norm, as the operator requires.
        let row: Vec<f64> = (0..dim)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f64 / (1u64 << 23) as f64 - 1.0
            })
            .collect();
        let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
        for v in row {
            vectors.extend_from_slice(&((v / norm) as f32).to_le_bytes());
        }
    }
    let (v, ids) = (dir.join("v.f32"), dir.join("ids.txt"));
    fs::write(&v, vectors).unwrap();
    let lines: String = (0..n).map(|i| format!("{}\n", i * 3)).collect();
    fs::write(&ids, lines).unwrap();
    let semq = qemfs().with_file_name("semq");
    let out = run(Command::new(semq)
        .args([
            "encode",
            "--op",
            "quant",
            "--dim",
            "256",
            "--bins",
            "16",
            "--vectors",
        ])
        .arg(&v)
        .arg("--ids")
        .arg(&ids)
        .arg(out));
    assert!(out.status.success(), "semq encode: {}", text(&out));
}

#[test]
fn pages_of_a_source_read_whole_are_let_go() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = source_and_mountpoint(dir.path());
    // Counts of 12 random bits: about 1.5 bytes a value once compressed.
    let n = SHAPE.iter().product::<u64>() as usize;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let dense: Vec<u8> = (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as u16 & 0xfff).to_le_bytes()
        })
        .collect();
    let path = src.join("noisy.qem");
    let spec = WriteSpec::counts(
        SHAPE,
        CountDtype::U16,
        scientific_metadata(SHAPE, &Calibration::default()).unwrap(),
    );
    let mut w = Writer::create(&path, spec).unwrap();
    w.push(&dense).unwrap();
    w.finish().unwrap();
    let file_kib = fs::metadata(&path).unwrap().len() / 1024;
    assert!(file_kib > 30 << 10, "a source of {file_kib} KiB");

    let out = mount(&src, &mnt, &["--cache-size", "64", "--gpu", "off"]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let _unmount = UnmountOnDrop(mnt.clone());
    let pid = daemon_pid(&mnt);
    let root = mnt.join("noisy.qem");
    fs::metadata(root.join("data.npy")).unwrap();
    let before = rss_file_kib(pid);
    let mut read = Vec::new();
    fs::File::open(root.join("data.npy"))
        .unwrap()
        .read_to_end(&mut read)
        .unwrap();
    assert!(read.ends_with(&dense), "data.npy holds the counts");
    for image in ["sum", "bf", "adf", "haadf"] {
        fs::read(root.join(format!("virtual/{image}.npy"))).unwrap();
    }
    let grown = rss_file_kib(pid).saturating_sub(before);
    eprintln!("file {file_kib} KiB; daemon RssFile {before} KiB, then +{grown} KiB");
    assert!(
        grown < file_kib / 4,
        "the daemon kept {grown} KiB of a {file_kib} KiB source resident"
    );

    let semq = src.join("vectors.semq");
    write_semq(dir.path(), &semq);
    let semq_kib = fs::metadata(&semq).unwrap().len() / 1024;
    let reference = dir.path().join("reference.npy");
    let out = run(Command::new(qemfs().with_file_name("semq"))
        .args(["convert", "--what", "vectors"])
        .arg(&semq)
        .arg(&reference));
    assert!(out.status.success(), "semq convert: {}", text(&out));
    // Before the lookup that opens (and verifies) the file.
    let before = rss_file_kib(pid);
    let vectors = mnt.join("vectors.semq/vectors.npy");
    assert!(
        fs::read(&vectors).unwrap() == fs::read(&reference).unwrap(),
        "vectors.npy holds what semq convert writes"
    );
    let grown = rss_file_kib(pid).saturating_sub(before);
    eprintln!("semq {semq_kib} KiB; daemon RssFile {before} KiB, then +{grown} KiB");
    assert!(
        grown < semq_kib / 4,
        "the daemon kept {grown} KiB of a {semq_kib} KiB .semq resident"
    );
    assert!(unmount(&mnt).status.success());
}
