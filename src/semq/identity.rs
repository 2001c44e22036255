//! The two identities of an Encoding (spec 3.4) and their text form.

use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type Digest32 = [u8; 32];

/// `content_digest = SHA-256(S)`, S = file bytes 6 .. end of rows.
pub fn content_digest(s: &[u8]) -> Digest32 {
    Sha256::digest(s).into()
}

/// An incremental content digest, for writers that produce S in pieces.
#[derive(Clone, Default)]
pub(crate) struct ContentHasher(Sha256);

impl ContentHasher {
    pub fn new() -> ContentHasher {
        ContentHasher(Sha256::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Digest32 {
        self.0.finalize().into()
    }
}

/// `state_id = SHA-256(content_digest ‖ manifest_section)`.
pub fn state_id(content_digest: &Digest32, manifest_section: &[u8]) -> Digest32 {
    let mut h = Sha256::new();
    h.update(content_digest);
    h.update(manifest_section);
    h.finalize().into()
}

/// 64 lowercase hex characters.
pub fn to_hex(digest: &Digest32) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for &b in digest {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 0x0f)] as char);
    }
    s
}

/// Parses exactly 64 hex digits of either case.
pub fn from_hex(text: &str) -> Option<Digest32> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_empty_vector() {
        let s = [
            2u8, 4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let c = content_digest(&s);
        assert_eq!(
            to_hex(&c),
            "4528e8a0422f5cde968847e021c85b4e6e78ce68da9e92b2981c62dd48f78f4a"
        );
        let st = state_id(&c, &[0, 0, 0, 0]);
        assert_eq!(
            to_hex(&st),
            "ef4d1522eb158aa9b6b83cd5d51f80ea2cc59ac3aeb45b69a1c28c99375b55b9"
        );
        assert_eq!(from_hex(&to_hex(&st).to_uppercase()), Some(st));
        assert_eq!(from_hex("0g"), None);
    }
}
