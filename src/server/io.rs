//! A connection's bytes as the server drives them: the [`Stream`] a connection runs on (plain
//! TCP or TLS), the IO wrapper hyper reads and writes through ([`Tracked`]: activity for
//! the idle watchdog, read-ahead replayed after parking, 1xx blocks written between hyper's
//! responses), the watchdog's per-connection state ([`Activity`]) and hyper's request-head timer
//! ([`WatchdogTimer`]).

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::interim;

/// The byte stream of a client connection: what `connection::serve_connection` runs
/// on. Anything readable and writable serves; the one thing the server asks besides is how to
/// wait while a connection is parked (hyper's state freed, see `serve_h1`).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Resolves when the parked peer has sent something or closed. Bytes read meanwhile go to
    /// `pending`, which the next hyper connection reads first.
    ///
    /// The default reads what has come (one small read, into `pending`): it suits a stream
    /// that may hold bytes of its own (TLS decrypts whole records). A plain socket only waits
    /// for readiness and leaves the bytes to hyper.
    fn poll_parked(&mut self, cx: &mut Context<'_>, pending: &mut Bytes) -> Poll<io::Result<()>> {
        const PARKED_READ: usize = 1024;
        let mut buf = [MaybeUninit::<u8>::uninit(); PARKED_READ];
        let mut buf = ReadBuf::uninit(&mut buf);
        std::task::ready!(Pin::new(self).poll_read(cx, &mut buf))?;
        // Empty at EOF: hyper reads again and meets the EOF itself.
        *pending = Bytes::copy_from_slice(buf.filled());
        Poll::Ready(Ok(()))
    }
}

/// A TLS connection parks with the default: rustls may hold decrypted bytes of its own, which a
/// readiness wait on the socket would not see.
impl Stream for tokio_rustls::server::TlsStream<TcpStream> {}

impl Stream for TcpStream {
    #[inline]
    fn poll_parked(&mut self, cx: &mut Context<'_>, _: &mut Bytes) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }
}

/// What the idle watchdog knows about a connection. It is also the waker the watchdog's own
/// futures (timer, shutdown signal) are polled with, and the interim sink's: that records that
/// one of them fired and wakes the connection task, so that `serve_h1` polls the watchdog only
/// then. One allocation per connection, touched by every read and write anyway.
#[derive(Default)]
pub struct Activity {
    /// Set by every read or write that moved bytes; cleared by the watchdog.
    active: AtomicBool,
    /// Requests being handled now.
    pub in_flight: AtomicUsize,
    /// The current hyper connection has started a request.
    pub served: AtomicBool,
    /// A request of the current hyper connection came with a body. hyper may still be reading
    /// (or draining) it after the response, so the connection does not park after responses.
    pub with_body: AtomicBool,
    /// The watchdog's timer or the shutdown signal woke the task.
    pub watchdog_woken: AtomicBool,
    /// The connection task's waker.
    pub task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for Activity {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.watchdog_woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Activity {
    #[inline]
    fn touch(&self) {
        if !self.active.load(Ordering::Relaxed) {
            self.active.store(true, Ordering::Relaxed);
        }
    }

    /// Whether bytes moved since the last call.
    pub fn take_active(&self) -> bool {
        self.active.swap(false, Ordering::Relaxed)
    }
}

/// A stream that records activity for the idle watchdog, first replays `pending` (bytes a
/// released hyper connection had read ahead, or a parked read), and writes the connection's
/// queued 1xx blocks where they cannot interleave with hyper's output.
///
/// hyper writes a response through its own buffer and flushes this stream only once that
/// buffer is drained, and it flushes at every poll of the connection. So the queue goes out
/// at a flush (hyper owes nothing then; the sink wakes the task for it, so a 103 goes out
/// while the handler still waits for the origin) or before the first write after one (the
/// final response's head), never inside a response (see [`interim::Shared`]). A TLS stream
/// goes below this wrapper, so 1xx blocks are encrypted like hyper's bytes.
pub struct Tracked<S> {
    pub inner: S,
    pub pending: Bytes,
    pub activity: Arc<Activity>,
    /// 1xx blocks to write before hyper's next output, and whether hyper owes bytes.
    interim: Arc<interim::Shared>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<Activity>, interim: Arc<interim::Shared>) -> Tracked<S> {
        Tracked {
            inner,
            pending: Bytes::new(),
            activity,
            interim,
        }
    }
}

impl<S: Stream> Tracked<S> {
    /// While parked: resolves when the peer has sent something or closed (see [`Stream`]).
    #[inline]
    pub fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_parked(cx, &mut self.pending)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pending.is_empty() {
            let n = self.pending.len().min(buf.remaining());
            buf.put_slice(&self.pending[..n]);
            if n == self.pending.len() {
                self.pending = Bytes::new();
            } else {
                self.pending.advance(n);
            }
            self.activity.touch();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        std::task::ready!(this.interim.poll_before_write(&mut this.inner, cx))?;
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        std::task::ready!(this.interim.poll_before_write(&mut this.inner, cx))?;
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        std::task::ready!(this.interim.poll_at_flush(&mut this.inner, cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// hyper's timer for HTTP/1.1 connections, where its one use is the request-head deadline
/// (`header_read_timeout`), set anew for every request. Instead of an entry in tokio's timer
/// wheel per request, the deadline is compared with the clock whenever hyper polls it: the
/// connection's watchdog (see `serve_h1`) wakes the task at least every `header_read_timeout`,
/// and hyper polls the deadline each time it finds no complete head, so a slow head is cut off
/// at most one watchdog tick late.
#[derive(Clone, Copy)]
pub struct WatchdogTimer;

impl hyper::rt::Timer for WatchdogTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(std::time::Instant::now() + duration))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(deadline))
    }
}

/// A deadline that registers no wakeup of its own (see [`WatchdogTimer`]).
struct Deadline(std::time::Instant);

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if std::time::Instant::now() >= self.0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl hyper::rt::Sleep for Deadline {}
