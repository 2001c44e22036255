//! The `semq` subcommands.

pub mod check;
pub mod encode;
pub mod report;

use crate::exit::Failure;
use crate::out_of_memory::working_on;
use crate::semq_args::{Cli, Command};

/// Runs a parsed command line; the exit status on success.
pub fn run(cli: Cli) -> Result<u8, Failure> {
    // A mapped input truncated by another process reads as zeros instead
    // of killing us; `exit::finish` and every published output then fail.
    qemfs::mapguard::install_strict();
    cli.remote.apply();
    // Named if the run runs out of memory; validate and hash name each
    // file while they work on it.
    let _working: Vec<_> = match &cli.command {
        Command::Show(a) => vec![&a.file],
        Command::Diff(a) => vec![&a.reference, &a.candidate],
        Command::Floor(a) => std::iter::once(&a.reference).chain(&a.nulls).collect(),
        Command::Encode(a) => vec![&a.vectors, &a.ids],
        Command::Convert(a) => vec![&a.input],
        Command::Concat(a) => a.inputs.iter().collect(),
        Command::Version(_) | Command::Validate(_) | Command::Hash(_) | Command::Completions(_) => {
            vec![]
        }
    }
    .into_iter()
    .map(|path| working_on(path))
    .collect();
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
