//! API keys (pingap's `key_auth`): a named key in a request header or a query parameter. A
//! request without one of the rule's keys is answered 401; the key holder's name goes into the
//! request's notes (`api_key`), for the access log and a rate limit keyed on it. The key is
//! removed from the request to the origin (at ②: the header, or the query parameter) unless
//! `forward = true`.
//!
//! A presented key is found by its SHA-256 (one map lookup, however many keys), then compared
//! with the stored key in constant time (`subtle`). Keys come from the rule (`keys = { name =
//! "key" }`) and/or a `keys_file` (`name:key` lines), the file read again when it changes.
//!
//! Also here, for the other credential rules: reading a credential from where a rule says
//! ([`credential`]) and removing it from the request sent upstream ([`strip`]).

use std::collections::HashMap;

use http::{request, HeaderMap, Request, StatusCode, Uri};

use super::vars::Seen;
use super::watch::Watched;
use crate::body::RequestBody;
use crate::clock::Clock;
use crate::config::rules_auth::{parse_keys_file, ApiKeyConfig, KeySource};
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// Keys by the SHA-256 of the key: (holder's name, key).
type Keys = HashMap<[u8; 32], (Box<str>, Box<str>)>;

fn index(pairs: impl IntoIterator<Item = (String, String)>) -> Keys {
    pairs
        .into_iter()
        .map(|(name, key)| (sha256(key.as_bytes()), (name.into(), key.into())))
        .collect()
}

fn sha256(b: &[u8]) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b).as_ref());
    out
}

fn file_keys(text: &str) -> Result<Keys, String> {
    parse_keys_file(text).map(index)
}

/// `api_key = { header | query, keys | keys_file, forward }`.
pub struct ApiKey {
    source: KeySource,
    keys: Keys,
    file: Option<Watched<Keys>>,
    forward: bool,
}

impl ApiKey {
    pub fn new(cfg: &ApiKeyConfig, clock: &Clock) -> ApiKey {
        ApiKey {
            source: cfg.source.clone(),
            keys: index(cfg.keys.clone()),
            file: (cfg.keys_file.as_ref()).map(|f| Watched::open(f, clock, file_keys)),
            forward: cfg.forward,
        }
    }

    /// The name of the holder of `presented`, if it is one of the keys.
    fn holder(&self, presented: &str) -> Option<Box<str>> {
        use subtle::ConstantTimeEq;
        let h = sha256(presented.as_bytes());
        let from_file = self.file.as_ref().and_then(Watched::get);
        let found = (self.keys.get(&h)).or_else(|| from_file.as_ref().and_then(|f| f.get(&h)))?;
        bool::from(found.1.as_bytes().ct_eq(presented.as_bytes())).then(|| found.0.clone())
    }
}

/// A credential as `source` says where it is: a header's value, a cookie or a query
/// parameter (raw, not decoded).
pub fn credential<'a>(source: &KeySource, seen: Seen<'a>) -> Option<&'a str> {
    match source {
        KeySource::Header(h) => seen.header(h.0.as_str()),
        KeySource::Cookie(c) => seen.cookie(c),
        KeySource::Query(q) => seen.arg(q),
    }
    .filter(|v| !v.is_empty())
}

/// Removes the credential of `source` from a request going upstream.
pub fn strip(source: &KeySource, headers: &mut HeaderMap, uri: &mut Uri) {
    match source {
        KeySource::Header(h) => {
            headers.remove(&h.0);
        }
        KeySource::Cookie(name) => strip_cookie(headers, name),
        KeySource::Query(name) => {
            let Some(q) = uri.query() else { return };
            let kept: Vec<&str> = q
                .split('&')
                .filter(|p| p.split_once('=').map_or(*p, |(k, _)| k) != name)
                .collect();
            let path = uri.path();
            let pq = if kept.is_empty() {
                path.to_string()
            } else {
                format!("{path}?{}", kept.join("&"))
            };
            let mut parts = uri.clone().into_parts();
            if let Ok(pq) = pq.parse() {
                parts.path_and_query = Some(pq);
                if let Ok(u) = Uri::from_parts(parts) {
                    *uri = u;
                }
            }
        }
    }
}

