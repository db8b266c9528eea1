//! Cache keys: the primary key a response is stored under ([`CacheKey`]) and how a request's is
//! made ([`cache_key`]; shaped by a route's `cache_key` rule, [`shaped_key`]; the keys an
//! unsafe method's Location / Content-Location name, [`same_origin_key`]), and the key
//! concurrent misses coalesce on ([`FillKey`]).

use super::vary::VaryKey;

/// The primary cache key: scheme, host (lowercase, without default port) and path with query.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey(Box<str>);

impl CacheKey {
    pub fn from_parts(scheme: &str, host: &str, path_and_query: &str) -> CacheKey {
        let mut s = String::with_capacity(scheme.len() + host.len() + path_and_query.len() + 3);
        s.push_str(scheme);
        s.push_str("://");
        let at = s.len();
        s.push_str(host);
        s[at..].make_ascii_lowercase();
        s.push_str(path_and_query);
        CacheKey(s.into_boxed_str())
    }

    /// A key written out by [`CacheKey::as_str`] (a purge message, a stored record), as it was.
    pub fn from_string(key: String) -> CacheKey {
        CacheKey(key.into_boxed_str())
    }

    #[inline]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What one fill produces, the key concurrent misses coalesce on: the response for a URL, or, once
/// the URL is known to vary on request fields (§4.1), the variant a request's values select (so
/// requests for different variants do not wait on each other's fills).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FillKey {
    url: CacheKey,
    variant: Option<VaryKey>,
}

impl FillKey {
    /// The fill of one variant of `url`.
    pub fn variant(url: CacheKey, variant: VaryKey) -> FillKey {
        FillKey {
            url,
            variant: Some(variant),
        }
    }
}

impl From<CacheKey> for FillKey {
    /// The fill of a URL whose response does not vary (or is not known yet).
    fn from(url: CacheKey) -> FillKey {
        FillKey { url, variant: None }
    }
}

/// The cache key of a request: scheme, its one authority (see [`crate::inbound`]), path and
/// query.
pub fn cache_key<B>(req: &http::Request<B>) -> CacheKey {
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    CacheKey::from_parts(
        "http",
        crate::inbound::authority(req.uri(), req.headers()),
        pq,
    )
}

/// [`cache_key`] of a request's head.
pub fn cache_key_of(parts: &http::request::Parts) -> CacheKey {
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    CacheKey::from_parts("http", key_host(parts), pq)
}

/// The host part of a request's key: its one authority.
pub fn key_host(parts: &http::request::Parts) -> &str {
    crate::inbound::authority(&parts.uri, &parts.headers)
}

/// The cache key of a request a route's rules shape (docs/rules.md, "Cache"): `shape` (a
/// `cache_key` rule) decides what of the query is in it, and which request header fields and
/// cookies are added; `pool` (a split that caches per pool) adds the pool's name. The parts
/// added follow the URL, each after a space (no URL holds one), as `name=value` with `%` and
/// spaces in the value escaped: `http://h/p?a=1 x-tenant=acme cookie:lang=fr pool=blue`. A
/// field or cookie the request lacks adds `name=` with nothing: absent and empty share one
/// entry.
pub fn shaped_key(
    uri: &http::Uri,
    headers: &http::HeaderMap,
    shape: Option<&crate::config::rules_cache::CacheKeyConfig>,
    pool: Option<&str>,
) -> CacheKey {
    use crate::config::rules_cache::QueryKey;
    if shape.is_none() && pool.is_none() {
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        return CacheKey::from_parts("http", crate::inbound::authority(uri, headers), pq);
    }
    let path = uri.path();
    let mut pq = String::with_capacity(path.len() + uri.query().map_or(0, str::len) + 1);
    pq.push_str(if path.is_empty() { "/" } else { path });
    let query = match shape {
        None => uri.query(),
        Some(s) if s.query == QueryKey::None => None,
        Some(_) => uri.query(),
    };
    if let Some(q) = query {
        let kept: Vec<&str> = match shape {
            None => vec![q],
            Some(s) => {
                let mut pairs: Vec<&str> = (q.split('&'))
                    .filter(|p| !p.is_empty())
                    .filter(|p| {
                        let name = p.split_once('=').map_or(*p, |(n, _)| n);
                        (s.keep.is_empty() || s.keep.iter().any(|g| g.matches(name)))
                            && !s.drop.iter().any(|g| g.matches(name))
                    })
                    .collect();
                if s.query == QueryKey::Sort {
                    pairs.sort_unstable();
                }
                pairs
            }
        };
        if !kept.is_empty() {
            pq.push('?');
            pq.push_str(&kept.join("&"));
        }
    }
    let add = |pq: &mut String, name: &str, value: &[u8]| {
        pq.push(' ');
        pq.push_str(name);
        pq.push('=');
        for &b in value {
            match b {
                b'%' | b' ' | 0..=0x1f | 0x7f.. => pq.push_str(&format!("%{b:02X}")),
                b => pq.push(b as char),
            }
        }
    };
    if let Some(s) = shape {
        for f in &s.headers {
            let value = (headers.get_all(&f.0).iter())
                .map(|v| v.as_bytes())
                .collect::<Vec<_>>()
                .join(&b","[..]);
            add(&mut pq, f.0.as_str(), &value);
        }
        for c in &s.cookies {
            let value = cookie(headers, c).unwrap_or_default();
            add(&mut pq, &format!("cookie:{c}"), value.as_bytes());
        }
    }
    if let Some(p) = pool {
        add(&mut pq, "pool", p.as_bytes());
    }
    CacheKey::from_parts("http", crate::inbound::authority(uri, headers), &pq)
}

