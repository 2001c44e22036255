//! What went wrong with a remote object, in words.

/// A remote read that failed, naming the URL.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("not a URL this tool reads ({reason})")]
    InvalidUrl { url: String, reason: String },
    #[error("no such object (HTTP 404)")]
    NotFound { url: String },
    #[error("no such bucket '{bucket}'")]
    NoSuchBucket { url: String, bucket: String },
    #[error("access denied (HTTP 403){}", with_detail(.detail))]
    AccessDenied { url: String, detail: String },
    #[error("the credentials were refused ({reason}); check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or use --no-sign-request for a public bucket")]
    Credentials { url: String, reason: String },
    #[error("no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with ~/.aws/credentials); for a public bucket use --no-sign-request")]
    NoCredentials { url: String },
    #[error("the server does not support Range requests (it answered a range request with the whole object); serve the file from a server that does, or download it first")]
    NoRange { url: String },
    #[error("the object changed since it was opened ({reason}); nothing of the new version was mixed in: open it again")]
    Changed { url: String, reason: String },
    #[error("{reason}")]
    Request { url: String, reason: String },
    #[error("staging its bytes locally: {source}")]
    Local { url: String, source: std::io::Error },
}

fn with_detail(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// The text of an error and all its sources.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        next = s.source();
    }
    text
}

/// The value of `<name>…</name>` in an S3 error body.
fn xml_element<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find("</")? + start;
    Some(&body[start..end])
}

impl RemoteError {
    /// Classifies an `object_store` error of a request for `url`
    /// (`bucket` for S3, to name a missing one).
    pub(crate) fn from_store(url: &str, bucket: Option<&str>, e: object_store::Error) -> Self {
        let url = url.to_string();
        let text = chain(&e);
        let code = xml_element(&text, "Code");
        if code == Some("NoSuchBucket") {
            return RemoteError::NoSuchBucket {
                url,
                bucket: bucket.unwrap_or("").to_string(),
            };
        }
        if let Some(
            c @ ("InvalidAccessKeyId"
            | "SignatureDoesNotMatch"
            | "ExpiredToken"
            | "InvalidToken"
            | "AuthorizationHeaderMalformed"),
        ) = code
        {
            let message = xml_element(&text, "Message").unwrap_or("");
            return RemoteError::Credentials {
                url,
                reason: format!("{c}: {message}")
                    .trim_end_matches([':', ' '])
                    .to_string(),
            };
        }
        match e {
            object_store::Error::NotFound { .. } => RemoteError::NotFound { url },
            object_store::Error::PermissionDenied { .. } => RemoteError::AccessDenied {
                url,
                detail: xml_element(&text, "Message").unwrap_or("").to_string(),
            },
            object_store::Error::Unauthenticated { .. } => RemoteError::Credentials {
                url,
                reason: "HTTP 401".to_string(),
            },
            object_store::Error::Precondition { .. } => RemoteError::Changed {
                url,
                reason: "its version no longer matches".to_string(),
            },
            _ if text.contains("non-partial response")
                || text.contains("Range request not supported") =>
            {
                RemoteError::NoRange { url }
            }
            _ => RemoteError::Request {
                url,
                reason: plain_reason(&text),
            },
        }
    }

    /// As an I/O error of the kind a caller tests for (not found, denied),
    /// with this error's text.
    pub fn into_io(self) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match &self {
            RemoteError::NotFound { .. } | RemoteError::NoSuchBucket { .. } => ErrorKind::NotFound,
            RemoteError::AccessDenied { .. }
            | RemoteError::Credentials { .. }
            | RemoteError::NoCredentials { .. } => ErrorKind::PermissionDenied,
            RemoteError::InvalidUrl { .. } => ErrorKind::InvalidInput,
            RemoteError::NoRange { .. } => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, self)
    }

    /// Whether the source's error is this kind (through an I/O error).
    pub fn of_io(e: &std::io::Error) -> Option<&RemoteError> {
        e.get_ref()?.downcast_ref::<RemoteError>()
    }
}

/// An error chain's text with the clauses a user can act on first: a
/// time-out or a refused connection said as such.
fn plain_reason(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let lead = if lower.contains("status code: 5") || lower.contains("slowdown") {
        "the server kept failing (retried with backoff)"
    } else if lower.contains("connection refused") || lower.contains("tcp connect error") {
        "the server cannot be reached"
    } else if lower.contains("operation timed out") || lower.contains("timed out") {
        "the server did not answer in time"
    } else {
        return text.to_string();
    };
    format!("{lead} ({text})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_error_codes_are_read_from_the_body() {
        let body = "<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>";
        assert_eq!(xml_element(body, "Code"), Some("NoSuchBucket"));
        assert_eq!(
            xml_element(body, "Message"),
            Some("The specified bucket does not exist")
        );
        assert_eq!(xml_element("no xml", "Code"), None);
    }
}
