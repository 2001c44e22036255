//! A run that cannot get the memory its work needs ends with an error
//! naming the files it was working on, exit status 2, after removing its
//! unfinished outputs.
//!
//! Rust's default on a failed allocation is to print "memory allocation of
//! N bytes failed" and abort (SIGABRT, status 134), leaving temporaries
//! behind. Files may declare shapes whose work does not fit (a detector of
//! 8000 × 8000 pixels needs about 1.3 GB, see `qem --help`), and a
//! process limited by `ulimit -v`, a container or a batch scheduler is
//! refused long before the machine is full. The binaries therefore
//! allocate through [`Refusing`], which takes a failed allocation itself
//! instead of returning it: it names the files registered with
//! [`working_on`], removes the unfinished outputs as an interrupted run
//! does, and ends the process.
//!
//! This includes allocations the standard library or a dependency would
//! have recovered from (`Vec::try_reserve`, as `std::fs::read` uses), which
//! otherwise end the same command with an error a moment later; nothing in
//! the commands relies on recovering from one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::Duration;

/// The system allocator, ending the run cleanly where it fails.
pub struct Refusing {
    /// Said after the error: what the work needs, where to read more.
    pub hint: &'static str,
}

// SAFETY: every call is passed to the system allocator unchanged; only a
// null result (a failure) is taken instead of returned.
unsafe impl GlobalAlloc for Refusing {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.checked(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.checked(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.checked(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
    }
}

impl Refusing {
    #[inline]
    fn checked(&self, ptr: *mut u8, size: usize) -> *mut u8 {
        if ptr.is_null() {
            self.refuse(size)
        }
        ptr
    }

    #[cold]
    #[inline(never)]
    fn refuse(&self, size: usize) -> ! {
        // The first thread to fail reports and ends the run; another one
        // failing meanwhile waits for that. The first failing again (in the
        // report itself, hardly: it asks for a few small blocks after a
        // large one was refused) aborts as Rust would have.
        static FIRST: AtomicI64 = AtomicI64::new(0);
        // SAFETY: no preconditions.
        let me = i64::from(unsafe { libc::gettid() });
        if let Err(first) = FIRST.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            if first == me {
                std::process::abort();
            }
            loop {
                // (sleep, not park: parking may allocate a thread handle)
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        // The failing thread may be inside a write by path or a change to
        // the list of temporaries: then it cannot take their locks, and
        // leaves the temporaries to the next run writing those outputs.
        let removed = qemfs::publish::try_remove_unpublished(Duration::from_secs(2));
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "error: ");
        let names = match WORKING.try_lock() {
            Ok(names) => Some(names),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        match names {
            Some(names) if !names.is_empty() => {
                for (i, name) in names.iter().enumerate() {
                    let _ = write!(err, "{}{}", if i > 0 { ", " } else { "" }, name.display());
                }
                let _ = write!(err, ": ");
            }
            _ => {}
        }
        let _ = write!(err, "out of memory: a further ");
        let _ = match size {
            0..1_000_000 => write!(err, "{size} bytes"),
            1_000_000..1_000_000_000 => write!(err, "{:.1} MB", size as f64 / 1e6),
            _ => write!(err, "{:.1} GB", size as f64 / 1e9),
        };
        let _ = writeln!(
            err,
            " could not be allocated{}; {}",
            self.hint,
            if removed.is_some() {
                "unfinished outputs were removed"
            } else {
                "an unfinished output may be left as a hidden temporary, which the next run writing it removes"
            }
        );
        // Straight out: exit handlers (the HDF5 library's among them) could
        // touch the temporaries just removed or wait on locks held here.
        // SAFETY: ends the process; nothing after it runs.
        unsafe { libc::_exit(crate::exit::ERROR.into()) }
    }
}

/// The files the run is working on now, named by an out-of-memory error.
static WORKING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers `path` as worked on until the returned guard is dropped.
pub fn working_on(path: &Path) -> Working {
    let path = path.to_path_buf();
    lock().push(path.clone());
    Working(path)
}

fn lock() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    WORKING.lock().unwrap_or_else(|e| e.into_inner())
}

/// A file being worked on (see [`working_on`]).
pub struct Working(PathBuf);

impl Drop for Working {
    fn drop(&mut self) {
        let mut names = lock();
        if let Some(i) = names.iter().position(|p| *p == self.0) {
            names.remove(i);
        }
    }
}
