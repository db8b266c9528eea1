//! Cache rules (nginx's `proxy_cache_key`, `proxy_cache_valid`, `proxy_cache_bypass` and
//! `proxy_ignore_headers`; Varnish's `vcl_hash`): at ① each leaves its decision for the proxy
//! in the request ([`Steer`]: the key's shape, lifetimes, a bypass, a forced lifetime), and
//! its name in the request's context (the note `cache_rule`, which the access log writes); at
//! ④ the first of them that applied adds larder's member to the response's `Cache-Status`
//! field (RFC 9211) with `detail="rule=NAME"`.

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{HeaderValue, Request, Response};

use crate::body::{Body, RequestBody};
use crate::config::rules_cache::{CacheKeyConfig, CacheTtlConfig};
use crate::metrics::CacheResult;
use crate::phases::{Cx, Step, Verdict};
use crate::proxy::Steer;

/// The note a cache rule leaves: the names of the cache rules that applied, comma separated.
pub const NOTE: &str = "cache_rule";

/// RFC 9211's field.
static CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// What one cache rule decides.
pub enum Decide {
    Key(Arc<CacheKeyConfig>),
    Ttl(Arc<CacheTtlConfig>),
    Bypass,
    Force(Duration),
}

/// A cache rule: its name (`rule=NAME`) and its decision.
pub struct CacheRule {
    name: Box<str>,
    decide: Decide,
}

/// Kept by the first cache rule that applied to a request: it writes the `Cache-Status`.
struct First;

impl CacheRule {
    pub fn new(name: &str, decide: Decide) -> CacheRule {
        CacheRule {
            name: name.into(),
            decide,
        }
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }
}

/// Notes `name` as a cache rule that applied; true for the first.
pub fn note(cx: &mut Cx, name: &str) -> bool {
    match cx.notes.iter_mut().find(|(n, _)| *n == NOTE) {
        Some((_, v)) => {
            if !v.split(',').any(|n| n == name) {
                *v = format!("{v},{name}").into();
            }
            false
        }
        None => {
            cx.notes.push((NOTE, name.into()));
            true
        }
    }
}

impl Step for CacheRule {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let steer = req.extensions_mut().get_or_insert_default::<Steer>();
        match &self.decide {
            Decide::Key(k) => steer.key = Some(Arc::clone(k)),
            Decide::Ttl(t) => steer.ttl = Some(Arc::clone(t)),
            Decide::Bypass => steer.bypass = true,
            Decide::Force(d) => steer.force = Some(*d),
        }
        if note(cx, &self.name) {
            cx.stash(self.id(), First);
        }
        Verdict::Next
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        if cx.stashed::<First>(self.id()).is_some() {
            stamp(resp, cx);
        }
    }
}

/// Appends larder's member to the response's `Cache-Status` (RFC 9211 §2: each cache adds its
/// own after those of the caches nearer the origin): the result its handler noted, and which
/// rules decided.
pub fn stamp(resp: &mut Response<Body>, cx: &Cx) {
    let Some(rules) = cx.note(NOTE) else {
        return;
    };
    let result = match resp.body().outcome().cache() {
        c if c == CacheResult::Hit as usize => "hit",
        c if c == CacheResult::Stale as usize => "hit; fwd=stale",
        c if c == CacheResult::Miss as usize => "fwd=miss; stored",
        c if c == CacheResult::Expired as usize => "fwd=stale",
        c if c == CacheResult::Revalidated as usize => "fwd=stale; fwd-status=304",
        c if c == CacheResult::Bypass as usize => "fwd=bypass",
        // Not a cache's answer (a file, a rule's own answer): nothing to say.
        _ => return,
    };
    // A response the cache considered and did not store says so.
    let result = match (result, resp.body().outcome().no_store()) {
        ("fwd=miss; stored", Some(_)) => "fwd=miss",
        (r, _) => r,
    };
    // Rule names are TOML strings: quoted as an sf-string, what cannot be in one left out.
    let detail: String = (rules.chars())
        .filter(|c| (' '..='~').contains(c))
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    let member = format!("larder; {result}; detail=\"rule={detail}\"");
    if let Ok(v) = HeaderValue::from_str(&member) {
        resp.headers_mut().append(CACHE_STATUS.clone(), v);
    }
}
