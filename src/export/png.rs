//! 8-bit grayscale PNG previews with auto-contrast.
//!
//! The image data is stored in uncompressed deflate blocks: previews are
//! small, and an uncompressed PNG's size follows from its shape alone, so
//! the mount can list a preview's exact size before computing it.
//!
//! A virtual image has one value per scan position, often a few dozen a
//! side; shown one screen pixel each it is a smudge. Previews are therefore
//! enlarged by a whole factor, each value a square block (nearest
//! neighbour, so no value is invented), until the long side is at least
//! `PREVIEW_MIN_SIDE` pixels.

/// Largest payload of one stored deflate block.
const STORED_BLOCK: usize = 65_535;

/// Previews are enlarged until their long side has at least this many pixels.
pub(crate) const PREVIEW_MIN_SIDE: u32 = 256;

/// The whole factor a `rows × columns` image is enlarged by.
fn preview_factor(rows: u32, columns: u32) -> u32 {
    let long = rows.max(columns);
    if long == 0 {
        1
    } else {
        PREVIEW_MIN_SIDE.div_ceil(long)
    }
}

/// The shape of the preview of a `rows × columns` image.
pub(crate) fn preview_shape(rows: u32, columns: u32) -> (u32, u32) {
    let k = preview_factor(rows, columns);
    (rows * k, columns * k)
}

/// Exact size of the PNG [`preview`] writes for an image of this shape.
pub(crate) fn preview_len(rows: u32, columns: u32) -> u64 {
    let (r, c) = preview_shape(rows, columns);
    png_len(r, c)
}

/// The preview of a `rows × columns` image of `values` (row-major): the
/// 8-bit stretch of [`auto_contrast`], enlarged to `preview_shape`.
pub fn preview(rows: u32, columns: u32, values: &[f32]) -> Vec<u8> {
    let k = preview_factor(rows, columns) as usize;
    let (r, c) = (rows as usize, columns as usize);
    let mut gray = auto_contrast(values);
    gray.resize(r * c, 0);
    let mut big = Vec::with_capacity(r * c * k * k);
    for row in gray.chunks(c.max(1)).take(r) {
        let line: Vec<u8> = row
            .iter()
            .flat_map(|&v| std::iter::repeat_n(v, k))
            .collect();
        for _ in 0..k {
            big.extend_from_slice(&line);
        }
    }
    let (pr, pc) = preview_shape(rows, columns);
    encode_gray8(pr, pc, &big)
}

/// Exact size of the PNG [`encode_gray8`] writes for an image of this shape.
pub(crate) fn png_len(rows: u32, columns: u32) -> u64 {
    let raw = u64::from(rows) * (u64::from(columns) + 1);
    let blocks = raw.div_ceil(STORED_BLOCK as u64).max(1);
    let zlib = 2 + raw + 5 * blocks + 4;
    8 + (12 + 13) + (12 + zlib) + 12
}

/// A grayscale PNG of `rows × columns` 8-bit pixels (row-major).
/// `pixels.len()` must equal `rows * columns`; a shorter slice is padded
/// with black and a longer one cut, so the size is always [`png_len`].
pub(crate) fn encode_gray8(rows: u32, columns: u32, pixels: &[u8]) -> Vec<u8> {
    let (r, c) = (rows as usize, columns as usize);
    let mut raw = Vec::with_capacity(r * (c + 1));
    for row in 0..r {
        raw.push(0); // filter type None
        let start = (row * c).min(pixels.len());
        let end = (start + c).min(pixels.len());
        raw.extend_from_slice(&pixels[start..end]);
        raw.resize(raw.len() + c - (end - start), 0);
    }

    let mut zlib = Vec::with_capacity(raw.len() + raw.len() / STORED_BLOCK * 5 + 11);
    zlib.extend_from_slice(&[0x78, 0x01]);
    let mut blocks = raw.chunks(STORED_BLOCK).peekable();
    if blocks.peek().is_none() {
        zlib.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let last = u8::from(blocks.peek().is_none());
        let len = block.len() as u16;
        zlib.push(last);
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());

    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&columns.to_be_bytes());
    ihdr.extend_from_slice(&rows.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // 8-bit gray, deflate, no interlace

    let mut out = Vec::with_capacity(png_len(rows, columns) as usize);
    out.extend_from_slice(b"\x89PNG\r\n\x1a\n");
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// Maps values to 0–255 linearly between their 0.5th and 99.5th
/// percentiles (of the finite values), so a few hot pixels do not wash out
/// the image. Non-finite values become 0; a flat image is mid-gray.
pub fn auto_contrast(values: &[f32]) -> Vec<u8> {
    let mut finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return vec![0; values.len()];
    }
    let n = finite.len();
    let lo_at = n * 5 / 1000;
    let hi_at = (n * 995 / 1000).min(n - 1);
    let lo = *finite.select_nth_unstable_by(lo_at, f32::total_cmp).1;
    let hi = *finite.select_nth_unstable_by(hi_at, f32::total_cmp).1;
    let span = f64::from(hi) - f64::from(lo);
    values
        .iter()
        .map(|&v| {
            if !v.is_finite() {
                0
            } else if span <= 0.0 {
                128
            } else {
                let t = (f64::from(v) - f64::from(lo)) / span;
                (t * 255.0).round().clamp(0.0, 255.0) as u8
            }
        })
        .collect()
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc.finalize().to_be_bytes());
}

fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65_521;
    // 5552 is the longest run whose sums cannot overflow u32 before reducing.
    let (mut a, mut b) = (1u32, 0u32);
    for run in data.chunks(5552) {
        for &byte in run {
            a += u32::from(byte);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes with the `png` crate, which checks every CRC and the zlib
    /// stream's Adler-32.
    fn decode(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let decoder = ::png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!(info.color_type, ::png::ColorType::Grayscale);
        assert_eq!(info.bit_depth, ::png::BitDepth::Eight);
        pixels.truncate(info.buffer_size());
        (info.width, info.height, pixels)
    }

    #[test]
    fn encodes_exactly_the_announced_size() {
        for (rows, columns) in [(1, 1), (3, 5), (300, 400), (0, 0), (1, 70_000)] {
            let pixels: Vec<u8> = (0..rows * columns).map(|i| (i * 31 % 251) as u8).collect();
            let png = encode_gray8(rows, columns, &pixels);
            assert_eq!(png.len() as u64, png_len(rows, columns), "{rows}x{columns}");
            if rows > 0 {
                assert_eq!(decode(&png), (columns, rows, pixels));
            }
        }
    }

    #[test]
    fn adler32_matches_the_rfc_example() {
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
        assert_eq!(adler32(&vec![255u8; 100_000]), {
            let (mut a, mut b) = (1u64, 0u64);
            for _ in 0..100_000 {
                a = (a + 255) % 65_521;
                b = (b + a) % 65_521;
            }
            ((b << 16) | a) as u32
        });
    }

    #[test]
    fn auto_contrast_spans_the_range_and_ignores_outliers() {
        let mut values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        values[999] = 1e9; // one hot pixel
        values[0] = f32::NAN;
        let out = auto_contrast(&values);
        assert_eq!(out[0], 0);
        assert_eq!(out[999], 255);
        assert!(out[500] > 100 && out[500] < 160, "{}", out[500]);
        assert!(out[5] <= 2);
        assert_eq!(auto_contrast(&[3.0, 3.0]), vec![128, 128]);
        assert_eq!(auto_contrast(&[f32::INFINITY]), vec![0]);
    }

    #[test]
    fn small_images_are_enlarged_block_by_block() {
        for (rows, columns) in [(24, 32), (1, 1), (3, 300), (256, 2), (600, 10)] {
            let values: Vec<f32> = (0..rows * columns).map(|i| (i % 97) as f32).collect();
            let png = preview(rows, columns, &values);
            assert_eq!(png.len() as u64, preview_len(rows, columns));
            let (w, h, pixels) = decode(&png);
            assert_eq!((h, w), preview_shape(rows, columns));
            assert!(w.max(h) >= PREVIEW_MIN_SIDE, "{rows}x{columns} -> {h}x{w}");
            let k = (h / rows) as usize;
            assert_eq!(
                (h as usize, w as usize),
                (rows as usize * k, columns as usize * k)
            );
            // Nearest neighbour: every output pixel is its source value's stretch.
            let gray = auto_contrast(&values);
            for (i, &p) in pixels.iter().enumerate() {
                let (y, x) = (i / w as usize, i % w as usize);
                assert_eq!(
                    p,
                    gray[y / k * columns as usize + x / k],
                    "{rows}x{columns} at {y},{x}"
                );
            }
        }
        // 24 x 32 scan positions (the bundled example) become 192 x 256.
        assert_eq!(preview_shape(24, 32), (192, 256));
        assert_eq!(preview_shape(300, 400), (300, 400));
    }
}
