//! Which inputs are URLs, and what they name.

use std::path::Path;

use super::error::RemoteError;

/// A remote object's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    /// `s3://BUCKET/KEY`.
    S3 { bucket: String, key: String },
    /// An `http://` or `https://` URL, as given.
    Http { url: url::Url },
}

impl Address {
    /// The address `text` names, if it is a URL (`s3://`, `http://`,
    /// `https://`); `None` for anything else, which is a local path. A
    /// local file whose name begins so is named `./s3://…`.
    pub fn parse(text: &str) -> Option<Result<Address, RemoteError>> {
        let scheme = ["s3://", "http://", "https://"].into_iter().find(|s| {
            text.get(..s.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(s))
        })?;
        let invalid = |reason: &str| RemoteError::InvalidUrl {
            url: text.to_string(),
            reason: reason.to_string(),
        };
        if scheme == "s3://" {
            let rest = &text[scheme.len()..];
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Some(Err(invalid("no bucket: write s3://BUCKET/KEY")));
            }
            return Some(Ok(Address::S3 {
                bucket: bucket.to_string(),
                key: key.to_string(),
            }));
        }
        Some(match url::Url::parse(text) {
            Ok(url) if url.host_str().is_some_and(|h| !h.is_empty()) => Ok(Address::Http { url }),
            Ok(_) => Err(invalid("no host")),
            Err(e) => Err(invalid(&e.to_string())),
        })
    }

    /// [`Address::parse`] of a path's text (a path that is not UTF-8 is
    /// never a URL).
    pub fn of_path(path: &Path) -> Option<Result<Address, RemoteError>> {
        Address::parse(path.to_str()?)
    }

    /// The object's name: the key's or URL path's last segment.
    pub fn file_name(&self) -> &str {
        let path = match self {
            Address::S3 { key, .. } => key.as_str(),
            Address::Http { url } => url.path(),
        };
        path.rsplit('/').next().unwrap_or("")
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::S3 { bucket, key } => write!(f, "s3://{bucket}/{key}"),
            Address::Http { url } => write!(f, "{url}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths() {
        assert_eq!(
            Address::parse("s3://bucket/a/b.qem").unwrap().unwrap(),
            Address::S3 {
                bucket: "bucket".into(),
                key: "a/b.qem".into()
            }
        );
        assert_eq!(
            Address::parse("s3://bucket").unwrap().unwrap(),
            Address::S3 {
                bucket: "bucket".into(),
                key: "".into()
            }
        );
        assert!(Address::parse("s3:///key").unwrap().is_err());
        let http = Address::parse("http://127.0.0.1:8000/d/x.qem")
            .unwrap()
            .unwrap();
        assert_eq!(http.file_name(), "x.qem");
        assert_eq!(http.to_string(), "http://127.0.0.1:8000/d/x.qem");
        assert!(Address::parse("HTTPS://example.org/x").unwrap().is_ok());
        assert!(Address::parse("http://").unwrap().is_err());
        for local in ["scan.qem", "./s3://b/k", "/data/http:/x", "s3:/b/k"] {
            assert!(Address::parse(local).is_none(), "{local}");
        }
    }
}
