//! Rules (docs/rules.md): what a route does besides its handler, compiled from its
//! `[[listener.route.rule]]` and the `[[policy.NAME]]`s it uses into steps at the request
//! phases ([`crate::phases`]). Each rule is a condition ([`when`]) and one action, a file per
//! kind of action:
//!
//! - [`access`]: allow / deny by the client's address;
//! - [`headers`]: request and response header edits, values from templates ([`vars`]);
//! - [`answer`]: fixed answers (a maintenance page by a switch of the admin API);
//! - [`request_id`]: the request's id, kept from a trusted client or made (UUIDv7);
//! - [`cors`]: CORS at the edge (preflights answered, the fields of actual requests);
//! - [`rewrite`]: path rewrites and prefix strips, before the handler and the cache key;
//! - [`redirect`]: redirects with captures;
//! - [`error_page`]: custom error pages per status;
//! - limits: [`rate`] (requests per key, GCRA, locally or in the fleet's Redis), [`in_flight`]
//!   (requests in flight per key), [`pace`] (bytes per second per response), [`max_body`]
//!   (request body size), the keys they count by in [`limit_key`];
//! - [`cache`]: the cache key's parts, lifetimes, bypass and forced caching (read by the
//!   proxy), and the `Cache-Status` that names the rule;
//! - [`traffic`]: a weighted split between pools, a mirror to a shadow pool;
//! - [`basic_auth`]: users of an htpasswd file (re-read when it changes, verifications cached);
//! - [`api_key`]: named keys in a header or query parameter;
//! - [`jwt`]: tokens verified with a secret, a PEM key or a JWKS (file or URL);
//! - [`forward_auth`]: an auth service's subrequest decides, its allows cached;
//! - [`watch`]: the files those read, read again when they change; [`subrequest`]: the
//!   requests they make (an auth service, a JWKS URL).
//!
//! `request_id` and `error_page` rules run first at ①, wherever they are in the list (in
//! their order among themselves): so that an answer of any other rule (a 403, a redirect)
//! carries the id, and gets its error page.
//!
//! Compiled once when a router is built (at start and on every reload), so a reload applies
//! rule changes; the configuration checked what can be checked (patterns, templates, policy
//! names) when it was read. What limits count ([`rate`]'s buckets, [`in_flight`]'s places) is
//! [`Kept`] across a reload for a rule that did not change, as nginx keeps a `limit_req` or
//! `limit_conn` zone: a reload is not a way around a limit.

pub mod access;
pub mod answer;
pub mod api_key;
pub mod basic_auth;
pub mod cache;
pub mod cors;
pub mod error_page;
pub mod forward_auth;
pub mod headers;
pub mod in_flight;
pub mod jwt;
pub mod limit_key;
pub mod max_body;
pub mod pace;
pub mod rate;
pub mod redirect;
pub mod request_id;
pub mod rewrite;
pub mod subrequest;
pub mod traffic;
pub mod vars;
pub mod watch;
pub mod when;

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::admin::Switches;
use crate::clock::Clock;
use crate::config::rules::{expand, Action, Policies, RuleConfig};
use crate::config::RouteConfig;
use crate::fleet::Fleet;
use crate::phases::{Guarded, Step};
use crate::upstream::Pools;

/// What rules may use besides their configuration: the running pools (forward auth, splits,
/// mirrors), the fleet's Redis (fleet-wide limits) and the cache's clock (rate limits, when a
/// watched file is looked at again, how long a remembered decision lasts: tests move it).
pub struct Env<'a> {
    pub pools: &'a Pools,
    pub fleet: Option<&'a Arc<Fleet>>,
    pub clock: &'a Clock,
    /// The server's named switches (a fixed answer given only while its switch is on).
    pub switches: &'a Arc<Switches>,
    /// The limits' state of the routers built before, and the listener being built
    /// (`127.0.0.1:8080`), which with the route and the rule names a limit.
    pub kept: &'a Kept,
    pub listener: &'a str,
}

/// The steps whose state outlives a reload, by what names them: the listener, the route's host
/// and path, the rule's place among the route's expanded rules, its label and its whole action
/// (a changed limit starts afresh). Held weakly: a step lives as long as a router uses it, so
/// an entry outlives the last router that had the rule only until the next compile prunes it.
#[derive(Default)]
pub struct Kept(Mutex<HashMap<String, Weak<dyn Any + Send + Sync>>>);

impl Kept {
    /// The step kept under `key`, or `make`'s, kept from now on.
    fn get_or<T: Any + Send + Sync>(&self, key: String, make: impl FnOnce() -> T) -> Arc<T> {
        let mut map = self.0.lock().expect("not poisoned");
        map.retain(|_, kept| kept.strong_count() > 0);
        if let Some(step) = (map.get(&key).and_then(Weak::upgrade)).and_then(|a| a.downcast().ok())
        {
            return step;
        }
        let step = Arc::new(make());
        let erased: Arc<dyn Any + Send + Sync> = step.clone();
        map.insert(key, Arc::downgrade(&erased));
        step
    }
}

