//! Rules (docs/rules.md): `[[policy.NAME]]`, reusable named lists of rules, and a route's own
//! `[[listener.route.rule]]`. A rule is a condition (`when`: method, path glob or regex, host,
//! header, query parameter, cookie, client address) and one action; the actions are compiled
//! into the route's phases by `crate::rules`. What is checked here, at load: patterns compile,
//! templates name known variables and cannot put CR or LF in a header, each rule has exactly
//! one action.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::headers::is_token;
use super::net::{Cidr, HostPattern};
use super::respond::RespondConfig;
use super::rules_auth::{ApiKeyConfig, BasicAuthConfig, ForwardAuthConfig, JwtRuleConfig};
use super::rules_cache::{
    CacheForceConfig, CacheKeyConfig, CacheTtlConfig, MirrorConfig, SplitConfig,
};
use super::rules_limits::{default_max_keys, LimitRateConfig, LimitStatus, MaxKeys, Missing, Rate};
use super::units::{Bounded, ByteSize, Dur, HOUR_MS};

/// One rule: when it applies (every request of the route, without `when`) and what it does.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRule")]
pub struct RuleConfig {
    /// Shown in logs, metrics and the cache status (`rule=NAME`); the action's kind otherwise.
    pub name: Option<String>,
    pub when: Option<When>,
    pub action: Action,
}

/// What a rule does. Exactly one per rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `use = "NAME"`: the rules of `[[policy.NAME]]` here, in their order (under this rule's
    /// `when`, if it has one, besides their own).
    Use(String),
    /// `allow = ["10.0.0.0/8"]`: every client outside these networks is answered 403.
    Allow(Vec<Cidr>),
    /// `deny = ["192.0.2.0/24"]`: clients inside these networks are answered 403.
    Deny(Vec<Cidr>),
    /// `request_headers = { set = {..}, add = {..}, remove = [..] }`: the request sent upstream.
    RequestHeaders(HeaderEdits),
    /// `response_headers = { ... }`: the response sent to the client.
    ResponseHeaders(HeaderEdits),
    /// `respond = { status, body, content_type, headers, switch }`: a fixed answer (a mock, a
    /// maintenance page answered only while its switch is on).
    Respond(RespondConfig),
    // Edge (issue #41 items 5 and 6): request ids, CORS, rewrites, redirects, error pages.
    /// `request_id = { header, trust }`: the request's id, kept from a trusted client or made.
    RequestId(RequestIdConfig),
    /// `cors = { origins, methods, headers, expose, credentials, max_age }`.
    Cors(CorsConfig),
    /// `rewrite = { to, query }`: the path (and query) the handler and the cache key see.
    Rewrite(RewriteConfig),
    /// `strip_prefix = "/api"`: the path without this prefix.
    StripPrefix(StripPrefix),
    /// `redirect = { to, status, query }`.
    Redirect(RedirectRule),
    /// `error_page = { status, file | body, content_type }`: the body of responses with
    /// these statuses replaced.
    ErrorPage(ErrorPageConfig),
    // Limits (issue #41 item 4; docs/rules.md "Limits").
    /// `rate_limit = { rate = "5/s", burst, key, delay, status, fleet, max_keys }` (nginx's
    /// `limit_req`).
    RateLimit(RateLimitConfig),
    /// `in_flight = { max = 10, key }` (nginx's `limit_conn`): requests in flight per key.
    InFlight(InFlightConfig),
    /// `limit_rate = { rate = "100KiB/s", after = "1MiB" }`: bytes per second per response.
    LimitRate(LimitRateConfig),
    /// `max_body = "1MiB"` (nginx's `client_max_body_size`): 413 past it.
    MaxBody(ByteSize),
    // Cache and traffic (config/rules_cache.rs).
    /// `cache_key = { query, keep, drop, headers, cookies }`: the cache key's parts.
    CacheKey(CacheKeyConfig),
    /// `cache_ttl = { status = {..}, min, max }`: lifetimes when the origin gives none, clamps.
    CacheTtl(CacheTtlConfig),
    /// `cache_bypass = true`: not looked up, not stored (passed upstream).
    CacheBypass,
    /// `cache_force = { ttl }`: stored even when the origin says not to.
    CacheForce(CacheForceConfig),
    /// `split = { pools = {..}, sticky, cache }`: a weighted choice between pools.
    Split(SplitConfig),
    /// `mirror = { pool, max_in_flight, timeout, body, max_body }`: a copy of what goes
    /// upstream to a shadow.
    Mirror(MirrorConfig),
    // Access: authentication (config/rules_auth.rs).
    /// `basic_auth = { htpasswd, realm, forward }`: users of an htpasswd file (401 otherwise).
    BasicAuth(BasicAuthConfig),
    /// `api_key = { header | query, keys | keys_file, forward }`: named keys.
    ApiKey(ApiKeyConfig),
    /// `jwt = { secret | public_key | jwks, algorithms, issuer, audience, ... }`: a verified
    /// token, its claims for later rules.
    Jwt(JwtRuleConfig),
    /// `forward_auth = { url, ... }`: an auth service's subrequest decides.
    ForwardAuth(Box<ForwardAuthConfig>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    when: Option<When>,
    #[serde(rename = "use")]
    policy: Option<String>,
    allow: Option<Vec<Cidr>>,
    deny: Option<Vec<Cidr>>,
    request_headers: Option<HeaderEdits>,
    response_headers: Option<HeaderEdits>,
    respond: Option<RespondConfig>,
    // Edge.
    request_id: Option<RequestIdConfig>,
    cors: Option<CorsConfig>,
    rewrite: Option<RewriteConfig>,
    strip_prefix: Option<StripPrefix>,
    redirect: Option<RedirectRule>,
    error_page: Option<ErrorPageConfig>,
    // Limits.
    rate_limit: Option<RateLimitConfig>,
    in_flight: Option<InFlightConfig>,
    limit_rate: Option<LimitRateConfig>,
    max_body: Option<ByteSize>,
    // Cache and traffic.
    cache_key: Option<CacheKeyConfig>,
    cache_ttl: Option<CacheTtlConfig>,
    cache_bypass: Option<bool>,
    cache_force: Option<CacheForceConfig>,
    split: Option<SplitConfig>,
    mirror: Option<MirrorConfig>,
    // Access: authentication.
    basic_auth: Option<BasicAuthConfig>,
    api_key: Option<ApiKeyConfig>,
    jwt: Option<JwtRuleConfig>,
    forward_auth: Option<ForwardAuthConfig>,
}

