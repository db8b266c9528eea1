//! Cache keys: the primary key a response is stored under ([`CacheKey`]), and the key concurrent
//! misses coalesce on ([`FillKey`]).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lowercases_host_only() {
        let k = CacheKey::from_parts("http", "Example.COM", "/A?b=C");
        assert_eq!(k.as_str(), "http://example.com/A?b=C");
    }
}
