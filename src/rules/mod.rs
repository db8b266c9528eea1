//! Rules (docs/rules.md): what a route does besides its handler, compiled from its
//! `[[listener.route.rule]]` and the `[[policy.NAME]]`s it uses into steps at the request
//! phases ([`crate::phases`]). Each rule is a condition ([`when`]) and one action, a file per
//! kind of action:
//!
//! - [`access`]: allow / deny by the client's address;
//! - [`headers`]: request and response header edits, values from templates ([`vars`]);
//! - [`answer`]: fixed answers;
//! - [`basic_auth`]: users of an htpasswd file (re-read when it changes, verifications cached);
//! - [`api_key`]: named keys in a header or query parameter;
//! - [`jwt`]: tokens verified with a secret, a PEM key or a JWKS (file or URL);
//! - [`forward_auth`]: an auth service's subrequest decides, its allows cached;
//! - [`watch`]: the files those read, read again when they change; [`subrequest`]: the
//!   requests they make (an auth service, a JWKS URL).
//!
//! Compiled once when a router is built (at start and on every reload), so a reload applies
//! rule changes; the configuration checked what can be checked (patterns, templates, policy
//! names) when it was read.

pub mod access;
pub mod answer;
pub mod api_key;
pub mod basic_auth;
pub mod forward_auth;
pub mod headers;
pub mod jwt;
pub mod subrequest;
pub mod vars;
pub mod watch;
pub mod when;

use std::sync::Arc;

use crate::clock::Clock;
use crate::config::rules::{expand, Action, Policies};
use crate::config::RouteConfig;
use crate::fleet::Fleet;
use crate::phases::{Guarded, Step};
use crate::upstream::Pools;

/// What rules may use besides their configuration: the running pools (forward auth, splits,
/// mirrors), the fleet's Redis (fleet-wide limits) and the cache's clock (when a watched file
/// is looked at again, how long a remembered decision lasts: a test moves it).
pub struct Env<'a> {
    pub pools: &'a Pools,
    pub fleet: Option<&'a Arc<Fleet>>,
    pub clock: &'a Clock,
}

/// A route's rules as steps, in order: its own, each `use` replaced by its policy's.
pub fn compile(route: &RouteConfig, policies: &Policies, env: &Env<'_>) -> Vec<Guarded> {
    let rules = expand(&route.rules, policies)
        .unwrap_or_else(|(_, why)| unreachable!("checked when the configuration is read: {why}"));
    rules
        .into_iter()
        .map(|e| {
            let mut whens = e.outer;
            whens.extend(e.rule.when.as_ref());
            Guarded {
                when: when::Matcher::of(whens),
                step: step(&e.rule.action, env),
            }
        })
        .collect()
}

/// The step of one action.
fn step(action: &Action, env: &Env<'_>) -> Arc<dyn Step> {
    match action {
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
        Action::Respond(r) => Arc::new(answer::Answer::new(r)),
        // Access: authentication.
        Action::BasicAuth(b) => Arc::new(basic_auth::BasicAuth::new(b, env.clock)),
        Action::ApiKey(k) => Arc::new(api_key::ApiKey::new(k, env.clock)),
        Action::Jwt(j) => Arc::new(jwt::Jwt::new(j, env.clock)),
        Action::ForwardAuth(f) => Arc::new(forward_auth::ForwardAuth::new(f, env.clock)),
    }
}