impl TryFrom<RawRule> for RuleConfig {
    type Error = String;
    fn try_from(r: RawRule) -> Result<Self, String> {
        let mut actions = Vec::new();
        actions.extend(r.policy.map(Action::Use));
        actions.extend(r.allow.map(Action::Allow));
        actions.extend(r.deny.map(Action::Deny));
        actions.extend(r.request_headers.map(Action::RequestHeaders));
        actions.extend(r.response_headers.map(Action::ResponseHeaders));
        actions.extend(r.respond.map(Action::Respond));
        // Edge.
        actions.extend(r.request_id.map(Action::RequestId));
        actions.extend(r.cors.map(Action::Cors));
        actions.extend(r.rewrite.map(Action::Rewrite));
        actions.extend(r.strip_prefix.map(Action::StripPrefix));
        actions.extend(r.redirect.map(Action::Redirect));
        actions.extend(r.error_page.map(Action::ErrorPage));
        // Limits.
        actions.extend(r.rate_limit.map(Action::RateLimit));
        actions.extend(r.in_flight.map(Action::InFlight));
        actions.extend(r.limit_rate.map(Action::LimitRate));
        actions.extend(r.max_body.map(Action::MaxBody));
        // Cache and traffic.
        if r.cache_key.as_ref().is_some_and(CacheKeyConfig::is_empty) {
            return Err(
                "`cache_key` names no part: give `query`, `keep`, `drop`, `headers` or `cookies`"
                    .into(),
            );
        }
        actions.extend(r.cache_key.map(Action::CacheKey));
        actions.extend(r.cache_ttl.map(Action::CacheTtl));
        match r.cache_bypass {
            Some(true) => actions.push(Action::CacheBypass),
            Some(false) => {
                return Err("`cache_bypass = false` does nothing: leave the rule out".into())
            }
            None => {}
        }
        actions.extend(r.cache_force.map(Action::CacheForce));
        actions.extend(r.split.map(Action::Split));
        actions.extend(r.mirror.map(Action::Mirror));
        // Access: authentication.
        actions.extend(r.basic_auth.map(Action::BasicAuth));
        actions.extend(r.api_key.map(Action::ApiKey));
        actions.extend(r.jwt.map(Action::Jwt));
        actions.extend(r.forward_auth.map(|f| Action::ForwardAuth(Box::new(f))));
        if actions.len() != 1 {
            return Err(format!(
                "a rule needs exactly one action ({}), found {}",
                ACTIONS.join(", "),
                actions.len()
            ));
        }
        Ok(RuleConfig {
            name: r.name,
            when: r.when,
            action: actions.pop().expect("one action"),
        })
    }
}

/// The actions' keys, for the error that asks for one.
const ACTIONS: &[&str] = &[
    "use",
    "allow",
    "deny",
    "request_headers",
    "response_headers",
    "respond",
    // Edge.
    "request_id",
    "cors",
    "rewrite",
    "strip_prefix",
    "redirect",
    "error_page",
    // Limits.
    "rate_limit",
    "in_flight",
    "limit_rate",
    "max_body",
    // Cache and traffic.
    "cache_key",
    "cache_ttl",
    "cache_bypass",
    "cache_force",
    "split",
    "mirror",
    // Access: authentication.
    "basic_auth",
    "api_key",
    "jwt",
    "forward_auth",
];

