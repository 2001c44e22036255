//! The `semq` command line: one clap definition that the binary parses with
//! and from which the man pages and shell completions are generated.
//!
//! `show`, `diff`, `floor` and `version` keep the conventions of the
//! upstream `semq` command that scripts already rely on (argparse style:
//! prefixes of long options, `--opt=value`, Python integers for `--limit`,
//! argparse-shaped usage errors; see [`crate::argparse`]).

use clap::{Args, Parser, Subcommand, ValueEnum};
use qemfs_args::completions::CompletionsArgs;
use std::path::PathBuf;

const EXAMPLES: &str = "\
Examples:
  semq show model.semq --limit 5
  semq diff old.semq new.semq --json
  semq floor old.semq null1.semq null2.semq null3.semq > floor.json
  semq diff old.semq new.semq --floor floor.json     # exit 1 when the rebuild drifted
  semq encode --op quant --dim 384 --bins 4 --vectors v.npy --ids ids.txt out.semq
  semq hash *.semq > SUMS && semq hash --check SUMS
  semq diff s3://models/old.semq new.semq --floor floor.json
  semq show --no-sign-request s3://public-models/model.semq

Remote sources: a file may be an s3://BUCKET/KEY or http(s):// URL. S3
credentials and endpoint come the AWS way (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL_S3
or AWS_ENDPOINT_URL, AWS_PROFILE and ~/.aws/{credentials,config}), under
--endpoint-url, --region and --no-sign-request.

Outputs appear whole or not at all. A run stopped by Ctrl-C, kill or a
closed terminal removes its unfinished outputs, then ends with that
signal's status (130 for Ctrl-C). A run that cannot get the memory it
needs (ulimit -v, a container's or a scheduler's limit) names the file,
removes its unfinished outputs and exits 2.

Exit status: 0 ok / same / gate passed, 1 gate failed or files differ, 2 error.";

#[derive(Debug, Parser)]
#[command(
    name = "semq",
    version,
    about = "Inspect, compare, gate and encode .semq embedding states",
    after_help = EXAMPLES,
    infer_long_args = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub remote: qemfs_args::remote::RemoteArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print a file's config, digests, manifest and ids
    #[command(after_help = "Examples:
  semq show model.semq --limit 5
  semq show --json model.semq           # every id, whatever --limit says")]
    Show(ShowArgs),
    /// Compare a reference with a candidate; gate it against a floor
    #[command(after_help = "Examples:
  semq diff old.semq new.semq --json
  semq diff old.semq new.semq --floor floor.json     # exit 1 when the rebuild drifted
  semq diff old.semq new.semq --floor floor.json --per-row
  semq diff s3://models/old.semq new.semq --floor floor.json")]
    Diff(DiffArgs),
    /// Measure a floor from null rebuilds of the reference (prints JSON)
    #[command(after_help = "Examples:
  semq floor old.semq null1.semq null2.semq null3.semq > floor.json
  semq floor old.semq null*.semq --per-row > floor.json")]
    Floor(FloorArgs),
    /// Print version and build information
    #[command(after_help = "Examples:
  semq version
  semq version --json")]
    Version(VersionArgs),
    /// Check files completely (framing, sizes, ids, manifest, digests, rows)
    #[command(after_help = "Examples:
  semq validate *.semq")]
    Validate(ValidateArgs),
    /// Print state ids (or content digests) like sha256sum; verify a list
    #[command(after_help = "Examples:
  semq hash *.semq > SUMS && semq hash --check SUMS
  semq hash --content model.semq        # ids and rows only, not the config")]
    Hash(HashArgs),
    /// Encode float32 vectors into a new .semq file
    #[command(after_help = "Examples:
  semq encode --op quant --dim 384 --bins 4 --vectors v.npy --ids ids.txt out.semq
  semq encode --op phase --dim 384 --sectors 8 --vectors v.f32 --ids ids.npy out.semq
  semq encode --op orbit --dim 384 --vectors v.npy --ids ids.json --manifest model=e5 out.semq")]
    Encode(EncodeArgs),
    /// Export rows as .npy (symbols or vectors), .jsonl or packed .bin
    #[command(after_help = "Examples:
  semq convert model.semq symbols.npy
  semq convert model.semq vectors.npy --what vectors
  semq convert model.semq rows.jsonl")]
    Convert(ConvertArgs),
    /// Join files with disjoint ids into one
    #[command(after_help = "Examples:
  semq concat all.semq part1.semq part2.semq part3.semq")]
    Concat(ConcatArgs),
    /// Print a shell completion script
    #[command(after_help = "Examples:
  semq completions bash > /etc/bash_completion.d/semq")]
    Completions(CompletionsArgs),
}

/// `--limit`: any Python int, as the upstream command accepts.
fn python_int(text: &str) -> Result<i64, String> {
    crate::argparse::parse_python_int(text).ok_or_else(|| format!("invalid int value: '{text}'"))
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The .semq file
    pub file: PathBuf,
    /// Print one JSON object (complete: all ids, whatever --limit says)
    #[arg(long)]
    pub json: bool,
    /// How many ids to list
    #[arg(long, default_value = "20", value_parser = python_int, allow_negative_numbers = true)]
    pub limit: i64,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The reference .semq
    pub reference: PathBuf,
    /// The candidate .semq
    pub candidate: PathBuf,
    /// Gate the candidate against this floor (exit 1 when it is not within)
    #[arg(long, value_name = "FLOOR")]
    pub floor: Option<PathBuf>,
    /// With --floor: also reject any row changed by more than the floor's max_hamming
    #[arg(long)]
    pub per_row: bool,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
    /// How many ids to list per section
    #[arg(long, default_value = "20", value_parser = python_int, allow_negative_numbers = true)]
    pub limit: i64,
}

