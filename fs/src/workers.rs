//! A fixed set of plain threads answering reads.
//!
//! Not a rayon pool on purpose: a read may wait for another reader's decode
//! of the same block, and a rayon worker blocked inside a join can be handed
//! a task that waits on itself. Decoding still runs on rayon's pool.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

pub struct Workers {
    sender: Mutex<Sender<Job>>,
}

impl Workers {
    pub fn new(count: usize) -> std::io::Result<Workers> {
        let (sender, receiver) = channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        for i in 0..count.max(1) {
            let receiver = Arc::clone(&receiver);
            std::thread::Builder::new()
                .name(format!("qemfs-read-{i}"))
                .spawn(move || loop {
                    let job = {
                        let guard = receiver.lock().unwrap_or_else(|e| e.into_inner());
                        guard.recv()
                    };
                    match job {
                        Ok(job) => job(),
                        // The filesystem is gone: stop.
                        Err(_) => return,
                    }
                })?;
        }
        Ok(Workers {
            sender: Mutex::new(sender),
        })
    }

    /// Runs `job` on a worker; if the workers are gone it runs here.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(returned) = sender.send(Box::new(job)) {
            drop(sender);
            (returned.0)();
        }
    }
}
