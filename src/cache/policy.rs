//! The caching policy: what may be stored, for how long, and whether a stored response may answer a
//! request. Every rule of RFC 9111 that larder applies lives here, with its section cited; the
//! proxy only asks questions of this module and acts on the typed answers.
//!
//! - [`CacheControl`] parses the Cache-Control field (§5.2) once, robustly.
//! - [`storability`] decides at fill time (§3, §3.5, §4.2.1, §4.2.2) and yields a [`Freshness`].
//! - [`Freshness::current_age`] computes Age per §4.2.3.
//! - [`RequestDirectives`] reads the request's directives (§5.2.1) for the lookup decision.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};

use crate::config::rules_cache::CacheTtlConfig;
use crate::config::CacheConfig;
use crate::http::date;

/// Seconds value used for "infinite" directive values and overflow (§1.2.2: 2^31).
const DELTA_MAX: u64 = 2_147_483_648;

/// Parsed Cache-Control directives (request or response), §5.2.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CacheControl {
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub max_stale: Option<u64>,
    pub min_fresh: Option<u64>,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
    pub no_store: bool,
    pub no_cache: bool,
    /// `no-cache="a, b"`: these fields must not be reused without revalidation.
    pub no_cache_fields: Vec<HeaderName>,
    pub private: bool,
    /// `private="a, b"`: these fields must not be stored by a shared cache.
    pub private_fields: Vec<HeaderName>,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub no_transform: bool,
    pub only_if_cached: bool,
    pub immutable: bool,
    pub must_understand: bool,
    /// Invalid values seen (a directive with a bad argument is treated conservatively).
    pub invalid_max_age: bool,
}

impl CacheControl {
    /// Parses every field line of `name` in `headers` as one comma-separated list.
    pub fn from_headers(headers: &HeaderMap, name: &HeaderName) -> Self {
        let mut cc = CacheControl::default();
        for value in headers.get_all(name) {
            if let Ok(s) = value.to_str() {
                cc.parse_into(s);
            }
        }
        cc
    }

    /// Parses a targeted field (RFC 9213 §2.1): a Structured Field Dictionary (RFC 9651). A
    /// field that is not a valid Dictionary, or whose known directives have the wrong type
    /// (`max-age="60"`, `no-store=1`), is ignored as a whole: None, so the next targeted field
    /// or Cache-Control applies. Absent: None.
    pub fn from_targeted(headers: &HeaderMap, name: &HeaderName) -> Option<Self> {
        use sfv::{BareItem, ListEntry};
        let mut lines = headers.get_all(name).iter().peekable();
        lines.peek()?;
        let mut dict = sfv::Dictionary::new();
        for line in lines {
            sfv::Parser::new(line.as_bytes())
                .parse_dictionary_with_visitor(&mut dict)
                .ok()?;
        }
        let mut cc = CacheControl::default();
        for (key, entry) in &dict {
            let seconds = || match entry {
                ListEntry::Item(i) => match &i.bare_item {
                    BareItem::Integer(n) => u64::try_from(i64::from(*n)).ok(),
                    _ => None,
                },
                ListEntry::InnerList(_) => None,
            };
            let flag =
                || matches!(entry, ListEntry::Item(i) if i.bare_item == BareItem::Boolean(true));
            // `private` and `no-cache` may name fields: an inner list of strings or tokens.
            let fields = || -> Option<Vec<HeaderName>> {
                match entry {
                    ListEntry::InnerList(l) => l
                        .items
                        .iter()
                        .map(|i| {
                            let n = match &i.bare_item {
                                BareItem::String(s) => s.as_str(),
                                BareItem::Token(t) => t.as_str(),
                                _ => return None,
                            };
                            HeaderName::from_bytes(n.as_bytes()).ok()
                        })
                        .collect(),
                    _ => flag().then(Vec::new),
                }
            };
            match key.as_str() {
                "max-age" => cc.max_age = Some(seconds()?.min(DELTA_MAX)),
                "s-maxage" => cc.s_maxage = Some(seconds()?.min(DELTA_MAX)),
                "stale-while-revalidate" => cc.stale_while_revalidate = Some(seconds()?),
                "stale-if-error" => cc.stale_if_error = Some(seconds()?),
                "no-store" | "public" | "must-revalidate" | "proxy-revalidate" | "no-transform"
                | "immutable" | "must-understand" => {
                    if !flag() {
                        return None;
                    }
                    *match key.as_str() {
                        "no-store" => &mut cc.no_store,
                        "public" => &mut cc.public,
                        "must-revalidate" => &mut cc.must_revalidate,
                        "proxy-revalidate" => &mut cc.proxy_revalidate,
                        "no-transform" => &mut cc.no_transform,
                        "immutable" => &mut cc.immutable,
                        _ => &mut cc.must_understand,
                    } = true;
                }
                "private" => {
                    let f = fields()?;
                    cc.private |= f.is_empty();
                    cc.private_fields.extend(f);
                }
                "no-cache" => {
                    let f = fields()?;
                    cc.no_cache |= f.is_empty();
                    cc.no_cache_fields.extend(f);
                }
                // Directives larder does not know are ignored (RFC 9111 §5.2.3).
                _ => {}
            }
        }
        Some(cc)
    }

