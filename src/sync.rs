//! The locks of the parts whose interleavings are tested with `shuttle`
//! (randomised thread schedules, as mountpoint-s3 hunts its concurrency
//! bugs): the single-flight computation of derived files
//! (`tree::content::Lazy`) and the filesystem's tables
//! (`tree::filesystem`). Built with the `shuttle` feature (tests only),
//! they are shuttle's, whose scheduler can switch threads at every lock;
//! otherwise they are std's.
//!
//! Run those tests with
//! `cargo test --release -p qemfs --features shuttle --lib shuttle`.

#[cfg(feature = "shuttle")]
pub use shuttle::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex, MutexGuard,
};
#[cfg(not(feature = "shuttle"))]
pub use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex, MutexGuard,
};

/// Locks `m`. Every update under these locks is complete before the next
/// begins, so a lock poisoned by a panicking holder still guards
/// consistent state.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
