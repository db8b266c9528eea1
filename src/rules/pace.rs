//! Bytes per second per response (nginx's `limit_rate` and `limit_rate_after`): `limit_rate =
//! { rate = "100KiB/s", after = "1MiB" }`. At ④ the response's body is wrapped in [`Paced`],
//! which lets the first `after` bytes go at once and then as many as `rate` allows since the
//! body began (nginx's sum: `after + rate × elapsed − sent`), splitting frames and sleeping on
//! tokio's timer for the rest.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::body::{Body, BoxError};
use crate::config::rules_limits::LimitRateConfig;
use crate::phases::{Cx, Step};

/// `limit_rate = { ... }`.
pub struct LimitRate {
    rate: u64,
    after: u64,
}

impl LimitRate {
    pub fn new(cfg: &LimitRateConfig) -> LimitRate {
        LimitRate {
            rate: cfg.rate.0.max(1),
            after: cfg.after.map_or(0, |a| a.0),
        }
    }
}

impl Step for LimitRate {
    fn deliver(&self, resp: &mut Response<Body>, _cx: &Cx) {
        let body = std::mem::replace(resp.body_mut(), Body::empty());
        let outcome = body.outcome();
        let mut paced = Body::stream(Paced::new(body, self.rate, self.after));
        *paced.outcome_mut() = outcome;
        *resp.body_mut() = paced;
    }
}

/// A body sent at most at `rate` bytes a second after its first `after` bytes.
pub struct Paced {
    body: Body,
    rate: u64,
    after: u64,
    /// When the first frame was asked for.
    start: Option<Instant>,
    sent: u64,
    /// What the body gave and is not yet sent.
    pending: Bytes,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Paced {
    pub fn new(body: Body, rate: u64, after: u64) -> Paced {
        Paced {
            body,
            rate,
            after,
            start: None,
            sent: 0,
            pending: Bytes::new(),
            sleep: None,
        }
    }

    /// The largest piece sent at once: a tenth of a second's worth (at least 1 KiB).
    fn slice(&self) -> u64 {
        (self.rate / 10).max(1024)
    }

    /// Bytes that may go now.
    fn budget(&self, now: Instant) -> u64 {
        let start = self.start.unwrap_or(now);
        let elapsed = now.saturating_duration_since(start).as_nanos();
        let earned = (elapsed * u128::from(self.rate) / 1_000_000_000) as u64;
        (self.after.saturating_add(earned)).saturating_sub(self.sent)
    }

    /// When `want` bytes may go.
    fn when(&self, want: u64) -> Instant {
        let start = self.start.unwrap_or_else(Instant::now);
        let need = (self.sent + want).saturating_sub(self.after);
        let nanos = u128::from(need) * 1_000_000_000 / u128::from(self.rate);
        start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

impl http_body::Body for Paced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let me = &mut *self;
        if me.start.is_none() {
            me.start = Some(Instant::now());
        }
        loop {
            if me.pending.is_empty() {
                match Pin::new(&mut me.body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => me.pending = data,
                        Err(other) => return Poll::Ready(Some(Ok(other))),
                    },
                    other => return other,
                }
                if me.pending.is_empty() {
                    continue;
                }
            }
            if let Some(sleep) = &mut me.sleep {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                me.sleep = None;
            }
            let want = (me.pending.len() as u64).min(me.slice());
            let budget = me.budget(Instant::now());
            if budget >= want {
                me.sent += want;
                return Poll::Ready(Some(Ok(Frame::data(me.pending.split_to(want as usize)))));
            }
            let at = me.when(want);
            me.sleep = Some(Box::pin(tokio::time::sleep_until(at)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.body.size_hint();
        let p = self.pending.len() as u64;
        let mut h = SizeHint::new();
        h.set_lower(inner.lower() + p);
        if let Some(u) = inner.upper() {
            h.set_upper(u + p);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// 12 KiB at 16 KiB/s after 4 KiB: the last 8 KiB take half a second (tokio's timer never
    /// wakes early, so the bound below holds on any machine), and the body arrives whole.
    #[tokio::test]
    async fn paces_after_the_first_bytes() {
        let data: Vec<u8> = (0..12 * 1024).map(|i| (i % 251) as u8).collect();
        let start = Instant::now();
        let mut paced = Paced::new(Body::full(data.clone()), 16 * 1024, 4 * 1024);
        assert_eq!(http_body::Body::size_hint(&paced).exact(), Some(12 * 1024));
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(frame) = paced.frame().await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
            frames += 1;
        }
        assert_eq!(got, data);
        assert!(frames >= 8, "in slices of a tenth of a second: {frames}");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(495), "{took:?}");
    }
}
