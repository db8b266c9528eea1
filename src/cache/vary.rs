//! Vary (RFC 9111 §4.1): which request fields select among stored responses for one URL, how
//! their values are normalized so that semantically equal requests share a variant, and which
//! requests a given response may answer ([`Selection`]).
//!
//! Accept-Encoding is not a selecting field here: larder negotiates the coding itself from the
//! variants of one entry, so it never splits the cache.

use http::header::{self, HeaderMap, HeaderName};

/// The selecting request-field names of a response's Vary, lowercased, deduplicated, sorted;
/// Accept-Encoding left out. `None` for `Vary: *` (never matches).
pub fn selecting_names(response: &HeaderMap) -> Option<Box<[HeaderName]>> {
    let mut names: Vec<HeaderName> = Vec::new();
    for v in response.get_all(header::VARY) {
        let Ok(s) = v.to_str() else { continue };
        for t in s.split(',') {
            let t = t.trim();
            if t == "*" {
                return None;
            }
            if t.is_empty() || t.eq_ignore_ascii_case("accept-encoding") {
                continue;
            }
            if let Ok(n) = HeaderName::from_bytes(t.as_bytes()) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Some(names.into_boxed_slice())
}

/// The normalized values of the selecting fields in one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct VaryKey(Box<[Option<Box<str>>]>);

impl VaryKey {
    pub fn of(names: &[HeaderName], request: &HeaderMap) -> VaryKey {
        VaryKey(names.iter().map(|n| normalize(n, request)).collect())
    }
}

/// Which requests a stored response answers (§4.1): the selecting fields its Vary names and the
/// values the request that caused it had for them. Empty for a response that does not vary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    names: Box<[HeaderName]>,
    key: VaryKey,
}

impl Selection {
    /// The selection of `response`, fetched for `request`; None for `Vary: *` (answers no one).
    pub fn of(response: &HeaderMap, request: &HeaderMap) -> Option<Selection> {
        let names = selecting_names(response)?;
        let key = VaryKey::of(&names, request);
        Some(Selection { names, key })
    }

    /// Whether the response varies on request fields (other than Accept-Encoding).
    pub fn varies(&self) -> bool {
        !self.names.is_empty()
    }

    /// The selecting field names, sorted.
    pub fn names(&self) -> &[HeaderName] {
        &self.names
    }

    /// The values that select this response.
    pub fn key(&self) -> &VaryKey {
        &self.key
    }

    /// The values `request` has for this response's selecting fields: the variant it selects.
    pub fn key_of(&self, request: &HeaderMap) -> VaryKey {
        VaryKey::of(&self.names, request)
    }

    /// Whether this response may answer `request`: every selecting field has the same normalized
    /// value in both requests (absent in both counts as equal).
    pub fn matches(&self, request: &HeaderMap) -> bool {
        !self.varies() || self.key_of(request) == self.key
    }

    /// The normalized values that select this response, one per name (None: field absent).
    pub(super) fn values(&self) -> &[Option<Box<str>>] {
        &self.key.0
    }

    /// A selection read back from a stored record: None unless the names are sorted without
    /// repeats (as [`selecting_names`] gives them) and there is one value per name.
    pub(super) fn from_parts(
        names: Box<[HeaderName]>,
        values: Box<[Option<Box<str>>]>,
    ) -> Option<Selection> {
        let sorted = names.windows(2).all(|w| w[0].as_str() < w[1].as_str());
        (sorted && names.len() == values.len()).then(|| Selection {
            names,
            key: VaryKey(values),
        })
    }
}

/// Fields whose values compare case-insensitively.
fn case_insensitive(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "accept" | "accept-language" | "accept-charset" | "origin" | "user-agent-class"
    )
}

/// Combines every field line into one list (§5.3 of RFC 9110), trims whitespace around members,
/// drops empty members; lowercases fields known to be case-insensitive. Absent field → None.
fn normalize(name: &HeaderName, request: &HeaderMap) -> Option<Box<str>> {
    let mut lines = request.get_all(name).iter().peekable();
    lines.peek()?;
    let mut out = String::new();
    for line in lines {
        let s = String::from_utf8_lossy(line.as_bytes());
        for member in s.split(',') {
            let m = member.split_whitespace().collect::<Vec<_>>().join(" ");
            let m = m.replace(" ;", ";").replace("; ", ";");
            if m.is_empty() {
                continue;
            }
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&m);
        }
    }
    if case_insensitive(name) {
        out.make_ascii_lowercase();
    }
    Some(out.into_boxed_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn names_are_normalized_and_accept_encoding_ignored() {
        let r = headers(&[
            ("vary", "Accept-Language, accept-encoding"),
            ("vary", "X-Foo ,accept-language"),
        ]);
        let names = selecting_names(&r).unwrap();
        assert_eq!(
            names.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["accept-language", "x-foo"]
        );
        assert!(selecting_names(&headers(&[("vary", "x, *")])).is_none());
        assert!(selecting_names(&headers(&[])).unwrap().is_empty());
    }

    #[test]
    fn values_equal_after_whitespace_case_and_line_folding() {
        let names = [HeaderName::from_static("accept-language")];
        let a = VaryKey::of(&names, &headers(&[("accept-language", "en-US, fr;q=0.5")]));
        let b = VaryKey::of(
            &names,
            &headers(&[
                ("accept-language", "en-us"),
                ("accept-language", "fr ; q=0.5"),
            ]),
        );
        assert_eq!(a, b);
        let c = VaryKey::of(&names, &headers(&[("accept-language", "de")]));
        assert_ne!(a, c);
        let absent = VaryKey::of(&names, &headers(&[]));
        let empty = VaryKey::of(&names, &headers(&[("accept-language", "")]));
        assert_ne!(absent, empty);
    }

    #[test]
    fn a_selection_matches_the_requests_that_select_it() {
        let response = headers(&[("vary", "Cookie, Accept-Encoding")]);
        let alice = headers(&[("cookie", "s=alice"), ("accept-encoding", "gzip")]);
        let sel = Selection::of(&response, &alice).unwrap();
        assert!(sel.varies());
        assert!(sel.matches(&headers(&[("cookie", "s=alice")])));
        assert!(!sel.matches(&headers(&[("cookie", "s=bob")])));
        assert!(!sel.matches(&headers(&[])));
        let plain = Selection::of(&headers(&[("vary", "accept-encoding")]), &alice).unwrap();
        assert!(!plain.varies() && plain.matches(&headers(&[("cookie", "s=bob")])));
        assert!(Selection::of(&headers(&[("vary", "*")]), &alice).is_none());
    }

    #[test]
    fn case_sensitive_fields_keep_case() {
        let names = [HeaderName::from_static("x-token")];
        let a = VaryKey::of(&names, &headers(&[("x-token", "Abc")]));
        let b = VaryKey::of(&names, &headers(&[("x-token", "abc")]));
        assert_ne!(a, b);
    }
}
