//! The settings of the authentication rules (docs/rules.md, "Access: authentication"):
//! `basic_auth`, `api_key`, `jwt` and `forward_auth`. What can be checked without the files
//! they name is checked here while parsing (one place for a key, algorithms known, a URL's
//! scheme); the files they name are read and parsed by `Config::load` with the parsers here
//! ([`parse_htpasswd`], [`parse_keys_file`], [`pem_keys`], [`parse_jwks`]), which the rules use
//! again when they read them (`crate::rules`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::headers::HeaderNameCfg;
use super::units::{Bounded, Dur, HOUR_MS, MINUTE_MS, SECOND_MS};

/// `basic_auth = { htpasswd = "path", realm = "members" }`: users of an htpasswd file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthConfig {
    /// An htpasswd file as Apache's `htpasswd -B` writes it (bcrypt; `{SHA}` also taken),
    /// read again when it changes.
    pub htpasswd: PathBuf,
    /// The realm the browser shows (`WWW-Authenticate: Basic realm="..."`).
    #[serde(default = "BasicAuthConfig::default_realm")]
    pub realm: Realm,
    /// Send the client's `Authorization` upstream (nginx does). With `false` it is removed
    /// from the request to the origin only: the cache still sees a request with credentials
    /// (RFC 9111 §3.5), so the origin's answers are shared only when it marks them `public`.
    #[serde(default = "yes")]
    pub forward: bool,
}

impl BasicAuthConfig {
    fn default_realm() -> Realm {
        Realm("restricted".into())
    }
}

fn yes() -> bool {
    true
}

/// A realm: printable text without `"` or `\` (it goes inside a quoted string).
#[derive(Debug, Clone, PartialEq)]
pub struct Realm(pub String);

impl<'de> Deserialize<'de> for Realm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.len() > 200 || !s.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return Err(de::Error::custom(
                "a realm is 1 to 200 printable ASCII characters",
            ));
        }
        if s.contains(['"', '\\']) {
            return Err(de::Error::custom("a realm cannot hold `\"` or `\\`"));
        }
        Ok(Realm(s))
    }
}

/// `api_key = { header = "x-api-key", keys = { alice = "k1" } }`: named keys in a header or a
/// query parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKeyConfig {
    pub source: KeySource,
    /// Key holder's name -> key, from `keys` (the file's are read when the rule is compiled).
    pub keys: BTreeMap<String, String>,
    /// `keys_file`: lines `name:key` (`#` starts a comment), read when the rule is compiled.
    pub keys_file: Option<PathBuf>,
    /// Send the key upstream (by default it is removed from the request to the origin).
    pub forward: bool,
}

/// Where a credential is read from.
#[derive(Debug, Clone, PartialEq)]
pub enum KeySource {
    Header(HeaderNameCfg),
    Query(String),
    /// JWT only: a cookie.
    Cookie(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApiKey {
    header: Option<HeaderNameCfg>,
    query: Option<String>,
    #[serde(default)]
    keys: BTreeMap<String, String>,
    keys_file: Option<PathBuf>,
    #[serde(default)]
    forward: bool,
}

impl<'de> Deserialize<'de> for ApiKeyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RawApiKey::deserialize(d)?;
        let source = match (r.header, r.query) {
            (Some(h), None) => KeySource::Header(h),
            (None, Some(q)) if !q.is_empty() => KeySource::Query(q),
            (None, None) => {
                KeySource::Header(HeaderNameCfg(http::HeaderName::from_static("x-api-key")))
            }
            _ => {
                return Err(de::Error::custom(
                    "an api_key is read from one place: `header` or `query`",
                ))
            }
        };
        if r.keys.is_empty() == r.keys_file.is_none() {
            return Err(de::Error::custom(
                "an api_key rule takes `keys = { name = \"key\" }` or `keys_file`, one of them",
            ));
        }
        for (name, key) in &r.keys {
            check_key(name, key).map_err(de::Error::custom)?;
        }
        Ok(ApiKeyConfig {
            source,
            keys: r.keys,
            keys_file: r.keys_file,
            forward: r.forward,
        })
    }
}

/// A key and its holder's name are usable: a name of letters, digits, `_.@-`; a key of at
/// least 8 visible ASCII characters (a shorter one is guessed).
pub fn check_key(name: &str, key: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !(name.bytes()).all(|b| b.is_ascii_alphanumeric() || b"_.@-".contains(&b))
    {
        return Err(format!(
            "`{name}`: a key's name is 1 to 64 letters, digits or `_.@-`"
        ));
    }
    if key.len() < 8 || key.len() > 512 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the key of `{name}`: 8 to 512 visible ASCII characters"
        ));
    }
    Ok(())
}