    /// Whether any field line of `name` is present.
    pub fn present(headers: &HeaderMap, name: &HeaderName) -> bool {
        headers.contains_key(name)
    }

    fn parse_into(&mut self, s: &str) {
        for item in split_list(s) {
            let (name, arg) = match item.split_once('=') {
                Some((n, a)) => (n.trim(), Some(unquote(a.trim()))),
                None => (item.trim(), None),
            };
            // Lowered on the stack: every known directive is shorter than 24 bytes (a longer
            // name is an extension, ignored).
            let mut lowered = [0u8; 24];
            let Some(buf) = lowered.get_mut(..name.len()) else {
                continue;
            };
            buf.copy_from_slice(name.as_bytes());
            buf.make_ascii_lowercase();
            match std::str::from_utf8(buf).unwrap_or("") {
                "max-age" => {
                    // §4.2.1: with duplicates, use the first... but conflicting values make the
                    // response stale; we keep the smallest, which is the conservative reading.
                    match arg.as_deref().and_then(parse_delta) {
                        Some(v) => self.max_age = Some(self.max_age.map_or(v, |o| o.min(v))),
                        None => self.invalid_max_age = true,
                    }
                }
                "s-maxage" => {
                    if let Some(v) = arg.as_deref().and_then(parse_delta) {
                        self.s_maxage = Some(self.s_maxage.map_or(v, |o| o.min(v)));
                    } else {
                        self.invalid_max_age = true;
                    }
                }
                "max-stale" => {
                    // Without a value, any staleness is accepted.
                    self.max_stale =
                        Some(arg.as_deref().and_then(parse_delta).unwrap_or(DELTA_MAX));
                }
                "min-fresh" => self.min_fresh = arg.as_deref().and_then(parse_delta),
                "stale-while-revalidate" => {
                    self.stale_while_revalidate = arg.as_deref().and_then(parse_delta)
                }
                "stale-if-error" => self.stale_if_error = arg.as_deref().and_then(parse_delta),
                "no-store" => self.no_store = true,
                "no-cache" => match arg {
                    Some(fields) if !fields.trim().is_empty() => {
                        self.no_cache_fields.extend(parse_field_names(&fields))
                    }
                    _ => self.no_cache = true,
                },
                "private" => match arg {
                    Some(fields) if !fields.trim().is_empty() => {
                        self.private_fields.extend(parse_field_names(&fields))
                    }
                    _ => self.private = true,
                },
                "public" => self.public = true,
                "must-revalidate" => self.must_revalidate = true,
                "proxy-revalidate" => self.proxy_revalidate = true,
                "no-transform" => self.no_transform = true,
                "only-if-cached" => self.only_if_cached = true,
                "immutable" => self.immutable = true,
                "must-understand" => self.must_understand = true,
                _ => {}
            }
        }
    }
}

/// Splits a list on commas that are not inside a quoted string.
fn split_list(s: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        let s = rest?;
        let mut in_quotes = false;
        let mut escaped = false;
        for (i, c) in s.bytes().enumerate() {
            match c {
                _ if escaped => escaped = false,
                b'\\' if in_quotes => escaped = true,
                b'"' => in_quotes = !in_quotes,
                b',' if !in_quotes => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
    .filter(|i| !i.trim().is_empty())
}

fn unquote(s: &str) -> String {
    if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') {
        let inner = &s[1..s.len() - 1];
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else {
                out.push(c);
            }
        }
        out
    } else {
        s.to_string()
    }
}

/// delta-seconds (§1.2.2): digits only; overflow saturates at 2^31.
fn parse_delta(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse::<u64>().unwrap_or(DELTA_MAX).min(DELTA_MAX))
}

fn parse_field_names(s: &str) -> Vec<HeaderName> {
    s.split(',')
        .filter_map(|f| HeaderName::from_bytes(f.trim().as_bytes()).ok())
        .collect()
}

