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
//! number of huge pages long (inside a mapping one huge page longer),
//! advised to use them before its first byte is touched. Its memory goes back to the system when it is dropped, and it
//! comes zeroed from the kernel, with no pass of our own to clear it.
//! Small buffers are ordinary vectors.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use memmap2::MmapMut;

/// Bytes of one decoded block (or window of one), zeroed when made.
pub struct BlockBuf {
    store: Store,
    len: usize,
    /// Bytes handed to readers since it last took a decode (see
    /// [`BlockBuf::serve`]).
    served: AtomicU64,
}

enum Store {
    Heap(Vec<u8>),
    /// An anonymous mapping one huge page longer than `cap`, used from
    /// `offset` (the first huge-page boundary in it) on: the parts before
    /// and after are never touched, so they take no memory.
    Mapped {
        map: MmapMut,
        offset: usize,
        cap: usize,
    },
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

/// What a fresh buffer of `len` bytes holds: whole huge pages from one
/// huge page on, else exactly `len`.
fn capacity_for(len: usize) -> usize {
    let huge = huge_page_size();
    if len >= huge {
        len.next_multiple_of(huge)
    } else {
        len
    }
}

/// `cap` zeroed bytes (a multiple of the huge-page size) starting on a
/// huge-page boundary, advised to use huge pages; `None` where the system
/// refuses the memory.
fn mapped(cap: usize) -> Option<Store> {
    let huge = huge_page_size();
    let map = MmapMut::map_anon(cap.checked_add(huge)?).ok()?;
    let offset = (map.as_ptr() as usize).next_multiple_of(huge) - map.as_ptr() as usize;
    // Only advice: where transparent huge pages are off, the mapping is in
    // small pages as any other. Over the whole mapping, so that it stays
    // one mapping (the untouched ends hold no whole aligned huge page).
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Some(Store::Mapped { map, offset, cap })
}

impl BlockBuf {
    /// `len` zeroed bytes; `None` where the system refuses the memory (a
    /// limit on the daemon's address space, `ulimit -v`), which fails the
    /// one read that needed it instead of the whole mount.
    pub fn zeroed(len: usize) -> Option<BlockBuf> {
        let store = match (len >= huge_page_size())
            .then(|| mapped(capacity_for(len)))
            .flatten()
        {
            Some(store) => store,
            // Small, or refused (out of address space, or of mappings: a
            // budget of hundreds of GB in 2 MiB blocks nears
            // vm.max_map_count): the heap, in small pages.
            None => {
                let mut v = Vec::new();
                v.try_reserve_exact(len).ok()?;
                v.resize(len, 0);
                Store::Heap(v)
            }
        };
        Some(BlockBuf {
            store,
            len,
            served: AtomicU64::new(0),
        })
    }

    /// The bytes this buffer can hold (what it costs in memory).
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Heap(v) => v.len(),
            Store::Mapped { cap, .. } => *cap,
        }
    }

    /// Whether this buffer serves for `len` bytes without hiding much more
    /// memory than a fresh one would take: a budget that weighs blocks by
    /// their capacity would otherwise count a small block in a large buffer
    /// as large.
    pub fn fits(&self, len: usize) -> bool {
        (len..=capacity_for(len) + len / 4).contains(&self.capacity())
    }

    /// Makes the buffer `len` bytes long (at most its capacity), keeping
    /// what its first `len` bytes held: a reused buffer is overwritten by
    /// its next decode, so its stale bytes are never cleared. Its count of
    /// bytes served starts again.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "a block buffer cannot grow");
        self.len = len;
        *self.served.get_mut() = 0;
    }

    /// Counts `n` more of its bytes handed to a reader and says whether
    /// as many as it holds have now been, since it was made, last resized
    /// for a decode or last said so: a reader going through it once has
    /// had them all (a byte read twice counts twice). The count then
    /// starts again, so that a window evicted on this answer and taken
    /// back by a later reader is let go again only once that reader has
    /// been through it too, not at its first read.
    pub fn serve(&self, n: usize) -> bool {
        let len = self.len as u64;
        let mut through = false;
        let _ = self
            .served
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |before| {
                let now = before.saturating_add(n as u64);
                through = now >= len;
                Some(if through { 0 } else { now })
            });
        through
    }
}

impl Deref for BlockBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.store {
            Store::Heap(v) => &v[..self.len],
            Store::Mapped { map, offset, .. } => &map[*offset..*offset + self.len],
        }
    }
}

impl DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.store {
            Store::Heap(v) => &mut v[..self.len],
            Store::Mapped { map, offset, .. } => &mut map[*offset..*offset + self.len],
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
            let mut b = BlockBuf::zeroed(len).unwrap();
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
    fn memory_the_system_refuses_is_none() {
        // More than any address space holds: both the mapping and the heap
        // refuse it.
        assert!(BlockBuf::zeroed(usize::MAX / 2).is_none());
        assert!(BlockBuf::zeroed(isize::MAX as usize - 4096).is_none());
    }

    #[test]
    fn small_buffers_are_zeroed_vectors_of_their_length() {
        for len in [0, 1, 4096, huge_page_size() - 1] {
            let b = BlockBuf::zeroed(len).unwrap();
            assert_eq!((b.len(), b.capacity()), (len, len));
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn a_buffer_shrinks_keeping_its_bytes_and_never_grows() {
        let huge = huge_page_size();
        let mut b = BlockBuf::zeroed(huge + 10).unwrap();
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
    fn serving_every_byte_is_counted_again_after_each_time_through() {
        let mut b = BlockBuf::zeroed(1000).unwrap();
        assert!(!b.serve(400));
        assert!(!b.serve(599));
        assert!(b.serve(1));
        // Taken back by another reader: counted again from nothing.
        assert!(!b.serve(10));
        assert!(b.serve(990));
        // Reused for another window: counted afresh, against its new length.
        b.set_len(500);
        assert!(!b.serve(499));
        assert!(b.serve(1));
    }

    #[test]
    fn fits_allows_a_quarter_more_than_a_fresh_buffer() {
        let huge = huge_page_size();
        let b = BlockBuf::zeroed(8 * huge).unwrap();
        assert!(b.fits(8 * huge));
        // A little smaller: the same number of huge pages.
        assert!(b.fits(8 * huge - 100));
        assert!(b.fits(7 * huge));
        // Far smaller: the buffer would hide memory from the budget.
        assert!(!b.fits(4 * huge));
        // Larger: it cannot hold it.
        assert!(!b.fits(8 * huge + 1));
        let small = BlockBuf::zeroed(1000).unwrap();
        assert!(small.fits(900) && !small.fits(700) && !small.fits(1001));
    }
}
