//! Who may write and read a push route's records: the route's bearer token (every id), or a
//! JSON Web Token (HS256 or RS256, checked by the `jsonwebtoken` crate) whose `larder` claim
//! lists the id patterns it may `publish` (write) and `subscribe` to (read), as Mercure's
//! `mercure` claim does:
//!
//! ```json
//! {"larder": {"publish": ["cars/*"], "subscribe": ["*"]}, "exp": 1893456000}
//! ```
//!
//! `exp` and `nbf` are checked when present. A browser's EventSource cannot send headers, so
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
                Some((key, v))
            }
        };
        Ok(Auth {
            token: cfg.token.clone(),
            jwt,
            read_needs_jwt: cfg.read_needs_jwt,
        })
    }

    fn bearer(headers: &HeaderMap) -> Option<&str> {
        headers
            .get(http::header::AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")
            .map(str::trim)
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
