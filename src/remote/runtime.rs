//! The asynchronous runtime under the stores' clients.
//!
//! The readers are synchronous (rayon workers, FUSE threads, the commands'
//! main thread); each request batch is run to completion with
//! [`block_on`] from whichever thread needs it. Two worker threads drive
//! the sockets: the work is waiting, not computing.

use std::future::Future;
use std::sync::OnceLock;

fn runtime() -> Result<&'static tokio::runtime::Runtime, &'static str> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("qemfs-remote")
                .enable_all()
                .build()
                .map_err(|e| format!("cannot start the threads for remote reads: {e}"))
        })
        .as_ref()
        .map_err(String::as_str)
}

/// Runs `future` to completion on the shared runtime, from a thread that
/// is not one of its own; `Err` when the system refused its threads.
pub(crate) fn block_on<F: Future>(future: F) -> Result<F::Output, &'static str> {
    Ok(runtime()?.block_on(future))
}
