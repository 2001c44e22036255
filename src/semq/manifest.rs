//! The manifest: sorted key/value text pairs and their section (spec 3.3).

use super::error::{Result, SemqError};
use super::ids::is_valid_text;

pub const MAX_PAIRS: usize = 4096;
pub const MAX_KEY_LEN: usize = 256;
pub const MAX_VALUE_LEN: usize = 65536;
/// Largest manifest section, the count included.
pub const MAX_SECTION_LEN: usize = 16 * 1024 * 1024;

/// A valid manifest: keys unique and sorted bytewise, every key and value
/// valid text within the limits, the section within 16 MiB.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Manifest {
    pairs: Vec<(String, String)>,
}

impl Manifest {
    pub fn empty() -> Manifest {
        Manifest::default()
    }

    /// Builds a manifest from pairs in the caller's order, with the checks
    /// of the encoder (spec 6, step 4); `field` is the caller's pair index.
    pub fn from_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Result<Manifest> {
        if pairs.len() > MAX_PAIRS {
            return Err(SemqError::invalid("manifest exceeds 4096 pairs"));
        }
        let mut section_len: usize = 4;
        let mut owned = Vec::with_capacity(pairs.len());
        for (i, (k, v)) in pairs.iter().enumerate() {
            let (k, v) = (k.as_ref(), v.as_ref());
            let at = |message: &str| SemqError::invalid_at(message, None, Some(i as u64));
            if k.is_empty() || k.len() > MAX_KEY_LEN {
                return Err(at("manifest key must be 1..256 bytes"));
            }
            if v.len() > MAX_VALUE_LEN {
                return Err(at("manifest value must be at most 65536 bytes"));
            }
            let Some(key) = text(k) else {
                return Err(at("manifest key is not valid UTF-8"));
            };
            let Some(value) = text(v) else {
                return Err(at("manifest value is not valid UTF-8"));
            };
            section_len += 8 + k.len() + v.len();
            owned.push((i, key, value));
        }
        if section_len > MAX_SECTION_LEN {
            return Err(SemqError::invalid("manifest section exceeds 16 MiB"));
        }
        // Stable, so the later of two equal keys is the caller's later pair.
        owned.sort_by(|a, b| a.1.as_bytes().cmp(b.1.as_bytes()));
        if let Some(w) = owned.windows(2).find(|w| w[0].1 == w[1].1) {
            return Err(SemqError::invalid_at(
                "duplicate manifest key",
                None,
                Some(w[1].0 as u64),
            ));
        }
        Ok(Manifest {
            pairs: owned.into_iter().map(|(_, k, v)| (k, v)).collect(),
        })
    }

    /// Parses a section read from a file; the error is the message of the
    /// first violation (the reader reports it as FormatError(manifest)).
    pub fn parse_section(section: &[u8]) -> Result<Manifest, &'static str> {
        const MALFORMED: &str = "manifest section is malformed";
        if section.len() > MAX_SECTION_LEN {
            return Err("manifest section exceeds 16 MiB");
        }
        let mut pos = 0usize;
        let n = read_u32(section, &mut pos).ok_or(MALFORMED)? as usize;
        if n > MAX_PAIRS {
            return Err("manifest exceeds 4096 pairs");
        }
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(n);
        for _ in 0..n {
            let klen = read_u32(section, &mut pos).ok_or(MALFORMED)? as usize;
            if klen == 0 || klen > MAX_KEY_LEN {
                return Err(MALFORMED);
            }
            let k = take(section, &mut pos, klen).ok_or(MALFORMED)?;
            let vlen = read_u32(section, &mut pos).ok_or(MALFORMED)? as usize;
            if vlen > MAX_VALUE_LEN {
                return Err(MALFORMED);
            }
            let v = take(section, &mut pos, vlen).ok_or(MALFORMED)?;
            let key = text(k).ok_or(MALFORMED)?;
            let value = text(v).ok_or(MALFORMED)?;
            if let Some((prev, _)) = pairs.last() {
                if prev.as_bytes() >= key.as_bytes() {
                    return Err(MALFORMED);
                }
            }
            pairs.push((key, value));
        }
        if pos != section.len() {
            return Err(MALFORMED);
        }
        Ok(Manifest { pairs })
    }

    /// The section bytes: count, then (key_len, key, value_len, value).
    pub fn to_section(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.section_len());
        self.write_section(&mut out);
        out
    }

    pub fn write_section(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.pairs.len() as u32).to_le_bytes());
        for (k, v) in &self.pairs {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v.as_bytes());
        }
    }

    pub fn section_len(&self) -> usize {
        4 + self
            .pairs
            .iter()
            .map(|(k, v)| 8 + k.len() + v.len())
            .sum::<usize>()
    }

    /// Pairs in bytewise key order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .binary_search_by(|(k, _)| k.as_bytes().cmp(key.as_bytes()))
            .ok()
            .map(|i| self.pairs[i].1.as_str())
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

fn text(bytes: &[u8]) -> Option<String> {
    if is_valid_text(bytes) {
        String::from_utf8(bytes.to_vec()).ok()
    } else {
        None
    }
}

fn read_u32(buf: &[u8], pos: &mut usize) -> Option<u32> {
    let b = take(buf, pos, 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Option<&'a [u8]> {
    let end = pos.checked_add(len)?;
    let out = buf.get(*pos..end)?;
    *pos = end;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example_section() {
        let m = Manifest::from_pairs(&[("encoder", "x")]).unwrap();
        assert_eq!(
            m.to_section(),
            [1, 0, 0, 0, 7, 0, 0, 0, b'e', b'n', b'c', b'o', b'd', b'e', b'r', 1, 0, 0, 0, b'x']
        );
        assert_eq!(Manifest::parse_section(&m.to_section()), Ok(m));
    }

    #[test]
    fn duplicate_reports_later_caller_index() {
        let err = Manifest::from_pairs(&[("b", "1"), ("a", "2"), ("b", "3")]).unwrap_err();
        assert_eq!(err.field(), Some(2));
    }

    #[test]
    fn parse_rejects_unsorted_and_trailing() {
        let unsorted = [
            2, 0, 0, 0, 1, 0, 0, 0, b'b', 0, 0, 0, 0, 1, 0, 0, 0, b'a', 0, 0, 0, 0,
        ];
        assert!(Manifest::parse_section(&unsorted).is_err());
        assert!(Manifest::parse_section(&[0, 0, 0, 0, 0]).is_err());
        assert!(Manifest::parse_section(&[0, 0, 0]).is_err());
    }
}
