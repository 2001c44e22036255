//! One opened remote object, every range of it pinned to one version.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt};

use super::address::Address;
use super::error::RemoteError;
use super::runtime::block_on;
use super::{options, CONCURRENT_PARTS, PART_BYTES};

/// What identifies the version of an object that was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The ETag, where the server gives one.
    pub etag: Option<String>,
    /// `Last-Modified`, RFC 3339.
    pub modified: String,
    pub size: u64,
}

/// A remote object opened for ranged reads.
pub struct Object {
    address: Address,
    url: String,
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    meta: ObjectMeta,
    opening: Bytes,
}

/// Bytes fetched by the request that opens an object: a `.qem` envelope
/// and, for all but the largest scans, its whole header.
pub const OPENING_BYTES: u64 = 1 << 20;

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("url", &self.url)
            .field("size", &self.meta.size)
            .field("etag", &self.meta.e_tag)
            .finish()
    }
}

impl Object {
    /// Opens `address`: one ranged GET of its first [`OPENING_BYTES`],
    /// whose answer gives the size and version every later range is
    /// pinned to (see [`Object::opening`]).
    pub fn open(address: &Address) -> Result<Object, RemoteError> {
        let url = address.to_string();
        let (store, path) = match address {
            Address::S3 { bucket, key } => {
                if key.is_empty() || key.ends_with('/') {
                    return Err(RemoteError::InvalidUrl {
                        url,
                        reason: "names a bucket or a prefix, not an object".to_string(),
                    });
                }
                (
                    options::s3(bucket, &url)?,
                    object_store::path::Path::from(key.as_str()),
                )
            }
            Address::Http { url: u } => {
                let path = object_store::path::Path::from_url_path(u.path()).map_err(|e| {
                    RemoteError::InvalidUrl {
                        url: url.clone(),
                        reason: e.to_string(),
                    }
                })?;
                (options::http(u)?, path)
            }
        };
        let mut object = Object {
            address: address.clone(),
            url,
            store,
            path,
            meta: ObjectMeta {
                location: Default::default(),
                last_modified: Default::default(),
                size: 0,
                e_tag: None,
                version: None,
            },
            opening: Bytes::new(),
        };
        // The opening GET asks for the first bytes: its answer gives the
        // size and version (what a HEAD would, a round trip sooner), and
        // an error document that names a missing bucket or a refused key.
        let store = Arc::clone(&object.store);
        let opened = run(&object, async {
            let result = store
                .get_opts(
                    &object.path,
                    GetOptions {
                        range: Some(GetRange::Bounded(0..OPENING_BYTES)),
                        ..Default::default()
                    },
                )
                .await?;
            let meta = result.meta.clone();
            Ok::<_, object_store::Error>((meta, result.bytes().await?))
        })?;
        match opened {
            Ok((meta, bytes)) => {
                object.meta = meta;
                object.opening = bytes;
            }
            // An empty object has no first byte to ask for.
            Err(e) if super::error::chain(&e).contains("416") => {
                let store = Arc::clone(&object.store);
                object.meta = run(&object, async { store.head(&object.path).await })?
                    .map_err(|e| object.error(e))?;
            }
            Err(e) => return Err(object.error(e)),
        }
        let expected = OPENING_BYTES.min(object.meta.size);
        if object.opening.len() as u64 != expected {
            return Err(RemoteError::Request {
                url: object.url.clone(),
                reason: format!(
                    "the answer for bytes 0..{expected} held {} bytes (cut short)",
                    object.opening.len()
                ),
            });
        }
        Ok(object)
    }

    /// The object's first `min(size, OPENING_BYTES)` bytes, fetched when it
    /// was opened.
    pub fn opening(&self) -> &Bytes {
        &self.opening
    }

    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The URL, as errors name it.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn size(&self) -> u64 {
        self.meta.size
    }

    /// The version every read is pinned to.
    pub fn version(&self) -> Version {
        Version {
            etag: self.meta.e_tag.clone(),
            modified: self.meta.last_modified.to_rfc3339(),
            size: self.meta.size,
        }
    }

