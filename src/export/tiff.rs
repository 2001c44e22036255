//! Uncompressed grayscale TIFF (one or many pages), laid out so that every
//! byte offset is known before any pixel is decoded: the mount can state a
//! file's size from the header alone and serve any byte range of it.
//!
//! File = header (+ description) then, per page, its IFD followed by its
//! pixels. Classic TIFF is used while every offset fits 32 bits; larger
//! files switch to BigTIFF, which Fiji, tifffile and libtiff all read.

use std::io::{self, Write};

/// Pixel types TIFF pages can hold here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    U8,
    U16,
    F32,
}

impl Sample {
    pub fn size(self) -> u64 {
        match self {
            Sample::U8 => 1,
            Sample::U16 => 2,
            Sample::F32 => 4,
        }
    }

    /// TIFF SampleFormat: 1 = unsigned integer, 3 = IEEE float.
    fn format(self) -> u16 {
        match self {
            Sample::F32 => 3,
            _ => 1,
        }
    }
}

const TAG_COUNT: u64 = 12;

/// The byte layout of a TIFF of `pages` pages of `rows × columns` samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiffLayout {
    rows: u32,
    columns: u32,
    sample: Sample,
    pages: u64,
    description: Vec<u8>,
    big: bool,
}

impl TiffLayout {
    /// `description` is stored (NUL-terminated) in page 0's
    /// ImageDescription; give it the scan shape, for example.
    pub fn new(rows: u32, columns: u32, sample: Sample, pages: u64, description: &str) -> Self {
        let mut description = description.as_bytes().to_vec();
        description.retain(|&b| b != 0);
        description.push(0);
        let mut layout = TiffLayout {
            rows,
            columns,
            sample,
            pages,
            description,
            big: false,
        };
        if layout.total_len() > u64::from(u32::MAX) {
            layout.big = true;
        }
        layout
    }

    pub fn is_bigtiff(&self) -> bool {
        self.big
    }

