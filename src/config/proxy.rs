//! The `proxy` handler's settings (`proxy = { upstream = "..." }` on a route): its pool, inline
//! or named, its timeouts, and whose request directives it obeys.

use std::time::Duration;

use serde::Deserialize;

use super::net::{Cidr, Upstream};
use super::pool::{self, BackendConfig, HealthConfig, PoolConfig, UpstreamRef};
use super::units::{yes, Dur, HOUR_MS};

/// A caching reverse proxy to a pool of backends.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawProxy")]
pub struct ProxyConfig {
    /// The backends: inline (`upstream`), or a named `[pool.NAME]`. After parsing always
    /// `Pool`: [`Config::parse`] names each inline pool.
    pub upstream: UpstreamRef,
    /// Of an inline pool (`upstream`); a named pool sets its own.
    pub connect_timeout: Option<Dur<1, HOUR_MS>>,
    /// Time until the upstream's response head arrives, counted once the request (with its
    /// body) has been sent; while a body is being sent, the longest time without progress of
    /// it. At least 1ms.
    pub response_timeout: Dur<1>,
    /// Longest silence while reading an upstream body (between two reads, like nginx's
    /// `proxy_read_timeout`). At least 1ms.
    pub body_timeout: Dur<1>,
    /// Set false to proxy without caching.
    pub cache: bool,
    /// Whether clients' request directives that would make larder fetch more (no-cache,
    /// `Pragma: no-cache`, max-age, min-fresh) or serve staler (max-stale) are obeyed.
    pub request_cache_control: RequestCacheControl,
    /// Addresses whose request directives are obeyed even when `request_cache_control` ignores
    /// everyone else's (an office, a deploy script).
    pub request_cache_control_trusted: Vec<Cidr>,
    /// Idle pooled connections kept per backend, of an inline pool.
    pub pool_max_idle: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(default, deserialize_with = "pool::upstream_list")]
    upstream: Option<Vec<BackendConfig>>,
    pool: Option<String>,
    connect_timeout: Option<Dur<1, HOUR_MS>>,
    #[serde(default = "ProxyConfig::default_response_timeout")]
    response_timeout: Dur<1>,
    #[serde(default = "ProxyConfig::default_body_timeout")]
    body_timeout: Dur<1>,
    #[serde(default = "yes")]
    cache: bool,
    #[serde(default)]
    request_cache_control: RequestCacheControl,
    #[serde(default)]
    request_cache_control_trusted: Vec<Cidr>,
    pool_max_idle: Option<usize>,
}

impl TryFrom<RawProxy> for ProxyConfig {
    type Error = String;
    fn try_from(r: RawProxy) -> Result<Self, String> {
        let upstream = match (r.upstream, r.pool) {
            (Some(list), None) if list.is_empty() => {
                return Err("`upstream` lists no backend".into())
            }
            (Some(list), None) => UpstreamRef::Inline(list),
            (None, Some(name)) => {
                if r.connect_timeout.is_some() || r.pool_max_idle.is_some() {
                    return Err(format!(
                        "`connect_timeout` and `pool_max_idle` of a route with `pool` are set \
                         in [pool.{name}]"
                    ));
                }
                UpstreamRef::Pool(name)
            }
            (Some(_), Some(_)) => {
                return Err(
                    "needs one of `upstream` (URLs) and `pool` (a [pool.NAME]), not both".into(),
                )
            }
            (None, None) => {
                return Err("needs `upstream` (a URL or a list) or `pool` (a [pool.NAME])".into())
            }
        };
        Ok(ProxyConfig {
            upstream,
            connect_timeout: r.connect_timeout,
            response_timeout: r.response_timeout,
            body_timeout: r.body_timeout,
            cache: r.cache,
            request_cache_control: r.request_cache_control,
            request_cache_control_trusted: r.request_cache_control_trusted,
            pool_max_idle: r.pool_max_idle,
        })
    }
}

impl ProxyConfig {
    /// A route to the backends `upstreams` (an inline pool), every other setting at its
    /// default.
    pub fn new(upstream: Upstream) -> Self {
        Self::pool_of(vec![upstream])
    }