impl Action {
    /// The action's key in the file: a rule's name when it has none.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Use(_) => "use",
            Action::Allow(_) => "allow",
            Action::Deny(_) => "deny",
            Action::RequestHeaders(_) => "request_headers",
            Action::ResponseHeaders(_) => "response_headers",
            Action::Respond(_) => "respond",
            // Edge.
            Action::RequestId(_) => "request_id",
            Action::Cors(_) => "cors",
            Action::Rewrite(_) => "rewrite",
            Action::StripPrefix(_) => "strip_prefix",
            Action::Redirect(_) => "redirect",
            Action::ErrorPage(_) => "error_page",
            // Limits.
            Action::RateLimit(_) => "rate_limit",
            Action::InFlight(_) => "in_flight",
            Action::LimitRate(_) => "limit_rate",
            Action::MaxBody(_) => "max_body",
            // Cache and traffic.
            Action::CacheKey(_) => "cache_key",
            Action::CacheTtl(_) => "cache_ttl",
            Action::CacheBypass => "cache_bypass",
            Action::CacheForce(_) => "cache_force",
            Action::Split(_) => "split",
            Action::Mirror(_) => "mirror",
            // Access: authentication.
            Action::BasicAuth(_) => "basic_auth",
            Action::ApiKey(_) => "api_key",
            Action::Jwt(_) => "jwt",
            Action::ForwardAuth(_) => "forward_auth",
        }
    }
}

impl Action {
    /// The templates the action renders (their named captures are checked against the rule's
    /// path patterns).
    pub fn templates(&self) -> Vec<&Template> {
        match self {
            Action::RequestHeaders(e) | Action::ResponseHeaders(e) => {
                e.set.values().chain(e.add.values()).collect()
            }
            // Edge.
            Action::Rewrite(r) => vec![&r.to],
            Action::Redirect(r) => vec![&r.to],
            // Limits.
            Action::RateLimit(RateLimitConfig {
                key: LimitKey::Template(t),
                ..
            })
            | Action::InFlight(InFlightConfig {
                key: LimitKey::Template(t),
                ..
            }) => vec![t],
            _ => Vec::new(),
        }
    }
}

impl Expanded<'_> {
    /// A template's `${name}` that no path pattern of the rule's conditions captures.
    pub fn unknown_capture(&self) -> Option<String> {
        let whens = self.outer.iter().copied().chain(self.rule.when.as_ref());
        let mut names = Vec::new();
        for w in whens {
            if let Some(p) = &w.path_regex {
                names.extend(p.regex.capture_names().flatten());
            }
        }
        for t in self.rule.action.templates() {
            for p in &t.parts {
                if let Piece::Var(Var::Named(n)) = p {
                    if !names.contains(&n.as_str()) {
                        return Some(format!(
                            "`${n}` is neither a variable nor a named group of the rule's `path_regex` (`{}`)",
                            t.source
                        ));
                    }
                }
            }
        }
        None
    }
}

impl RuleConfig {
    /// The rule's name, or its action's kind.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(self.action.kind())
    }
}

/// When a rule applies: every condition given holds (each list: any of its entries).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    /// Any of these methods (`["GET", "HEAD"]`).
    #[serde(default)]
    pub method: Vec<Method>,
    /// A glob on the path (`/old/*`: `*` within a segment, `**` across segments); its `*`s
    /// are captured (`$1`, ...).
    pub path: Option<Glob>,
    /// A regular expression on the path (`^/old/(?<rest>.*)$`); its groups are captured (`$1`,
    /// `${rest}`).
    pub path_regex: Option<Pattern>,
    /// Any of these hosts (`example.com`, `*.example.com`).
    #[serde(default)]
    pub host: Vec<HostPattern>,
    /// Request header fields: name = value (`"*"`: present with any value; `"~REGEX"`; a glob).
    #[serde(default)]
    pub header: BTreeMap<FieldName, ValueMatch>,
    /// Query parameters, the same way.
    #[serde(default)]
    pub query: BTreeMap<String, ValueMatch>,
    /// Cookies, the same way.
    #[serde(default)]
    pub cookie: BTreeMap<String, ValueMatch>,
    /// The client's address is in any of these networks.
    #[serde(default)]
    pub client: Vec<Cidr>,
    /// None of these conditions hold (all of them together fail).
    pub not: Option<Box<When>>,
}

/// A request method (an RFC 9110 token, upper case as sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Method(pub http::Method);

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !is_token(&s) {
            return Err(de::Error::custom(format!("`{s}` is not a method")));
        }
        http::Method::from_bytes(s.to_ascii_uppercase().as_bytes())
            .map(Method)
            .map_err(|_| de::Error::custom(format!("`{s}` is not a method")))
    }
}

/// A header field's name, lower case (a map key in the file).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldName(pub String);

impl FieldName {
    /// As an http header name (checked when parsed).
    pub fn header(&self) -> http::HeaderName {
        http::HeaderName::from_bytes(self.0.as_bytes()).expect("checked when parsed")
    }
}

impl<'de> Deserialize<'de> for FieldName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderName::from_bytes(s.as_bytes())
            .map(|h| FieldName(h.as_str().to_string()))
            .map_err(|_| de::Error::custom(format!("`{s}` is not a valid header name")))
    }
}

/// A regular expression, compiled when the configuration is read (a bad one is an error naming
/// its key and line). Equal when written the same.
#[derive(Clone)]
pub struct Pattern {
    pub source: String,
    pub regex: regex::Regex,
}

