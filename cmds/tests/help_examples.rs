//! Every subcommand's help (and so its man page) ends with examples, and
//! every example is a command line the parser accepts: an example that a
//! renamed flag has broken fails here, not in a user's shell.

use clap::{Command, CommandFactory, Parser};

/// The command lines of an "Examples:" section that start with `program`,
/// cut at a comment, a redirection, a pipe or `&&` (each part after `&&`
/// is a command line too).
fn example_lines(help: &str, program: &str) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    let Some((_, examples)) = help.split_once("Examples:") else {
        return lines;
    };
    for line in examples.lines() {
        let line = line.split(" #").next().unwrap_or("");
        for part in line.split("&&") {
            let words: Vec<String> = part
                .split_whitespace()
                .take_while(|w| !matches!(*w, ">" | "|" | "<"))
                .map(String::from)
                .collect();
            if words.first().map(String::as_str) == Some(program) {
                lines.push(words);
            }
        }
    }
    lines
}

fn check(mut cli: Command, program: &str, parse: impl Fn(&[String]) -> Result<(), String>) {
    cli.build();
    let mut seen = 0;
    for sub in cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let help = sub
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let lines = example_lines(&help, program);
        assert!(
            !lines.is_empty(),
            "`{program} {}` has no examples in its help",
            sub.get_name()
        );
        for words in lines {
            assert_eq!(
                words.get(1).map(String::as_str),
                Some(sub.get_name()),
                "an example of `{program} {}` runs another subcommand: {words:?}",
                sub.get_name()
            );
            parse(&words).unwrap_or_else(|e| panic!("example {words:?} does not parse: {e}"));
            seen += 1;
        }
    }
    assert!(seen > 0);
}

#[test]
fn every_qem_subcommand_has_examples_that_parse() {
    check(qemfs_cmds::qem_args::Cli::command(), "qem", |argv| {
        qemfs_cmds::qem_args::Cli::try_parse_from(argv)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
}

#[test]
fn every_semq_subcommand_has_examples_that_parse() {
    check(qemfs_cmds::semq_args::Cli::command(), "semq", |argv| {
        qemfs_cmds::semq_args::parse(argv)
            .map(|_| ())
            .map_err(|e| format!("{e:?}"))
    });
}