/// Why a response is not stored. Turned into text only for logs and headers; a response
/// carries it as its [`code`](NoStoreReason::code) (in [`crate::metrics::Outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NoStoreReason {
    /// The request method is not GET or HEAD.
    Method,
    /// The status code is not final or is not one we store (§3).
    Status,
    /// `no-store` in the request or the response (§5.2.1.5, §5.2.2.5).
    NoStore,
    /// `private` response in a shared cache (§5.2.2.7).
    Private,
    /// Request had Authorization and the response did not allow sharing (§3.5).
    Authorization,
    /// Response sets a cookie and the configuration does not allow storing those.
    SetCookie,
    /// No explicit lifetime and not heuristically cacheable (§4.2.2).
    NoFreshness,
    /// `Vary: *` never matches (§4.1).
    VaryStar,
    /// Vary on request fields other than Accept-Encoding (variants per field: not yet stored).
    Vary,
    /// Body larger than the configured maximum object size.
    TooLarge,
    /// Cache disabled for this route.
    Disabled,
    /// The response is a 206 or carries Content-Range.
    Partial,
    /// must-understand with a status we do not understand (§5.2.2.3).
    NotUnderstood,
    /// The body is in a coding larder knows but could not decode (passed on as sent).
    Undecodable,
}

impl NoStoreReason {
    /// Every reason, in code order.
    const ALL: [NoStoreReason; 14] = [
        NoStoreReason::Method,
        NoStoreReason::Status,
        NoStoreReason::NoStore,
        NoStoreReason::Private,
        NoStoreReason::Authorization,
        NoStoreReason::SetCookie,
        NoStoreReason::NoFreshness,
        NoStoreReason::VaryStar,
        NoStoreReason::Vary,
        NoStoreReason::TooLarge,
        NoStoreReason::Disabled,
        NoStoreReason::Partial,
        NoStoreReason::NotUnderstood,
        NoStoreReason::Undecodable,
    ];

    /// The reason as one byte, as a response's outcome carries it.
    #[inline]
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The reason of [`code`](NoStoreReason::code) `c`.
    #[inline]
    pub fn from_code(c: u8) -> Option<NoStoreReason> {
        Self::ALL.get(c as usize).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NoStoreReason::Method => "method",
            NoStoreReason::Status => "status",
            NoStoreReason::NoStore => "no-store",
            NoStoreReason::Private => "private",
            NoStoreReason::Authorization => "authorization",
            NoStoreReason::SetCookie => "set-cookie",
            NoStoreReason::NoFreshness => "no-freshness",
            NoStoreReason::VaryStar => "vary-star",
            NoStoreReason::Vary => "vary",
            NoStoreReason::TooLarge => "too-large",
            NoStoreReason::Disabled => "disabled",
            NoStoreReason::Partial => "partial",
            NoStoreReason::NotUnderstood => "not-understood",
            NoStoreReason::Undecodable => "undecodable",
        }
    }
}

/// Status codes cacheable by default, i.e. heuristically (RFC 9110 §15.1).
pub fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Status codes whose semantics larder understands well enough to store (for must-understand).
fn understood(status: StatusCode) -> bool {
    heuristically_cacheable(status) || matches!(status.as_u16(), 302 | 303 | 307 | 451)
}

/// How fresh a stored response is, computed once at store time (§4.2.1, §4.2.3).
///
/// Times are wall-clock, so that an entry written out (disk, another node) and read back ages
/// across the gap. A clock stepped back never makes an entry younger than it was stored:
/// resident time saturates at zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Freshness lifetime.
    pub lifetime: Duration,
    /// corrected_initial_age of §4.2.3.
    pub initial_age: Duration,
    /// When the response was received (response_time of §4.2.3; resident time counts from it).
    pub received: SystemTime,
    /// The stored response must be revalidated before every reuse (no-cache).
    pub always_revalidate: bool,
    /// Stale reuse forbidden (must-revalidate, proxy-revalidate, s-maxage).
    pub must_revalidate: bool,
    /// RFC 5861 windows.
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
}

impl Freshness {
    /// A response larder produced itself (a file, an image transform) at `now` (the cache's
    /// clock), fresh for `lifetime` from then, with no stale serving.
    pub fn own(lifetime: Duration, now: SystemTime) -> Freshness {
        Freshness {
            lifetime,
            initial_age: Duration::ZERO,
            received: now,
            always_revalidate: false,
            must_revalidate: false,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
        }
    }

    /// current_age = corrected_initial_age + resident_time (§4.2.3). Saturating: a clock
    /// stepped back counts no resident time, and no stored value overflows.
    #[inline]
    pub fn current_age(&self, now: SystemTime) -> Duration {
        let resident = now.duration_since(self.received).unwrap_or(Duration::ZERO);
        self.initial_age.saturating_add(resident)
    }

