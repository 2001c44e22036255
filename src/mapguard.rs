//! Memory-mapped files that another process truncates must not kill us.
//!
//! Reading a page of a mapping past the new end of its file raises SIGBUS,
//! whose default action ends the process: one user truncating one file
//! would take down a whole mount. [`install`] sets a SIGBUS handler that,
//! for an address inside a registered mapping ([`Mapping`]), maps a page of
//! zeros over the faulting page, counts the event and lets the read go on;
//! any other SIGBUS keeps its default action. The reader then decodes
//! zeros, which is why callers compare [`faults`] before and after work on
//! a mapped file and report the file as changed when the count moved
//! (the `.qem` and `.semq` readers also check sizes and checksums, but a
//! verified block is not hashed twice).
//!
//! Each fault is also charged to its mapping ([`Mapping::faults`]), so a
//! reader of one file compares its own count and is not disturbed by
//! another file being truncated at the same time.
//!
//! A truncation to the middle of a page raises no fault for the bytes past
//! the new end inside that page: the kernel serves them as zeros. So a
//! mapping also holds its file's descriptor and [`Mapping::faults`] checks
//! its size (`fstat`, not the path, which may name another file by now):
//! a file shorter than its mapping counts as one fault more, charged once
//! to the global count as well ([`Mapping::changed`]).
//!
//! Registration uses a fixed table of atomics, the only state a signal
//! handler may touch; once the handler is installed, a mapping that finds
//! the table full is refused (an error for that file), never made
//! unguarded. The mount keeps far fewer open (`--open-containers`).

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

const SLOTS: usize = 4096;

/// `(start, length)` of registered mappings; start 0 = free slot.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENGTHS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static SLOT_FAULTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static FAULTS: AtomicU64 = AtomicU64::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static STRICT: AtomicBool = AtomicBool::new(false);

/// What callers report when [`faults`] moved during their work.
pub(crate) const CHANGED: &str =
    "the source file changed (truncated?) while it was read; reopen it";

/// The number of SIGBUS faults absorbed so far (in any mapping).
pub fn faults() -> u64 {
    FAULTS.load(Ordering::SeqCst)
}

/// The system's page size (4096 where it cannot be asked).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096)
}

/// Installs the handler (once per process). The mount daemon calls this at
/// start-up; the `qem` and `semq` commands call [`install_strict`].
pub fn install() {
    INSTALL.call_once(|| {
        PAGE.store(page_size(), Ordering::SeqCst);
        // SAFETY: sigaction gets a zeroed, fully initialised struct and a
        // handler with the SA_SIGINFO signature.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
        raise_open_file_limit();
    });
}

