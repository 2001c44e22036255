//! Man pages and completion scripts, generated from the clap definitions so
//! they cannot drift from what the binaries accept.

use clap::{Arg, Command, CommandFactory};
use std::io::Write;

/// Every man page of both tools: `(file name, roff text)`. One page per
/// tool and one per subcommand (`qem-show.1`, ...), as git does.
pub fn render_all() -> Vec<(String, Vec<u8>)> {
    let mut pages = Vec::new();
    for command in [
        crate::qem_args::Cli::command(),
        crate::semq_args::Cli::command(),
    ] {
        let mut command = command.version(env!("CARGO_PKG_VERSION"));
        // Built, the command has its `help` subcommand, which the tool's page
        // lists: it gets a page too.
        command.build();
        let name = command.get_name().to_string();
        pages.push((format!("{name}.1"), render(&command)));
        for sub in command.get_subcommands() {
            let full = format!("{name}-{}", sub.get_name());
            let sub = if sub.get_name() == "help" {
                help_page(sub, &name)
            } else {
                sub.clone()
            };
            let sub = sub.name(full.clone()).version(env!("CARGO_PKG_VERSION"));
            pages.push((format!("{full}.1"), render(&sub)));
        }
    }
    pages
}

/// clap's `help` subcommand holds a copy of every subcommand; its page
/// names its argument instead of listing pages that do not exist.
fn help_page(help: &Command, tool: &str) -> Command {
    Command::new("help")
        .bin_name(format!("{tool} help"))
        .about(help.get_about().cloned().unwrap_or_default())
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(
            Arg::new("command")
                .value_name("COMMAND")
                .num_args(0..)
                .help("The subcommand (and its subcommands) whose help to print"),
        )
}

fn render(command: &Command) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = clap_mangen::Man::new(command.clone()).render(&mut out);
    out
}

/// Writes the completion script for `shell` of the tool described by `command`.
pub fn completions(
    mut command: Command,
    shell: clap_complete::Shell,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let name = command.get_name().to_string();
    let mut buffer = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut buffer);
    out.write_all(&buffer)
}
