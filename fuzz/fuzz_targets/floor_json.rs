//! The strict floor JSON reader; whatever it accepts must write back to
//! JSON that reads to the same floor.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qemfs::semq::Floor;

fuzz_target!(|data: &[u8]| {
    if let Ok(floor) = Floor::from_json(data) {
        let text = floor.to_json();
        let again = Floor::from_json(text.as_bytes()).expect("canonical floor JSON reads back");
        assert_eq!(floor, again);
    }
});
