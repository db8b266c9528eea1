//! A subscription over Server-Sent Events: the response body that writes a subscriber's events.
//!
//! It starts with what [`super::store::Store::subscribe`] gave (the records of `init`, or the
//! changes missed since `Last-Event-ID`), then reads the topic's ring. Every event waiting
//! when the subscriber wakes goes out in one write; a lone event goes out as the shared bytes
//! themselves, with no copy. A subscriber the ring has overtaken gets a `reset` event and its
//! stream ends (the client reconnects with its last event id and resumes from the history);
//! on HTTP/1.x so does one whose socket took nothing for two heartbeats ([`serve_raw`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::fanout::{Event, Receiver};
use super::store::Start;
use crate::body::BoxError;

/// The most bytes gathered into one write.
const BATCH: usize = 64 * 1024;

/// A subscriber's stream of events.
pub struct SseBody {
    first: Option<Bytes>,
    rx: Receiver,
    skip_to: u64,
    done: bool,
}

impl SseBody {
    pub fn new(start: Start) -> SseBody {
        SseBody {
            first: Some(opening(&start)),
            // hyper or h3 polls the body only while the client's window has room.
            rx: start.rx.eager(),
            skip_to: start.skip_to,
            done: false,
        }
    }
}

/// Events gathered for one write: the one event itself (sent as its shared bytes), or a
/// copy of several.
#[derive(Default)]
struct Batch {
    one: Option<Arc<Event>>,
    many: Option<BytesMut>,
    /// The stream ends after this batch (the ring closed, or the subscriber lagged).
    ended: bool,
}

impl Batch {
    /// Takes the event `first` received and whatever else waits in `rx` (up to [`BATCH`]
    /// bytes), leaving out what precedes the subscription's start (`skip_to`).
    fn gather(first: Result<Arc<Event>, RecvError>, rx: &mut Receiver, skip_to: u64) -> Batch {
        let wanted = |e: &Event| e.seq == 0 || e.seq > skip_to;
        let mut b = Batch::default();
        match first {
            Ok(e) if wanted(&e) => b.add(e),
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => b.end(OVERFLOW),
            Err(RecvError::Closed) => b.end(b""),
        }
        while !b.ended && b.len() < BATCH {
            match rx.try_recv() {
                Ok(e) if wanted(&e) => b.add(e),
                Ok(_) => {}
                Err(TryRecvError::Lagged(_)) => b.end(OVERFLOW),
                Err(TryRecvError::Closed) => b.end(b""),
                Err(TryRecvError::Empty) => break,
            }
        }
        b
    }

    fn add(&mut self, e: Arc<Event>) {
        self.push(&e.sse, Some(Arc::clone(&e)));
    }

    /// The stream's last bytes.
    fn end(&mut self, tail: &'static [u8]) {
        self.ended = true;
        self.push(tail, None);
    }

    fn push(&mut self, b: &[u8], event: Option<Arc<Event>>) {
        if b.is_empty() {
            return;
        }
        if let Some(m) = &mut self.many {
            m.extend_from_slice(b);
        } else if let (None, Some(e)) = (&self.one, event) {
            self.one = Some(e);
        } else {
            let mut m = BytesMut::with_capacity(self.len() + b.len() + 512);
            if let Some(o) = self.one.take() {
                m.extend_from_slice(&o.sse);
            }
            m.extend_from_slice(b);
            self.many = Some(m);
        }
    }

    fn len(&self) -> usize {
        self.many.as_ref().map_or(0, |m| m.len()) + self.one.as_ref().map_or(0, |e| e.sse.len())
    }

    /// The bytes to write: as one HTTP/1.1 chunk when `chunked` (a lone event's chunk is
    /// rendered already), else as they are.
    fn take(self, chunked: bool) -> Option<Bytes> {
        match (self.one, self.many) {
            (_, Some(m)) if chunked => Some(super::fanout::chunk(&m)),
            (_, Some(m)) => Some(m.freeze()),
            (Some(e), None) if chunked => Some(e.chunk.clone()),
            (Some(e), None) => Some(e.sse.clone()),
            (None, None) => None,
        }
    }
}

/// What a subscription's stream starts with: the client's retry delay, then the events of
/// its start (the records of `init`, or what it missed).
fn opening(start: &Start) -> Bytes {
    // The client's EventSource retries after 2 s when the stream ends.
    let mut head = BytesMut::from(&b"retry: 2000\n\n"[..]);
    for e in &start.first {
        head.extend_from_slice(&e.sse);
    }
    head.freeze()
}