    /// Whether the response is fresh (§4.2): lifetime > current_age.
    #[inline]
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        !self.always_revalidate && self.lifetime > self.current_age(now)
    }

    /// How long past its lifetime the response is (zero if fresh).
    pub fn staleness(&self, now: SystemTime) -> Duration {
        self.current_age(now).saturating_sub(self.lifetime)
    }

    /// May be served stale while a background revalidation runs (RFC 5861 §3).
    pub fn serve_while_revalidating(&self, now: SystemTime) -> bool {
        !self.must_revalidate
            && !self.always_revalidate
            && self.staleness(now) <= self.stale_while_revalidate
            && !self.stale_while_revalidate.is_zero()
    }

    /// May be served stale because the origin cannot be reached or broke off the response: the
    /// "disconnected" case of RFC 9111 §4.2.4, up to `grace` past the lifetime, unless a
    /// directive forbids stale reuse (must-revalidate, proxy-revalidate, s-maxage, no-cache).
    pub fn serve_disconnected(&self, now: SystemTime, grace: Duration) -> bool {
        !self.must_revalidate
            && !self.always_revalidate
            && !grace.is_zero()
            && self.staleness(now) <= grace
    }

    /// May be served stale because the origin failed (RFC 5861 §4; never under must-revalidate,
    /// RFC 9111 §5.2.2.2).
    pub fn serve_on_error(&self, now: SystemTime) -> bool {
        !self.must_revalidate
            && !self.stale_if_error.is_zero()
            && self.staleness(now) <= self.stale_if_error
    }
}

/// What a fill needs to know about the request it fetched for.
pub struct FetchContext {
    pub method: Method,
    pub has_authorization: bool,
    /// When the upstream request was sent.
    pub request_time: SystemTime,
    /// When the response head was received.
    pub response_time: SystemTime,
    /// Request Cache-Control no-store.
    pub request_no_store: bool,
    /// A `cache_ttl` rule applies (docs/rules.md, "Cache"): lifetimes by status where the
    /// origin gives none (instead of §4.2.2's heuristic), and clamps on every lifetime.
    pub ttl: Option<Arc<CacheTtlConfig>>,
    /// A `cache_force` rule applies: stored for this long whatever Cache-Control, Expires or
    /// `no-store` say, never when `private`, and without its Set-Cookie.
    pub force: Option<Duration>,
}

/// A response larder may store, and what to strip from it first.
#[derive(Debug)]
pub struct Storable {
    pub freshness: Freshness,
    /// Header fields that must not be stored (qualified private / no-cache, Set-Cookie).
    pub strip: Vec<HeaderName>,
    pub no_transform: bool,
    /// May answer later requests carrying Authorization (§3.5).
    pub auth_ok: bool,
}

