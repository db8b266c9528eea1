//! Content codings: choosing one per request (RFC 9110 §12.5.3) and producing them at fill time.
//!
//! Compression never happens on a hit. A stored body is encoded once into each coding by
//! [`Compressor::encode_each`] on a bounded pool of blocking threads; a hit only calls
//! [`AcceptEncoding::parse`] and picks the smallest stored body the client accepts. Responses
//! that are not stored are coded or decoded while they stream ([`encode_stream`],
//! [`decode_stream`]).

use std::io::{Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::Semaphore;

use crate::body::Body;
use crate::config::CompressionConfig;

/// A content coding larder stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Identity = 0,
    Gzip = 1,
    Br = 2,
    Zstd = 3,
}

impl Encoding {
    pub const ALL: [Encoding; 4] = [
        Encoding::Identity,
        Encoding::Gzip,
        Encoding::Br,
        Encoding::Zstd,
    ];
    pub const COMPRESSED: [Encoding; 3] = [Encoding::Gzip, Encoding::Br, Encoding::Zstd];

    /// The Content-Encoding token, or None for identity.
    pub fn token(self) -> Option<&'static str> {
        match self {
            Encoding::Identity => None,
            Encoding::Gzip => Some("gzip"),
            Encoding::Br => Some("br"),
            Encoding::Zstd => Some("zstd"),
        }
    }

    pub fn header_value(self) -> Option<HeaderValue> {
        self.token().map(HeaderValue::from_static)
    }

    /// Parses a Content-Encoding value; None for codings larder does not handle.
    pub fn from_content_encoding(v: &str) -> Option<Encoding> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "identity" => Some(Encoding::Identity),
            "gzip" | "x-gzip" => Some(Encoding::Gzip),
            "br" => Some(Encoding::Br),
            "zstd" => Some(Encoding::Zstd),
            _ => None,
        }
    }
}

/// The q-values a request's Accept-Encoding gives each stored coding, in thousandths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptEncoding {
    q: [u16; 4],
}

/// Accept-Encoding values up to this long are remembered ([`AcceptEncoding::parse`]); browsers
/// send 17-23 bytes.
const MEMO_LEN: usize = 48;

/// The last Accept-Encoding value a thread parsed, and its result.
struct LastParsed {
    /// `u8::MAX` until a value is parsed (longer than any remembered one).
    len: u8,
    bytes: [u8; MEMO_LEN],
    parsed: AcceptEncoding,
}

thread_local! {
    static LAST_PARSED: std::cell::RefCell<LastParsed> = const {
        std::cell::RefCell::new(LastParsed {
            len: u8::MAX,
            bytes: [0; MEMO_LEN],
            parsed: AcceptEncoding::IDENTITY_ONLY,
        })
    };
}

impl AcceptEncoding {
    /// No Accept-Encoding field: identity only (any coding is allowed by the RFC, but clients
    /// that send nothing expect plain bytes).
    pub const IDENTITY_ONLY: AcceptEncoding = AcceptEncoding { q: [1000, 0, 0, 0] };

    /// Parses Accept-Encoding per RFC 9110 §12.5.3: q-values, `*`, `identity;q=0`. Unknown or
    /// malformed members are ignored.
    ///
    /// Every cache hit asks, and clients send few distinct values (browsers one each), so the
    /// last value parsed on this thread is kept with its result: a hit with the same bytes
    /// compares them instead of splitting and trimming (about 450 instructions for `gzip`).
    #[inline]
    pub fn parse(value: Option<&HeaderValue>) -> AcceptEncoding {
        let Some(v) = value else {
            return Self::IDENTITY_ONLY;
        };
        let b = v.as_bytes();
        if b.len() > MEMO_LEN {
            return Self::parse_value(v);
        }
        LAST_PARSED.with(|m| {
            let mut m = m.borrow_mut();
            if usize::from(m.len) == b.len() && &m.bytes[..b.len()] == b {
                return m.parsed;
            }
            let parsed = Self::parse_value(v);
            m.bytes[..b.len()].copy_from_slice(b);
            m.len = b.len() as u8;
            m.parsed = parsed;
            parsed
        })
    }

