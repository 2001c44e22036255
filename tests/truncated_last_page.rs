//! A source truncated in place to the middle of its last mapped page: the
//! bytes past the new end read as zeros and raise no SIGBUS, so the readers
//! check the file's size on the mapping's descriptor and refuse to serve
//! values from it (`QemError::Changed`), whether or not its checksum
//! blocks were verified before. Its own test binary: the global fault
//! count moves.

use std::fs;

use qemfs::qem::{QemError, QemFile};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/conformance/qem/u16-mixed-chunks-9x9.qem"
);

#[test]
fn reads_after_an_in_place_truncation_inside_the_last_page_fail_as_changed() {
    qemfs::mapguard::install();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scan.qem");
    fs::copy(FIXTURE, &path).unwrap();
    let len = fs::metadata(&path).unwrap().len();
    let page = 4096;
    // The cut must stay inside the last page, past the start of that page.
    let cut = len - 16;
    assert!(
        cut / page == (len - 1) / page && !cut.is_multiple_of(page),
        "{len}"
    );

    let file = QemFile::open(&path).unwrap();
    let mut whole = vec![0u8; file.dense_bytes().unwrap()];
    file.read_all(&mut whole).unwrap();
    let last = file.frames() - 1;
    let mut frame = vec![0u8; file.frame_bytes()];
    file.read_frame(last, &mut frame).unwrap();
    assert_eq!(frame[..], whole[whole.len() - frame.len()..]);
    assert!(file.faults() == 0);

    // In place: the same inode, as another process would do it.
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();

    let err = file.read_all(&mut whole).unwrap_err();
    assert!(matches!(err, QemError::Changed), "{err}");
    let err = file.read_frame(last, &mut frame).unwrap_err();
    assert!(matches!(err, QemError::Changed), "{err}");
    let err = file.decode_pixels(&[0]).unwrap_err();
    assert!(matches!(err, QemError::Changed), "{err}");
    assert!(
        file.faults() > 0,
        "a reader comparing fault counts sees it too"
    );
    assert!(qemfs::mapguard::faults() > 0, "and so do strict commands");

    // A file opened after the cut reads its own (short) length: refused
    // at open for its declared size, never read as zeros.
    assert!(QemFile::open(&path).is_err());
}
