//! Giving freed memory back to the system: the count of bytes freed since the last time
//! ([`memory_freed`]: connections parking, finished image transforms) and the background service
//! that asks glibc to return its free pages ([`return_freed_memory`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// Bytes freed since freed memory was last returned: buffers of connections going idle, and
/// the working memory of finished image transforms.
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// What an idle connection gives back (its read and write buffers).
const CONNECTION_BUFFERS: usize = 16 << 10;

/// Notes that an idle connection gave its buffers back.
#[inline]
pub fn connection_released() {
    RELEASED.fetch_add(CONNECTION_BUFFERS, Ordering::Relaxed);
}

/// Notes `bytes` of heap freed (e.g. an image transform's buffers), for `return_freed_memory`.
pub fn memory_freed(bytes: u64) {
    let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    RELEASED.fetch_add(bytes, Ordering::Relaxed);
}

/// glibc keeps freed memory in its arenas (and, once a large block was freed, serves blocks up
/// to 32 MiB from them rather than from fresh mappings). When enough has been freed (thousands
/// of clients going idle together, a burst of image transforms), this asks it, at most once a
/// second and off the async workers, to return the free pages of every arena to the system, so
/// that RSS follows what is really held.
pub async fn return_freed_memory(mut shutdown: watch::Receiver<bool>) {
    const ENOUGH: usize = 4 << 20;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if RELEASED.load(Ordering::Relaxed) >= ENOUGH {
            RELEASED.store(0, Ordering::Relaxed);
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            tokio::task::spawn_blocking(|| {
                // SAFETY: malloc_trim only returns free pages; it has no preconditions.
                unsafe { libc::malloc_trim(0) };
            });
        }
    }
}
