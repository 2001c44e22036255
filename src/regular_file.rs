//! Opening inputs: regular files only.
//!
//! A path handed to a command, or found in a mounted folder, can name a
//! FIFO (a read blocks until some writer appears, possibly never), a
//! character device (`/dev/zero` never ends), a socket or a directory.
//! Every input of the library and the commands is opened here: with
//! `O_NONBLOCK`, so that opening a FIFO cannot block, then checked with
//! `fstat` on the opened descriptor (a check of the path would race with
//! a swap of the file), refused unless it is a regular file, and only
//! then switched back to blocking reads.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a file that is not a regular file is, in words.
fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn refused(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file; only regular files are read"),
    )
}

/// Opens `path` for reading if, once opened, it is a regular file.
///
/// The error says what the file is instead (FIFO, device, socket,
/// directory); callers add the path, as they do for every I/O error.
pub fn open(path: &Path) -> io::Result<File> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(file) => file,
        // open(2) of a socket fails with ENXIO ("No such device or
        // address"), which would send the user looking for hardware.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(match std::fs::metadata(path) {
                Ok(meta) if !meta.is_file() => refused(&format!("is {}", kind(&meta))),
                _ => e,
            })
        }
        // `-` names standard input to most tools; when no file of that
        // name exists, say why it is not read rather than "not found".
        Err(e) if e.kind() == io::ErrorKind::NotFound && path == Path::new("-") => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "standard input is not read here: this input is memory-mapped or \
                 read more than once, so it must be a regular file; give its path",
            ))
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(&format!("is {}", kind(&meta))));
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let cleared = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) >= 0
    };
    if !cleared {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// The whole content of the regular file at `path` (as [`std::fs::read`],
/// for small inputs: id lists, JSON documents, headers).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open(path)?;
    let len = file.metadata()?.len();
    // A hint only: the file may have shrunk; it is never trusted beyond
    // what read_to_end finds.
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0).min(1 << 30));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("pipe");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        path
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let e = open(&fifo(dir.path())).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn devices_directories_and_sockets_are_refused_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let e = open(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let e = open(dir.path()).unwrap_err();
        assert!(e.to_string().contains("directory"), "{e}");
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = open(&sock).unwrap_err();
        assert!(e.to_string().contains("socket"), "{e}");
    }

    #[test]
    fn a_regular_file_reads_normally_and_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"bytes").unwrap();
        let file = open(&path).unwrap();
        // SAFETY: fcntl on an open descriptor.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        assert_eq!(read(&path).unwrap(), b"bytes");
    }
}