    fn parse_value(v: &HeaderValue) -> AcceptEncoding {
        let Ok(s) = v.to_str() else {
            return Self::IDENTITY_ONLY;
        };
        let mut q: [Option<u16>; 4] = [None; 4];
        let mut star: Option<u16> = None;
        for member in s.split(',') {
            let mut parts = member.split(';');
            let coding = parts.next().unwrap_or("").trim();
            if coding.is_empty() {
                continue;
            }
            let mut weight = 1000u16;
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    if k.trim().eq_ignore_ascii_case("q") {
                        match parse_qvalue(v.trim()) {
                            Some(w) => weight = w,
                            None => weight = 0,
                        }
                    }
                }
            }
            let slot = if coding == "*" {
                star = Some(star.map_or(weight, |s| s.max(weight)));
                continue;
            } else if coding.eq_ignore_ascii_case("identity") {
                0
            } else if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                1
            } else if coding.eq_ignore_ascii_case("br") {
                2
            } else if coding.eq_ignore_ascii_case("zstd") {
                3
            } else {
                continue;
            };
            q[slot] = Some(q[slot].map_or(weight, |old| old.max(weight)));
        }
        let mut out = [0u16; 4];
        for (i, slot) in q.iter().enumerate() {
            out[i] = match (slot, star) {
                (Some(w), _) => *w,
                (None, Some(s)) => s,
                // identity is acceptable unless excluded (by itself or by `*;q=0`).
                (None, None) if i == 0 => 1000,
                (None, None) => 0,
            };
        }
        AcceptEncoding { q: out }
    }

    #[inline]
    pub fn accepts(&self, e: Encoding) -> bool {
        self.q[e as usize] > 0
    }

    /// The coding to compress a response with on the fly: the acceptable one with the highest
    /// q-value, preferring zstd, then br, then gzip on ties (cheapest to produce for its ratio).
    pub fn dynamic_choice(&self) -> Option<Encoding> {
        [Encoding::Zstd, Encoding::Br, Encoding::Gzip]
            .into_iter()
            .filter(|e| self.accepts(*e))
            .max_by_key(|e| (self.q[*e as usize], *e as u8))
    }

    /// Picks from `by_size` (available codings, smallest body first) the first acceptable one;
    /// identity if none is.
    #[inline]
    pub fn choose(&self, by_size: &[Encoding]) -> Encoding {
        by_size
            .iter()
            .copied()
            .find(|e| self.accepts(*e))
            .unwrap_or(Encoding::Identity)
    }
}

/// qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] ), in thousandths.
fn parse_qvalue(s: &str) -> Option<u16> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut thousandths: u16 = 0;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// Errors decoding a body the origin sent encoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("corrupt {0:?} body: {1}")]
    Corrupt(Encoding, std::io::Error),
    #[error("decoded body exceeds {0} bytes")]
    TooLarge(usize),
}

/// Compresses stored bodies off the async workers, a bounded number at a time.
pub struct Compressor {
    cfg: CompressionConfig,
    permits: Arc<Semaphore>,
    types: Vec<TypeMatch>,
}

enum TypeMatch {
    Exact(String),
    Major(String),
}

