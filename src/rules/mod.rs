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
//! - [`error_page`]: custom error pages per status.
//!
//! `request_id` and `error_page` rules run first at ①, wherever they are in the list (in
//! their order among themselves): so that an answer of any other rule (a 403, a redirect)
//! carries the id, and gets its error page.
//!
//! Compiled once when a router is built (at start and on every reload), so a reload applies
//! rule changes; the configuration checked what can be checked (patterns, templates, policy
//! names) when it was read.

pub mod access;
pub mod answer;
pub mod cors;
pub mod error_page;
pub mod headers;
pub mod redirect;
pub mod request_id;
pub mod rewrite;
pub mod vars;
pub mod when;

use std::sync::Arc;

use crate::admin::Switches;
use crate::config::rules::{expand, Action, Policies};
use crate::config::RouteConfig;
use crate::fleet::Fleet;
use crate::phases::{Guarded, Step};
use crate::upstream::Pools;

/// What rules may use besides their configuration: the running pools (forward auth, splits,
/// mirrors) and the fleet's Redis (fleet-wide limits).
pub struct Env<'a> {
    pub pools: &'a Pools,
    pub fleet: Option<&'a Arc<Fleet>>,
    /// The server's named switches (a fixed answer given only while its switch is on).
    pub switches: &'a Arc<Switches>,
}

/// A route's rules as steps, in order: its own, each `use` replaced by its policy's.
pub fn compile(route: &RouteConfig, policies: &Policies, env: &Env<'_>) -> Vec<Guarded> {
    let mut rules = expand(&route.rules, policies)
        .unwrap_or_else(|(_, why)| unreachable!("checked when the configuration is read: {why}"));
    // Those that must see every answer first (a stable sort keeps the rest in order).
    rules.sort_by_key(|e| !first(&e.rule.action));
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

/// Whether a rule runs before the others: it acts on every response the route gives, ①'s
/// answers included (④ runs only the steps ① reached).
fn first(action: &Action) -> bool {
    matches!(action, Action::RequestId(_) | Action::ErrorPage(_))
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
        Action::Respond(r) => Arc::new(answer::Answer::new(r, env.switches)),
        // Edge.
        Action::RequestId(r) => Arc::new(request_id::RequestId::new(r)),
        Action::Cors(c) => Arc::new(cors::Cors::new(c)),
        Action::Rewrite(r) => Arc::new(rewrite::Rewrite::new(r)),
        Action::StripPrefix(p) => Arc::new(rewrite::Strip::new(p)),
        Action::Redirect(r) => Arc::new(redirect::Redirect::new(r)),
        Action::ErrorPage(e) => Arc::new(error_page::ErrorPage::new(e)),
    }
}