impl Pattern {
    pub fn new(source: &str) -> Result<Pattern, String> {
        let regex = regex::RegexBuilder::new(source)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| format!("`{source}` is not a valid regular expression: {e}"))?;
        Ok(Pattern {
            source: source.to_string(),
            regex,
        })
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.source == other.source
    }
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.source)
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Pattern::new(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// A glob: `*` matches within one path segment (not `/`), `**` matches anything, `?` one
/// character but `/`; everything else literally. Each `*`/`**`/`?` is a capture (`$1`...).
/// Compiled to an anchored regular expression.
#[derive(Debug, Clone, PartialEq)]
pub struct Glob(pub Pattern);

impl Glob {
    /// `segments`: whether `*` stops at `/` (paths) or not (header values, cookies).
    pub fn new(glob: &str, segments: bool) -> Result<Glob, String> {
        let (one, any) = if segments {
            ("([^/]*)", "([^/])")
        } else {
            ("(.*)", "(.)")
        };
        let mut re = String::from("^");
        let mut chars = glob.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '*' if chars.peek() == Some(&'*') => {
                    chars.next();
                    re.push_str("(.*)");
                }
                '*' => re.push_str(one),
                '?' => re.push_str(any),
                c => re.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
            }
        }
        re.push('$');
        let mut p = Pattern::new(&re)?;
        p.source = glob.to_string();
        Ok(Glob(p))
    }
}

impl<'de> Deserialize<'de> for Glob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !s.starts_with('/') {
            return Err(de::Error::custom(format!(
                "`{s}` is not a path glob: it starts with `/` (`/old/*`)"
            )));
        }
        Glob::new(&s, true).map_err(de::Error::custom)
    }
}

/// How a header, query parameter or cookie value is matched.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueMatch {
    /// `"*"`: present, with any value.
    Present,
    /// A value without `*` or `?`: exactly this.
    Exact(String),
    /// A value with `*` (any characters) or `?`.
    Glob(Glob),
    /// `"~REGEX"`: a regular expression (unanchored, as nginx's `~`).
    Regex(Pattern),
}

impl<'de> Deserialize<'de> for ValueMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "*" {
            Ok(ValueMatch::Present)
        } else if let Some(re) = s.strip_prefix('~') {
            Pattern::new(re)
                .map(ValueMatch::Regex)
                .map_err(de::Error::custom)
        } else if s.contains(['*', '?']) {
            Glob::new(&s, false)
                .map(ValueMatch::Glob)
                .map_err(de::Error::custom)
        } else {
            Ok(ValueMatch::Exact(s))
        }
    }
}

/// Header edits: set (replace), add (append), remove; values are templates.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderEdits {
    #[serde(default)]
    pub set: BTreeMap<FieldName, Template>,
    #[serde(default)]
    pub add: BTreeMap<FieldName, Template>,
    #[serde(default)]
    pub remove: Vec<FieldName>,
}

/// Text with variables, nginx's way: `$name` or `${name}`; `$$` is a `$`. Parsed when the
/// configuration is read: an unknown variable is an error naming its key and line.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub source: String,
    pub parts: Vec<Piece>,
}

/// A piece of a [`Template`].
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Var(Var),
}

/// The variables a template may name (nginx's names where nginx has one).
#[derive(Debug, Clone, PartialEq)]
pub enum Var {
    /// `$1`..`$9`: a capture of the last path pattern that matched (`$0`: the whole match).
    Capture(usize),
    /// `${name}`: a named capture.
    Named(String),
    /// `$remote_addr`: the client's address (the real one behind trusted proxies).
    RemoteAddr,
    /// `$host`: the request's host, without a port.
    Host,
    /// `$uri`: the path (after rewrites).
    Uri,
    /// `$args`: the query, without `?`.
    Args,
    /// `$request_uri`: the path and query as the client sent them (after rewrites here).
    RequestUri,
    /// `$scheme`: `http` or `https`.
    Scheme,
    /// `$request_method`.
    Method,
    /// `$request_id`: the request's id (a `request_id` rule gives it).
    RequestId,
    /// `$http_NAME`: a request header (`_` for `-`).
    Header(String),
    /// `$cookie_NAME`.
    Cookie(String),
    /// `$arg_NAME`: a query parameter.
    Arg(String),
    /// `$jwt_claim_NAME`: a claim of the verified token (a `jwt` rule verifies it).
    Claim(String),
}

