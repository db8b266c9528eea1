//! Header rules (nginx's `proxy_set_header` and `add_header`, pingap's request and response
//! header plugins): set, add and remove fields on the request sent upstream (②) or on the
//! response sent to the client (④), values rendered from templates.
//!
//! A response rule's values that read the request (`$uri`, `$http_...`) are rendered at ①,
//! while the request is there, and kept in the request's context for ④.

use http::header::HeaderName;
use http::{request, HeaderMap, HeaderValue, Request, Response};

use super::vars::{header_value, Seen};
use crate::body::{Body, RequestBody};
use crate::config::rules::{HeaderEdits, Piece, Template, Var};
use crate::phases::{Cx, Step, Verdict};

/// A value: fixed (rendered once at load) or a template.
enum Value {
    Fixed(HeaderValue),
    Template(Template),
}

/// Compiled edits.
struct Edits {
    set: Vec<(HeaderName, Value)>,
    add: Vec<(HeaderName, Value)>,
    remove: Vec<HeaderName>,
    /// Every value is fixed: applied as it is, nothing rendered or collected per request.
    fixed: bool,
}

impl Edits {
    fn new(cfg: &HeaderEdits) -> Edits {
        let value = |t: &Template| match t.is_plain() {
            true => {
                let mut s = String::new();
                for p in &t.parts {
                    if let Piece::Text(x) = p {
                        s.push_str(x);
                    }
                }
                match HeaderValue::from_str(&s) {
                    Ok(v) => Value::Fixed(v),
                    Err(_) => Value::Template(t.clone()),
                }
            }
            false => Value::Template(t.clone()),
        };
        let set: Vec<_> = (cfg.set.iter())
            .map(|(k, v)| (k.header(), value(v)))
            .collect();
        let add: Vec<_> = (cfg.add.iter())
            .map(|(k, v)| (k.header(), value(v)))
            .collect();
        let fixed = (set.iter().chain(&add)).all(|(_, v)| matches!(v, Value::Fixed(_)));
        Edits {
            set,
            add,
            remove: cfg.remove.iter().map(|k| k.header()).collect(),
            fixed,
        }
    }

    /// Whether a value reads the request (so a response rule renders it at ①).
    fn reads_request(&self) -> bool {
        self.set.iter().chain(&self.add).any(|(_, v)| match v {
            Value::Fixed(_) => false,
            Value::Template(t) => t.parts.iter().any(|p| {
                matches!(
                    p,
                    Piece::Var(
                        Var::Host
                            | Var::Uri
                            | Var::Args
                            | Var::RequestUri
                            | Var::Scheme
                            | Var::Method
                            | Var::Header(_)
                            | Var::Cookie(_)
                            | Var::Arg(_)
                    )
                )
            }),
        })
    }

    /// The rendered values, in order (set ones, then added ones).
    fn render(&self, seen: Option<Seen<'_>>, cx: &Cx) -> Vec<Option<HeaderValue>> {
        (self.set.iter().chain(&self.add))
            .map(|(_, v)| match v {
                Value::Fixed(v) => Some(v.clone()),
                Value::Template(t) => header_value(t, seen, cx),
            })
            .collect()
    }

    /// [`Edits::apply`] when every value is fixed.
    fn apply_fixed(&self, h: &mut HeaderMap) {
        for name in &self.remove {
            h.remove(name);
        }
        for (name, v) in &self.set {
            if let Value::Fixed(v) = v {
                h.insert(name.clone(), v.clone());
            }
        }
        for (name, v) in &self.add {
            if let Value::Fixed(v) = v {
                h.append(name.clone(), v.clone());
            }
        }
    }

    fn apply(&self, h: &mut HeaderMap, values: Vec<Option<HeaderValue>>) {
        for name in &self.remove {
            h.remove(name);
        }
        let mut values = values.into_iter();
        for (name, _) in &self.set {
            match values.next().flatten() {
                Some(v) => {
                    h.insert(name.clone(), v);
                }
                None => {
                    h.remove(name);
                }
            }
        }
        for (name, _) in &self.add {
            if let Some(v) = values.next().flatten() {
                h.append(name.clone(), v);
            }
        }
    }
}

/// `request_headers`: on the request sent upstream (②), after larder's own forwarding fields.
pub struct RequestHeaders(Edits);

impl RequestHeaders {
    pub fn new(cfg: &HeaderEdits) -> RequestHeaders {
        RequestHeaders(Edits::new(cfg))
    }
}

impl Step for RequestHeaders {
    fn upstream_request(&self, req: &mut request::Parts, cx: &Cx) {
        if self.0.fixed {
            self.0.apply_fixed(&mut req.headers);
            return;
        }
        let values = self.0.render(Some(Seen::of_parts(req)), cx);
        self.0.apply(&mut req.headers, values);
    }
}

/// `response_headers`: on the response to the client (④), whatever served it.
pub struct ResponseHeaders {
    edits: Edits,
    /// Some value reads the request: rendered at ①, kept in the context.
    early: bool,
}

/// Values a response rule rendered at ①, kept in the request's context for ④.
struct Rendered(Vec<Option<HeaderValue>>);

impl ResponseHeaders {
    pub fn new(cfg: &HeaderEdits) -> ResponseHeaders {
        let edits = Edits::new(cfg);
        ResponseHeaders {
            early: edits.reads_request(),
            edits,
        }
    }

    fn id(&self) -> usize {
        self as *const Self as usize
    }
}

impl Step for ResponseHeaders {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        self.answered(req, cx);
        Verdict::Next
    }

    /// An earlier rule's answer gets these fields too (nginx's `add_header ... always`).
    fn answered(&self, req: &Request<RequestBody>, cx: &mut Cx) {
        if self.early {
            let values = self.edits.render(Some(Seen::of(req)), cx);
            cx.stash(self.id(), Rendered(values));
        }
    }

    fn deliver(&self, resp: &mut Response<Body>, cx: &Cx) {
        if self.edits.fixed {
            self.edits.apply_fixed(resp.headers_mut());
            return;
        }
        let values = match cx.stashed::<Rendered>(self.id()) {
            Some(r) => r.0.clone(),
            None => self.edits.render(None, cx),
        };
        self.edits.apply(resp.headers_mut(), values);
    }

    fn upstream(&self) -> bool {
        false
    }

    fn fields(&self) -> usize {
        self.edits.set.len() + self.edits.add.len()
    }
}
