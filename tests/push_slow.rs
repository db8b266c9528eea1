//! Push subscribers that do not read (issue #39): a WebSocket peer that floods pings and never
//! reads its pongs, and SSE subscribers whose sockets stay full while large changes are
//! written. Real clients on sockets with a small receive buffer; larder's memory (the test
//! process's resident set: larder runs in-process) and what the clients see on the wire.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use common::*;

const TOKEN: &str = "s3cret";

async fn push_larder(keys: &str) -> (Larder, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let toml = one_route(
        "",
        "push",
        &format!(
            "dir = \"{}\"\ntoken = \"{TOKEN}\"\n{keys}",
            dir.path().display()
        ),
    );
    (Larder::start(&toml).await, dir)
}

/// A connection to `addr` whose receive buffer is 4 KiB (set before connecting, so the
/// window it offers stays small).
async fn small_window(addr: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(addr).await.unwrap()
}

/// This process's resident set, in bytes (larder runs in it).
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

/// `n` masked ping frames of 125 bytes each (the largest a control frame may carry).
fn pings(n: usize) -> Vec<u8> {
    let mut one = vec![0x89, 0x80 | 125, 0, 0, 0, 0];
    one.extend(std::iter::repeat_n(b'p', 125));
    one.repeat(n)
}

#[tokio::test]
async fn a_websocket_peer_that_floods_pings_and_never_reads_is_closed() {
    let (l, _dir) = push_larder("heartbeat = \"300ms\"").await;
    let tcp = small_window(l.addr).await;
    let (ws, resp) = tokio_tungstenite::client_async(format!("ws://{}/", l.addr), tcp)
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    let mut tcp = ws.into_inner();
    let before = rss();
    let burst = pings(8192);
    // Pings, as fast as larder takes them, never reading a pong.
    let mut sent = 0usize;
    let flood = async {
        loop {
            if tcp.write_all(&burst).await.is_err() {
                return true;
            }
            sent += burst.len();
            if rss().saturating_sub(before) > 256 << 20 {
                return false;
            }
        }
    };
    let closed = tokio::time::timeout(Duration::from_secs(10), flood)
        .await
        .unwrap_or(false);
    let grown = rss().saturating_sub(before);
    assert!(
        closed,
        "larder closes the session of a peer that does not read (sent {sent} bytes of pings, \
         larder grew by {grown} bytes)"
    );
    assert!(
        grown < 64 << 20,
        "what larder holds for a peer that does not read is bounded: grew by {grown} bytes"
    );
    // Reading now, the peer finds the connection closed.
    let mut buf = vec![0u8; 64 * 1024];
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the connection is closed");
}

/// An SSE subscription over HTTP/1.1 on a socket with a small receive buffer, not read.
async fn slow_subscriber(addr: SocketAddr) -> TcpStream {
    let mut s = small_window(addr).await;
    s.write_all(b"GET /?subscribe&init=0 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    s
}

/// Reads `s` until it closes: the bytes and the longest wait between two reads.
async fn read_out(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration, bool) {
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut longest = Duration::ZERO;
    let start = Instant::now();
    let mut last = start;
    loop {
        let left = limit.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return (all, longest.max(last.elapsed()), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (all, longest.max(last.elapsed()), true),
            Ok(Ok(n)) => {
                all.extend_from_slice(&buf[..n]);
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
        }
    }
}

#[tokio::test]
async fn sse_subscribers_that_do_not_read_are_reset_and_never_left_silent() {
    // Twenty subscribers that read nothing while 200 changes of 50 KB are written: each one's
    // socket fills, its write waits past two heartbeats (and its ring is overtaken).
    let (l, _dir) =
        push_larder("heartbeat = \"300ms\"\nqueue = 64\nmax_record_size = \"1MiB\"").await;
    let mut subs = Vec::new();
    for _ in 0..20 {
        subs.push(slow_subscriber(l.addr).await);
    }
    let c = client();
    let value = format!("\"{}\"", "z".repeat(50 * 1024));
    for i in 0..200 {
        let r = send(
            &c,
            "PUT",
            &l.url(&format!("/big/{}", i % 100)),
            &[("authorization", "Bearer s3cret")],
            &value,
        )
        .await;
        assert!(r.status.is_success(), "{}", r.status);
    }
    // Reading now, each finds what was written for it, then the reset and the stream's end,
    // with nothing like a heartbeat's silence on the way.
    for (i, s) in subs.iter_mut().enumerate() {
        let (got, longest, closed) = read_out(s, Duration::from_secs(10)).await;
        let text = String::from_utf8_lossy(&got);
        let tail = &text[text.len().saturating_sub(120)..];
        assert!(
            text.ends_with(
                "\r\n2a\r\nevent: reset\ndata: {\"reason\":\"overflow\"}\n\n\r\n0\r\n\r\n"
            ),
            "subscriber {i} is told it overflowed, and its stream ends: {tail:?}"
        );
        assert!(closed, "subscriber {i}: the connection is closed");
        assert!(
            longest < Duration::from_secs(2),
            "subscriber {i}: the stream is never silent past its heartbeat: {longest:?}"
        );
    }
}
