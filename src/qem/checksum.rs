//! Body integrity (§2 rule 5): the body is hashed in 64 MiB blocks, each
//! verified at most once, lazily, before any byte of it is exposed.

use std::ops::Range;
use std::sync::OnceLock;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::error::QemError;

/// Size of one checksum block of the body.
pub(crate) const CHECKSUM_BLOCK: usize = 64 * 1024 * 1024;

/// Lowercase hexadecimal of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// SHA-256 of `bytes` as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 of a file's bytes as lowercase hex, read in 1 MiB pieces (for
/// `sha256` files and `qem hash --file`, on files of any size). A URL is
/// read by ranges, in order, none of it kept.
pub fn sha256_file_hex(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    if let Some(address) = crate::remote::Address::of_path(path) {
        let object = crate::remote::Object::open(&address.map_err(|e| e.into_io())?)
            .map_err(|e| e.into_io())?;
        let mut hasher = Sha256::new();
        hasher.update(object.opening());
        let rest = object.opening().len() as u64..object.size();
        object
            .read_parts(std::iter::once(rest), |_, bytes| {
                hasher.update(&bytes);
                Ok(())
            })
            .map_err(|e| e.into_io())?;
        return Ok(hex(&hasher.finalize()));
    }
    let mut file = crate::regular_file::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buffer)? {
            0 => return Ok(hex(&hasher.finalize())),
            n => hasher.update(&buffer[..n]),
        }
    }
}

/// Parses exactly 64 lowercase hex digits. Uppercase is refused because the
/// format compares digests as strings.
pub(crate) fn parse_lower_hex32(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = (lower_nibble(pair[0])? << 4) | lower_nibble(pair[1])?;
    }
    Some(out)
}

fn lower_nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Verdicts of the body's checksum blocks, shared by all readers of a file.
#[derive(Debug)]
pub(crate) struct BodyIntegrity {
    /// `None` when the header's entry is not 64 lowercase hex digits: such a
    /// block can never verify.
    expected: Vec<Option<[u8; 32]>>,
    verdicts: Vec<OnceLock<bool>>,
    body_len: usize,
}

impl BodyIntegrity {
    pub(crate) fn new(entries: &[String], body_len: usize) -> Result<Self, QemError> {
        let blocks = body_len.div_ceil(CHECKSUM_BLOCK);
        if entries.len() != blocks {
            return Err(QemError::ChecksumTable {
                expected: blocks,
                found: entries.len(),
            });
        }
        Ok(BodyIntegrity {
            expected: entries.iter().map(|s| parse_lower_hex32(s)).collect(),
            verdicts: (0..blocks).map(|_| OnceLock::new()).collect(),
            body_len,
        })
    }

    pub(crate) fn blocks(&self) -> usize {
        self.expected.len()
    }

    /// The same table with every block taken as verified: for a reader
    /// whose conclusions are kept only once this table's own verdicts are
    /// in (see `QemFile::validate`), never for one that serves bytes.
    pub(crate) fn assumed(&self) -> Self {
        BodyIntegrity {
            expected: self.expected.clone(),
            verdicts: self.verdicts.iter().map(|_| OnceLock::from(true)).collect(),
            body_len: self.body_len,
        }
    }

    /// Whether every block's verdict is already known.
    pub(crate) fn all_known(&self) -> bool {
        self.verdicts.iter().all(|v| v.get().is_some())
    }

    fn check_block(&self, body: &[u8], k: usize) -> Result<(), QemError> {
        let ok = *self.verdicts[k].get_or_init(|| {
            let start = k * CHECKSUM_BLOCK;
            let end = (start + CHECKSUM_BLOCK).min(self.body_len);
            match (&self.expected[k], body.get(start..end)) {
                // Fuzzing builds (`--cfg fuzzing`) skip the digest so that
                // mutated bodies reach the decoders.
                (Some(want), Some(bytes)) => {
                    cfg!(fuzzing) || Sha256::digest(bytes).as_slice() == want
                }
                _ => false,
            }
        });
        if ok {
            Ok(())
        } else {
            Err(QemError::BodyChecksum { block: k })
        }
    }

    /// Verifies every checksum block that `range` (body-relative) touches.
    pub(crate) fn ensure(&self, body: &[u8], range: Range<usize>) -> Result<(), QemError> {
        if range.start >= range.end {
            return Ok(());
        }
        let first = range.start / CHECKSUM_BLOCK;
        let last = (range.end - 1) / CHECKSUM_BLOCK;
        for k in first..=last.min(self.blocks().saturating_sub(1)) {
            self.check_block(body, k)?;
        }
        Ok(())
    }

    /// Whether the verdict of every block that `range` touches is known.
    pub(crate) fn known(&self, range: Range<usize>) -> bool {
        if range.start >= range.end {
            return true;
        }
        let first = range.start / CHECKSUM_BLOCK;
        let last = ((range.end - 1) / CHECKSUM_BLOCK).min(self.blocks().saturating_sub(1));
        (first..=last).all(|k| self.verdicts.get(k).is_none_or(|v| v.get().is_some()))
    }

    /// Verifies every block, in parallel; the lowest failing block is named.
    pub(crate) fn ensure_all(&self, body: &[u8]) -> Result<(), QemError> {
        let results: Vec<Result<(), QemError>> = (0..self.blocks())
            .into_par_iter()
            .map(|k| self.check_block(body, k))
            .collect();
        results.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let d: [u8; 32] = core::array::from_fn(|i| (i * 37) as u8);
        assert_eq!(parse_lower_hex32(&hex(&d)), Some(d));
        assert_eq!(parse_lower_hex32(&hex(&d).to_uppercase()), None);
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn verdicts_name_the_block() {
        let body = vec![7u8; 10];
        let good = sha256_hex(&body);
        let i = BodyIntegrity::new(std::slice::from_ref(&good), body.len()).unwrap();
        i.ensure(&body, 0..10).unwrap();
        let bad = BodyIntegrity::new(&["0".repeat(64)], body.len()).unwrap();
        assert!(matches!(
            bad.ensure(&body, 3..4),
            Err(QemError::BodyChecksum { block: 0 })
        ));
        assert!(matches!(
            BodyIntegrity::new(&[good.clone(), good], body.len()),
            Err(QemError::ChecksumTable {
                expected: 1,
                found: 2
            })
        ));
    }
}
