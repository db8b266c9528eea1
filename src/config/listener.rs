//! The `[[listener]]` tables: a listening socket, its routes, and the handler of each route; how
//! the client's real address is found on it (`proxy_protocol`, `[listener.real_ip]`).

use std::net::SocketAddr;

use serde::Deserialize;

use super::images::ImagesConfig;
use super::net::{Cidr, HostPattern, PathPrefix};
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
    /// Every connection begins with a PROXY protocol header (v1 or v2), whose source address is
    /// the connection's client.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// The client's address taken from a field that trusted proxies set (see [`RealIpConfig`]).
    #[serde(default)]
    pub real_ip: Option<RealIpConfig>,
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
}

/// `[listener.real_ip]`: as nginx's `set_real_ip_from` + `real_ip_header` with
/// `real_ip_recursive on`. Only when the immediate peer (the socket's, or the PROXY header's
/// source) lies in `from` is `header` read: its addresses right to left, the trusted ones
/// skipped, the first one not trusted is the client.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRealIp")]
pub struct RealIpConfig {
    /// The trusted proxies (never empty).
    pub from: Vec<Cidr>,
    pub header: RealIpHeader,
}

/// The field the client's address is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum RealIpHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    #[serde(rename = "forwarded")]
    Forwarded,
    /// `X-Real-IP: client`.
    #[serde(rename = "x-real-ip")]
    XRealIp,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRealIp {
    from: Vec<Cidr>,
    #[serde(default = "default_real_ip_header")]
    header: RealIpHeader,
}

fn default_real_ip_header() -> RealIpHeader {
    RealIpHeader::XForwardedFor
}

impl TryFrom<RawRealIp> for RealIpConfig {
    type Error = String;
    fn try_from(r: RawRealIp) -> Result<Self, String> {
        if r.from.is_empty() {
            return Err(
                "`from` lists no trusted proxy (a field nobody is trusted to set is never read)"
                    .into(),
            );
        }
        if r.from.len() > MAX_TRUSTED {
            return Err(format!(
                "`from` lists {} networks, at most {MAX_TRUSTED}",
                r.from.len()
            ));
        }
        Ok(RealIpConfig {
            from: r.from,
            header: r.header,
        })
    }
}

/// Trusted networks at most in `real_ip.from` (each address of a field is checked against
/// every one).
pub const MAX_TRUSTED: usize = 1024;

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

/// What serves the requests of a route. Built once per route at load: the image route's
/// settings (the largest variant since the image proxy's keys) are not worth a box.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum HandlerConfig {
    Proxy(ProxyConfig),
    Static(StaticConfig),
    Respond(RespondConfig),
    /// Boxed: its settings (grammars, keys, sources) are several times any other handler's.
    Images(Box<ImagesConfig>),
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
            handlers.push(HandlerConfig::Images(Box::new(i)));
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
    fn real_ip_needs_a_trusted_proxy_and_a_known_field() {
        let base = "[[listener]]\naddr = \"127.0.0.1:1\"\n[listener.real_ip]\n";
        let route = "[[listener.route]]\nrespond = { body = \"x\" }\n";
        let e = err(&format!("{base}from = []\n{route}"));
        assert!(e.contains("no trusted proxy") && e.contains("line"), "{e}");
        let e = err(&format!(
            "{base}from = [\"10.0.0.0/8\"]\nheader = \"via\"\n{route}"
        ));
        assert!(e.contains("x-forwarded-for") && e.contains("line 5"), "{e}");
        let e = err(&format!("{base}from = [\"10.0.0.0/33\"]\n{route}"));
        assert!(e.contains("10.0.0.0/33") && e.contains("line 4"), "{e}");
    }

    #[test]
    fn route_needs_one_handler() {
        let e = err("[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\npath = \"/\"\n");
        assert!(e.contains("exactly one handler"), "{e}");
    }
}
