//! The raw reader: HTTP/1.1 over a bare socket, for what no well-behaved client sends or
//! shows (pipelining, split or dripped heads, interim responses, bytes after a response).
//! [`Raw`] writes bytes as given and reads responses back one at a time, never a byte past
//! the one asked for; [`read_head`] reads a request head for origins that speak raw bytes.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

/// How long a read that must succeed waits before the test fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A response read off a raw connection.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// The head as it came: status line, fields and the empty line.
    pub head: String,
    /// Fields by lowercased name; of a repeated field, the last.
    pub headers: HashMap<String, String>,
    /// The body, de-chunked when it was chunked.
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Why a read brought nothing.
#[derive(Debug)]
enum Short {
    /// The peer closed the connection.
    Closed,
    /// The connection failed (reset by the peer...).
    Failed(std::io::Error),
    /// Nothing came in time.
    Late,
}

/// A client connection that speaks raw bytes.
pub struct Raw {
    stream: TcpStream,
    /// Bytes read and not yet handed out. Emptied buffers are freed: a held connection costs
    /// no more heap than its socket (tests/conn_memory.rs counts it).
    buf: Vec<u8>,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw::try_connect(addr).await.expect("connect")
    }

    pub async fn try_connect(addr: SocketAddr) -> std::io::Result<Raw> {
        Ok(Raw::from(TcpStream::connect(addr).await?))
    }

    /// A connection from `source` (another loopback address than 127.0.0.1).
    pub async fn connect_from(source: IpAddr, to: SocketAddr) -> Raw {
        let socket = match source {
            IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .unwrap();
        socket.bind(SocketAddr::new(source, 0)).unwrap();
        Raw::from(socket.connect(to).await.unwrap())
    }

    pub async fn write(&mut self, bytes: impl AsRef<[u8]>) {
        self.try_write(bytes).await.expect("write");
    }

    /// Writes where the peer may have closed already.
    pub async fn try_write(&mut self, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
        self.stream.write_all(bytes.as_ref()).await
    }

    /// Reads the next response (an interim 1xx is one too).
    pub async fn response(&mut self) -> RawResponse {
        self.must(false).await
    }

    /// Reads the next response to a HEAD request (no body, whatever its fields say).
    pub async fn head_response(&mut self) -> RawResponse {
        self.must(true).await
    }

    /// The next response, or None when the connection closes or the response is not whole
    /// within `wait`.
    pub async fn try_response(&mut self, wait: Duration) -> Option<RawResponse> {
        self.read_response(false, Instant::now() + wait).await.ok()
    }

    /// Reads until `done` holds for the bytes read (and not handed out) so far; returns them.
    pub async fn read_until(&mut self, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let deadline = Instant::now() + PATIENCE;
        while !done(&self.buf) {
            if let Err(e) = self.fill(deadline).await {
                panic!(
                    "{e:?} before the end: {}",
                    String::from_utf8_lossy(&self.buf)
                );
            }
        }
        self.take(self.buf.len())
    }

    /// What one read brings within `wait` (bytes read before first), None when nothing came:
    /// like a read on a socket with a read timeout. Empty when the peer closed.
    pub async fn read_some(&mut self, wait: Duration) -> Option<std::io::Result<Vec<u8>>> {
        if self.buf.is_empty() {
            match self.fill(Instant::now() + wait).await {
                Err(Short::Late) => return None,
                Err(Short::Failed(e)) => return Some(Err(e)),
                Err(Short::Closed) | Ok(()) => {}
            }
        }
        Some(Ok(self.take(self.buf.len())))
    }

    /// Everything until the peer closes (or the connection fails); fails the test if it has not
    /// closed within `wait`.
    pub async fn read_to_end(&mut self, wait: Duration) -> Vec<u8> {
        let deadline = Instant::now() + wait;
        loop {
            match self.fill(deadline).await {
                Ok(()) => {}
                Err(Short::Closed | Short::Failed(_)) => return self.take(self.buf.len()),
                Err(Short::Late) => panic!(
                    "still open after {wait:?}: {}",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    /// Whether the peer closes the connection (or it fails) within `wait`; what it sends
    /// before is dropped.
    pub async fn closes_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            match self.fill(deadline).await {
                Ok(()) => self.buf.clear(),
                Err(Short::Closed | Short::Failed(_)) => return true,
                Err(Short::Late) => return false,
            }
        }
    }

    async fn must(&mut self, head_only: bool) -> RawResponse {
        match self
            .read_response(head_only, Instant::now() + PATIENCE)
            .await
        {
            Ok(r) => r,
            Err(e) => panic!(
                "no whole response ({e:?}); got {}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    async fn read_response(
        &mut self,
        head_only: bool,
        deadline: Instant,
    ) -> Result<RawResponse, Short> {
        let end = loop {
            if let Some(end) = head_end(&self.buf) {
                break end;
            }
            self.fill(deadline).await?;
        };
        let mut fields = [httparse::EMPTY_HEADER; 256];
        let mut parsed = httparse::Response::new(&mut fields);
        parsed
            .parse(&self.buf[..end])
            .expect("a well-formed response head");
        let status = parsed.code.unwrap();
        let headers: HashMap<String, String> = parsed
            .headers
            .iter()
            .map(|f| {
                let value = String::from_utf8_lossy(f.value).trim().to_string();
                (f.name.to_ascii_lowercase(), value)
            })
            .collect();
        let bodiless = head_only || status < 200 || status == 204 || status == 304;
        let chunked = headers
            .get("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().ends_with("chunked"));
        let length: Option<usize> = headers.get("content-length").map(|v| v.parse().unwrap());
        let (body, used) = if bodiless {
            (Vec::new(), end)
        } else if chunked {
            self.chunked_body(end, deadline).await?
        } else if let Some(len) = length {
            while self.buf.len() < end + len {
                self.fill(deadline).await?;
            }
            (self.buf[end..end + len].to_vec(), end + len)
        } else {
            // Delimited by the close (RFC 9112 §6.3, item 8).
            loop {
                match self.fill(deadline).await {
                    Ok(()) => {}
                    Err(Short::Closed | Short::Failed(_)) => break,
                    Err(late) => return Err(late),
                }
            }
            (self.buf[end..].to_vec(), self.buf.len())
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.take(used);
        Ok(RawResponse {
            status,
            head,
            headers,
            body,
        })
    }

    /// The body of a chunked response whose head ends at `at`, and where it ends.
    async fn chunked_body(
        &mut self,
        mut at: usize,
        deadline: Instant,
    ) -> Result<(Vec<u8>, usize), Short> {
        let mut body = Vec::new();
        loop {
            let (line, size) = match httparse::parse_chunk_size(&self.buf[at..]) {
                Ok(httparse::Status::Complete(c)) => c,
                Ok(httparse::Status::Partial) => {
                    self.fill(deadline).await?;
                    continue;
                }
                Err(_) => panic!("bad chunk size: {}", String::from_utf8_lossy(&self.buf)),
            };
            let size = size as usize;
            if size == 0 {
                // The trailer section ends with an empty line.
                at += line;
                loop {
                    if self.buf[at..].starts_with(b"\r\n") {
                        return Ok((body, at + 2));
                    }
                    if let Some(end) = head_end(&self.buf[at..]) {
                        return Ok((body, at + end));
                    }
                    self.fill(deadline).await?;
                }
            }
            while self.buf.len() < at + line + size + 2 {
                self.fill(deadline).await?;
            }
            body.extend_from_slice(&self.buf[at + line..at + line + size]);
            at += line + size + 2;
        }
    }

    /// Reads what is there into the buffer.
    async fn fill(&mut self, deadline: Instant) -> Result<(), Short> {
        match timeout_at(deadline, read_more(&mut self.stream, &mut self.buf)).await {
            Err(_) => Err(Short::Late),
            Ok(Ok(0)) => Err(Short::Closed),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Short::Failed(e)),
        }
    }

    /// Hands out the first `n` bytes read.
    fn take(&mut self, n: usize) -> Vec<u8> {
        // What stays is moved to a buffer of its size: none when nothing stays.
        let rest = self.buf.split_off(n);
        std::mem::replace(&mut self.buf, rest)
    }
}

impl From<TcpStream> for Raw {
    fn from(stream: TcpStream) -> Raw {
        Raw {
            stream,
            buf: Vec::new(),
        }
    }
}

/// Sends raw bytes to `addr` on a new connection and reads until the peer closes (which it
/// must within 5 s): for requests no well-behaved client would send. Ask for
/// `Connection: close`.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = Raw::connect(addr).await;
    s.write(request).await;
    String::from_utf8_lossy(&s.read_to_end(Duration::from_secs(5)).await).into_owned()
}

/// One request on a new connection, with `fields` ("Name: value") and `Connection: close`;
/// its response, read whole (no body to a HEAD).
pub async fn raw_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    fields: &[&str],
) -> RawResponse {
    let mut s = Raw::connect(addr).await;
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: t\r\n");
    for f in fields {
        req.push_str(f);
        req.push_str("\r\n");
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write(req).await;
    if method == "HEAD" {
        s.head_response().await
    } else {
        s.response().await
    }
}

/// Reads one request head from a raw socket, with whatever followed it in the same reads;
/// None when the peer closed first. For origins that speak raw bytes.
pub async fn read_head(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    while head_end(&got).is_none() {
        if read_more(s, &mut got).await.unwrap_or(0) == 0 {
            return None;
        }
    }
    Some(got)
}

/// Where the head at the start of `bytes` ends (after its empty line), once it is all there.
fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

/// One read appended to `buf`: how many bytes, 0 when the peer closed.
async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.reserve(16 * 1024);
    s.read_buf(buf).await
}
