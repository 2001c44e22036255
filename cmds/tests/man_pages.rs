//! The man pages of `qem` and `semq` in `man/` are generated from the clap
//! definitions; this fails when they are stale. Regenerate with
//! `QEMFS_UPDATE_MAN=1 cargo test -p qemfs-cmds --test man_pages`.
//! (`qemfs`'s pages share the folder; fs/src/main.rs checks those.)

use std::path::Path;

use clap::CommandFactory;
use qemfs_args::man::{check_pages, render_tool};

#[test]
fn man_pages_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../man");
    let mut pages = render_tool(qemfs_cmds::qem_args::Cli::command());
    pages.extend(render_tool(qemfs_cmds::semq_args::Cli::command()));
    let ours = |name: &str| name == "qem.1" || name.starts_with("qem-") || name.starts_with("semq");
    if let Err(e) = check_pages(&dir, &pages, ours) {
        panic!("{e}");
    }
}
