//! Opening, full validation and the main read paths of a `.qem` file.
//!
//! Built by cargo-fuzz with `--cfg fuzzing`, under which the library does
//! not insist on the header and body SHA-256 digests (see
//! `src/qem/envelope.rs` and `src/qem/checksum.rs`): mutated bodies reach
//! the decoders instead of stopping at the checksum.
//!
//! Besides "no panic", a file that passes full validation must be readable
//! by every path, and the paths must agree with the whole-array decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qemfs::qem::{Codec, Dtype, PixelValues, QemFile, Tile, ValidationLevel};

/// Inputs declaring a larger decoded array are skipped, so that one input
/// never takes more than a few milliseconds.
const MAX_DENSE_BYTES: usize = 16 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = QemFile::from_bytes(data.to_vec()) else {
        return;
    };
    let dense_bytes = match file.dense_bytes() {
        Some(n) if n <= MAX_DENSE_BYTES => n,
        _ => return,
    };
    let valid = file.validate(ValidationLevel::Full).is_ok();
    if file.frames() == 0 || file.pixels() == 0 {
        return;
    }
    let mut frame = vec![0u8; file.frame_bytes()];
    let frame_read = file.read_frame(0, &mut frame);
    let sums = file.spatial_sums(Tile::Px8, 0..file.frames());
    let _ = file.spatial_sums(Tile::Px32, 0..1);
    let last_pixel = file.pixels() - 1;
    let pixels = file.decode_pixels(&[0, last_pixel]);
    if let Some(last) = file.blocks().len().checked_sub(1) {
        let _ = file.decode_block(last);
    }
    if !valid {
        return;
    }
    let mut dense = vec![0u8; dense_bytes];
    file.read_all(&mut dense)
        .expect("a fully validated file reads whole");
    frame_read.expect("a fully validated file reads frame 0");
    assert_eq!(frame[..], dense[..frame.len()], "read_frame(0) != read_all");
    let pixels = pixels.expect("a fully validated file decodes pixels");
    if file.codec() == Codec::Integer {
        sums.expect("a fully validated integer file has spatial sums");
    }
    let (n, p, e) = (file.frames(), file.pixels(), file.decoded_dtype().size());
    for (k, px) in [0, last_pixel].into_iter().enumerate() {
        for t in 0..n {
            let at = (t * p + px) * e;
            let want = &dense[at..at + e];
            let same = match (&pixels.values, file.codec(), file.stored_dtype()) {
                (PixelValues::U16(v), Codec::Integer, Dtype::U8) => {
                    u16::from(want[0]) == v[k * n + t]
                }
                (PixelValues::U16(v), Codec::Integer, _) => {
                    u16::from_le_bytes([want[0], want[1]]) == v[k * n + t]
                }
                (PixelValues::F32Bits(v), Codec::Float, _) => {
                    u32::from_le_bytes([want[0], want[1], want[2], want[3]]) == v[k * n + t]
                }
                (PixelValues::U16(_), Codec::Scaled, _) => true,
                _ => panic!("decode_pixels returns the wrong value kind"),
            };
            assert!(same, "decode_pixels != read_all at pixel {px}, frame {t}");
        }
    }
});
