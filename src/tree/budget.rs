//! The one byte budget of a tree (`qemfs mount --cache-size`): decoded
//! blocks, derived files (virtual images and their `.npy`/TIFF/PNG
//! encodings, digests, JSON documents) and the products they are computed
//! from share one LRU bounded by bytes, so that whatever mix of files is
//! being read, what the tree holds stays within it.
//!
//! Values are kept by type-erased key: a block by its [`BlockKey`], every
//! other held value by a number given when its file (or product) was made.
//! A value larger than the whole budget is handed to its caller but not
//! kept; files that can be larger than a budget (`data.npy`, `vectors.npy`,
//! `rows.bin`, ...) are therefore served in windows computed per read, never
//! held whole (see `qem_view` and `semq_view`).

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cache::{BlockCache, CacheStats, Weighted};

use super::{BlockKey, TreeError};

/// How long a decode waits for others' reservations to make room for its
/// own: about a window's decode (64 MiB at a few hundred MB/s), so that a
/// reader waits for the prefetcher's window rather than decoding beside it
/// with the budget full (the 4 GB block of `fs/tests/huge_block.rs` rose
/// to 386-552 MiB under a 256 MiB budget so; 302-315 with the wait, and
/// its sequential read 5-10 % slower); bounded, since the decodes waited
/// for may themselves be waiting.
pub const DECODE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// A value the budget can hold: what it costs in bytes.
pub trait Charged: Any + Send + Sync {
    fn charge(&self) -> usize;
}

impl Charged for Vec<u8> {
    fn charge(&self) -> usize {
        self.len()
    }
}

/// Weighed by the memory it holds, which may reach past its length to the
/// end of its last huge page.
impl Charged for super::block_buf::BlockBuf {
    fn charge(&self) -> usize {
        self.capacity()
    }
}

impl Weighted for dyn Charged {
    fn weight(&self) -> usize {
        self.charge()
    }
}

/// What a held value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheKey {
    /// A decoded block.
    Block(BlockKey),
    /// A derived file's bytes or a product it is computed from, numbered
    /// by [`Budget::derived`]; `view` is its container's opening, so that
    /// closing the container drops it with the container's blocks.
    Derived { view: u64, id: u64 },
    /// An idle cursor over a block decoded in windows, standing at block
    /// frame `frame` (see `qem_view`): kept by the same LRU as the windows
    /// it makes, so that the budget decides between them.
    Cursor {
        view: u64,
        block: usize,
        codes: bool,
        frame: usize,
    },
}

impl CacheKey {
    /// The opening of the container the value belongs to.
    pub fn view(&self) -> u64 {
        match self {
            CacheKey::Block(b) => b.view,
            CacheKey::Derived { view, .. } | CacheKey::Cursor { view, .. } => *view,
        }
    }
}

impl From<BlockKey> for CacheKey {
    fn from(key: BlockKey) -> Self {
        CacheKey::Block(key)
    }
}

/// The tree's budget: an LRU of every held value, single-flight loads.
pub struct Budget {
    cache: BlockCache<CacheKey, dyn Charged, TreeError>,
    next: AtomicU64,
}

fn typed<T: Charged>(value: Arc<dyn Charged>) -> Result<Arc<T>, TreeError> {
    let any: Arc<dyn Any + Send + Sync> = value;
    any.downcast::<T>()
        .map_err(|_| TreeError::Internal("a cached value of another type".into()))
}

