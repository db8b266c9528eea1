//! The fields a proxy removes or adds on the way through (RFC 9110 §7.6): hop-by-hop fields,
//! Via, and the X-Forwarded-* fields telling the origin about the client (and [`Hop`], the
//! proxy that connected to larder when the client's address came from its field).

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop fields (RFC 9110 §7.6.1), plus the legacy ones proxies also drop.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Removes hop-by-hop fields and every field the Connection header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages have none: one pass over the names (standard names compare as tags) costs
    // less than a hashed removal of each of the eight.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    for name in connection_listed(headers) {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The fields the Connection header names (hop-by-hop too, RFC 9110 §7.6.1); no allocation
/// when there are none.
fn connection_listed(h: &HeaderMap) -> Vec<HeaderName> {
    (h.get_all(header::CONNECTION).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// A copy of `src` without its hop-by-hop fields (those [`strip_hop_by_hop`] removes), in a map
/// with room for `room` more fields.
///
/// Built field by field rather than cloned: a clone's list of fields is exactly as long as it
/// is full, so the first field added to it reallocates the list (and the connection that sends
/// the map reuses it for the response's head, which then reallocates too).
pub fn end_to_end_copy(src: &HeaderMap, room: usize) -> HeaderMap {
    let listed = connection_listed(src);
    let mut h = HeaderMap::with_capacity(src.len() + room);
    for (name, value) in src {
        if !HOP_BY_HOP.contains(name) && !listed.contains(name) {
            h.append(name, value.clone());
        }
    }
    h
}

/// `ip` as a field value: an IPv4 address is written digit by digit (`Ipv4Addr`'s `Display`
/// goes through the formatter and its padding, about 1,300 instructions per forwarded request).
fn ip_value(ip: IpAddr) -> HeaderValue {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::from_str(&ip.to_string()).expect("an address is a field value");
    };
    let mut b = [0u8; 15];
    let mut n = 0;
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            b[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            b[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            b[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        b[n] = b'0' + o % 10;
        n += 1;
    }
    HeaderValue::from_bytes(&b[..n]).expect("digits and dots")
}

/// On a request whose client's address was taken from a trusted proxy's field
/// (`[listener.real_ip]`, `crate::real_ip`): the address of the proxy that connected to larder.
/// X-Forwarded-For upstream is the chain received with this appended (as nginx's
/// `$proxy_add_x_forwarded_for`), so the origin sees every hop and can walk it the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hop(pub IpAddr);

/// On a request that came over TLS (HTTPS on TCP, or HTTP/3): its scheme is `https`. Set by the
/// server from the connection, never from what the request says (an absolute-form target or
/// HTTP/2's `:scheme` are the client's word), so a plain-text client cannot pass for a secure
/// one. Read through [`scheme`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secure;

/// The scheme the client used to reach larder: `https` on a [`Secure`] request, else `http`.
pub fn scheme(ext: &http::Extensions) -> &'static str {
    if ext.get::<Secure>().is_some() {
        "https"
    } else {
        "http"
    }
}

/// The Via value larder adds (RFC 9110 §7.6.3).
pub const VIA: HeaderValue = HeaderValue::from_static("1.1 larder");

/// Adds what the origin is told about a request forwarded from `client`: X-Forwarded-Host (the
/// request's authority, when it has one), X-Forwarded-For (appended to the list a proxy before
/// larder started), X-Forwarded-Proto (`scheme`, see [`scheme`]), and Via. `client` is the
/// address appended: whoever connected to larder (the [`Hop`] when the request has one, else
/// its client). `trusted` says the request came through a trusted proxy (`[listener.real_ip]`):
/// the X-Forwarded-Proto it set, saying what its client used, is then kept, as the client
/// address it named is.
pub fn add_forwarding(
    h: &mut HeaderMap,
    host: Option<&HeaderValue>,
    client: IpAddr,
    scheme: &'static str,
    trusted: bool,
) {
    // Names checked at compile time (`from_static` at run time validates every byte).
    const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
    const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
    if let Some(v) = host {
        h.insert(X_FORWARDED_HOST, v.clone());
    }
    let value = match h.get(X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) => HeaderValue::from_str(&format!("{prev}, {client}")).ok(),
        None => Some(ip_value(client)),
    };
    if let Some(v) = value {
        h.insert(X_FORWARDED_FOR, v);
    }
    let keep = trusted
        && h.get(X_FORWARDED_PROTO)
            .is_some_and(|v| matches!(v.as_bytes(), b"http" | b"https"));
    if !keep {
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
    }
    h.append(header::VIA, VIA);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_connection_listed_fields() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, X-Secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
        // A legacy hop-by-hop field alone is found by the first pass too.
        let mut h = HeaderMap::new();
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), [header::ACCEPT]);
    }

    #[test]
    fn an_end_to_end_copy_leaves_hop_by_hop_fields_and_keeps_order() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("X-Secret"));
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.append(header::ACCEPT, HeaderValue::from_static("text/html"));
        h.append(header::ACCEPT, HeaderValue::from_static("*/*"));
        h.insert(header::HOST, HeaderValue::from_static("example.com"));
        let copy = end_to_end_copy(&h, 4);
        assert_eq!(copy.len(), 3);
        let accept: Vec<_> = copy.get_all(header::ACCEPT).iter().collect();
        assert_eq!(accept, ["text/html", "*/*"]);
        assert_eq!(copy[header::HOST], "example.com");
        // The same fields as removing them in place.
        let mut stripped = h.clone();
        strip_hop_by_hop(&mut stripped);
        assert_eq!(stripped, copy);
        // Room for the fields a proxy adds.
        assert!(copy.capacity() >= 7);
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.30.40",
            "255.255.255.255",
            "192.168.100.9",
            "::1",
            "2001:db8::8a2e:370:7334",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_value(ip), ip.to_string().as_str());
        }
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        add_forwarding(&mut h, None, "10.0.0.1".parse().unwrap(), "http", false);
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 10.0.0.1");
    }

    #[test]
    fn forwarded_proto_is_the_connections_unless_a_trusted_proxy_said() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-proto", HeaderValue::from_static(v));
            h
        };
        let mut h = HeaderMap::new();
        add_forwarding(&mut h, None, ip, "https", false);
        assert_eq!(h["x-forwarded-proto"], "https");
        // A client's own claim is replaced...
        let mut h = with("https");
        add_forwarding(&mut h, None, ip, "http", false);
        assert_eq!(h["x-forwarded-proto"], "http");
        // ...a trusted proxy's kept, when it is one of the two schemes.
        let mut h = with("https");
        add_forwarding(&mut h, None, ip, "http", true);
        assert_eq!(h["x-forwarded-proto"], "https");
        let mut h = with("gopher");
        add_forwarding(&mut h, None, ip, "http", true);
        assert_eq!(h["x-forwarded-proto"], "http");
        let mut ext = http::Extensions::new();
        assert_eq!(scheme(&ext), "http");
        ext.insert(Secure);
        assert_eq!(scheme(&ext), "https");
    }
}
