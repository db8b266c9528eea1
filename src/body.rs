//! The body types of the handlers: the response body every handler returns ([`Body`]), and the
//! request body every handler reads ([`RequestBody`]: hyper's for HTTP/1.1 and HTTP/2, a stream
//! of frames for HTTP/3).
//!
//! A cache hit is the common case, so the body keeps it unboxed: `Full` holds one shared `Bytes`
//! (a refcount bump of the stored body, never a copy; an empty one is no body at all). Anything
//! streamed (a proxied response not being stored, a large file) goes through the boxed `Stream`
//! variant.
//!
//! A response body also carries its response's [`Outcome`] (cache result, stored coding and
//! bytes saved, why it was not stored): set by the handler that builds the response, read by the
//! server when the response completes, for the metrics and the access log. With it the body is
//! 40 bytes, as the bare enum of an empty, a full and a streamed body was: the two variants fit
//! in 32 (the streamed one beside the shared buffer's non-null pointer) and the outcome is one
//! `u64` (a test pins both).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;

use crate::metrics::Outcome;

/// Error type carried by streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response (or upstream request) body, and what its handler noted of the response.
pub struct Body {
    kind: Kind,
    outcome: Outcome,
}

enum Kind {
    /// One chunk of shared bytes, sent once (then empty); empty: no body at all (HEAD, 304,
    /// 204). No separate empty variant or `Option`: either would need a tag word.
    Full(Bytes),
    /// Anything else, streamed.
    Stream(BoxBody<Bytes, BoxError>),
}

impl Body {
    #[inline]
    fn of(kind: Kind) -> Self {
        Body {
            kind,
            outcome: Outcome::default(),
        }
    }

    /// An empty body.
    #[inline]
    pub fn empty() -> Self {
        Body::of(Kind::Full(Bytes::new()))
    }

    /// A body of one shared buffer (an empty one: no body).
    #[inline]
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Body::of(Kind::Full(bytes.into()))
    }

    /// A streamed body from any `http_body::Body`.
    pub fn stream<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        Body::of(Kind::Stream(body.map_err(Into::into).boxed()))
    }

    /// What the handler noted of the response this body belongs to.
    #[inline]
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Notes of the response this body belongs to (the handler building it).
    #[inline]
    pub fn outcome_mut(&mut self) -> &mut Outcome {
        &mut self.outcome
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Full(b) if b.is_empty() => Poll::Ready(None),
            Kind::Full(b) => Poll::Ready(Some(Ok(Frame::data(std::mem::take(b))))),
            Kind::Stream(s) => Pin::new(s).poll_frame(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_empty(),
            Kind::Stream(s) => s.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.len() as u64),
            Kind::Stream(s) => s.size_hint(),
        }
    }
}

/// A request's body as handlers read it.
pub enum RequestBody {
    /// From hyper (HTTP/1.1, HTTP/2): unboxed, the common case.
    Hyper(hyper::body::Incoming),
    /// From another transport (HTTP/3).
    Stream(BoxBody<Bytes, BoxError>),
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            RequestBody::Stream(s) => Pin::new(s).poll_frame(cx),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Hyper(b) => b.is_end_stream(),
            RequestBody::Stream(s) => s.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Hyper(b) => b.size_hint(),
            RequestBody::Stream(s) => s.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_yields_once_with_exact_hint() {
        let b = Body::full(Bytes::from_static(b"hello"));
        assert_eq!(http_body::Body::size_hint(&b).exact(), Some(5));
        let collected = b.collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"hello");
    }

    #[tokio::test]
    async fn empty_full_is_empty() {
        let b = Body::full(Bytes::new());
        assert!(http_body::Body::is_end_stream(&b));
        let mut sent = Body::full("x");
        let frame = sent.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "x");
        assert!(http_body::Body::is_end_stream(&sent), "sent once");
        assert!(sent.frame().await.is_none());
    }

    /// Every response moves its body through the serving future: carrying the outcome does not
    /// make it bigger than the bare enum was (40 bytes: a tag word beside a `Bytes`).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn the_outcome_rides_in_the_space_of_the_old_tag() {
        assert_eq!(std::mem::size_of::<Kind>(), 32);
        assert_eq!(std::mem::size_of::<Body>(), 40);
    }
}
