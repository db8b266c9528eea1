//! The static-files handler: files from a root directory, or from a file set bundled in the
//! binary (the demo origin of the embedded default).
//!
//! Owns: mapping a request path to a file without ever leaving the root (percent-decoding once,
//! refusing `..`, encoded slashes, backslashes, NUL, dotfiles, and symlinks that lead out), MIME
//! types, validators (strong ETag, Last-Modified) and the 304/412 rules, HEAD.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;

use crate::body::Body;
use crate::config::{Bundle, StaticConfig};
use crate::deliver::etag_list_matches;
use crate::proxy::upstream::text_response;

/// Files larger than this are refused by this handler (streaming large files is not built yet).
const MAX_FILE: u64 = 64 * 1024 * 1024;

pub struct StaticFiles {
    source: Source,
    prefix: String,
    strip_prefix: bool,
    index: Vec<String>,
    cache_control: Option<HeaderValue>,
}

enum Source {
    Dir(PathBuf),
    Bundled(Vec<BundledFile>),
}

struct BundledFile {
    path: &'static str,
    body: Bytes,
    etag: HeaderValue,
}

/// The demo origin's files.
const DEMO: [(&str, &[u8]); 4] = [
    ("index.html", include_bytes!("../assets/demo/index.html")),
    ("data.json", include_bytes!("../assets/demo/data.json")),
    ("page.html", include_bytes!("../assets/demo/page.html")),
    ("small.html", include_bytes!("../assets/demo/small.html")),
];

/// Start time of the process: the Last-Modified of bundled files.
fn bundle_time() -> SystemTime {
    static T: std::sync::OnceLock<SystemTime> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        UNIX_EPOCH + Duration::from_secs(secs)
    })
}

impl StaticFiles {
    pub fn new(cfg: StaticConfig, prefix: &str) -> StaticFiles {
        let source = match (&cfg.root, cfg.bundled) {
            (_, Some(Bundle::Demo)) => Source::Bundled(
                DEMO.iter()
                    .map(|(path, body)| BundledFile {
                        path,
                        body: Bytes::from_static(body),
                        etag: HeaderValue::from_str(&format!(
                            "\"{:x}-{:x}\"",
                            fnv1a(body),
                            body.len()
                        ))
                        .expect("hex etag"),
                    })
                    .collect(),
            ),
            (Some(root), None) => {
                Source::Dir(std::fs::canonicalize(root).unwrap_or_else(|_| root.clone()))
            }
            (None, None) => Source::Dir(PathBuf::from(".")),
        };
        StaticFiles {
            source,
            prefix: prefix.to_string(),
            strip_prefix: cfg.strip_prefix,
            index: cfg.index,
            cache_control: cfg
                .cache_control
                .as_deref()
                .and_then(|c| HeaderValue::from_str(c).ok()),
        }
    }

    pub fn source(&self) -> String {
        match &self.source {
            Source::Dir(p) => p.display().to_string(),
            Source::Bundled(_) => "bundled demo files".into(),
        }
    }

    pub async fn handle<B>(&self, req: Request<B>) -> Response<Body> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = text_response(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        let mut path = req.uri().path();
        if self.strip_prefix {
            path = path
                .strip_prefix(self.prefix.trim_end_matches('/'))
                .unwrap_or(path);
        }
        let segments = match safe_segments(path) {
            Ok(s) => s,
            Err(status) => return text_response(status, "bad path\n"),
        };
        let found = match &self.source {
            Source::Bundled(files) => self.bundled(files, &segments),
            Source::Dir(root) => self.lookup_dir(root, &segments, path.ends_with('/')).await,
        };
        let Some(file) = found else {
            return text_response(StatusCode::NOT_FOUND, "not found\n");
        };
        self.respond(file, req.method(), req.headers())
    }

    fn bundled(&self, files: &[BundledFile], segments: &[String]) -> Option<Found> {
        let want = if segments.is_empty() {
            self.index.first()?.clone()
        } else {
            segments.join("/")
        };
        let f = files.iter().find(|f| f.path == want)?;
        Some(Found {
            name: f.path.to_string(),
            body: f.body.clone(),
            etag: f.etag.clone(),
            modified: bundle_time(),
        })
    }

    async fn lookup_dir(&self, root: &Path, segments: &[String], dir_hint: bool) -> Option<Found> {
        let mut full = root.to_path_buf();
        for s in segments {
            full.push(s);
        }
        let mut meta = tokio::fs::metadata(&full).await.ok()?;
        if meta.is_dir() || dir_hint {
            let dir = full.clone();
            let mut found = None;
            for idx in &self.index {
                let candidate = dir.join(idx);
                if let Ok(m) = tokio::fs::metadata(&candidate).await {
                    if m.is_file() {
                        found = Some((candidate, m));
                        break;
                    }
                }
            }
            let (f, m) = found?;
            full = f;
            meta = m;
        }
        if !meta.is_file() || meta.len() > MAX_FILE {
            return None;
        }
        // Symlinks must not lead outside the root.
        let real = tokio::fs::canonicalize(&full).await.ok()?;
        if !real.starts_with(root) {
            return None;
        }
        let body = Bytes::from(tokio::fs::read(&real).await.ok()?);
        let modified = meta.modified().unwrap_or(UNIX_EPOCH);
        let mtime = modified.duration_since(UNIX_EPOCH).unwrap_or_default();
        let etag = HeaderValue::from_str(&format!(
            "\"{:x}.{:x}-{:x}\"",
            mtime.as_secs(),
            mtime.subsec_nanos(),
            body.len()
        ))
        .expect("hex etag");
        Some(Found {
            name: real.file_name()?.to_string_lossy().into_owned(),
            body,
            etag,
            modified,
        })
    }

