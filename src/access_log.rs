//! The access log: one line per request, written off the request path. A completed request
//! hands its fields ([`Entry`]) to a bounded queue without blocking; a writer thread formats
//! them (`combined`, `json`, or a template of named fields) and appends them to the file (or
//! standard output) through a buffer flushed when the queue runs dry. When the queue is full
//! the line is dropped and counted, never a request held up. SIGUSR1 makes the writer reopen
//! the file (after logrotate moved it).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Method, Version};

use crate::config::{AccessLogConfig, LogFormat as Format, LogPiece as Piece};
use crate::metrics::CACHE;

/// What a completed request leaves for its line.
pub struct Entry {
    pub time: SystemTime,
    pub remote: SocketAddr,
    pub method: Method,
    pub uri: String,
    pub version: Version,
    pub host: Option<String>,
    pub referer: Option<String>,
    pub user_agent: Option<String>,
    pub status: u16,
    /// The response body's length when the head says it.
    pub bytes: Option<u64>,
    pub duration: Duration,
    /// An index into [`crate::metrics::CACHE`].
    pub cache: usize,
    /// Why the cache did not store the response, when it considered storing it
    /// ([`crate::cache::policy::NoStoreReason`]).
    pub no_store: Option<&'static str>,
    pub route: String,
    /// The cache rules that applied to the request (docs/rules.md, "Cache"), comma separated.
    pub cache_rule: Option<Box<str>>,
    /// Who a rule authenticated (`basic_auth`'s user: the request's note `user`), nginx's
    /// `$remote_user`.
    pub user: Option<String>,
    /// The request's id, when a `request_id` rule gave it one.
    pub request_id: Option<String>,
    /// The backend that answered and its time, when the response was fetched.
    pub upstream: Option<crate::http::fetch::Upstreamed>,
    /// The URL grammar and presets of an image request, when an image route served it.
    pub image: Option<ImageServed>,
}

/// What an image route notes of the request it served, in its response's extensions, for the
/// log: the URL grammar (`zimg`, `imgproxy`, `thumbor`) and the presets applied, comma
/// separated (none: empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageServed {
    pub grammar: &'static str,
    pub presets: Box<str>,
}

impl Entry {
    /// The request's part of the entry, taken before it is handled.
    pub fn request(
        remote: SocketAddr,
        method: &Method,
        uri: &http::Uri,
        version: Version,
        h: &HeaderMap,
    ) -> Entry {
        let field = |n: http::header::HeaderName| {
            h.get(n)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        Entry {
            time: SystemTime::now(),
            remote,
            method: method.clone(),
            uri: uri.to_string(),
            version,
            host: field(http::header::HOST).or_else(|| uri.authority().map(|a| a.to_string())),
            referer: field(http::header::REFERER),
            user_agent: field(http::header::USER_AGENT),
            status: 0,
            bytes: None,
            duration: Duration::ZERO,
            cache: 0,
            no_store: None,
            route: String::new(),
            cache_rule: None,
            user: None,
            request_id: None,
            upstream: None,
            image: None,
        }
    }
}

/// A server's access log. The server's start owns it and hands it to the routers it builds,
/// and a completed request that is logged holds it until its line is queued: no registry.
pub struct AccessLog {
    tx: SyncSender<Entry>,
    /// Lines dropped because the writer fell behind.
    dropped: AtomicU64,
    /// Set by SIGUSR1: the writer reopens the file.
    reopen: Arc<AtomicBool>,
    sample: f64,
}

thread_local! {
    /// Sampling credit of this thread: a request is logged each time it reaches 1.
    static CREDIT: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

impl AccessLog {
    /// Opens the log and starts its writer thread.
    pub fn start(cfg: &AccessLogConfig) -> Result<Arc<AccessLog>, String> {
        let format = cfg.format.clone();
        let out = Output::open(&cfg.path)?;
        let (tx, rx) = sync_channel(cfg.buffer.get() as usize);
        let reopen = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&reopen);
        std::thread::Builder::new()
            .name("larder-access-log".into())
            .spawn(move || write_lines(rx, out, format, flag))
            .map_err(|e| format!("access log writer: {e}"))?;
        Ok(Arc::new(AccessLog {
            tx,
            dropped: AtomicU64::new(0),
            reopen,
            sample: cfg.sample.0,
        }))
    }

    /// Whether this request is to be logged (sampling).
    #[inline]
    pub fn wants(&self) -> bool {
        if self.sample >= 1.0 {
            return true;
        }
        CREDIT.with(|c| {
            let credit = c.get() + self.sample;
            let log = credit >= 1.0;
            c.set(if log { credit - 1.0 } else { credit });
            log
        })
    }

    /// Queues a line; drops (and counts) it when the writer is behind.
    pub fn log(&self, e: Entry) {
        match self.tx.try_send(e) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Asks the writer to reopen the file (SIGUSR1).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }
}

/// Where lines go.
enum Output {
    Stdout(BufWriter<std::io::Stdout>),
    File(PathBuf, BufWriter<File>),
}

impl Output {
    fn open(path: &Path) -> Result<Output, String> {
        if path == Path::new("-") {
            return Ok(Output::Stdout(BufWriter::new(std::io::stdout())));
        }
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
            .map_err(|e| format!("access log {}: {e}", path.display()))?;
        Ok(Output::File(
            path.to_path_buf(),
            BufWriter::with_capacity(64 << 10, f),
        ))
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::Stdout(w) => w,
            Output::File(_, w) => w,
        }
    }
}

