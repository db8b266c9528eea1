//! Heap bytes held per idle keep-alive connection, counted by a wrapping global allocator
//! (exact, unlike RSS). Also prints the sizes of the live allocations an idle connection adds.
//! The test bed's raw connections hold no buffer between responses, so the count includes the
//! client's side at the cost of its sockets alone.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::*;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);
static SIZES: Mutex<Vec<(usize, isize)>> = Mutex::new(Vec::new());

thread_local! {
    static IN_TRACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn trace(size: usize, delta: isize) {
    if TRACE.load(Ordering::Relaxed) && !IN_TRACE.with(|t| t.replace(true)) {
        if let Ok(mut v) = SIZES.try_lock() {
            match v.iter_mut().find(|(s, _)| *s == size) {
                Some((_, n)) => *n += delta,
                None => v.push((size, delta)),
            }
        }
        IN_TRACE.with(|t| t.set(false));
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        trace(l.size(), 1);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        trace(l.size(), -1);
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        trace(l.size(), -1);
        trace(new, 1);
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// The tests count the same process-wide heap: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "current_thread")]
async fn heap_per_idle_keepalive_connection() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (h, addr, _dir) = warm_server("100ms", 512).await;
    const N: usize = 500;
    let before = LIVE.load(Ordering::Relaxed);
    TRACE.store(true, Ordering::Relaxed);
    let conns = futures_util_join(addr, N, open).await;
    // Idle past `idle_release` (the first watchdog tick sees the request, the second releases).
    tokio::time::sleep(Duration::from_millis(500)).await;
    TRACE.store(false, Ordering::Relaxed);
    let after = LIVE.load(Ordering::Relaxed);
    // The client's own streams are counted too; they are small (a tokio TcpStream, an empty
    // buffer).
    let per = (after - before) as f64 / N as f64;
    let mut sizes: Vec<(usize, isize)> = SIZES
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|(_, n)| *n >= N as isize / 2)
        .collect();
    sizes.sort();
    println!("heap per idle connection (server + client stream): {per:.0} bytes");
    for (size, n) in &sizes {
        println!("  {size:>6} bytes x {n}");
    }
    assert!(h.open_connections() >= N);
    // Before release, about 24 KB in a debug build (two 8 KiB hyper buffers, the task, small
    // bookkeeping). Released, a connection is its task and its socket registration: under
    // 2 KiB, client stream included (1,465 bytes in a debug build since the task is a future
    // written by hand, `ServeH1`; 2,521 before, 2,777 when it held the stream and service
    // twice). See docs/benchmarks.md, "Idle connections".
    assert!(per < 2.0 * 1024.0, "{per}");
    // Released connections still serve, and keep serving.
    let mut conns = conns;
    for s in conns.iter_mut().take(20) {
        for _ in 0..2 {
            assert_eq!(request_on(s).await, 200);
        }
    }
    drop(conns);
}

/// A one-worker static server with the 100-byte file, warmed up (the file loaded, the
/// runtime's structures grown), with the given `idle_release` and
/// `release_above_connections`.
async fn warm_server(
    idle_release: &str,
    release_above: usize,
) -> (Larder, std::net::SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("small.html"), "x".repeat(100)).unwrap();
    let server = format!(
        "workers = 1\nidle_release = \"{idle_release}\"\nrelease_above_connections = {release_above}"
    );
    let h = Larder::start(&static_files(dir.path(), "", &server)).await;
    let addr = h.addr;
    let warm: Vec<Raw> = futures_util_join(addr, 50, open).await;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(200)).await;
    (h, addr, dir)
}

/// A connection that has been answered once.
async fn open(addr: std::net::SocketAddr) -> Raw {
    let mut s = Raw::connect(addr).await;
    assert_eq!(request_on(&mut s).await, 200);
    s
}

/// Heap per open connection right after each has been answered once (well before
/// `idle_release`), with `release_above_connections` at `bound`.
async fn heap_right_after_a_response(bound: usize) -> f64 {
    let _one = ONE_AT_A_TIME.lock().await;
    let (h, addr, _dir) = warm_server("30s", bound).await;
    const N: usize = 300;
    let before = LIVE.load(Ordering::Relaxed);
    let conns = futures_util_join(addr, N, open).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let per = (LIVE.load(Ordering::Relaxed) - before) as f64 / N as f64;
    assert!(h.open_connections() >= N);
    drop(conns);
    per
}

#[tokio::test(flavor = "current_thread")]
async fn above_the_bound_connections_hold_no_buffers_between_requests() {
    // Below the bound, an open connection keeps hyper's buffers between requests (about
    // 24 KB in a debug build); above it, it gives them back after every response.
    let kept = heap_right_after_a_response(100_000).await;
    let released = heap_right_after_a_response(10).await;
    println!("heap per connection after a response: {kept:.0} bytes kept, {released:.0} released");
    assert!(kept > 16.0 * 1024.0, "{kept}");
    assert!(released < 4.0 * 1024.0, "{released}");
}

async fn request_on(s: &mut Raw) -> u16 {
    s.write(b"GET /small.html HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    let r = s.response().await;
    assert_eq!(r.body.len(), 100);
    r.status
}

async fn futures_util_join<F, Fut>(addr: std::net::SocketAddr, n: usize, f: F) -> Vec<Raw>
where
    F: Fn(std::net::SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Raw>,
{
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(f(addr).await);
    }
    v
}

/// An SSE subscriber of a push route, once its connection is handed over after the head,
/// holds its task, socket and ring receiver: no hyper buffer, nor a slice of one.
#[tokio::test(flavor = "current_thread")]
async fn heap_per_idle_push_subscriber() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_route(
        "[server]\nworkers = 1",
        "push",
        &format!("dir = \"{}\"\ntoken = \"t\"", dir.path().display()),
    );
    let h = Larder::start(&cfg).await;
    let addr = h.addr;
    let subscribe = |addr| async move {
        let mut s = Raw::connect(addr).await;
        s.write(b"GET /?subscribe HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        s.read_until(|b| String::from_utf8_lossy(b).contains("event: init"))
            .await;
        s
    };
    // Warm: the topic, the runtime's structures.
    let warm = futures_util_join(addr, 20, subscribe).await;
    drop(warm);
    tokio::time::sleep(Duration::from_millis(200)).await;
    const N: usize = 500;
    let before = LIVE.load(Ordering::Relaxed);
    let subs = futures_util_join(addr, N, subscribe).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let per = (LIVE.load(Ordering::Relaxed) - before) as f64 / N as f64;
    println!("heap per idle push subscriber (server + client stream): {per:.0} bytes");
    assert_eq!(h.open_connections(), N);
    // Before the read-ahead slice was copied out, 8 KiB of hyper's read buffer stayed with
    // every subscriber.
    assert!(per < 3.0 * 1024.0, "{per}");
    drop(subs);
}