/// `jwt = { secret | public_key | jwks, algorithms, issuer, audience, leeway, header | cookie |
/// query, claims_to_headers }`.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtRuleConfig {
    pub key: JwtKey,
    /// The algorithms taken (a token's `alg` must be one); by default the key's.
    pub algorithms: Vec<JwtAlg>,
    /// `iss` must be one of these (when given).
    pub issuer: Vec<String>,
    /// `aud` must hold one of these (when given).
    pub audience: Vec<String>,
    /// How far `exp` and `nbf` may be off (whole seconds).
    pub leeway: Dur<0, HOUR_MS>,
    /// Where the token is: `Authorization: Bearer` by default.
    pub source: KeySource,
    /// Headers set on the request to the origin from the verified claims: (header, claim).
    pub claims_to_headers: Vec<(HeaderNameCfg, String)>,
    /// Send the token to the origin: by default yes from a header or a cookie (as nginx's
    /// `auth_jwt`), no from a query parameter (a URL's token ends in the origin's logs).
    pub forward: bool,
    /// A JWKS URL is fetched again this often (and on an unknown `kid`, at most every
    /// `jwks_min_refresh`).
    pub jwks_refresh: Dur<{ SECOND_MS }, { 24 * HOUR_MS }>,
    pub jwks_min_refresh: Dur<0, HOUR_MS>,
}

/// Where a JWT rule's keys come from.
#[derive(Debug, Clone, PartialEq)]
pub enum JwtKey {
    /// HS256/384/512.
    Secret(String),
    /// A PEM public key (RSA, EC P-256/P-384 or Ed25519).
    PublicKey(PathBuf),
    /// A JWKS document in a file (read again when it changes).
    JwksFile(PathBuf),
    /// A JWKS document at an `https://` (or `http://`) URL.
    JwksUrl(http::Uri),
}

/// A signature algorithm a JWT rule takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JwtAlg(pub jsonwebtoken::Algorithm);

/// The algorithms a rule may name (none: `none` is not among them).
pub const JWT_ALGORITHMS: &[&str] = &[
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
    "ES384", "EdDSA",
];

impl<'de> Deserialize<'de> for JwtAlg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !JWT_ALGORITHMS.contains(&s.as_str()) {
            return Err(de::Error::custom(format!(
                "`{s}` is not an algorithm larder takes ({})",
                JWT_ALGORITHMS.join(", ")
            )));
        }
        s.parse()
            .map(JwtAlg)
            .map_err(|_| de::Error::custom(format!("`{s}` is not an algorithm")))
    }
}

/// One value or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn list(o: Option<OneOrMany>) -> Vec<String> {
        match o {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s],
            Some(OneOrMany::Many(v)) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJwt {
    secret: Option<String>,
    public_key: Option<PathBuf>,
    jwks: Option<String>,
    #[serde(default)]
    algorithms: Vec<JwtAlg>,
    issuer: Option<OneOrMany>,
    audience: Option<OneOrMany>,
    leeway: Option<Dur<0, HOUR_MS>>,
    header: Option<HeaderNameCfg>,
    cookie: Option<String>,
    query: Option<String>,
    forward: Option<bool>,
    #[serde(default)]
    claims_to_headers: BTreeMap<String, String>,
    jwks_refresh: Option<Dur<{ SECOND_MS }, { 24 * HOUR_MS }>>,
    jwks_min_refresh: Option<Dur<0, HOUR_MS>>,
}

