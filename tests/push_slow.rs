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