/// Raises the soft limit of open descriptors to the hard limit: each
/// mapping holds its file's descriptor (see [`Mapping::changed`]), and the
/// mount keeps up to `--open-containers` of them open, more than the
/// customary soft limit of 1024 allows next to FUSE and source files.
fn raise_open_file_limit() {
    // SAFETY: getrlimit/setrlimit read and write a plain struct we own.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            // Only an attempt: at the old limit a mapping past it fails to
            // open with EMFILE, an error for that file.
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// [`install`], and from now on refuse to publish any output file
/// ([`crate::publish::AtomicFile`]) once a fault was absorbed while it was
/// written: for one-shot commands, whose outputs derive from their mapped
/// inputs. (A long-running server, whose outputs need not derive from a
/// file that changed, calls [`install`] alone.)
pub fn install_strict() {
    install();
    STRICT.store(true, Ordering::SeqCst);
}

/// Whether [`install_strict`] was called.
pub fn strict() -> bool {
    STRICT.load(Ordering::SeqCst)
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let inside = (0..SLOTS).find(|&i| {
        let start = STARTS[i].load(Ordering::SeqCst);
        start != 0 && addr >= start && addr - start < LENGTHS[i].load(Ordering::SeqCst)
    });
    // SAFETY: mmap and signal are plain system calls (async-signal-safe on
    // Linux). MAP_FIXED replaces exactly one page of a mapping we own
    // and that stays registered until it is unmapped.
    unsafe {
        if let Some(slot) = inside {
            let page = PAGE.load(Ordering::SeqCst);
            let at = addr & !(page - 1);
            let zeros = libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if zeros != libc::MAP_FAILED {
                SLOT_FAULTS[slot].fetch_add(1, Ordering::SeqCst);
                FAULTS.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        // Not ours (or unfixable): the default action on the retried access.
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

/// A read-only memory map registered with the guard for its lifetime.
///
/// [`Mapping::map`] is the only way to map a file in this crate and its
/// binaries: a mapping made any other way would not be guarded, and a
/// truncation of its file would kill the process.
pub struct Mapping {
    slot: Option<usize>,
    map: memmap2::Mmap,
    /// The mapped file (a duplicate descriptor), to check its size.
    file: std::fs::File,
    /// Set once the file was found shorter than the mapping.
    shrunk: AtomicBool,
}

impl Mapping {
    /// Maps `file` read-only and registers the mapping. Open the file with
    /// [`crate::regular_file::open`]: other kinds of file either cannot be
    /// mapped or never end.
    pub fn map(file: &std::fs::File) -> std::io::Result<Self> {
        // SAFETY: the map is read-only and only ever read through slices.
        // A truncation by another process while it is mapped faults on
        // access, which the handler (once installed) absorbs and charges
        // to this mapping; readers compare [`Mapping::faults`].
        let map = unsafe { memmap2::Mmap::map(file)? };
        let mapping = Self::register(map, file.try_clone()?);
        if mapping.slot.is_none() && !mapping.map.is_empty() && INSTALL.is_completed() {
            // An unguarded mapping would let one truncation end the
            // process; refusing it makes this one file fail instead.
            return Err(std::io::Error::other(format!(
                "more than {SLOTS} files mapped at once; close some (qemfs mount: \
                 lower --open-containers)"
            )));
        }
        Ok(mapping)
    }

    /// Asks the kernel to read the whole file in ahead (`MADV_WILLNEED`),
    /// for a file about to be read whole. Call it only once what the
    /// file's header declares has been checked against its size: a
    /// hostile multi-gigabyte file should be refused after reading a page,
    /// not after reading all of it.
    pub fn will_need(&self) {
        // Only a hint; a failure changes nothing.
        let _ = self.map.advise(memmap2::Advice::WillNeed);
    }

    /// Drops this process's page-table entries for the whole mapping
    /// (`MADV_DONTNEED`): the file's pages stay in the page cache, and the
    /// next read of any of them maps it again with a minor fault. A
    /// long-lived reader calls it after each piece of work, so that its
    /// resident memory does not grow with the share of its files it has
    /// ever read (a daemon reading three 100 MB files whole showed 200 MiB
    /// of them resident beside its cache).
    pub fn release_pages(&self) {
        if self.map.is_empty() {
            return;
        }
        // SAFETY: the mapping is a read-only shared file mapping: dropping
        // its page-table entries frees no memory that a reference points
        // into (the range stays mapped) and changes no byte a later read
        // sees; only the pages' residency in this process. Only a hint; a
        // failure changes nothing.
        let _ = unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }

    fn register(map: memmap2::Mmap, file: std::fs::File) -> Self {
        let (start, len) = (map.as_ptr() as usize, map.len());
        let slot = (start != 0 && len != 0)
            .then(|| {
                // Reserve a free slot (usize::MAX matches no address), set
                // its length, then publish the start.
                let i = (0..SLOTS).find(|&i| {
                    STARTS[i]
                        .compare_exchange(0, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                })?;
                LENGTHS[i].store(len, Ordering::SeqCst);
                SLOT_FAULTS[i].store(0, Ordering::SeqCst);
                STARTS[i].store(start, Ordering::SeqCst);
                Some(i)
            })
            .flatten();
        Mapping {
            slot,
            map,
            file,
            shrunk: AtomicBool::new(false),
        }
    }

    /// Faults absorbed in this mapping so far (0 when it could not be
    /// registered: such a mapping is not guarded at all), plus one once
    /// the file is found shorter than the mapping ([`Mapping::shrunk`]).
    pub fn faults(&self) -> u64 {
        let absorbed = self
            .slot
            .map_or(0, |i| SLOT_FAULTS[i].load(Ordering::SeqCst));
        absorbed + u64::from(self.shrunk())
    }

    /// Whether the file is now shorter than the mapping: bytes past its
    /// new end inside the last page read as zeros without a fault. Checked
    /// on the held descriptor; the first time it is found, the global
    /// [`faults`] count moves too, so that strict commands publish nothing.
    pub fn shrunk(&self) -> bool {
        if self.shrunk.load(Ordering::SeqCst) {
            return true;
        }
        let shorter = self
            .file
            .metadata()
            .is_ok_and(|m| m.len() < self.map.len() as u64);
        if shorter && !self.shrunk.swap(true, Ordering::SeqCst) {
            FAULTS.fetch_add(1, Ordering::SeqCst);
        }
        shorter
    }

    /// Whether the file changed under this mapping since it was mapped: a
    /// page faulted (and reads as zeros now, whatever the file holds) or
    /// the file is shorter. Nothing read from a changed mapping is served.
    pub fn changed(&self) -> bool {
        self.faults() != 0
    }
}

impl Deref for Mapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unregister before the map is unmapped (fields drop after this).
        if let Some(i) = self.slot {
            STARTS[i].store(0, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_truncated_mapping_reads_zeros_instead_of_killing_the_process() {
        install();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let page = PAGE.load(Ordering::SeqCst);
        file.write_all(&vec![7u8; 4 * page]).unwrap();
        file.flush().unwrap();
        let map = Mapping::map(file.as_file()).unwrap();
        assert_eq!(map[3 * page], 7);
        file.as_file().set_len(page as u64).unwrap();
        let before = faults();
        let other = Mapping::map(file.as_file()).unwrap();
        let tail: u64 = map[2 * page..].iter().map(|&b| u64::from(b)).sum();
        assert_eq!(tail, 0);
        assert!(faults() > before);
        assert!(map.faults() > 0, "charged to the mapping that faulted");
        assert_eq!(other.faults(), 0, "and to no other");
        assert_eq!(map[0], 7);
    }

    #[test]
    fn a_mapping_truncated_inside_its_last_page_is_changed_without_a_fault() {
        install();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let page = PAGE.load(Ordering::SeqCst);
        file.write_all(&vec![7u8; 2 * page]).unwrap();
        file.flush().unwrap();
        let map = Mapping::map(file.as_file()).unwrap();
        assert!(!map.changed());
        let before = faults();
        file.as_file().set_len((page + page / 2) as u64).unwrap();
        // The tail of the last page reads as zeros, and nothing faults.
        assert_eq!(map[2 * page - 1], 0);
        assert_eq!(
            map.slot.map(|i| SLOT_FAULTS[i].load(Ordering::SeqCst)),
            Some(0)
        );
        assert!(
            map.shrunk() && map.changed(),
            "found shorter on its descriptor"
        );
        assert!(faults() > before, "charged to the global count");
        let once = faults();
        assert!(map.changed());
        assert_eq!(faults(), once, "once");
    }
}
