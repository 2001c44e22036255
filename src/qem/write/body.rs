//! The body as it is produced (spec §2): its layout (offsets, length) is
//! decided here as chunks are encoded, while its bytes are hashed per
//! 64 MiB checksum block and spooled ([`super::spool`]) on threads of their
//! own. One chunk is hashed and spooled while the next is encoded; before,
//! these two serial streams held up the encoder for about half of a float
//! import.

use std::io;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::publish::io_error;
use super::spool::Spool;
use super::WriteError;
use crate::pool::Pool;
use crate::qem::checksum::hex;
use crate::qem::checksum::CHECKSUM_BLOCK;

/// Where the body's bytes go.
pub(super) enum Sink {
    /// The output's temporary file, and its name for errors.
    Spool(Spool, PathBuf),
    Memory(Vec<u8>),
}

impl Sink {
    fn write(&mut self, pieces: &[Vec<u8>]) -> Result<(), WriteError> {
        match self {
            Sink::Spool(spool, path) => spool.write(pieces).map_err(|e| io_error(path, e)),
            Sink::Memory(v) => {
                for p in pieces {
                    v.extend_from_slice(p);
                }
                Ok(())
            }
        }
    }
}

/// The `sha256` list (spec §2 rule 5): one digest per 64 MiB of body, the
/// last block possibly shorter.
#[derive(Default)]
struct Blocks {
    block: Sha256,
    filled: usize,
    digests: Vec<Value>,
}

impl Blocks {
    fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = CHECKSUM_BLOCK - self.filled;
            let (now, rest) = data.split_at(room.min(data.len()));
            self.block.update(now);
            self.filled += now.len();
            if self.filled == CHECKSUM_BLOCK {
                let digest = std::mem::take(&mut self.block).finalize();
                self.digests.push(Value::String(hex(&digest)));
                self.filled = 0;
            }
            data = rest;
        }
    }

    fn finish(mut self) -> Vec<Value> {
        if self.filled > 0 {
            self.digests
                .push(Value::String(hex(&self.block.finalize())));
        }
        self.digests
    }
}

/// Pieces smaller than this are not kept for reuse (count streams shrink
/// theirs to what they hold).
const RECYCLE_MIN: usize = 4096;
/// Bytes of written pieces kept for reuse: a float chunk's payload.
const RECYCLE_BYTES: usize = 8 << 20;

/// Payload buffers the body's thread has written, handed back to the
/// encoder: a chunk's pieces reuse the pages of the chunk before instead of
/// faulting in fresh ones (the allocator returns freed pieces to the
/// system between chunks; on a float import those faults were ~6% of the
/// CPU time).
pub(super) type Recycled = Arc<Pool>;

/// What the body's thread hands back at the end.
pub(super) struct Written {
    pub sink: Sink,
    pub digests: Vec<Value>,
}

fn work(
    pieces: Receiver<Vec<Vec<u8>>>,
    mut sink: Sink,
    recycled: Recycled,
) -> Result<Written, WriteError> {
    let mut blocks = Blocks::default();
    for batch in pieces {
        // Hashing and writing are two serial streams over the same bytes:
        // they run side by side.
        let written = std::thread::scope(|s| {
            let writing = s.spawn(|| sink.write(&batch));
            for piece in &batch {
                blocks.update(piece);
            }
            writing.join()
        });
        // On an error the receiver is dropped, so the next send fails and
        // the writer collects this error.
        written.unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        for piece in batch {
            if piece.capacity() >= RECYCLE_MIN {
                recycled.give(piece);
            }
        }
    }
    Ok(Written {
        sink,
        digests: blocks.finish(),
    })
}

pub(super) struct Body {
    /// Bytes laid out so far.
    pub len: u64,
    /// Pieces of the chunk being laid out, in body order.
    batch: Vec<Vec<u8>>,
    sender: Option<SyncSender<Vec<Vec<u8>>>>,
    worker: Option<JoinHandle<Result<Written, WriteError>>>,
    /// Written pieces, for the encoder to fill again.
    pub recycled: Recycled,
}

