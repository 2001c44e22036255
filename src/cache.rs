//! The byte-bounded LRU behind a tree's budget (`tree::budget`): decoded
//! blocks and derived values, shared by every reader of a mount (or of one
//! CLI run).
//!
//! Loads are single-flight: when several threads ask for the same missing
//! key at once, one of them loads it and the others wait for that result, so
//! a block is never decoded twice at the same time. Different keys load in
//! parallel; the lock is never held while loading.
//!
//! A value evicted while something else still holds it (a reader lent its
//! bytes, a buffer list that may reuse it) is remembered weakly: asked for
//! again while it is still alive, it is taken back instead of loaded
//! again. Readers of one Zarr chunk (its 1 MiB requests answered in turn,
//! beside other readers' decodes) otherwise decoded a block once for each
//! request that came after its eviction under a small budget.
//!
//! Waiting for another caller's load blocks the thread, so callers must not
//! be rayon workers when the load itself uses rayon: a worker blocked in a
//! join can be handed the waiting task and deadlock. Call from plain threads.

use lru::LruCache;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// A value's size in bytes as far as the budget is concerned.
pub trait Weighted {
    fn weight(&self) -> usize;
}

impl<T> Weighted for Vec<T> {
    fn weight(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
}

impl Weighted for [u8] {
    fn weight(&self) -> usize {
        self.len()
    }
}

type Slot<V, E> = Arc<OnceLock<Result<Arc<V>, E>>>;

/// Values taken out of the cache under its lock, to be dropped after it.
type Evicted<V> = Vec<Arc<V>>;

struct State<K: Hash + Eq, V: ?Sized, E> {
    lru: LruCache<K, Arc<V>>,
    bytes: usize,
    /// Bytes promised to loads under way (see `reserve`), counted against
    /// the budget before their values arrive.
    reserved: usize,
    /// Loads under way; each waiter blocks on the slot's `OnceLock`.
    loading: HashMap<K, Slot<V, E>>,
    /// Values evicted while held elsewhere, until they are taken back or
    /// their last holder lets them go (dead ones are pruned as it grows).
    evicted_alive: HashMap<K, Weak<V>>,
}

/// Counters for the mount's `user.qemfs.cache` attribute and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered without a load: with a held value, or one taken
    /// back after its eviction while still in memory.
    pub hits: u64,
    /// Lookups that found none: each loads the value, or waits for the
    /// load of it already under way.
    pub misses: u64,
    /// Values loaded (blocks decoded, products computed): more than the
    /// keys ever asked for when values are evicted and asked for again.
    pub loads: u64,
    pub evictions: u64,
    pub entries: usize,
    pub bytes: usize,
    pub reserved: usize,
    pub budget: usize,
}

/// An LRU of `Arc<V>` keyed by `K`, holding at most `budget` bytes.
pub struct BlockCache<K: Hash + Eq, V: ?Sized, E> {
    budget: usize,
    state: Mutex<State<K, V, E>>,
    /// Signalled when a reservation is given back.
    room: Condvar,
    hits: AtomicU64,
    misses: AtomicU64,
    loads: AtomicU64,
    evictions: AtomicU64,
}

