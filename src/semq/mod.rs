//! The `.semq` format (see `shared/spec/semq.md`).
