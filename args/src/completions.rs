//! `completions SHELL`, the same subcommand in `qem`, `semq` and `qemfs`.

use std::io::Write;

use clap::{Args, Command};

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

/// Writes the completion script for `shell` of the tool described by
/// `command`, in one write. Hidden subcommands (`qemfs daemon`) are left
/// out: clap_complete offers every subcommand, hidden or not.
pub fn write(
    command: Command,
    shell: clap_complete::Shell,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut command = without_hidden_subcommands(&command);
    let name = command.get_name().to_string();
    let mut buffer = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut buffer);
    out.write_all(&buffer)
}

/// `command` rebuilt from what a completion script reads (names, help
/// lines, aliases, version, arguments) with its hidden subcommands dropped,
/// at every level. clap has no way to remove a subcommand in place.
fn without_hidden_subcommands(command: &Command) -> Command {
    let mut kept = Command::new(command.get_name().to_owned())
        .args(command.get_arguments().cloned())
        .visible_aliases(command.get_visible_aliases().map(str::to_owned))
        .subcommands(
            command
                .get_subcommands()
                .filter(|sub| !sub.is_hide_set())
                .map(without_hidden_subcommands),
        );
    if let Some(about) = command.get_about() {
        kept = kept.about(about.clone());
    }
    if let Some(about) = command.get_long_about() {
        kept = kept.long_about(about.clone());
    }
    if let Some(version) = command.get_version() {
        kept = kept.version(version.to_owned());
    }
    if let Some(version) = command.get_long_version() {
        kept = kept.long_version(version.to_owned());
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_subcommands_are_not_offered() {
        let command = Command::new("tool")
            .subcommand(Command::new("shown").about("A visible one"))
            .subcommand(Command::new("secret").hide(true));
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut script = Vec::new();
            write(command.clone(), shell, &mut script).unwrap();
            let script = String::from_utf8(script).unwrap();
            assert!(script.contains("shown"), "{shell}: {script}");
            assert!(!script.contains("secret"), "{shell}: {script}");
        }
    }
}
