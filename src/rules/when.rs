//! A rule's conditions (`when`), compiled: checked at ① against the request as it is then
//! (after earlier rules' rewrites); a path pattern that matches leaves its captures in the
//! request's context.

use http::Request;

use super::vars::Seen;
use crate::body::RequestBody;
use crate::config::rules::{ValueMatch, When};
use crate::phases::{Applies, Cx};

/// Every condition of a rule: its own `when` and those of the `use`s that led to it.
pub struct Matcher {
    whens: Vec<When>,
}

impl Matcher {
    /// None when there is no condition (the rule applies to every request).
    pub fn of(whens: Vec<&When>) -> Option<Box<dyn Applies>> {
        (!whens.is_empty()).then(|| {
            Box::new(Matcher {
                whens: whens.into_iter().cloned().collect(),
            }) as Box<dyn Applies>
        })
    }
}

impl Applies for Matcher {
    fn applies(&self, req: &Request<RequestBody>, cx: &mut Cx) -> bool {
        let seen = Seen::of(req);
        self.whens.iter().all(|w| holds(w, seen, cx, true))
    }
}

/// Whether `w` holds; `capture`: a path pattern's groups go into `cx` (not under `not`).
fn holds(w: &When, seen: Seen<'_>, cx: &mut Cx, capture: bool) -> bool {
    if !w.method.is_empty() && !w.method.iter().any(|m| m.0 == seen.method) {
        return false;
    }
    if !w.host.is_empty() {
        let host = seen.host();
        if !w.host.iter().any(|p| p.matches(host)) {
            return false;
        }
    }
    if !w.client.is_empty() && !w.client.iter().any(|c| c.contains(cx.client.ip())) {
        return false;
    }
    for (name, m) in &w.header {
        let mut values = seen.headers.get_all(name.0.as_str()).iter();
        if !values.any(|v| v.to_str().is_ok_and(|v| value_matches(m, v))) {
            return false;
        }
    }
    for (name, m) in &w.query {
        if !seen.arg(name).is_some_and(|v| {
            let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
            value_matches(m, &v)
        }) {
            return false;
        }
    }
    for (name, m) in &w.cookie {
        if !seen.cookie(name).is_some_and(|v| value_matches(m, v)) {
            return false;
        }
    }
    let path = seen.uri.path();
    for p in [w.path.as_ref().map(|g| &g.0), w.path_regex.as_ref()]
        .into_iter()
        .flatten()
    {
        let Some(caps) = p.regex.captures(path) else {
            return false;
        };
        if capture {
            cx.captures.clear();
            let names = p.regex.capture_names();
            for (m, name) in caps.iter().zip(names) {
                cx.captures
                    .push((name.map(Into::into), m.map_or("", |m| m.as_str()).into()));
            }
        }
    }
    if let Some(not) = &w.not {
        if holds(not, seen, cx, false) {
            return false;
        }
    }
    true
}

fn value_matches(m: &ValueMatch, v: &str) -> bool {
    match m {
        ValueMatch::Present => true,
        ValueMatch::Exact(s) => s == v,
        ValueMatch::Glob(g) => g.0.regex.is_match(v),
        ValueMatch::Regex(p) => p.regex.is_match(v),
    }
}
