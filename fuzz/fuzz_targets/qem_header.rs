//! Envelope, JSON header, scientific metadata and chunk layout: everything
//! `QemFile::from_bytes` checks before touching the body.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = qemfs::qem::QemFile::from_bytes(data.to_vec()) {
        // Everything derived from the header alone must be consistent.
        let _ = file.dense_bytes();
        let _ = file.frame_bytes();
        for b in 0..file.blocks().len().min(4) {
            let _ = file.raw_block_streams(b);
        }
        if file.frames() > 0 {
            let _ = file.block_of_frame(file.frames() - 1);
        }
    }
});
