//! A block far larger than the budget, through the real mount (issues 14
//! and 16): a valid 2048×2040 file whose one 512-scan block decodes to
//! 4.28 GB, mounted with `--cache-size 256` and the daemon held to 2 GiB of
//! address space, answers scattered 4 KiB reads, a 512 MiB sequential read,
//! a frame file and `virtual/sum.npy` with the right bytes, and its peak
//! resident memory stays within the budget plus 200 MiB.

mod common;

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Command;

use common::{
    alive, can_mount, daemon_pid, mount, run, source_and_mountpoint, text, unmount, UnmountOnDrop,
};
use qemfs::qem::write::{scientific_metadata, Calibration, CountDtype, WriteSpec, Writer};

const FRAMES: usize = 512;
const PIXELS: usize = 2048 * 2040;
const FRAME: usize = PIXELS * 2;
const SHAPE: [u64; 4] = [1, FRAMES as u64, 2048, 2040];
const BUDGET_MIB: u64 = 256;

/// The one lit pixel of frame `t`: every frame has a single count of
/// `t + 1` at its own pixel, the rest of the block is zero, so the file is
/// small and every value is known without decoding.
fn lit(t: usize) -> (usize, u16) {
    ((t * 7919 + 12345) % PIXELS, t as u16 + 1)
}

/// Byte offset in the decoded array of each lit pixel's value.
fn lit_bytes() -> Vec<(u64, u16)> {
    (0..FRAMES)
        .map(|t| {
            let (p, v) = lit(t);
            ((t * FRAME + 2 * p) as u64, v)
        })
        .collect()
}

