//! The digest lists of `qem hash` and `semq hash`: one `<hex>  <file>` line
//! per file, as `sha256sum` prints them, so that `sha256sum -c` style
//! checks (`semq hash --check`) read them back.

use std::io::{self, Write};
use std::path::Path;

/// Writes `<hex>  <file>` to `out` for each file whose digest was found,
/// in the order given, and `error: <file>: <reason>` to `err` for each that
/// was not (`out` is flushed first, so that the two streams interleave as
/// the files are listed). Returns whether every digest was found.
pub fn write_sums<'a>(
    out: &mut impl Write,
    err: &mut impl Write,
    sums: impl IntoIterator<Item = (&'a Path, Result<String, String>)>,
) -> io::Result<bool> {
    let mut all = true;
    for (path, digest) in sums {
        match digest {
            Ok(hex) => writeln!(out, "{hex}  {}", path.display())?,
            Err(reason) => {
                out.flush()?;
                writeln!(err, "error: {}: {reason}", path.display())?;
                all = false;
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_digests_go_to_out_and_failures_to_err_in_order() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let sums = [
            (Path::new("a.qem"), Ok("ab".repeat(32))),
            (Path::new("b.qem"), Err("not a .qem file".to_string())),
        ];
        assert!(!write_sums(&mut out, &mut err, sums).unwrap());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{}  a.qem\n", "ab".repeat(32))
        );
        assert_eq!(
            String::from_utf8(err).unwrap(),
            "error: b.qem: not a .qem file\n"
        );
    }
}