impl<K, V, E> BlockCache<K, V, E>
where
    K: Hash + Eq + Clone,
    V: Weighted + ?Sized,
    E: Clone,
{
    /// A cache that keeps at most `budget` bytes of values. A value larger
    /// than the whole budget is handed to its caller but not kept.
    pub fn new(budget: usize) -> Self {
        BlockCache {
            budget,
            state: Mutex::new(State {
                lru: LruCache::unbounded(),
                bytes: 0,
                reserved: 0,
                loading: HashMap::new(),
                evicted_alive: HashMap::new(),
            }),
            room: Condvar::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The cached value for `key`, or the result of `load` (run once for all
    /// concurrent callers of the same key). Errors are returned to every
    /// waiter of that load and are not cached, so a later call retries.
    pub fn get_or_load<F>(&self, key: &K, load: F) -> Result<Arc<V>, E>
    where
        F: FnOnce() -> Result<Arc<V>, E>,
    {
        let slot = {
            let mut state = self.lock();
            if let Some(value) = state.lru.get(key) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Arc::clone(value));
            }
            if let Some(value) = state.evicted_alive.remove(key).and_then(|w| w.upgrade()) {
                // Still in memory: kept again, at the head of the LRU.
                self.hits.fetch_add(1, Ordering::Relaxed);
                let evicted = self.insert_locked(&mut state, key.clone(), Arc::clone(&value));
                drop(state);
                drop(evicted);
                return Ok(value);
            }
            self.misses.fetch_add(1, Ordering::Relaxed);
            Arc::clone(
                state
                    .loading
                    .entry(key.clone())
                    .or_insert_with(|| Arc::new(OnceLock::new())),
            )
        };
        let result = slot
            .get_or_init(|| {
                self.loads.fetch_add(1, Ordering::Relaxed);
                load()
            })
            .clone();
        let mut state = self.lock();
        let mut evicted = Evicted::new();
        // Whoever gets here first retires the slot and publishes the value,
        // under the same lock that lookups take, so no later caller can miss
        // both the slot and the cached value.
        if state
            .loading
            .get(key)
            .is_some_and(|s| Arc::ptr_eq(s, &slot))
        {
            state.loading.remove(key);
            if let Ok(value) = &result {
                evicted = self.insert_locked(&mut state, key.clone(), Arc::clone(value));
            }
        }
        drop(state);
        drop(evicted);
        result
    }

    /// Keeps `value` under `key` (when it fits the budget), evicting the
    /// least recently used: for values computed under their own
    /// single-flight lock (`tree::content::Lazy`).
    pub fn insert(&self, key: K, value: Arc<V>) {
        let evicted = self.insert_locked(&mut self.lock(), key, value);
        drop(evicted);
    }

    /// Sets `bytes` of the budget aside for a value about to be loaded (a
    /// prefetched block), evicting the least recently used to make room,
    /// unless what is already set aside and `bytes` would exceed
    /// `share` of the budget (in 1/1024ths): then nothing is reserved and
    /// `false` returned. Give it back with [`BlockCache::unreserve`].
    pub fn reserve(&self, bytes: usize, share: usize) -> bool {
        self.reserve_within(bytes, share, Duration::ZERO)
    }

    /// As [`reserve`](Self::reserve), but where only the other loads'
    /// reservations stand in the way, waits up to `patience` for them to
    /// be given back: two loads whose working memory together exceeds the
    /// budget then run one after the other instead of side by side beside
    /// a full cache. A load that cannot fit even alone is refused at once.
    pub fn reserve_within(&self, bytes: usize, share: usize, patience: Duration) -> bool {
        let limit = self.budget / 1024 * share.min(1024);
        if bytes > limit {
            return false;
        }
        let deadline = Instant::now() + patience;
        let mut state = self.lock();
        while state.reserved + bytes > limit {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .room
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        state.reserved += bytes;
        let evicted = self.evict_locked(&mut state);
        drop(state);
        drop(evicted);
        true
    }

    /// Gives back bytes set aside by [`BlockCache::reserve`].
    pub fn unreserve(&self, bytes: usize) {
        let mut state = self.lock();
        state.reserved = state.reserved.saturating_sub(bytes);
        drop(state);
        self.room.notify_all();
    }

    /// Whether a value of `weight` can be held at all: one larger than the
    /// whole budget is never inserted (it would evict everything and then
    /// itself).
    pub fn can_hold(&self, weight: usize) -> bool {
        weight <= self.budget
    }

    /// The cached value, if present (counts as a use).
    pub fn get(&self, key: &K) -> Option<Arc<V>> {
        self.lock().lru.get(key).cloned()
    }

    /// Takes the value of `key` out of the cache (not counted as a hit or
    /// a miss): for values that one user at a time works with and gives
    /// back with [`insert`](Self::insert) (a block cursor).
    pub fn take(&self, key: &K) -> Option<Arc<V>> {
        let mut state = self.lock();
        let value = state.lru.pop(key)?;
        state.bytes -= value.weight();
        Some(value)
    }

    /// Waits for the load of `key` under way, if there is one: for a
    /// caller that needs what that load leaves behind (a block cursor kept
    /// standing after its window) rather than its value.
    pub fn wait_for_load(&self, key: &K) {
        let slot = self.lock().loading.get(key).cloned();
        if let Some(slot) = slot {
            slot.wait();
        }
    }

    /// Whether `key` is cached, being loaded, or evicted but still in
    /// memory (taken back when asked for): prefetchers use this to skip
    /// work that is already done or under way.
    pub fn is_present_or_loading(&self, key: &K) -> bool {
        let state = self.lock();
        state.lru.contains(key)
            || state.loading.contains_key(key)
            || state
                .evicted_alive
                .get(key)
                .is_some_and(|w| w.strong_count() > 0)
    }

    /// Evicts `key` now, as if it were the least recently used: a reader
    /// that still holds it can take it back (see `get_or_load`), and once
    /// no one does its memory is free for the next load.
    pub fn evict(&self, key: &K) {
        let mut state = self.lock();
        let Some(value) = state.lru.pop(key) else {
            return;
        };
        state.bytes -= value.weight();
        self.evictions.fetch_add(1, Ordering::Relaxed);
        if Arc::strong_count(&value) > 1 {
            state
                .evicted_alive
                .insert(key.clone(), Arc::downgrade(&value));
        }
        drop(state);
        drop(value);
    }

    /// Drops every entry whose key matches `stale` (a source file that
    /// changed or disappeared).
    pub fn remove_where(&self, mut stale: impl FnMut(&K) -> bool) {
        let mut state = self.lock();
        let keys: Vec<K> = state
            .lru
            .iter()
            .filter(|(k, _)| stale(k))
            .map(|(k, _)| k.clone())
            .collect();
        let mut removed = Evicted::new();
        for key in keys {
            if let Some(value) = state.lru.pop(&key) {
                state.bytes -= value.weight();
                removed.push(value);
            }
        }
        state.evicted_alive.retain(|k, _| !stale(k));
        drop(state);
        drop(removed);
    }

    pub fn stats(&self) -> CacheStats {
        let state = self.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            loads: self.loads.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: state.lru.len(),
            bytes: state.bytes,
            reserved: state.reserved,
            budget: self.budget,
        }
    }

    /// Keeps `value` (when it fits): returns what was evicted, for the
    /// caller to drop once the lock is released.
    fn insert_locked(&self, state: &mut State<K, V, E>, key: K, value: Arc<V>) -> Evicted<V> {
        let weight = value.weight();
        if !self.can_hold(weight) {
            return Evicted::new();
        }
        if let Some(old) = state.lru.put(key, value) {
            state.bytes -= old.weight();
        }
        state.bytes += weight;
        self.evict_locked(state)
    }

    /// Evicts the least recently used until values and reservations fit,
    /// returning them: they are dropped after the lock is released, since
    /// dropping one can be slow (a 64 MiB window is unmapped, an idle
    /// block cursor gives its heap back to the system) and every reader
    /// waits on this lock.
    fn evict_locked(&self, state: &mut State<K, V, E>) -> Evicted<V> {
        let mut evicted = Evicted::new();
        while state.bytes + state.reserved > self.budget {
            match state.lru.pop_lru() {
                Some((key, value)) => {
                    state.bytes -= value.weight();
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    if Arc::strong_count(&value) > 1 {
                        state.evicted_alive.insert(key, Arc::downgrade(&value));
                    }
                    evicted.push(value);
                }
                None => break,
            }
        }
        if state.evicted_alive.len() > state.lru.len() + 64 {
            state.evicted_alive.retain(|_, w| w.strong_count() > 0);
        }
        evicted
    }

    fn lock(&self) -> MutexGuard<'_, State<K, V, E>> {
        // A panic while holding the lock cannot leave the maps inconsistent
        // (every update is a single call), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;
    use std::time::Duration;

    type Cache = BlockCache<u32, Vec<u8>, String>;

    fn block(n: usize) -> Result<Arc<Vec<u8>>, String> {
        Ok(Arc::new(vec![0; n]))
    }

    #[test]
    fn an_evicted_value_is_taken_back_while_held_and_gone_after() {
        let cache = Cache::new(1000);
        let held = cache.get_or_load(&1, || block(100)).unwrap();
        cache.get_or_load(&2, || block(100)).unwrap();
        cache.evict(&1);
        cache.evict(&2);
        cache.evict(&3); // not there: nothing happens
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.evictions), (0, 0, 2));
        // 1 is still held by a reader: taken back, not loaded again.
        let again = cache
            .get_or_load(&1, || Err("loaded again".to_string()))
            .unwrap();
        assert!(Arc::ptr_eq(&held, &again));
        // 2 was dropped: loaded again.
        assert!(cache.get_or_load(&2, || Err("gone".to_string())).is_err());
    }

    #[test]
    fn keeps_the_most_recent_within_the_budget() {
        let cache = Cache::new(250);
        for key in 0..3 {
            cache.get_or_load(&key, || block(100)).unwrap();
        }
        // 300 bytes asked for, 250 allowed: the oldest went.
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.evictions), (2, 200, 1));
        assert!(cache.get(&0).is_none());
        assert!(cache.get(&1).is_some());
        // Using 1 makes 2 the least recent.
        cache.get_or_load(&3, || block(100)).unwrap();
        assert!(cache.get(&1).is_some());
        assert!(cache.get(&2).is_none());
        // Asked for again after its eviction, 0 is loaded a second time.
        cache.get_or_load(&0, || block(100)).unwrap();
        assert_eq!((cache.stats().misses, cache.stats().loads), (5, 5));
    }

    #[test]
    fn an_evicted_value_still_held_is_taken_back_not_loaded_again() {
        let cache = Cache::new(100);
        let held = cache.get_or_load(&0, || block(100)).unwrap();
        cache.get_or_load(&1, || block(100)).unwrap();
        assert!(cache.get(&0).is_none(), "0 was evicted for 1");
        assert!(cache.is_present_or_loading(&0), "but it is still in memory");
        let again = cache
            .get_or_load(&0, || Err("loaded again".to_string()))
            .unwrap();
        assert!(Arc::ptr_eq(&again, &held));
        let stats = cache.stats();
        assert_eq!((stats.loads, stats.entries, stats.bytes), (2, 1, 100));
        // Once nothing holds it, an evicted value is gone: loaded again.
        drop((held, again));
        cache.get_or_load(&1, || block(100)).unwrap();
        assert!(!cache.is_present_or_loading(&0));
        cache.get_or_load(&0, || block(100)).unwrap();
        assert_eq!(cache.stats().loads, 4);
    }

    #[test]
    fn a_stale_value_is_not_taken_back() {
        let cache = Cache::new(100);
        let _held = cache.get_or_load(&0, || block(100)).unwrap();
        cache.get_or_load(&1, || block(100)).unwrap();
        cache.remove_where(|k| *k == 0);
        assert!(!cache.is_present_or_loading(&0));
        let fresh = cache.get_or_load(&0, || block(7)).unwrap();
        assert_eq!(fresh.len(), 7);
    }

    #[test]
    fn oversized_values_are_returned_but_not_kept() {
        let cache = Cache::new(10);
        assert_eq!(cache.get_or_load(&1, || block(11)).unwrap().len(), 11);
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn errors_reach_the_caller_and_are_retried() {
        let cache = Cache::new(100);
        let err = cache.get_or_load(&1, || Err("corrupt".to_string()));
        assert_eq!(err.unwrap_err(), "corrupt");
        assert_eq!(cache.get_or_load(&1, || block(5)).unwrap().len(), 5);
    }

    #[test]
    fn concurrent_misses_load_once() {
        let cache = Arc::new(Cache::new(1 << 20));
        let loads = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (cache, loads, barrier) = (cache.clone(), loads.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    cache
                        .get_or_load(&7, || {
                            loads.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            block(64)
                        })
                        .unwrap()
                })
            })
            .collect();
        let values: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        assert!(values.iter().all(|v| Arc::ptr_eq(v, &values[0])));
        // Every caller missed; one load served them all.
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses, stats.loads), (0, 8, 1));
        cache.get_or_load(&7, || block(64)).unwrap();
        assert_eq!((cache.stats().hits, cache.stats().loads), (1, 1));
    }

    #[test]
    fn different_keys_load_in_parallel() {
        let cache = Arc::new(Cache::new(1 << 20));
        let barrier = Arc::new(Barrier::new(2));
        // Each load waits for the other to start: this deadlocks unless
        // the two loads really run at the same time.
        let threads: Vec<_> = (0..2)
            .map(|key| {
                let (cache, barrier) = (cache.clone(), barrier.clone());
                std::thread::spawn(move || {
                    cache
                        .get_or_load(&key, || {
                            barrier.wait();
                            block(8)
                        })
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(cache.stats().entries, 2);
    }

    #[test]
    fn reservations_count_against_the_budget() {
        let cache = Cache::new(1024);
        for key in 0..4 {
            cache.get_or_load(&key, || block(200)).unwrap();
        }
        // Half the budget may be set aside: 400 bytes, making room.
        assert!(cache.reserve(400, 512));
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.reserved), (3, 600, 400));
        assert!(!cache.reserve(200, 512), "beyond the share: refused");
        cache.unreserve(400);
        assert_eq!(cache.stats().reserved, 0);
    }

    /// A reservation that only others' reservations stand in the way of
    /// waits for them to be given back; one that cannot fit alone, or
    /// whose wait runs out, is refused.
    #[test]
    fn a_reservation_waits_for_room_others_give_back() {
        let cache = Arc::new(Cache::new(1024));
        assert!(cache.reserve(700, 1024));
        assert!(!cache.reserve_within(2048, 1024, Duration::from_secs(60)));
        let began = std::time::Instant::now();
        assert!(!cache.reserve_within(700, 1024, Duration::from_millis(50)));
        assert!(began.elapsed() >= Duration::from_millis(50));
        let c = Arc::clone(&cache);
        let giver = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            c.unreserve(700);
        });
        assert!(cache.reserve_within(700, 1024, Duration::from_secs(60)));
        giver.join().unwrap();
        assert_eq!(cache.stats().reserved, 700);
    }

    #[test]
    fn a_taken_value_leaves_the_cache_until_put_back() {
        let cache = Cache::new(1000);
        cache.get_or_load(&1, || block(300)).unwrap();
        let taken = cache.take(&1).unwrap();
        assert_eq!(taken.len(), 300);
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes, stats.hits), (0, 0, 0));
        assert!(cache.take(&1).is_none());
        cache.insert(1, taken);
        assert_eq!(cache.stats().bytes, 300);
    }

    #[test]
    fn stale_entries_can_be_dropped() {
        let cache = Cache::new(1000);
        for key in 0..4 {
            cache.get_or_load(&key, || block(10)).unwrap();
        }
        cache.remove_where(|k| k % 2 == 0);
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.bytes), (2, 20));
        assert!(cache.is_present_or_loading(&1));
        assert!(!cache.is_present_or_loading(&2));
    }
}
