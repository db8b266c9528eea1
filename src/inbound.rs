//! Where a request enters, before routing: what every request must satisfy whatever its handler
//! (proxy, static files, images, admin), and the one authority that routing, the cache key and
//! the Host forwarded upstream all read.
//!
//! RFC 9112 §3.2: an HTTP/1.1 request carries exactly one Host field, and a Host field that is
//! not an authority is refused (400). RFC 9112 §3.2.2: a request target in absolute form
//! (`GET http://a.example/p`) decides the authority, and a proxy replaces Host with it; the same
//! holds for HTTP/2's `:authority` (hyper makes it the URI's authority) against a `host` field
//! (RFC 9113 §8.3.1). After [`admit`], the URI's authority and the Host field, when both are
//! there, are the same text, and [`authority`] reads it.
//!
//! The common request (origin form, one Host) costs one header lookup and a scan of the Host's
//! bytes: nothing is allocated.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};

use crate::body::Body;
use crate::http::text_response;

/// A request refused where it enters: its status and a short text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    pub text: &'static str,
}

impl Refused {
    pub fn response(self) -> Response<Body> {
        text_response(self.status, self.text)
    }
}

/// Checks `req` and makes its Host field the one authority (see the module doc); refused with
/// 400, or 431 over `max_headers` fields.
pub fn admit<B>(req: &mut Request<B>, max_headers: usize) -> Result<(), Refused> {
    // HTTP/1.1's parser counts fields itself (hyper's `max_headers`); HTTP/2 has only a size
    // limit, so the count is checked here, for every version alike.
    if req.headers().len() > max_headers {
        return Err(Refused {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            text: "too many request header fields\n",
        });
    }
    normalize(req).map_err(|text| Refused {
        status: StatusCode::BAD_REQUEST,
        text,
    })
}

/// The request's authority (`host[:port]`) as routing, the cache key and the forwarded Host read
/// it: the URI's (absolute form, HTTP/2), else the Host field, else empty (HTTP/1.0).
pub fn authority<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> &'a str {
    uri.authority()
        .map(|a| a.as_str())
        .or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()))
        .unwrap_or("")
}

/// The checks and the Host replacement of [`admit`]; the error is the 400 response's text.
fn normalize<B>(req: &mut Request<B>) -> Result<(), &'static str> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host field\n");
    }
    if host.is_none() && req.version() == Version::HTTP_11 {
        return Err("an HTTP/1.1 request needs a Host field\n");
    }
    let Some(target) = req.uri().authority() else {
        return match host {
            Some(h) if !is_authority(h.as_bytes()) => Err("the Host field is not a host\n"),
            _ => Ok(()),
        };
    };
    // RFC 9110 §4.2.4: userinfo in an http(s) URI is an error.
    if target.as_str().contains('@') {
        return Err("the request target carries userinfo\n");
    }
    // Without a Host field (HTTP/2, HTTP/1.0) the URI's authority is the only one: nothing to add.
    if host.is_some_and(|h| h.as_bytes() != target.as_str().as_bytes()) {
        // An authority is made of characters a field value may hold.
        let v = HeaderValue::from_str(target.as_str()).map_err(|_| "bad request target\n")?;
        req.headers_mut().insert(header::HOST, v);
    }
    Ok(())
}

/// Whether a Host field value is made of the characters of an authority (RFC 3986 §3.2: host
/// and port; no userinfo). What matters is what it cannot hold: `/`, `?`, `#` and `@` would make
/// a cache key that collides with another host's path, and spaces or controls have no place in
/// a host. An empty value is allowed (RFC 9112 §3.2: a target without authority).
fn is_authority(v: &[u8]) -> bool {
    // One table lookup per byte: this runs on every request.
    v.iter().all(|&b| AUTHORITY_BYTE[b as usize])
}

/// The bytes an authority may hold: unreserved, sub-delims, `%` (pct-encoded), `:` and the
/// brackets of an IP literal.
static AUTHORITY_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'['
                    | b']'
            );
        b += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: Version, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::get(uri).version(version);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(()).unwrap()
    }

    fn host(r: &Request<()>) -> Vec<&str> {
        r.headers()
            .get_all(header::HOST)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn the_target_authority_replaces_host() {
        for version in [Version::HTTP_11, Version::HTTP_2] {
            let mut r = req(version, "http://victim.example/p", &["attacker.example"]);
            normalize(&mut r).unwrap();
            assert_eq!(host(&r), ["victim.example"]);
            assert_eq!(authority(r.uri(), r.headers()), "victim.example");
        }
        // HTTP/2 without a host field keeps none: the authority is the URI's.
        let mut r = req(Version::HTTP_2, "http://a.example:8080/p", &[]);
        normalize(&mut r).unwrap();
        assert!(host(&r).is_empty());
        assert_eq!(authority(r.uri(), r.headers()), "a.example:8080");
    }

    #[test]
    fn host_must_be_one_authority() {
        let bad = |version, uri, hosts: &[&str]| normalize(&mut req(version, uri, hosts)).is_err();
        assert!(bad(Version::HTTP_11, "/p", &["a.example", "b.example"]));
        assert!(bad(Version::HTTP_11, "/p", &[]));
        assert!(bad(Version::HTTP_11, "http://a.example/p", &[]));
        assert!(bad(Version::HTTP_11, "/p", &["a.example/x"]));
        assert!(bad(Version::HTTP_11, "/p", &["a.example?x"]));
        assert!(bad(Version::HTTP_11, "/p", &["u@a.example"]));
        assert!(bad(Version::HTTP_11, "/p", &["a example"]));
        assert!(bad(
            Version::HTTP_11,
            "http://u@a.example/p",
            &["a.example"]
        ));
        assert!(!bad(Version::HTTP_10, "/p", &[]));
        assert!(!bad(Version::HTTP_11, "/p", &["A.example:8080"]));
        assert!(!bad(Version::HTTP_11, "/p", &["[::1]:80"]));
        assert!(!bad(Version::HTTP_11, "/p", &[""]));
    }

    #[test]
    fn header_count_is_bounded() {
        let mut r = req(Version::HTTP_2, "http://a.example/", &[]);
        for i in 0..5 {
            r.headers_mut().insert(
                format!("x-{i}").parse::<header::HeaderName>().unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        assert!(admit(&mut r, 5).is_ok());
        assert_eq!(admit(&mut r, 4).unwrap_err().status, 431);
    }
}
