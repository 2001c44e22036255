//! The 56-byte envelope (§2): signature, header length, body start and the
//! header digest, checked before the JSON is touched.

use sha2::{Digest, Sha256};

use super::error::QemError;

pub const SIGNATURE: &[u8; 8] = b"QEMDATA1";
pub const ENVELOPE_BYTES: usize = 56;
pub const MAX_HEADER_BYTES: u64 = 16 * 1024 * 1024;

/// The parsed and checked envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub header_len: usize,
    pub body_start: usize,
    pub header_sha256: [u8; 32],
}

impl Envelope {
    /// Checks the envelope of a whole file and the header digest (rules 1–3).
    pub fn parse(file: &[u8]) -> Result<Self, QemError> {
        if file.len() < ENVELOPE_BYTES {
            return Err(QemError::NotQem {
                reason: format!(
                    "{} bytes, shorter than the {ENVELOPE_BYTES}-byte envelope",
                    file.len()
                ),
            });
        }
        let sig = &file[..8];
        if sig != SIGNATURE {
            // Legacy .ans containers share the prefix layout; naming them
            // tells the user to re-export rather than that the file is junk.
            if sig == b"QGPUSTRM" {
                return Err(QemError::LegacyContainer {
                    signature: "QGPUSTRM",
                });
            }
            if sig.starts_with(b"QGANS") {
                return Err(QemError::LegacyContainer { signature: "QGANS" });
            }
            return Err(QemError::NotQem {
                reason: format!("signature {} is not QEMDATA1", printable(sig)),
            });
        }
        let n = u64_at(file, 8);
        let start = u64_at(file, 16);
        let size = file.len() as u64;
        if n == 0 || n > MAX_HEADER_BYTES || Some(start) != n.checked_add(56) || start > size {
            return Err(QemError::HeaderLength {
                length: n,
                body_start: start,
                file_size: size,
            });
        }
        let mut header_sha256 = [0u8; 32];
        header_sha256.copy_from_slice(&file[24..56]);
        // Bounded by the checks above: start <= size fits usize.
        let header_len = n as usize;
        let body_start = start as usize;
        let digest = Sha256::digest(&file[ENVELOPE_BYTES..body_start]);
        // Fuzzing builds (`cargo fuzz`, `--cfg fuzzing`) accept any digest so
        // that mutated headers reach the parser behind it.
        if digest.as_slice() != header_sha256 && !cfg!(fuzzing) {
            return Err(QemError::HeaderChecksum);
        }
        Ok(Envelope {
            header_len,
            body_start,
            header_sha256,
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn printable(sig: &[u8]) -> String {
    sig.iter()
        .map(|&c| {
            if c.is_ascii_graphic() {
                (c as char).to_string()
            } else {
                format!("\\x{c:02x}")
            }
        })
        .collect()
}
