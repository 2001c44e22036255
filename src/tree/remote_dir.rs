//! A mounted S3 prefix: its keys, split at `/`, as folders; each
//! `.qem`/`.semq` object a container, every other object a file.
//!
//! Every request of the mount resolves its path from the root, so each
//! folder's listing is kept for [`LISTING_TTL`] (as long as the kernel
//! trusts a name): a burst of lookups costs one LIST per folder, and an
//! object replaced or added is seen at most that long after.

use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::remote::listing::{self, Listing};
use crate::remote::{Address, Staged};
use crate::sync::{lock, Mutex};

use super::content::Content;
use super::source::Origin;
use super::TreeError;

/// How long a folder's listing answers lookups (the mount's entry TTL).
pub const LISTING_TTL: Duration = super::filesystem::TTL;

/// Folder listings kept at most; the least recently used go first.
const LISTINGS_KEPT: usize = 4096;

/// A folder of a mounted prefix.
#[derive(Debug, Clone)]
pub struct RemoteDir {
    pub bucket: String,
    /// The key prefix without its trailing `/` (empty: the bucket's top).
    pub prefix: String,
    pub origin: Origin,
}

impl RemoteDir {
    /// The folder `name` one level down.
    pub fn child(&self, name: &str) -> RemoteDir {
        RemoteDir {
            bucket: self.bucket.clone(),
            prefix: self.key(name),
            origin: self.origin,
        }
    }

    /// The key of the entry `name`.
    pub fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// The URL of the entry `name`.
    pub fn url(&self, name: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(name))
    }
}

/// A folder (bucket, prefix) and its listing with when it was made.
type Kept = lru::LruCache<(String, String), (Instant, Arc<Listing>)>;

/// The listings of the folders lately asked for.
pub struct Listings {
    kept: Mutex<Kept>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings {
            kept: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(LISTINGS_KEPT).expect("not zero"),
            )),
        }
    }
}

impl Listings {
    /// The listing of `dir`, listed again when older than [`LISTING_TTL`].
    pub fn of(&self, dir: &RemoteDir) -> Result<Arc<Listing>, TreeError> {
        let key = (dir.bucket.clone(), dir.prefix.clone());
        if let Some((at, listing)) = lock(&self.kept).get(&key) {
            if at.elapsed() < LISTING_TTL {
                return Ok(Arc::clone(listing));
            }
        }
        // Not held while listing: a slow server stalls only the lookups of
        // this folder, and two of them may list it twice, harmlessly.
        let listing =
            Arc::new(
                listing::list(&dir.bucket, &dir.prefix).map_err(|e| TreeError::Io {
                    path: format!("s3://{}/{}", dir.bucket, dir.prefix).into(),
                    reason: e.to_string(),
                })?,
            );
        lock(&self.kept).put(key, (Instant::now(), Arc::clone(&listing)));
        Ok(listing)
    }
}

/// An object that is not a container, served as it is: staged by ranges
/// as it is read (see [`Staged`]), from the version open(2) found.
pub(crate) struct RemoteFile {
    address: Address,
    size: u64,
    staged: OnceLock<Result<Staged, String>>,
}

impl RemoteFile {
    pub fn new(address: Address, size: u64) -> Self {
        RemoteFile {
            address,
            size,
            staged: OnceLock::new(),
        }
    }

    fn error(&self, reason: impl Into<String>) -> TreeError {
        TreeError::Io {
            path: self.address.to_string().into(),
            reason: reason.into(),
        }
    }

    fn staged(&self) -> Result<&Staged, TreeError> {
        let staged = self.staged.get_or_init(|| {
            let staged = Staged::open(&self.address).map_err(|e| e.to_string())?;
            // The size is the listing's, shown before open: a different
            // object behind the name now would be served cut or padded.
            if staged.object().size() != self.size {
                return Err(format!(
                    "the object changed since it was listed ({} bytes then, {} now); \
                     nothing of the new version was mixed in: open it again",
                    self.size,
                    staged.object().size()
                ));
            }
            Ok(staged)
        });
        staged.as_ref().map_err(|e| self.error(e.clone()))
    }
}

impl Content for RemoteFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn pin(&self) -> Result<(), TreeError> {
        self.staged().map(|_| ())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, TreeError> {
        let n = super::content::readable(self.size, offset, buf.len());
        if n == 0 {
            return Ok(0);
        }
        let staged = self.staged()?;
        staged
            .ensure(offset..offset + n as u64)
            .map_err(|e| self.error(e.to_string()))?;
        staged
            .file()
            .read_exact_at(&mut buf[..n], offset)
            .map_err(|e| self.error(e.to_string()))?;
        Ok(n)
    }
}
