//! The float codec's whole-array checksum, enforced wherever a whole
//! float array leaves.
//!
//! Float files carry `logical_sha256`, the SHA-256 of the whole decoded
//! array. It is the only check of the decoded float values (body block
//! digests cover the stored bytes, not the decoder's output), so every path
//! that hands out a whole float array (convert to any format, `qem hash`,
//! a full read of `data.npy`) must compare it before the last of it is
//! out, and fail on a mismatch. One verdict per opened file is
//! remembered: a reader that finds a mismatch makes every later whole-array
//! reader of that file fail at once.
//!
//! [`LogicalDigest`] hashes blocks as a sequential reader produces them,
//! so a reader that decodes every block anyway (a conversion, a
//! sequential read of `data.npy`) pays only the hashing;
//! [`QemFile::verify_logical`] decodes whatever it needs itself.

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::checksum::hex;
use super::error::{QemError, Result};
use super::file::QemFile;
use super::header::Codec;

impl QemFile {
    /// `logical_sha256` of a float file (other codecs have none).
    pub fn logical_expected(&self) -> Option<&str> {
        match self.codec() {
            Codec::Float => self.header().logical_sha256.as_deref(),
            _ => None,
        }
    }

    /// The whole-array verdict, if some reader already computed it: the
    /// digest, or the mismatch.
    pub fn logical_verdict(&self) -> Option<Result<String>> {
        self.logical.get().cloned()
    }

    /// Records the digest of the whole decoded array and, for a float
    /// file, compares it with `logical_sha256`. The first recorded verdict
    /// stands (every reader computes the same bytes).
    pub(super) fn record(&self, actual: String) -> Result<String> {
        let Some(expected) = self.logical_expected() else {
            return Ok(actual);
        };
        self.logical
            .get_or_init(|| {
                if actual == expected {
                    Ok(actual)
                } else {
                    Err(QemError::LogicalChecksum {
                        expected: expected.to_string(),
                        actual,
                    })
                }
            })
            .clone()
    }

    /// Decodes the whole array (bounded memory: batches of blocks decoded
    /// in parallel, hashed in order) unless its verdict is known, and
    /// returns the digest of the decoded bytes; a float file whose digest
    /// differs from `logical_sha256` fails with
    /// [`QemError::LogicalChecksum`].
    pub fn verify_logical(&self) -> Result<String> {
        if let Some(known) = self.logical_verdict() {
            return known;
        }
        let mut hasher = Sha256::new();
        let blocks = self.blocks();
        for batch in super::file::block_batches(blocks) {
            if let [info] = &blocks[batch.clone()] {
                if info.decoded_bytes > super::block::WINDOW_BYTES {
                    // A block larger than a window, alone in its batch:
                    // hashed window by window.
                    let mut cursor = self.block_cursor(info.index)?;
                    let w = self.window_frames(info.index);
                    let mut window = Vec::new();
                    while cursor.next_frame() < info.frames {
                        let n = w.min(info.frames - cursor.next_frame());
                        window.resize(n * self.frame_bytes(), 0);
                        cursor.read(self, n, &mut window)?;
                        hasher.update(&window);
                    }
                    continue;
                }
            }
            let dense: Vec<Result<Vec<u8>>> = batch
                .into_par_iter()
                .map(|b| self.decode_block(b))
                .collect();
            for d in dense {
                hasher.update(d?);
            }
        }
        self.record(hex(&hasher.finalize()))
    }

    /// Compares `actual`, the SHA-256 (lowercase hex) of the whole decoded
    /// array that the caller hashed while reading it in order (frames
    /// `0..frames()`, any piece size), as [`verify_logical`](Self::verify_logical)
    /// does without decoding again. Fails on a float mismatch.
    pub fn check_logical(&self, actual: String) -> Result<String> {
        self.record(actual)
    }

    /// A digest to feed with this file's blocks in order.
    pub fn logical_digest(&self) -> LogicalDigest {
        LogicalDigest {
            hasher: Sha256::new(),
            next: 0,
            next_frame: 0,
            done: None,
        }
    }
}

/// The SHA-256 of a file's decoded array, fed block by block in order by
/// a reader that decodes them anyway.
pub struct LogicalDigest {
    hasher: Sha256,
    next: usize,
    /// The next frame of block `next` (a window reader feeds pieces).
    next_frame: usize,
    /// The digest, once the last block was fed.
    done: Option<String>,
}

impl LogicalDigest {
    /// The block this digest needs next.
    pub fn next_block(&self) -> usize {
        self.next
    }

    /// The frame of [`next_block`](Self::next_block) it needs next.
    pub fn next_frame(&self) -> usize {
        self.next_frame
    }

    /// Feeds the decoded bytes of block `index` of `file`. A block already
    /// fed is ignored, and so is one past a gap (the digest then needs
    /// [`finish`](Self::finish) to decode the rest). Feeding the last block
    /// records the verdict and fails on a float mismatch.
    pub fn feed(&mut self, file: &QemFile, index: usize, dense: &[u8]) -> Result<()> {
        let frames = file.blocks().get(index).map_or(0, |b| b.frames);
        self.feed_window(file, index, 0..frames, dense)
    }

    /// As [`feed`](Self::feed), for the decoded bytes of frames `frames`
    /// (block-relative) of block `index`: a window of a block decoded in
    /// windows. A window that does not start where the digest stands is
    /// ignored.
    pub fn feed_window(
        &mut self,
        file: &QemFile,
        index: usize,
        frames: std::ops::Range<usize>,
        dense: &[u8],
    ) -> Result<()> {
        if index != self.next || frames.start != self.next_frame || frames.is_empty() {
            return Ok(());
        }
        self.hasher.update(dense);
        self.next_frame = frames.end;
        if file
            .blocks()
            .get(index)
            .is_some_and(|b| frames.end < b.frames)
        {
            return Ok(());
        }
        self.next_frame = 0;
        self.next += 1;
        if self.next == file.blocks().len() {
            let actual = hex(&std::mem::take(&mut self.hasher).finalize());
            self.done = Some(actual.clone());
            file.record(actual)?;
        }
        Ok(())
    }

    /// The digest of the whole array: from the blocks fed when they were
    /// all fed in order (or the known verdict), else by
    /// [`QemFile::verify_logical`]. Fails on a float mismatch.
    pub fn finish(self, file: &QemFile) -> Result<String> {
        match self.done {
            Some(actual) => file.record(actual),
            None => file.verify_logical(),
        }
    }
}
