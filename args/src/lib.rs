//! The command-line flags that `qem`, `semq` and `qemfs` share: one
//! definition each, so help, man pages, completions and parsing agree
//! across the tools. A crate of its own so that `qemfs` builds without the
//! `qem`/`semq` command code.
//!
//! The `man` feature adds the `man` module, the man page renderer that the
//! binaries' tests use; nothing the binaries run needs it.

pub mod completions;
pub mod detector;
pub mod gpu;
#[cfg(feature = "man")]
pub mod man;
pub mod remote;
