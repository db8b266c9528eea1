//! 1xx interim responses (RFC 9110 §15.2): an origin's `103 Early Hints` (or any 1xx but 100 and
//! 101) reaches the HTTP/1.1 client before the final response, as a proxy must forward them.
//!
//! hyper's server has no way to send an informational response, so the connection's socket is
//! written directly, and only when that cannot interleave with hyper's own output: while a
//! request is being handled, hyper writes nothing new on its connection until the handler
//! returns, and the IO wrapper (`server::Tracked`) records whether hyper still owes bytes of an
//! earlier response (it has written since its last flush; hyper flushes the socket only once its
//! buffer is drained). If it does, or the socket is full, the rest of the interim block is queued
//! and the IO wrapper writes it before the first write that follows hyper's flush: the final
//! response's head.
//!
//! The sink travels to the upstream client in a task-local set around each proxied HTTP/1.1
//! request's handler; fetches without a client (background revalidation) have none and forward nothing.
//! Upstream 100 Continue is not forwarded (hyper answers the client's `Expect` itself), nor 101.
//!
//! Bounds: an origin may send any number of 1xx responses, and a client may not read. At most
//! [`MAX_PER_RESPONSE`] go on per request and at most [`MAX_QUEUED`] bytes wait in the queue of
//! a connection; the others are dropped whole (a block is never cut, so the framing holds) and
//! counted in the server's [`Dropped`] counter.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{HeaderMap, StatusCode};

tokio::task_local! {
    static SINK: Sink;
}

/// Interim responses forwarded per request at most; later ones are dropped.
pub const MAX_PER_RESPONSE: u32 = 8;

/// Interim bytes a connection queues at most while its client does not read; a block that does
/// not fit is dropped.
pub const MAX_QUEUED: usize = 16 * 1024;

/// The server's count of interim responses dropped at the bounds (shared by its connections).
pub type Dropped = Arc<AtomicU64>;

/// What one HTTP/1.1 connection shares between its IO wrapper and its request handlers.
pub struct Shared {
    /// hyper has written since its last flush: it may still hold response bytes.
    pub owed: AtomicBool,
    /// Interim bytes to write before hyper's next output.
    pub pending: Mutex<Vec<u8>>,
    /// `pending` is not empty (read without the lock on every write).
    pub queued: AtomicBool,
    /// Interim responses met during the request being handled.
    seen: AtomicU32,
    dropped: Dropped,
}

impl Shared {
    pub fn new(dropped: Dropped) -> Shared {
        Shared {
            owed: AtomicBool::new(false),
            pending: Mutex::new(Vec::new()),
            queued: AtomicBool::new(false),
            seen: AtomicU32::new(0),
            dropped,
        }
    }

    fn drop_one(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where a request's interim responses go: the client connection's socket.
#[derive(Clone)]
pub struct Sink {
    fd: RawFd,
    shared: Arc<Shared>,
}

impl Sink {
    pub fn new(fd: RawFd, shared: Arc<Shared>) -> Sink {
        Sink { fd, shared }
    }

    /// Runs a request's handler with this sink in reach of the upstream client; the request
    /// starts with no interim response forwarded.
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        self.shared.seen.store(0, Ordering::Relaxed);
        SINK.scope(self, f).await
    }

    /// The sink of the request being handled on this task, if any.
    pub fn current() -> Option<Sink> {
        SINK.try_with(Sink::clone).ok()
    }

    /// Sends one interim response on to the client.
    pub fn forward(&self, status: StatusCode, headers: &HeaderMap) {
        if !status.is_informational()
            || status == StatusCode::CONTINUE
            || status == StatusCode::SWITCHING_PROTOCOLS
        {
            return;
        }
        let shared = &*self.shared;
        if shared.seen.fetch_add(1, Ordering::Relaxed) >= MAX_PER_RESPONSE {
            shared.drop_one();
            return;
        }
        let block = encode(status, headers);
        let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() + block.len() > MAX_QUEUED {
            shared.drop_one();
            return;
        }
        let mut from = 0;
        if pending.is_empty() && !shared.owed.load(Ordering::Acquire) {
            // SAFETY: `fd` is the client socket, open for as long as the request is handled
            // (this runs before the final response, while the handler still waits for it);
            // MSG_DONTWAIT never blocks, MSG_NOSIGNAL turns a closed peer into an error.
            let n = unsafe {
                libc::send(
                    self.fd,
                    block.as_ptr().cast(),
                    block.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            from = usize::try_from(n).unwrap_or(0);
        }
        if from < block.len() {
            pending.extend_from_slice(&block[from..]);
            shared.queued.store(true, Ordering::Release);
        }
    }
}

/// `HTTP/1.1 103 Early Hints` and the fields, minus hop-by-hop ones.
fn encode(status: StatusCode, headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        status
            .canonical_reason()
            .unwrap_or("Informational")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    let mut headers = headers.clone();
    crate::http::fields::strip_hop_by_hop(&mut headers);
    for (name, value) in &headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_and_count_are_bounded() {
        let dropped = Dropped::default();
        let shared = Arc::new(Shared::new(Arc::clone(&dropped)));
        // hyper owes bytes: everything queues (the socket is never written, so no real fd).
        shared.owed.store(true, Ordering::Release);
        let sink = Sink::new(-1, Arc::clone(&shared));
        let mut h = HeaderMap::new();
        h.insert("link", "x".repeat(3000).parse().unwrap());
        let hints = StatusCode::from_u16(103).unwrap();
        for _ in 0..20 {
            sink.forward(hints, &h);
        }
        let block = encode(hints, &h).len();
        let queued = shared.pending.lock().unwrap().len();
        assert_eq!(queued, MAX_QUEUED / block * block);
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            20 - (MAX_QUEUED / block) as u64
        );
        // The count is per request: small blocks, and past MAX_PER_RESPONSE all are dropped.
        shared.pending.lock().unwrap().clear();
        shared.seen.store(0, Ordering::Relaxed);
        dropped.store(0, Ordering::Relaxed);
        for _ in 0..20 {
            sink.forward(hints, &HeaderMap::new());
        }
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            20 - u64::from(MAX_PER_RESPONSE)
        );
    }

    #[test]
    fn encodes_early_hints_without_hop_by_hop_fields() {
        let mut h = HeaderMap::new();
        h.insert("link", "</a.css>; rel=preload".parse().unwrap());
        h.insert("connection", "x-hop".parse().unwrap());
        h.insert("x-hop", "1".parse().unwrap());
        let b = encode(StatusCode::from_u16(103).unwrap(), &h);
        assert_eq!(
            String::from_utf8(b).unwrap(),
            "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"
        );
    }
}