#[derive(Debug, Args)]
pub struct FloorArgs {
    /// The reference .semq
    pub reference: PathBuf,
    /// Null rebuilds: the same inputs encoded again
    #[arg(required = true)]
    pub nulls: Vec<PathBuf>,
    /// The fewest null rebuilds accepted
    #[arg(long, default_value = "3", value_parser = python_int, allow_negative_numbers = true)]
    pub min_nulls: i64,
    /// Also record the largest per-row hamming distance (for diff --per-row)
    #[arg(long)]
    pub per_row: bool,
}

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Files to check (in parallel)
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// Files to hash
    #[arg(required_unless_present = "check")]
    pub files: Vec<PathBuf>,
    /// Print the content digest (ids and rows) instead of the state id
    #[arg(long)]
    pub content: bool,
    /// Verify the `<hex>  <file>` lines of SUMS instead (- reads them from standard input)
    #[arg(long, value_name = "SUMS", conflicts_with = "files")]
    pub check: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    Quant,
    Phase,
    Orbit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdKind {
    U64,
    Utf8,
}

#[derive(Debug, Args)]
pub struct EncodeArgs {
    /// The operator
    #[arg(long)]
    pub op: Op,
    /// Vector dimension
    #[arg(long)]
    pub dim: u32,
    /// quant: bins per coordinate (2..64)
    #[arg(long, required_if_eq("op", "quant"))]
    pub bins: Option<u32>,
    /// phase: sectors per coordinate pair (2..256)
    #[arg(long, required_if_eq("op", "phase"))]
    pub sectors: Option<u32>,
    /// orbit: scale (1..2^30, default 50)
    #[arg(long)]
    pub scale: Option<u32>,
    /// float32 vectors: .npy [n, dim] or raw little-endian .f32
    #[arg(long)]
    pub vectors: PathBuf,
    /// Ids: .txt (one per line), .json (array of strings) or .npy (uint64)
    #[arg(long)]
    pub ids: PathBuf,
    /// Id kind (default: u64 for .npy ids, else utf8)
    #[arg(long, value_enum)]
    pub id_kind: Option<IdKind>,
    /// A manifest entry (repeatable)
    #[arg(long = "manifest", value_name = "KEY=VALUE")]
    pub manifest: Vec<String>,
    /// Manifest entries from a JSON object of strings
    #[arg(long, value_name = "M.json")]
    pub manifest_json: Option<PathBuf>,
    /// Replace OUT if it exists
    #[arg(long)]
    pub force: bool,
    /// The new .semq file
    pub out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum What {
    Symbols,
    Vectors,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The .semq file
    pub input: PathBuf,
    /// OUT.npy, OUT.jsonl or OUT.bin
    pub out: PathBuf,
    /// For .npy: the symbols (uint8 [n, units]) or the decoded vectors (float32 [n, dim])
    #[arg(long, value_enum, default_value = "symbols")]
    pub what: What,
    /// Replace OUT if it exists
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct ConcatArgs {
    /// The new .semq file
    pub out: PathBuf,
    /// Inputs with the same config and id kind and disjoint ids
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Replace OUT if it exists
    #[arg(long)]
    pub force: bool,
}

/// Parses `argv` (program name first); usage errors come back rendered as
/// argparse would print them, help and version as clap prints them.
pub fn parse(argv: &[String]) -> Result<Cli, crate::argparse::Rendered> {
    use clap::{CommandFactory, FromArgMatches};
    let mut command = Cli::command();
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let result = command
        .try_get_matches_from_mut(argv)
        .and_then(|m| Cli::from_arg_matches(&m));
    result.map_err(|err| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        crate::argparse::render(&err, argv, &names, |name| {
            let sub = command.find_subcommand_mut(name)?;
            let usage = sub.render_usage().to_string();
            Some(usage.replacen("Usage: ", "usage: semq ", 1))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        std::iter::once("semq")
            .chain(args.iter().copied())
            .map(String::from)
            .collect()
    }

    fn stderr_of(args: &[&str]) -> String {
        let rendered = parse(&argv(args)).unwrap_err();
        assert_eq!(rendered.status, 2);
        rendered.stderr
    }

    #[test]
    fn accepts_what_argparse_accepts() {
        let cli = parse(&argv(&["show", "f.semq", "--lim", " -3", "--js"])).unwrap();
        match cli.command {
            Command::Show(a) => assert_eq!((a.limit, a.json), (-3, true)),
            other => panic!("{other:?}"),
        }
        let cli = parse(&argv(&["diff", "--limit=2", "a", "b", "--floor", "f.json"])).unwrap();
        match cli.command {
            Command::Diff(a) => {
                assert_eq!(a.limit, 2);
                assert_eq!(a.floor.unwrap(), PathBuf::from("f.json"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usage_errors_read_like_argparse() {
        assert_eq!(
            stderr_of(&["show", "x.semq", "--limit", "x"]),
            "usage: semq show [-h] [--json] [--limit LIMIT] file\n\
             semq show: error: argument --limit: invalid int value: 'x'\n"
        );
        assert_eq!(
            stderr_of(&["floor", "ref.semq"]),
            "usage: semq floor [-h] [--min-nulls MIN_NULLS] [--per-row]\n                  \
             reference nulls [nulls ...]\n\
             semq floor: error: the following arguments are required: nulls\n"
        );
        let top = stderr_of(&[]);
        assert!(top.starts_with("usage: semq [-h] {show,diff,floor,version,validate,"));
        assert!(top.ends_with("semq: error: the following arguments are required: command\n"));
        assert!(stderr_of(&["bogus"]).contains(
            "semq: error: argument command: invalid choice: 'bogus' (choose from 'show', 'diff', 'floor', 'version', 'validate',"
        ));
    }
}