impl Var {
    fn parse(name: &str) -> Result<Var, String> {
        if let Ok(n) = name.parse::<usize>() {
            return if n <= 9 {
                Ok(Var::Capture(n))
            } else {
                Err(format!(
                    "`${name}`: captures go from $0 to $9 (use a named group)"
                ))
            };
        }
        let prefixed = |p: &str| name.strip_prefix(p).filter(|r| !r.is_empty());
        Ok(match name {
            "remote_addr" => Var::RemoteAddr,
            "host" => Var::Host,
            "uri" => Var::Uri,
            "args" | "query_string" => Var::Args,
            "request_uri" => Var::RequestUri,
            "scheme" => Var::Scheme,
            "request_method" => Var::Method,
            "request_id" => Var::RequestId,
            _ => {
                if let Some(h) = prefixed("http_") {
                    Var::Header(h.replace('_', "-").to_ascii_lowercase())
                } else if let Some(c) = prefixed("cookie_") {
                    Var::Cookie(c.to_string())
                } else if let Some(a) = prefixed("arg_") {
                    Var::Arg(a.to_string())
                } else if let Some(c) = prefixed("jwt_claim_") {
                    Var::Claim(c.to_string())
                } else if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    && name.starts_with(|c: char| c.is_ascii_alphabetic())
                {
                    Var::Named(name.to_string())
                } else {
                    return Err(format!("`${name}` is not a variable"));
                }
            }
        })
    }
}

impl Template {
    pub fn parse(s: &str) -> Result<Template, String> {
        if s.contains(['\r', '\n', '\0']) {
            return Err(format!("{s:?} holds a line break or NUL"));
        }
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(i) = rest.find('$') {
            text.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            let (name, after) = if rest.starts_with('$') {
                text.push('$');
                rest = &rest[1..];
                continue;
            } else if let Some(braced) = rest.strip_prefix('{') {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("`{s}`: `${{` without its `}}`"))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                // `$1abc` is `$1` then `abc`, as in nginx.
                let end = if rest.starts_with(|c: char| c.is_ascii_digit()) {
                    1.min(end)
                } else {
                    end
                };
                (&rest[..end], &rest[end..])
            };
            if name.is_empty() {
                return Err(format!(
                    "`{s}`: a `$` names no variable (write `$$` for a `$`)"
                ));
            }
            if !text.is_empty() {
                parts.push(Piece::Text(std::mem::take(&mut text)));
            }
            parts.push(Piece::Var(Var::parse(name)?));
            rest = after;
        }
        text.push_str(rest);
        if !text.is_empty() {
            parts.push(Piece::Text(text));
        }
        Ok(Template {
            source: s.to_string(),
            parts,
        })
    }

    /// Whether the template names a variable (else its text is all there is).
    pub fn is_plain(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Piece::Text(_)))
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Template::parse(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// The named policies: `[[policy.NAME]]`.
pub type Policies = BTreeMap<String, Vec<RuleConfig>>;

/// A rule as it runs on a route: the conditions of each `use` that led to it (outermost
/// first) and the rule itself (never a `use`).
pub struct Expanded<'a> {
    pub outer: Vec<&'a When>,
    pub rule: &'a RuleConfig,
}

/// The most rules a route runs, its policies' included (a request holds a bit for each).
pub const MAX_RULES: usize = 64;

/// A route's rules with every `use` replaced by the policy's rules, in order. An error (for the
/// configuration's checks to blame the rule's key) when a policy is unknown, uses itself, or
/// the route would run more than [`MAX_RULES`].
pub fn expand<'a>(
    rules: &'a [RuleConfig],
    policies: &'a Policies,
) -> Result<Vec<Expanded<'a>>, (usize, String)> {
    let mut out = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        walk(r, policies, &mut Vec::new(), &mut Vec::new(), &mut out).map_err(|e| (i, e))?;
    }
    for e in &out {
        if let Some(why) = e.unknown_capture() {
            let i = rules
                .iter()
                .position(|r| std::ptr::eq(r, e.rule))
                .unwrap_or(0);
            return Err((i, why));
        }
    }
    if out.len() > MAX_RULES {
        return Err((
            rules.len() - 1,
            format!(
                "the route runs {} rules with its policies: at most {MAX_RULES}",
                out.len()
            ),
        ));
    }
    Ok(out)
}

fn walk<'a>(
    r: &'a RuleConfig,
    policies: &'a Policies,
    outer: &mut Vec<&'a When>,
    using: &mut Vec<&'a str>,
    out: &mut Vec<Expanded<'a>>,
) -> Result<(), String> {
    let Action::Use(name) = &r.action else {
        out.push(Expanded {
            outer: outer.clone(),
            rule: r,
        });
        return Ok(());
    };
    let Some(policy) = policies.get(name) else {
        let known: Vec<&str> = policies.keys().map(String::as_str).collect();
        return Err(format!(
            "uses the policy `{name}`, which is not defined (defined: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ));
    };
    if using.contains(&name.as_str()) {
        return Err(format!(
            "the policy `{name}` uses itself ({} -> {name})",
            using.join(" -> ")
        ));
    }
    using.push(name);
    let pushed = r.when.as_ref().map(|w| outer.push(w)).is_some();
    for p in policy {
        walk(p, policies, outer, using, out)?;
    }
    if pushed {
        outer.pop();
    }
    using.pop();
    Ok(())
}

// Edge (issue #41 items 5 and 6): request ids, CORS, rewrites, redirects, error pages; the
// steps are in src/rules/{request_id,cors,rewrite,redirect,error_page}.rs.

/// `request_id = { header = "x-request-id", trust = false | true | ["10.0.0.0/8"] }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestIdConfig {
    /// The field the id is read from (trusted clients), sent upstream in and returned in.
    #[serde(default = "RequestIdConfig::default_header")]
    pub header: FieldName,
    /// Whose id is kept: nobody's (`false`, the default), everybody's (`true`), or clients in
    /// these networks.
    #[serde(default)]
    pub trust: Trust,
}

impl RequestIdConfig {
    fn default_header() -> FieldName {
        FieldName("x-request-id".into())
    }
}

/// Whose word is taken: `false`, `true` or a list of networks.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Trust {
    #[default]
    Nobody,
    Everybody,
    Networks(Vec<Cidr>),
}

