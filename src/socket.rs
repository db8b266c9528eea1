//! Writes to TCP sockets with `send(2)` or `sendmsg(2)`, not `write(2)`/`writev(2)`.
//!
//! tokio writes a `TcpStream` through the file interface (`writev`), and the kernel's
//! `vfs_writev` does file-level work on every call that a socket does not need (the file's
//! notification and accounting checks): with thousands of connections those fields are cold,
//! and perf counted about 500 ns per response there at 4,000 connections (about 80 ns at 100),
//! where `sendmsg` goes straight to the socket. The minimal server in `bench/ceiling.c` spends
//! about 230 ns more per response at 4,000 connections when it writes with `writev` instead of
//! `send` (docs/design.md "Socket writes").
//!
//! Every HTTP write to a plain TCP socket goes through [`poll_send`]: the server's connections
//! ([`crate::server::Stream`] for `TcpStream`, TLS records included) and larder's own upstream
//! connections ([`SendStream`]). The server's plain (not TLS) connections write through
//! [`poll_send_zero_copy`], which sends a slice of a mapped body ([`crate::mapped`]) with
//! `sendfile` instead of copying it. The byte pipe of an upgraded connection (WebSocket
//! pass-through, after the 101) still writes the client's side with tokio's own calls.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// At most this many slices go in one call (Linux's `UIO_MAXIOV`); the rest is the caller's
/// next write, as with a short write.
const MAX_SLICES: usize = 1024;

/// Slices totalling at most this many bytes (a small response's head and body) are copied
/// into one buffer and sent with `send`: `sendmsg` copies in its message header and iovec
/// array on every call, about 140 ns more than `send` of the same 315 bytes here (a loopback
/// pair, send and receive in a loop), while copying 315 bytes costs a few ns.
const COPY_UP_TO: usize = 2048;

/// `bufs` written to `tcp` with one `send` (one slice, or a few small ones joined) or
/// `sendmsg` once the socket is writable: the bytes taken (possibly fewer than offered), or
/// the socket's error. `MSG_NOSIGNAL`: a peer that closed gives `EPIPE`, not a signal.
pub fn poll_send(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    loop {
        std::task::ready!(tcp.poll_write_ready(cx))?;
        // A call that would block clears the readiness, so the next `poll_write_ready`
        // registers the task's waker.
        match try_send(tcp, bufs) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

/// `bufs` written to `tcp` now, or `WouldBlock` (its readiness cleared) when it is full.
pub fn try_send(tcp: &TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    tcp.try_io(Interest::WRITABLE, || send(tcp, bufs))
}

fn send(tcp: &TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    send_flags(tcp.as_raw_fd(), bufs, libc::MSG_NOSIGNAL)
}

/// `bufs` with `send` or `sendmsg` and `flags`.
fn send_flags(
    fd: std::os::fd::RawFd,
    bufs: &[IoSlice<'_>],
    flags: libc::c_int,
) -> io::Result<usize> {
    let n = match bufs {
        [one] => send_one(fd, one, flags),
        _ => {
            let total = bufs.iter().map(|b| b.len()).sum::<usize>();
            if total <= COPY_UP_TO {
                // Not zeroed first: only the `total` bytes written below are sent.
                let mut joined = [std::mem::MaybeUninit::<u8>::uninit(); COPY_UP_TO];
                let mut at = 0;
                for b in bufs {
                    // SAFETY: `at + b.len() <= total <= COPY_UP_TO`, so the copy stays in
                    // `joined`, which does not overlap `b`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            b.as_ptr(),
                            joined.as_mut_ptr().add(at).cast::<u8>(),
                            b.len(),
                        )
                    };
                    at += b.len();
                }
                // SAFETY: the first `total` bytes of `joined` were written above.
                let joined =
                    unsafe { std::slice::from_raw_parts(joined.as_ptr().cast::<u8>(), at) };
                send_one(fd, joined, flags)
            } else {
                let bufs = &bufs[..bufs.len().min(MAX_SLICES)];
                // SAFETY: a zeroed msghdr is valid (no address, no control data); `IoSlice`
                // is ABI-compatible with `iovec` on Unix (std documents it), and `bufs`
                // outlives the call, which only reads through the pointers.
                unsafe {
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
                    msg.msg_iovlen = bufs.len() as _;
                    libc::sendmsg(fd, &msg, flags)
                }
            }
        }
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One buffer with `send(2)`.
fn send_one(fd: std::os::fd::RawFd, buf: &[u8], flags: libc::c_int) -> isize {
    // SAFETY: `buf` is valid for `buf.len()` bytes for the call, which only reads it.
    unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), flags) }
}