fn write_file(path: &Path) {
    let spec = WriteSpec::counts(
        SHAPE,
        CountDtype::U16,
        scientific_metadata(SHAPE, &Calibration::default()).unwrap(),
    );
    let mut w = Writer::create(path, spec).unwrap();
    // Untouched zero pages are never made resident: only the pages of the
    // lit pixels are.
    let mut dense = vec![0u8; FRAMES * FRAME];
    for t in 0..FRAMES {
        let (p, v) = lit(t);
        let at = t * FRAME + 2 * p;
        dense[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    w.push(&dense).unwrap();
    w.finish().unwrap();
    assert!(fs::metadata(path).unwrap().len() < 64 << 20);
}

/// Checks `buf`, read from decoded-array offset `at`, against the known
/// values: the lit pixels it covers, zero everywhere else.
fn check(buf: &[u8], at: u64, lit: &[(u64, u16)]) {
    let end = at + buf.len() as u64;
    let mut expected = vec![];
    for &(o, v) in lit.iter().filter(|(o, _)| *o + 1 >= at && *o < end) {
        for (k, b) in v.to_le_bytes().into_iter().enumerate() {
            let o = o + k as u64;
            if (at..end).contains(&o) {
                expected.push(((o - at) as usize, b));
            }
        }
    }
    let mut nonzero = buf.iter().enumerate().filter(|(_, &b)| b != 0);
    let mut want = expected.iter().filter(|(_, b)| *b != 0);
    loop {
        match (nonzero.next(), want.next()) {
            (None, None) => break,
            (got, want) => assert_eq!(
                got.map(|(i, &b)| (i, b)),
                want.copied(),
                "decoded bytes from array offset {at}"
            ),
        }
    }
}

/// The daemon's peak resident memory since the last call, in MiB; the
/// peak is reset (`clear_refs` 5) so that each phase is measured alone.
fn phase_peak_mib(pid: u32, phase: &str) -> u64 {
    let peak = status_kib(pid, "VmHWM:") / 1024;
    let rss = status_kib(pid, "VmRSS:") / 1024;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    eprintln!("{phase}: peak {peak} MiB, now {rss} MiB, daemon CPU so far {ticks} ticks");
    fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    peak
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The data after an `.npy` file's header (its length from the shape).
fn npy_body(bytes: &[u8], body: usize) -> &[u8] {
    assert!(bytes.starts_with(b"\x93NUMPY"), "an npy file");
    &bytes[bytes.len() - body..]
}

#[test]
fn a_block_of_4_gb_is_served_within_the_budget_under_a_2_gib_limit() {
    if !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = source_and_mountpoint(dir.path());
    let clock = std::time::Instant::now();
    write_file(&src.join("huge.qem"));
    eprintln!("written: {:?}", clock.elapsed());
    let log = dir.path().join("log");
    let out = mount(
        &src,
        &mnt,
        &[
            "--cache-size",
            &BUDGET_MIB.to_string(),
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "mount: {}", text(&out));
    let _unmount = UnmountOnDrop(mnt.clone());
    let pid = daemon_pid(&mnt);
    let limited = run(Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg("--as=2147483648"));
    assert!(limited.status.success(), "prlimit: {}", text(&limited));

    let values = lit_bytes();
    let data = mnt.join("huge.qem/data.npy");
    fs::metadata(&data).unwrap();
    let mut peaks = vec![];
    peaks.push(phase_peak_mib(pid, "mounted, data.npy looked up"));
    let total = (FRAMES * FRAME) as u64;
    let header = fs::metadata(&data).unwrap().len() - total;
    let mut file = File::open(&data).unwrap();
    let mut read_at = |at: u64, buf: &mut [u8]| {
        file.seek(SeekFrom::Start(header + at)).unwrap();
        file.read_exact(buf).unwrap();
    };

    // 4 KiB reads at scattered offsets, half of them over a lit pixel.
    let mut small = vec![0u8; 4096];
    for i in 0..16u64 {
        let at = if i % 2 == 0 {
            values[(i as usize * 37) % FRAMES]
                .0
                .saturating_sub(1000 + i)
        } else {
            (i * 2_654_435_761 * 4099) % (total - 4096)
        };
        read_at(at, &mut small);
        check(&small, at, &values);
    }

    eprintln!("small reads: {:?}", clock.elapsed());
    peaks.push(phase_peak_mib(pid, "small reads"));
    // 512 MiB sequentially, in 1 MiB reads, from frame 100.
    let start = 100 * FRAME as u64;
    let mut buf = vec![0u8; 1 << 20];
    let began = std::time::Instant::now();
    let mut at = start;
    while at < start + (512 << 20) {
        read_at(at, &mut buf);
        check(&buf, at, &values);
        at += buf.len() as u64;
    }
    let seconds = began.elapsed().as_secs_f64();
    eprintln!("512 MiB sequential: {:.0} MiB/s", 512.0 / seconds);
    peaks.push(phase_peak_mib(pid, "sequential"));

    // One frame file.
    let frame = fs::read(mnt.join("huge.qem/frames/0/300.npy")).unwrap();
    check(npy_body(&frame, FRAME), 300 * FRAME as u64, &values);

    eprintln!("frame: {:?}", clock.elapsed());
    peaks.push(phase_peak_mib(pid, "frame"));
    // The sum of each frame is its one count.
    let sum = fs::read(mnt.join("huge.qem/virtual/sum.npy")).unwrap();
    let sums: Vec<u64> = npy_body(&sum, FRAMES * 8)
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let expected: Vec<u64> = (0..FRAMES).map(|t| u64::from(lit(t).1)).collect();
    assert_eq!(sums, expected);

    eprintln!("sum: {:?}", clock.elapsed());
    peaks.push(phase_peak_mib(pid, "sum"));
    assert!(alive(pid), "the daemon survived the reads");
    let peak = peaks.iter().max().copied().unwrap_or(0);
    eprintln!("daemon peak resident: {peak} MiB");
    // The target. Measured on 2 cores: 302-315 MiB over six
    // runs, every phase. Before decodes waited for each other's
    // reservations (`Budget::reserve_while`), the frame's window was
    // decoded beside the prefetcher's next window with the budget full,
    // and the peak reached 386-552 MiB.
    assert!(
        peak <= BUDGET_MIB + 200,
        "daemon peak resident {peak} MiB over the budget {BUDGET_MIB} MiB + 200"
    );
    drop(file);
    assert!(unmount(&mnt).status.success());
}