impl Trust {
    /// Whether a client at `ip` is trusted.
    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        match self {
            Trust::Nobody => false,
            Trust::Everybody => true,
            Trust::Networks(nets) => nets.iter().any(|n| n.contains(ip)),
        }
    }
}

impl<'de> Deserialize<'de> for Trust {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            All(bool),
            Nets(Vec<String>),
        }
        match Raw::deserialize(d).map_err(|_| {
            de::Error::custom("expected `true`, `false` or a list of networks ([\"10.0.0.0/8\"])")
        })? {
            Raw::All(false) => Ok(Trust::Nobody),
            Raw::All(true) => Ok(Trust::Everybody),
            Raw::Nets(nets) => (nets.iter())
                .map(|n| n.parse::<Cidr>())
                .collect::<Result<Vec<_>, _>>()
                .map(Trust::Networks)
                .map_err(de::Error::custom),
        }
    }
}

/// `cors = { ... }`: the CORS protocol (the Fetch standard's) answered at the edge.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawCors")]
pub struct CorsConfig {
    /// The allowed origins (`https://app.example`), or None for any (`"*"`).
    pub origins: Option<Vec<String>>,
    pub methods: Vec<Method>,
    pub headers: Vec<FieldName>,
    pub expose: Vec<FieldName>,
    pub credentials: bool,
    pub max_age: Option<Dur<0, { 24 * HOUR_MS }>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCors {
    origins: Origins,
    #[serde(default = "RawCors::default_methods")]
    methods: Vec<Method>,
    #[serde(default)]
    headers: Vec<FieldName>,
    #[serde(default)]
    expose: Vec<FieldName>,
    #[serde(default)]
    credentials: bool,
    max_age: Option<Dur<0, { 24 * HOUR_MS }>>,
}

impl RawCors {
    fn default_methods() -> Vec<Method> {
        ["GET", "HEAD", "POST"]
            .iter()
            .map(|m| Method(http::Method::from_bytes(m.as_bytes()).expect("a method")))
            .collect()
    }
}

/// `"*"` or a list of origins.
#[derive(Deserialize)]
#[serde(untagged)]
enum Origins {
    One(String),
    List(Vec<String>),
}

impl TryFrom<RawCors> for CorsConfig {
    type Error = String;
    fn try_from(r: RawCors) -> Result<Self, String> {
        let list = match r.origins {
            Origins::One(s) => vec![s],
            Origins::List(l) => l,
        };
        let origins = if list.iter().any(|o| o == "*") {
            if list.len() > 1 {
                return Err("`origins`: `\"*\"` stands alone (any origin)".into());
            }
            if r.credentials {
                return Err(
                    "`origins = \"*\"` with `credentials = true`: browsers refuse credentialed \
                     answers for any origin; list the origins"
                        .into(),
                );
            }
            None
        } else {
            if list.is_empty() {
                return Err("`origins` is empty: no origin would be allowed".into());
            }
            for o in &list {
                check_origin(o)?;
            }
            Some(list)
        };
        if r.methods.is_empty() {
            return Err("`methods` is empty: no preflight would pass".into());
        }
        Ok(CorsConfig {
            origins,
            methods: r.methods,
            headers: r.headers,
            expose: r.expose,
            credentials: r.credentials,
            max_age: r.max_age,
        })
    }
}

/// An origin as browsers send it (RFC 6454): `scheme://host[:port]`, lower case, no path.
fn check_origin(o: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "`{o}` is not an origin ({why}; write `https://app.example` or `http://localhost:3000`)"
        ))
    };
    let Some((scheme, rest)) = o.split_once("://") else {
        return bad("no scheme");
    };
    if scheme.is_empty()
        || !scheme
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
    {
        return bad("the scheme is lower-case letters");
    }
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return bad("an origin has no path, query or user");
    }
    if rest
        .bytes()
        .any(|b| b.is_ascii_uppercase() || !b.is_ascii_graphic())
    {
        return bad("browsers send the host in lower case");
    }
    Ok(())
}