    fn bucket(&self) -> Option<&str> {
        match &self.address {
            Address::S3 { bucket, .. } => Some(bucket),
            Address::Http { .. } => None,
        }
    }

    fn error(&self, e: object_store::Error) -> RemoteError {
        RemoteError::from_store(&self.url, self.bucket(), e)
    }

    /// Fetches `ranges` (each within the object), split into parts of at
    /// most [`PART_BYTES`] with up to [`CONCURRENT_PARTS`] in flight, and
    /// hands each part to `each` (on this thread) as it arrives.
    pub fn read_parts(
        &self,
        ranges: impl IntoIterator<Item = Range<u64>>,
        mut each: impl FnMut(Range<u64>, Bytes) -> std::io::Result<()>,
    ) -> Result<(), RemoteError> {
        let parts: Vec<Range<u64>> = ranges
            .into_iter()
            .flat_map(|r| {
                (r.start..r.end)
                    .step_by(PART_BYTES as usize)
                    .map(move |s| s..(s + PART_BYTES).min(r.end))
            })
            .filter(|r| !r.is_empty())
            .collect();
        if let Some(bad) = parts.iter().find(|r| r.end > self.meta.size) {
            return Err(RemoteError::Request {
                url: self.url.clone(),
                reason: format!(
                    "bytes {}..{} asked for, past the object's end ({} bytes)",
                    bad.start, bad.end, self.meta.size
                ),
            });
        }
        let fetches = futures::stream::iter(parts.into_iter().map(|r| self.fetch(r)))
            .buffered(CONCURRENT_PARTS);
        let local = |e| RemoteError::Local {
            url: self.url.clone(),
            source: e,
        };
        run(self, async {
            let mut fetches = std::pin::pin!(fetches);
            while let Some((range, bytes)) = fetches.try_next().await? {
                each(range, bytes).map_err(local)?;
            }
            Ok(())
        })?
    }

    /// One ranged GET, pinned to the opened version.
    async fn fetch(&self, range: Range<u64>) -> Result<(Range<u64>, Bytes), RemoteError> {
        // A weak ETag never matches `If-Match` (strong comparison); such a
        // server, and one that gives none, is pinned by its modification
        // time, and every answer is compared with the opened version too
        // (a server may ignore the condition).
        let strong = self.meta.e_tag.clone().filter(|t| !t.starts_with("W/"));
        let options = GetOptions {
            if_unmodified_since: strong.is_none().then_some(self.meta.last_modified),
            if_match: strong,
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let result = self
            .store
            .get_opts(&self.path, options)
            .await
            .map_err(|e| self.error(e))?;
        let meta = &result.meta;
        let changed = |reason: String| RemoteError::Changed {
            url: self.url.clone(),
            reason,
        };
        if meta.size != self.meta.size {
            return Err(changed(format!(
                "{} bytes when opened, {} now",
                self.meta.size, meta.size
            )));
        }
        if self.meta.e_tag.is_some() && meta.e_tag != self.meta.e_tag {
            return Err(changed(format!(
                "ETag {} when opened, {} now",
                self.meta.e_tag.as_deref().unwrap_or(""),
                meta.e_tag.as_deref().unwrap_or("none")
            )));
        }
        if self.meta.e_tag.is_none() && meta.last_modified != self.meta.last_modified {
            return Err(changed(format!(
                "modified {} when opened, {} now",
                self.meta.last_modified.to_rfc3339(),
                meta.last_modified.to_rfc3339()
            )));
        }
        let bytes = result.bytes().await.map_err(|e| self.error(e))?;
        if bytes.len() as u64 != range.end - range.start {
            return Err(RemoteError::Request {
                url: self.url.clone(),
                reason: format!(
                    "the answer for bytes {}..{} held {} bytes (cut short)",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok((range, bytes))
    }
}

/// [`block_on`], its failure to start said as this object's error.
fn run<F: std::future::Future>(object: &Object, future: F) -> Result<F::Output, RemoteError> {
    block_on(future).map_err(|reason| RemoteError::Request {
        url: object.url.clone(),
        reason: reason.to_string(),
    })
}
