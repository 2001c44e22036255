//! Inputs found by the fuzz targets in `fuzz/` (see `fuzz/README.md`),
//! minimised, each fed to the normal build: they must give a typed error.

use qemfs::npy::{self, NpyError};

/// `npy_parse`, crash-7332412d74f3ef4119c6d225fbe6b6084d03038b (129 bytes;
/// libFuzzer could not shrink it further): a format 3.0 (UTF-8) header
/// whose `descr` starts with a two-byte character (`'Ɠu2'`).
/// `DType::from_descr` split the string after its first byte, inside the
/// character, and panicked; `qem convert` and `semq encode` aborted on such
/// an input instead of reporting it. Kept as a file, which the command-line
/// tests feed to `qem convert` and `semq encode` too.
fn npy_v3_descr_multibyte() -> Vec<u8> {
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/regressions/npy-v3-descr-multibyte.npy"
    ))
    .unwrap();
    assert_eq!(bytes.len(), 129);
    bytes
}

#[test]
fn npy_descr_starting_with_a_multibyte_character_is_refused() {
    let err = npy::parse_header(&npy_v3_descr_multibyte()).unwrap_err();
    assert!(
        matches!(&err, NpyError::UnsupportedDType(d) if d == "\u{193}u2"),
        "{err:?}"
    );
    for descr in ["\u{193}u2", "\u{e9}", "\u{1f600}f4", "\u{193}"] {
        assert!(
            matches!(
                npy::DType::from_descr(descr),
                Err(NpyError::UnsupportedDType(_))
            ),
            "{descr}"
        );
    }
    // The ASCII forms are unchanged.
    assert_eq!(npy::DType::from_descr("<u2").unwrap(), npy::DType::U16);
    assert!(matches!(
        npy::DType::from_descr(">u2"),
        Err(NpyError::BigEndian(_))
    ));
}
