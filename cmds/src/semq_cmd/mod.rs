//! The `semq` subcommands.

pub mod check;
pub mod encode;
pub mod report;

use crate::exit::Failure;
use crate::semq_args::{Cli, Command};

/// Runs a parsed command line; the exit status on success.
pub fn run(cli: Cli) -> Result<u8, Failure> {
    // A mapped input truncated by another process reads as zeros instead
    // of killing us; `exit::finish` and every published output then fail.
    qemfs::mapguard::install_strict();
    match cli.command {
        Command::Show(a) => report::show(&a),
        Command::Diff(a) => report::diff(&a),
        Command::Floor(a) => report::floor(&a),
        Command::Version(a) => report::version(&a),
        Command::Validate(a) => check::validate(&a),
        Command::Hash(a) => check::hash(&a),
        Command::Encode(a) => encode::encode(&a),
        Command::Convert(a) => encode::convert(&a),
        Command::Concat(a) => encode::concat(&a),
        Command::Completions(a) => {
            use clap::CommandFactory;
            let mut out = crate::out::Stdout::new();
            qemfs_args::completions::write(Cli::command(), a.shell, &mut out)?;
            out.done()?;
            Ok(crate::exit::OK)
        }
    }
}
