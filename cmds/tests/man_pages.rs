//! The man pages in `man/` are generated from the clap definitions; this
//! fails when they are stale. Regenerate with
//! `QEMFS_UPDATE_MAN=1 cargo test -p qemfs-cmds --test man_pages`.

use std::path::Path;

#[test]
fn man_pages_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../man");
    let pages = qemfs_cmds::manpages::render_all();
    if std::env::var_os("QEMFS_UPDATE_MAN").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for old in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(old.unwrap().path()).unwrap();
        }
        for (name, text) in &pages {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }
    let mut stale = Vec::new();
    for (name, text) in &pages {
        match std::fs::read(dir.join(name)) {
            Ok(existing) if &existing == text => {}
            _ => stale.push(name.clone()),
        }
    }
    let listed = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert!(
        stale.is_empty() && listed == pages.len(),
        "man pages are stale or missing ({stale:?}; {listed} files for {} pages); \
         regenerate with QEMFS_UPDATE_MAN=1 cargo test -p qemfs-cmds --test man_pages",
        pages.len()
    );
}
