//! Standard output for commands: buffered, and never a panic when the
//! reader closes the pipe (`println!` would panic; these writes return an
//! error that [`crate::exit::finish`] turns into a quiet exit).

use std::io::{self, BufWriter, StdoutLock, Write};

/// A buffered handle on stdout; call [`Stdout::done`] to flush.
pub struct Stdout(BufWriter<StdoutLock<'static>>);

impl Stdout {
    pub fn new() -> Self {
        Stdout(BufWriter::with_capacity(1 << 16, io::stdout().lock()))
    }

    /// Flushes, reporting a closed pipe or a full disk as an error.
    pub fn done(mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Default for Stdout {
    fn default() -> Self {
        Self::new()
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Prints one `<file>: OK` or `<file>: <reason>` line per file, in the
/// order given; exit 2 when any file failed (`validate` of both tools).
pub fn print_verdicts(
    files: &[std::path::PathBuf],
    verdicts: Vec<Result<(), String>>,
) -> Result<u8, crate::exit::Failure> {
    let mut out = Stdout::new();
    let mut status = crate::exit::OK;
    for (path, verdict) in files.iter().zip(verdicts) {
        match verdict {
            Ok(()) => writeln!(out, "{}: OK", path.display())?,
            Err(reason) => {
                writeln!(out, "{}: {reason}", path.display())?;
                status = crate::exit::ERROR;
            }
        }
    }
    out.done()?;
    Ok(status)
}
