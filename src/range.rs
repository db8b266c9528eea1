//! Byte ranges (RFC 9110 §14): parsing `Range` against a representation's length, `If-Range`,
//! and building the 206 response, one range or several as `multipart/byteranges`, from a body
//! held in memory (`Bytes`, sliced without copying) or from a file (read in bounded chunks).
//!
//! Used by [`crate::static_files`] and the caching proxy's stored entries: a caller decides the
//! representation (its length, validators, Content-Type), asks [`evaluate`] what to do, and on
//! [`Decision::Partial`] calls [`partial`]; on [`Decision::Unsatisfiable`], [`unsatisfiable`].
//! A 200 passed through from an origin that ignored Range has one range cut from its stream
//! ([`slice_stream`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Frame, SizeHint};

use crate::body::{Body, BoxError};
use crate::http::{date, etag};

/// More ranges than this in one request are not worth serving as parts (a known abuse: many
/// tiny overlapping ranges); such a Range field is ignored and the whole body sent.
pub const MAX_RANGES: usize = 64;

/// Bytes read from a file per chunk when streaming.
pub const FILE_CHUNK: usize = 128 * 1024;

/// One satisfiable range, inclusive on both ends (`first..=last`), as in `Content-Range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub first: u64,
    pub last: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    fn content_range(&self, complete: u64) -> String {
        format!("bytes {}-{}/{}", self.first, self.last, complete)
    }
}

/// What to do with a request's Range field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No (usable) Range field, or If-Range failed: send the whole representation with 200.
    Full,
    /// Send these ranges with 206 (in request order; overlapping ones merged).
    Partial(Vec<ByteRange>),
    /// None of the ranges overlaps the representation: 416.
    Unsatisfiable,
}

/// Parses a Range field value against a representation of `len` bytes (§14.1.2, §14.2).
/// Unknown units and syntax errors yield `Full` (the field is ignored, §14.2).
pub fn parse(value: &[u8], len: u64) -> Decision {
    let Ok(s) = std::str::from_utf8(value) else {
        return Decision::Full;
    };
    let s = s.trim();
    let Some(set) = s
        .get(..6)
        .filter(|u| u.eq_ignore_ascii_case("bytes="))
        .map(|_| &s[6..])
    else {
        return Decision::Full;
    };
    let mut ranges = Vec::new();
    let mut any = false;
    for spec in set.split(',') {
        let spec = spec.trim();
        if spec.is_empty() {
            continue; // §5.6.1: empty list elements are allowed
        }
        any = true;
        if ranges.len() >= MAX_RANGES {
            return Decision::Full;
        }
        let Some((a, b)) = spec.split_once('-') else {
            return Decision::Full;
        };
        let (a, b) = (a.trim(), b.trim());
        if a.is_empty() {
            // suffix-range: the last N bytes.
            let Some(n) = parse_u64(b) else {
                return Decision::Full;
            };
            if n > 0 && len > 0 {
                ranges.push(ByteRange {
                    first: len.saturating_sub(n),
                    last: len - 1,
                });
            }
            continue;
        }
        let Some(first) = parse_u64(a) else {
            return Decision::Full;
        };
        let last = if b.is_empty() {
            None
        } else {
            match parse_u64(b) {
                Some(l) if l >= first => Some(l),
                _ => return Decision::Full,
            }
        };
        if first < len {
            ranges.push(ByteRange {
                first,
                last: last.map_or(len - 1, |l| l.min(len - 1)),
            });
        }
    }
    if !any {
        return Decision::Full;
    }
    if ranges.is_empty() {
        return Decision::Unsatisfiable;
    }
    Decision::Partial(coalesce(ranges))
}

fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Merges overlapping ranges (§14.2 allows it; it keeps a response no larger than the body
/// times one). When nothing overlaps, the request's order is kept.
fn coalesce(mut ranges: Vec<ByteRange>) -> Vec<ByteRange> {
    if ranges.len() < 2 {
        return ranges;
    }
    let mut sorted = ranges.clone();
    sorted.sort_by_key(|r| r.first);
    let overlaps = sorted.windows(2).any(|w| w[1].first <= w[0].last);
    if !overlaps {
        return ranges;
    }
    ranges.clear();
    for r in sorted {
        match ranges.last_mut() {
            Some(prev) if r.first <= prev.last.saturating_add(1) => {
                prev.last = prev.last.max(r.last);
            }
            _ => ranges.push(r),
        }
    }
    ranges
}

/// Whether an If-Range field lets the Range apply (§13.1.5): an entity-tag must match `etag`
/// strongly; a date must equal `last_modified` exactly. No If-Range: true.
pub fn if_range_allows(
    if_range: Option<&HeaderValue>,
    etag: Option<&HeaderValue>,
    last_modified: Option<SystemTime>,
) -> bool {
    let Some(v) = if_range else {
        return true;
    };
    let b = v.as_bytes();
    if b.starts_with(b"\"") || b.starts_with(b"W/") {
        // Weak tags never match (strong comparison).
        return etag.is_some_and(|e| etag::strong_eq(v, e));
    }
    let (Some(lm), Some(since)) = (last_modified, date::parse(v)) else {
        return false;
    };
    date::secs(lm) == date::secs(since)
}

/// The whole Range decision for a GET: `Range` and `If-Range` from `req` against a representation
/// of `len` bytes with these validators.
pub fn evaluate(
    req: &HeaderMap,
    len: u64,
    etag: Option<&HeaderValue>,
    last_modified: Option<SystemTime>,
) -> Decision {
    decide(
        req.get(header::RANGE),
        req.get(header::IF_RANGE),
        len,
        etag,
        last_modified,
    )
}

/// [`evaluate`] from the values of `Range` and `If-Range` (taken from a request already sent on).
pub fn decide(
    range: Option<&HeaderValue>,
    if_range: Option<&HeaderValue>,
    len: u64,
    etag: Option<&HeaderValue>,
    last_modified: Option<SystemTime>,
) -> Decision {
    let Some(range) = range else {
        return Decision::Full;
    };
    if !if_range_allows(if_range, etag, last_modified) {
        return Decision::Full;
    }
    parse(range.as_bytes(), len)
}

/// Where the bytes of a partial response come from.
pub enum Source {
    /// A body in memory; parts are zero-copy slices.
    Bytes(Bytes),
    /// A file, read in [`FILE_CHUNK`] pieces as the connection drains (memory stays bounded).
    File(Arc<std::fs::File>),
}

/// A 416 with `Content-Range: bytes */len` (§15.5.17).
pub fn unsatisfiable(len: u64) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
        r.headers_mut().insert(header::CONTENT_RANGE, v);
    }
    r
}

