//! NumPy `.npy` headers: parsing (for `convert` inputs and test fixtures) and
//! writing (for every array view the tree and the CLI export).
//!
//! Only little-endian (or byte-sized) numeric dtypes are supported: they are
//! what both formats store, and they let array bytes be used as they are.
//!
//! # Why not npyz or ndarray-npy
//!
//! Both were tried (npyz 0.8.4, ndarray-npy 0.9.1; issue 19) on the inputs
//! of `npy_refusals_that_npyz_and_ndarray_npy_do_not_make` below:
//! - A version 2.0 header whose length field says 4 GiB, in a 20-byte
//!   file: both allocate the 4 GiB (`vec![0; header_len]`) before reading,
//!   an allocation sized by an unchecked field. We refuse lengths over
//!   1 MiB before allocating anything.
//! - npyz accepts a dictionary with keys besides `descr`, `fortran_order`
//!   and `shape` (numpy refuses it), non-ASCII text in a 1.0/2.0 header,
//!   and a shape whose element count overflows: `(2**32, 2**32, 2)` gives
//!   `len() == 0` in a release build. We refuse all three.
//! - ndarray-npy refuses those, but has no public header API: only typed
//!   reads of the whole array (`ReadNpyExt`, into memory) or typed views of
//!   the whole file (`ViewNpyExt`), so the element type must be known at
//!   compile time. `convert` and `semq encode` choose the element type from
//!   the header at run time and stream files larger than memory.
//!
//! So the parser below stays (`parse_header_any`, `parse_dict` and its
//! lexer), fuzzed by `fuzz/fuzz_targets/npy_parse.rs`.

use std::fmt;

/// `\x93NUMPY`: the first six bytes of every `.npy` file.
pub(crate) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// numpy pads the header so that the data starts on this boundary, which keeps
/// `np.load(..., mmap_mode="r")` aligned for every element size.
const ALIGN: usize = 64;

/// Headers longer than this are refused: numpy itself caps them (10 000 bytes
/// by default), and an unchecked length must never size an allocation.
const MAX_HEADER: usize = 1 << 20;

