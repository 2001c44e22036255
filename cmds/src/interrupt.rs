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
//! The signals are blocked in every thread and taken by one thread of
//! their own with `sigwait(2)`: removing files is not allowed in a signal
//! handler. Only SIGKILL (and a crash) still leave temporaries, which the
//! next run writing the same output removes.

use std::mem::MaybeUninit;

/// The signals that end a run after its temporaries are removed.
const ENDING: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Takes the ending signals from now on. Must be called before the
/// process starts any other thread: threads inherit the blocked signals
/// of the thread that starts them, and a thread started earlier would
/// still be ended by them at once.
pub fn install() {
    // SAFETY: plain signal-set manipulation on a local set.
    let set = unsafe {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        let mut set = set.assume_init();
        for signal in ENDING {
            // One ignored when we started (`nohup`, a background job of a
            // script) stays ignored.
            if !ignored(signal) {
                libc::sigaddset(&mut set, signal);
            }
        }
        set
    };
    // SAFETY: blocks signals of this thread only; `set` is a valid set.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        return;
    }
    let taker = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut signal = 0;
            // SAFETY: `set` and `signal` are valid for the call.
            if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                let _held = qemfs::publish::remove_unpublished();
                end_by(signal);
            }
        });
    if taker.is_err() {
        // No thread to take them: let them end the process as before.
        // SAFETY: as above.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    }
}

/// Whether `signal` is ignored.
fn ignored(signal: libc::c_int) -> bool {
    let mut current = MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: a query (no new action); `current` is written by the call.
    let ok = unsafe { libc::sigaction(signal, std::ptr::null(), current.as_mut_ptr()) } == 0;
    // SAFETY: written by the successful call.
    ok && unsafe { current.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// Ends the process as `signal`'s default action does.
fn end_by(signal: libc::c_int) -> ! {
    // SAFETY: restores the default action, unblocks the signal in this
    // thread and sends it to this thread, which then ends the process.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut one = MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(one.as_mut_ptr());
        let mut one = one.assume_init();
        libc::sigaddset(&mut one, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::raise(signal);
    }
    // Not reached: the signal's default action ends the process.
    std::process::exit(128 + signal)
}