impl Budget {
    pub fn new(bytes: usize) -> Self {
        Budget {
            cache: BlockCache::new(bytes),
            next: AtomicU64::new(1),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.cache.stats().budget
    }

    /// Whether a value of `bytes` can be held ([`BlockCache::can_hold`]).
    pub fn can_hold(&self, bytes: usize) -> bool {
        self.cache.can_hold(bytes)
    }

    /// A new key for a value derived from container opening `view`.
    pub fn derived(&self, view: u64) -> CacheKey {
        CacheKey::Derived {
            view,
            id: self.next.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The held value of `key`, or the result of `load`, run once for all
    /// concurrent callers (see [`BlockCache::get_or_load`]).
    pub fn get_or_load<T: Charged>(
        &self,
        key: impl Into<CacheKey>,
        load: impl FnOnce() -> Result<Arc<T>, TreeError>,
    ) -> Result<Arc<T>, TreeError> {
        let value = self
            .cache
            .get_or_load(&key.into(), || load().map(|v| v as Arc<dyn Charged>))?;
        typed(value)
    }

    /// The held value of `key`, if any (counts as a use).
    pub fn get<T: Charged>(&self, key: impl Into<CacheKey>) -> Option<Arc<T>> {
        self.cache.get(&key.into()).and_then(|v| typed(v).ok())
    }

    /// Takes the held value of `key` out of the budget (see
    /// [`BlockCache::take`]); put it back with [`keep`](Self::keep).
    pub fn take<T: Charged>(&self, key: impl Into<CacheKey>) -> Option<Arc<T>> {
        self.cache.take(&key.into()).and_then(|v| typed(v).ok())
    }

    /// Holds `value` under `key` if it fits, evicting the least recently
    /// used values to make room.
    pub fn keep<T: Charged>(&self, key: impl Into<CacheKey>, value: Arc<T>) {
        self.cache.insert(key.into(), value as Arc<dyn Charged>);
    }

    /// Sets `bytes` aside for a load under way, if loads so set aside stay
    /// within `share` of the budget (1/1024ths); see
    /// [`BlockCache::reserve`].
    pub fn reserve(&self, bytes: usize, share: usize) -> bool {
        self.cache.reserve(bytes, share)
    }

    pub fn unreserve(&self, bytes: usize) {
        self.cache.unreserve(bytes);
    }

    /// As [`reserve`](Self::reserve), given back when the guard is
    /// dropped, for a decode about to start: where other decodes' bytes
    /// stand in the way it waits up to [`DECODE_PATIENCE`] for them (see
    /// [`BlockCache::reserve_within`]); `None` (nothing set aside) when
    /// `share` still cannot hold it, and the decode runs unreserved (a
    /// reader is always answered).
    pub fn reserve_while(&self, bytes: usize, share: usize) -> Option<Reservation<'_>> {
        self.cache
            .reserve_within(bytes, share, DECODE_PATIENCE)
            .then_some(Reservation {
                budget: self,
                bytes,
            })
    }

    /// Waits for the load of `key` under way, if any (see
    /// [`BlockCache::wait_for_load`]).
    pub fn wait_for_load(&self, key: impl Into<CacheKey>) {
        self.cache.wait_for_load(&key.into());
    }

    /// Whether `key` is held or being loaded.
    pub fn is_present_or_loading(&self, key: impl Into<CacheKey>) -> bool {
        self.cache.is_present_or_loading(&key.into())
    }

    /// Evicts `key` now (see [`BlockCache::evict`]).
    pub fn evict(&self, key: impl Into<CacheKey>) {
        self.cache.evict(&key.into());
    }

    /// Drops every value whose key matches `stale`.
    pub fn remove_where(&self, stale: impl FnMut(&CacheKey) -> bool) {
        self.cache.remove_where(stale);
    }

    pub fn stats(&self) -> CacheStats {
        self.cache.stats()
    }
}

/// Bytes of a budget set aside for a load under way, until dropped.
pub struct Reservation<'a> {
    budget: &'a Budget,
    bytes: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.unreserve(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Image(Vec<f64>);

    impl Charged for Image {
        fn charge(&self) -> usize {
            self.0.len() * 8
        }
    }

    #[test]
    fn blocks_and_derived_values_share_one_budget() {
        let budget = Budget::new(1000);
        let block = BlockKey {
            view: 1,
            block: 0,
            window: 0,
            codes: false,
        };
        budget
            .get_or_load(block, || Ok(Arc::new(vec![0u8; 600])))
            .unwrap();
        let image = budget.derived(1);
        let got = budget
            .get_or_load(image, || Ok(Arc::new(Image(vec![1.0; 75]))))
            .unwrap();
        assert_eq!(got.0.len(), 75);
        // 600 + 600 bytes asked for, 1000 allowed: the block went.
        let stats = budget.stats();
        assert_eq!((stats.entries, stats.bytes), (1, 600));
        assert!(!budget.is_present_or_loading(block));
        assert!(budget.get::<Image>(image).is_some());
        // A key holds one type; asking for another is an error, not a
        // misread.
        assert!(budget.get::<Vec<u8>>(image).is_none());
        budget.remove_where(|k| k.view() == 1);
        assert_eq!(budget.stats().entries, 0);
    }

    /// A load's reservation makes room before the load runs and is given
    /// back when it ends; one the budget cannot hold is refused.
    #[test]
    fn a_reservation_evicts_first_and_is_given_back() {
        let budget = Budget::new(1 << 20);
        let image = budget.derived(1);
        budget.keep(image, Arc::new(Image(vec![0.0; 80_000])));
        assert_eq!(budget.stats().entries, 1);
        {
            let held = budget.reserve_while(600_000, 1024);
            assert!(held.is_some());
            let stats = budget.stats();
            assert_eq!((stats.entries, stats.reserved), (0, 600_000), "{stats:?}");
            assert!(budget.reserve_while(600_000, 1024).is_none());
        }
        assert_eq!(budget.stats().reserved, 0);
    }
}
