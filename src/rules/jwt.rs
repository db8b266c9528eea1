//! JSON Web Tokens (pingap's `jwt`, nginx Plus's `auth_jwt`): a token from `Authorization:
//! Bearer` (or a chosen header, cookie or query parameter) verified with the `jsonwebtoken`
//! crate: HS256/384/512 with a secret; RS, PS, ES256/384 and EdDSA with a PEM public key or the
//! keys of a JWKS, from a file (read again when it changes) or a URL (fetched again every
//! `jwks_refresh`, and on a `kid` it does not know, at most every `jwks_min_refresh`); `exp`,
//! `nbf` with leeway, `iss` and `aud` when the rule names them. The verified claims go into the
//! request's context (`$jwt_claim_NAME` in templates, a rate-limit key); `claims_to_headers`
//! sets headers on the request to the origin from them (at ②, replacing what the client sent).
//!
//! A request without a token is answered 401 with `WWW-Authenticate: Bearer`; one with a token
//! that does not verify, 401 with `Bearer error="invalid_token"` (RFC 6750 §3).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use arc_swap::ArcSwap;
use http::{header, request, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm as A, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::api_key::credential;
use super::subrequest;
use super::vars::Seen;
use super::watch::Watched;
use crate::body::{Body, RequestBody};
use crate::clock::Clock;
use crate::config::rules_auth::{parse_jwks, pem_keys, JwtKey, JwtRuleConfig, KeySource};
use crate::http::text_response;
use crate::phases::{Cx, Edit, Step, Verdict};
use crate::upstream::connect::Client;

/// The longest token looked at.
const MAX_TOKEN: usize = 16 << 10;

/// The largest JWKS document fetched.
const MAX_JWKS: usize = 1 << 20;

/// Verifying keys: each with its `kid` (JWKS) and the algorithms it verifies.
#[derive(Default)]
pub struct KeySet {
    keys: Vec<(Option<String>, DecodingKey, Vec<A>)>,
}

impl KeySet {
    fn of_jwks(set: &JwkSet) -> KeySet {
        let mut keys = Vec::new();
        for jwk in &set.keys {
            let algs = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => {
                    vec![A::RS256, A::RS384, A::RS512, A::PS256, A::PS384, A::PS512]
                }
                AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                    EllipticCurve::P256 => vec![A::ES256],
                    EllipticCurve::P384 => vec![A::ES384],
                    _ => continue,
                },
                AlgorithmParameters::OctetKeyPair(_) => vec![A::EdDSA],
                // Symmetric keys are not published: a rule's `secret` is the place for one.
                AlgorithmParameters::OctetKey(_) => continue,
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(k) => keys.push((jwk.common.key_id.clone(), k, algs)),
                Err(e) => {
                    tracing::warn!(kid = ?jwk.common.key_id, error = %e, "a JWKS key larder cannot use")
                }
            }
        }
        KeySet { keys }
    }

    /// The key for a token's `kid` and `alg`: the one with that `kid`, or without a `kid` in
    /// the token, the first that verifies `alg`.
    fn find(&self, kid: Option<&str>, alg: A) -> Option<&DecodingKey> {
        (self.keys.iter())
            .find(|(k, _, algs)| algs.contains(&alg) && (kid.is_none() || k.as_deref() == kid))
            .map(|(_, key, _)| key)
    }
}

fn jwks_file(text: &str) -> Result<KeySet, String> {
    parse_jwks(text).map(|s| KeySet::of_jwks(&s))
}

/// A JWKS at a URL: the keys last fetched, when, and when a fetch was last begun.
struct Remote {
    url: http::Uri,
    client: Option<Client>,
    set: ArcSwap<KeySet>,
    /// Clock milliseconds of the last good fetch (0: none yet), of the last begun.
    fetched: AtomicU64,
    tried: AtomicU64,
    refresh_ms: u64,
    min_refresh_ms: u64,
    clock: Clock,
}

impl Remote {
    fn now_ms(&self) -> u64 {
        (self.clock.now().duration_since(UNIX_EPOCH)).map_or(0, |d| d.as_millis() as u64)
    }

