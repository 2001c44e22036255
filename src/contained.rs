//! A library decoding bytes from an untrusted file may panic on them where
//! it should have returned an error (zarrs 0.23 indexes a shard with an
//! unchecked `offset + size`, which wraps for an index entry near 2^64).
//! [`contained`] runs such a call and turns its panic, on this thread or on
//! the library's worker threads, into an error the caller names the input
//! in, instead of a crash with a backtrace.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// Calls running inside [`contained`] now.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Runs `f`; a panic inside it becomes `Err` with the panic's message.
///
/// While any such call runs, a panic anywhere in the process prints
/// nothing: the call it unwinds through reports it. (Panics outside these
/// calls are printed as Rust prints them.)
pub fn contained<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if ACTIVE.load(Ordering::Acquire) == 0 {
                previous(info);
            }
        }));
    });
    ACTIVE.fetch_add(1, Ordering::AcqRel);
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    ACTIVE.fetch_sub(1, Ordering::AcqRel);
    result.map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string());
        format!("the decoder failed on it ({message})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        let out: Result<(), String> = contained(|| {
            let v: Vec<u8> = vec![1, 2, 3];
            let at = std::hint::black_box(usize::MAX);
            let _ = v[at..].len();
        });
        let err = out.unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        assert_eq!(contained(|| 7), Ok(7));
    }

    #[test]
    fn a_panic_on_a_worker_thread_is_contained_too() {
        let out = contained(|| {
            use rayon::prelude::*;
            (0..64u64)
                .into_par_iter()
                .map(|i| {
                    assert!(i != 40, "entry {i} is corrupt");
                    i
                })
                .sum::<u64>()
        });
        assert_eq!(
            out.unwrap_err(),
            "the decoder failed on it (entry 40 is corrupt)"
        );
    }
}
