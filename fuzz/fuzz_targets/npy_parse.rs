//! The `.npy` header parser used by `qem convert` and `semq encode` on
//! their inputs, and the size checks that follow it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qemfs::npy;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = npy::parse_header(data) {
        assert!(header.data_offset <= data.len());
        let len = header.data_len().expect("parse_header checks the size");
        let _ = header.check_file_len(data.len() as u64);
        // What we write for the same array must parse to the same array.
        let again = npy::encode_header(header.dtype, &header.shape);
        let back = npy::parse_header(&again).expect("our own header parses");
        assert_eq!((back.dtype, &back.shape), (header.dtype, &header.shape));
        assert_eq!(back.data_len(), Some(len));
    }
});
