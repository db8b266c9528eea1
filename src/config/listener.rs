//! The `[[listener]]` tables: a listening socket, its routes, and the handler of each route.

use std::net::SocketAddr;

use serde::Deserialize;

use super::images::ImagesConfig;
use super::net::{HostPattern, PathPrefix};
use super::proxy::ProxyConfig;
use super::push::PushConfig;
use super::respond::RespondConfig;
use super::rules::RuleConfig;
use super::static_files::StaticConfig;
use super::tls::{HstsConfig, RedirectConfig, TlsConfig};

/// One listening socket and the routes it serves.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    /// HTTPS on this listener: its certificates (see [`TlsConfig`]).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
}

/// A route: which requests (host, path prefix) go to which handler.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRoute")]
pub struct RouteConfig {
    pub host: Option<HostPattern>,
    pub path: PathPrefix,
    pub handler: HandlerConfig,
    /// `Strict-Transport-Security` for the route's responses (TLS listeners only).
    pub hsts: Option<HstsConfig>,
    /// The route's own rules (`[[listener.route.rule]]`), in order (docs/rules.md).
    pub rules: Vec<RuleConfig>,
}

/// What serves the requests of a route.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerConfig {
    Proxy(ProxyConfig),
    Static(StaticConfig),
    Respond(RespondConfig),
    Images(ImagesConfig),
    /// Live JSON records, written over HTTP, pushed to subscribers (SSE, WebSocket).
    Push(Box<PushConfig>),
    /// A permanent redirect (308) of every request to the same URL over HTTPS.
    RedirectHttps(RedirectConfig),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    host: Option<HostPattern>,
    #[serde(default = "PathPrefix::root")]
    path: PathPrefix,
    proxy: Option<ProxyConfig>,
    #[serde(rename = "static")]
    static_files: Option<StaticConfig>,
    respond: Option<RespondConfig>,
    images: Option<ImagesConfig>,
    push: Option<PushConfig>,
    redirect_https: Option<RedirectConfig>,
    hsts: Option<HstsConfig>,
    #[serde(default, rename = "rule")]
    rules: Vec<RuleConfig>,
}

impl TryFrom<RawRoute> for RouteConfig {
    type Error = String;
    fn try_from(r: RawRoute) -> Result<Self, String> {
        let mut handlers = Vec::new();
        if let Some(p) = r.proxy {
            handlers.push(HandlerConfig::Proxy(p));
        }
        if let Some(s) = r.static_files {
            handlers.push(HandlerConfig::Static(s));
        }
        if let Some(s) = r.respond {
            handlers.push(HandlerConfig::Respond(s));
        }
        if let Some(i) = r.images {
            handlers.push(HandlerConfig::Images(i));
        }
        if let Some(p) = r.push {
            handlers.push(HandlerConfig::Push(Box::new(p)));
        }
        if let Some(to) = r.redirect_https {
            handlers.push(HandlerConfig::RedirectHttps(to));
        }
        if handlers.len() != 1 {
            return Err(format!(
                "route `{}` needs exactly one handler (proxy, static, respond, images, push or redirect_https), found {}",
                r.path.0,
                handlers.len()
            ));
        }
        Ok(RouteConfig {
            host: r.host,
            path: r.path,
            handler: handlers.pop().expect("one handler"),
            hsts: r.hsts,
            rules: r.rules,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::err;

    #[test]
    fn route_needs_one_handler() {
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\n");
        assert!(e.contains("exactly one handler"), "{e}");
    }
}
