//! Under `mapguard::install_strict` (what the `qem` and `semq` commands
//! run with), an output written while a mapped input was truncated is
//! never published. Its own test binary: the fault count is per process.

use std::fs;
use std::io::Write;

use qemfs::mapguard;
use qemfs::publish::{AtomicFile, Overwrite, PublishError};

#[test]
fn an_output_is_not_published_after_its_input_was_truncated() {
    mapguard::install_strict();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.bin");
    let page = 4096 * 16;
    fs::write(&input, vec![7u8; 4 * page]).unwrap();
    let file = fs::File::open(&input).unwrap();
    let map = mapguard::Mapping::map(&file).unwrap();

    // Written before any fault: published.
    let first = dir.path().join("first.out");
    let mut out = AtomicFile::create(&first, Overwrite::Never).unwrap();
    out.file().write_all(&map[..16]).unwrap();
    out.publish().unwrap();
    assert_eq!(fs::read(&first).unwrap(), vec![7u8; 16]);

    // Copying the input while another process truncates it.
    let target = dir.path().join("copy.out");
    let mut out = AtomicFile::create(&target, Overwrite::Never).unwrap();
    out.file().write_all(&map[..page]).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .unwrap()
        .set_len(page as u64)
        .unwrap();
    // Read in user space (a syscall reading the lost pages would fail with
    // EFAULT instead of faulting).
    let rest = map[page..].to_vec();
    out.file().write_all(&rest).unwrap();
    assert!(mapguard::faults() > 0, "the truncated pages faulted");
    let err = out.publish().unwrap_err();
    assert!(matches!(err, PublishError::SourceChanged(_)), "{err}");
    assert!(err.to_string().contains("copy.out"), "{err}");
    // Neither the output nor its temporary is left behind.
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["first.out", "input.bin"]);
}
