//! Connection-level limits: the accept loop survives running out of file descriptors, the
//! max-connections bound pauses accepting until a connection closes, and idle keep-alive
//! connections release their buffers yet keep serving (read-ahead included) until the idle
//! timeout closes them; with many connections open, they release them after every response.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use larder::config::{Config, HandlerConfig, StaticConfig};

/// One GET on `s`; the status code, or None if nothing came back in time.
fn request(s: &mut TcpStream, path: &str) -> Option<u16> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .ok()?;
    response(s).map(|(status, _)| status)
}

/// Reads one response (with a Content-Length body) from `s`, and not a byte more (pipelined
/// responses may follow): its status and body length. Panics if the response announces that
/// the connection closes.
fn response(s: &mut TcpStream) -> Option<(u16, usize)> {
    s.set_read_timeout(Some(Duration::from_millis(2000))).ok()?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    assert!(!head.contains("connection: close"), "{head}");
    Some((head.split(' ').nth(1)?.parse().ok()?, len))
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn accept_loop_survives_running_out_of_file_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let addr = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_larder"));
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
    let mut child = Child(cmd.spawn().unwrap());

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut first = loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            if request(&mut s, "/a.txt") == Some(200) {
                break s;
            }
        }
        assert!(Instant::now() < deadline, "larder did not start");
        std::thread::sleep(Duration::from_millis(50));
    };

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
    let mut flood: Vec<TcpStream> = (0..120)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.0.try_wait().unwrap().is_none(), "larder exited");
    // A connection accepted before the exhaustion is still served.
    assert_eq!(request(&mut first, "/a.txt"), Some(200));
    // Some of the flood could not be accepted (no response), proving we hit the limit.
    let unanswered = flood
        .iter_mut()
        .rev()
        .take(20)
        .filter(|s| {
            let mut s: &TcpStream = s;
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            let mut b = [0u8; 16];
            !matches!(s.read(&mut b), Ok(n) if n > 0)
        })
        .count();
    assert!(unanswered > 0, "the descriptor limit was never reached");

    // Free the descriptors: new connections are served again.
    flood.clear();
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            if request(&mut s, "/a.txt") == Some(200) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "larder never recovered from EMFILE"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(child.0.try_wait().unwrap().is_none(), "larder exited");
}

#[tokio::test(flavor = "multi_thread")]
async fn at_max_connections_accepting_pauses_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let mut cfg = Config::single_route(
        "127.0.0.1:0".parse().unwrap(),
        HandlerConfig::Static(StaticConfig::new_root(dir.path().to_path_buf())),
    );
    cfg.server.max_connections = larder::config::Bounded(4);
    let h = larder::server::start(cfg).await.unwrap();
    let addr = h.addrs[0];
    tokio::task::spawn_blocking(move || {
        let mut held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
        for s in &mut held {
            assert_eq!(request(s, "/a.txt"), Some(200));
        }
        // The fifth connects (kernel backlog) but is not served while four are open.
        let mut fifth = TcpStream::connect(addr).unwrap();
        fifth
            .set_read_timeout(Some(Duration::from_millis(400)))
            .unwrap();
        fifth
            .write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut b = [0u8; 64];
        assert!(fifth.read(&mut b).is_err(), "served beyond the bound");
        // One closes: the fifth is accepted and answered.
        held.pop();
        fifth
            .set_read_timeout(Some(Duration::from_millis(3000)))
            .unwrap();
        let n = fifth.read(&mut b).unwrap();
        assert!(b[..n].starts_with(b"HTTP/1.1 200"));
    })
    .await
    .unwrap();
}

/// A server whose connections release their buffers after 100 ms idle and close after 700 ms.
async fn releasing_server() -> (larder::server::Handle, SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let mut cfg = Config::single_route(
        "127.0.0.1:0".parse().unwrap(),
        HandlerConfig::Static(StaticConfig::new_root(dir.keep())),
    );
    cfg.server.idle_release = larder::config::Dur(Duration::from_millis(100));
    cfg.server.idle_timeout = larder::config::Dur(Duration::from_millis(700));
    let h = larder::server::start(cfg).await.unwrap();
    let addr = h.addrs[0];
    (h, addr)
}