/// Builds a 206 for `ranges` of a representation of `len` bytes. `headers` are the headers of
/// the full 200 response (Content-Type, ETag, ...); Content-Length is replaced, and for several
/// ranges Content-Type becomes `multipart/byteranges` with the original type in each part.
/// `head_only` builds the same headers with no body.
pub fn partial(
    ranges: &[ByteRange],
    len: u64,
    mut headers: HeaderMap,
    source: Source,
    head_only: bool,
) -> Response<Body> {
    headers.remove(header::CONTENT_LENGTH);
    let segments: Vec<Segment>;
    let total: u64;
    if let [r] = ranges {
        set_content_range(&mut headers, r, len);
        segments = vec![Segment::Range(*r)];
        total = r.len();
    } else {
        let boundary = boundary();
        let part_type = headers.get(header::CONTENT_TYPE).cloned();
        let mut segs = Vec::with_capacity(ranges.len() * 2 + 1);
        let mut sum = 0u64;
        for (i, r) in ranges.iter().enumerate() {
            let mut head = String::with_capacity(96);
            if i > 0 {
                head.push_str("\r\n");
            }
            head.push_str("--");
            head.push_str(&boundary);
            head.push_str("\r\n");
            if let Some(t) = part_type.as_ref().and_then(|t| t.to_str().ok()) {
                head.push_str("Content-Type: ");
                head.push_str(t);
                head.push_str("\r\n");
            }
            head.push_str("Content-Range: ");
            head.push_str(&r.content_range(len));
            head.push_str("\r\n\r\n");
            sum += head.len() as u64 + r.len();
            segs.push(Segment::Literal(Bytes::from(head)));
            segs.push(Segment::Range(*r));
        }
        let tail = format!("\r\n--{boundary}--\r\n");
        sum += tail.len() as u64;
        segs.push(Segment::Literal(Bytes::from(tail)));
        if let Ok(v) = HeaderValue::from_str(&format!("multipart/byteranges; boundary={boundary}"))
        {
            headers.insert(header::CONTENT_TYPE, v);
        }
        segments = segs;
        total = sum;
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(total));
    let body = if head_only {
        Body::empty()
    } else {
        match source {
            Source::Bytes(b) => {
                let chunks: VecDeque<Bytes> = segments
                    .into_iter()
                    .map(|s| match s {
                        Segment::Literal(l) => l,
                        Segment::Range(r) => b.slice(r.first as usize..=r.last as usize),
                    })
                    .collect();
                Body::stream(Chunks {
                    chunks,
                    remaining: total,
                })
            }
            Source::File(f) => Body::stream(FileBody::new(f, segments, total)),
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
    *resp.headers_mut() = headers;
    resp
}

fn set_content_range(headers: &mut HeaderMap, r: &ByteRange, len: u64) {
    if let Ok(v) = HeaderValue::from_str(&r.content_range(len)) {
        headers.insert(header::CONTENT_RANGE, v);
    }
}

/// One range of a representation of `len` bytes that arrives as a stream from its first byte
/// (a 200 passed through from an origin that ignored Range): sets Content-Range and
/// Content-Length in `headers` (those of the 200) and returns the body of the 206. The bytes
/// before the range are read and dropped; the stream is dropped as soon as the range is sent,
/// so the rest is never pulled.
pub fn slice_stream(r: ByteRange, len: u64, headers: &mut HeaderMap, body: Body) -> Body {
    set_content_range(headers, &r, len);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(r.len()));
    Body::stream(Slice {
        inner: Some(body),
        skip: r.first,
        left: r.len(),
    })
}

struct Slice {
    inner: Option<Body>,
    skip: u64,
    left: u64,
}

impl http_body::Body for Slice {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if this.left == 0 {
                this.inner = None;
                return Poll::Ready(None);
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            let frame = match std::task::ready!(Pin::new(inner).poll_frame(cx)) {
                None => {
                    this.inner = None;
                    return Poll::Ready(Some(Err(
                        "the representation ended before the range".into()
                    )));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(frame)) => frame,
            };
            let Ok(mut data) = frame.into_data() else {
                continue; // trailers of the whole are not the part's
            };
            let n = data.len() as u64;
            if this.skip >= n {
                this.skip -= n;
                continue;
            }
            let _ = data.split_to(this.skip as usize);
            this.skip = 0;
            data.truncate(this.left.min(data.len() as u64) as usize);
            this.left -= data.len() as u64;
            if this.left == 0 {
                this.inner = None;
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// A whole file as a streamed body (the 200 for a file too large to hold in memory).
pub fn file_body(file: Arc<std::fs::File>, len: u64) -> Body {
    if len == 0 {
        return Body::empty();
    }
    Body::stream(FileBody::new(
        file,
        vec![Segment::Range(ByteRange {
            first: 0,
            last: len - 1,
        })],
        len,
    ))
}

/// A multipart boundary: unique enough per response, never found in a body by construction of
/// its length and randomness (RFC 2046 §5.1.1 allows up to 70 characters).
fn boundary() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mix = (t ^ n.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("larder-{mix:016x}{n:08x}")
}

enum Segment {
    Literal(Bytes),
    Range(ByteRange),
}

/// In-memory parts, one frame each.
struct Chunks {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let next = self.chunks.pop_front();
        if let Some(b) = &next {
            self.remaining -= b.len() as u64;
        }
        Poll::Ready(next.map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

type ReadResult = std::io::Result<Bytes>;

/// Segments of a file read with `pread` on the blocking pool, one chunk at a time: at most one
/// chunk per response is in memory beyond what the connection is writing.
struct FileBody {
    file: Arc<std::fs::File>,
    segments: VecDeque<Segment>,
    reading: Option<tokio::task::JoinHandle<ReadResult>>,
    remaining: u64,
}

impl FileBody {
    fn new(file: Arc<std::fs::File>, segments: Vec<Segment>, total: u64) -> FileBody {
        FileBody {
            file,
            segments: segments.into(),
            reading: None,
            remaining: total,
        }
    }
}

fn read_at(file: &std::fs::File, offset: u64, len: usize) -> ReadResult {
    use std::os::unix::fs::FileExt;
    let mut buf = BytesMut::zeroed(len);
    let mut done = 0;
    while done < len {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "file shrank while being sent",
            ));
        }
        done += n;
    }
    Ok(buf.freeze())
}

impl http_body::Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(task) = &mut this.reading {
                let res = std::task::ready!(Pin::new(task).poll(cx));
                this.reading = None;
                return Poll::Ready(Some(match res {
                    Ok(Ok(b)) => {
                        this.remaining -= b.len() as u64;
                        Ok(Frame::data(b))
                    }
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(e.into()),
                }));
            }
            match this.segments.pop_front() {
                None => return Poll::Ready(None),
                Some(Segment::Literal(b)) => {
                    this.remaining -= b.len() as u64;
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Some(Segment::Range(r)) => {
                    let n = r.len().min(FILE_CHUNK as u64);
                    if n < r.len() {
                        this.segments.push_front(Segment::Range(ByteRange {
                            first: r.first + n,
                            last: r.last,
                        }));
                    }
                    let file = Arc::clone(&this.file);
                    this.reading = Some(tokio::task::spawn_blocking(move || {
                        read_at(&file, r.first, n as usize)
                    }));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn r(first: u64, last: u64) -> ByteRange {
        ByteRange { first, last }
    }

    #[test]
    fn parses_forms() {
        assert_eq!(parse(b"bytes=0-0", 10), Decision::Partial(vec![r(0, 0)]));
        assert_eq!(parse(b"bytes=5-", 10), Decision::Partial(vec![r(5, 9)]));
        assert_eq!(parse(b"bytes=-3", 10), Decision::Partial(vec![r(7, 9)]));
        assert_eq!(parse(b"bytes=-30", 10), Decision::Partial(vec![r(0, 9)]));
        assert_eq!(parse(b"bytes=8-100", 10), Decision::Partial(vec![r(8, 9)]));
        assert_eq!(
            parse(b"bytes=0-1, 5-6", 10),
            Decision::Partial(vec![r(0, 1), r(5, 6)])
        );
        assert_eq!(
            parse(b"bytes=5-6,0-1", 10),
            Decision::Partial(vec![r(5, 6), r(0, 1)])
        );
        assert_eq!(
            parse(b"bytes=0-4,2-6,9-", 10),
            Decision::Partial(vec![r(0, 6), r(9, 9)])
        );
        assert_eq!(parse(b"bytes=10-", 10), Decision::Unsatisfiable);
        assert_eq!(parse(b"bytes=-0", 10), Decision::Unsatisfiable);
        assert_eq!(parse(b"bytes=0-", 0), Decision::Unsatisfiable);
        assert_eq!(parse(b"bytes=5-1", 10), Decision::Full);
        assert_eq!(parse(b"items=0-1", 10), Decision::Full);
        assert_eq!(parse(b"bytes=a-b", 10), Decision::Full);
        assert_eq!(parse(b"bytes=", 10), Decision::Full);
        let many = format!("bytes={}", vec!["0-0"; MAX_RANGES + 1].join(","));
        assert_eq!(parse(many.as_bytes(), 10), Decision::Full);
    }

    #[test]
    fn if_range() {
        let tag = HeaderValue::from_static("\"abc\"");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
        let date = HeaderValue::from_str(&httpdate::fmt_http_date(t)).unwrap();
        assert!(if_range_allows(None, Some(&tag), None));
        assert!(if_range_allows(Some(&tag), Some(&tag), None));
        assert!(!if_range_allows(
            Some(&HeaderValue::from_static("\"old\"")),
            Some(&tag),
            None
        ));
        assert!(!if_range_allows(
            Some(&HeaderValue::from_static("W/\"abc\"")),
            Some(&tag),
            None
        ));
        assert!(if_range_allows(Some(&date), Some(&tag), Some(t)));
        assert!(!if_range_allows(
            Some(&date),
            Some(&tag),
            Some(t + std::time::Duration::from_secs(1))
        ));
    }

    #[tokio::test]
    async fn a_range_cut_from_a_stream_stops_reading_after_it() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let polled = Arc::new(AtomicUsize::new(0));
        let p = Arc::clone(&polled);
        // 100 chunks of 10 bytes: 0..=9, 10..=19, ...
        let chunks = futures_util::stream::iter((0..100u8).map(move |i| {
            p.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![i; 10])))
        }));
        let body = Body::stream(http_body_util::StreamBody::new(chunks));
        let mut h = HeaderMap::new();
        let sliced = slice_stream(r(15, 34), 1000, &mut h, body);
        assert_eq!(h[header::CONTENT_RANGE], "bytes 15-34/1000");
        assert_eq!(h[header::CONTENT_LENGTH], "20");
        let got = sliced.collect().await.unwrap().to_bytes();
        let want: Vec<u8> = [vec![1u8; 5], vec![2; 10], vec![3; 5]].concat();
        assert_eq!(&got[..], &want[..]);
        assert_eq!(polled.load(Ordering::SeqCst), 4);

        let short = Body::full(Bytes::from_static(b"abc"));
        let mut h = HeaderMap::new();
        assert!(slice_stream(r(1, 9), 10, &mut h, short)
            .collect()
            .await
            .is_err());
    }

    #[tokio::test]
    async fn multipart_from_bytes_and_file() {
        let data = Bytes::from_static(b"0123456789");
        let ranges = [r(0, 1), r(8, 9)];
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let resp = partial(&ranges, 10, h.clone(), Source::Bytes(data.clone()), false);
        assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
        let len: usize = resp.headers()[header::CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let ct = resp.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_string();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), len);
        let boundary = ct.split("boundary=").nth(1).unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.starts_with(&format!(
            "--{boundary}\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n01\r\n"
        )));
        assert!(text.ends_with(&format!(
            "Content-Range: bytes 8-9/10\r\n\r\n89\r\n--{boundary}--\r\n"
        )));

        let mut tmp = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut tmp, &data).unwrap();
        let resp = partial(&[r(3, 5)], 10, h, Source::File(Arc::new(tmp)), false);
        assert_eq!(resp.headers()[header::CONTENT_RANGE], "bytes 3-5/10");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"345");
    }
}
