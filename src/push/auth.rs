//! Who may write and read a push route's records: the route's bearer token (every id), or a
//! JSON Web Token (HS256 or RS256, checked by the `jsonwebtoken` crate) whose `larder` claim
//! lists the id patterns it may `publish` (write) and `subscribe` to (read), as Mercure's
//! `mercure` claim does:
//!
//! ```json
//! {"larder": {"publish": ["cars/*"], "subscribe": ["*"]}, "exp": 1893456000}
//! ```
//!
//! `exp` and `nbf` are checked when present, give or take the route's `leeway` (60 s by
//! default). A browser's EventSource cannot send headers, so
//! a read token may also come in the `authorization` query parameter.

use http::{HeaderMap, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::filter::IdPattern;
use crate::config::PushConfig;

/// The keys a route checks tokens with.
pub struct Auth {
    token: Option<String>,
    jwt: Option<(DecodingKey, Validation)>,
    read_needs_jwt: bool,
}

#[derive(Deserialize, Default)]
struct Claims {
    #[serde(default)]
    larder: Grants,
}

#[derive(Deserialize, Default)]
struct Grants {
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    subscribe: Vec<String>,
}

/// What a request may do.
#[derive(Debug, PartialEq)]
pub enum Allowed {
    /// Every id.
    All,
    /// The ids of these patterns.
    Patterns(Vec<IdPattern>),
    /// Nothing, with the answer: 401 (no credentials, or wrong ones) or 403 (the route takes
    /// none), and why.
    Nothing(StatusCode, &'static str),
}

impl Allowed {
    pub fn id(&self, id: &str) -> bool {
        match self {
            Allowed::All => true,
            Allowed::Patterns(ps) => ps.iter().any(|p| p.matches(id)),
            Allowed::Nothing(..) => false,
        }
    }

    /// Whether every id of `pattern` is allowed (a subscription to it).
    pub fn pattern(&self, pattern: &IdPattern) -> bool {
        match self {
            Allowed::All => true,
            Allowed::Patterns(ps) => ps.iter().any(|p| covers(p, pattern)),
            Allowed::Nothing(..) => false,
        }
    }
}

/// Whether every id `inner` matches, `outer` matches too.
fn covers(outer: &IdPattern, inner: &IdPattern) -> bool {
    let o: Vec<&str> = outer.as_str().split('/').collect();
    let i: Vec<&str> = inner.as_str().split('/').collect();
    for (k, seg) in o.iter().enumerate() {
        let last = k + 1 == o.len();
        match i.get(k) {
            None => return false,
            Some(_) if *seg == "*" && last => return true,
            // A trailing `*` of the inner pattern reaches deeper than one segment.
            Some(&"*") if k + 1 == i.len() => return false,
            Some(s) if *seg == "*" || seg == s => {}
            Some(_) => return false,
        }
    }
    o.len() == i.len()
}

impl Auth {
    pub fn new(cfg: &PushConfig) -> Result<Auth, String> {
        let jwt = match &cfg.jwt {
            None => None,
            Some(j) => {
                let (key, alg) = match (&j.secret, &j.public_key) {
                    (Some(s), _) => (DecodingKey::from_secret(s.as_bytes()), Algorithm::HS256),
                    (None, Some(path)) => {
                        let pem =
                            std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
                        let key = DecodingKey::from_rsa_pem(&pem)
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                        (key, Algorithm::RS256)
                    }
                    (None, None) => return Err("jwt needs `secret` or `public_key`".into()),
                };
                let mut v = Validation::new(alg);
                v.required_spec_claims.clear();
                v.validate_nbf = true;
                v.leeway = j.leeway.0.as_secs();
                Some((key, v))
            }
        };
        Ok(Auth {
            token: cfg.token.clone(),
            jwt,
            read_needs_jwt: cfg.read_needs_jwt,
        })
    }

    /// The bearer token, its scheme's name in any case (RFC 9110 §11.1).
    fn bearer(headers: &HeaderMap) -> Option<&str> {
        crate::admin::bearer_token(headers)
    }

    fn claims(&self, token: &str) -> Option<Claims> {
        let (key, v) = self.jwt.as_ref()?;
        jsonwebtoken::decode::<Claims>(token, key, v)
            .ok()
            .map(|d| d.claims)
    }

    fn patterns(list: &[String]) -> Allowed {
        Allowed::Patterns(
            list.iter()
                .filter_map(|p| IdPattern::parse(p).ok())
                .collect(),
        )
    }

    /// What a write request may write.
    pub fn writer(&self, headers: &HeaderMap) -> Allowed {
        if self.token.is_none() && self.jwt.is_none() {
            return Allowed::Nothing(StatusCode::FORBIDDEN, "this route has no write token");
        }
        let Some(given) = Self::bearer(headers) else {
            return Allowed::Nothing(StatusCode::UNAUTHORIZED, "a bearer token is required");
        };
        if let Some(t) = &self.token {
            if crate::admin::bearer_matches(headers, t) {
                return Allowed::All;
            }
        }
        match self.claims(given) {
            Some(c) => Self::patterns(&c.larder.publish),
            None => Allowed::Nothing(StatusCode::UNAUTHORIZED, "the token is not valid"),
        }
    }

    /// What a read or subscription may see; `query_token` is the `authorization` query
    /// parameter.
    pub fn reader(&self, headers: &HeaderMap, query_token: Option<&str>) -> Allowed {
        if !self.read_needs_jwt {
            return Allowed::All;
        }
        if let Some(t) = &self.token {
            if crate::admin::bearer_matches(headers, t) {
                return Allowed::All;
            }
        }
        let Some(given) = Self::bearer(headers).or(query_token) else {
            return Allowed::Nothing(StatusCode::UNAUTHORIZED, "a token is required to read");
        };
        match self.claims(given) {
            Some(c) => Self::patterns(&c.larder.subscribe),
            None => Allowed::Nothing(StatusCode::UNAUTHORIZED, "the token is not valid"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dur, JwtConfig};
    use http::HeaderValue;

    const SECRET: &str = "a-long-enough-shared-secret";

    fn auth(leeway_secs: u64) -> Auth {
        let mut cfg = PushConfig::new_dir("/unused".into(), Some("tok".into()));
        cfg.jwt = Some(JwtConfig {
            secret: Some(SECRET.into()),
            public_key: None,
            leeway: Dur(std::time::Duration::from_secs(leeway_secs)),
        });
        Auth::new(&cfg).unwrap()
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    fn jwt(claims: serde_json::Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    }

    #[test]
    fn exp_and_nbf_are_checked_with_the_configured_leeway() {
        let now = jsonwebtoken::get_current_timestamp();
        let grants = serde_json::json!({"publish": ["*"]});
        // Expired 30 s ago, and valid only 30 s from now.
        let expired = jwt(serde_json::json!({"larder": grants, "exp": now - 30}));
        let early = jwt(serde_json::json!({"larder": grants, "nbf": now + 30}));
        for token in [&expired, &early] {
            let h = bearer(&format!("Bearer {token}"));
            assert!(auth(60).writer(&h).id("x"), "within 60 s of leeway");
            assert!(!auth(0).writer(&h).id("x"), "no leeway");
            assert!(!auth(10).writer(&h).id("x"), "beyond 10 s of leeway");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let a = auth(0);
        let token = jwt(serde_json::json!({"larder": {"publish": ["cars/*"]}}));
        for scheme in ["Bearer", "bearer", "BEARER"] {
            assert_eq!(a.writer(&bearer(&format!("{scheme} tok"))), Allowed::All);
            let granted = a.writer(&bearer(&format!("{scheme} {token}")));
            assert!(granted.id("cars/1") && !granted.id("bikes/1"), "{scheme}");
        }
    }

    #[test]
    fn a_pattern_covers_the_ones_inside_it() {
        let p = |s| IdPattern::parse(s).unwrap();
        assert!(covers(&p("*"), &p("cars/*")));
        assert!(covers(&p("cars/*"), &p("cars/*")));
        assert!(covers(&p("cars/*"), &p("cars/42")));
        assert!(covers(&p("cars/*"), &p("cars/*/wheels")));
        assert!(!covers(&p("cars/42"), &p("cars/*")));
        assert!(!covers(&p("cars/*/wheels"), &p("cars/*")));
        assert!(!covers(&p("cars/*"), &p("*")));
        assert!(!covers(&p("cars/*/x"), &p("cars/1/*")));
        assert!(covers(&p("cars/*/x"), &p("cars/1/x")));
    }
}
