//! A fixed set of plain threads taking jobs off one queue: the mount's read
//! workers (`qemfs-fuse`) and the tree's bounded prefetcher
//! ([`crate::tree`]) are both one of these.
//!
//! Plain threads, not rayon tasks: a job may wait on another reader's
//! decode of the same block, and a rayon worker waiting inside a join could
//! be handed that very decode's caller and deadlock. Decoding itself still
//! runs on the rayon pool.
//!
//! A job that panics is caught on its worker: the worker goes on to the
//! next job, so a bug in one read never shrinks the pool (what the job
//! owned, such as a FUSE reply, is dropped, which answers an error).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// A job for a worker.
pub type Job = Box<dyn FnOnce() + Send>;

/// The queue in front of the threads.
enum Queue {
    /// At most this many jobs wait; more are refused.
    Bounded(SyncSender<Job>),
    Unbounded(mpsc::Sender<Job>),
}

/// The threads and their queue. Dropping it lets the threads finish the
/// queued jobs and stop.
pub struct Workers {
    queue: Queue,
}

impl Workers {
    /// Starts `threads` threads named `{name}-{i}` behind a queue of at most
    /// `queued` waiting jobs (`None`: no bound). It stands when at least one
    /// thread started; the error is the last start's when none did.
    pub fn new(name: &str, threads: usize, queued: Option<usize>) -> std::io::Result<Workers> {
        let (queue, receiver) = match queued {
            Some(n) => {
                let (s, r) = mpsc::sync_channel::<Job>(n);
                (Queue::Bounded(s), r)
            }
            None => {
                let (s, r) = mpsc::channel::<Job>();
                (Queue::Unbounded(s), r)
            }
        };
        let receiver = Arc::new(Mutex::new(receiver));
        let mut started = 0;
        let mut failed = None;
        for i in 0..threads {
            let receiver = Arc::clone(&receiver);
            match std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&receiver))
            {
                Ok(_) => started += 1,
                Err(e) => failed = Some(e),
            }
        }
        if started == 0 {
            return Err(failed.unwrap_or_else(|| std::io::Error::other("no worker threads asked")));
        }
        Ok(Workers { queue })
    }

    /// Queues `job`; gives it back unrun when a bounded queue is full or
    /// the threads are gone.
    pub fn try_run(&self, job: Job) -> Result<(), Job> {
        match &self.queue {
            Queue::Bounded(s) => s.try_send(job).map_err(|e| match e {
                TrySendError::Full(job) | TrySendError::Disconnected(job) => job,
            }),
            Queue::Unbounded(s) => s.send(job).map_err(|e| e.0),
        }
    }
}

/// A worker's loop: one job at a time until the queue is dropped.
fn work(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let guard = receiver.lock().unwrap_or_else(|e| e.into_inner());
            guard.recv()
        };
        match job {
            // The job's panic has been reported by the panic hook; what it
            // held is dropped by the unwinding, and nothing it shares with
            // this loop is left half-updated (the loop holds nothing).
            Ok(job) => drop(catch_unwind(AssertUnwindSafe(job))),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// A panicking job leaves its worker alive: the one thread runs the
    /// next job after it.
    #[test]
    fn a_panicking_job_does_not_stop_its_worker() {
        let workers = Workers::new("test-panic", 1, None).unwrap();
        let (done, finished) = channel();
        workers
            .try_run(Box::new(|| panic!("a job's bug")))
            .map_err(|_| ())
            .unwrap();
        workers
            .try_run(Box::new(move || done.send(()).unwrap()))
            .map_err(|_| ())
            .unwrap();
        finished
            .recv_timeout(Duration::from_secs(10))
            .expect("the worker ran the job after the panicking one");
    }

    /// A bounded queue refuses jobs beyond threads + queue and hands them
    /// back unrun.
    #[test]
    fn a_full_bounded_queue_gives_the_job_back() {
        let workers = Workers::new("test-bound", 1, Some(1)).unwrap();
        let (release, gate) = channel::<()>();
        let (started, running) = channel::<()>();
        workers
            .try_run(Box::new(move || {
                started.send(()).unwrap();
                gate.recv().unwrap();
            }))
            .map_err(|_| ())
            .unwrap();
        running.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(workers.try_run(Box::new(|| {})).is_ok(), "one waits");
        assert!(
            workers.try_run(Box::new(|| {})).is_err(),
            "the second is refused"
        );
        release.send(()).unwrap();
    }
}
