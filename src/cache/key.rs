//! Cache keys: the primary key a response is stored under ([`CacheKey`]) and how a request's is
//! made ([`cache_key`]; the keys an unsafe method's Location / Content-Location name,
//! [`same_origin_key`]), and the key concurrent misses coalesce on ([`FillKey`]).

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