impl Body {
    pub fn start(sink: Sink) -> Result<Body, WriteError> {
        // A rendezvous channel: the thread holds the chunk it is writing and
        // the encoder the one it is building, no more (memory stays bounded
        // by two chunks' encoded bytes).
        let (sender, receiver) = sync_channel(0);
        let recycled = Arc::new(Pool::new(RECYCLE_BYTES));
        let given = recycled.clone();
        let worker = std::thread::Builder::new()
            .name("qem-body".into())
            .spawn(move || work(receiver, sink, given))
            .map_err(|e| io_error(&PathBuf::from("<body writer thread>"), e))?;
        Ok(Body {
            len: 0,
            batch: Vec::new(),
            sender: Some(sender),
            worker: Some(worker),
            recycled,
        })
    }

    /// Appends `piece` to the body.
    pub fn put(&mut self, piece: Vec<u8>) {
        if !piece.is_empty() {
            self.len += piece.len() as u64;
            self.batch.push(piece);
        }
    }

    /// Zero bytes up to the next multiple of 8; returns the aligned offset.
    pub fn align8(&mut self) -> u64 {
        let pad = (8 - self.len % 8) % 8;
        self.put(vec![0; pad as usize]);
        self.len
    }

    /// Hands the pieces laid out so far to the body's thread (once per
    /// chunk); waits while it is still busy with the previous ones.
    pub fn send(&mut self) -> Result<(), WriteError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let sent = self.sender.as_ref().map(|s| s.send(batch));
        match sent {
            Some(Ok(())) => Ok(()),
            // The thread stopped on an error: report it.
            _ => match self.finish() {
                Err(e) => Err(e),
                Ok(_) => Err(io_error(
                    &PathBuf::from("<body writer thread>"),
                    io::Error::other("stopped before the body was complete"),
                )),
            },
        }
    }

    /// Everything written: the sink and the `sha256` list.
    pub fn finish(&mut self) -> Result<Written, WriteError> {
        if !self.batch.is_empty() {
            self.send()?;
        }
        drop(self.sender.take());
        let Some(worker) = self.worker.take() else {
            return Err(WriteError::WrongFinish);
        };
        match worker.join() {
            Ok(written) => written,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Body {
    /// A writer dropped unfinished (an error elsewhere) lets its thread end
    /// before the spool it writes to is removed.
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_cover_64_mib_blocks_across_pieces() {
        let data: Vec<u8> = (0..(CHECKSUM_BLOCK + 1000))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut body = Body::start(Sink::Memory(Vec::new())).unwrap();
        // Pieces that straddle the block boundary, in two batches.
        let (a, b) = data.split_at(CHECKSUM_BLOCK - 3);
        body.put(a[..10].to_vec());
        body.put(a[10..].to_vec());
        body.send().unwrap();
        body.put(b.to_vec());
        assert_eq!(body.len, data.len() as u64);
        let written = body.finish().unwrap();
        let Sink::Memory(bytes) = written.sink else {
            panic!("memory sink")
        };
        assert_eq!(bytes, data);
        let expected: Vec<Value> = data
            .chunks(CHECKSUM_BLOCK)
            .map(|c| Value::String(hex(&Sha256::digest(c))))
            .collect();
        assert_eq!(written.digests, expected);
    }

    #[test]
    fn written_pieces_come_back_for_reuse() {
        let mut body = Body::start(Sink::Memory(Vec::new())).unwrap();
        let piece = vec![7u8; 3 * RECYCLE_MIN];
        let at = piece.as_ptr();
        body.put(piece);
        body.put(vec![1u8; 10]);
        body.send().unwrap();
        let Sink::Memory(bytes) = body.finish().unwrap().sink else {
            panic!("memory sink")
        };
        assert_eq!(bytes.len(), 3 * RECYCLE_MIN + 10);
        // The large piece is handed out again, emptied; the small one was
        // not kept, so the next request gets a fresh buffer.
        let again = body.recycled.take(2 * RECYCLE_MIN);
        assert!(again.is_empty() && again.capacity() >= 3 * RECYCLE_MIN);
        assert_eq!(again.as_ptr(), at);
        assert_eq!(
            body.recycled.take_stale(10),
            vec![0u8; 10],
            "the small piece was not kept"
        );
    }
}