/// `rewrite = { to = "/v2/$1", query = "keep" }` (nginx's `rewrite ... break`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRewrite")]
pub struct RewriteConfig {
    /// The new path, possibly with a query (`/search?q=$1`).
    pub to: Template,
    pub query: QueryMode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRewrite {
    to: Template,
    #[serde(default)]
    query: QueryMode,
}

impl TryFrom<RawRewrite> for RewriteConfig {
    type Error = String;
    fn try_from(r: RawRewrite) -> Result<Self, String> {
        match r.to.parts.first() {
            Some(Piece::Text(t)) if t.starts_with('/') => {}
            Some(Piece::Var(Var::Capture(_) | Var::Named(_) | Var::Uri | Var::RequestUri)) => {}
            _ => {
                return Err(format!(
                    "`to = \"{}\"`: a rewrite's target is a path (starts with `/`)",
                    r.to.source
                ))
            }
        }
        Ok(RewriteConfig {
            to: r.to,
            query: r.query,
        })
    }
}

/// What becomes of the request's query: kept (appended after the target's own, if it has
/// one) or dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryMode {
    #[default]
    Keep,
    Drop,
}

/// `strip_prefix = "/api"`: a path prefix (starts with `/`; a trailing `/` is ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripPrefix(pub String);

impl<'de> Deserialize<'de> for StripPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let p = s.trim_end_matches('/');
        if !s.starts_with('/') || p.is_empty() {
            return Err(de::Error::custom(format!(
                "`{s}` is not a prefix to strip (write `/api`)"
            )));
        }
        if s.contains(['?', '#', ' ']) {
            return Err(de::Error::custom(format!(
                "`{s}`: a path prefix, without query"
            )));
        }
        Ok(StripPrefix(p.to_string()))
    }
}

/// `redirect = { to = "/new/$1", status = 301, query = "keep" }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedirectRule {
    /// The `Location`: a path or an absolute URL, with variables.
    pub to: Template,
    /// 301 (the default), 302, 303, 307 or 308.
    #[serde(default = "RedirectRule::default_status")]
    pub status: RedirectStatus,
    /// The request's query appended (`keep`, the default) or not; never when `to` names
    /// `$request_uri` or `$args`, which hold it already.
    #[serde(default)]
    pub query: QueryMode,
}

impl RedirectRule {
    fn default_status() -> RedirectStatus {
        RedirectStatus(301)
    }
}

/// A redirect's status: 301, 302, 303, 307 or 308.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedirectStatus(pub u16);

impl<'de> Deserialize<'de> for RedirectStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        match n {
            301 | 302 | 303 | 307 | 308 => Ok(RedirectStatus(n as u16)),
            _ => Err(de::Error::custom(format!(
                "{n} is not a redirect status (301, 302, 303, 307 or 308)"
            ))),
        }
    }
}

/// The largest error page larder holds (in memory, for every response it replaces).
pub const MAX_ERROR_PAGE: usize = 1 << 20;

/// `error_page = { status = [404, 502], file = "errors/50x.html" | body = "...",
/// content_type = "text/html; charset=utf-8" }`. A `file` is read when the configuration is
/// (a relative path from the working directory), at most [`MAX_ERROR_PAGE`] bytes: a missing
/// one is an error naming the key and line, and a reload reads it again.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawErrorPage")]
pub struct ErrorPageConfig {
    pub status: Vec<u16>,
    /// The file it was read from, if any.
    pub file: Option<std::path::PathBuf>,
    pub body: String,
    pub content_type: super::headers::HeaderValueCfg,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawErrorPage {
    status: StatusList,
    file: Option<std::path::PathBuf>,
    body: Option<String>,
    content_type: Option<super::headers::HeaderValueCfg>,
}

/// One status or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum StatusList {
    One(i64),
    List(Vec<i64>),
}

impl TryFrom<RawErrorPage> for ErrorPageConfig {
    type Error = String;
    fn try_from(r: RawErrorPage) -> Result<Self, String> {
        let status = match r.status {
            StatusList::One(n) => vec![n],
            StatusList::List(l) => l,
        };
        if status.is_empty() {
            return Err("`status` is empty: no response would get the page".into());
        }
        let status = (status.into_iter())
            .map(|n| match n {
                400..=599 => Ok(n as u16),
                _ => Err(format!("{n}: error pages are for statuses 400 to 599")),
            })
            .collect::<Result<Vec<u16>, String>>()?;
        let body = match (&r.file, r.body) {
            (Some(_), Some(_)) => return Err("`file` or `body`, not both".into()),
            (None, None) => return Err("needs `file` or `body`".into()),
            (None, Some(b)) if b.len() > MAX_ERROR_PAGE => {
                return Err(format!(
                    "`body` is larger than {} KiB",
                    MAX_ERROR_PAGE >> 10
                ))
            }
            (None, Some(b)) => b,
            (Some(f), None) => read_page(f)?,
        };
        let content_type = r.content_type.unwrap_or(super::headers::HeaderValueCfg(
            http::HeaderValue::from_static("text/html; charset=utf-8"),
        ));
        Ok(ErrorPageConfig {
            status,
            file: r.file,
            body,
            content_type,
        })
    }
}