impl<'de> Deserialize<'de> for JwtRuleConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use jsonwebtoken::Algorithm as A;
        let r = RawJwt::deserialize(d)?;
        let key = match (r.secret, r.public_key, r.jwks) {
            (Some(s), None, None) => {
                if s.len() < 16 {
                    return Err(de::Error::custom(
                        "a JWT `secret` of fewer than 16 bytes is guessed: use 32 or more",
                    ));
                }
                JwtKey::Secret(s)
            }
            (None, Some(p), None) => JwtKey::PublicKey(p),
            (None, None, Some(j)) if j.starts_with("https://") || j.starts_with("http://") => {
                JwtKey::JwksUrl(
                    j.parse()
                        .map_err(|e| de::Error::custom(format!("`{j}` is not a URL: {e}")))?,
                )
            }
            (None, None, Some(j)) => JwtKey::JwksFile(PathBuf::from(j)),
            _ => {
                return Err(de::Error::custom(
                    "a jwt rule takes one of `secret`, `public_key` or `jwks`",
                ))
            }
        };
        let hmac = |a: &JwtAlg| matches!(a.0, A::HS256 | A::HS384 | A::HS512);
        match &key {
            JwtKey::Secret(_) if !r.algorithms.iter().all(hmac) => {
                return Err(de::Error::custom(
                    "a `secret` verifies HS256, HS384 or HS512 only",
                ))
            }
            JwtKey::PublicKey(_) | JwtKey::JwksFile(_) | JwtKey::JwksUrl(_)
                if r.algorithms.iter().any(hmac) =>
            {
                return Err(de::Error::custom(
                    "HS algorithms need a `secret`: a public key or JWKS verifies RS, PS, ES or EdDSA",
                ))
            }
            _ => {}
        }
        let source = match (r.header, r.cookie, r.query) {
            (None, None, None) => KeySource::Header(HeaderNameCfg(http::header::AUTHORIZATION)),
            (Some(h), None, None) => KeySource::Header(h),
            (None, Some(c), None) => KeySource::Cookie(c),
            (None, None, Some(q)) => KeySource::Query(q),
            _ => {
                return Err(de::Error::custom(
                    "a jwt rule reads its token from one of `header`, `cookie` or `query`",
                ))
            }
        };
        let mut claims_to_headers = Vec::new();
        for (name, claim) in r.claims_to_headers {
            let h = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                de::Error::custom(format!(
                    "`claims_to_headers`: `{name}` is not a valid header name"
                ))
            })?;
            if claim.is_empty() {
                return Err(de::Error::custom("`claims_to_headers`: a claim has a name"));
            }
            claims_to_headers.push((HeaderNameCfg(h), claim));
        }
        Ok(JwtRuleConfig {
            key,
            algorithms: r.algorithms,
            issuer: OneOrMany::list(r.issuer),
            audience: OneOrMany::list(r.audience),
            leeway: r.leeway.unwrap_or(Dur(std::time::Duration::from_secs(60))),
            forward: r.forward.unwrap_or(!matches!(source, KeySource::Query(_))),
            source,
            claims_to_headers,
            jwks_refresh: r
                .jwks_refresh
                .unwrap_or(Dur(std::time::Duration::from_millis(5 * MINUTE_MS))),
            jwks_min_refresh: r
                .jwks_min_refresh
                .unwrap_or(Dur(std::time::Duration::from_secs(10))),
        })
    }
}

/// `forward_auth = { url, request_headers, response_headers, cache_for, cache_by, fail_open,
/// timeout }`: a subrequest decides (nginx's `auth_request`, Traefik's ForwardAuth).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardAuthConfig {
    /// The auth service's URL (`http://` or `https://`), asked with a GET.
    #[serde(deserialize_with = "auth_url")]
    pub url: http::Uri,
    /// The client's request headers sent to the auth service (besides `X-Forwarded-*`).
    #[serde(default = "ForwardAuthConfig::default_request_headers")]
    pub request_headers: Vec<HeaderNameCfg>,
    /// The auth service's answer headers copied onto the request to the origin on an allow.
    #[serde(default)]
    pub response_headers: Vec<HeaderNameCfg>,
    /// How long an allow is remembered (0: every request asks).
    #[serde(default = "ForwardAuthConfig::default_cache_for")]
    pub cache_for: Dur<0, { 24 * HOUR_MS }>,
    /// The request headers whose values key a remembered allow (by default the
    /// `request_headers`).
    pub cache_by: Option<Vec<HeaderNameCfg>>,
    /// Allows remembered at most (the oldest dropped past it).
    #[serde(default = "ForwardAuthConfig::default_cache_entries")]
    pub cache_entries: Bounded<1, 10_000_000>,
    /// Let the request through when the auth service cannot be asked (errors, timeouts, 5xx).
    #[serde(default)]
    pub fail_open: bool,
    /// How long the auth service may take.
    #[serde(default = "ForwardAuthConfig::default_timeout")]
    pub timeout: Dur<1, { 5 * MINUTE_MS }>,
}

impl ForwardAuthConfig {
    fn default_request_headers() -> Vec<HeaderNameCfg> {
        vec![
            HeaderNameCfg(http::header::AUTHORIZATION),
            HeaderNameCfg(http::header::COOKIE),
        ]
    }
    fn default_cache_for() -> Dur<0, { 24 * HOUR_MS }> {
        Dur(std::time::Duration::ZERO)
    }
    fn default_cache_entries() -> Bounded<1, 10_000_000> {
        Bounded(10_000)
    }
    fn default_timeout() -> Dur<1, { 5 * MINUTE_MS }> {
        Dur(std::time::Duration::from_secs(2))
    }
}