/// Decides whether a response may be stored by a shared cache, and for how long (§3, §4.2).
pub fn storability(
    ctx: &FetchContext,
    status: StatusCode,
    headers: &HeaderMap,
    cfg: &CacheConfig,
) -> Result<Storable, NoStoreReason> {
    if ctx.method != Method::GET && ctx.method != Method::HEAD {
        return Err(NoStoreReason::Method);
    }
    if ctx.request_no_store {
        return Err(NoStoreReason::NoStore);
    }
    // §3.3-3.4: a 206 is partial. A Content-Range field on another status means nothing (RFC
    // 9110 §14.4) and is stored like any other field (§3.1).
    if status == StatusCode::PARTIAL_CONTENT {
        return Err(NoStoreReason::Partial);
    }
    if status.is_informational() || status == StatusCode::NOT_MODIFIED {
        return Err(NoStoreReason::Status);
    }
    // A `cache_force` rule applies to successes and redirects only (nginx's proxy_cache_valid
    // without codes: 200, 301, 302): an error is never forced into the cache.
    let force = ctx
        .force
        .filter(|_| matches!(status.as_u16(), 200 | 203 | 204 | 301 | 302 | 308));
    // RFC 9213: a targeted field, when present, replaces Cache-Control (and Expires).
    let targeted = cfg
        .targeted_cache_control
        .iter()
        .find_map(|f| CacheControl::from_targeted(headers, &f.0));
    let is_targeted = targeted.is_some();
    let cc =
        targeted.unwrap_or_else(|| CacheControl::from_headers(headers, &header::CACHE_CONTROL));
    if cc.must_understand {
        if !understood(status) {
            return Err(NoStoreReason::NotUnderstood);
        }
    } else if cc.no_store && force.is_none() {
        return Err(NoStoreReason::NoStore);
    }
    // Forced caching never shares a response the origin made for one client.
    if cc.private {
        return Err(NoStoreReason::Private);
    }
    if ctx.has_authorization && !(cc.public || cc.s_maxage.is_some() || cc.must_revalidate) {
        return Err(NoStoreReason::Authorization);
    }
    let mut strip = Vec::new();
    if headers.contains_key(header::SET_COOKIE) {
        if !cfg.store_set_cookie && force.is_none() {
            return Err(NoStoreReason::SetCookie);
        }
        strip.push(header::SET_COOKIE);
    }
    if vary_has_star(headers) {
        return Err(NoStoreReason::VaryStar);
    }
    strip.extend(cc.private_fields.iter().cloned());
    strip.extend(cc.no_cache_fields.iter().cloned());

    let date = headers
        .get(header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(date::parse_lenient);
    let lifetime = match force {
        Some(forced) => forced,
        None => {
            let ttl = ctx.ttl.as_deref();
            let at = (date, ctx.response_time);
            freshness_lifetime(&cc, headers, at, status, cfg, is_targeted, ttl)?
        }
    };

    // §4.2.3 age calculation.
    // Age is a single value; a list (`Age: 7200, 0`, or several field lines) is read by its
    // first member rather than thrown away, the conservative reading.
    let age_value = headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| parse_delta(s.split(',').next().unwrap_or("")))
        .unwrap_or(0);
    let date_value = date.unwrap_or(ctx.response_time);
    let apparent_age = ctx
        .response_time
        .duration_since(date_value)
        .unwrap_or(Duration::ZERO);
    let response_delay = ctx
        .response_time
        .duration_since(ctx.request_time)
        .unwrap_or(Duration::ZERO);
    let corrected_age_value = Duration::from_secs(age_value) + response_delay;
    let initial_age = apparent_age.max(corrected_age_value);

    Ok(Storable {
        freshness: Freshness {
            lifetime,
            initial_age,
            received: ctx.response_time,
            always_revalidate: cc.no_cache && force.is_none(),
            must_revalidate: cc.must_revalidate || cc.proxy_revalidate || cc.s_maxage.is_some(),
            stale_while_revalidate: cc
                .stale_while_revalidate
                .map_or(cfg.stale_while_revalidate.0, Duration::from_secs),
            stale_if_error: cc
                .stale_if_error
                .map_or(cfg.stale_if_error.0, Duration::from_secs),
        },
        strip,
        no_transform: cc.no_transform,
        auth_ok: cc.public || cc.s_maxage.is_some() || cc.must_revalidate,
    })
}

/// Freshness lifetime (§4.2.1), falling back to a `cache_ttl` rule's lifetime for the status,
/// then to the heuristic of §4.2.2. `at`: the response's Date, and when it was received. The
/// origin's own lifetime (explicit or heuristic) is clamped by the rule's `min` and `max`, a
/// deviation from §4.2.1 the operator asks for; the rule's lifetime by status is not.
fn freshness_lifetime(
    cc: &CacheControl,
    headers: &HeaderMap,
    (date, response_time): (Option<SystemTime>, SystemTime),
    status: StatusCode,
    cfg: &CacheConfig,
    targeted: bool,
    ttl: Option<&CacheTtlConfig>,
) -> Result<Duration, NoStoreReason> {
    let own = |l: Duration| ttl.map_or(l, |t| t.clamp(l));
    let by_status = (ttl.filter(|_| origin_silent(cc, headers, targeted)))
        .and_then(|t| t.for_status(status.as_u16()));
    if let Some(d) = by_status {
        return Ok(d);
    }
    origin_lifetime(cc, headers, (date, response_time), status, cfg, targeted).map(own)
}

/// Whether the origin gives the response no lifetime of its own (no `s-maxage`, `max-age`,
/// `Expires`, nor `no-cache`): a `cache_ttl` rule's lifetime by status applies.
fn origin_silent(cc: &CacheControl, headers: &HeaderMap, targeted: bool) -> bool {
    cc.s_maxage.is_none()
        && cc.max_age.is_none()
        && !cc.invalid_max_age
        && !cc.no_cache
        && (targeted || !headers.contains_key(header::EXPIRES))
}