/// An error page's file: a regular file of at most [`MAX_ERROR_PAGE`] bytes, UTF-8.
fn read_page(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let shown = if path.is_relative() {
        let cwd = std::env::current_dir().unwrap_or_default();
        format!(
            "{} (relative to the working directory, {})",
            path.display(),
            cwd.display()
        )
    } else {
        path.display().to_string()
    };
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    let mut text = String::new();
    (std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?)
        .take(MAX_ERROR_PAGE as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{shown}: {e}"))?;
    if text.len() > MAX_ERROR_PAGE {
        return Err(format!(
            "{shown} is larger than {} KiB",
            MAX_ERROR_PAGE >> 10
        ));
    }
    Ok(text)
}

// Limits (issue #41 item 4): the rules that take a key; the rest is in `rules_limits.rs`.

/// What a limit counts requests by.
#[derive(Debug, Clone, PartialEq)]
pub enum LimitKey {
    /// `"client"`: the client's address (the real one behind trusted proxies).
    Client,
    /// `"header:NAME"`: a request header's value.
    Header(FieldName),
    /// `"claim:NAME"`: a claim of the verified token (a `jwt` rule verifies it).
    Claim(String),
    /// `"api_key"`: the API key an `api_key` rule accepted (its note `api_key`).
    ApiKey,
    /// `"cookie:NAME"`.
    Cookie(String),
    /// `"$..."`: a template (`"$http_x_tenant:$arg_plan"`); empty when rendered: missing.
    Template(Template),
}

impl<'de> Deserialize<'de> for LimitKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let named = |p: &str| s.strip_prefix(p).filter(|r| !r.is_empty());
        if s == "client" {
            Ok(LimitKey::Client)
        } else if s == "api_key" {
            Ok(LimitKey::ApiKey)
        } else if let Some(h) = named("header:") {
            FieldName::deserialize(de::value::StrDeserializer::<D::Error>::new(h))
                .map(LimitKey::Header)
        } else if let Some(c) = named("claim:") {
            Ok(LimitKey::Claim(c.to_string()))
        } else if let Some(c) = named("cookie:") {
            Ok(LimitKey::Cookie(c.to_string()))
        } else if s.contains('$') {
            Template::parse(&s)
                .map(LimitKey::Template)
                .map_err(de::Error::custom)
        } else {
            Err(de::Error::custom(format!(
                "`{s}` is not a limit key: \"client\", \"header:NAME\", \"claim:NAME\", \"api_key\", \"cookie:NAME\" or a template with `$`"
            )))
        }
    }
}

/// `rate_limit = { ... }`: requests per key at most at `rate`, with `burst` more at once
/// (GCRA: a bucket of `count + burst` requests refilled at `rate`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    pub rate: Rate,
    /// Requests beyond the rate's count that may come at once (rejected, or delayed with
    /// `delay`).
    #[serde(default = "no_burst")]
    pub burst: Bounded<0, 1_000_000_000>,
    #[serde(default = "client_key")]
    pub key: LimitKey,
    #[serde(default)]
    pub missing: Missing,
    /// Requests beyond the rate's count, within the burst, wait their turn instead of being
    /// answered (nginx's `delay`); without it they pass at once (`nodelay`).
    #[serde(default)]
    pub delay: bool,
    #[serde(default)]
    pub status: LimitStatus,
    /// Decided in the fleet's Redis (`[cache.shared]`), for every node together.
    #[serde(default)]
    pub fleet: bool,
    #[serde(default = "default_max_keys")]
    pub max_keys: MaxKeys,
}

/// `in_flight = { max = 10, key }`: requests of one key being served at once.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InFlightConfig {
    pub max: Bounded<1, 1_000_000_000>,
    #[serde(default = "client_key")]
    pub key: LimitKey,
    #[serde(default)]
    pub missing: Missing,
    #[serde(default)]
    pub status: LimitStatus,
}

fn client_key() -> LimitKey {
    LimitKey::Client
}

fn no_burst() -> Bounded<0, 1_000_000_000> {
    Bounded(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_known_variables() {
        let t = Template::parse("/new/$1?x=${rest}&ip=$remote_addr$$").unwrap();
        assert_eq!(
            t.parts,
            vec![
                Piece::Text("/new/".into()),
                Piece::Var(Var::Capture(1)),
                Piece::Text("?x=".into()),
                Piece::Var(Var::Named("rest".into())),
                Piece::Text("&ip=".into()),
                Piece::Var(Var::RemoteAddr),
                Piece::Text("$".into()),
            ]
        );
        assert_eq!(
            Template::parse("$http_x_api_key").unwrap().parts,
            vec![Piece::Var(Var::Header("x-api-key".into()))]
        );
        assert!(Template::parse("$").is_err());
        assert!(Template::parse("${rest").is_err());
        assert!(Template::parse("a\r\nb").is_err());
        assert!(Template::parse("$12").unwrap().parts.len() == 2);
    }

    #[test]
    fn globs_capture_their_stars() {
        let g = Glob::new("/old/**", true).unwrap();
        let c = g.0.regex.captures("/old/a/b").unwrap();
        assert_eq!(&c[1], "a/b");
        let g = Glob::new("/api/*/items", true).unwrap();
        assert!(g.0.regex.is_match("/api/v1/items"));
        assert!(!g.0.regex.is_match("/api/v1/x/items"));
        assert!(!g.0.regex.is_match("/api/v1/items/3"));
        let g = Glob::new("/a.b", true).unwrap();
        assert!(!g.0.regex.is_match("/aXb"));
    }
}
