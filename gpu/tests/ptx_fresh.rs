//! The CUDA backend embeds `kernels/qem.ptx`, compiled ahead of time from
//! `kernels/qem.cu` so that a machine needs only the driver. Nothing builds
//! the PTX in `cargo build`, so an edit of `qem.cu` that is not followed by
//! `kernels/build-ptx.sh` would ship the old kernels silently. The script
//! records the SHA-256 of both files in `kernels/qem.sha256` (the format of
//! `sha256sum`); this test fails when either file no longer matches.

use sha2::{Digest, Sha256};
use std::path::Path;

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The `(digest, file name)` lines of a `sha256sum` listing.
fn recorded(listing: &str) -> Vec<(&str, &str)> {
    listing
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (digest, name) = line
                .split_once("  ")
                .unwrap_or_else(|| panic!("qem.sha256: not a `sha256sum` line: {line:?}"));
            (digest, name)
        })
        .collect()
}

#[test]
fn ptx_is_generated_from_the_current_kernel_source() {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let listing = std::fs::read_to_string(kernels.join("qem.sha256"))
        .expect("kernels/qem.sha256 is written by kernels/build-ptx.sh");
    let lines = recorded(&listing);
    let names: Vec<&str> = lines.iter().map(|(_, name)| *name).collect();
    assert_eq!(
        names,
        ["qem.cu", "qem.ptx"],
        "qem.sha256 must record the kernel source and the PTX made from it"
    );
    for (digest, name) in lines {
        let bytes = std::fs::read(kernels.join(name)).unwrap();
        assert_eq!(
            sha256_hex(&bytes),
            digest,
            "gpu/kernels/{name} differs from what gpu/kernels/build-ptx.sh recorded: \
             qem.ptx is stale or was edited by hand; run gpu/kernels/build-ptx.sh \
             and commit qem.ptx and qem.sha256"
        );
    }
}

#[test]
fn listing_parser_reads_sha256sum_output() {
    let lines = recorded("ab  qem.cu\ncd  qem.ptx\n\n");
    assert_eq!(lines, [("ab", "qem.cu"), ("cd", "qem.ptx")]);
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}
