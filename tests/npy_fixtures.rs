//! Every `.npy` the upstream tools wrote into the conformance set parses, and
//! its declared shape and dtype account for exactly the bytes in the file.

use qemfs::npy;
use std::path::Path;

#[test]
fn conformance_arrays_parse_with_exact_lengths() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance/qem");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/fixtures/conformance/qem in the repository")
    {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("npy") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let header = npy::parse_header(&bytes).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        header
            .check_file_len(bytes.len() as u64)
            .unwrap_or_else(|e| panic!("{path:?}: {e}"));
        assert!(matches!(
            header.dtype,
            npy::DType::U8 | npy::DType::U16 | npy::DType::F32
        ));
        assert_eq!(header.shape.len(), 4, "{path:?}");
        seen += 1;
    }
    assert!(seen >= 20, "only {seen} arrays found in {dir:?}");
}