/// A route's rules as steps, in order: its own, each `use` replaced by its policy's.
pub fn compile(route: &RouteConfig, policies: &Policies, env: &Env<'_>) -> Vec<Guarded> {
    let mut rules = expand(&route.rules, policies)
        .unwrap_or_else(|(_, why)| unreachable!("checked when the configuration is read: {why}"));
    // Those that must see every answer first (a stable sort keeps the rest in order).
    rules.sort_by_key(|e| !first(&e.rule.action));
    rules
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let mut whens = e.outer;
            whens.extend(e.rule.when.as_ref());
            let kept = |rule: &RuleConfig| {
                let (l, host, path) = (env.listener, &route.host, &route.path);
                format!(
                    "{l} {host:?} {path:?} {i} {} {:?}",
                    rule.label(),
                    rule.action
                )
            };
            Guarded {
                when: when::Matcher::of(whens),
                step: step(e.rule, env, kept),
            }
        })
        .collect()
}

/// Whether a rule runs before the others: it acts on every response the route gives, ①'s
/// answers included (④ runs only the steps ① reached).
fn first(action: &Action) -> bool {
    matches!(action, Action::RequestId(_) | Action::ErrorPage(_))
}

/// The step of one rule's action.
/// `kept` names a stateful rule's state for [`Kept`].
fn step(rule: &RuleConfig, env: &Env<'_>, kept: impl Fn(&RuleConfig) -> String) -> Arc<dyn Step> {
    let name = rule.label();
    match &rule.action {
        Action::Use(_) => unreachable!("expanded"),
        Action::Allow(nets) => Arc::new(access::ByAddress {
            nets: nets.clone(),
            allow: true,
        }),
        Action::Deny(nets) => Arc::new(access::ByAddress {
            nets: nets.clone(),
            allow: false,
        }),
        Action::RequestHeaders(e) => Arc::new(headers::RequestHeaders::new(e)),
        Action::ResponseHeaders(e) => Arc::new(headers::ResponseHeaders::new(e)),
        Action::Respond(r) => Arc::new(answer::Answer::new(r, env.switches)),
        // Edge.
        Action::RequestId(r) => Arc::new(request_id::RequestId::new(r)),
        Action::Cors(c) => Arc::new(cors::Cors::new(c)),
        Action::Rewrite(r) => Arc::new(rewrite::Rewrite::new(r)),
        Action::StripPrefix(p) => Arc::new(rewrite::Strip::new(p)),
        Action::Redirect(r) => Arc::new(redirect::Redirect::new(r)),
        Action::ErrorPage(e) => Arc::new(error_page::ErrorPage::new(e)),
        // Limits.
        Action::RateLimit(r) => env.kept.get_or(kept(rule), || {
            rate::RateLimit::new(rule.label(), r, env.clock, env.fleet)
        }),
        Action::InFlight(f) => env
            .kept
            .get_or(kept(rule), || in_flight::InFlight::new(rule.label(), f)),
        Action::LimitRate(l) => Arc::new(pace::LimitRate::new(l)),
        Action::MaxBody(m) => Arc::new(max_body::MaxBody(m.0)),
        // Cache and traffic.
        Action::CacheKey(k) => cache_rule(name, cache::Decide::Key(Arc::new(k.clone()))),
        Action::CacheTtl(t) => cache_rule(name, cache::Decide::Ttl(Arc::new(t.clone()))),
        Action::CacheBypass => cache_rule(name, cache::Decide::Bypass),
        Action::CacheForce(f) => cache_rule(name, cache::Decide::Force(f.ttl.0)),
        Action::Split(s) => Arc::new(traffic::Split::new(s, env.pools)),
        Action::Mirror(m) => match traffic::Mirror::new(m, env.pools) {
            Some(m) => Arc::new(m),
            // The configuration checked the pool: a router built without it mirrors nothing.
            None => {
                tracing::warn!(pool = m.pool, "mirror to a pool that is not running: off");
                Arc::new(traffic::Nothing)
            }
        },
        // Access: authentication.
        Action::BasicAuth(b) => Arc::new(basic_auth::BasicAuth::new(b, env.clock)),
        Action::ApiKey(k) => Arc::new(api_key::ApiKey::new(k, env.clock)),
        Action::Jwt(j) => Arc::new(jwt::Jwt::new(j, env.clock)),
        Action::ForwardAuth(f) => Arc::new(forward_auth::ForwardAuth::new(f, env.clock)),
    }
}

fn cache_rule(name: &str, decide: cache::Decide) -> Arc<dyn Step> {
    Arc::new(cache::CacheRule::new(name, decide))
}