/// The writer thread: formats and writes lines until the log is dropped; flushes whenever
/// the queue runs dry, so lines reach the file within a moment and a burst goes through the
/// buffer.
fn write_lines(rx: Receiver<Entry>, mut out: Output, format: Format, reopen: Arc<AtomicBool>) {
    let mut line = String::with_capacity(512);
    let mut write = |out: &mut Output, e: Entry| {
        line.clear();
        render(&format, &e, &mut line);
        line.push('\n');
        if let Err(err) = out.writer().write_all(line.as_bytes()) {
            tracing::error!(error = %err, "cannot write the access log");
        }
    };
    loop {
        let first = match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(e) => Some(e),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.writer().flush();
                return;
            }
        };
        if reopen.swap(false, Ordering::Relaxed) {
            let _ = out.writer().flush();
            if let Output::File(path, _) = &out {
                match Output::open(&path.clone()) {
                    Ok(o) => out = o,
                    Err(e) => tracing::error!(error = %e, "cannot reopen the access log"),
                }
            }
        }
        if let Some(e) = first {
            write(&mut out, e);
            while let Ok(e) = rx.try_recv() {
                write(&mut out, e);
            }
        }
        let _ = out.writer().flush();
    }
}

fn render(format: &Format, e: &Entry, out: &mut String) {
    use std::fmt::Write as _;
    match format {
        Format::Combined => {
            let _ = write!(
                out,
                "{} - {} [{}] \"{} {} {}\" {} {} \"{}\" \"{}\"",
                e.remote.ip(),
                user(e),
                clf_time(e.time),
                e.method,
                e.uri,
                protocol(e.version),
                e.status,
                e.bytes.map_or("-".to_string(), |b| b.to_string()),
                quoted(e.referer.as_deref().unwrap_or("-")),
                quoted(e.user_agent.as_deref().unwrap_or("-")),
            );
        }
        Format::Json => {
            let v = serde_json::json!({
                "time": iso_time(e.time),
                "remote": e.remote.ip().to_string(),
                "method": e.method.as_str(),
                "uri": e.uri,
                "protocol": protocol(e.version),
                "host": e.host,
                "status": e.status,
                "bytes": e.bytes,
                "referer": e.referer,
                "user_agent": e.user_agent,
                "duration_us": e.duration.as_micros() as u64,
                "cache": CACHE[e.cache],
                "no_store": e.no_store,
                "route": e.route,
                "cache_rule": e.cache_rule,
                "user": e.user,
                "request_id": e.request_id,
                "upstream_addr": e.upstream.as_ref().map(|u| &*u.addr),
                "upstream_time": e.upstream.as_ref().map(|u| (u.time.as_micros() as f64) / 1e6),
                "image_grammar": e.image.as_ref().map(|i| i.grammar),
                "image_presets": e.image.as_ref().map(|i| &*i.presets).filter(|p| !p.is_empty()),
            });
            out.push_str(&v.to_string());
        }
        Format::Template(pieces) => {
            for p in pieces {
                match p {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Field(f) => field(e, f, out),
                }
            }
        }
    }
}

fn field(e: &Entry, name: &str, out: &mut String) {
    use std::fmt::Write as _;
    let _ = match name {
        "remote" => write!(out, "{}", e.remote.ip()),
        "time" => write!(out, "{}", httpdate::fmt_http_date(e.time)),
        "method" => write!(out, "{}", e.method),
        "uri" => write!(out, "{}", e.uri),
        "protocol" => write!(out, "{}", protocol(e.version)),
        "status" => write!(out, "{}", e.status),
        "bytes" => write!(
            out,
            "{}",
            e.bytes.map_or("-".to_string(), |b| b.to_string())
        ),
        "referer" => write!(out, "{}", e.referer.as_deref().unwrap_or("-")),
        "user_agent" => write!(out, "{}", e.user_agent.as_deref().unwrap_or("-")),
        "host" => write!(out, "{}", e.host.as_deref().unwrap_or("-")),
        "duration_ms" => write!(out, "{:.3}", e.duration.as_secs_f64() * 1000.0),
        "duration_us" => write!(out, "{}", e.duration.as_micros()),
        "cache" => write!(out, "{}", CACHE[e.cache]),
        "no_store" => write!(out, "{}", e.no_store.unwrap_or("-")),
        "route" => write!(out, "{}", e.route),
        "cache_rule" => write!(out, "{}", e.cache_rule.as_deref().unwrap_or("-")),
        "user" => write!(out, "{}", user(e)),
        "request_id" => write!(out, "{}", e.request_id.as_deref().unwrap_or("-")),
        "time_iso" => write!(out, "{}", iso_time(e.time)),
        "upstream_addr" => match &e.upstream {
            Some(u) => write!(out, "{}", u.addr),
            None => write!(out, "-"),
        },
        // nginx's $upstream_response_time: seconds, to the millisecond.
        "upstream_time" => match &e.upstream {
            Some(u) => write!(out, "{:.3}", u.time.as_secs_f64()),
            None => write!(out, "-"),
        },
        "image_grammar" => write!(out, "{}", e.image.as_ref().map_or("-", |i| i.grammar)),
        "image_presets" => match e.image.as_ref().filter(|i| !i.presets.is_empty()) {
            Some(i) => write!(out, "{}", i.presets),
            None => write!(out, "-"),
        },
        _ => Ok(()),
    };
}

