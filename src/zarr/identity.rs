//! The identities a written store records of its source `.qem`: the
//! SHA-256 of the decoded array (what `qem hash` prints) and of the file's
//! bytes (what `qem hash --file` and sha256sum print), so that a Zarr user
//! can prove which acquisition a store came from.
//!
//! Both are hashed while the store is written, on one thread beside the
//! parallel writers, not by a second pass over the file: decoding is most
//! of a conversion's time, and a second decode would nearly double it.
//! The writers decode runs of frames in parallel, started in frame order;
//! each run is handed over as soon as it is decoded and hashed once every
//! run before it has been. The bytes held waiting are bounded: past the
//! bound the array's digest is given up (and taken by a second pass after
//! all), so memory never follows the writers' disorder. While no run is
//! waiting, the thread hashes the file's bytes piece by piece.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::pool::Pooled;
use crate::qem::QemFile;

/// Bytes of the file hashed between two looks for a decoded run.
const FILE_PIECE: usize = 4 << 20;

/// Decoded frames `first..first + frames`, the bytes `range` of `bytes`.
struct Run {
    first: usize,
    frames: usize,
    bytes: Arc<Pooled>,
    range: Range<usize>,
}

/// What was hashed: the decoded array's digest, when every run came in
/// order within the bound (else `None`: the caller decodes again), and the
/// file's, when it did not change while hashed.
pub(super) struct Identities {
    pub logical: Option<String>,
    pub file: Option<String>,
}

/// What the writers and the hashing thread share.
struct Shared {
    /// Hash the decoded array (false when its digest is known already).
    array: bool,
    /// Bytes of runs handed over and not yet hashed.
    held: AtomicUsize,
    bound: usize,
    gave_up: AtomicBool,
}

/// The writers' side: hands decoded runs to the hashing thread; dropped,
/// it tells the thread that no more come.
pub(super) struct Feed<'s> {
    sender: mpsc::Sender<Run>,
    shared: &'s Shared,
}

impl Feed<'_> {
    /// Offers decoded frames `first..first + frames`, `bytes[range]`.
    pub fn give(&self, first: usize, frames: usize, bytes: &Arc<Pooled>, range: Range<usize>) {
        let shared = self.shared;
        if !shared.array || shared.gave_up.load(Ordering::Relaxed) {
            return;
        }
        let n = range.len();
        if shared.held.fetch_add(n, Ordering::AcqRel) + n > shared.bound {
            shared.gave_up.store(true, Ordering::Relaxed);
            shared.held.fetch_sub(n, Ordering::AcqRel);
            return;
        }
        let run = Run {
            first,
            frames,
            bytes: Arc::clone(bytes),
            range,
        };
        if self.sender.send(run).is_err() {
            shared.gave_up.store(true, Ordering::Relaxed);
        }
    }
}

/// Runs `work` with a [`Feed`] while a second thread hashes `file` (opened
/// from `path`) and, when `array`, the runs `work` gives it, holding at
/// most `bound` bytes of runs waiting for an earlier one.
pub(super) fn while_writing<R>(
    file: &QemFile,
    path: &Path,
    array: bool,
    bound: usize,
    work: impl FnOnce(&Feed<'_>) -> R,
) -> (R, Identities) {
    let (sender, runs) = mpsc::channel::<Run>();
    let shared = Shared {
        array,
        held: AtomicUsize::new(0),
        bound,
        gave_up: AtomicBool::new(false),
    };
    std::thread::scope(|scope| {
        let feed = &shared;
        let hasher = scope.spawn(move || {
            let mut digest = file.file_digest();
            let mut file_done = false;
            let mut array_digest = Sha256::new();
            let mut next = 0usize;
            let mut waiting: BTreeMap<usize, Run> = BTreeMap::new();
            loop {
                let run = match runs.try_recv() {
                    Ok(run) => run,
                    Err(TryRecvError::Empty) if !file_done => {
                        file_done = digest.step(FILE_PIECE);
                        continue;
                    }
                    Err(TryRecvError::Empty) => match runs.recv() {
                        Ok(run) => run,
                        Err(_) => break,
                    },
                    Err(TryRecvError::Disconnected) => break,
                };
                if feed.gave_up.load(Ordering::Relaxed) {
                    for r in std::iter::once(run).chain(std::mem::take(&mut waiting).into_values())
                    {
                        feed.held.fetch_sub(r.range.len(), Ordering::AcqRel);
                    }
                    continue;
                }
                waiting.insert(run.first, run);
                while let Some(run) = waiting.remove(&next) {
                    array_digest.update(&run.bytes[run.range.clone()]);
                    next += run.frames;
                    feed.held.fetch_sub(run.range.len(), Ordering::AcqRel);
                }
            }
            let complete = array && !feed.gave_up.load(Ordering::Relaxed) && next == file.frames();
            Identities {
                logical: complete.then(|| crate::qem::checksum::hex(&array_digest.finalize())),
                file: digest.finish(path),
            }
        });
        let feed = Feed {
            sender,
            shared: &shared,
        };
        let result = work(&feed);
        // No more runs: the hashing thread finishes once it has these.
        drop(feed);
        let identities = hasher
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        (result, identities)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;

    fn fixture() -> (std::path::PathBuf, QemFile) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/conformance/qem/u8-mixed-13x7.qem");
        let file = QemFile::open(&path).unwrap();
        (path, file)
    }

    /// Gives the file's frames as runs of `run` frames, in `order`, each
    /// frame three bytes of its index.
    fn give_all(feed: &Feed<'_>, frames: usize, run: usize, order: &[usize], pool: &Arc<Pool>) {
        for &k in order {
            let first = k * run;
            let n = run.min(frames - first);
            let bytes: Vec<u8> = (first..first + n).flat_map(|f| [f as u8; 3]).collect();
            let len = bytes.len();
            feed.give(first, n, &Arc::new(Pooled::new(bytes, pool)), 0..len);
        }
    }

    #[test]
    fn runs_out_of_order_hash_as_the_array_in_order() {
        let (path, file) = fixture();
        let frames = file.frames();
        let pool = Arc::new(Pool::new(0));
        let runs = frames.div_ceil(10);
        let mut order: Vec<usize> = (0..runs).collect();
        order.reverse();
        let ((), ids) = while_writing(&file, &path, true, 1 << 20, |feed| {
            give_all(feed, frames, 10, &order, &pool)
        });
        let whole: Vec<u8> = (0..frames).flat_map(|f| [f as u8; 3]).collect();
        assert_eq!(ids.logical, Some(crate::qem::checksum::sha256_hex(&whole)));
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(ids.file, Some(crate::qem::checksum::sha256_hex(&bytes)));
    }

    #[test]
    fn past_the_bound_the_array_digest_is_given_up_not_held() {
        let (path, file) = fixture();
        let frames = file.frames();
        let pool = Arc::new(Pool::new(0));
        // The first frame last: the others wait, past 6 bytes held.
        assert!(frames > 3);
        let order: Vec<usize> = (1..frames).chain([0]).collect();
        let ((), ids) = while_writing(&file, &path, true, 6, |feed| {
            give_all(feed, frames, 1, &order, &pool)
        });
        assert_eq!(ids.logical, None);
        assert!(ids.file.is_some());
        // A run missing: no digest either.
        let ((), ids) = while_writing(&file, &path, true, 1 << 20, |feed| {
            give_all(feed, frames, 1, &order[1..], &pool)
        });
        assert_eq!(ids.logical, None);
    }
}
