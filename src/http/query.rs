//! A request's query string, decoded once: `name=value` pairs split on `&`, percent-decoded
//! (invalid UTF-8 replaced), at most [`MAX_PAIRS`] kept (no unbounded work from a client).

use percent_encoding::percent_decode_str;

/// Pairs read at most; the rest of a longer query is ignored.
pub const MAX_PAIRS: usize = 32;

/// A decoded query.
pub struct Query(Vec<(String, String)>);

impl Query {
    /// Decodes `q`; with `plus_is_space`, `+` is a space (as HTML forms send it).
    pub fn parse(q: Option<&str>, plus_is_space: bool) -> Query {
        let decode = |s: &str| {
            let s = if plus_is_space {
                std::borrow::Cow::Owned(s.replace('+', " "))
            } else {
                std::borrow::Cow::Borrowed(s)
            };
            percent_decode_str(&s).decode_utf8_lossy().into_owned()
        };
        Query(
            q.unwrap_or("")
                .split('&')
                .filter(|p| !p.is_empty())
                .take(MAX_PAIRS)
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }

    /// The value of the first pair named `k` (ASCII case-insensitive).
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    }

    /// Whether a pair is named `k` exactly (a flag such as `?subscribe`).
    pub fn has(&self, k: &str) -> bool {
        self.0.iter().any(|(n, _)| n == k)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first pair whose name is one of `names`.
    pub fn first_of(&self, names: &[&str]) -> Option<(&str, &str)> {
        (self.0.iter())
            .find(|(n, _)| names.contains(&n.as_str()))
            .map(|(n, v)| (n.as_str(), v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_pairs() {
        let q = Query::parse(Some("a=1%202&b=x+y&flag&&C=3"), false);
        assert_eq!(q.get("a"), Some("1 2"));
        assert_eq!(q.get("b"), Some("x+y"));
        assert_eq!(q.get("c"), Some("3"));
        assert!(q.has("flag") && !q.has("FLAG"));
        assert_eq!(q.first_of(&["b", "a"]), Some(("a", "1 2")));
        assert_eq!(Query::parse(Some("b=x+y"), true).get("b"), Some("x y"));
        let long = vec!["k=v"; 100].join("&");
        assert_eq!(Query::parse(Some(&long), false).0.len(), MAX_PAIRS);
        assert!(Query::parse(None, false).is_empty());
    }
}
