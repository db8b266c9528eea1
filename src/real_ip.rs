//! The client's real address behind trusted proxies (`[listener.real_ip]`), per request: as
//! nginx's `set_real_ip_from` + `real_ip_header` with `real_ip_recursive on`.
//!
//! Only when the immediate peer (the socket's, or a PROXY header's source, see
//! `server::proxy_protocol`) lies in `from` is the field read: its addresses right to left,
//! the trusted ones skipped; the first one not trusted is the client. A malformed entry (or
//! `unknown`, an obfuscated RFC 7239 node, the [`MAX_HOPS`]th entry) ends the walk at the last
//! good address; a missing field keeps the peer. The address found is the `peer` the router
//! dispatches with, so every address-based rule, the access log, metrics and rate limits see it.
//!
//! What the origin is told (X-Forwarded-For, see [`crate::http::fields::add_forwarding`]): from a
//! trusted peer, the chain received with the peer's own address appended (marked on the request
//! by [`Hop`]); when the field read is Forwarded or X-Real-IP, the client found and the peer
//! (the X-Forwarded-For that came through is not what the proxy vouches for); from a peer not
//! trusted, only the peer's address: the chain it sent is its own claim, and is dropped (the
//! field configured too).

use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::Request;

use crate::config::{Cidr, RealIpConfig, RealIpHeader};
pub use crate::http::fields::Hop;

/// Addresses of a field read at most, right to left: no real chain of proxies is that long, and
/// a client's long list costs no more than this many checks.
pub const MAX_HOPS: usize = 64;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// A listener's trusted proxies and the field they set.
#[derive(Debug)]
pub struct RealIp {
    from: Vec<Cidr>,
    kind: RealIpHeader,
    name: HeaderName,
}

impl RealIp {
    pub fn new(cfg: &RealIpConfig) -> RealIp {
        let name = match cfg.header {
            RealIpHeader::XForwardedFor => X_FORWARDED_FOR,
            RealIpHeader::Forwarded => http::header::FORWARDED,
            RealIpHeader::XRealIp => HeaderName::from_static("x-real-ip"),
        };
        RealIp {
            from: cfg.from.clone(),
            kind: cfg.header,
            name,
        }
    }

    /// Whether `ip` is a trusted proxy.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.from.iter().any(|c| c.contains(ip))
    }

    /// The client of `req`, which came from `peer`. From a trusted peer the request is marked
    /// with the peer's address ([`Hop`], appended to X-Forwarded-For upstream) when the client
    /// is another, and when the field read is not X-Forwarded-For, the X-Forwarded-For that came
    /// is replaced by the client found; from a peer not trusted its X-Forwarded-For (and the
    /// field configured) is removed.
    pub fn client<B>(&self, req: &mut Request<B>, peer: SocketAddr) -> SocketAddr {
        if !self.trusts(peer.ip()) {
            // Its own claims: not passed on for an origin to believe.
            let h = req.headers_mut();
            h.remove(X_FORWARDED_FOR);
            if self.kind != RealIpHeader::XForwardedFor {
                h.remove(&self.name);
            }
            return peer;
        }
        let client = match self.walk(req.headers()) {
            Some(client) if client.ip() != peer.ip() => {
                req.extensions_mut().insert(Hop(peer.ip()));
                client
            }
            _ => peer,
        };
        if self.kind != RealIpHeader::XForwardedFor {
            // The proxy vouches for another field: the X-Forwarded-For that came through it is
            // not its word, and is replaced by the client it names (the peer is appended
            // upstream).
            let h = req.headers_mut();
            h.remove(X_FORWARDED_FOR);
            if client != peer {
                if let Ok(v) = HeaderValue::from_str(&client.ip().to_string()) {
                    h.insert(X_FORWARDED_FOR, v);
                }
            }
        }
        client
    }

    /// The client named by the field in `headers` (None: no field, or no good address in it).
    fn walk(&self, headers: &HeaderMap) -> Option<SocketAddr> {
        let mut last = None;
        let mut seen = 0;
        // Several field lines are one list, in order (RFC 9110 §5.3).
        for value in headers.get_all(&self.name).iter().rev() {
            let Ok(text) = value.to_str() else {
                return last;
            };
            for entry in text.rsplit(',') {
                seen += 1;
                let found = match self.kind {
                    RealIpHeader::Forwarded => forwarded_for(entry),
                    RealIpHeader::XForwardedFor | RealIpHeader::XRealIp => address(entry),
                };
                let Some(a) = found else {
                    return last;
                };
                last = Some(a);
                if !self.trusts(a.ip()) || seen >= MAX_HOPS {
                    return last;
                }
            }
        }
        last
    }
}