    fn respond(&self, f: Found, method: &Method, req: &HeaderMap) -> Response<Body> {
        let mut headers = HeaderMap::new();
        let mime = mime_guess::from_path(&f.name).first_or_octet_stream();
        let ct = if mime.type_() == mime_guess::mime::TEXT
            || mime.essence_str() == "application/javascript"
            || mime.essence_str() == "application/json"
        {
            format!("{}; charset=utf-8", mime.essence_str())
        } else {
            mime.essence_str().to_string()
        };
        if let Ok(v) = HeaderValue::from_str(&ct) {
            headers.insert(header::CONTENT_TYPE, v);
        }
        headers.insert(header::ETAG, f.etag.clone());
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(f.modified)) {
            headers.insert(header::LAST_MODIFIED, v);
        }
        if let Some(cc) = &self.cache_control {
            headers.insert(header::CACHE_CONTROL, cc.clone());
        }
        let status = precondition(req, &f);
        if status != StatusCode::OK {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = status;
            if status == StatusCode::NOT_MODIFIED {
                *r.headers_mut() = headers;
                r.headers_mut().remove(header::CONTENT_TYPE);
            }
            return r;
        }
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(f.body.len()));
        let body = if *method == Method::HEAD {
            Body::empty()
        } else {
            Body::full(f.body)
        };
        let mut r = Response::new(body);
        *r.headers_mut() = headers;
        r
    }
}

struct Found {
    name: String,
    body: Bytes,
    etag: HeaderValue,
    modified: SystemTime,
}

/// RFC 9110 §13.2.2 evaluation for a file: 412, 304, or 200.
fn precondition(req: &HeaderMap, f: &Found) -> StatusCode {
    let lm_secs = f
        .modified
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let date = |v: &HeaderValue| {
        v.to_str()
            .ok()
            .and_then(|s| httpdate::parse_http_date(s).ok())
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
    };
    if let Some(im) = req.get(header::IF_MATCH) {
        if !etag_list_matches(im, Some(&f.etag), true) {
            return StatusCode::PRECONDITION_FAILED;
        }
    } else if let Some(since) = req.get(header::IF_UNMODIFIED_SINCE).and_then(date) {
        if lm_secs > since {
            return StatusCode::PRECONDITION_FAILED;
        }
    }
    if let Some(inm) = req.get(header::IF_NONE_MATCH) {
        if etag_list_matches(inm, Some(&f.etag), false) {
            return StatusCode::NOT_MODIFIED;
        }
    } else if let Some(since) = req.get(header::IF_MODIFIED_SINCE).and_then(date) {
        if lm_secs <= since {
            return StatusCode::NOT_MODIFIED;
        }
    }
    StatusCode::OK
}

/// Decodes a request path into safe segments, or the status to refuse it with.
pub fn safe_segments(path: &str) -> Result<Vec<String>, StatusCode> {
    let lower = path.to_ascii_lowercase();
    // Encoded separators and NUL never name a file.
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains("%00") {
        return Err(StatusCode::BAD_REQUEST);
    }
    let decoded = percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    // A second round of decoding must not change anything either (double encoding).
    if decoded.contains('%') {
        let twice = percent_decode_str(&decoded).decode_utf8_lossy();
        if twice != decoded && (twice.contains("..") || twice.contains('/') || twice.contains('\\'))
        {
            return Err(StatusCode::BAD_REQUEST);
        }
    }
    if decoded.contains('\0') || decoded.contains('\\') {
        return Err(StatusCode::BAD_REQUEST);
    }
    let mut out = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" => continue,
            "." | ".." => return Err(StatusCode::BAD_REQUEST),
            s if s.starts_with('.') => return Err(StatusCode::NOT_FOUND),
            s => out.push(s.to_string()),
        }
    }
    Ok(out)
}

/// FNV-1a, for bundled files' ETags (computed once at start).
fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_traversal() {
        for bad in [
            "/../etc/passwd",
            "/a/../../b",
            "/%2e%2e/etc/passwd",
            "/a%2fb",
            "/a%5cb",
            "/a\\b",
            "/%252e%252e/x",
            "/%c0%ae%c0%ae/x",
            "/a%00b",
            "/.git/config",
            "/./a",
        ] {
            assert!(safe_segments(bad).is_err(), "{bad}");
        }
        assert_eq!(
            safe_segments("/a/b%20c.html").unwrap(),
            vec!["a", "b c.html"]
        );
        assert_eq!(safe_segments("/").unwrap(), Vec::<String>::new());
    }
}
