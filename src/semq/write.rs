//! Writing an image: to a temporary sibling, fsync, then publish under the
//! final name without ever replacing an existing file (spec 5, DESIGN).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::encoding::Encoding;
use super::error::{Result, SemqError};

static COUNTER: AtomicU64 = AtomicU64::new(0);

impl Encoding {
    /// Writes the file image to `path`. Fails with an `Io` error of kind
    /// `AlreadyExists` when `path` exists; never leaves a partial file
    /// under `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_new_file(path.as_ref(), self.image())
    }
}

/// Publishes `bytes` as a new file at `path` atomically: the bytes go to
/// a temporary sibling (same directory, so same filesystem), are synced,
/// and the temporary is hard-linked to the final name, which fails rather
/// than replaces when the name exists; the temporary is then removed.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| SemqError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path has no file name",
        ))
    })?;
    let (tmp, mut file) = create_temp(&dir, &name.to_string_lossy()).map_err(io)?;
    let result = (|| -> io::Result<()> {
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::hard_link(&tmp, path)?;
        Ok(())
    })();
    // The temporary goes in every case: after a successful link the final
    // name holds the data, after a failure nothing was published.
    let removed = fs::remove_file(&tmp);
    result.map_err(io)?;
    removed.map_err(io)?;
    // Make the new directory entry durable too.
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn create_temp(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    loop {
        let k = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.{}.{k}.tmp", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}
