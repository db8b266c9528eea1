//! The PROXY protocol (HAProxy's; v1 text, v2 binary, told apart by their first bytes) at the
//! start of every connection on a listener with `proxy_protocol = true`: the header is read
//! before anything else (before the h2c sniff, before the TLS handshake), within the request-head
//! deadline and at most [`MAX_HEADER`] bytes, parsed by the `ppp` crate, and its source address
//! becomes the connection's peer. A connection that does not begin with a valid header is
//! closed. A v2 `LOCAL` header (a proxy's health check), an `UNKNOWN` v1 header, and Unix or
//! unspecified addresses keep the socket's own peer.
//!
//! The header is peeked at, then exactly its bytes are read: what follows it stays in the
//! socket for the TLS handshake or hyper, with no buffer carried into the connection.

use std::net::SocketAddr;
use std::time::Duration;

use ppp::{v1, v2, HeaderResult, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The largest PROXY header read: a v1 header is at most 107 bytes, a v2 header with IPv6
/// addresses 52, its TLVs (a load balancer's endpoint id, TLS details) a few hundred more.
pub const MAX_HEADER: usize = 2048;

/// Why a connection was closed before its PROXY header was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The peer closed first, or reading failed.
    Closed,
    /// No complete header within the request-head deadline.
    TimedOut,
    /// The first bytes are not a PROXY header, or not a valid one, or it is over [`MAX_HEADER`].
    Invalid,
}

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// A header of `len` bytes; the client's address (None: keep the socket's).
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
    /// The start of a header: more bytes may complete it.
    Incomplete,
    Invalid,
}

fn parse(bytes: &[u8]) -> Parsed {
    let result = HeaderResult::parse(bytes);
    if result.is_incomplete() {
        return if bytes.len() < MAX_HEADER {
            Parsed::Incomplete
        } else {
            Parsed::Invalid
        };
    }
    match result {
        HeaderResult::V1(Ok(h)) => Parsed::Header {
            len: h.header.len(),
            source: match h.addresses {
                v1::Addresses::Tcp4(a) => Some((a.source_address, a.source_port).into()),
                v1::Addresses::Tcp6(a) => Some((a.source_address, a.source_port).into()),
                v1::Addresses::Unknown => None,
            },
        },
        HeaderResult::V2(Ok(h)) => Parsed::Header {
            len: h.len(),
            source: match (h.command, h.addresses) {
                (v2::Command::Local, _) => None,
                (_, v2::Addresses::IPv4(a)) => Some((a.source_address, a.source_port).into()),
                (_, v2::Addresses::IPv6(a)) => Some((a.source_address, a.source_port).into()),
                (_, v2::Addresses::Unix(_) | v2::Addresses::Unspecified) => None,
            },
        },
        HeaderResult::V1(Err(_)) | HeaderResult::V2(Err(_)) => Parsed::Invalid,
    }
}

