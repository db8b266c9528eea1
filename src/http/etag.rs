//! Entity-tags (RFC 9110 §8.8.3): comparing them, strongly or weakly, against a request's list,
//! and weakening a strong one for a body in another coding.

use http::header::HeaderValue;

/// Whether an If-Match / If-None-Match list matches `etag` (RFC 9110 §8.8.3.2): `strong`
/// comparison (If-Match) needs both tags strong and equal; weak comparison (If-None-Match)
/// compares the opaque tags alone. `*` matches any current representation.
pub fn list_matches(list: &HeaderValue, etag: Option<&HeaderValue>, strong: bool) -> bool {
    let Ok(list) = list.to_str() else {
        return false;
    };
    if list.trim() == "*" {
        return etag.is_some();
    }
    let Some(etag) = etag.and_then(|e| e.to_str().ok()) else {
        return false;
    };
    let (etag_weak, etag_opaque) = split(etag);
    if strong && etag_weak {
        return false;
    }
    list.split(',').any(|candidate| {
        let (weak, opaque) = split(candidate.trim());
        opaque == etag_opaque && !(strong && weak)
    })
}

/// Strong comparison of two single entity-tags (If-Range, §13.1.5): both strong, byte-equal.
pub fn strong_eq(a: &HeaderValue, b: &HeaderValue) -> bool {
    !is_weak(a) && !is_weak(b) && a.as_bytes() == b.as_bytes()
}

/// Whether a tag is weak (`W/"..."`).
pub fn is_weak(tag: &HeaderValue) -> bool {
    tag.as_bytes().starts_with(b"W/")
}

/// A strong ETag weakened (None if it is weak already). A strong ETag names one
/// representation; a body in another coding is a different representation, so it is sent with
/// the tag weakened (as nginx does).
pub fn weakened(tag: &HeaderValue) -> Option<HeaderValue> {
    if is_weak(tag) {
        return None;
    }
    let mut weak = Vec::with_capacity(tag.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(tag.as_bytes());
    HeaderValue::from_bytes(&weak).ok()
}

/// (weak, opaque-tag) of one entity-tag.
fn split(tag: &str) -> (bool, &str) {
    match tag.strip_prefix("W/") {
        Some(rest) => (true, rest),
        None => (false, tag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn etag_comparison() {
        let strong = hv("\"a\"");
        let weak = hv("W/\"a\"");
        assert!(list_matches(&hv("\"a\""), Some(&strong), true));
        assert!(list_matches(&hv("W/\"a\""), Some(&strong), false));
        assert!(!list_matches(&hv("W/\"a\""), Some(&strong), true));
        assert!(!list_matches(&hv("\"a\""), Some(&weak), true));
        assert!(list_matches(&hv("\"b\", \"a\""), Some(&weak), false));
        assert!(list_matches(&hv("*"), Some(&weak), false));
        assert!(!list_matches(&hv("*"), None, false));
    }

    #[test]
    fn strong_comparison_of_single_tags() {
        assert!(strong_eq(&hv("\"a\""), &hv("\"a\"")));
        assert!(!strong_eq(&hv("W/\"a\""), &hv("W/\"a\"")));
        assert!(!strong_eq(&hv("\"a\""), &hv("W/\"a\"")));
        assert!(!strong_eq(&hv("\"a\""), &hv("\"b\"")));
    }

    #[test]
    fn weakening() {
        assert_eq!(weakened(&hv("\"v1\"")).unwrap(), "W/\"v1\"");
        assert_eq!(weakened(&hv("W/\"v1\"")), None);
    }
}