    /// Bytes of one page's pixels.
    pub fn page_data_len(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.columns) * self.sample.size()
    }

    fn header_len(&self) -> u64 {
        let fixed = if self.big { 16 } else { 8 };
        align8(fixed + self.description.len() as u64)
    }

    fn ifd_len(&self) -> u64 {
        if self.big {
            8 + 20 * TAG_COUNT + 8
        } else {
            2 + 12 * TAG_COUNT + 4
        }
    }

    /// Bytes from a page's IFD to the start of its pixels.
    fn page_prefix_len(&self) -> u64 {
        align8(self.ifd_len())
    }

    fn page_stride(&self) -> u64 {
        align8(self.page_prefix_len() + self.page_data_len())
    }

    /// Offset of page `i`'s IFD.
    pub fn page_offset(&self, page: u64) -> u64 {
        self.header_len() + page * self.page_stride()
    }

    /// Offset of page `i`'s first pixel byte.
    pub fn page_data_offset(&self, page: u64) -> u64 {
        self.page_offset(page) + self.page_prefix_len()
    }

    /// The size of the whole file.
    pub fn total_len(&self) -> u64 {
        self.header_len() + self.pages * self.page_stride()
    }

    /// The file header with the description, padded to the first IFD.
    pub fn header(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.header_len() as usize);
        out.extend_from_slice(b"II");
        let first_ifd = if self.pages == 0 {
            0
        } else {
            self.page_offset(0)
        };
        if self.big {
            out.extend_from_slice(&43u16.to_le_bytes());
            out.extend_from_slice(&8u16.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
            out.extend_from_slice(&first_ifd.to_le_bytes());
        } else {
            out.extend_from_slice(&42u16.to_le_bytes());
            out.extend_from_slice(&(first_ifd as u32).to_le_bytes());
        }
        out.extend_from_slice(&self.description);
        out.resize(self.header_len() as usize, 0);
        out
    }

    /// Page `i`'s IFD, padded up to its pixels.
    pub fn page_prefix(&self, page: u64) -> Vec<u8> {
        let description_offset = if self.big { 16 } else { 8 };
        let next = if page + 1 < self.pages {
            self.page_offset(page + 1)
        } else {
            0
        };
        let data_offset = self.page_data_offset(page);
        // (tag, type, count, value) in ascending tag order, as TIFF requires.
        const SHORT: u16 = 3;
        const LONG: u16 = 4;
        const ASCII: u16 = 2;
        const LONG8: u16 = 16;
        let offset_type = if self.big { LONG8 } else { LONG };
        let (description_count, description_value) = if page == 0 {
            (self.description.len() as u64, description_offset)
        } else {
            // Later pages repeat nothing but a one-byte empty description.
            (1, 0)
        };
        let entries: [(u16, u16, u64, u64); TAG_COUNT as usize] = [
            (256, LONG, 1, u64::from(self.columns)),
            (257, LONG, 1, u64::from(self.rows)),
            (258, SHORT, 1, self.sample.size() * 8),
            (259, SHORT, 1, 1),
            (262, SHORT, 1, 1),
            (270, ASCII, description_count, description_value),
            (273, offset_type, 1, data_offset),
            (277, SHORT, 1, 1),
            (278, LONG, 1, u64::from(self.rows)),
            (279, offset_type, 1, self.page_data_len()),
            (284, SHORT, 1, 1),
            (339, SHORT, 1, u64::from(self.sample.format())),
        ];
        let mut out = Vec::with_capacity(self.page_prefix_len() as usize);
        if self.big {
            out.extend_from_slice(&TAG_COUNT.to_le_bytes());
        } else {
            out.extend_from_slice(&(TAG_COUNT as u16).to_le_bytes());
        }
        for (tag, kind, count, value) in entries {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            let field_len = if self.big { 8 } else { 4 };
            if self.big {
                out.extend_from_slice(&count.to_le_bytes());
            } else {
                out.extend_from_slice(&(count as u32).to_le_bytes());
            }
            // Values that fit the value field sit left-justified in it;
            // longer ones are stored elsewhere and the field holds their offset.
            let mut field = [0u8; 8];
            if kind == SHORT {
                field[..2].copy_from_slice(&(value as u16).to_le_bytes());
            } else if kind == ASCII && count <= field_len as u64 {
                if page == 0 {
                    field[..self.description.len()].copy_from_slice(&self.description);
                }
            } else {
                field.copy_from_slice(&value.to_le_bytes());
            }
            out.extend_from_slice(&field[..field_len]);
        }
        if self.big {
            out.extend_from_slice(&next.to_le_bytes());
        } else {
            out.extend_from_slice(&(next as u32).to_le_bytes());
        }
        out.resize(self.page_prefix_len() as usize, 0);
        out
    }

    /// Zero bytes after page `i`'s pixels, up to the next page.
    pub fn page_padding(&self) -> usize {
        (self.page_stride() - self.page_prefix_len() - self.page_data_len()) as usize
    }

    /// Writes the whole file, asking `page_data` for each page's pixels
    /// (`page_data_len()` little-endian bytes) in order.
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        mut page_data: impl FnMut(u64, &mut W) -> io::Result<()>,
    ) -> io::Result<()> {
        out.write_all(&self.header())?;
        let padding = vec![0u8; self.page_padding()];
        for page in 0..self.pages {
            out.write_all(&self.page_prefix(page))?;
            page_data(page, out)?;
            out.write_all(&padding)?;
        }
        Ok(())
    }
}

