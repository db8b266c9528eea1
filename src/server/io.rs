//! A connection's bytes as the server drives them: the [`Stream`] a connection runs on (plain
//! TCP or TLS), the IO wrapper hyper reads and writes through ([`Tracked`]: activity for
//! the idle watchdog, read-ahead replayed after parking, 1xx blocks written between hyper's
//! responses, HTTP/2's writes batched per poll of the task), the watchdog's per-connection
//! state ([`Activity`]) and hyper's request-head timer ([`WatchdogTimer`]).

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::interim;

/// The byte stream of a client connection: what `connection::serve_connection` runs
/// on. Anything readable and writable serves; the one thing the server asks besides is how to
/// wait while a connection is parked (hyper's state freed, see `ServeH1`).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Whether the stream is TLS: its requests are marked [`crate::http::fields::Secure`].
    const SECURE: bool = false;

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

    /// Writes `bufs` into the stream's own send buffer and leaves the system call to
    /// `poll_flush` (or to when that buffer is full): see [`Tracked::batched`]. A stream
    /// without such a buffer writes through ([`Stream::poll_send`]).
    fn poll_write_held(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, bufs)
    }

    /// Whether bytes written by `poll_write_held` wait for a flush.
    fn holds_writes(&self) -> bool {
        false
    }

    /// Writes `bufs` through (the unbatched write). A plain socket sends them with
    /// `sendmsg` ([`crate::socket`]), cheaper in the kernel than the `writev` of its
    /// `AsyncWrite`, and a large body's slice lying in a memory file ([`crate::mapped`]) with
    /// `sendfile`, without copying it.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write_vectored(cx, bufs)
    }
}

/// A TLS connection parks with the default: rustls may hold decrypted bytes of its own, which a
/// readiness wait on the socket would not see.
///
/// rustls encrypts what it is given into records it keeps until they are written out (it
/// copies the plaintext once for that in any case), so a held write costs nothing more than a
/// written-through one: the records of several responses then leave in one `sendmsg`.
impl Stream for tokio_rustls::server::TlsStream<TcpStream> {
    const SECURE: bool = true;

    fn poll_write_held(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let (tcp, tls) = self.get_mut();
        loop {
            let n = io::Write::write_vectored(&mut tls.writer(), bufs)?;
            // Zero with something to write: rustls's send buffer is at its limit (64 KiB by
            // default), so records go out before more are made. Zero with nothing held is
            // rustls refusing more (it never has so far): the caller's write-zero error, not
            // a busy loop.
            if n > 0 || bufs.iter().all(|b| b.is_empty()) || !tls.wants_write() {
                return Poll::Ready(Ok(n));
            }
            std::task::ready!(poll_write_tls(tcp, tls, cx))?;
        }
    }

    fn holds_writes(&self) -> bool {
        self.get_ref().1.wants_write()
    }
}

