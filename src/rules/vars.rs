//! What rules read of a request: its parts, a query parameter, a cookie; and templates
//! (`$remote_addr`, `$1`, `$http_x_key` ...) rendered from them into header values and URLs,
//! where no variable can bring a CR or LF (a value that would is refused, not sent).

use http::{HeaderMap, HeaderValue, Method, Uri};

use crate::config::rules::{Piece, Template, Var};
use crate::phases::Cx;

/// The parts of a request rules read (a request at ①, the upstream request's parts at ②).
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    /// `https` or `http`: how the client reached larder ([`crate::http::fields::scheme`]).
    pub scheme: &'static str,
}

impl<'a> Seen<'a> {
    pub fn of<B>(req: &'a http::Request<B>) -> Seen<'a> {
        Seen {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            scheme: crate::http::fields::scheme(req.extensions()),
        }
    }

    pub fn of_parts(p: &'a http::request::Parts) -> Seen<'a> {
        Seen {
            method: &p.method,
            uri: &p.uri,
            headers: &p.headers,
            scheme: crate::http::fields::scheme(&p.extensions),
        }
    }

    /// The request's host, without a port.
    pub fn host(&self) -> &'a str {
        let h = crate::inbound::authority(self.uri, self.headers);
        if h.starts_with('[') {
            h.find(']').map_or(h, |i| &h[..=i])
        } else {
            h.split(':').next().unwrap_or(h)
        }
    }

    /// The first value of a request header, as text.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A cookie's value (the first of that name, in any `Cookie` field).
    pub fn cookie(&self, name: &str) -> Option<&'a str> {
        cookie(self.headers, name)
    }

    /// A query parameter's raw value (not decoded; the first of that name); `""` when it is
    /// present without a value.
    pub fn arg(&self, name: &str) -> Option<&'a str> {
        let q = self.uri.query()?;
        q.split('&').find_map(|p| match p.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if p == name => Some(""),
            _ => None,
        })
    }
}

/// A cookie's value from a request's `Cookie` fields (RFC 6265 §4.2: `a=1; b=2`).
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k.trim() == name).then(|| v.trim().trim_matches('"'))
        })
}

/// Renders `t` for this request: each variable's value (empty when it has none).
pub fn render(t: &Template, seen: Option<Seen<'_>>, cx: &Cx, out: &mut String) {
    use std::fmt::Write;
    for p in &t.parts {
        match p {
            Piece::Text(s) => out.push_str(s),
            Piece::Var(v) => match v {
                Var::Capture(n) => {
                    if let Some((_, c)) = cx.captures.get(*n) {
                        out.push_str(c);
                    }
                }
                Var::Named(name) => {
                    if let Some((_, c)) =
                        (cx.captures.iter()).find(|(n, _)| n.as_deref() == Some(name.as_str()))
                    {
                        out.push_str(c);
                    }
                }
                Var::RemoteAddr => {
                    let _ = write!(out, "{}", cx.client.ip());
                }
                Var::RequestId => {
                    if let Some(id) = cx.request_id.as_ref().and_then(|v| v.to_str().ok()) {
                        out.push_str(id);
                    }
                }
                Var::Claim(name) => {
                    if let Some(v) = cx.claims.as_ref().and_then(|c| c.get(name)) {
                        match v {
                            serde_json::Value::String(s) => out.push_str(s),
                            other => {
                                let _ = write!(out, "{other}");
                            }
                        }
                    }
                }
                _ => {
                    let Some(seen) = seen else { continue };
                    match v {
                        Var::Host => out.push_str(seen.host()),
                        Var::Uri => out.push_str(seen.uri.path()),
                        Var::Args => out.push_str(seen.uri.query().unwrap_or("")),
                        Var::RequestUri => {
                            out.push_str(seen.uri.path_and_query().map_or("/", |p| p.as_str()))
                        }
                        Var::Scheme => out.push_str(seen.scheme),
                        Var::Method => out.push_str(seen.method.as_str()),
                        Var::Header(h) => out.push_str(seen.header(h).unwrap_or("")),
                        Var::Cookie(c) => out.push_str(seen.cookie(c).unwrap_or("")),
                        Var::Arg(a) => out.push_str(seen.arg(a).unwrap_or("")),
                        _ => {}
                    }
                }
            },
        }
    }
}

/// `t` rendered as a header value; None (and a debug line) when the result is not a valid
/// field value (a CR, LF or other control character from a variable).
pub fn header_value(t: &Template, seen: Option<Seen<'_>>, cx: &Cx) -> Option<HeaderValue> {
    let mut s = String::new();
    render(t, seen, cx, &mut s);
    match HeaderValue::from_str(&s) {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::debug!(
                template = t.source.as_str(),
                "a rendered header value is not valid: not sent"
            );
            None
        }
    }
}
