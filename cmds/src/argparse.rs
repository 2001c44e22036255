//! Usage errors in the shape of Python's argparse, for the `semq` command.
//!
//! Scripts written against the upstream `semq` command match its usage
//! errors (`usage: ...` then `semq show: error: ...`, exit 2), so clap's
//! errors are re-rendered that way. Help and version requests print clap's
//! own text.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// argparse usage lines of the upstream subcommands, wrapped as argparse
/// wraps them at its default width.
const UPSTREAM_USAGE: &[(&str, &str)] = &[
    ("show", "usage: semq show [-h] [--json] [--limit LIMIT] file"),
    (
        "diff",
        "usage: semq diff [-h] [--floor FLOOR] [--per-row] [--json] [--limit LIMIT]\n                 reference candidate",
    ),
    (
        "floor",
        "usage: semq floor [-h] [--min-nulls MIN_NULLS] [--per-row]\n                  reference nulls [nulls ...]",
    ),
    ("version", "usage: semq version [-h] [--json]"),
];

/// What a failed parse prints and how it exits.
#[derive(Debug)]
pub struct Rendered {
    pub stdout: String,
    pub stderr: String,
    pub status: u8,
}

/// Python's `int(text)`: surrounding whitespace, an optional sign, decimal
/// digits with single underscores between them. Values beyond i64 saturate
/// (a limit that large means "everything" either way).
pub fn parse_python_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut value: i128 = 0;
    for c in digits.chars() {
        if c == '_' {
            continue;
        }
        let d = c.to_digit(10)?;
        value = (value * 10 + i128::from(d)).min(i128::from(i64::MAX) + 1);
    }
    let value = if negative { -value } else { value };
    Some(value.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
}

/// The subcommand argv names, as argparse sees it: the first argument that
/// is not an option.
fn subcommand(argv: &[String]) -> Option<&str> {
    argv.iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(String::as_str)
}

/// Renders a clap error as argparse would report the same mistake.
/// `commands` are the subcommand names in listing order; `sub_usage` gives
/// the usage line of a subcommand that is not an upstream one.
pub fn render(
    err: &clap::Error,
    argv: &[String],
    commands: &[&str],
    mut sub_usage: impl FnMut(&str) -> Option<String>,
) -> Rendered {
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        return Rendered {
            stdout: err.render().to_string(),
            stderr: String::new(),
            status: 0,
        };
    }
    let top_usage = format!("usage: semq [-h] {{{}}} ...", commands.join(","));
    let sub = subcommand(argv).filter(|s| commands.contains(s));
    let (usage, prog) = match sub {
        Some(name) => {
            let usage = UPSTREAM_USAGE
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, u)| u.to_string())
                .or_else(|| sub_usage(name))
                .unwrap_or_else(|| format!("usage: semq {name} [-h] ..."));
            (usage, format!("semq {name}"))
        }
        None => (top_usage, "semq".to_string()),
    };
    let message = message(err, commands);
    Rendered {
        stdout: String::new(),
        stderr: format!("{usage}\n{prog}: error: {message}\n"),
        status: 2,
    }
}

fn context_strings(err: &clap::Error, kind: ContextKind) -> Vec<String> {
    match err.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    }
}

/// `<NULLS>...` → `nulls`, `--limit <LIMIT>` → `--limit`: the names argparse
/// uses for arguments in messages.
fn argparse_name(clap_name: &str) -> String {
    let first = clap_name.split_whitespace().next().unwrap_or(clap_name);
    if first.starts_with('-') {
        first.to_string()
    } else {
        first
            .trim_end_matches("...")
            .trim_start_matches('<')
            .trim_end_matches('>')
            .to_lowercase()
    }
}

fn message(err: &clap::Error, commands: &[&str]) -> String {
    let invalid_args = context_strings(err, ContextKind::InvalidArg);
    match err.kind() {
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            "the following arguments are required: command".to_string()
        }
        ErrorKind::InvalidSubcommand => {
            let bad = context_strings(err, ContextKind::InvalidSubcommand);
            let choices: Vec<String> = commands.iter().map(|c| format!("'{c}'")).collect();
            format!(
                "argument command: invalid choice: '{}' (choose from {})",
                bad.first().map(String::as_str).unwrap_or(""),
                choices.join(", ")
            )
        }
        ErrorKind::MissingRequiredArgument => {
            let names: Vec<String> = invalid_args.iter().map(|a| argparse_name(a)).collect();
            format!("the following arguments are required: {}", names.join(", "))
        }
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let arg = invalid_args
                .first()
                .map(|a| argparse_name(a))
                .unwrap_or_default();
            let value = context_strings(err, ContextKind::InvalidValue)
                .into_iter()
                .next()
                .unwrap_or_default();
            if err.kind() == ErrorKind::ValueValidation {
                format!("argument {arg}: invalid int value: '{value}'")
            } else {
                let valid = context_strings(err, ContextKind::ValidValue);
                let choices: Vec<String> = valid.iter().map(|c| format!("'{c}'")).collect();
                format!(
                    "argument {arg}: invalid choice: '{value}' (choose from {})",
                    choices.join(", ")
                )
            }
        }
        ErrorKind::UnknownArgument | ErrorKind::TooManyValues => {
            let bad = context_strings(err, ContextKind::InvalidArg);
            format!("unrecognized arguments: {}", bad.join(" "))
        }
        ErrorKind::NoEquals | ErrorKind::InvalidUtf8 | ErrorKind::WrongNumberOfValues => {
            let arg = invalid_args
                .first()
                .map(|a| argparse_name(a))
                .unwrap_or_default();
            format!("argument {arg}: expected one argument")
        }
        _ => {
            // Other mistakes (conflicts, ...) keep clap's wording, on one line.
            let text = err
                .kind()
                .as_str()
                .unwrap_or("invalid arguments")
                .to_string();
            let detail: Vec<String> = invalid_args.iter().map(|a| argparse_name(a)).collect();
            if detail.is_empty() {
                text
            } else {
                format!("argument {}: {text}", detail.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_python_int as p;

    #[test]
    fn python_ints() {
        assert_eq!(p("3"), Some(3));
        assert_eq!(p(" 3 "), Some(3));
        assert_eq!(p("-1"), Some(-1));
        assert_eq!(p("+7"), Some(7));
        assert_eq!(p("1_000"), Some(1000));
        assert_eq!(p("99999999999999999999999"), Some(i64::MAX));
        assert_eq!(p("-99999999999999999999999"), Some(i64::MIN));
        for bad in ["x", "", " ", "1__0", "_1", "1_", "1.0", "--1", "0x10"] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
    }
}