    /// A route to an inline pool of `upstreams`.
    pub fn pool_of(upstreams: Vec<Upstream>) -> Self {
        ProxyConfig {
            upstream: UpstreamRef::Inline(upstreams.into_iter().map(BackendConfig::new).collect()),
            connect_timeout: None,
            response_timeout: Self::default_response_timeout(),
            body_timeout: Self::default_body_timeout(),
            cache: true,
            request_cache_control: RequestCacheControl::default(),
            request_cache_control_trusted: Vec::new(),
            pool_max_idle: None,
        }
    }

    /// The name of the route's pool, once [`Config::parse`] named the inline ones.
    pub fn pool_name(&self) -> &str {
        match &self.upstream {
            UpstreamRef::Pool(name) => name,
            UpstreamRef::Inline(_) => "",
        }
    }

    /// The pool an inline `upstream` makes: round-robin, with a TCP health check when it has
    /// several backends (one alone has nothing to fail over to).
    pub fn inline_pool(&self, backends: &[BackendConfig]) -> PoolConfig {
        let mut pool = PoolConfig::of(backends.to_vec());
        if backends.len() > 1 {
            pool.health = Some(HealthConfig::tcp());
        }
        if let Some(t) = self.connect_timeout {
            pool.connect_timeout = t;
        }
        if let Some(n) = self.pool_max_idle {
            pool.max_idle = n;
        }
        pool
    }
    fn default_response_timeout() -> Dur<1> {
        Dur(Duration::from_secs(30))
    }
    fn default_body_timeout() -> Dur<1> {
        Dur(Duration::from_secs(60))
    }
}

/// Whose Cache-Control request directives a proxy route obeys. RFC 9111 §5.2.1: "They are
/// advisory; caches MAY implement them, but are not required to." `no-store` and
/// `only-if-cached` are obeyed from everyone either way: they never make larder fetch more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestCacheControl {
    /// Only from `request_cache_control_trusted` addresses: no client can make every request an
    /// origin fetch (Varnish's default too).
    #[default]
    Ignore,
    /// From every client.
    #[serde(alias = "honor")]
    Honour,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{err, MIN};
    use crate::config::{Config, HandlerConfig};

    #[test]
    fn proxy_body_timeout_defaults_to_60s_and_is_never_zero() {
        let c = Config::parse(MIN, "t").unwrap();
        let HandlerConfig::Proxy(p) = &c.listeners[0].routes[0].handler else {
            panic!("proxy route")
        };
        assert_eq!(p.body_timeout, Dur(Duration::from_secs(60)));
        let e = err(&MIN.replace("2\" }", "2\", body_timeout = \"0s\" }"));
        assert!(
            e.contains("line 4, key `listener.route.proxy.body_timeout`")
                && e.contains("must be 1ms to"),
            "{e}"
        );
    }

    #[test]
    fn request_cache_control_is_ignored_by_default() {
        let proxy = |text: &str| {
            let c = Config::parse(text, "t").unwrap();
            let HandlerConfig::Proxy(p) = &c.listeners[0].routes[0].handler else {
                panic!("proxy route")
            };
            p.clone()
        };
        let p = proxy(MIN);
        assert_eq!(p.request_cache_control, RequestCacheControl::Ignore);
        assert!(p.request_cache_control_trusted.is_empty());
        for (value, want) in [
            ("honour", RequestCacheControl::Honour),
            ("honor", RequestCacheControl::Honour),
            ("ignore", RequestCacheControl::Ignore),
        ] {
            let text = MIN.replace(
                "2\" }",
                &format!("2\", request_cache_control = \"{value}\" }}"),
            );
            assert_eq!(proxy(&text).request_cache_control, want);
        }
        let text = MIN.replace(
            "2\" }",
            "2\", request_cache_control_trusted = [\"10.0.0.0/8\"] }",
        );
        assert!(proxy(&text).request_cache_control_trusted[0].contains("10.1.2.3".parse().unwrap()));
        let e = err(&MIN.replace("2\" }", "2\", request_cache_control = \"always\" }"));
        assert!(e.contains("line 4") && e.contains("honour"), "{e}");
    }
}
