//! The signals that end a run: SIGINT (Ctrl-C), SIGTERM (`kill`) and
//! SIGHUP (a closed terminal), taken by a thread that waits for them.
//!
//! Both the mount daemon (which unmounts) and the `qem`/`semq` commands
//! (which remove their temporaries, see [`crate::publish`]) have work to do
//! before they end, and neither may do it in a signal handler. So the
//! signals are blocked in every thread and one thread takes them with
//! `sigwait(2)` or `sigtimedwait(2)`.

use std::mem::MaybeUninit;

/// The signals that end a run.
pub const ENDING: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Blocks the ending signals in the calling thread, and so in every
/// thread it starts afterwards, and returns the set blocked, for the
/// thread that waits for them. Call it before any other thread starts: a
/// thread started earlier would still be ended by them at once.
///
/// A signal that was ignored when the process started (`nohup`, a
/// background job of a script) stays ignored and is left out of the set.
/// Returns `None` when the signals could not be blocked (then they end
/// the process as before).
pub fn block_ending() -> Option<libc::sigset_t> {
    // SAFETY: plain signal-set manipulation on a local set.
    let set = unsafe {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        let mut set = set.assume_init();
        for signal in ENDING {
            if !ignored(signal) {
                libc::sigaddset(&mut set, signal);
            }
        }
        set
    };
    // SAFETY: blocks signals of this thread only; `set` is a valid set.
    let blocked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    (blocked == 0).then_some(set)
}

/// Unblocks `set` again in the calling thread (for a process that found
/// no thread to take the signals).
pub fn unblock(set: &libc::sigset_t) {
    // SAFETY: unblocks signals of this thread only; `set` is a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, set, std::ptr::null_mut()) };
}

/// Whether `signal` is ignored.
fn ignored(signal: libc::c_int) -> bool {
    let mut current = MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: a query (no new action); `current` is written by the call.
    let ok = unsafe { libc::sigaction(signal, std::ptr::null(), current.as_mut_ptr()) } == 0;
    // SAFETY: written by the successful call.
    ok && unsafe { current.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// Ends the process as `signal`'s default action does, so that shells and
/// schedulers see the status they expect (130 for Ctrl-C).
pub fn end_by(signal: libc::c_int) -> ! {
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
