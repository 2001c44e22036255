//! Large buffers reused from one piece of a job to the next.
//!
//! A fresh buffer larger than malloc's mapping threshold (128 KiB and up)
//! comes from the kernel, which faults in and clears each of its pages as
//! it is first written, and returns them when it is freed. Where a job
//! fills buffers of about the same size again and again (a conversion's
//! encoded pieces, its stored Zarr objects) that was a tenth of its CPU
//! time; a buffer handed back and taken again costs nothing.
//!
//! The mount's decoded blocks are reused differently (`tree::qem_view`'s
//! recycler): they are shared with the cache and readers, so they are
//! reusable only once every holder has let go, which a pool of owned
//! buffers cannot see.

use std::sync::{Mutex, MutexGuard};

/// Buffers handed back for reuse, at most `bound` bytes of them (counted
/// by capacity).
pub(crate) struct Pool {
    kept: Mutex<Kept>,
    bound: usize,
}

#[derive(Default)]
struct Kept {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Pool {
    /// A pool that keeps at most `bound` bytes.
    pub fn new(bound: usize) -> Pool {
        Pool {
            kept: Mutex::new(Kept::default()),
            bound,
        }
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kept buffer with room for `capacity` bytes, as it was handed back.
    fn reuse(&self, capacity: usize) -> Option<Vec<u8>> {
        let mut kept = self.kept();
        let at = kept
            .buffers
            .iter()
            .rposition(|b| b.capacity() >= capacity)?;
        let buffer = kept.buffers.swap_remove(at);
        kept.bytes -= buffer.capacity();
        Some(buffer)
    }

    /// An empty buffer with room for `capacity` bytes.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        match self.reuse(capacity) {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// A buffer of `len` bytes whose contents are stale: for a caller that
    /// writes every byte. Only bytes no earlier use reached are zeroed.
    pub fn take_stale(&self, len: usize) -> Vec<u8> {
        let mut b = self.reuse(len).unwrap_or_default();
        b.resize(len, 0);
        b
    }

    /// Keeps `buffer` for a later `take`, or frees it when the pool holds
    /// its bound already.
    pub fn give(&self, buffer: Vec<u8>) {
        let mut kept = self.kept();
        if kept.bytes + buffer.capacity() <= self.bound {
            kept.bytes += buffer.capacity();
            kept.buffers.push(buffer);
        }
    }
}

/// A buffer that goes back to its pool when its last holder drops it: for
/// one buffer read by two jobs at once (a conversion's stored object and
/// its in-order digest).
pub(crate) struct Pooled {
    buffer: Vec<u8>,
    pool: std::sync::Arc<Pool>,
}

impl Pooled {
    pub fn new(buffer: Vec<u8>, pool: &std::sync::Arc<Pool>) -> Pooled {
        Pooled {
            buffer,
            pool: std::sync::Arc::clone(pool),
        }
    }
}

impl std::ops::Deref for Pooled {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_back_what_fits_within_the_bound() {
        let pool = Pool::new(3000);
        let big = vec![7u8; 2000];
        let at = big.as_ptr();
        pool.give(big);
        // Beyond the bound: freed, not kept.
        pool.give(vec![1u8; 1500]);
        pool.give(vec![2u8; 500]);
        // Too small for the request: a new buffer.
        let fresh = pool.take(2500);
        assert!(fresh.is_empty() && fresh.capacity() >= 2500);
        assert_ne!(fresh.as_ptr(), at);
        // The large one, emptied.
        let again = pool.take(1000);
        assert!(again.is_empty() && again.capacity() >= 2000);
        assert_eq!(again.as_ptr(), at);
        // Its bytes count no more: the next one is kept.
        pool.give(vec![3u8; 2400]);
        let stale = pool.take_stale(2400);
        assert_eq!(stale, vec![3u8; 2400], "contents as handed back");
        let grown = pool.take_stale(100);
        assert_eq!(grown, vec![2u8; 100], "the 500-byte one, cut to length");
        assert_eq!(pool.take_stale(10), vec![0u8; 10], "none left: zeroed");
    }
}