/// Removes the cookie `name` from every Cookie field of `headers` (a field left empty goes).
fn strip_cookie(headers: &mut HeaderMap, name: &str) {
    let fields: Vec<http::HeaderValue> = headers
        .get_all(http::header::COOKIE)
        .iter()
        .cloned()
        .collect();
    if fields.is_empty() {
        return;
    }
    headers.remove(http::header::COOKIE);
    for v in fields {
        let Ok(text) = v.to_str() else {
            headers.append(http::header::COOKIE, v);
            continue;
        };
        let kept: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|c| !c.is_empty() && c.split_once('=').map_or(*c, |(k, _)| k) != name)
            .collect();
        if kept.is_empty() {
            continue;
        }
        if let Ok(v) = http::HeaderValue::from_str(&kept.join("; ")) {
            headers.append(http::header::COOKIE, v);
        }
    }
}

impl Step for ApiKey {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        match credential(&self.source, Seen::of(req)).and_then(|k| self.holder(k)) {
            Some(name) => {
                cx.notes.push(("api_key", name.into()));
                Verdict::Next
            }
            None => Verdict::Answer(text_response(
                StatusCode::UNAUTHORIZED,
                "a valid API key is required\n",
            )),
        }
    }

    fn upstream_request(&self, req: &mut request::Parts, _cx: &Cx) {
        if !self.forward {
            strip(&self.source, &mut req.headers, &mut req.uri);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HeaderNameCfg;

    /// A request as a rule sees it at ①.
    pub fn request(uri: &str, headers: &[(&str, &str)]) -> Request<RequestBody> {
        use http_body_util::BodyExt;
        let body = http_body_util::Empty::<bytes::Bytes>::new()
            .map_err(|never| match never {})
            .boxed();
        let mut b = Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(RequestBody::Stream(body)).unwrap()
    }

    #[test]
    fn the_holders_name_goes_into_the_notes() {
        let cfg = ApiKeyConfig {
            source: KeySource::Header(HeaderNameCfg(http::HeaderName::from_static("x-api-key"))),
            keys: [("alice".to_string(), "alice-key-1".to_string())].into(),
            keys_file: None,
            forward: false,
        };
        let step = ApiKey::new(&cfg, &Clock::system());
        let mut cx = Cx::new("127.0.0.1:1".parse().unwrap());
        let mut req = request("/a", &[("x-api-key", "alice-key-1")]);
        assert!(matches!(step.request(&mut req, &mut cx), Verdict::Next));
        assert_eq!(cx.note("api_key"), Some("alice"));
        let mut cx = Cx::new("127.0.0.1:1".parse().unwrap());
        let mut req = request("/a", &[("x-api-key", "alice-key-2")]);
        assert!(matches!(
            step.request(&mut req, &mut cx),
            Verdict::Answer(_)
        ));
        assert_eq!(cx.note("api_key"), None);
    }

    #[test]
    fn stripping_a_credential_leaves_the_rest() {
        let mut h = HeaderMap::new();
        h.append(
            http::header::COOKIE,
            http::HeaderValue::from_static("a=1; token=xyz; b=2"),
        );
        h.append(
            http::header::COOKIE,
            http::HeaderValue::from_static("token=q"),
        );
        let mut uri: Uri = "/p?x=1&token=abc&y=2".parse().unwrap();
        strip(&KeySource::Cookie("token".into()), &mut h, &mut uri);
        let cookies: Vec<_> = h.get_all(http::header::COOKIE).iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);
        strip(&KeySource::Query("token".into()), &mut h, &mut uri);
        assert_eq!(uri, "/p?x=1&y=2");
    }

    #[test]
    fn only_the_keys_parameter_is_stripped() {
        let source = KeySource::Query("key".into());
        for (from, to) in [
            ("/a?key=1", "/a"),
            ("/a?x=1&key=2&keyx=3&y", "/a?x=1&keyx=3&y"),
            ("/a?key", "/a"),
            ("/a", "/a"),
        ] {
            let mut uri: Uri = from.parse().unwrap();
            strip(&source, &mut HeaderMap::new(), &mut uri);
            assert_eq!(uri, to, "{from}");
        }
    }
}