/// Writes out every record rustls holds, in as few `sendmsg` calls as the socket takes.
fn poll_write_tls(
    tcp: &mut TcpStream,
    tls: &mut rustls::ServerConnection,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    /// rustls's records written to the socket without waiting; `WouldBlock` when it is full.
    struct Socket<'a>(&'a TcpStream);
    impl io::Write for Socket<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            crate::socket::try_send(self.0, &[io::IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
            crate::socket::try_send(self.0, bufs)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    while tls.wants_write() {
        match tls.write_tls(&mut Socket(tcp)) {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Ok(_) => {}
            // Readiness was cleared by the failed write: this registers the task's waker.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::task::ready!(tcp.poll_write_ready(cx))?
            }
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
    Poll::Ready(Ok(()))
}

impl Stream for TcpStream {
    #[inline]
    fn poll_parked(&mut self, cx: &mut Context<'_>, _: &mut Bytes) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }

    #[inline]
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        crate::socket::poll_send_zero_copy(self, cx, bufs)
    }
}

/// What a connection's task, its IO wrapper and its request handlers share, in one allocation
/// touched by every read and write anyway: what the idle watchdog and parking know about the
/// connection, the task's waker, and the 1xx state ([`interim::Shared`]). It is also the waker
/// the watchdog's own futures (timer, shutdown signal) are polled with, and the interim
/// sink's: that records that one of them fired and wakes the connection task, so that
/// `ServeH1` polls the watchdog only then. With thousands of connections this state is cold
/// when a request comes, so what a request reads comes first, together.
#[repr(C)]
pub struct Activity {
    /// Requests being handled now.
    pub in_flight: AtomicUsize,
    /// The connection task's waker.
    pub task: futures_util::task::AtomicWaker,
    /// Set by every read or write that moved bytes; cleared by the watchdog.
    active: AtomicBool,
    /// The current hyper connection has started a request.
    pub served: AtomicBool,
    /// A request of the current hyper connection came with a body. hyper may still be reading
    /// (or draining) it after the response, so the connection does not park after responses.
    pub with_body: AtomicBool,
    /// The watchdog's timer or the shutdown signal woke the task.
    pub watchdog_woken: AtomicBool,
    /// Batched writes ([`Tracked::batched`]): a flush was put off and is owed at the task's
    /// next poll, whose number the driver then advances ([`Activity::flush_at_next_poll`]).
    flush_owed: AtomicBool,
    poll_number: AtomicU32,
    /// 1xx responses queued for the client, and the hand-over after a 101.
    pub interim: interim::Shared,
    /// The server's metrics, when it counts requests: what each request of the connection is
    /// counted into when it completes (`connection::InService`), lent from here rather than a
    /// reference counted per request. The same for every router a reload gives the listener
    /// (`[admin]` changes only with a restart).
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl std::task::Wake for Activity {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        interim::Connection::wake(&**self);
    }
}

impl interim::Connection for Activity {
    #[inline]
    fn interim(&self) -> &interim::Shared {
        &self.interim
    }

    fn wake(&self) {
        self.watchdog_woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Activity {
    /// A new connection's; its dropped 1xx blocks are counted in `interim_dropped`, its
    /// requests in `metrics`.
    pub fn new(
        interim_dropped: interim::Dropped,
        metrics: Option<Arc<crate::metrics::Metrics>>,
    ) -> Activity {
        Activity {
            in_flight: AtomicUsize::new(0),
            task: Default::default(),
            active: AtomicBool::new(false),
            served: AtomicBool::new(false),
            with_body: AtomicBool::new(false),
            watchdog_woken: AtomicBool::new(false),
            flush_owed: AtomicBool::new(false),
            poll_number: AtomicU32::new(0),
            interim: interim::Shared::new(interim_dropped),
            metrics,
        }
    }

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

    /// Called by the connection's driver each time a poll of the connection ends `Pending`:
    /// if a batched stream put a flush off during that poll, the next poll counts as a new
    /// one (where the flush is done) and the task is woken for it.
    #[inline]
    pub fn flush_at_next_poll(&self, cx: &mut Context<'_>) {
        if self.flush_owed.load(Ordering::Relaxed) {
            self.flush_owed.store(false, Ordering::Relaxed);
            self.poll_number.fetch_add(1, Ordering::Relaxed);
            cx.waker().wake_by_ref();
        }
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
    /// Also holds the 1xx blocks to write before hyper's next output, and whether hyper owes
    /// bytes.
    pub activity: Arc<Activity>,
    /// Writes are held and flushes put off until the task's next poll (see [`Self::batched`]).
    batch: bool,
    /// The poll of the task in which a held flush was put off.
    flush_put_off_in: Option<u32>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Tracked<S> {
        Tracked {
            inner,
            pending: Bytes::new(),
            activity,
            batch: false,
            flush_put_off_in: None,
        }
    }

    /// Batches writes, for HTTP/2 (whose driver calls [`Activity::flush_at_next_poll`]).
    ///
    /// The h2 crate writes each DATA frame of 256 bytes or more straight from the response
    /// body, and flushes before it takes the next frame: one system call per response, with
    /// all a TCP send costs, when a poll of the connection often writes several responses
    /// (a client with many streams). Batched, writes go into the stream's own buffer
    /// ([`Stream::poll_write_held`]: rustls's records, for TLS) and the flushes of one poll of
    /// the task are put off to its next poll, which the driver asks for at once: the
    /// responses of one poll leave in one `sendmsg`. A stream that holds nothing writes
    /// through and its flushes are never put off.
    pub fn batched(mut self) -> Tracked<S> {
        self.batch = true;
        self
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

impl<S: Stream> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        std::task::ready!(this.activity.interim.poll_before_write(&mut this.inner, cx))?;
        let r = if this.batch {
            this.inner.poll_write_held(cx, &[io::IoSlice::new(buf)])
        } else {
            this.inner.poll_send(cx, &[io::IoSlice::new(buf)])
        };
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
        std::task::ready!(this.activity.interim.poll_before_write(&mut this.inner, cx))?;
        let r = if this.batch {
            this.inner.poll_write_held(cx, bufs)
        } else {
            this.inner.poll_send(cx, bufs)
        };
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
        if this.batch && this.inner.holds_writes() {
            // Put off within the poll of the task where it was first asked; done in the next.
            let poll = this.activity.poll_number.load(Ordering::Relaxed);
            match this.flush_put_off_in {
                Some(p) if p != poll => {}
                _ => {
                    this.flush_put_off_in = Some(poll);
                    this.activity.flush_owed.store(true, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
            }
        }
        std::task::ready!(this.activity.interim.poll_at_flush(&mut this.inner, cx))?;
        std::task::ready!(Pin::new(&mut this.inner).poll_flush(cx))?;
        this.flush_put_off_in = None;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// hyper's timer for HTTP/1.1 connections, where its one use is the request-head deadline
/// (`header_read_timeout`), set anew for every request. Instead of an entry in tokio's timer
/// wheel per request, the deadline is compared with the clock whenever hyper polls it: the
/// connection's watchdog (see `ServeH1`) wakes the task at least every `header_read_timeout`,
/// and hyper polls the deadline each time it finds no complete head, so a slow head is cut off
/// at most one watchdog tick late.
#[derive(Clone, Copy)]
pub struct WatchdogTimer;

impl hyper::rt::Timer for WatchdogTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(crate::clock::coarse_instant() + duration))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(Deadline(deadline))
    }

    /// The coarse clock: the deadline is seconds away and checked at watchdog ticks, so a
    /// few milliseconds of error do not matter, and hyper asks for the time at every request.
    fn now(&self) -> std::time::Instant {
        crate::clock::coarse_instant()
    }
}

/// A deadline that registers no wakeup of its own (see [`WatchdogTimer`]).
struct Deadline(std::time::Instant);

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if crate::clock::coarse_instant() >= self.0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl hyper::rt::Sleep for Deadline {}