    /// Claims the right to fetch now (at most one fetch every `min_refresh`).
    fn may_fetch(&self) -> bool {
        let now = self.now_ms();
        let tried = self.tried.load(Ordering::Relaxed);
        (tried == 0 || now.saturating_sub(tried) >= self.min_refresh_ms)
            && (self.tried)
                .compare_exchange(tried, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Whether the keys are older than `refresh`.
    fn stale(&self) -> bool {
        let f = self.fetched.load(Ordering::Relaxed);
        f == 0 || self.now_ms().saturating_sub(f) >= self.refresh_ms
    }

    async fn fetch(&self) {
        let Some(client) = &self.client else { return };
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, application/jwk-set+json"),
        );
        let timeout = std::time::Duration::from_secs(10);
        let got = subrequest::get(client, &self.url, h, timeout, MAX_JWKS).await;
        let keys = got.and_then(|g| {
            if !g.status.is_success() {
                return Err(format!("answered {}", g.status));
            }
            let text = std::str::from_utf8(&g.body).map_err(|e| e.to_string())?;
            jwks_file(text)
        });
        match keys {
            Ok(k) => {
                self.set.store(Arc::new(k));
                self.fetched.store(self.now_ms().max(1), Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(url = %self.url, error = %e, "fetching a JWKS failed: the keys fetched before stay")
            }
        }
    }
}

enum Keys {
    Fixed(KeySet),
    File(Watched<KeySet>),
    Url(Arc<Remote>),
}

/// What verifying needs, shared with a request that waits for a JWKS fetch.
struct Verifier {
    keys: Keys,
    algorithms: Vec<A>,
    validation: Validation,
}

impl Verifier {
    /// The claims of `token`, verified with `set`'s key for it.
    fn verify(&self, token: &str, set: &KeySet) -> Result<Map<String, Value>, Failure> {
        let head = jsonwebtoken::decode_header(token).map_err(|_| Failure::Invalid)?;
        if !self.algorithms.contains(&head.alg) {
            return Err(Failure::Invalid);
        }
        let key = set
            .find(head.kid.as_deref(), head.alg)
            .ok_or(Failure::NoKey)?;
        let mut v = self.validation.clone();
        v.algorithms = vec![head.alg];
        jsonwebtoken::decode::<Map<String, Value>>(token, key, &v)
            .map(|d| d.claims)
            .map_err(|e| {
                tracing::debug!(error = %e, "a JWT refused");
                Failure::Invalid
            })
    }
}

/// Why a token was not taken.
#[derive(Debug, PartialEq)]
enum Failure {
    Invalid,
    /// No key for its `kid`/`alg` (a JWKS URL may be fetched again).
    NoKey,
}

/// `jwt = { ... }`.
pub struct Jwt {
    verifier: Arc<Verifier>,
    source: KeySource,
    /// Send the token upstream (`forward`); else it is removed from the origin's request.
    forward: bool,
    claims_to_headers: Vec<(HeaderName, String)>,
}

impl Jwt {
    pub fn new(cfg: &JwtRuleConfig, clock: &Clock) -> Jwt {
        let asymmetric = vec![
            A::RS256,
            A::RS384,
            A::RS512,
            A::PS256,
            A::PS384,
            A::PS512,
            A::ES256,
            A::ES384,
            A::EdDSA,
        ];
        let (keys, default_algs) = match &cfg.key {
            JwtKey::Secret(s) => {
                let hs = vec![A::HS256, A::HS384, A::HS512];
                let set = KeySet {
                    keys: vec![(None, DecodingKey::from_secret(s.as_bytes()), hs)],
                };
                (Keys::Fixed(set), vec![A::HS256])
            }
            JwtKey::PublicKey(p) => {
                let keys = (std::fs::read(p).map_err(|e| e.to_string()))
                    .and_then(|pem| pem_keys(&pem))
                    .unwrap_or_else(|e| {
                        tracing::warn!(file = %p.display(), error = %e, "a JWT rule's public key cannot be read: its requests are refused");
                        Vec::new()
                    });
                let algs = keys.iter().flat_map(|(_, a)| a.clone()).collect();
                let set = KeySet {
                    keys: keys.into_iter().map(|(k, a)| (None, k, a)).collect(),
                };
                (Keys::Fixed(set), algs)
            }
            JwtKey::JwksFile(p) => (
                Keys::File(Watched::open(p, clock, jwks_file)),
                asymmetric.clone(),
            ),
            JwtKey::JwksUrl(u) => {
                let client = subrequest::client_for(u)
                    .inspect_err(
                        |e| tracing::warn!(url = %u, error = %e, "a JWKS URL cannot be fetched"),
                    )
                    .ok();
                let remote = Remote {
                    url: u.clone(),
                    client,
                    set: ArcSwap::from_pointee(KeySet::default()),
                    fetched: AtomicU64::new(0),
                    tried: AtomicU64::new(0),
                    refresh_ms: cfg.jwks_refresh.0.as_millis() as u64,
                    min_refresh_ms: cfg.jwks_min_refresh.0.as_millis() as u64,
                    clock: clock.clone(),
                };
                (Keys::Url(Arc::new(remote)), asymmetric.clone())
            }
        };
        let algorithms = if cfg.algorithms.is_empty() {
            default_algs
        } else {
            cfg.algorithms.iter().map(|a| a.0).collect()
        };
        let mut validation = Validation::new(algorithms.first().copied().unwrap_or(A::RS256));
        validation.leeway = cfg.leeway.0.as_secs();
        validation.validate_nbf = true;
        if cfg.issuer.is_empty() {
            validation.iss = None;
        } else {
            validation.set_issuer(&cfg.issuer);
        }
        if cfg.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&cfg.audience);
        }
        let mut required: HashSet<String> = HashSet::from(["exp".to_string()]);
        if !cfg.issuer.is_empty() {
            required.insert("iss".into());
        }
        if !cfg.audience.is_empty() {
            required.insert("aud".into());
        }
        validation.required_spec_claims = required;
        Jwt {
            verifier: Arc::new(Verifier {
                keys,
                algorithms,
                validation,
            }),
            source: cfg.source.clone(),
            forward: cfg.forward,
            claims_to_headers: (cfg.claims_to_headers.iter())
                .map(|(h, c)| (h.0.clone(), c.clone()))
                .collect(),
        }
    }

