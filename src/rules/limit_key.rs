//! What a limit (`rate_limit`, `in_flight`) counts a request under: its key (the client's
//! address, a header, a claim, the API key, a cookie, a template), or the client's address when
//! the key is missing (unless the rule skips such requests). Keys are kept as 64-bit SipHash
//! values under a key drawn at start (an attacker cannot aim collisions), so that one costs 8
//! bytes whatever its length; the fleet's Redis names keys by a SHA-256 of the value instead
//! (the same on every node, and no API key written there in clear).

use std::hash::{BuildHasher, Hasher, RandomState};

use http::Request;

use super::vars::{cookie, render, Seen};
use crate::body::RequestBody;
use crate::config::rules::LimitKey;
use crate::config::rules_limits::Missing;
use crate::phases::Cx;

/// A limit's key, compiled.
pub struct KeyOf {
    key: LimitKey,
    missing: Missing,
    hasher: RandomState,
}

/// A request's key: its kind (`c`: a client's address, `k`: the configured key) and value.
pub struct Key {
    pub kind: u8,
    pub value: Value,
}

/// A key's bytes: an address inline (no allocation for the common key), anything else owned.
pub enum Value {
    Address([u8; 16], usize),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Value {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Value::Address(a, n) => &a[..*n],
            Value::Owned(v) => v,
        }
    }
}

impl KeyOf {
    pub fn new(key: &LimitKey, missing: Missing) -> KeyOf {
        KeyOf {
            key: key.clone(),
            missing,
            hasher: RandomState::new(),
        }
    }

    /// The request's key; None: the rule skips it (its key is missing and `missing = "skip"`).
    pub fn of(&self, req: &Request<RequestBody>, cx: &Cx) -> Option<Key> {
        let client = || {
            let mut a = [0; 16];
            let n = match cx.client.ip() {
                std::net::IpAddr::V4(v4) => {
                    a[..4].copy_from_slice(&v4.octets());
                    4
                }
                std::net::IpAddr::V6(v6) => {
                    a = v6.octets();
                    16
                }
            };
            Key {
                kind: b'c',
                value: Value::Address(a, n),
            }
        };
        let found: Option<Vec<u8>> = match &self.key {
            LimitKey::Client => return Some(client()),
            LimitKey::Header(h) => (req.headers().get(h.0.as_str()))
                .map(|v| v.as_bytes().to_vec())
                .filter(|v| !v.is_empty()),
            LimitKey::Claim(c) => (cx.claims.as_ref().and_then(|m| m.get(c))).map(|v| match v {
                serde_json::Value::String(s) => s.as_bytes().to_vec(),
                other => other.to_string().into_bytes(),
            }),
            LimitKey::ApiKey => cx.note("api_key").map(|k| k.as_bytes().to_vec()),
            LimitKey::Cookie(c) => cookie(req.headers(), c).map(|v| v.as_bytes().to_vec()),
            LimitKey::Template(t) => {
                let mut s = String::new();
                render(t, Some(Seen::of(req)), cx, &mut s);
                (!s.is_empty()).then(|| s.into_bytes())
            }
        };
        match (found, self.missing) {
            (Some(value), _) => Some(Key {
                kind: b'k',
                value: Value::Owned(value),
            }),
            (None, Missing::Client) => Some(client()),
            (None, Missing::Skip) => None,
        }
    }

    /// The key's hash for this limit's own memory.
    pub fn hash(&self, key: &Key) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write_u8(key.kind);
        h.write(&key.value);
        h.finish()
    }
}

impl Key {
    /// The key's name in the fleet's Redis: the kind and 128 bits of SHA-256 of the value, in
    /// hex (the same on every node).
    pub fn fleet_name(&self) -> String {
        use std::fmt::Write;
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &self.value);
        let mut s = String::with_capacity(34);
        s.push(self.kind as char);
        s.push(':');
        for b in &d.as_ref()[..16] {
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}