/// The last event of a subscriber that fell too far behind.
pub const OVERFLOW: &[u8] = b"event: reset\ndata: {\"reason\":\"overflow\"}\n\n";

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(f))));
        }
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let this = &mut *self;
            let r = std::task::ready!(this.rx.poll_recv(cx));
            let batch = Batch::gather(r, &mut this.rx, this.skip_to);
            if batch.ended {
                this.done = true;
            }
            if let Some(b) = batch.take(false) {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The body of an HTTP/1.1 subscription's response: it asks for the connection at its first
/// poll (hyper has written the head by then) and never yields; [`serve_raw`] writes the events
/// on the socket from then on. A subscriber then costs its task and socket, not hyper's
/// connection state and buffers, and an event is one write of shared bytes.
pub struct HandOff {
    sink: Option<crate::interim::Sink>,
}

impl HandOff {
    pub fn new(sink: crate::interim::Sink) -> HandOff {
        HandOff { sink: Some(sink) }
    }
}

impl http_body::Body for HandOff {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(sink) = self.sink.take() {
            sink.ask_handoff();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// How long the end of a stream that a stalled client was cut off from (what was being written,
/// the `reset` and the last chunk) waits for it to read before its connection is dropped.
const LINGER: std::time::Duration = std::time::Duration::from_secs(30);

/// Writes `b`, waiting at most `wait` for the socket to take any of it: `Err(Some(rest))` with
/// what it did not take by then, `Err(None)` when the connection failed.
async fn write(
    io: &mut Box<dyn crate::upgrade::Io>,
    mut b: Bytes,
    wait: std::time::Duration,
) -> Result<(), Option<Bytes>> {
    use std::future::Future;
    use tokio::io::AsyncWriteExt;
    while !b.is_empty() {
        let wrote = {
            let mut fut = std::pin::pin!(io.write(&b));
            // Nearly every write goes at once: those read no clock and arm no timer.
            match std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
                Poll::Ready(r) => Some(r),
                Poll::Pending => tokio::time::timeout(wait, fut).await.ok(),
            }
        };
        match wrote {
            None => return Err(Some(b)),
            Some(Ok(0)) | Some(Err(_)) => return Err(None),
            Some(Ok(n)) => {
                let _ = b.split_to(n);
            }
        }
    }
    Ok(())
}

/// Ends a stream: `rest` (what was being written), then `last` unless the stream ended
/// already (`ended`), then the last chunk, each waiting at most `wait`; then the connection
/// is closed.
async fn finish(
    io: &mut Box<dyn crate::upgrade::Io>,
    rest: Option<Bytes>,
    last: &'static [u8],
    ended: bool,
    chunked: bool,
    wait: std::time::Duration,
) {
    use tokio::io::AsyncWriteExt;
    let mut parts = Vec::with_capacity(3);
    parts.extend(rest);
    if !ended {
        parts.push(if chunked {
            super::fanout::chunk(last)
        } else {
            Bytes::from_static(last)
        });
    }
    if chunked {
        parts.push(Bytes::from_static(b"0\r\n\r\n"));
    }
    for p in parts {
        if write(io, p, wait).await.is_err() {
            return;
        }
    }
    let _ = tokio::time::timeout(wait, io.shutdown()).await;
}

/// Writes a subscription's events on a connection handed over after the response head:
/// as HTTP/1.1 chunks (`chunked`), or as they are (an HTTP/1.0 response delimited by close).
///
/// A write that waits two heartbeats for the socket cuts the subscriber off as if it had
/// overflowed (by then the ring is overtaking it, or its client is gone): it stops reading
/// the ring, and what was being written, the `reset` and the end wait [`LINGER`] more for the
/// client to read them. So a client that reads again finds the `reset` and the stream's end,
/// never a stream left open with nothing coming.
pub async fn serve_raw(
    up: crate::upgrade::Upgraded,
    start: Start,
    chunked: bool,
    heartbeat: std::time::Duration,
) {
    use tokio::io::AsyncReadExt;
    // The permit is held while the subscriber lives.
    let crate::upgrade::Upgraded {
        mut io,
        permit: _permit,
        ..
    } = up;
    let patience = heartbeat * 2;
    let head = opening(&start);
    let head = if chunked {
        super::fanout::chunk(&head)
    } else {
        head
    };
    let Start {
        mut rx, skip_to, ..
    } = start;
    if let Err(rest) = write(&mut io, head, patience).await {
        if rest.is_some() {
            drop(rx);
            finish(&mut io, rest, OVERFLOW, false, chunked, LINGER).await;
        }
        return;
    }
    let mut probe = [0u8; 64];
    loop {
        // Waiting for an event, the socket is watched too: a subscriber that hangs up goes at
        // once, not at the next write (an SSE client sends nothing after its request; what it
        // might send is read and dropped).
        let got = tokio::select! {
            biased;
            r = rx.recv() => r,
            n = io.read(&mut probe) => {
                match n {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        };
        // Whatever else is waiting goes in the same write.
        let batch = Batch::gather(got, &mut rx, skip_to);
        let ended = batch.ended;
        if let Some(b) = batch.take(chunked) {
            match write(&mut io, b, patience).await {
                Ok(()) => {}
                Err(None) => return,
                Err(rest) => {
                    // The ring's place is given up now; the end waits for the client.
                    drop(rx);
                    finish(&mut io, rest, OVERFLOW, ended, chunked, LINGER).await;
                    return;
                }
            }
        }
        if ended {
            finish(&mut io, None, b"", true, chunked, patience).await;
            return;
        }
    }
}