fn align8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal independent TIFF reader: follows the IFD chain and pulls
    /// each page's tags and pixels, as a viewer would.
    fn read_pages(bytes: &[u8]) -> Vec<(u32, u32, u16, u16, Vec<u8>)> {
        let u16at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        assert_eq!(&bytes[..2], b"II");
        let big = u16at(2) == 43;
        let mut ifd = if big { u64at(8) } else { u64::from(u32at(4)) } as usize;
        let mut pages = Vec::new();
        while ifd != 0 {
            let (count, first, size) = if big {
                (u64at(ifd) as usize, ifd + 8, 20)
            } else {
                (usize::from(u16at(ifd)), ifd + 2, 12)
            };
            let mut tags = std::collections::HashMap::new();
            for e in 0..count {
                let o = first + e * size;
                let value = if big {
                    u64at(o + 12)
                } else {
                    u64::from(u32at(o + 8))
                };
                let value = if u16at(o + 2) == 3 {
                    value & 0xffff
                } else {
                    value
                };
                tags.insert(u16at(o), value);
            }
            let (w, h) = (tags[&256] as u32, tags[&257] as u32);
            let (start, len) = (tags[&273] as usize, tags[&279] as usize);
            pages.push((
                w,
                h,
                tags[&258] as u16,
                tags[&339] as u16,
                bytes[start..start + len].to_vec(),
            ));
            let next_at = first + count * size;
            ifd = if big {
                u64at(next_at)
            } else {
                u64::from(u32at(next_at))
            } as usize;
        }
        pages
    }

    /// Page 0's ImageDescription, inline or at its offset.
    fn description(bytes: &[u8]) -> String {
        let ifd = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
        let count = usize::from(u16::from_le_bytes([bytes[ifd], bytes[ifd + 1]]));
        let entry = (0..count)
            .map(|e| ifd + 2 + e * 12)
            .find(|&o| u16::from_le_bytes([bytes[o], bytes[o + 1]]) == 270)
            .unwrap();
        let n = u32::from_le_bytes(bytes[entry + 4..entry + 8].try_into().unwrap()) as usize;
        let at = if n <= 4 {
            entry + 8
        } else {
            u32::from_le_bytes(bytes[entry + 8..entry + 12].try_into().unwrap()) as usize
        };
        assert_eq!(bytes[at + n - 1], 0, "NUL-terminated");
        String::from_utf8(bytes[at..at + n - 1].to_vec()).unwrap()
    }

    #[test]
    fn short_descriptions_sit_in_the_entry() {
        for text in ["", "ab", "abc", "abcd"] {
            let layout = TiffLayout::new(1, 1, Sample::U8, 1, text);
            assert_eq!(description(&build(&layout, |_| vec![9])), text);
        }
    }

    fn build(layout: &TiffLayout, fill: impl Fn(u64) -> Vec<u8>) -> Vec<u8> {
        let mut out = Vec::new();
        layout
            .write(&mut out, |page, w| w.write_all(&fill(page)))
            .unwrap();
        out
    }

    #[test]
    fn pages_come_back_with_their_pixels() {
        for sample in [Sample::U8, Sample::U16, Sample::F32] {
            let layout = TiffLayout::new(3, 5, sample, 4, "scan_shape=(2, 2)");
            let n = layout.page_data_len() as usize;
            let bytes = build(&layout, |p| {
                (0..n).map(|i| (i as u64 * 7 + p) as u8).collect()
            });
            assert_eq!(bytes.len() as u64, layout.total_len());
            let pages = read_pages(&bytes);
            assert_eq!(pages.len(), 4);
            for (p, (w, h, bits, format, data)) in pages.into_iter().enumerate() {
                assert_eq!((w, h), (5, 3));
                assert_eq!(u64::from(bits), sample.size() * 8);
                assert_eq!(format, if sample == Sample::F32 { 3 } else { 1 });
                let want: Vec<u8> = (0..n).map(|i| (i as u64 * 7 + p as u64) as u8).collect();
                assert_eq!(data, want);
                let at = layout.page_data_offset(p as u64) as usize;
                assert_eq!(&bytes[at..at + n], &want[..]);
            }
            assert_eq!(description(&bytes), "scan_shape=(2, 2)");
        }
    }

    #[test]
    fn huge_files_switch_to_bigtiff() {
        let layout = TiffLayout::new(256, 256, Sample::F32, 20_000, "");
        assert!(layout.is_bigtiff());
        assert!(layout.total_len() > u64::from(u32::MAX));
        // Check the structure on a small BigTIFF built with the same code.
        let mut small = TiffLayout::new(2, 3, Sample::U16, 2, "a longer description");
        small.big = true;
        let bytes = build(&small, |p| vec![p as u8; 12]);
        assert_eq!(bytes.len() as u64, small.total_len());
        let pages = read_pages(&bytes);
        assert_eq!(pages.len(), 2);
        assert_eq!(pages[1].4, vec![1u8; 12]);
    }
}