/// Element types of arrays we read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// numpy's `bool`: one byte, 0 or 1 (validity masks).
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F32,
    F64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// The numpy `descr` string, as numpy writes it.
    pub fn descr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }

    /// The dtype's name as numpy prints it (`uint16`, `float32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// Parses a `descr`; byte-sized types accept any byte-order mark, wider
    /// ones only little-endian (`<`, or `=` which numpy writes on LE hosts
    /// only when asked, and which we take as native = little-endian).
    pub fn from_descr(descr: &str) -> Result<DType, NpyError> {
        match DType::from_descr_any_order(descr)? {
            (_, true) => Err(NpyError::BigEndian(descr.to_string())),
            (dtype, false) => Ok(dtype),
        }
    }

    /// Parses a `descr` of either byte order: the type and whether it is
    /// big-endian (never for byte-sized types).
    pub fn from_descr_any_order(descr: &str) -> Result<(DType, bool), NpyError> {
        // The order mark is one ASCII byte; a descr starting with any other
        // character (format 3.0 headers are UTF-8) has none, and is refused
        // below as unsupported.
        let (order, kind) = descr.split_at_checked(1).unwrap_or(("", descr));
        let dtype = match kind {
            "b1" | "?" => DType::Bool,
            "u1" | "B" => DType::U8,
            "i1" | "b" => DType::I8,
            "u2" => DType::U16,
            "u4" => DType::U32,
            "u8" => DType::U64,
            "i2" => DType::I16,
            "i4" => DType::I32,
            "i8" => DType::I64,
            "f4" => DType::F32,
            "f8" => DType::F64,
            _ => return Err(NpyError::UnsupportedDType(descr.to_string())),
        };
        match order {
            "<" | "=" => Ok((dtype, false)),
            "|" | ">" if dtype.size() == 1 => Ok((dtype, false)),
            ">" => Ok((dtype, true)),
            _ => Err(NpyError::UnsupportedDType(descr.to_string())),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What went wrong with a `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    #[error("not a .npy file (the magic string \\x93NUMPY is missing)")]
    NotNpy,
    #[error("truncated .npy header")]
    Truncated,
    #[error(".npy format version {0}.{1} is not supported (1.0, 2.0 and 3.0 are)")]
    Version(u8, u8),
    #[error(".npy header of {0} bytes is larger than the 1 MiB we accept")]
    HeaderTooLarge(usize),
    #[error("malformed .npy header: {0}")]
    Malformed(String),
    #[error(".npy dtype {0:?} is not supported (expected a little-endian integer or float type)")]
    UnsupportedDType(String),
    #[error(".npy dtype {0:?} is big-endian; re-save the array as little-endian")]
    BigEndian(String),
    #[error(".npy arrays in Fortran order are not supported; save with np.ascontiguousarray")]
    FortranOrder,
    #[error(".npy shape {0:?} is too large to address")]
    ShapeOverflow(Vec<usize>),
    #[error(
        ".npy data holds {actual} bytes but dtype {dtype} and shape {shape:?} need {expected}"
    )]
    DataLength {
        dtype: DType,
        shape: Vec<usize>,
        expected: u64,
        actual: u64,
    },
}

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Offset of the first data byte from the start of the file.
    pub data_offset: usize,
}

impl Header {
    /// Number of elements, or `None` when it does not fit a `usize`.
    pub fn element_count(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Number of data bytes, or `None` when it does not fit a `usize`.
    pub fn data_len(&self) -> Option<usize> {
        self.element_count()?.checked_mul(self.dtype.size())
    }

    /// Checks that a file of `file_len` bytes holds exactly this array.
    pub fn check_file_len(&self, file_len: u64) -> Result<(), NpyError> {
        let expected =
            self.data_len()
                .and_then(|n| n.checked_add(self.data_offset))
                .ok_or_else(|| NpyError::ShapeOverflow(self.shape.clone()))? as u64;
        if expected != file_len {
            return Err(NpyError::DataLength {
                dtype: self.dtype,
                shape: self.shape.clone(),
                expected: expected.saturating_sub(self.data_offset as u64),
                actual: file_len.saturating_sub(self.data_offset as u64),
            });
        }
        Ok(())
    }
}

/// A header of any byte order and memory order, as conversion inputs may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnyHeader {
    pub dtype: DType,
    /// Multi-byte elements are big-endian.
    pub big_endian: bool,
    /// The array is stored in Fortran (column-major) order.
    pub fortran_order: bool,
    pub shape: Vec<usize>,
    /// Offset of the first data byte from the start of the file.
    pub data_offset: usize,
}

impl AnyHeader {
    /// The same layout checks as [`Header`], ignoring the orders.
    pub fn header(&self) -> Header {
        Header {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data_offset: self.data_offset,
        }
    }
}

/// Parses the header at the start of `bytes` (which may be just a prefix of
/// the file; [`NpyError::Truncated`] asks for more). Fortran-ordered and
/// big-endian arrays are refused: every consumer here but conversion needs
/// little-endian C order (conversion uses `parse_header_any`).
pub fn parse_header(bytes: &[u8]) -> Result<Header, NpyError> {
    let any = parse_header_any(bytes)?;
    if any.big_endian {
        return Err(NpyError::BigEndian(format!(">{}", &any.dtype.descr()[1..])));
    }
    if any.fortran_order {
        return Err(NpyError::FortranOrder);
    }
    Ok(any.header())
}

/// Parses a header of either byte order and either memory order.
pub(crate) fn parse_header_any(bytes: &[u8]) -> Result<AnyHeader, NpyError> {
    if bytes.len() < MAGIC.len() {
        return Err(if MAGIC.starts_with(bytes) {
            NpyError::Truncated
        } else {
            NpyError::NotNpy
        });
    }
    if &bytes[..6] != MAGIC {
        return Err(NpyError::NotNpy);
    }
    let (major, minor) = match bytes.get(6..8) {
        Some(v) => (v[0], v[1]),
        None => return Err(NpyError::Truncated),
    };
    let (len_size, utf8) = match (major, minor) {
        (1, 0) => (2, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => return Err(NpyError::Version(major, minor)),
    };
    let len_bytes = bytes.get(8..8 + len_size).ok_or(NpyError::Truncated)?;
    let header_len = len_bytes
        .iter()
        .rev()
        .fold(0usize, |n, &b| (n << 8) | usize::from(b));
    if header_len > MAX_HEADER {
        return Err(NpyError::HeaderTooLarge(header_len));
    }
    let start = 8 + len_size;
    let text = bytes
        .get(start..start + header_len)
        .ok_or(NpyError::Truncated)?;
    let text = if utf8 {
        std::str::from_utf8(text).map_err(|_| NpyError::Malformed("header is not UTF-8".into()))?
    } else {
        if !text.is_ascii() {
            return Err(NpyError::Malformed("header is not ASCII".into()));
        }
        // ASCII is valid UTF-8.
        std::str::from_utf8(text).map_err(|_| NpyError::Malformed("header is not ASCII".into()))?
    };
    let dict = parse_dict(text)?;
    let (dtype, big_endian) = DType::from_descr_any_order(&dict.descr)?;
    let header = AnyHeader {
        dtype,
        big_endian,
        fortran_order: dict.fortran_order,
        shape: dict.shape,
        data_offset: start + header_len,
    };
    if header.header().data_len().is_none() {
        return Err(NpyError::ShapeOverflow(header.shape));
    }
    Ok(header)
}

/// The header bytes of a C-order array of `dtype` and `shape`, padded with
/// spaces so that the data starts on a 64-byte boundary, as numpy writes it
/// (format 1.0, or 2.0 when the dictionary does not fit 65535 bytes).
pub fn encode_header(dtype: DType, shape: &[usize]) -> Vec<u8> {
    let shape_text = match shape {
        [one] => format!("({one},)"),
        dims => {
            let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            format!("({})", parts.join(", "))
        }
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        shape_text
    );
    let layout = |len_size: usize| {
        let unpadded = MAGIC.len() + 2 + len_size + dict.len() + 1;
        let total = unpadded.div_ceil(ALIGN) * ALIGN;
        (total, total - MAGIC.len() - 2 - len_size)
    };
    let (major, len_size) = if layout(2).1 <= usize::from(u16::MAX) {
        (1u8, 2usize)
    } else {
        (2, 4)
    };
    let (total, header_len) = layout(len_size);
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[major, 0]);
    out.extend_from_slice(&(header_len as u64).to_le_bytes()[..len_size]);
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// The fields of the header dictionary we use.
struct Dict {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// A tiny parser for the Python literal numpy writes:
/// `{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }`.
/// Key order and spacing vary between numpy versions, so it parses rather
/// than matches.
fn parse_dict(text: &str) -> Result<Dict, NpyError> {
    let mut p = Lexer {
        s: text.as_bytes(),
        i: 0,
    };
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    p.expect(b'{')?;
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        match key.as_str() {
            "descr" => descr = Some(p.string()?),
            "fortran_order" => fortran = Some(p.boolean()?),
            "shape" => shape = Some(p.tuple()?),
            other => return Err(NpyError::Malformed(format!("unexpected key {other:?}"))),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_ws();
    if p.i != p.s.len() {
        return Err(NpyError::Malformed("text after the dictionary".into()));
    }
    let missing = |k: &str| NpyError::Malformed(format!("missing key {k:?}"));
    Ok(Dict {
        descr: descr.ok_or_else(|| missing("descr"))?,
        fortran_order: fortran.ok_or_else(|| missing("fortran_order"))?,
        shape: shape.ok_or_else(|| missing("shape"))?,
    })
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), NpyError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(NpyError::Malformed(format!(
                "expected {:?} at byte {}",
                c as char, self.i
            )))
        }
    }

    fn string(&mut self) -> Result<String, NpyError> {
        let quote = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => {
                return Err(NpyError::Malformed(format!(
                    "expected a string at byte {}",
                    self.i
                )))
            }
        };
        self.i += 1;
        let start = self.i;
        while let Some(&c) = self.s.get(self.i) {
            if c == quote {
                let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                self.i += 1;
                return Ok(text);
            }
            if c == b'\\' {
                return Err(NpyError::Malformed(
                    "escapes in strings are not supported".into(),
                ));
            }
            self.i += 1;
        }
        Err(NpyError::Malformed("unterminated string".into()))
    }

    fn boolean(&mut self) -> Result<bool, NpyError> {
        let rest = &self.s[self.i..];
        if rest.starts_with(b"True") {
            self.i += 4;
            Ok(true)
        } else if rest.starts_with(b"False") {
            self.i += 5;
            Ok(false)
        } else {
            Err(NpyError::Malformed(
                "fortran_order is not True or False".into(),
            ))
        }
    }

    fn tuple(&mut self) -> Result<Vec<usize>, NpyError> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            let start = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            // A trailing `L` is how Python 2 wrote long integers.
            let digits = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
            let dim: usize = digits
                .parse()
                .map_err(|_| NpyError::Malformed(format!("bad shape entry at byte {start}")))?;
            self.eat(b'L');
            dims.push(dim);
            if dims.len() > 32 {
                return Err(NpyError::Malformed("more than 32 dimensions".into()));
            }
            self.skip_ws();
            if !self.eat(b',') {
                self.skip_ws();
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_headers_of_every_rank() {
        for shape in [vec![], vec![7], vec![2, 3], vec![4, 5, 6, 7], vec![0, 3]] {
            for dtype in [DType::U8, DType::U16, DType::F32, DType::U64, DType::F64] {
                let bytes = encode_header(dtype, &shape);
                assert_eq!(bytes.len() % ALIGN, 0);
                assert_eq!(bytes.last(), Some(&b'\n'));
                let h = parse_header(&bytes).unwrap();
                assert_eq!(
                    (h.dtype, &h.shape, h.data_offset),
                    (dtype, &shape, bytes.len())
                );
            }
        }
    }

    #[test]
    fn writes_what_numpy_writes() {
        let bytes = encode_header(DType::U16, &[2, 3]);
        let text = std::str::from_utf8(&bytes[10..]).unwrap();
        assert_eq!(bytes.len(), 128);
        assert!(text.starts_with("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }"));
        assert_eq!(&bytes[6..8], &[1, 0]);
        assert_eq!(
            u16::from_le_bytes([bytes[8], bytes[9]]) as usize,
            bytes.len() - 10
        );
        let one = encode_header(DType::F32, &[5]);
        assert!(std::str::from_utf8(&one[10..])
            .unwrap()
            .contains("'shape': (5,), }"));
    }

    #[test]
    fn parses_other_key_orders_and_spacing() {
        let dict = b"{\"shape\":(3,4),\"fortran_order\":False,\"descr\":\"<f4\"}\n";
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        bytes.extend_from_slice(dict);
        let h = parse_header(&bytes).unwrap();
        assert_eq!((h.dtype, h.shape), (DType::F32, vec![3, 4]));
    }

    #[test]
    fn refuses_what_we_cannot_serve() {
        let swap = |from: &str, to: &str| {
            let bytes = encode_header(DType::U16, &[2, 3]);
            let text = std::str::from_utf8(&bytes[10..]).unwrap().replace(from, to);
            let mut out = bytes[..10].to_vec();
            out[8..10].copy_from_slice(&(text.len() as u16).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
            out
        };
        assert!(matches!(
            parse_header(&swap("<u2", ">u2")),
            Err(NpyError::BigEndian(_))
        ));
        assert!(matches!(
            parse_header(&swap("<u2", "<c8")),
            Err(NpyError::UnsupportedDType(_))
        ));
        assert_eq!(
            parse_header(&swap("False", "True ")),
            Err(NpyError::FortranOrder)
        );
        assert_eq!(parse_header(b"PK\x03\x04 not numpy"), Err(NpyError::NotNpy));
        let full = encode_header(DType::U8, &[1]);
        assert_eq!(parse_header(&full[..20]), Err(NpyError::Truncated));
        assert_eq!(parse_header(&full[..3]), Err(NpyError::Truncated));
        let huge = swap("(2, 3)", "(99999999999, 99999999999)");
        assert!(matches!(
            parse_header(&huge),
            Err(NpyError::ShapeOverflow(_))
        ));
    }

    /// A version 1.0 file holding `dict` and `data` bytes.
    fn v1(dict: &str, data: usize) -> Vec<u8> {
        let mut text = dict.as_bytes().to_vec();
        while !(10 + text.len() + 1).is_multiple_of(ALIGN) {
            text.push(b' ');
        }
        text.push(b'\n');
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(&text);
        out.resize(out.len() + data, 0);
        out
    }

    /// The cases the module documentation names (npyz 0.8.4 accepts the
    /// first three; both crates allocate 4 GiB for the last).
    #[test]
    fn npy_refusals_that_npyz_and_ndarray_npy_do_not_make() {
        let plain = v1(
            "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }",
            4,
        );
        assert_eq!(parse_header(&plain).unwrap().shape, [2]);
        let extra = v1(
            "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'extra': 1, }",
            4,
        );
        assert_eq!(
            parse_header(&extra),
            Err(NpyError::Malformed("unexpected key \"extra\"".into()))
        );
        let non_ascii = v1(
            "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), 'caf\u{e9}': 1, }",
            4,
        );
        assert_eq!(
            parse_header(&non_ascii),
            Err(NpyError::Malformed("header is not ASCII".into()))
        );
        let overflow = v1(
            "{'descr': '<u2', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }",
            0,
        );
        assert!(matches!(
            parse_header(&overflow),
            Err(NpyError::ShapeOverflow(_))
        ));
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[2, 0]);
        huge.extend_from_slice(&0xFFFF_FF00u32.to_le_bytes());
        huge.extend_from_slice(b"{'descr': '<u2'");
        assert_eq!(
            parse_header(&huge),
            Err(NpyError::HeaderTooLarge(0xFFFF_FF00))
        );
    }

    #[test]
    fn checks_the_data_length() {
        let h = parse_header(&encode_header(DType::U16, &[2, 3])).unwrap();
        let offset = h.data_offset as u64;
        assert!(h.check_file_len(offset + 12).is_ok());
        assert!(matches!(
            h.check_file_len(offset + 11),
            Err(NpyError::DataLength {
                expected: 12,
                actual: 11,
                ..
            })
        ));
    }
}
