//! Every subcommand's help (and so its man page) ends with examples, and
//! every example is a command line the parser accepts
//! (`qemfs_args::man::check_examples`).

use clap::{CommandFactory, Parser};

#[test]
fn every_qem_subcommand_has_examples_that_parse() {
    let parse = |argv: &[String]| {
        qemfs_cmds::qem_args::Cli::try_parse_from(argv)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    if let Err(e) = qemfs_args::man::check_examples(qemfs_cmds::qem_args::Cli::command(), parse) {
        panic!("{e}");
    }
}

#[test]
fn every_semq_subcommand_has_examples_that_parse() {
    let parse = |argv: &[String]| {
        qemfs_cmds::semq_args::parse(argv)
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    };
    if let Err(e) = qemfs_args::man::check_examples(qemfs_cmds::semq_args::Cli::command(), parse) {
        panic!("{e}");
    }
}
