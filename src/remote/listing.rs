//! The folders and objects directly under an S3 prefix: keys split at `/`,
//! as a mounted prefix mirrors them.

use std::time::SystemTime;

use object_store::path::Path as StorePath;
use object_store::ObjectStore;

use super::error::RemoteError;
use super::options;
use super::runtime::block_on;

/// An object directly under the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The key's last segment.
    pub name: String,
    pub size: u64,
    pub modified: SystemTime,
    /// The ETag, which changes with the object's bytes.
    pub etag: Option<String>,
}

/// What one prefix holds, each part sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Names of the prefixes one level down (`PREFIX/NAME/…`).
    pub folders: Vec<String>,
    pub objects: Vec<Listed>,
}

impl Listing {
    pub fn folder(&self, name: &str) -> bool {
        self.folders
            .binary_search_by(|f| f.as_str().cmp(name))
            .is_ok()
    }

    pub fn object(&self, name: &str) -> Option<&Listed> {
        self.objects
            .binary_search_by(|o| o.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.objects[i])
    }
}

/// The listing of `s3://BUCKET/PREFIX/` (`prefix` without its trailing
/// `/`; empty for the bucket's top): one `ListObjectsV2` with the `/`
/// delimiter, page after page.
pub fn list(bucket: &str, prefix: &str) -> Result<Listing, RemoteError> {
    let url = format!("s3://{bucket}/{prefix}");
    let store = options::s3(bucket, &url)?;
    let path = (!prefix.is_empty()).then(|| StorePath::from(prefix));
    let listed = block_on(store.list_with_delimiter(path.as_ref()))
        .map_err(|reason| RemoteError::Request {
            url: url.clone(),
            reason: reason.to_string(),
        })?
        .map_err(|e| RemoteError::from_store(&url, Some(bucket), e))?;
    let last = |p: &StorePath| p.filename().map(str::to_string);
    let mut listing = Listing {
        folders: listed.common_prefixes.iter().filter_map(last).collect(),
        objects: listed
            .objects
            .iter()
            // A zero-byte `PREFIX/` key (a console's "folder") is the
            // folder itself, not an entry of it.
            .filter(|o| o.location.as_ref() != prefix)
            .filter_map(|o| {
                Some(Listed {
                    name: last(&o.location)?,
                    size: o.size,
                    modified: o.last_modified.into(),
                    etag: o.e_tag.clone(),
                })
            })
            .collect(),
    };
    listing.folders.sort();
    listing.folders.dedup();
    listing.objects.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(listing)
}
