//! `completions SHELL`, the same subcommand in `qem`, `semq` and `qemfs`.

use std::io::Write;

use clap::{Args, Command};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

/// Writes the completion script for `shell` of the tool described by
/// `command`, in one write.
pub fn write(
    mut command: Command,
    shell: clap_complete::Shell,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let name = command.get_name().to_string();
    let mut buffer = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut buffer);
    out.write_all(&buffer)
}
