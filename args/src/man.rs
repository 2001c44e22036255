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