impl Compressor {
    pub fn new(cfg: CompressionConfig) -> Self {
        let threads = match cfg.threads.as_usize() {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let types = cfg
            .types
            .iter()
            .map(|t| {
                let t = t.trim().to_ascii_lowercase();
                match t.strip_suffix("/*") {
                    Some(major) => TypeMatch::Major(format!("{major}/")),
                    None => TypeMatch::Exact(t),
                }
            })
            .collect();
        Compressor {
            cfg,
            permits: Arc::new(Semaphore::new(threads)),
            types,
        }
    }

    pub fn config(&self) -> &CompressionConfig {
        &self.cfg
    }

    /// Whether a body of this Content-Type and length gets compressed variants.
    pub fn wants(&self, content_type: Option<&HeaderValue>, len: usize) -> bool {
        if !self.cfg.enabled || (len as u64) < self.cfg.min_length.0 {
            return false;
        }
        let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let mime = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        self.types.iter().any(|t| match t {
            TypeMatch::Exact(e) => *e == mime,
            TypeMatch::Major(m) => mime.starts_with(m.as_str()),
        })
    }

    /// The order [`Compressor::encode_each`] builds codings in: the fastest first at the default
    /// levels (gzip 9 is several times faster than zstd 19, itself several times faster than
    /// brotli 11), so most clients have a compressed body soonest.
    pub const BUILD_ORDER: [Encoding; 3] = [Encoding::Gzip, Encoding::Zstd, Encoding::Br];

    /// Whether a compression asked for now would start at once (a permit is free), rather than
    /// queue behind others.
    pub fn idle(&self) -> bool {
        self.permits.available_permits() > 0
    }

    /// Encodes `identity` into each compressed coding in [`Self::BUILD_ORDER`] on the blocking
    /// pool (one permit for all three; `started` is called once it is held), handing each to
    /// `ready` as soon as it is done; a coding that does not make the body smaller is handed over
    /// as None. `ready` returns false to stop.
    pub async fn encode_each<F>(&self, identity: Bytes, started: impl FnOnce(), mut ready: F)
    where
        F: FnMut(Encoding, Option<Bytes>) -> bool + Send + 'static,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("semaphore never closed");
        started();
        let cfg = self.cfg.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for e in Self::BUILD_ORDER {
                let out = encode(&identity, e, &cfg);
                if !ready(e, (out.len() < identity.len()).then_some(out)) {
                    return;
                }
            }
        })
        .await;
    }

    /// Decodes a body the origin sent with a coding, on the blocking pool, bounded in output.
    pub async fn decode(
        &self,
        body: Bytes,
        enc: Encoding,
        limit: usize,
    ) -> Result<Bytes, DecodeError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("semaphore never closed");
        tokio::task::spawn_blocking(move || decode(&body, enc, limit))
            .await
            .unwrap_or(Err(DecodeError::TooLarge(limit)))
    }
}

/// Compresses a streamed body on the fly (for responses that are not stored).
pub fn encode_stream(body: Body, e: Encoding, cfg: &CompressionConfig) -> Body {
    use async_compression::tokio::bufread::{BrotliEncoder, GzipEncoder, ZstdEncoder};
    use async_compression::Level;

    let reader = reader(body);
    let level = |l: i64| Level::Precise(l as i32);
    match e {
        Encoding::Gzip => frames(GzipEncoder::with_quality(
            reader,
            level(cfg.dynamic_gzip_level.get()),
        )),
        // A 512 KiB window (lgwin 19), as nginx's brotli module (`brotli_window`) and pingora
        // use, rather than async-compression's 4 MiB: the encoder's ring buffer is sized by
        // it, for every response. (It did not close the CPU gap to pingap's on-the-fly br,
        // docs/benchmarks.md session 25: that is elsewhere.)
        Encoding::Br => frames(BrotliEncoder::with_params(
            reader,
            async_compression::brotli::EncoderParams::default()
                .quality(level(cfg.dynamic_brotli_level.get()))
                .window_size(19),
        )),
        Encoding::Zstd => frames(ZstdEncoder::with_quality(
            reader,
            level(cfg.dynamic_zstd_level.get()),
        )),
        Encoding::Identity => frames(reader),
    }
}

/// Decodes a streamed body on the fly (a response that is not stored, for a client that does
/// not accept its coding). Memory stays bounded: the output is produced as the client reads it.
/// A corrupt body ends the stream with an error.
pub fn decode_stream(body: Body, e: Encoding) -> Body {
    use async_compression::tokio::bufread::{BrotliDecoder, GzipDecoder, ZstdDecoder};

    let reader = reader(body);
    match e {
        Encoding::Gzip => {
            let mut d = GzipDecoder::new(reader);
            d.multiple_members(true); // like MultiGzDecoder for stored bodies
            frames(d)
        }
        Encoding::Br => frames(BrotliDecoder::new(reader)),
        Encoding::Zstd => frames(ZstdDecoder::new(reader)),
        Encoding::Identity => frames(reader),
    }
}

/// A body's bytes as an `AsyncBufRead`.
fn reader(body: Body) -> impl tokio::io::AsyncBufRead + Send + Sync + 'static {
    use futures_util::TryStreamExt;
    let data =
        http_body_util::BodyDataStream::new(body).map_err(|e| std::io::Error::other(e.to_string()));
    tokio_util::io::StreamReader::new(data)
}

/// An `AsyncRead` as a streamed body.
fn frames<R: tokio::io::AsyncRead + Send + Sync + 'static>(r: R) -> Body {
    use futures_util::TryStreamExt;
    Body::stream(http_body_util::StreamBody::new(
        tokio_util::io::ReaderStream::new(r).map_ok(http_body::Frame::data),
    ))
}

