//! Active health checks of a pool: every `interval`, each backend is checked (a TCP connect,
//! or an HTTP GET whose status must pass) within `timeout`, all at once; `fall` failures in a
//! row take a backend out, `rise` passes in a row bring it back. The task ends with its pool.

use std::sync::atomic::Ordering;
use std::sync::Weak;

use http::{header, Request};
use tokio::time::{timeout, MissedTickBehavior};

use super::{Backend, Pool};
use crate::body::Body;
use crate::config::{HealthCheck, HealthConfig};

/// Checks `pool`'s backends until the pool is dropped.
pub(super) async fn run(pool: Weak<Pool>, cfg: HealthConfig) {
    let mut tick = tokio::time::interval(cfg.interval.0);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let checks = (pool.backends.iter()).map(|b| check(&pool, b, &cfg));
        let results = futures_util::future::join_all(checks).await;
        for (b, result) in pool.backends.iter().zip(results) {
            record(&pool, b, result, &cfg);
        }
    }
}

/// One check of `b`: Ok, or why it failed.
async fn check(pool: &Pool, b: &Backend, cfg: &HealthConfig) -> Result<(), String> {
    let https = b.url.scheme == http::uri::Scheme::HTTPS;
    match cfg.check {
        HealthCheck::Tcp => {
            let port = (b.url.authority.port_u16()).unwrap_or(if https { 443 } else { 80 });
            let addr = (b.url.authority.host(), port);
            match timeout(cfg.timeout.0, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("connect: {e}")),
                Err(_) => Err(format!("no connection within {:?}", cfg.timeout.0)),
            }
        }
        HealthCheck::Http => {
            let uri = format!("{}://{}{}", b.url.scheme, b.url.authority, cfg.path);
            let host = cfg
                .host
                .clone()
                .unwrap_or_else(|| b.url.authority.to_string());
            let req = Request::get(uri)
                .header(header::HOST, host)
                .header(header::USER_AGENT, "larder-health-check")
                .body(Body::empty())
                .map_err(|e| format!("bad check request: {e}"))?;
            match timeout(cfg.timeout.0, pool.client.request(req)).await {
                Ok(Ok(resp)) if cfg.passes(resp.status().as_u16()) => Ok(()),
                Ok(Ok(resp)) => Err(format!("{} answered {}", cfg.path, resp.status())),
                Ok(Err(e)) => Err(format!("{}: {e}", cfg.path)),
                Err(_) => Err(format!("no answer within {:?}", cfg.timeout.0)),
            }
        }
    }
}

/// Counts a check's result; `fall` failures in a row take the backend out, `rise` passes
/// bring it back.
fn record(pool: &Pool, b: &Backend, result: Result<(), String>, cfg: &HealthConfig) {
    let h = &b.health;
    let prev = h.streak.load(Ordering::Relaxed);
    let streak = match result {
        Ok(()) => prev.max(0).saturating_add(1),
        Err(_) => prev.min(0).saturating_sub(1),
    };
    h.streak.store(streak, Ordering::Relaxed);
    let down = h.down.load(Ordering::Relaxed);
    match result {
        Ok(()) if down && i64::from(streak) >= cfg.rise.get() => {
            h.down.store(false, Ordering::Relaxed);
            // Back in service: a passive ejection from before is over too.
            h.fails.store(0, Ordering::Relaxed);
            tracing::info!(pool = %pool.name, backend = %b.url.authority, "health check passes: backend up");
        }
        Err(why) if !down && -i64::from(streak) >= cfg.fall.get() => {
            h.down.store(true, Ordering::Relaxed);
            tracing::warn!(pool = %pool.name, backend = %b.url.authority, reason = %why,
                "health check fails: backend down");
        }
        _ => {}
    }
}