/// The origin's own lifetime (§4.2.1), or the heuristic's (§4.2.2).
fn origin_lifetime(
    cc: &CacheControl,
    headers: &HeaderMap,
    (date, response_time): (Option<SystemTime>, SystemTime),
    status: StatusCode,
    cfg: &CacheConfig,
    targeted: bool,
) -> Result<Duration, NoStoreReason> {
    // A shared cache uses s-maxage first, then max-age.
    if let Some(s) = cc.s_maxage {
        return Ok(Duration::from_secs(s));
    }
    if let Some(m) = cc.max_age {
        return Ok(Duration::from_secs(m));
    }
    if cc.invalid_max_age {
        // An invalid max-age makes the response stale (§4.2.1: treat as not fresh).
        return Ok(Duration::ZERO);
    }
    if let Some(exp) = headers.get(header::EXPIRES).filter(|_| !targeted) {
        // An invalid Expires (e.g. "0") means already expired (§5.3).
        let expires = exp.to_str().ok().and_then(date::parse_lenient);
        return Ok(match expires {
            Some(e) => e
                .duration_since(date.unwrap_or(response_time))
                .unwrap_or(Duration::ZERO),
            None => Duration::ZERO,
        });
    }
    if cc.no_cache {
        // Stored, but revalidated before every reuse.
        return Ok(Duration::ZERO);
    }
    // §4.2.2 heuristic: a fraction of the time since Last-Modified, for cacheable-by-default codes
    // or responses marked public.
    if heuristically_cacheable(status) || cc.public {
        if let Some(lm) = headers
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
            .and_then(date::parse_lenient)
        {
            let since = date
                .unwrap_or(response_time)
                .duration_since(lm)
                .unwrap_or(Duration::ZERO);
            return Ok(since.mul_f64(cfg.heuristic_fraction.0));
        }
    }
    Err(NoStoreReason::NoFreshness)
}

/// `Vary: *` anywhere in the Vary field lines.
pub fn vary_has_star(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .any(|t| t.trim() == "*")
}

/// The request's say in a lookup (§5.2.1, with Pragma per §5.4).
#[derive(Debug, Default, Clone)]
pub struct RequestDirectives {
    /// Must not be answered from cache without revalidation (no-cache, Pragma: no-cache, max-age=0).
    pub no_cache: bool,
    pub no_store: bool,
    pub max_age: Option<Duration>,
    pub min_fresh: Option<Duration>,
    pub max_stale: Option<Duration>,
    pub only_if_cached: bool,
}

