//! The fields a proxy removes or adds on the way through (RFC 9110 §7.6): hop-by-hop fields,
//! Via, and the X-Forwarded-* fields telling the origin about the client.

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
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The Via value larder adds (RFC 9110 §7.6.3).
pub const VIA: HeaderValue = HeaderValue::from_static("1.1 larder");

/// Adds what the origin is told about a request forwarded from `client`: X-Forwarded-Host (the
/// request's authority, when it has one), X-Forwarded-For (appended to the list a proxy before
/// larder started), X-Forwarded-Proto, and Via.
pub fn add_forwarding(h: &mut HeaderMap, host: Option<&HeaderValue>, client: IpAddr) {
    if let Some(v) = host {
        h.insert(HeaderName::from_static("x-forwarded-host"), v.clone());
    }
    let ip = client.to_string();
    let xff = HeaderName::from_static("x-forwarded-for");
    let value = match h.get(&xff).and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {ip}"),
        None => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert(xff, v);
    }
    h.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
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
    }
}
