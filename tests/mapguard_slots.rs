//! The SIGBUS guard never hands out an unguarded mapping: once its table
//! of mappings is full, a further one is refused (an error naming the
//! cause), and a slot freed by dropping a mapping is usable again. Its own
//! test binary, so that no other test maps files while the table is full.

use std::io::Write;

use qemfs::mapguard::{install, Mapping};

#[test]
fn a_full_guard_refuses_to_map_instead_of_leaving_a_file_unguarded() {
    install();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&[1u8; 4096]).unwrap();
    file.flush().unwrap();
    let mut held = Vec::new();
    let refused = loop {
        match Mapping::map(file.as_file()) {
            Ok(m) => held.push(m),
            Err(e) => break e,
        }
        assert!(held.len() <= 1 << 20, "the guard's table never filled");
    };
    assert!(
        refused.to_string().contains("files mapped at once"),
        "{refused}"
    );
    assert!(held.len() >= 1024, "{} slots", held.len());
    held.pop();
    let again = Mapping::map(file.as_file()).expect("a freed slot is reused");
    assert_eq!(again[0], 1);
}
