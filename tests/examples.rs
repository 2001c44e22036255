//! The bundled examples (made by `cargo run --example make_examples`) are
//! valid files of every kind, fully checked.

use std::path::Path;

use qemfs::qem::{Codec, QemFile, ValidationLevel};

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/data")
        .join(name)
}

#[test]
fn every_example_passes_full_validation() {
    for (name, codec, shape) in [
        ("scan-u16.qem", Codec::Integer, [24, 32, 64, 64]),
        ("empad-f32.qem", Codec::Float, [8, 8, 32, 32]),
        ("derived-scaled.qem", Codec::Scaled, [6, 10, 16, 16]),
    ] {
        let file = QemFile::open(data(name)).unwrap();
        assert_eq!(file.codec(), codec, "{name}");
        assert_eq!(file.shape(), shape, "{name}");
        let report = file.validate(ValidationLevel::Full).unwrap();
        assert!(report.decoded && report.integrity, "{name}");
    }
    let semq = qemfs::semq::Encoding::open(data("embeddings.semq")).unwrap();
    assert_eq!(semq.len(), 500);
    assert_eq!(semq.manifest().get("model"), Some("example-encoder"));
}
