//! The `[admin]` section: the admin token, the admin API's listener, who may purge.

use std::net::SocketAddr;

use serde::Deserialize;

use super::net::Cidr;

/// The `[admin]` section.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token (`Authorization: Bearer <token>`) for admin operations; none disables them.
    pub token: Option<String>,
    /// Address of the admin API listener (`/_larder/status`, `/_larder/purge`); off when unset.
    /// Needs `token`. Bind it to loopback unless the network in front is trusted.
    pub listen: Option<SocketAddr>,
    /// Addresses allowed to send `PURGE` to proxy routes without the token.
    #[serde(default)]
    pub purge_allow: Vec<Cidr>,
}
