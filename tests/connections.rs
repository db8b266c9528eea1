//! Connection-level limits: the accept loop survives running out of file descriptors, the
//! max-connections bound pauses accepting until a connection closes, and idle keep-alive
//! connections release their buffers yet keep serving (read-ahead included) until the idle
//! timeout closes them; with many connections open, they release them after every response.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// One GET on `s`; the status code, or None if nothing came back in time.
async fn get_on(s: &mut Raw, path: &str) -> Option<u16> {
    s.try_write(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n"))
        .await
        .ok()?;
    next_response(s).await.map(|(status, _)| status)
}

/// Reads one response from `s` (pipelined responses may follow): its status and body length,
/// or None if it did not come whole within 10 s. Panics if the response announces that the
/// connection closes.
async fn next_response(s: &mut Raw) -> Option<(u16, usize)> {
    let r = s.try_response(Duration::from_secs(10)).await?;
    assert!(
        !r.head.to_ascii_lowercase().contains("connection: close"),
        "{}",
        r.head
    );
    Some((r.status, r.body.len()))
}

/// larder serving `a.txt` ("hello") from the directory returned, with `server_keys` in its
/// `[server]` table.
async fn hello_files(server_keys: &str) -> (Larder, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let larder = Larder::start(&static_files(dir.path(), "", server_keys)).await;
    (larder, dir)
}

/// A larder process with one worker serving `a.txt` ("hello") from the directory returned.
fn lone_worker_serving_hello() -> (tempfile::TempDir, std::net::SocketAddr, Child) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let addr = free_port();
    let mut cmd = larder_command();
    cmd.args([
        "--root",
        dir.path().to_str().unwrap(),
        "--listen",
        &addr.to_string(),
    ])
    .args(["--workers", "1"])
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    (dir, addr, Child(cmd.spawn().unwrap()))
}

