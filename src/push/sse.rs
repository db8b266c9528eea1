//! A subscription over Server-Sent Events: the response body that writes a subscriber's events.
//!
//! It starts with what [`super::store::Store::subscribe`] gave (the records of `init`, or the
//! changes missed since `Last-Event-ID`), then reads the topic's ring. Every event waiting
//! when the subscriber wakes goes out in one write; a lone event goes out as the shared bytes
//! themselves, with no copy. A subscriber the ring has overtaken gets a `reset` event and its
//! stream ends (the client reconnects with its last event id and resumes from the history).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio_util::sync::ReusableBoxFuture;

use super::fanout::Event;
use super::store::Start;
use crate::body::BoxError;

type Recv = (
    Result<Arc<Event>, RecvError>,
    broadcast::Receiver<Arc<Event>>,
);

async fn recv(mut rx: broadcast::Receiver<Arc<Event>>) -> Recv {
    let r = rx.recv().await;
    (r, rx)
}

/// The most bytes gathered into one write.
const BATCH: usize = 64 * 1024;

/// A subscriber's stream of events.
pub struct SseBody {
    first: Option<Bytes>,
    next: ReusableBoxFuture<'static, Recv>,
    skip_to: u64,
    done: bool,
}

impl SseBody {
    pub fn new(start: Start) -> SseBody {
        let mut first = BytesMut::new();
        for e in &start.first {
            first.extend_from_slice(&e.sse);
        }
        // The client's EventSource retries after 2 s when the stream ends.
        let mut head = BytesMut::from(&b"retry: 2000\n\n"[..]);
        head.extend_from_slice(&first);
        SseBody {
            first: Some(head.freeze()),
            next: ReusableBoxFuture::new(recv(start.rx)),
            skip_to: start.skip_to,
            done: false,
        }
    }

    fn wanted(&self, e: &Event) -> bool {
        e.seq == 0 || e.seq > self.skip_to
    }
}

/// Events gathered for one write: the one event's own bytes, or a copy of several.
#[derive(Default)]
struct Batch {
    one: Option<Bytes>,
    many: Option<BytesMut>,
}

impl Batch {
    fn add(&mut self, b: &Bytes) {
        if b.is_empty() {
            return;
        }
        if let Some(m) = &mut self.many {
            m.extend_from_slice(b);
        } else if let Some(o) = self.one.take() {
            let mut m = BytesMut::with_capacity(o.len() + b.len() + 512);
            m.extend_from_slice(&o);
            m.extend_from_slice(b);
            self.many = Some(m);
        } else {
            self.one = Some(b.clone());
        }
    }

    fn len(&self) -> usize {
        self.many.as_ref().map_or(0, |m| m.len()) + self.one.as_ref().map_or(0, Bytes::len)
    }

    fn take(self) -> Option<Bytes> {
        self.many.map(BytesMut::freeze).or(self.one)
    }
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
            let (r, mut rx) = std::task::ready!(self.next.poll(cx));
            let mut batch = Batch::default();
            let mut end: Option<&'static [u8]> = None;
            match r {
                Ok(e) if self.wanted(&e) => batch.add(&e.sse),
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => end = Some(OVERFLOW),
                Err(RecvError::Closed) => end = Some(b""),
            }
            while end.is_none() && batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(e) if self.wanted(&e) => batch.add(&e.sse),
                    Ok(_) => {}
                    Err(TryRecvError::Lagged(_)) => end = Some(OVERFLOW),
                    Err(TryRecvError::Closed) => end = Some(b""),
                    Err(TryRecvError::Empty) => break,
                }
            }
            match end {
                Some(tail) => {
                    self.done = true;
                    batch.add(&Bytes::from_static(tail));
                }
                None => self.next.set(recv(rx)),
            }
            let out = batch.take();
            if let Some(b) = out {
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

/// How long one write to a subscriber may wait for its socket before the subscriber is
/// dropped (its client stopped reading; a slower one gets a `reset` from its ring first).
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Writes `b` within [`WRITE_TIMEOUT`]: whether it went.
async fn write(io: &mut Box<dyn crate::upgrade::Io>, b: Bytes) -> bool {
    use std::future::Future;
    use tokio::io::AsyncWriteExt;
    let mut fut = std::pin::pin!(io.write_all(&b));
    // Nearly every write goes at once: those read no clock and arm no timer.
    let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
    if let Poll::Ready(r) = first {
        return r.is_ok();
    }
    matches!(tokio::time::timeout(WRITE_TIMEOUT, fut).await, Ok(Ok(())))
}

/// Writes a subscription's events on a connection handed over after the response head:
/// as HTTP/1.1 chunks (`chunked`), or as they are (an HTTP/1.0 response delimited by close).
pub async fn serve_raw(up: crate::upgrade::Upgraded, start: Start, chunked: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let crate::upgrade::Upgraded { mut io, permit, .. } = up;
    let _permit = permit;
    let frame = |data: &[u8]| -> Bytes {
        if chunked {
            super::fanout::chunk(data)
        } else {
            Bytes::copy_from_slice(data)
        }
    };
    let mut head = BytesMut::from(&b"retry: 2000\n\n"[..]);
    for e in &start.first {
        head.extend_from_slice(&e.sse);
    }
    let Start {
        mut rx, skip_to, ..
    } = start;
    if !write(&mut io, frame(&head)).await {
        return;
    }
    drop(head);
    let wanted = |e: &Event| e.seq == 0 || e.seq > skip_to;
    let mut probe = [0u8; 64];
    loop {
        let mut end: Option<&'static [u8]> = None;
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
        let first = match got {
            Ok(e) => Some(e),
            Err(RecvError::Lagged(_)) => {
                end = Some(OVERFLOW);
                None
            }
            Err(RecvError::Closed) => {
                end = Some(b"");
                None
            }
        };
        let mut out: Option<Bytes> = None;
        let mut batch = Batch::default();
        if let Some(e) = first.filter(|e| wanted(e)) {
            out = Some(if chunked {
                e.chunk.clone()
            } else {
                e.sse.clone()
            });
            batch.add(&e.sse);
        }
        // Whatever else is waiting goes in the same write.
        let mut more = false;
        while end.is_none() && batch.len() < BATCH {
            match rx.try_recv() {
                Ok(e) if wanted(&e) => {
                    batch.add(&e.sse);
                    more = true;
                }
                Ok(_) => {}
                Err(TryRecvError::Lagged(_)) => end = Some(OVERFLOW),
                Err(TryRecvError::Closed) => end = Some(b""),
                Err(TryRecvError::Empty) => break,
            }
        }
        if let Some(tail) = end {
            batch.add(&Bytes::from_static(tail));
            more = true;
        }
        if more || out.is_none() {
            out = batch.take().map(|b| frame(&b));
        }
        if let Some(b) = out {
            if !write(&mut io, b).await {
                return;
            }
        }
        if end.is_some() {
            if chunked {
                let _ = write(&mut io, Bytes::from_static(b"0\r\n\r\n")).await;
            }
            let _ = io.shutdown().await;
            return;
        }
    }
}
