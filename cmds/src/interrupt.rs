//! Interrupted runs (Ctrl-C, `kill`, a closed terminal) leave no
//! temporaries behind.
//!
//! Outputs are written under temporary names and published whole (see
//! `qemfs::publish`), so a run killed at any point leaves no partial file
//! under a final name. A run ended by SIGINT, SIGTERM or SIGHUP also
//! removes its temporaries before it ends, where before they stayed until
//! the same output was next written: a 20 GB conversion stopped with
//! Ctrl-C no longer leaves gigabytes in a hidden file. It then ends as the
//! signal would have ended it, so that shells and schedulers see the same
//! status as before (130 for Ctrl-C).
//!
//! The signals are taken by a thread of their own (`qemfs::signals`):
//! removing files is not allowed in a signal handler. Only SIGKILL (and a
//! crash) still leave temporaries, which the next run writing the same
//! output removes.

use qemfs::signals;

/// Takes the ending signals from now on. Must be called before the
/// process starts any other thread (see `signals::block_ending`).
pub fn install() {
    let Some(set) = signals::block_ending() else {
        return;
    };
    let taker = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut signal = 0;
            // SAFETY: `set` and `signal` are valid for the call.
            if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                let _held = qemfs::publish::remove_unpublished();
                signals::end_by(signal);
            }
        });
    if taker.is_err() {
        // No thread to take them: let them end the process as before.
        signals::unblock(&set);
    }
}