/// A connection to `addr` on which `/a.txt` was answered, once the process has started.
async fn first_answered(addr: std::net::SocketAddr) -> Raw {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = Raw::try_connect(addr).await {
            if get_on(&mut s, "/a.txt").await == Some(200) {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "larder did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn accept_loop_survives_running_out_of_file_descriptors() {
    let (_dir, addr, mut child) = lone_worker_serving_hello();
    let mut first = first_answered(addr).await;

    // larder fits max_connections to its open-files limit at start, so accepting pauses at the
    // bound before descriptors run out. Descriptors can still run out (upstream connections and
    // files take them too, or the limit is lowered under a running process): lower it to 40
    // now, then send far more connections than descriptors. The kernel completes the
    // handshakes, larder accepts until EMFILE and must keep going.
    let lim = libc::rlimit {
        rlim_cur: 40,
        rlim_max: 40,
    };
    // SAFETY: prlimit on our own child with a valid rlimit and no old-limit pointer.
    let set = unsafe {
        libc::prlimit(
            child.0.id() as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let mut flood = Vec::new();
    for _ in 0..120 {
        if let Ok(s) = Raw::try_connect(addr).await {
            flood.push(s);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(child.0.try_wait().unwrap().is_none(), "larder exited");
    // A connection accepted before the exhaustion is still served.
    assert_eq!(get_on(&mut first, "/a.txt").await, Some(200));
    // Some of the flood could not be accepted (no response), proving we hit the limit.
    let mut unanswered = 0;
    for s in flood.iter_mut().rev().take(20) {
        s.write(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let answer = s.read_some(Duration::from_millis(100)).await;
        if !matches!(answer, Some(Ok(b)) if !b.is_empty()) {
            unanswered += 1;
        }
    }
    assert!(unanswered > 0, "the descriptor limit was never reached");

    // Free the descriptors: new connections are served again.
    flood.clear();
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = Raw::try_connect(addr).await {
            if get_on(&mut s, "/a.txt").await == Some(200) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "larder never recovered from EMFILE"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(child.0.try_wait().unwrap().is_none(), "larder exited");
}

#[tokio::test(flavor = "multi_thread")]
async fn at_max_connections_accepting_pauses_until_one_closes() {
    let (h, _dir) = hello_files("max_connections = 4").await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(Raw::connect(h.addr).await);
    }
    for s in &mut held {
        assert_eq!(get_on(s, "/a.txt").await, Some(200));
    }
    // The fifth connects (kernel backlog) but is not served while four are open.
    let mut fifth = Raw::connect(h.addr).await;
    fifth.write(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert!(
        fifth.read_some(Duration::from_millis(400)).await.is_none(),
        "served beyond the bound"
    );
    // One closes: the fifth is accepted and answered.
    held.pop();
    let b = fifth
        .read_some(Duration::from_millis(3000))
        .await
        .expect("an answer")
        .unwrap();
    assert!(b.starts_with(b"HTTP/1.1 200"));
}

/// HTTP/2 connections (h2c, prior knowledge) hold their place under the bound as long as they
/// are open, like HTTP/1.1 ones.
#[tokio::test(flavor = "multi_thread")]
async fn http2_connections_count_against_max_connections() {
    let (h, _dir) = hello_files("max_connections = 2").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = Raw::connect(h.addr).await;
        // The preface and an empty SETTINGS frame: the server answers with its own SETTINGS.
        s.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await;
        assert!(
            s.read_some(Duration::from_millis(3000)).await.is_some(),
            "no HTTP/2 SETTINGS"
        );
        held.push(s);
    }
    let mut third = Raw::connect(h.addr).await;
    third.write(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert!(
        third.read_some(Duration::from_millis(400)).await.is_none(),
        "served beyond the bound while two HTTP/2 connections are open"
    );
    held.pop();
    let b = third
        .read_some(Duration::from_millis(3000))
        .await
        .expect("an answer")
        .unwrap();
    assert!(b.starts_with(b"HTTP/1.1 200"));
}

/// A server whose connections release their buffers after 100 ms idle and close after 700 ms.
async fn releasing_server() -> (Larder, tempfile::TempDir) {
    hello_files("idle_release = \"100ms\"\nidle_timeout = \"700ms\"").await
}

#[tokio::test(flavor = "multi_thread")]
async fn released_connection_serves_again_and_keeps_a_split_request_head() {
    let (h, _dir) = releasing_server().await;
    let mut s = Raw::connect(h.addr).await;
    assert_eq!(get_on(&mut s, "/a.txt").await, Some(200));
    // Idle past the release: the same connection serves the next request.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(get_on(&mut s, "/a.txt").await, Some(200));
    // Half a request head, then a pause long enough for a release, then the rest: the bytes
    // hyper had read ahead are replayed to the next connection state, nothing is lost.
    s.write(b"GET /a.txt HTTP/1.1\r\nHo").await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    s.write(b"st: t\r\n\r\n").await;
    let b = s
        .read_some(Duration::from_secs(2))
        .await
        .expect("an answer");
    let text = String::from_utf8_lossy(&b.unwrap()).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("hello"), "{text}");
    // Pipelined requests right after a release both get answers, in order.
    tokio::time::sleep(Duration::from_millis(350)).await;
    s.write(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\nGET /missing HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    let got = s
        .read_until(|got| String::from_utf8_lossy(got).contains("HTTP/1.1 404"))
        .await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread")]
async fn released_connection_is_closed_at_the_idle_timeout() {
    let (h, _dir) = releasing_server().await;
    let mut s = Raw::connect(h.addr).await;
    assert_eq!(get_on(&mut s, "/a.txt").await, Some(200));
    let start = Instant::now();
    // EOF (nothing) once the idle timeout passes, not before the release or at once.
    let b = s.read_some(Duration::from_secs(5)).await.expect("closed");
    assert_eq!(b.unwrap(), b"");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
    assert!(waited < Duration::from_millis(2500), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_closes_idle_keepalive_connections_and_reports_none_left() {
    // Default idle settings: a keep-alive connection would otherwise stay open for 60 s.
    let (h, _dir) = hello_files("").await;
    // One connection in hyper's hands (a request just served), one released (idle past 1 s).
    let mut released = Raw::connect(h.addr).await;
    assert_eq!(get_on(&mut released, "/a.txt").await, Some(200));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let mut fresh = Raw::connect(h.addr).await;
    assert_eq!(get_on(&mut fresh, "/a.txt").await, Some(200));
    // Both are closed by the shutdown, which so finds no connection left open.
    assert_eq!(h.shutdown().await, 0);
    for s in [&mut fresh, &mut released] {
        let b = s.read_some(Duration::from_secs(5)).await.expect("closed");
        assert_eq!(b.unwrap(), b"", "connection left open");
    }
}

/// CPU time this process has used (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[tokio::test(flavor = "multi_thread")]
async fn above_the_bound_connections_release_after_every_response_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    // Larger than the in-memory limit: streamed from disk in chunks.
    let big = 3 * 1024 * 1024 + 17;
    std::fs::write(dir.path().join("big.bin"), vec![7u8; big]).unwrap();
    // Every connection releases after each response; never because it idled.
    let server = "release_above_connections = 0\nidle_release = \"0s\"";
    let h = Larder::start(&static_files(dir.path(), "", server)).await;
    let mut s = Raw::connect(h.addr).await;
    for _ in 0..50 {
        assert_eq!(get_on(&mut s, "/a.txt").await, Some(200));
    }
    // A streamed body is written whole before the connection lets go of hyper.
    s.write(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert_eq!(next_response(&mut s).await, Some((200, big)));
    assert_eq!(get_on(&mut s, "/a.txt").await, Some(200));
    // Pipelined requests in one write: both answered, in order.
    s.write(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    assert_eq!(next_response(&mut s).await, Some((200, 5)));
    assert_eq!(next_response(&mut s).await.map(|r| r.0), Some(404));
    // Half a head, then a pause: the connection waits for the rest without spinning on the
    // bytes it read ahead, then answers.
    s.write(b"GET /a.txt HTTP/1.1\r\nHo").await;
    let cpu = cpu_time();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let spent = cpu_time() - cpu;
    assert!(
        spent < Duration::from_millis(150),
        "busy while waiting: {spent:?}"
    );
    s.write(b"st: t\r\n\r\n").await;
    assert_eq!(next_response(&mut s).await, Some((200, 5)));
    // A request body the handler never reads, sent in two parts: hyper ends the connection
    // after the answer; the rest of the body is never taken for a request.
    s.write(b"POST /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
        .await;
    let got = s
        .read_some(Duration::from_secs(2))
        .await
        .expect("an answer");
    assert!(got.unwrap().starts_with(b"HTTP/1.1 405"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = s
        .try_write(b"67890GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    let rest = s.read_to_end(Duration::from_secs(2)).await;
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    let mut s = Raw::connect(h.addr).await;
    assert_eq!(get_on(&mut s, "/a.txt").await, Some(200));
}

/// Threads of process `pid` now.
fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// With one worker, larder is a single thread again soon after blocking work (a file's stat)
/// is done: a second thread makes the kernel take a reference on the socket's file at every
/// `recv` and `sendmsg` (see `LONE_WORKER_BLOCKING_KEEP_ALIVE` in `server/start.rs`).
#[tokio::test(flavor = "multi_thread")]
async fn a_lone_worker_is_alone_again_after_blocking_work() {
    let (dir, addr, child) = lone_worker_serving_hello();
    let pid = child.0.id();
    let alone_within = |limit: Duration| async move {
        let deadline = Instant::now() + limit;
        while threads_of(pid) != 1 {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    };
    let mut s = first_answered(addr).await;
    // The first request stat-ed and read the file on a blocking thread (tokio keeps an idle
    // one for 10 s by default).
    assert!(
        alone_within(Duration::from_secs(3)).await,
        "{} threads 3 s after the first request",
        threads_of(pid)
    );
    // A second later the file is stat-ed again, on a new blocking thread that goes too.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    std::fs::write(dir.path().join("a.txt"), "hello again").unwrap();
    let mut seen_again = false;
    for _ in 0..50 {
        s.write(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n").await;
        if next_response(&mut s).await == Some((200, "hello again".len())) {
            seen_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_again, "the changed file was never served");
    assert!(
        alone_within(Duration::from_secs(3)).await,
        "{} threads 3 s after the re-stat",
        threads_of(pid)
    );
}