/// An address as proxies write it: `192.0.2.1`, `2001:db8::1`, with a port `192.0.2.1:4711` or
/// `[2001:db8::1]:4711`, or bracketed `[2001:db8::1]`. The port is 0 when none is given.
fn address(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, 0));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    inner
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(|ip| SocketAddr::new(ip.into(), 0))
}

/// The `for=` node of one RFC 7239 element (`for=192.0.2.60;proto=http;by=203.0.113.43`),
/// quoted or not; None when it has none or it is not an address (`unknown`, `_hidden`).
fn forwarded_for(element: &str) -> Option<SocketAddr> {
    let node = element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
    })?;
    let node = match node.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => node,
    };
    address(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real_ip(from: &[&str], header: RealIpHeader) -> RealIp {
        RealIp::new(&RealIpConfig {
            from: from.iter().map(|c| c.parse().unwrap()).collect(),
            header,
        })
    }

    /// The client `r` finds for a request from `peer` with `fields` (name, value), and the
    /// request as it is then.
    fn client(r: &RealIp, peer: &str, fields: &[(&str, &str)]) -> (SocketAddr, Request<()>) {
        let mut req = Request::new(());
        for (k, v) in fields {
            let name = HeaderName::from_bytes(k.as_bytes()).unwrap();
            req.headers_mut()
                .append(name, HeaderValue::from_str(v).unwrap());
        }
        let c = r.client(&mut req, peer.parse().unwrap());
        (c, req)
    }

    const TRUSTED: &[&str] = &["10.0.0.0/8", "127.0.0.1/32"];

    #[test]
    fn the_walk_skips_trusted_proxies_right_to_left() {
        let r = real_ip(TRUSTED, RealIpHeader::XForwardedFor);
        let xff = [("x-forwarded-for", "198.51.100.9, 10.1.2.3")];
        let (c, req) = client(&r, "127.0.0.1:5000", &xff);
        assert_eq!(c, "198.51.100.9:0".parse().unwrap());
        // The proxy that connected is what larder appends upstream.
        assert_eq!(
            req.extensions().get::<Hop>(),
            Some(&Hop("127.0.0.1".parse().unwrap()))
        );
        assert_eq!(req.headers()["x-forwarded-for"], "198.51.100.9, 10.1.2.3");
        // Left of the first untrusted address nothing counts: a client's forged entries.
        let (c, _) = client(
            &r,
            "127.0.0.1:5000",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.9, 10.1.2.3")],
        );
        assert_eq!(c.ip(), "198.51.100.9".parse::<IpAddr>().unwrap());
        // Several field lines are one list.
        let (c, _) = client(
            &r,
            "10.9.9.9:1",
            &[
                ("x-forwarded-for", "203.0.113.5"),
                ("x-forwarded-for", "10.1.1.1, 10.2.2.2"),
            ],
        );
        assert_eq!(c.ip(), "203.0.113.5".parse::<IpAddr>().unwrap());
        // Every address trusted: the leftmost one is the client (nginx's choice).
        let (c, _) = client(
            &r,
            "127.0.0.1:1",
            &[("x-forwarded-for", "10.1.1.1, 10.2.2.2")],
        );
        assert_eq!(c.ip(), "10.1.1.1".parse::<IpAddr>().unwrap());
        // Ports and IPv6, with and without brackets.
        let (c, _) = client(
            &r,
            "127.0.0.1:1",
            &[("x-forwarded-for", "[2001:db8::1]:4711")],
        );
        assert_eq!(c, "[2001:db8::1]:4711".parse().unwrap());
        let (c, _) = client(&r, "127.0.0.1:1", &[("x-forwarded-for", " 2001:db8::2 ")]);
        assert_eq!(c.ip(), "2001:db8::2".parse::<IpAddr>().unwrap());
        let (c, _) = client(&r, "127.0.0.1:1", &[("x-forwarded-for", "192.0.2.1:80")]);
        assert_eq!(c, "192.0.2.1:80".parse().unwrap());
    }

    #[test]
    fn a_malformed_entry_stops_the_walk_at_the_last_good_address() {
        let r = real_ip(TRUSTED, RealIpHeader::XForwardedFor);
        for (xff, want) in [
            ("198.51.100.9, garbage, 10.1.2.3", "10.1.2.3"),
            ("198.51.100.9, , 10.1.2.3", "10.1.2.3"),
            ("198.51.100.9, unknown", "127.0.0.1"),
            ("", "127.0.0.1"),
            ("999.1.1.1", "127.0.0.1"),
        ] {
            let (c, _) = client(&r, "127.0.0.1:5000", &[("x-forwarded-for", xff)]);
            assert_eq!(c.ip(), want.parse::<IpAddr>().unwrap(), "{xff:?}");
        }
        // A field of bytes that are not text is no address either.
        let mut req = Request::new(());
        req.headers_mut().insert(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"198.51.100.9\xff").unwrap(),
        );
        assert_eq!(r.client(&mut req, "127.0.0.1:1".parse().unwrap()).port(), 1);
    }

    #[test]
    fn the_walk_is_bounded() {
        let r = real_ip(TRUSTED, RealIpHeader::XForwardedFor);
        let long = format!("198.51.100.9, {}", vec!["10.0.0.1"; 200].join(", "));
        let (c, _) = client(&r, "127.0.0.1:1", &[("x-forwarded-for", &long)]);
        assert_eq!(c.ip(), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_peer_not_trusted_is_the_client_and_its_chain_is_dropped() {
        let r = real_ip(TRUSTED, RealIpHeader::XForwardedFor);
        let xff = [("x-forwarded-for", "198.51.100.9, 10.1.2.3")];
        let (c, req) = client(&r, "192.0.2.50:5000", &xff);
        assert_eq!(c, "192.0.2.50:5000".parse().unwrap());
        assert!(req.headers().get("x-forwarded-for").is_none());
        assert!(req.extensions().get::<Hop>().is_none());
        // A trusted peer without the field is the client too, the request untouched.
        let (c, req) = client(&r, "10.0.0.5:5000", &[]);
        assert_eq!(c, "10.0.0.5:5000".parse().unwrap());
        assert!(req.extensions().get::<Hop>().is_none());
        // IPv4-mapped IPv6 peers count as IPv4.
        let (c, _) = client(&r, "[::ffff:127.0.0.1]:1", &xff);
        assert_eq!(c.ip(), "198.51.100.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn forwarded_for_nodes_are_read() {
        let r = real_ip(TRUSTED, RealIpHeader::Forwarded);
        let (c, _) = client(
            &r,
            "127.0.0.1:1",
            &[(
                "forwarded",
                "for=\"[2001:db8::1]:4711\";proto=https, for=10.1.2.3",
            )],
        );
        assert_eq!(c, "[2001:db8::1]:4711".parse().unwrap());
        let (c, _) = client(
            &r,
            "127.0.0.1:1",
            &[("forwarded", "proto=http;For=192.0.2.60;by=203.0.113.43")],
        );
        assert_eq!(c.ip(), "192.0.2.60".parse::<IpAddr>().unwrap());
        let (c, _) = client(
            &r,
            "127.0.0.1:1",
            &[("forwarded", "for=\"192.0.2.43:47011\"")],
        );
        assert_eq!(c, "192.0.2.43:47011".parse().unwrap());
        // Obfuscated or unknown nodes, and elements without `for`, end the walk.
        for f in [
            "for=_hidden, for=10.1.2.3",
            "for=unknown, for=10.1.2.3",
            "proto=http, for=10.1.2.3",
        ] {
            let (c, _) = client(&r, "127.0.0.1:1", &[("forwarded", f)]);
            assert_eq!(c.ip(), "10.1.2.3".parse::<IpAddr>().unwrap(), "{f}");
        }
        // Not the field configured: X-Forwarded-For is not read, nor passed on.
        let (c, req) = client(&r, "127.0.0.1:1", &[("x-forwarded-for", "198.51.100.9")]);
        assert_eq!(c.port(), 1);
        assert!(req.headers().get("x-forwarded-for").is_none());
        // With a client found, the X-Forwarded-For upstream starts from it.
        let (_, req) = client(
            &r,
            "127.0.0.1:1",
            &[
                ("x-forwarded-for", "6.6.6.6"),
                ("forwarded", "for=192.0.2.60"),
            ],
        );
        assert_eq!(req.headers()["x-forwarded-for"], "192.0.2.60");
        assert_eq!(
            req.extensions().get::<Hop>(),
            Some(&Hop("127.0.0.1".parse().unwrap()))
        );
    }

    #[test]
    fn x_real_ip_is_read() {
        let r = real_ip(TRUSTED, RealIpHeader::XRealIp);
        let (c, req) = client(&r, "10.0.0.1:1", &[("x-real-ip", "198.51.100.9")]);
        assert_eq!(c.ip(), "198.51.100.9".parse::<IpAddr>().unwrap());
        assert_eq!(req.headers()["x-real-ip"], "198.51.100.9");
        // From a peer not trusted, the field is its own claim: dropped with X-Forwarded-For.
        let fields = [
            ("x-real-ip", "198.51.100.9"),
            ("x-forwarded-for", "6.6.6.6"),
        ];
        let (c, req) = client(&r, "192.0.2.1:1", &fields);
        assert_eq!(c, "192.0.2.1:1".parse().unwrap());
        assert!(req.headers().is_empty());
    }
}