/// The value of the cookie `name` in the request's Cookie fields (the first).
fn cookie<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    (headers.get_all(http::header::COOKIE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k.trim() == name).then(|| v.trim())
        })
}

/// The cache key a Location / Content-Location names, if on the same origin (§4.4).
pub fn same_origin_key(target: &str, host: &str, request_path: &str) -> Option<CacheKey> {
    if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        return authority
            .eq_ignore_ascii_case(host)
            .then(|| CacheKey::from_parts("http", host, path));
    }
    if target.starts_with("//") || target.contains("://") {
        return None;
    }
    if target.starts_with('/') {
        return Some(CacheKey::from_parts("http", host, target));
    }
    let dir = &request_path[..request_path.rfind('/').map_or(0, |i| i + 1)];
    Some(CacheKey::from_parts(
        "http",
        host,
        &format!("{dir}{target}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lowercases_host_only() {
        let k = CacheKey::from_parts("http", "Example.COM", "/A?b=C");
        assert_eq!(k.as_str(), "http://example.com/A?b=C");
    }

    #[test]
    fn rules_shape_the_key() {
        use crate::config::rules_cache::CacheKeyConfig;
        let shape: CacheKeyConfig = toml::from_str(
            r#"query = "sort"
               drop = ["utm_*"]
               headers = ["x-tenant"]
               cookies = ["lang"]"#,
        )
        .unwrap();
        let req = http::Request::get("/p?z=1&utm_source=x&a=2")
            .header("host", "Ex.com")
            .header("x-tenant", "acme corp")
            .header("cookie", "a=b; lang=fr")
            .body(())
            .unwrap();
        let k = shaped_key(req.uri(), req.headers(), Some(&shape), Some("blue"));
        assert_eq!(
            k.as_str(),
            "http://ex.com/p?a=2&z=1 x-tenant=acme%20corp cookie:lang=fr pool=blue"
        );
        let keep: CacheKeyConfig = toml::from_str(r#"keep = ["page"]"#).unwrap();
        let req = http::Request::get("/p?x=1&page=2")
            .header("host", "h")
            .body(())
            .unwrap();
        let k = shaped_key(req.uri(), req.headers(), Some(&keep), None);
        assert_eq!(k.as_str(), "http://h/p?page=2");
        let none: CacheKeyConfig = toml::from_str(r#"query = "none""#).unwrap();
        let k = shaped_key(req.uri(), req.headers(), Some(&none), None);
        assert_eq!(k.as_str(), "http://h/p");
        // Without a shape: the plain key.
        let k = shaped_key(req.uri(), req.headers(), None, None);
        assert_eq!(k, cache_key(&req));
    }

    #[test]
    fn invalidation_targets_stay_on_the_origin() {
        let k = |t: &str| same_origin_key(t, "example.com", "/a/b").map(|k| k.as_str().to_string());
        assert_eq!(k("/x").as_deref(), Some("http://example.com/x"));
        assert_eq!(k("c").as_deref(), Some("http://example.com/a/c"));
        assert_eq!(
            k("http://EXAMPLE.com/y").as_deref(),
            Some("http://example.com/y")
        );
        assert_eq!(k("http://other.com/y"), None);
        assert_eq!(k("//other.com/y"), None);
        assert_eq!(k("https://example.com/y"), None);
    }
}
