//! Exit statuses and the one way errors reach the user.
//!
//! The contract for scripts: 0 = ok / same / gate passed, 1 = differences /
//! gate failed, 2 = invalid input or any error. Diagnostics go to stderr as
//! `error: <file>: <reason>`.

use std::fmt;
use std::io;
use std::path::Path;
use std::process::ExitCode;

/// 0: ok, same, gate passed.
pub const OK: u8 = 0;
/// 1: differences found, gate failed.
pub const DIFFERENT: u8 = 1;
/// 2: invalid input or an error.
pub const ERROR: u8 = 2;

/// An error to report on stderr, with the exit status it ends the run with.
#[derive(Debug)]
pub struct Failure {
    pub status: u8,
    pub message: String,
    /// The reader of our stdout went away (e.g. `| head`): not an error for
    /// the user, who has what they wanted.
    pub closed_pipe: bool,
}

impl Failure {
    /// `error: <file>: <reason>`, exit 2.
    pub fn file(path: impl AsRef<Path>, reason: impl fmt::Display) -> Self {
        Failure {
            status: ERROR,
            message: format!("{}: {reason}", path.as_ref().display()),
            closed_pipe: false,
        }
    }

    /// `error: <reason>`, exit 2.
    pub fn plain(reason: impl fmt::Display) -> Self {
        Failure {
            status: ERROR,
            message: reason.to_string(),
            closed_pipe: false,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl From<io::Error> for Failure {
    /// Errors writing to stdout; a closed pipe is marked so that [`finish`]
    /// ends quietly.
    fn from(e: io::Error) -> Self {
        Failure {
            status: ERROR,
            message: format!("writing output: {e}"),
            closed_pipe: e.kind() == io::ErrorKind::BrokenPipe,
        }
    }
}

/// Turns a command's outcome into the process exit status, printing the
/// error on stderr.
pub fn finish(result: Result<u8, Failure>) -> ExitCode {
    match result {
        // Some mapped input changed under us and parts of it read as
        // zeros: whatever was printed cannot be trusted.
        Ok(_) if qemfs::mapguard::faults() > 0 => {
            eprintln!("error: an input file changed (truncated?) while it was read; the output above is not trustworthy: run again on a stable copy");
            ExitCode::from(ERROR)
        }
        Ok(status) => ExitCode::from(status),
        Err(e) if e.closed_pipe => ExitCode::from(OK),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.status)
        }
    }
}
