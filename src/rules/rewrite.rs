//! Path rewrites at ① (nginx's `rewrite REGEX TARGET break`, pingap's `strip_path`): the
//! request's path (and query) changed before the handler sees it, so the cache key, the
//! upstream request and every later rule follow the new URI. The route was chosen by the
//! path as it came; a rewrite does not choose another.
//!
//! - `rewrite = { to = "/v2/$1", query = "keep" }`: the path (and query, when `to` has a `?`)
//!   rendered from the template, with the captures of the rule's `path` / `path_regex`; the
//!   request's query appended (`keep`, after the target's own with `&`) or dropped;
//! - `strip_prefix = "/api"`: `/api/x?q` becomes `/x?q` and `/api` becomes `/`; a path not
//!   under the prefix (`/apix`) is left alone.
//!
//! A target that renders to an invalid URI (a variable holding a space) is answered 400.

use http::uri::{PathAndQuery, Uri};
use http::{Request, StatusCode};

use super::vars::{render, Seen};
use crate::body::RequestBody;
use crate::config::rules::{QueryMode, RewriteConfig, StripPrefix, Template};
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// Puts `pq` (a path, maybe with `?query`) in the request's URI, keeping its scheme and
/// authority; false (the request unchanged) when it is not a valid origin-form target.
pub fn set_target<B>(req: &mut Request<B>, pq: &str) -> bool {
    if !pq.starts_with('/') {
        return false;
    }
    let Ok(pq) = pq.parse::<PathAndQuery>() else {
        return false;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq);
    match Uri::from_parts(parts) {
        Ok(uri) => {
            *req.uri_mut() = uri;
            true
        }
        Err(_) => false,
    }
}

/// `target`'s query and the request's, as `mode` says: `target?its&theirs`.
pub fn with_query(mut target: String, query: Option<&str>, mode: QueryMode) -> String {
    if let (QueryMode::Keep, Some(q)) = (mode, query.filter(|q| !q.is_empty())) {
        target.push(if target.contains('?') { '&' } else { '?' });
        target.push_str(q);
    }
    target
}

/// `rewrite = { to, query }`.
pub struct Rewrite {
    to: Template,
    query: QueryMode,
}

impl Rewrite {
    pub fn new(cfg: &RewriteConfig) -> Rewrite {
        Rewrite {
            to: cfg.to.clone(),
            query: cfg.query,
        }
    }
}

impl Step for Rewrite {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let mut to = String::new();
        render(&self.to, Some(Seen::of(req)), cx, &mut to);
        let to = with_query(to, req.uri().query(), self.query);
        match set_target(req, &to) {
            true => Verdict::Next,
            false => {
                tracing::debug!(
                    template = self.to.source.as_str(),
                    "a rewrite rendered an invalid URI"
                );
                Verdict::Answer(text_response(
                    StatusCode::BAD_REQUEST,
                    "the rewritten URI is not valid\n",
                ))
            }
        }
    }
}

/// `strip_prefix = "/api"`.
pub struct Strip {
    /// Without a trailing `/`.
    prefix: String,
}

impl Strip {
    pub fn new(cfg: &StripPrefix) -> Strip {
        Strip {
            prefix: cfg.0.clone(),
        }
    }

    /// The path without the prefix, if it is under it.
    pub fn strip<'a>(&self, path: &'a str) -> Option<&'a str> {
        let rest = path.strip_prefix(self.prefix.as_str())?;
        match rest {
            "" => Some("/"),
            r if r.starts_with('/') => Some(r),
            _ => None,
        }
    }
}

impl Step for Strip {
    fn request(&self, req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
        let Some(rest) = self.strip(req.uri().path()) else {
            return Verdict::Next;
        };
        let mut to = rest.to_string();
        if let Some(q) = req.uri().query() {
            to.push('?');
            to.push_str(q);
        }
        // The rest of a valid path is one.
        set_target(req, &to);
        Verdict::Next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_whole_segments_only() {
        let s = Strip::new(&StripPrefix("/api".into()));
        assert_eq!(s.strip("/api/x/y"), Some("/x/y"));
        assert_eq!(s.strip("/api"), Some("/"));
        assert_eq!(s.strip("/api/"), Some("/"));
        assert_eq!(s.strip("/apix"), None);
        assert_eq!(s.strip("/other"), None);
    }

    #[test]
    fn queries_kept_or_dropped() {
        assert_eq!(
            with_query("/a".into(), Some("x=1"), QueryMode::Keep),
            "/a?x=1"
        );
        assert_eq!(
            with_query("/a?y=2".into(), Some("x=1"), QueryMode::Keep),
            "/a?y=2&x=1"
        );
        assert_eq!(
            with_query("/a?y=2".into(), Some("x=1"), QueryMode::Drop),
            "/a?y=2"
        );
        assert_eq!(with_query("/a".into(), None, QueryMode::Keep), "/a");
        let mut req = Request::new(());
        *req.uri_mut() = "http://h.example/old?q".parse().unwrap();
        assert!(set_target(&mut req, "/new?z"));
        assert_eq!(req.uri().to_string(), "http://h.example/new?z");
        assert!(!set_target(&mut req, "/has space"));
        assert!(!set_target(&mut req, "relative"));
    }
}