impl RequestDirectives {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        if !headers.contains_key(header::CACHE_CONTROL) {
            let pragma_no_cache = headers
                .get_all(header::PRAGMA)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|s| {
                    s.split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("no-cache"))
                });
            return RequestDirectives {
                no_cache: pragma_no_cache,
                ..Default::default()
            };
        }
        let cc = CacheControl::from_headers(headers, &header::CACHE_CONTROL);
        RequestDirectives {
            no_cache: cc.no_cache,
            no_store: cc.no_store,
            max_age: cc.max_age.map(Duration::from_secs),
            min_fresh: cc.min_fresh.map(Duration::from_secs),
            max_stale: cc.max_stale.map(Duration::from_secs),
            only_if_cached: cc.only_if_cached,
        }
    }

    /// What a cache obeys from a client whose say over freshness it does not honour (§5.2.1:
    /// request directives are advisory): `no-store` and `only-if-cached`, which never make it
    /// fetch more; no-cache, max-age, min-fresh and max-stale are dropped.
    pub fn binding_only(self) -> Self {
        RequestDirectives {
            no_store: self.no_store,
            only_if_cached: self.only_if_cached,
            ..RequestDirectives::default()
        }
    }

    /// Whether a stored response of this freshness satisfies the request as is (§4.2, §5.2.1).
    pub fn accepts(&self, f: &Freshness, now: SystemTime) -> bool {
        if self.no_cache || f.always_revalidate {
            return false;
        }
        let age = f.current_age(now);
        if let Some(max_age) = self.max_age {
            if age > max_age {
                return false;
            }
        }
        if let Some(min_fresh) = self.min_fresh {
            if f.lifetime < age.saturating_add(min_fresh) {
                return false;
            }
        }
        if f.lifetime > age {
            return true;
        }
        // Stale: acceptable only within max-stale, and never when must-revalidate.
        match self.max_stale {
            Some(ms) if !f.must_revalidate => age - f.lifetime <= ms,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cc(s: &str) -> CacheControl {
        let mut h = HeaderMap::new();
        h.insert(header::CACHE_CONTROL, HeaderValue::from_str(s).unwrap());
        CacheControl::from_headers(&h, &header::CACHE_CONTROL)
    }

    #[test]
    fn a_no_store_reason_survives_its_code() {
        for r in NoStoreReason::ALL {
            assert_eq!(
                NoStoreReason::from_code(r.code()),
                Some(r),
                "{}",
                r.as_str()
            );
        }
        assert_eq!(
            NoStoreReason::from_code(NoStoreReason::ALL.len() as u8),
            None
        );
    }

    #[test]
    fn parses_case_quotes_and_conflicts() {
        let c = cc("Max-Age=\"60\", PUBLIC");
        assert_eq!(c.max_age, Some(60));
        assert!(c.public);
        assert_eq!(cc("max-age=60, max-age=10").max_age, Some(10));
        assert!(cc("max-age=-1").invalid_max_age);
        assert_eq!(cc("max-age=99999999999999999999").max_age, Some(DELTA_MAX));
        let c = cc("private=\"Set-Cookie, X-A\", no-cache=\"x-b\"");
        assert!(!c.private && !c.no_cache);
        assert_eq!(c.private_fields.len(), 2);
        assert_eq!(c.no_cache_fields, vec![HeaderName::from_static("x-b")]);
        assert!(cc("no-store,,").no_store);
        // An extension longer than any known directive is skipped, the rest still read; a
        // quoted comma with an escaped quote before it does not split.
        let c = cc("x-an-extension-longer-than-any-directive=1, STALE-WHILE-REVALIDATE=30");
        assert_eq!(c.stale_while_revalidate, Some(30));
        let c = cc("private=\"a\\\", b\", No-Store");
        assert!(c.no_store && !c.private);
    }

    fn ctx() -> FetchContext {
        let now = SystemTime::now();
        FetchContext {
            method: Method::GET,
            has_authorization: false,
            request_time: now,
            response_time: now,
            request_no_store: false,
            ttl: None,
            force: None,
        }
    }

    fn resp(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn s_maxage_beats_max_age() {
        let s = storability(
            &ctx(),
            StatusCode::OK,
            &resp(&[("cache-control", "max-age=10, s-maxage=100")]),
            &CacheConfig::default(),
        )
        .unwrap();
        assert_eq!(s.freshness.lifetime, Duration::from_secs(100));
        assert!(s.freshness.must_revalidate);
    }

    /// `cache_ttl` and `cache_force` rules (docs/rules.md, "Cache").
    #[test]
    fn rules_give_lifetimes_and_force() {
        let c = CacheConfig::default();
        let ttl: CacheTtlConfig = toml::from_str(
            r#"status = { "404" = "30s", "5xx" = "5s" }
               min = "1m"
               max = "1h""#,
        )
        .unwrap();
        let mut with_ttl = ctx();
        with_ttl.ttl = Some(Arc::new(ttl));
        // A 404 without Last-Modified: not heuristically fresh, stored for the rule's 30 s.
        assert_eq!(
            storability(&ctx(), StatusCode::NOT_FOUND, &resp(&[]), &c).unwrap_err(),
            NoStoreReason::NoFreshness
        );
        let s = storability(&with_ttl, StatusCode::NOT_FOUND, &resp(&[]), &c).unwrap();
        assert_eq!(s.freshness.lifetime, Duration::from_secs(30));
        let s = storability(&with_ttl, StatusCode::BAD_GATEWAY, &resp(&[]), &c).unwrap();
        assert_eq!(
            s.freshness.lifetime,
            Duration::from_secs(5),
            "not raised to `min`"
        );
        let h = resp(&[("cache-control", "max-age=5")]);
        let s = storability(&with_ttl, StatusCode::OK, &h, &c).unwrap();
        assert_eq!(
            s.freshness.lifetime,
            Duration::from_secs(60),
            "raised to `min`"
        );
        // The origin's own lifetime wins over the status's, within the clamps.
        let h = resp(&[("cache-control", "max-age=86400")]);
        let s = storability(&with_ttl, StatusCode::NOT_FOUND, &h, &c).unwrap();
        assert_eq!(s.freshness.lifetime, Duration::from_secs(3600));
        // Forced: no-store and no-cache overridden, Set-Cookie stripped, private refused.
        let mut forced = ctx();
        forced.force = Some(Duration::from_secs(300));
        let h = resp(&[
            ("cache-control", "no-store, no-cache"),
            ("set-cookie", "s=1"),
        ]);
        let s = storability(&forced, StatusCode::OK, &h, &c).unwrap();
        assert_eq!(s.freshness.lifetime, Duration::from_secs(300));
        assert!(!s.freshness.always_revalidate);
        assert_eq!(s.strip, vec![header::SET_COOKIE]);
        let h = resp(&[("cache-control", "private")]);
        assert_eq!(
            storability(&forced, StatusCode::OK, &h, &c).unwrap_err(),
            NoStoreReason::Private
        );
        // An error is never forced.
        let h = resp(&[("cache-control", "no-store")]);
        assert_eq!(
            storability(&forced, StatusCode::INTERNAL_SERVER_ERROR, &h, &c).unwrap_err(),
            NoStoreReason::NoStore
        );
    }

    #[test]
    fn invalid_expires_is_stale() {
        let s = storability(
            &ctx(),
            StatusCode::OK,
            &resp(&[("expires", "0")]),
            &CacheConfig::default(),
        )
        .unwrap();
        assert_eq!(s.freshness.lifetime, Duration::ZERO);
    }

    #[test]
    fn private_and_no_store_and_auth() {
        let c = CacheConfig::default();
        let r = |v: &str| storability(&ctx(), StatusCode::OK, &resp(&[("cache-control", v)]), &c);
        assert_eq!(
            r("private, max-age=60").unwrap_err(),
            NoStoreReason::Private
        );
        assert_eq!(
            r("no-store, max-age=60").unwrap_err(),
            NoStoreReason::NoStore
        );
        let mut a = ctx();
        a.has_authorization = true;
        let h = resp(&[("cache-control", "max-age=60")]);
        assert_eq!(
            storability(&a, StatusCode::OK, &h, &c).unwrap_err(),
            NoStoreReason::Authorization
        );
        let h = resp(&[("cache-control", "public, max-age=60")]);
        assert!(storability(&a, StatusCode::OK, &h, &c).is_ok());
    }

    #[test]
    fn heuristic_needs_last_modified() {
        let c = CacheConfig::default();
        let now = SystemTime::now();
        let lm = httpdate::fmt_http_date(now - Duration::from_secs(1000));
        let d = httpdate::fmt_http_date(now);
        let s = storability(
            &ctx(),
            StatusCode::OK,
            &resp(&[("last-modified", &lm), ("date", &d)]),
            &c,
        )
        .unwrap();
        assert!((99..=101).contains(&s.freshness.lifetime.as_secs()));
        assert_eq!(
            storability(&ctx(), StatusCode::OK, &resp(&[]), &c).unwrap_err(),
            NoStoreReason::NoFreshness
        );
    }

    #[test]
    fn age_header_adds_to_initial_age() {
        let s = storability(
            &ctx(),
            StatusCode::OK,
            &resp(&[("cache-control", "max-age=100"), ("age", "30")]),
            &CacheConfig::default(),
        )
        .unwrap();
        assert_eq!(s.freshness.initial_age.as_secs(), 30);
        assert!(s.freshness.is_fresh(SystemTime::now()));
    }

    #[test]
    fn age_counts_wall_clock_residence_and_saturates() {
        let received = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let f = Freshness {
            lifetime: Duration::from_secs(100),
            initial_age: Duration::from_secs(30),
            received,
            ..Freshness::own(Duration::ZERO, received)
        };
        // Resident time is counted from the wall-clock time of receipt (across a restart too).
        let later = received + Duration::from_secs(50);
        assert_eq!(f.current_age(later), Duration::from_secs(80));
        assert!(f.is_fresh(later));
        assert!(!f.is_fresh(later + Duration::from_secs(20)));
        // A clock stepped back: no resident time, never younger than stored.
        let earlier = received - Duration::from_secs(3600);
        assert_eq!(f.current_age(earlier), Duration::from_secs(30));
        // Stored values that would overflow saturate.
        let absurd = Freshness {
            initial_age: Duration::MAX,
            ..f
        };
        assert_eq!(absurd.current_age(later), Duration::MAX);
        let min_fresh = RequestDirectives {
            min_fresh: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        assert!(!min_fresh.accepts(&absurd, later));
    }

    #[test]
    fn request_directives() {
        let mut h = HeaderMap::new();
        h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
        assert!(RequestDirectives::from_headers(&h).no_cache);
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("max-stale=5"),
        );
        let d = RequestDirectives::from_headers(&h);
        assert!(!d.no_cache);
        let f = Freshness {
            lifetime: Duration::from_secs(10),
            initial_age: Duration::from_secs(12),
            received: SystemTime::now(),
            always_revalidate: false,
            must_revalidate: false,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
        };
        let now = SystemTime::now();
        assert!(d.accepts(&f, now));
        assert!(!RequestDirectives::default().accepts(&f, now));
        // Not honoured: max-stale no longer stretches the lifetime.
        assert!(!d.clone().binding_only().accepts(&f, now));
    }

    #[test]
    fn binding_only_keeps_no_store_and_only_if_cached() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache, max-age=0, min-fresh=9, no-store, only-if-cached"),
        );
        let d = RequestDirectives::from_headers(&h).binding_only();
        assert!(d.no_store && d.only_if_cached);
        assert!(!d.no_cache && d.max_age.is_none() && d.min_fresh.is_none());
    }
}
