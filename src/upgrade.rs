//! Protocol upgrades (RFC 9110 §7.8: WebSocket and other `Upgrade` protocols) on HTTP/1.1: the
//! connection hands its socket, after the 101 it wrote, to the handler that answered the
//! upgrade. It lives low in the module ladder because the server (which owns the connection)
//! and the handlers (which answer the 101) both use it.
//!
//! The server runs hyper's connection through its low-level parts (to park idle connections),
//! under which hyper does not complete an upgrade itself; so the handler claims the connection
//! before answering 101 (through the connection's `crate::interim::Sink`, which it already
//! reaches), and once hyper has written the 101 the connection sends the socket (and any bytes
//! hyper read past the request) to the claim. Requests that ask for no upgrade cost nothing.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use tokio::io::{AsyncRead, AsyncWrite};

/// A connection's byte stream.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A connection handed over after its 101.
pub struct Upgraded {
    pub io: Box<dyn Io>,
    /// What the client sent past the request, already read.
    pub read_ahead: Bytes,
    /// The connection's place under the server's connection bound, held while it lives
    /// (none for a stream of an HTTP/2 connection, which holds the place itself).
    pub permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Whether a request asks for an upgrade: an `Upgrade` field and `upgrade` among the
/// `Connection` options.
pub fn wanted(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && (headers.get_all(header::CONNECTION).iter())
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_needs_both_fields() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert!(!wanted(&h));
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(wanted(&h));
        h.remove(header::UPGRADE);
        assert!(!wanted(&h));
    }
}