/// `out` as stored bytes, without the spare capacity an encoder left (zstd's bulk encoder
/// allocates the input's size for a body it may shrink tenfold): a stored body's memory is
/// what the cache counts for it.
fn exact(mut out: Vec<u8>) -> Bytes {
    if out.capacity() - out.len() > out.len() / 8 {
        out.shrink_to_fit();
    }
    Bytes::from(out)
}

/// Encodes `data` with one coding at the configured level.
pub fn encode(data: &[u8], e: Encoding, cfg: &CompressionConfig) -> Bytes {
    match e {
        Encoding::Identity => Bytes::copy_from_slice(data),
        Encoding::Gzip => {
            let level = flate2::Compression::new(cfg.gzip_level.get() as u32);
            let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 3), level);
            enc.write_all(data).expect("write to Vec");
            exact(enc.finish().expect("finish to Vec"))
        }
        Encoding::Br => {
            let mut out = Vec::with_capacity(data.len() / 3);
            let params = brotli::enc::BrotliEncoderParams {
                quality: cfg.brotli_level.get() as i32,
                lgwin: 22,
                size_hint: data.len(),
                ..Default::default()
            };
            brotli::BrotliCompress(&mut &data[..], &mut out, &params).expect("write to Vec");
            exact(out)
        }
        Encoding::Zstd => {
            exact(zstd::bulk::compress(data, cfg.zstd_level.get() as i32).expect("zstd in memory"))
        }
    }
}

