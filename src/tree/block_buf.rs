//! Buffers for decoded blocks, laid on huge-page boundaries.
//!
//! A decoded block is written whole, once, into a fresh buffer of tens of
//! MB. In 4 KiB pages its first write costs one page fault and one cleared
//! page per 4 KiB (a cold mount's reads of every Zarr chunk spent a fifth
//! of the daemon's CPU so); in transparent huge pages, one per 2 MiB. The
//! kernel backs only whole, aligned huge pages, and a heap allocation of
//! that size starts anywhere: the part of a block below its first 2 MiB
//! boundary and above its last stayed in small pages (about 2 MiB a block,
//! 13k faults when a 256 MiB cache first fills). So a large buffer here is
//! its own anonymous mapping, aligned to the huge-page size and a whole
//! number of huge pages long, advised to use them before its first byte is
//! touched. Its memory goes back to the system when it is dropped, and it
//! comes zeroed from the kernel, with no pass of our own to clear it.
//! Small buffers are ordinary vectors.

use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;

/// Bytes of one decoded block (or window of one), zeroed when made.
pub struct BlockBuf {
    store: Store,
    len: usize,
}

enum Store {
    Heap(Vec<u8>),
    Mapped(Mapping),
}

/// An anonymous private mapping this buffer owns alone.
struct Mapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by one `BlockBuf`; shared access is through
// `&[u8]` only, mutation through `&mut self`, as for a `Vec<u8>`.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is exactly the mapping made in
        // `Mapping::new`, and nothing borrows it once its owner is dropped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The size of a transparent huge page (2 MiB where the kernel does not
/// say).
pub(crate) fn huge_page_size() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&s| s.is_power_of_two() && s >= crate::mapguard::page_size())
            .unwrap_or(2 << 20)
    })
}

impl Mapping {
    /// `len` (a multiple of `align`, itself a multiple of the page size)
    /// zeroed bytes starting on a multiple of `align`; `None` where the
    /// system refuses the memory.
    fn new(len: usize, align: usize) -> Option<Mapping> {
        let total = len.checked_add(align)?;
        // SAFETY: a fresh anonymous mapping; no existing memory is named.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as usize;
        let start = base.next_multiple_of(align);
        // SAFETY: both ranges lie inside the mapping just made, on page
        // boundaries (base, start and len are multiples of the page size),
        // and hold nothing yet; what stays is `start..start + len`.
        unsafe {
            if start > base {
                libc::munmap(base as *mut libc::c_void, start - base);
            }
            let end = start + len;
            if base + total > end {
                libc::munmap(end as *mut libc::c_void, base + total - end);
            }
            // Only advice: where transparent huge pages are off, the
            // mapping is in small pages as any other.
            #[cfg(target_os = "linux")]
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(Mapping {
            ptr: std::ptr::NonNull::new(start as *mut u8)?,
            len,
        })
    }
}

impl BlockBuf {
    /// `len` zeroed bytes.
    pub fn zeroed(len: usize) -> BlockBuf {
        let huge = huge_page_size();
        let store = if len >= huge {
            let cap = len.next_multiple_of(huge);
            match Mapping::new(cap, huge) {
                Some(map) => Store::Mapped(map),
                // Refused (out of address space, or of mappings: a budget
                // of hundreds of GB in 2 MiB blocks nears vm.max_map_count):
                // the heap, in small pages, as before this type existed.
                None => Store::Heap(vec![0; len]),
            }
        } else {
            Store::Heap(vec![0; len])
        };
        BlockBuf { store, len }
    }

    /// The bytes this buffer can hold (what it costs in memory).
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Heap(v) => v.len(),
            Store::Mapped(m) => m.len,
        }
    }

    /// Whether this buffer serves for `len` bytes without hiding much more
    /// memory than a fresh one would take: a budget that weighs blocks by
    /// their capacity would otherwise count a small block in a large buffer
    /// as large.
    pub fn fits(&self, len: usize) -> bool {
        let fresh = if len >= huge_page_size() {
            len.next_multiple_of(huge_page_size())
        } else {
            len
        };
        (len..=fresh + len / 4).contains(&self.capacity())
    }

    /// Makes the buffer `len` bytes long (at most its capacity), keeping
    /// what its first `len` bytes held: a reused buffer is overwritten by
    /// its next decode, so its stale bytes are never cleared.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "a block buffer cannot grow");
        self.len = len;
    }
}

impl Deref for BlockBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.store {
            Store::Heap(v) => &v[..self.len],
            // SAFETY: `len` is at most the mapping's length (`set_len`),
            // and every byte of the mapping is initialised (zeroed by the
            // kernel, then only ever written as bytes).
            Store::Mapped(m) => unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), self.len) },
        }
    }
}

impl DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.store {
            Store::Heap(v) => &mut v[..self.len],
            // SAFETY: as in `deref`; `&mut self` makes the borrow unique.
            Store::Mapped(m) => unsafe { std::slice::from_raw_parts_mut(m.ptr.as_ptr(), self.len) },
        }
    }
}

impl AsRef<[u8]> for BlockBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_aligned_whole_huge_pages_and_zeroed() {
        let huge = huge_page_size();
        for len in [huge, huge + 1, 3 * huge - 4096, 8 * huge] {
            let mut b = BlockBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % huge, 0, "len {len}");
            assert_eq!(b.capacity(), len.next_multiple_of(huge));
            assert!(b.iter().all(|&x| x == 0));
            // Every byte, the last included, can be written and read back.
            b.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i % 251) as u8);
            assert!(b.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
        }
    }

    #[test]
    fn small_buffers_are_zeroed_vectors_of_their_length() {
        for len in [0, 1, 4096, huge_page_size() - 1] {
            let b = BlockBuf::zeroed(len);
            assert_eq!((b.len(), b.capacity()), (len, len));
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_buffer_shrinks_keeping_its_bytes_and_never_grows() {
        let huge = huge_page_size();
        let mut b = BlockBuf::zeroed(huge + 10);
        b[5] = 7;
        b.set_len(100);
        assert_eq!((b.len(), b[5]), (100, 7));
        // Back up to the capacity, which reaches past the length it was
        // made with.
        b.set_len(2 * huge);
        assert_eq!(b.len(), 2 * huge);
        let grown = std::panic::catch_unwind(move || b.set_len(2 * huge + 1));
        assert!(grown.is_err());
    }

    #[test]
    fn fits_allows_a_quarter_more_than_a_fresh_buffer() {
        let huge = huge_page_size();
        let b = BlockBuf::zeroed(8 * huge);
        assert!(b.fits(8 * huge));
        // A little smaller: the same number of huge pages.
        assert!(b.fits(8 * huge - 100));
        assert!(b.fits(7 * huge));
        // Far smaller: the buffer would hide memory from the budget.
        assert!(!b.fits(4 * huge));
        // Larger: it cannot hold it.
        assert!(!b.fits(8 * huge + 1));
        let small = BlockBuf::zeroed(1000);
        assert!(small.fits(900) && !small.fits(700) && !small.fits(1001));
    }
}