#[tokio::test(flavor = "multi_thread")]
async fn released_connection_serves_again_and_keeps_a_split_request_head() {
    let (_h, addr) = releasing_server().await;
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        assert_eq!(request(&mut s, "/a.txt"), Some(200));
        // Idle past the release: the same connection serves the next request.
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(request(&mut s, "/a.txt"), Some(200));
        // Half a request head, then a pause long enough for a release, then the rest: the bytes
        // hyper had read ahead are replayed to the next connection state, nothing is lost.
        s.write_all(b"GET /a.txt HTTP/1.1\r\nHo").unwrap();
        std::thread::sleep(Duration::from_millis(350));
        s.write_all(b"st: t\r\n\r\n").unwrap();
        let mut b = [0u8; 256];
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = s.read(&mut b).unwrap();
        let text = String::from_utf8_lossy(&b[..n]).to_string();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("hello"), "{text}");
        // Pipelined requests right after a release both get answers, in order.
        std::thread::sleep(Duration::from_millis(350));
        s.write_all(
            b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\nGET /missing HTTP/1.1\r\nHost: t\r\n\r\n",
        )
        .unwrap();
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("HTTP/1.1 404") {
            let n = s.read(&mut b).unwrap();
            assert!(n > 0, "closed before both answers");
            got.extend_from_slice(&b[..n]);
        }
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn released_connection_is_closed_at_the_idle_timeout() {
    let (_h, addr) = releasing_server().await;
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        assert_eq!(request(&mut s, "/a.txt"), Some(200));
        let start = Instant::now();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 16];
        // EOF (0) once the idle timeout passes, not before the release or at once.
        assert_eq!(s.read(&mut b).unwrap(), 0);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(500), "{waited:?}");
        assert!(waited < Duration::from_millis(2500), "{waited:?}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_closes_idle_keepalive_connections_and_reports_none_left() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    // Default idle settings: a keep-alive connection would otherwise stay open for 60 s.
    let cfg = Config::single_route(
        "127.0.0.1:0".parse().unwrap(),
        HandlerConfig::Static(StaticConfig::new_root(dir.keep())),
    );
    let h = larder::server::start(cfg).await.unwrap();
    let addr = h.addrs[0];
    // One connection in hyper's hands (a request just served), one released (idle past 1 s).
    let (mut fresh, mut released) = tokio::task::spawn_blocking(move || {
        let mut released = TcpStream::connect(addr).unwrap();
        assert_eq!(request(&mut released, "/a.txt"), Some(200));
        std::thread::sleep(Duration::from_millis(1300));
        let mut fresh = TcpStream::connect(addr).unwrap();
        assert_eq!(request(&mut fresh, "/a.txt"), Some(200));
        (fresh, released)
    })
    .await
    .unwrap();
    // Both are closed by the shutdown, which so finds no connection left open.
    assert_eq!(h.shutdown().await, 0);
    for s in [&mut fresh, &mut released] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(s.read(&mut b).unwrap(), 0, "connection left open");
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
    let mut cfg = Config::single_route(
        "127.0.0.1:0".parse().unwrap(),
        HandlerConfig::Static(StaticConfig::new_root(dir.keep())),
    );
    // Every connection releases after each response; never because it idled.
    cfg.server.release_above_connections = 0;
    cfg.server.idle_release = larder::config::Dur(Duration::ZERO);
    let h = larder::server::start(cfg).await.unwrap();
    let addr = h.addrs[0];
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for _ in 0..50 {
            assert_eq!(request(&mut s, "/a.txt"), Some(200));
        }
        // A streamed body is written whole before the connection lets go of hyper.
        s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        assert_eq!(response(&mut s), Some((200, big)));
        assert_eq!(request(&mut s, "/a.txt"), Some(200));
        // Pipelined requests in one write: both answered, in order.
        s.write_all(b"GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        assert_eq!(response(&mut s), Some((200, 5)));
        assert_eq!(response(&mut s).map(|r| r.0), Some(404));
        // Half a head, then a pause: the connection waits for the rest without spinning on
        // the bytes it read ahead, then answers.
        s.write_all(b"GET /a.txt HTTP/1.1\r\nHo").unwrap();
        let cpu = cpu_time();
        std::thread::sleep(Duration::from_millis(300));
        let spent = cpu_time() - cpu;
        assert!(
            spent < Duration::from_millis(150),
            "busy while waiting: {spent:?}"
        );
        s.write_all(b"st: t\r\n\r\n").unwrap();
        assert_eq!(response(&mut s), Some((200, 5)));
        // A request body the handler never reads, sent in two parts: hyper ends the
        // connection after the answer; the rest of the body is never taken for a request.
        s.write_all(b"POST /a.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12345")
            .unwrap();
        let mut got = [0u8; 512];
        let n = s.read(&mut got).unwrap();
        assert!(got[..n].starts_with(b"HTTP/1.1 405"));
        std::thread::sleep(Duration::from_millis(50));
        let _ = s.write_all(b"67890GET /a.txt HTTP/1.1\r\nHost: t\r\n\r\n");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
        let mut s = TcpStream::connect(addr).unwrap();
        assert_eq!(request(&mut s, "/a.txt"), Some(200));
    })
    .await
    .unwrap();
}