fn auth_url<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
    let s = String::deserialize(d)?;
    let u: http::Uri = s
        .parse()
        .map_err(|e| de::Error::custom(format!("`{s}` is not a URL: {e}")))?;
    match (u.scheme_str(), u.authority()) {
        (Some("http" | "https"), Some(_)) => Ok(u),
        _ => Err(de::Error::custom(format!(
            "`{s}`: the auth service's URL is http:// or https:// with a host"
        ))),
    }
}

/// How an htpasswd line's password is hashed.
#[derive(Debug, Clone, PartialEq)]
pub enum PasswordHash {
    /// `$2y$`, `$2a$`, `$2b$` (`htpasswd -B`).
    Bcrypt(String),
    /// `{SHA}` + base64 of the password's SHA-1 (`htpasswd -s`): weak, taken for old files.
    Sha1([u8; 20]),
}

/// The users of an htpasswd file, in its order. Blank lines and `#` comments are skipped;
/// MD5-crypt (`$apr1$`, htpasswd's old default), crypt(3) and plain-text entries are refused
/// with their line: larder does not take them (re-create the user with `htpasswd -B`).
pub fn parse_htpasswd(text: &str) -> Result<Vec<(String, PasswordHash)>, String> {
    use base64::Engine;
    let mut users = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let at = n + 1;
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!("line {at}: not `user:hash`"));
        };
        if user.is_empty() {
            return Err(format!("line {at}: no user name"));
        }
        let hash = if ["$2y$", "$2a$", "$2b$"].iter().any(|p| hash.starts_with(p)) {
            PasswordHash::Bcrypt(hash.to_string())
        } else if let Some(b64) = hash.strip_prefix("{SHA}") {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .ok()
                .and_then(|b| <[u8; 20]>::try_from(b).ok())
                .ok_or_else(|| format!("line {at}: user `{user}`: a bad {{SHA}} hash"))?;
            PasswordHash::Sha1(bytes)
        } else if hash.starts_with("$apr1$") {
            return Err(format!(
                "line {at}: user `{user}` has an MD5-crypt hash ($apr1$), which larder does not take: \
                 write it again with `htpasswd -B` (bcrypt)"
            ));
        } else {
            return Err(format!(
                "line {at}: user `{user}`: not a bcrypt ($2y$) or {{SHA}} hash (crypt and plain \
                 text are not taken): write it again with `htpasswd -B`"
            ));
        };
        users.push((user.to_string(), hash));
    }
    Ok(users)
}

/// The named keys of a `keys_file`: lines `name:key`; blank lines and `#` comments skipped.
pub fn parse_keys_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, key)) = line.split_once(':') else {
            return Err(format!("line {}: not `name:key`", n + 1));
        };
        check_key(name, key).map_err(|e| format!("line {}: {e}", n + 1))?;
        keys.push((name.to_string(), key.to_string()));
    }
    Ok(keys)
}

/// The verifying keys of a PEM public key, with the algorithms each takes (RSA: RS*/PS*;
/// EC: ES256/ES384; Ed25519: EdDSA).
pub fn pem_keys(
    pem: &[u8],
) -> Result<Vec<(jsonwebtoken::DecodingKey, Vec<jsonwebtoken::Algorithm>)>, String> {
    use jsonwebtoken::{Algorithm as A, DecodingKey};
    if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
        return Ok(vec![(
            k,
            vec![A::RS256, A::RS384, A::RS512, A::PS256, A::PS384, A::PS512],
        )]);
    }
    if let Ok(k) = DecodingKey::from_ec_pem(pem) {
        return Ok(vec![(k, vec![A::ES256, A::ES384])]);
    }
    if let Ok(k) = DecodingKey::from_ed_pem(pem) {
        return Ok(vec![(k, vec![A::EdDSA])]);
    }
    Err("not a PEM public key (RSA, EC or Ed25519)".into())
}

/// A JWKS document's keys that larder can use.
pub fn parse_jwks(text: &str) -> Result<jsonwebtoken::jwk::JwkSet, String> {
    let set: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    Ok(set)
}

/// Read by larder at most (an htpasswd, keys or JWKS file): past it the file is refused.
pub const MAX_AUTH_FILE: u64 = 16 << 20;

/// Reads a rule's file, bounded by [`MAX_AUTH_FILE`].
pub fn read_auth_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    f.take(MAX_AUTH_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_AUTH_FILE {
        return Err(format!(
            "{}: larger than {} MiB",
            path.display(),
            MAX_AUTH_FILE >> 20
        ));
    }
    Ok(text)
}
