//! Man pages, generated from the clap definitions so they cannot drift
//! from what the binaries accept. Each binary renders its own tool's pages
//! (only it can see its CLI) and a test compares them with `man/`.

use clap::{Arg, Command};

/// The man pages of one tool: one for the tool and one per subcommand
/// (`qem-show.1`, ...), as git does; hidden subcommands get none.
pub fn render_tool(command: Command) -> Vec<(String, Vec<u8>)> {
    let mut pages = Vec::new();
    // The tool's own version (`#[command(version)]` in its crate), also on
    // every subcommand's page.
    let version = command
        .get_version()
        .unwrap_or(env!("CARGO_PKG_VERSION"))
        .to_string();
    let mut command = command.version(version.clone());
    // Built, the command has its `help` subcommand, which the tool's page
    // lists: it gets a page too.
    command.build();
    let name = command.get_name().to_string();
    pages.push((format!("{name}.1"), render(&command)));
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let full = format!("{name}-{}", sub.get_name());
        let sub = if sub.get_name() == "help" {
            help_page(sub, &name)
        } else {
            sub.clone()
        };
        let sub = sub.name(full.clone()).version(version.clone());
        pages.push((format!("{full}.1"), render(&sub)));
    }
    pages
}

/// Compares `pages` with the files of `dir` that `owned` claims (its
/// tool's: other tools' pages share the folder), first rewriting them when
/// `QEMFS_UPDATE_MAN` is set. The error names what is stale.
pub fn check_pages(
    dir: &std::path::Path,
    pages: &[(String, Vec<u8>)],
    owned: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let owned_files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(&owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    if std::env::var_os("QEMFS_UPDATE_MAN").is_some() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        for old in owned_files() {
            std::fs::remove_file(old).map_err(|e| e.to_string())?;
        }
        for (name, text) in pages {
            std::fs::write(dir.join(name), text).map_err(|e| e.to_string())?;
        }
    }
    let stale: Vec<&str> = pages
        .iter()
        .filter(|(name, text)| std::fs::read(dir.join(name)).ok().as_ref() != Some(text))
        .map(|(name, _)| name.as_str())
        .collect();
    let listed = owned_files().len();
    if stale.is_empty() && listed == pages.len() {
        return Ok(());
    }
    Err(format!(
        "man pages are stale or missing ({stale:?}; {listed} files for {} pages); \
         regenerate with QEMFS_UPDATE_MAN=1 and the test that failed",
        pages.len()
    ))
}

/// Checks that every visible subcommand of `cli` ends its help (and so its
/// man page) with examples, and that each example is a command line
/// `parse` accepts: an example a renamed flag has broken fails the tool's
/// test, not a user's shell. The error names the subcommand or the line.
pub fn check_examples(
    mut cli: Command,
    parse: impl Fn(&[String]) -> Result<(), String>,
) -> Result<(), String> {
    cli.build();
    let program = cli.get_name().to_string();
    let mut seen = 0;
    for sub in cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let help = sub
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let lines = example_lines(&help, &program);
        if lines.is_empty() {
            return Err(format!(
                "`{program} {}` has no examples in its help",
                sub.get_name()
            ));
        }
        for words in lines {
            if words.get(1).map(String::as_str) != Some(sub.get_name()) {
                return Err(format!(
                    "an example of `{program} {}` runs another subcommand: {words:?}",
                    sub.get_name()
                ));
            }
            parse(&words).map_err(|e| format!("example {words:?} does not parse: {e}"))?;
            seen += 1;
        }
    }
    if seen == 0 {
        return Err(format!("`{program}` has no subcommand examples"));
    }
    Ok(())
}

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
