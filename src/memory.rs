//! Giving freed memory back to the system: the count of bytes freed since the last time
//! ([`memory_freed`]: connections parking, finished image transforms) and the background service
//! that asks the allocators to return their free pages ([`return_freed_memory`]).

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

/// The allocators keep freed memory in their arenas: glibc (which, once a large block was
/// freed, serves blocks up to 32 MiB from them rather than from fresh mappings), and jemalloc,
/// the binary's allocator, which returns unused pages only some seconds later and only while
/// it keeps allocating. When enough has been freed (thousands of clients going idle together,
/// a burst of image transforms), this asks both, at most once a second and off the async
/// workers, to return the free pages of every arena to the system, so that RSS follows what
/// is really held.
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
            tokio::task::spawn_blocking(return_free_pages);
        }
    }
}

/// Returns the free pages of both allocators: jemalloc's (the binary's Rust heap) and glibc's
/// (the C libraries': libjpeg-turbo, libwebp, zstd; and the Rust heap when the library runs
/// under another binary, such as the tests).
fn return_free_pages() {
    // "arena.4096.purge": 4096 is MALLCTL_ARENAS_ALL, every arena. A no-op when jemalloc
    // serves nothing.
    // SAFETY: a NUL-terminated name, and no old or new value (null pointers, length 0).
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
