//! The `qem` subcommands.

pub mod convert;
pub mod diff;
pub mod inspect;
pub mod tree;

use crate::exit::Failure;
use crate::qem_args::{Cli, Command};

/// Runs a parsed command line; the exit status on success.
pub fn run(cli: Cli) -> Result<u8, Failure> {
    // A mapped input truncated by another process reads as zeros instead
    // of killing us; `exit::finish` and every published output then fail.
    qemfs::mapguard::install_strict();
    match cli.command {
        Command::Show(a) => inspect::show(&a),
        Command::Validate(a) => inspect::validate(&a),
        Command::Hash(a) => inspect::hash(&a),
        Command::Diff(a) => diff::diff(&a),
        Command::Convert(a) => convert::convert(&a),
        Command::Ls(a) => tree::ls(&a),
        Command::Cat(a) => tree::cat(&a),
        Command::Completions(a) => {
            use clap::CommandFactory;
            let mut out = crate::out::Stdout::new();
            qemfs_args::completions::write(Cli::command(), a.shell, &mut out)?;
            out.done()?;
            Ok(crate::exit::OK)
        }
    }
}
