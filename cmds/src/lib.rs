//! Shared plumbing of the `qem` and `semq` binaries: exit codes, error
//! reporting, stdout handling, progress bars and the clap definitions (kept
//! in the library so man pages and completions are generated from the very
//! same definitions the binaries parse with). The flags `qemfs` shares with
//! them are in the `qemfs-args` crate.

pub mod argparse;
pub mod exit;
pub mod interrupt;
pub mod out;
pub mod out_of_memory;
pub mod progress;
pub mod qem_args;
pub mod qem_cmd;
pub mod semq_args;
pub mod semq_cmd;