/// A slice at least this long that lies in a mapped body ([`crate::mapped`]) is sent with
/// `sendfile`; shorter ones (a small range of a large body) are copied like any other.
const SENDFILE_MIN: usize = 16 * 1024;

/// Bytes sent with `sendfile` since start, by every connection (tests read it: the path was
/// taken).
static SENT_ZERO_COPY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes the server has sent with `sendfile` so far.
pub fn sent_zero_copy() -> u64 {
    SENT_ZERO_COPY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Like [`poll_send`], for the server's plain HTTP connections: a slice of a mapped body
/// ([`crate::mapped::find`]) goes with `sendfile(2)` from its memory file, its pages handed
/// to the socket without a copy; what comes before it (the response's head) goes first with
/// `MSG_MORE`, so the head and the body's first bytes leave in one segment.
pub fn poll_send_zero_copy(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    loop {
        std::task::ready!(tcp.poll_write_ready(cx))?;
        match tcp.try_io(Interest::WRITABLE, || {
            send_zero_copy(tcp.as_raw_fd(), bufs, crate::mapped::find)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

/// Where a write's zero-copy part is: the first slice of at least [`SENDFILE_MIN`] bytes that
/// `find` places in a memory file, as (its index, the file, its offset there).
fn zero_copy_part(
    bufs: &[IoSlice<'_>],
    find: impl Fn(&[u8]) -> Option<(std::os::fd::RawFd, u64)>,
) -> Option<(usize, std::os::fd::RawFd, u64)> {
    bufs.iter()
        .enumerate()
        .filter(|(_, b)| b.len() >= SENDFILE_MIN)
        .find_map(|(i, b)| find(b).map(|(fd, off)| (i, fd, off)))
}

/// One write of `bufs` to `fd`: the slices before the zero-copy part (if any) with `sendmsg`,
/// then that part with `sendfile`; the bytes taken, counted from the first slice as a
/// `sendmsg` of them all would. It stops at the first short write (the caller writes the rest
/// next), and after the zero-copy part (what follows it is the next write). A `sendfile` that
/// would block after the head went out is a short write of the head, not `WouldBlock`: the
/// next call meets the full socket and clears its readiness then.
fn send_zero_copy(
    fd: std::os::fd::RawFd,
    bufs: &[IoSlice<'_>],
    find: impl Fn(&[u8]) -> Option<(std::os::fd::RawFd, u64)>,
) -> io::Result<usize> {
    let Some((i, file, offset)) = zero_copy_part(bufs, find) else {
        return send_flags(fd, bufs, libc::MSG_NOSIGNAL);
    };
    let head: usize = bufs[..i].iter().map(|b| b.len()).sum();
    let mut sent = 0;
    if head > 0 {
        sent = send_flags(fd, &bufs[..i], libc::MSG_NOSIGNAL | libc::MSG_MORE)?;
        if sent < head {
            return Ok(sent);
        }
    }
    let mut offset = offset as libc::off_t;
    // SAFETY: `file` is the memory file holding `bufs[i]` (alive while the caller holds the
    // slice) and `offset` a valid pointer for the call. sendfile has no MSG_NOSIGNAL, but
    // Rust's runtime ignores SIGPIPE before `main`: a closed peer gives EPIPE.
    let n = unsafe { libc::sendfile(fd, file, &mut offset, bufs[i].len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // With the head out, any failure (a full socket, a closed peer) comes again with the
        // next write.
        return if sent > 0 { Ok(sent) } else { Err(e) };
    }
    SENT_ZERO_COPY.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(sent + n as usize)
}

/// A `TcpStream` whose writes go through [`poll_send`]; reads are the stream's own (`recv`).
/// For IO handed to hyper whole (larder's upstream connections).
#[derive(Debug)]
pub struct SendStream(pub TcpStream);

impl AsyncRead for SendStream {
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SendStream {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        poll_send(&self.0, cx, &[IoSlice::new(buf)])
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        poll_send(&self.0, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn slices_arrive_in_order_and_reads_pass_through() {
        let (a, mut b) = pair().await;
        let mut s = SendStream(a);
        let n = std::future::poll_fn(|cx| {
            Pin::new(&mut s).poll_write_vectored(
                cx,
                &[
                    IoSlice::new(b"head "),
                    IoSlice::new(b""),
                    IoSlice::new(b"body"),
                ],
            )
        })
        .await
        .unwrap();
        assert_eq!(n, 9);
        s.write_all(b"!").await.unwrap();
        let mut got = [0u8; 10];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"head body!");
        b.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");
    }

    /// Small slices are joined and sent with `send`, larger ones with `sendmsg`: both keep the
    /// order and every byte, also when some slices are empty.
    #[tokio::test]
    async fn joined_and_scattered_writes_keep_every_byte_in_order() {
        let (a, mut b) = pair().await;
        let mut s = SendStream(a);
        let head = vec![b'h'; 300];
        let small = [b's'; 100];
        let large = vec![b'l'; 5000];
        let mut expected = Vec::new();
        for (bufs, joined) in [
            (vec![&head[..], &[][..], &small[..]], true),
            (vec![&head[..], &large[..], &small[..]], false),
            (vec![&small[..COPY_UP_TO / 100], &head[..]], true),
        ] {
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            assert_eq!(total <= COPY_UP_TO, joined);
            let slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
            // All of it fits in an empty loopback socket's buffer: taken whole.
            let n = std::future::poll_fn(|cx| Pin::new(&mut s).poll_write_vectored(cx, &slices))
                .await
                .unwrap();
            assert_eq!(n, total);
            bufs.iter().for_each(|b| expected.extend_from_slice(b));
        }
        drop(s);
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, expected);
    }

    /// A full socket makes the writer wait (not spin, not fail), and it goes on once the
    /// reader drains it; every byte arrives.
    #[tokio::test]
    async fn a_full_socket_waits_for_the_reader() {
        let (a, mut b) = pair().await;
        let mut s = SendStream(a);
        let chunk = vec![7u8; 1 << 20];
        let writer = tokio::spawn(async move {
            for _ in 0..16 {
                s.write_all(&chunk).await.unwrap();
            }
            s.shutdown().await.unwrap();
        });
        // The writer fills the socket's buffers before anything is read.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !writer.is_finished(),
            "16 MiB cannot fit in the socket's buffers"
        );
        let mut all = Vec::new();
        b.read_to_end(&mut all).await.unwrap();
        writer.await.unwrap();
        assert_eq!(all.len(), 16 << 20);
        assert!(all.iter().all(|&x| x == 7));
    }

    #[tokio::test]
    async fn a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = pair().await;
        drop(b);
        let mut s = SendStream(a);
        let mut failed = false;
        // The first write may be taken before the peer's reset arrives.
        for _ in 0..100 {
            if s.write_all(&[1u8; 65536]).await.is_err() {
                failed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(failed, "writing to a closed peer fails");
    }

    /// Writes `parts` whole through `poll_send_zero_copy` the way hyper does (the slices not
    /// yet taken, advanced by each call's count).
    async fn write_all_zero_copy(tcp: &TcpStream, parts: &[bytes::Bytes]) -> Vec<usize> {
        let mut parts: Vec<bytes::Bytes> = parts.to_vec();
        let mut counts = Vec::new();
        while parts.iter().any(|p| !p.is_empty()) {
            let slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
            let mut n = std::future::poll_fn(|cx| poll_send_zero_copy(tcp, cx, &slices))
                .await
                .unwrap();
            assert!(n > 0);
            counts.push(n);
            for p in parts.iter_mut() {
                let take = n.min(p.len());
                bytes::Buf::advance(p, take);
                n -= take;
            }
        }
        counts
    }

    fn mapped_body(len: usize) -> bytes::Bytes {
        let heap = bytes::Bytes::from((0..len).map(|i| (i * 7 % 253) as u8).collect::<Vec<_>>());
        let body = crate::mapped::map(heap);
        assert!(crate::mapped::find(&body).is_some(), "mapped");
        body
    }

    /// A response's head, a mapped body far larger than the socket's buffers (many short
    /// sendfiles, the writer waiting for the slow reader between them) and the next response
    /// arrive byte for byte in order; the first call takes the head with the body's start and
    /// stops after the body (never past it).
    #[tokio::test]
    async fn a_mapped_body_goes_whole_and_in_order_through_short_writes() {
        let (a, mut b) = pair().await;
        let head = bytes::Bytes::from(vec![b'h'; 300]);
        let body = mapped_body(4 << 20);
        let next = bytes::Bytes::from_static(b"next response");
        let parts = [
            head.clone(),
            body.clone(),
            next.clone(),
            body.slice(1000..40_000),
        ];
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = b.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return all;
                }
                all.extend_from_slice(&chunk[..n]);
                // A slow reader: the writer meets a full socket.
                tokio::task::yield_now().await;
            }
        });
        let counts = write_all_zero_copy(&a, &parts).await;
        drop(a);
        let got = reader.await.unwrap();
        let expected: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "every byte in order");
        assert!(counts[0] > head.len(), "head and body start in one call");
        assert!(counts.len() > 2, "the body went in several short writes");
        let body_end = head.len() + body.len();
        let mut at = 0;
        for n in &counts {
            if at < body_end {
                assert!(
                    at + n <= body_end,
                    "no call runs from the body into what follows"
                );
            }
            at += n;
        }
    }

    /// The zero-copy part is the first large slice inside a mapping; small or heap slices are
    /// not, and without one the write is an ordinary send.
    #[test]
    fn the_zero_copy_part_is_the_first_large_mapped_slice() {
        let body = mapped_body(SENDFILE_MIN * 4);
        let heap = vec![0u8; SENDFILE_MIN * 2];
        let (fd, _) = crate::mapped::find(&body).unwrap();
        let small = &body[..SENDFILE_MIN - 1];
        let slices = [
            IoSlice::new(b"head"),
            IoSlice::new(small),
            IoSlice::new(&heap),
            IoSlice::new(&body[10..]),
        ];
        assert_eq!(
            zero_copy_part(&slices, crate::mapped::find),
            Some((3, fd, 10))
        );
        assert_eq!(zero_copy_part(&slices[..3], crate::mapped::find), None);
    }

    /// A peer gone mid-body is an error for the writer, not a signal or a hang.
    #[tokio::test]
    async fn a_closed_peer_mid_body_is_an_error() {
        let (a, b) = pair().await;
        let body = mapped_body(8 << 20);
        drop(b);
        let slices = [IoSlice::new(&body)];
        let mut failed = false;
        for _ in 0..100 {
            match std::future::poll_fn(|cx| poll_send_zero_copy(&a, cx, &slices)).await {
                Err(_) => {
                    failed = true;
                    break;
                }
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
        assert!(failed);
    }

    #[tokio::test]
    async fn try_send_says_would_block_when_full() {
        let (a, _b) = pair().await;
        a.writable().await.unwrap();
        let chunk = vec![0u8; 1 << 20];
        let mut sent = 0usize;
        loop {
            match try_send(&a, &[IoSlice::new(&chunk)]) {
                Ok(n) => sent += n,
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
            assert!(sent < 1 << 30, "never full");
        }
        assert!(sent > 0);
    }
}
