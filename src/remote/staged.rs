//! A remote object's bytes staged locally by ranges, and mapped.
//!
//! The readers of both formats address a file as one slice and check
//! every byte before they use it (the `.qem` body by 64 MiB checksum block,
//! a `.semq` whole). A staged object is an unlinked local file of the
//! object's size, sparse until read: [`Staged::ensure`] fetches the pieces
//! of a range not yet here, writes them into the file and only then marks
//! them present, so a reader that ensures a range before it touches it
//! reads the object's bytes and nothing else. Fetched bytes live in the
//! page cache of that file, which the kernel reclaims under pressure (they
//! are clean: written back to the local disk, not held in memory).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::{Condvar, Mutex};

use super::address::Address;
use super::error::RemoteError;
use super::object::Object;
use crate::mapguard::Mapping;

/// What is fetched at least at once: a reader's ranges are widened to
/// whole pieces, and presence is kept per piece.
pub const PIECE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Absent,
    Fetching,
    Present,
}

/// Pieces one reader claims and fetches at once (64 MiB: one body
/// checksum block of a `.qem`).
const CLAIM_PIECES: usize = 64;

/// An object being staged.
pub struct Staged {
    object: Object,
    file: File,
    mapping: Mapping,
    /// Each piece's state. A reader claims the absent pieces it needs,
    /// fetches them without the lock and marks them present; a reader
    /// needing a piece another is fetching waits for it (`fetched_one`),
    /// so readers of different pieces fetch at once, and of one piece once.
    /// Only pieces that are not absent are entered: the table follows what
    /// was fetched, never the size the server declares.
    pieces: Mutex<HashMap<usize, Piece>>,
    fetched_one: Condvar,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("object", &self.object)
            .finish_non_exhaustive()
    }
}

impl Staged {
    /// Opens `address` (one ranged GET of its first MiB, see
    /// [`Object::open`]) and makes its local file, holding those bytes.
    pub fn open(address: &Address) -> Result<Staged, RemoteError> {
        let object = Object::open(address)?;
        let local = |source| RemoteError::Local {
            url: object.url().to_string(),
            source,
        };
        let file = tempfile::tempfile().map_err(local)?;
        file.set_len(object.size()).map_err(local)?;
        let mapping = Mapping::map(&file).map_err(local)?;
        // The opening request's bytes are the first pieces (whole ones, or
        // the object's last, short one).
        let opening = object.opening();
        file.write_all_at(opening, 0).map_err(local)?;
        let whole = if opening.len() as u64 == object.size() {
            object.size().div_ceil(PIECE_BYTES)
        } else {
            opening.len() as u64 / PIECE_BYTES
        };
        let states: HashMap<usize, Piece> =
            (0..whole as usize).map(|p| (p, Piece::Present)).collect();
        Ok(Staged {
            object,
            file,
            mapping,
            pieces: Mutex::new(states),
            fetched_one: Condvar::new(),
        })
    }

    pub fn object(&self) -> &Object {
        &self.object
    }

    /// The object's bytes as a slice, valid where [`Staged::ensure`] has
    /// returned `Ok` (zeros elsewhere).
    pub fn bytes(&self) -> &[u8] {
        &self.mapping
    }

    /// The mapping (its page-cache pages can be let go of).
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The staged local file, for a reader that maps it itself.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Makes the bytes of `range` (clamped to the object) present: the
    /// pieces not yet here are fetched, contiguous ones together.
    pub fn ensure(&self, range: Range<u64>) -> Result<(), RemoteError> {
        let size = self.object.size();
        let range = range.start.min(size)..range.end.min(size);
        if range.is_empty() {
            return Ok(());
        }
        let first = (range.start / PIECE_BYTES) as usize;
        let last = ((range.end - 1) / PIECE_BYTES) as usize;
        let mut pieces = self.lock();
        // Pieces before `from` are present or in flight; `waiting` says
        // some were in flight (another reader's), to be looked at again.
        let mut from = first;
        let mut waiting = false;
        // Whether the lock has been held since `waiting` was last set: a
        // wait is safe only then (else the fetch it waits for may have
        // ended, its wake-up gone to nobody, while this reader fetched).
        let mut current = true;
        loop {
            // Claim what nobody has or fetches, contiguous pieces together,
            // at most CLAIM_PIECES a round: what a round holds in flight is
            // bounded, whatever the range.
            let mut runs: Vec<Range<usize>> = Vec::new();
            let mut claimed = 0;
            while from <= last && claimed < CLAIM_PIECES {
                match pieces.get(&from).copied().unwrap_or(Piece::Absent) {
                    Piece::Present => {}
                    Piece::Fetching => waiting = true,
                    Piece::Absent => {
                        pieces.insert(from, Piece::Fetching);
                        claimed += 1;
                        match runs.last_mut() {
                            Some(run) if run.end == from => run.end = from + 1,
                            _ => runs.push(from..from + 1),
                        }
                    }
                }
                from += 1;
            }
            if runs.is_empty() {
                if !waiting {
                    return Ok(());
                }
                // Another reader's fetch: present, or absent again if it
                // failed (then this reader claims and tries it itself).
                if current {
                    pieces = self
                        .fetched_one
                        .wait(pieces)
                        .unwrap_or_else(|e| e.into_inner());
                }
                from = first;
                waiting = false;
                current = true;
                continue;
            }
            drop(pieces);
            let bytes: Vec<Range<u64>> = runs
                .iter()
                .map(|r| r.start as u64 * PIECE_BYTES..(r.end as u64 * PIECE_BYTES).min(size))
                .collect();
            let fetched = self.object.read_parts(bytes, |part, data| {
                self.file.write_all_at(&data, part.start)
            });
            pieces = self.lock();
            current = false;
            for p in runs.iter().flat_map(|r| r.clone()) {
                if fetched.is_ok() {
                    pieces.insert(p, Piece::Present);
                } else {
                    pieces.remove(&p);
                }
            }
            self.fetched_one.notify_all();
            fetched?;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Piece>> {
        self.pieces.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the whole object present.
    pub fn ensure_all(&self) -> Result<(), RemoteError> {
        self.ensure(0..self.object.size())
    }
}
