//! libheif decodes a HEIC grid (the tiled images phones make) one tile at a time for the calling
//! thread, the pool's worker: the pool's `transform_workers` is what bounds the CPU transforms
//! take. (libheif's default is up to four tiles at once, a new thread for each tile.)
//! Alone in its binary: the test counts the process's threads while it decodes.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_heic_grid_is_decoded_on_the_calling_thread_alone() {
    // 400 tiles of 160×120.
    let src = common::heic_grid(20, 20, (3200, 2400), (3200, 2400));
    let probe = larder::images::sniff::probe(&src).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let before = threads();
    let seen = Arc::clone(&done);
    let watcher = std::thread::spawn(move || {
        let mut most = 0;
        while !seen.load(Ordering::Relaxed) {
            most = most.max(threads());
        }
        most
    });
    let img = larder::images::heif::decode(&src, &probe).unwrap();
    done.store(true, Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert_eq!((img.width, img.height), (3200, 2400));
    // The watcher is one more; libde265 decodes each picture on one worker thread of its own
    // while the caller waits for it (one thread's CPU). libheif's default ran eight: four tiles
    // at once, each with its libde265 worker.
    let extra = most.saturating_sub(before + 1);
    assert!(extra <= 1, "{extra} threads decoded at once");
}
