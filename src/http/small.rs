//! Short fixed responses built per request: plain-text errors and refusals, small JSON replies
//! (the admin API, the image server), never stored (`Cache-Control: no-store`); embedded HTML
//! pages.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::Body;

/// A short plain-text response (errors, refusals).
pub fn text_response(status: StatusCode, text: &str) -> Response<Body> {
    small(
        status,
        text.to_string(),
        HeaderValue::from_static("text/plain; charset=utf-8"),
    )
}

/// A JSON response; its body is small and built by the caller.
pub fn json_response(status: StatusCode, body: String) -> Response<Body> {
    small(status, body, HeaderValue::from_static("application/json"))
}

/// An embedded HTML page (the admin dashboard, push's demo page) under its Content Security
/// Policy; revalidated on every load (`no-cache`), so a new larder serves its new page.
pub fn page_response(html: &'static str, csp: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::full(html));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn small(status: StatusCode, body: String, content_type: HeaderValue) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_responses_are_typed_and_never_stored() {
        let t = text_response(StatusCode::NOT_FOUND, "not found\n");
        assert_eq!(t.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            t.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert_eq!(t.headers()[header::CACHE_CONTROL], "no-store");
        let j = json_response(StatusCode::OK, "{}".into());
        assert_eq!(j.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(j.headers()[header::CACHE_CONTROL], "no-store");
    }
}
