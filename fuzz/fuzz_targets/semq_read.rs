//! Reading a `.semq` image from memory, then the read paths a diff and the
//! `show` report take. Under `--cfg fuzzing` the content digest and state
//! id are not required to match (see `src/semq/read.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qemfs::semq::Encoding;

fuzz_target!(|data: &[u8]| {
    let Ok(e) = Encoding::from_slice(data) else {
        return;
    };
    let d = e.diff(&e).expect("a state is compatible with itself");
    assert!(d.is_empty(), "a state differs from itself: {d:?}");
    for (i, id) in e.ids().enumerate().take(64) {
        assert_eq!(e.find(id), Some(i), "id {i} is not found at its row");
        let _ = e.symbols(i);
    }
    let _ = e.decode_rows(0..e.len().min(8));
});