/// Reads the PROXY header at the start of `stream` (accepted from `peer`) by `deadline`: the
/// connection's client, the header's source or `peer`. Nothing after the header is consumed.
pub async fn read_header(
    stream: &mut TcpStream,
    peer: SocketAddr,
    deadline: Instant,
) -> Result<SocketAddr, Refused> {
    let mut buf = vec![0u8; MAX_HEADER];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Err(_) => return Err(Refused::TimedOut),
            Ok(Err(_)) | Ok(Ok(0)) => return Err(Refused::Closed),
            Ok(Ok(n)) => n,
        };
        match parse(&buf[..n]) {
            Parsed::Header { len, source } => {
                // Exactly the header's bytes, which are in the socket already.
                stream
                    .read_exact(&mut buf[..len])
                    .await
                    .map_err(|_| Refused::Closed)?;
                return Ok(source.unwrap_or(peer));
            }
            Parsed::Invalid => return Err(Refused::Invalid),
            Parsed::Incomplete => {
                // Part of a header in the first segment (rare): peek again shortly.
                tokio::time::sleep(Duration::from_millis(2)).await;
                if Instant::now() >= deadline {
                    return Err(Refused::TimedOut);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v2 header built by `ppp` (command 0: LOCAL, 1: PROXY).
    fn v2(command: u8, addresses: v2::Addresses) -> Vec<u8> {
        v2::Builder::with_addresses(0x20 | command, v2::Protocol::Stream, addresses)
            .build()
            .unwrap()
    }

    #[test]
    fn v1_and_v2_headers_give_their_source_and_length() {
        let text = b"PROXY TCP4 203.0.113.7 10.0.0.1 4711 80\r\nGET / HTTP/1.1\r\n";
        assert_eq!(
            parse(text),
            Parsed::Header {
                len: 41,
                source: Some("203.0.113.7:4711".parse().unwrap())
            }
        );
        let text = b"PROXY TCP6 2001:db8::1 ::1 4711 443\r\n";
        assert_eq!(
            parse(text),
            Parsed::Header {
                len: text.len(),
                source: Some("[2001:db8::1]:4711".parse().unwrap())
            }
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n"),
            Parsed::Header {
                len: 15,
                source: None
            }
        );
        let src: SocketAddr = "203.0.113.7:4711".parse().unwrap();
        let dst: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let mut bytes = v2(1, (src, dst).into());
        let len = bytes.len();
        bytes.extend_from_slice(b"PRI * HTTP/2.0\r\n");
        assert_eq!(
            parse(&bytes),
            Parsed::Header {
                len,
                source: Some(src)
            }
        );
        let src6: SocketAddr = "[2001:db8::7]:1".parse().unwrap();
        let dst6: SocketAddr = "[::1]:443".parse().unwrap();
        let bytes = v2(1, (src6, dst6).into());
        assert!(matches!(parse(&bytes), Parsed::Header { source: Some(s), .. } if s == src6));
    }

    /// A health check (`LOCAL`) and addresses that are not IP keep the socket's peer.
    #[test]
    fn local_unix_and_unspecified_keep_the_socket_peer() {
        let src: SocketAddr = "203.0.113.7:4711".parse().unwrap();
        let dst: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let local = v2(0, (src, dst).into());
        assert_eq!(
            parse(&local),
            Parsed::Header {
                len: local.len(),
                source: None
            }
        );
        let unix = v2(1, v2::Addresses::Unix(v2::Unix::new([1; 108], [2; 108])));
        assert!(matches!(parse(&unix), Parsed::Header { source: None, .. }));
        let unspecified = v2(1, v2::Addresses::Unspecified);
        assert!(matches!(
            parse(&unspecified),
            Parsed::Header { source: None, .. }
        ));
    }

    #[test]
    fn partial_headers_wait_and_other_bytes_are_refused() {
        let src: SocketAddr = "203.0.113.7:4711".parse().unwrap();
        let dst: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let whole = v2(1, (src, dst).into());
        assert_eq!(parse(&whole[..10]), Parsed::Incomplete);
        assert_eq!(parse(&whole[..whole.len() - 1]), Parsed::Incomplete);
        assert_eq!(parse(b"PROXY TCP4 203.0.113.7"), Parsed::Incomplete);
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Parsed::Invalid);
        assert_eq!(parse(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Parsed::Invalid);
        assert_eq!(
            parse(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
            Parsed::Invalid
        );
        assert_eq!(
            parse(b"PROXY TCP4 nonsense 10.0.0.1 1 2\r\n"),
            Parsed::Invalid
        );
        // A v2 header claiming more than the bound is refused once the bound is read.
        let mut big = whole.clone();
        big[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        big.resize(MAX_HEADER, 0);
        assert_eq!(parse(&big), Parsed::Invalid);
    }

    /// A connected pair of loopback sockets: (client, server side, the client's address).
    async fn pair() -> (TcpStream, TcpStream, SocketAddr) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, peer) = l.accept().await.unwrap();
        (client, server, peer)
    }

    /// A header in two writes is read whole; exactly its bytes are consumed, what follows stays
    /// in the socket.
    #[tokio::test]
    async fn a_header_in_pieces_is_read_and_what_follows_stays() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server, peer) = pair().await;
        let src: SocketAddr = "203.0.113.7:4711".parse().unwrap();
        let header = v2(1, (src, peer).into());
        let (a, b) = header.split_at(10);
        client.write_all(a).await.unwrap();
        let rest = [b, &b"GET / HTTP/1.1\r\n"[..]].concat();
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            client.write_all(&rest).await.unwrap();
            client
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(read_header(&mut server, peer, deadline).await, Ok(src));
        let _client = writer.await.unwrap();
        let mut after = [0u8; 16];
        server.read_exact(&mut after).await.unwrap();
        assert_eq!(&after, b"GET / HTTP/1.1\r\n");
    }

    /// A header still incomplete at the deadline is given up (the deadline is now: the test
    /// waits for nothing); a peer that closes, at once.
    #[tokio::test]
    async fn a_header_never_completed_times_out() {
        use tokio::io::AsyncWriteExt;
        let (mut client, mut server, peer) = pair().await;
        client.write_all(b"PROXY TCP4 203.0.113.7").await.unwrap();
        // Its bytes are there before the deadline is.
        server.peek(&mut [0u8; 1]).await.unwrap();
        let deadline = Instant::now();
        assert_eq!(
            read_header(&mut server, peer, deadline).await,
            Err(Refused::TimedOut)
        );
        let (client, mut server, peer) = pair().await;
        drop(client);
        assert_eq!(
            read_header(&mut server, peer, Instant::now() + Duration::from_secs(10)).await,
            Err(Refused::Closed)
        );
    }
}