    /// The token of a request, as the rule's source holds it.
    fn token<'a>(&self, seen: Seen<'a>) -> Option<&'a str> {
        let raw = credential(&self.source, seen)?;
        let token = match &self.source {
            KeySource::Header(h) if h.0 == header::AUTHORIZATION => {
                let (scheme, rest) = raw.split_once(' ')?;
                if !scheme.eq_ignore_ascii_case("bearer") {
                    return None;
                }
                rest.trim()
            }
            KeySource::Header(_) => raw
                .strip_prefix("Bearer ")
                .or_else(|| raw.strip_prefix("bearer "))
                .unwrap_or(raw)
                .trim(),
            _ => raw,
        };
        (!token.is_empty() && token.len() <= MAX_TOKEN).then_some(token)
    }
}

fn challenge(error: bool) -> Response<Body> {
    let mut r = text_response(StatusCode::UNAUTHORIZED, "a valid token is required\n");
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(if error {
            "Bearer error=\"invalid_token\""
        } else {
            "Bearer"
        }),
    );
    r
}

fn taken(claims: Map<String, Value>) -> Edit {
    let claims = Arc::new(claims);
    Box::new(move |_: &mut Request<RequestBody>, cx: &mut Cx| cx.claims = Some(claims))
}

impl Step for Jwt {
    fn request(&self, req: &mut Request<RequestBody>, cx: &mut Cx) -> Verdict {
        let Some(token) = self.token(Seen::of(req)) else {
            return Verdict::Answer(challenge(false));
        };
        let v = &self.verifier;
        let outcome = match &v.keys {
            Keys::Fixed(set) => v.verify(token, set),
            Keys::File(w) => match w.get() {
                Some(set) => v.verify(token, &set),
                None => Err(Failure::Invalid),
            },
            Keys::Url(remote) => {
                let outcome = v.verify(token, &remote.set.load());
                if outcome == Err(Failure::NoKey) && remote.may_fetch() {
                    // A key it does not know (or none fetched yet): fetch, then try again.
                    let (verifier, remote, token) =
                        (Arc::clone(v), Arc::clone(remote), token.to_string());
                    return Verdict::Wait(Box::pin(async move {
                        remote.fetch().await;
                        match verifier.verify(&token, &remote.set.load()) {
                            Ok(claims) => Ok(Some(taken(claims))),
                            Err(_) => Err(challenge(true)),
                        }
                    }));
                }
                if remote.stale() && remote.may_fetch() {
                    let remote = Arc::clone(remote);
                    tokio::spawn(async move { remote.fetch().await });
                }
                outcome
            }
        };
        match outcome {
            Ok(claims) => {
                cx.claims = Some(Arc::new(claims));
                Verdict::Next
            }
            Err(_) => Verdict::Answer(challenge(true)),
        }
    }

    fn upstream_request(&self, req: &mut request::Parts, cx: &Cx) {
        if !self.forward {
            super::api_key::strip(&self.source, &mut req.headers, &mut req.uri);
        }
        for (name, claim) in &self.claims_to_headers {
            req.headers.remove(name);
            let value = cx.claims.as_ref().and_then(|c| c.get(claim));
            let text = match value {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => continue,
            };
            match HeaderValue::from_str(&text) {
                Ok(v) => {
                    req.headers.insert(name.clone(), v);
                }
                Err(_) => tracing::debug!(
                    claim = claim.as_str(),
                    "a claim is not a valid header value: not sent"
                ),
            }
        }
    }
}
