//! Addresses and names in settings: networks ([`Cidr`]), upstream origins ([`Upstream`]), a
//! route's host and path ([`HostPattern`], [`PathPrefix`]), and which listening sockets collide.

use std::net::SocketAddr;
use std::str::FromStr;

use http::Uri;
use serde::de::{self, Deserializer};
use serde::Deserialize;

/// Whether two listening sockets cannot both be bound (on Linux, even with SO_REUSEADDR): the
/// same port (not 0, which picks a free one) and the same address, or one of them the wildcard
/// of its family (`0.0.0.0` takes the port on every IPv4 address; `[::]`, dual-stack unless
/// `net.ipv6.bindv6only` is set, on every address). With `per-core` threads' SO_REUSEPORT the
/// second bind would even succeed, and the kernel would spread one port's connections over two
/// listeners' routes.
pub fn ports_collide(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |w: std::net::IpAddr, o: std::net::IpAddr| {
        w.is_unspecified() && (w.is_ipv6() || o.is_ipv4())
    };
    x == y || covers(x, y) || covers(y, x)
}

/// An address or network: `127.0.0.1`, `::1`, `10.0.0.0/8`, `fd00::/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies in this network (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid address `{s}` (use 127.0.0.1, ::1 or 10.0.0.0/8)");
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: std::net::IpAddr = a.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// An upstream origin: `http://host:port` or `https://host:port`, with a path prefix or none
/// (`http://b/api/`): the prefix is put before the path of every request sent to it, as
/// nginx's `proxy_pass http://b/api/;` does in `location /`: `/x?q` goes as `/api/x?q` (a
/// prefix without a trailing `/`, `http://b/api`, gives `/api/x?q` too: one `/` between).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `host:port` as sent in requests' authority.
    pub authority: http::uri::Authority,
    pub scheme: http::uri::Scheme,
    /// The path prefix, without its trailing `/` (None: no prefix, or `/`).
    pub path: Option<Box<str>>,
}

impl Upstream {
    /// The target sent upstream for a request's path and query (`/x?q`): itself without a
    /// prefix, else the prefix then the path.
    pub fn target(&self, pq: &str) -> String {
        match &self.path {
            None => pq.to_string(),
            Some(prefix) => {
                let rest = pq.strip_prefix('/').unwrap_or(pq);
                let mut t = String::with_capacity(prefix.len() + 1 + rest.len());
                t.push_str(prefix);
                t.push('/');
                t.push_str(rest);
                t
            }
        }
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)?;
        if let Some(p) = &self.path {
            write!(f, "{p}/")?;
        }
        Ok(())
    }
}

impl FromStr for Upstream {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let uri: Uri = s
            .parse()
            .map_err(|e| format!("invalid upstream URL `{s}`: {e}"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or_else(|| format!("upstream `{s}` needs a scheme (http://)"))?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err(format!(
                "upstream `{s}`: the scheme must be http:// or https://"
            ));
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("upstream `{s}` needs a host"))?;
        if uri.query().is_some() {
            return Err(format!(
                "upstream `{s}`: a path prefix, without a query (`http://b/api/`)"
            ));
        }
        let path = uri.path().trim_end_matches('/');
        let path = (!path.is_empty()).then(|| path.into());
        Ok(Upstream {
            authority,
            scheme,
            path,
        })
    }
}

impl<'de> Deserialize<'de> for Upstream {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A route's host: exact (`example.com`), wildcard (`*.example.com`), or any (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Any,
    Exact(String),
    /// Suffix including the dot: `*.example.com` → `.example.com`.
    Suffix(String),
}

impl HostPattern {
    /// Whether `host` (without a port) matches, ignoring ASCII case.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => h.eq_ignore_ascii_case(host),
            HostPattern::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

impl FromStr for HostPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if t == "*" {
            return Ok(HostPattern::Any);
        }
        let valid = |h: &str| {
            !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        };
        if let Some(rest) = t.strip_prefix("*.") {
            if valid(rest) {
                return Ok(HostPattern::Suffix(format!(".{rest}")));
            }
        } else if valid(&t) {
            return Ok(HostPattern::Exact(t));
        }
        Err(format!(
            "invalid host pattern `{s}` (use example.com, *.example.com or *)"
        ))
    }
}

impl<'de> Deserialize<'de> for HostPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A route's path prefix; always starts with `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPrefix(pub String);

impl PathPrefix {
    pub(super) fn root() -> Self {
        PathPrefix("/".into())
    }
}

impl<'de> Deserialize<'de> for PathPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !s.starts_with('/') {
            return Err(de::Error::custom(format!(
                "path prefix `{s}` must start with /"
            )));
        }
        Ok(PathPrefix(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        assert_eq!("*".parse::<HostPattern>().unwrap(), HostPattern::Any);
        assert_eq!(
            "*.Example.com".parse::<HostPattern>().unwrap(),
            HostPattern::Suffix(".example.com".into())
        );
        assert!("exa mple".parse::<HostPattern>().is_err());
    }

    #[test]
    fn upstream_takes_a_path_prefix_and_rejects_other_schemes() {
        let u: Upstream = "http://127.0.0.1:3000".parse().unwrap();
        assert_eq!((u.path.as_deref(), u.target("/x?q")), (None, "/x?q".into()));
        assert_eq!(
            "http://127.0.0.1:3000/".parse::<Upstream>().unwrap().path,
            None
        );
        for prefixed in ["http://127.0.0.1:3000/api/", "http://127.0.0.1:3000/api"] {
            let u: Upstream = prefixed.parse().unwrap();
            assert_eq!(u.target("/x?q=1"), "/api/x?q=1");
            assert_eq!(u.target("/"), "/api/");
            assert_eq!(u.to_string(), "http://127.0.0.1:3000/api/");
        }
        assert!("http://127.0.0.1:3000/x?y".parse::<Upstream>().is_err());
        assert!("https://example.com".parse::<Upstream>().is_ok());
        assert!("ftp://x".parse::<Upstream>().is_err());
    }
}
