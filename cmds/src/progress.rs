//! Progress bars for long work: drawn on stderr only when stderr is a
//! terminal, so scripts and logs never see them.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A bar counting `total` units (bytes when `bytes` is set), or a hidden
/// one when stderr is not a terminal.
pub fn bar(total: u64, what: &str, bytes: bool) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let template = if bytes {
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})"
    } else {
        "{msg} [{bar:40}] {pos}/{len} ({eta})"
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(total)
        .with_style(style)
        .with_message(what.to_string())
}
