//! The read paths of `qem_decode`, without its 16 MiB skip: whatever
//! decoded size an input declares, it is opened, validated and read.
//!
//! Memory is the property under test: an input of a few kilobytes that
//! declares a huge detector or scan must be refused or read in bounded
//! memory, never by an allocation sized from a declared field. Run it under
//! a memory limit (see fuzz/README.md): libFuzzer's `-rss_limit_mb` and
//! `-malloc_limit_mb` turn such an allocation into an `oom-` artifact,
//! which is a finding like a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qemfs::qem::{QemFile, Tile, ValidationLevel};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = QemFile::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = file.validate(ValidationLevel::Full);
    if file.frames() == 0 || file.pixels() == 0 {
        return;
    }
    let mut frame = Vec::new();
    if frame.try_reserve_exact(file.frame_bytes()).is_ok() {
        frame.resize(file.frame_bytes(), 0);
        let _ = file.read_frame(0, &mut frame);
    }
    let _ = file.spatial_sums(Tile::Px32, 0..1);
    let _ = file.spatial_sums_checked(Tile::Px8, 0..1, true);
    let _ = file.decode_pixels(&[0, file.pixels() - 1]);
    let _ = file.decode_block(0);
    let _ = file.verify_logical();
});
