//! Request body size per route (nginx's `client_max_body_size`): `max_body = "1MiB"`. At ①, a
//! request whose `Content-Length` is larger is answered 413 before its body is read; a body
//! without a length (chunked, HTTP/2 or HTTP/3 without the field) is wrapped in http-body-util's
//! `Limited`, which fails past the limit as it streams: the proxy answers that failure 413
//! (`FetchError::RequestTooLarge`), not 502.

use http::header::CONTENT_LENGTH;
use http::{Request, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;

use crate::body::RequestBody;
use crate::http::text_response;
use crate::phases::{Cx, Step, Verdict};

/// `max_body = "..."`.
pub struct MaxBody(pub u64);

impl Step for MaxBody {
    fn request(&self, req: &mut Request<RequestBody>, _cx: &mut Cx) -> Verdict {
        if req.body().is_end_stream() {
            return Verdict::Next;
        }
        let length = (req.headers().get(CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match length {
            Some(n) if n > self.0 => Verdict::Answer(text_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large\n",
            )),
            // hyper holds the body to its length.
            Some(_) => Verdict::Next,
            None => {
                let empty = http_body_util::Empty::new().map_err(Into::into).boxed();
                let body = std::mem::replace(req.body_mut(), RequestBody::Stream(empty));
                let limit = usize::try_from(self.0).unwrap_or(usize::MAX);
                *req.body_mut() =
                    RequestBody::Stream(http_body_util::Limited::new(body, limit).boxed());
                Verdict::Next
            }
        }
    }
}