/// `2026-11-28T01:05:02.123Z`: ISO 8601 (RFC 3339) in UTC, to the millisecond.
fn iso_time(t: SystemTime) -> String {
    use time::format_description::FormatItem;
    static FORMAT: std::sync::OnceLock<Vec<FormatItem<'static>>> = std::sync::OnceLock::new();
    let format = FORMAT.get_or_init(|| {
        time::format_description::parse_borrowed::<2>(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z",
        )
        .expect("a valid description")
    });
    time::OffsetDateTime::from(t)
        .format(format)
        .unwrap_or_default()
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// A field inside double quotes: `"` and `\` escaped, control bytes as `\xHH` (as nginx does),
/// so a client cannot forge lines.
fn quoted(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                o.push('\\');
                o.push(c);
            }
            c if c.is_control() => o.push_str(&format!("\\x{:02X}", c as u32)),
            c => o.push(c),
        }
    }
    o
}

/// The user field: `-` when none; escaped as a quoted field is, and a space too (the field
/// is not quoted in the combined format).
fn user(e: &Entry) -> String {
    match e.user.as_deref() {
        None | Some("") => "-".into(),
        Some(u) => quoted(u).replace(' ', "\\x20"),
    }
}

/// `10/Oct/2000:13:55:36 +0000` (the common log format's time, in UTC).
fn clf_time(t: SystemTime) -> String {
    // httpdate gives "Tue, 10 Oct 2000 13:55:36 GMT".
    let d = httpdate::fmt_http_date(t);
    let parts: Vec<&str> = d.split(' ').collect();
    match parts[..] {
        [_, day, mon, year, hms, _] => format!("{day}/{mon}/{year}:{hms} +0000"),
        _ => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        let mut h = HeaderMap::new();
        h.insert(
            "user-agent",
            "curl/8 \"x\"\n"
                .parse()
                .unwrap_or(http::HeaderValue::from_static("curl")),
        );
        h.insert("host", "example.com".parse().unwrap());
        let mut e = Entry::request(
            "10.0.0.1:5000".parse().unwrap(),
            &Method::GET,
            &"/a?b=1".parse().unwrap(),
            Version::HTTP_11,
            &h,
        );
        e.time = SystemTime::UNIX_EPOCH + Duration::from_secs(971_186_136);
        e.status = 200;
        e.bytes = Some(42);
        e.duration = Duration::from_micros(1500);
        e.cache = 1;
        e.route = "127.0.0.1:80 */".into();
        e
    }

    #[test]
    fn combined_json_and_template() {
        let e = entry();
        let mut s = String::new();
        render(&Format::Combined, &e, &mut s);
        assert_eq!(
            s,
            "10.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /a?b=1 HTTP/1.1\" 200 42 \"-\" \"curl\""
        );
        s.clear();
        render(&Format::Json, &e, &mut s);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["cache"], "HIT");
        assert_eq!(v["duration_us"], 1500);
        s.clear();
        let template: Format = "{method} {uri} {status} {cache} {duration_ms}"
            .parse()
            .unwrap();
        render(&template, &e, &mut s);
        assert_eq!(s, "GET /a?b=1 200 HIT 1.500");
        // The user a rule authenticated, in the combined format's third field.
        let mut e = entry();
        e.user = Some("ann lee".into());
        s.clear();
        render(&Format::Combined, &e, &mut s);
        assert!(s.starts_with("10.0.0.1 - ann\\x20lee [10/Oct/2000"), "{s}");
        s.clear();
        render(&"{user} {status}".parse().unwrap(), &e, &mut s);
        assert_eq!(s, "ann\\x20lee 200");
        assert!("{nope}".parse::<Format>().unwrap_err().contains("nope"));
        assert!("{status".parse::<Format>().is_err());
    }

    /// A writer that falls behind costs lines, never a wait: with the queue full, `log`
    /// returns at once and counts the line.
    #[test]
    fn a_full_queue_drops_and_counts() {
        let (tx, rx) = sync_channel(2);
        let log = AccessLog {
            tx,
            dropped: AtomicU64::new(0),
            reopen: Arc::default(),
            sample: 1.0,
        };
        for _ in 0..5 {
            log.log(entry());
        }
        assert_eq!(log.dropped(), 3);
        assert_eq!(rx.try_iter().count(), 2);
    }

    #[test]
    fn quotes_and_control_bytes_cannot_forge_lines() {
        assert_eq!(quoted("a\"b\\c\nd"), "a\\\"b\\\\c\\x0Ad");
    }
}