/// Decodes `data` from one coding, refusing output larger than `limit`.
pub fn decode(data: &[u8], e: Encoding, limit: usize) -> Result<Bytes, DecodeError> {
    let mut out = Vec::with_capacity((data.len() * 4).min(limit));
    let cap = limit as u64 + 1;
    let res = match e {
        Encoding::Identity => return Ok(Bytes::copy_from_slice(data)),
        Encoding::Gzip => flate2::read::MultiGzDecoder::new(data)
            .take(cap)
            .read_to_end(&mut out),
        Encoding::Br => brotli::Decompressor::new(data, 8192)
            .take(cap)
            .read_to_end(&mut out),
        Encoding::Zstd => {
            zstd::stream::read::Decoder::new(data).and_then(|d| d.take(cap).read_to_end(&mut out))
        }
    };
    res.map_err(|err| DecodeError::Corrupt(e, err))?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge(limit));
    }
    Ok(exact(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ae(s: &str) -> AcceptEncoding {
        AcceptEncoding::parse(Some(&HeaderValue::from_str(s).unwrap()))
    }

    const BY_SIZE: [Encoding; 4] = [
        Encoding::Br,
        Encoding::Zstd,
        Encoding::Gzip,
        Encoding::Identity,
    ];

    /// A stored coding holds its bytes, not the buffer its encoder sized for the input (zstd's
    /// is as large as the input).
    #[test]
    fn encoded_bodies_hold_no_spare_capacity() {
        let data = b"{\"k\": \"v\"}, ".repeat(10_000);
        for e in [Encoding::Gzip, Encoding::Br, Encoding::Zstd] {
            let out = encode(&data, e, &CompressionConfig::default());
            assert_eq!(decode(&out, e, data.len()).unwrap(), data, "{e:?}");
            let len = out.len();
            let held = out.try_into_mut().expect("the only reference").capacity();
            assert!(held <= len + len / 8, "{e:?}: {len} bytes in {held}");
        }
    }

    /// The remembered value answers only the same bytes: values of the same length, a repeat,
    /// one too long to remember, in turn, each gives what parsing it alone gives.
    #[test]
    fn the_last_value_parsed_answers_only_its_own_bytes() {
        let long = format!("gzip;q=0.5, {}, br", "x".repeat(MEMO_LEN));
        let values = [
            "gzip",
            "gzip",
            "zstd",
            "br;q=0",
            "br;q=1",
            "gzip",
            &long,
            "gzip",
            &long,
            "*;q=0",
            "identity",
            "IDENTITY",
            "gzip, deflate, br, zstd",
        ];
        for v in values {
            let hv = HeaderValue::from_str(v).unwrap();
            assert_eq!(
                AcceptEncoding::parse(Some(&hv)),
                AcceptEncoding::parse_value(&hv),
                "{v}"
            );
        }
        assert!(!ae("br;q=0").accepts(Encoding::Br));
        assert!(ae("br;q=1").accepts(Encoding::Br));
    }

    #[test]
    fn negotiation_matrix() {
        assert_eq!(
            AcceptEncoding::parse(None).choose(&BY_SIZE),
            Encoding::Identity
        );
        assert_eq!(ae("gzip").choose(&BY_SIZE), Encoding::Gzip);
        assert_eq!(ae("gzip, br").choose(&BY_SIZE), Encoding::Br);
        assert_eq!(ae("br;q=0, gzip").choose(&BY_SIZE), Encoding::Gzip);
        assert_eq!(ae("*").choose(&BY_SIZE), Encoding::Br);
        assert_eq!(ae("*;q=0, gzip").choose(&BY_SIZE), Encoding::Gzip);
        assert_eq!(ae("identity").choose(&BY_SIZE), Encoding::Identity);
        assert_eq!(
            ae("zstd;q=0.5, identity;q=0").choose(&BY_SIZE),
            Encoding::Zstd
        );
        assert_eq!(ae("GZIP;Q=1.000").choose(&BY_SIZE), Encoding::Gzip);
        assert_eq!(ae("gzip;q=2").choose(&BY_SIZE), Encoding::Identity);
        assert_eq!(ae("x-gzip").choose(&BY_SIZE), Encoding::Gzip);
        assert_eq!(ae(";;,,garbage=;q").choose(&BY_SIZE), Encoding::Identity);
        assert!(!ae("*;q=0").accepts(Encoding::Identity));
        assert!(!ae("identity;q=0").accepts(Encoding::Identity));
    }

    #[test]
    fn qvalues() {
        assert_eq!(parse_qvalue("0.5"), Some(500));
        assert_eq!(parse_qvalue("0.001"), Some(1));
        assert_eq!(parse_qvalue("1"), Some(1000));
        assert_eq!(parse_qvalue("1.0001"), None);
        assert_eq!(parse_qvalue("0.5x"), None);
    }

    #[test]
    fn round_trip_every_coding() {
        let cfg = CompressionConfig::default();
        let data = "hello larder ".repeat(500);
        for e in Encoding::ALL {
            let enc = encode(data.as_bytes(), e, &cfg);
            let dec = decode(&enc, e, 1 << 20).unwrap();
            assert_eq!(dec, data.as_bytes(), "{e:?}");
        }
    }

    #[tokio::test]
    async fn stream_decoding_round_trips_every_coding() {
        use http_body_util::BodyExt;
        let cfg = CompressionConfig::default();
        let data = "streamed and decoded ".repeat(5000);
        for e in Encoding::ALL {
            let coded = encode(data.as_bytes(), e, &cfg);
            let out = decode_stream(Body::full(coded), e).collect().await.unwrap();
            assert_eq!(out.to_bytes(), data.as_bytes(), "{e:?}");
        }
        // Several gzip members, as MultiGzDecoder reads them for stored bodies.
        let two = [
            encode(b"first ", Encoding::Gzip, &cfg),
            encode(b"second", Encoding::Gzip, &cfg),
        ]
        .concat();
        let out = decode_stream(Body::full(two), Encoding::Gzip)
            .collect()
            .await
            .unwrap();
        assert_eq!(&out.to_bytes()[..], b"first second");
        let corrupt = decode_stream(Body::full(&b"not gzip at all"[..]), Encoding::Gzip);
        assert!(corrupt.collect().await.is_err());
    }

    #[test]
    fn decode_limit_and_corruption() {
        let cfg = CompressionConfig::default();
        let data = vec![b'a'; 100_000];
        let gz = encode(&data, Encoding::Gzip, &cfg);
        assert!(matches!(
            decode(&gz, Encoding::Gzip, 1000),
            Err(DecodeError::TooLarge(_))
        ));
        assert!(decode(b"not gzip at all", Encoding::Gzip, 1000).is_err());
    }

    #[test]
    fn wants_by_type_and_length() {
        let c = Compressor::new(CompressionConfig::default());
        let json = HeaderValue::from_static("application/json; charset=utf-8");
        assert!(c.wants(Some(&json), 1000));
        assert!(!c.wants(Some(&json), 10));
        assert!(c.wants(Some(&HeaderValue::from_static("text/html")), 1000));
        assert!(!c.wants(Some(&HeaderValue::from_static("image/png")), 1000));
        assert!(!c.wants(None, 1000));
    }
}
