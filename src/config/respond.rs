//! The `respond` handler's settings (`respond = { status = 200 }` on a route): a fixed response.

use serde::Deserialize;

use super::headers::HeaderValueCfg;
use super::units::Bounded;

/// A fixed response (health checks, `/ping`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondConfig {
    #[serde(default = "RespondConfig::default_status")]
    pub status: Bounded<100, 999>,
    #[serde(default)]
    pub body: String,
    #[serde(default = "RespondConfig::default_type")]
    pub content_type: HeaderValueCfg,
}

impl RespondConfig {
    fn default_status() -> Bounded<100, 999> {
        Bounded(200)
    }
    fn default_type() -> HeaderValueCfg {
        HeaderValueCfg(http::HeaderValue::from_static("text/plain"))
    }
}
