//! Resealing an edited `.qem` file: after a test changes header or body
//! bytes it rewrites the checksums (spec §2, §4) so that the edit itself,
//! not a digest mismatch, is what a reader meets. Shared by the tamper,
//! forged-index and mutation tests, which include this file with `#[path]`.

// Each test file uses a part of these.
#![allow(dead_code)]

use qemfs::qem::checksum::sha256_hex;
use sha2::{Digest, Sha256};

/// Where the body starts (the envelope's third field).
pub fn body_start(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize
}

/// Body offset of array `k` of chunk 0 (integer codec).
pub fn array_offset(bytes: &[u8], k: usize) -> usize {
    let start = body_start(bytes);
    let h: serde_json::Value = serde_json::from_slice(&bytes[56..start]).unwrap();
    h["chunks"][0]["arrays"][k]["offset"].as_u64().unwrap() as usize
}

/// Element count of array `k` of chunk 0.
pub fn array_count(bytes: &[u8], k: usize) -> usize {
    let start = body_start(bytes);
    let h: serde_json::Value = serde_json::from_slice(&bytes[56..start]).unwrap();
    h["chunks"][0]["arrays"][k]["count"].as_u64().unwrap() as usize
}

/// Rewrites the header digest of the envelope.
pub fn reseal_header(bytes: &mut [u8]) {
    let start = body_start(bytes);
    let digest = Sha256::digest(&bytes[56..start]);
    bytes[24..56].copy_from_slice(&digest);
}

/// Rewrites the (single) body checksum in the header and the header digest
/// after an edit of the body; `old` is the body checksum before.
pub fn reseal_body(bytes: &mut [u8], old: &str) {
    let start = body_start(bytes);
    let new = sha256_hex(&bytes[start..]);
    let header = std::str::from_utf8(&bytes[56..start])
        .unwrap()
        .replacen(old, &new, 1);
    assert_eq!(header.len(), start - 56);
    bytes[56..start].copy_from_slice(header.as_bytes());
    reseal_header(bytes);
}

/// [`reseal_body`] with the checksum before taken from `original`.
pub fn refresh_checksums(mut bytes: Vec<u8>, original: &[u8]) -> Vec<u8> {
    let old = sha256_hex(&original[body_start(original)..]);
    reseal_body(&mut bytes, &old);
    bytes
}
