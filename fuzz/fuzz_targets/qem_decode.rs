//! Opening, full validation and the main read paths of a `.qem` file.
//!
//! Built by cargo-fuzz with `--cfg fuzzing`, under which the library does
//! not insist on the header and body SHA-256 digests (see
//! `src/qem/envelope.rs` and `src/qem/checksum.rs`): mutated bodies reach
//! the decoders instead of stopping at the checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qemfs::qem::{QemFile, Tile, ValidationLevel};

/// Inputs declaring a larger decoded array are skipped, so that one input
/// never takes more than a few milliseconds.
const MAX_DENSE_BYTES: usize = 16 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = QemFile::from_bytes(data.to_vec()) else {
        return;
    };
    match file.dense_bytes() {
        Some(n) if n <= MAX_DENSE_BYTES => {}
        _ => return,
    }
    let _ = file.validate(ValidationLevel::Full);
    if file.frames() == 0 {
        return;
    }
    let mut frame = vec![0u8; file.frame_bytes()];
    let _ = file.read_frame(0, &mut frame);
    let _ = file.spatial_sums(Tile::Px8, 0..file.frames());
    let _ = file.spatial_sums(Tile::Px32, 0..1);
    if file.pixels() > 0 {
        let _ = file.decode_pixels(&[0, file.pixels() - 1]);
    }
    if let Some(last) = file.blocks().len().checked_sub(1) {
        let _ = file.decode_block(last);
    }
});
