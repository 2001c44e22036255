//! The bounded prefetcher: the block after the one a sequential reader is
//! on is decoded in the background by a small fixed set of threads for the
//! whole process, fed by a short queue. A request that finds the queue
//! full is dropped (the reader decodes that block itself when it gets
//! there), so a burst of readers never starts more than
//! [`THREADS`] + [`QUEUED`] prefetches, where one thread per request used
//! to be started without bound.
//!
//! A prefetch sets its block's bytes aside in the budget before it is
//! queued (see [`Budget::reserve`]), evicting to make room, and gives them
//! back once the block is cached, so prefetched memory is part of the
//! budget. Prefetches together hold at most [`SHARE`] of it; blocks larger
//! than that are never prefetched.
//!
//! The threads are a [`Workers`] pool with a bounded queue (plain
//! threads, not rayon tasks: see there).

use std::sync::{Arc, OnceLock};

use super::Budget;
use crate::workers::{Job, Workers};

/// Threads decoding prefetched blocks.
pub const THREADS: usize = 2;
/// Requests waiting for a thread.
pub const QUEUED: usize = 4;
/// The part of the budget prefetches may hold, in 1/1024ths (a quarter).
pub const SHARE: usize = 256;

/// The queue in front of the threads.
pub struct Prefetcher {
    workers: Workers,
}

impl Prefetcher {
    /// Starts `threads` threads behind a queue of `queued` requests; `None`
    /// when no thread could be started (nothing is prefetched then).
    pub fn new(threads: usize, queued: usize) -> Option<Prefetcher> {
        let workers = Workers::new("qemfs-prefetch", threads, Some(queued)).ok()?;
        Some(Prefetcher { workers })
    }

    /// Queues `job`, which will load about `bytes` into `budget`, if the
    /// queue has room and the budget's prefetch share can hold it.
    /// Returns whether it was queued.
    pub fn submit(
        &self,
        budget: &Arc<Budget>,
        bytes: usize,
        job: impl FnOnce() + Send + 'static,
    ) -> bool {
        if !budget.reserve(bytes, SHARE) {
            return false;
        }
        let held = Reserved {
            budget: Arc::clone(budget),
            bytes,
        };
        let job: Job = Box::new(move || {
            job();
            drop(held);
        });
        // A refused job (and its reservation) is dropped unrun.
        self.workers.try_run(job).is_ok()
    }
}

/// Bytes set aside in a budget until the prefetch is done (or dropped).
struct Reserved {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.unreserve(self.bytes);
    }
}

/// Queues a prefetch on the process's prefetcher (started on first use).
pub fn submit(budget: &Arc<Budget>, bytes: usize, job: impl FnOnce() + Send + 'static) -> bool {
    static PREFETCHER: OnceLock<Option<Prefetcher>> = OnceLock::new();
    PREFETCHER
        .get_or_init(|| Prefetcher::new(THREADS, QUEUED))
        .as_ref()
        .is_some_and(|p| p.submit(budget, bytes, job))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    /// A burst of requests starts at most threads + queue of them; the
    /// rest are dropped, and what is accepted is reserved in the budget.
    #[test]
    fn a_burst_of_requests_is_bounded_and_reserved() {
        let prefetcher = Prefetcher::new(2, 3).unwrap();
        let budget = Arc::new(Budget::new(1 << 20));
        let started = Arc::new(AtomicUsize::new(0));
        // The two threads stop at this barrier with the test.
        let gate = Arc::new(Barrier::new(3));
        let mut accepted = 0;
        for _ in 0..50 {
            let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
            accepted += usize::from(prefetcher.submit(&budget, 1000, move || {
                if started.fetch_add(1, Ordering::SeqCst) < 2 {
                    gate.wait();
                }
            }));
            // Let a thread take a job off the queue before the next.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(accepted <= 2 + 3, "{accepted} prefetches accepted");
        assert!(accepted >= 3, "the queue holds at least 3");
        assert_eq!(budget.stats().reserved, accepted * 1000);
        gate.wait();
        drop(prefetcher);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while budget.stats().reserved > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(budget.stats().reserved, 0, "every reservation given back");
        assert_eq!(started.load(Ordering::SeqCst), accepted);
    }

    /// A block larger than the prefetch share of the budget is never
    /// prefetched: it would push out the block being read.
    #[test]
    fn blocks_beyond_the_share_are_not_prefetched() {
        let prefetcher = Prefetcher::new(1, 4).unwrap();
        let budget = Arc::new(Budget::new(4096));
        assert!(!prefetcher.submit(&budget, 1025, || {}));
        assert_eq!(budget.stats().reserved, 0);
    }
}
