//! Ids: the two kinds, their validity rules and their order (spec 1, 3.1).

use std::cmp::Ordering;
use std::fmt;

/// The kind of every id of one Encoding; the discriminant is the byte
/// stored in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdKind {
    U64 = 0,
    Utf8 = 1,
}

impl IdKind {
    pub fn from_byte(b: u8) -> Option<IdKind> {
        match b {
            0 => Some(IdKind::U64),
            1 => Some(IdKind::Utf8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            IdKind::U64 => "u64",
            IdKind::Utf8 => "utf8",
        }
    }

    pub fn from_name(name: &str) -> Option<IdKind> {
        match name {
            "u64" => Some(IdKind::U64),
            "utf8" => Some(IdKind::Utf8),
            _ => None,
        }
    }
}

/// Longest utf8 id in bytes.
pub const MAX_UTF8_ID_LEN: usize = 4096;

/// RFC 3629 UTF-8 without NUL, the only text the format admits.
/// `std::str::from_utf8` already rejects overlong forms, surrogates, code
/// points above U+10FFFF, stray continuations and truncated sequences.
pub fn is_valid_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

/// Why a utf8 id is rejected (the checks of spec 6, step 2, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Utf8IdFault {
    Empty,
    TooLong,
    NotText,
}

impl Utf8IdFault {
    pub fn message(self) -> &'static str {
        match self {
            Utf8IdFault::Empty => "utf8 id is empty",
            Utf8IdFault::TooLong => "utf8 id exceeds 4096 bytes",
            Utf8IdFault::NotText => "utf8 id is not valid UTF-8 or contains NUL",
        }
    }
}

pub fn check_utf8_id(bytes: &[u8]) -> Result<(), Utf8IdFault> {
    if bytes.is_empty() {
        Err(Utf8IdFault::Empty)
    } else if bytes.len() > MAX_UTF8_ID_LEN {
        Err(Utf8IdFault::TooLong)
    } else if !is_valid_text(bytes) {
        Err(Utf8IdFault::NotText)
    } else {
        Ok(())
    }
}

/// An owned id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    U64(u64),
    Utf8(String),
}

/// An id borrowed from an Encoding (utf8 ids are validated text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdRef<'a> {
    U64(u64),
    Utf8(&'a str),
}

impl Id {
    pub fn kind(&self) -> IdKind {
        match self {
            Id::U64(_) => IdKind::U64,
            Id::Utf8(_) => IdKind::Utf8,
        }
    }

    pub fn as_ref(&self) -> IdRef<'_> {
        match self {
            Id::U64(v) => IdRef::U64(*v),
            Id::Utf8(s) => IdRef::Utf8(s),
        }
    }
}

impl IdRef<'_> {
    pub fn kind(&self) -> IdKind {
        match self {
            IdRef::U64(_) => IdKind::U64,
            IdRef::Utf8(_) => IdKind::Utf8,
        }
    }

    pub fn to_owned(&self) -> Id {
        match self {
            IdRef::U64(v) => Id::U64(*v),
            IdRef::Utf8(s) => Id::Utf8((*s).to_owned()),
        }
    }
}

/// Ids of one kind order numerically (u64) or bytewise (utf8; `str`'s
/// `Ord` is bytewise). Mixed kinds never meet in one Encoding; u64 sorts
/// first only to make the order total.
impl Ord for IdRef<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (IdRef::U64(a), IdRef::U64(b)) => a.cmp(b),
            (IdRef::Utf8(a), IdRef::Utf8(b)) => a.as_bytes().cmp(b.as_bytes()),
            (IdRef::U64(_), IdRef::Utf8(_)) => Ordering::Less,
            (IdRef::Utf8(_), IdRef::U64(_)) => Ordering::Greater,
        }
    }
}

impl PartialOrd for IdRef<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Id {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_ref().cmp(&other.as_ref())
    }
}

impl PartialOrd for Id {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// u64 ids as decimal, utf8 ids as their text (no escaping).
impl fmt::Display for IdRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdRef::U64(v) => write!(f, "{v}"),
            IdRef::Utf8(s) => f.write_str(s),
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

/// Ids handed to the encoder or a constructor, in input order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdList {
    U64(Vec<u64>),
    /// Raw bytes, so that invalid text can be reported as the spec requires.
    Utf8(Vec<Vec<u8>>),
}

impl IdList {
    pub fn kind(&self) -> IdKind {
        match self {
            IdList::U64(_) => IdKind::U64,
            IdList::Utf8(_) => IdKind::Utf8,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            IdList::U64(v) => v.len(),
            IdList::Utf8(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytewise_order_is_not_utf16_order() {
        let a = "\u{ff61}";
        let b = "\u{10000}";
        assert!(IdRef::Utf8(a) < IdRef::Utf8(b));
        assert!(IdRef::Utf8("ab") < IdRef::Utf8("abc"));
    }

    #[test]
    fn text_rules() {
        assert!(is_valid_text("\u{feff}x".as_bytes()));
        assert!(!is_valid_text(b"a\0b"));
        assert!(!is_valid_text(&[0xc0, 0x80]));
        assert!(!is_valid_text(&[0xed, 0xa0, 0x80]));
        assert!(!is_valid_text(&[0xf4, 0x90, 0x80, 0x80]));
        assert!(!is_valid_text(&[0x80]));
        assert!(!is_valid_text(&[0xe2, 0x82]));
        assert_eq!(check_utf8_id(b""), Err(Utf8IdFault::Empty));
        assert_eq!(check_utf8_id(&[b'a'; 4097]), Err(Utf8IdFault::TooLong));
        assert_eq!(check_utf8_id(&[b'a'; 4096]), Ok(()));
    }
}
