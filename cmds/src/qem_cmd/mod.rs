//! The `qem` subcommands.

pub mod convert;
pub mod diff;
pub mod inspect;
pub mod tree;

use crate::exit::Failure;
use crate::out_of_memory::working_on;
use crate::qem_args::{Cli, Command};

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
        Command::Diff(a) => vec![&a.a, &a.b],
        Command::Convert(a) => vec![&a.input],
        Command::Ls(a) => vec![&a.file],
        Command::Cat(a) => vec![&a.file],
        Command::Validate(_) | Command::Hash(_) | Command::Completions(_) => vec![],
    }
    .into_iter()
    .map(|path| working_on(path))
    .collect();
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
