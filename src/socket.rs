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
//! connections ([`SendStream`]). The byte pipe of an upgraded connection (WebSocket
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
    let fd = tcp.as_raw_fd();
    let n = match bufs {
        [one] => send_one(fd, one),
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
                send_one(fd, joined)
            } else {
                let bufs = &bufs[..bufs.len().min(MAX_SLICES)];
                // SAFETY: a zeroed msghdr is valid (no address, no control data); `IoSlice`
                // is ABI-compatible with `iovec` on Unix (std documents it), and `bufs`
                // outlives the call, which only reads through the pointers.
                unsafe {
                    let mut msg: libc::msghdr = std::mem::zeroed();
                    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
                    msg.msg_iovlen = bufs.len() as _;
                    libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL)
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
fn send_one(fd: std::os::fd::RawFd, buf: &[u8]) -> isize {
    // SAFETY: `buf` is valid for `buf.len()` bytes for the call, which only reads it.
    unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) }
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
