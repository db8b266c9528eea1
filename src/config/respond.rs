//! The `respond` handler's settings (`respond = { status = 200 }` on a route): a fixed response;
//! also a rule's fixed answer (`respond = { ..., switch = "maintenance" }`, docs/rules.md).

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::headers::HeaderValueCfg;
use super::units::Bounded;

/// A fixed response (health checks, `/ping`, a mock, a maintenance page).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RespondConfig {
    #[serde(default = "RespondConfig::default_status")]
    pub status: Bounded<100, 999>,
    #[serde(default)]
    pub body: String,
    #[serde(default = "RespondConfig::default_type")]
    pub content_type: HeaderValueCfg,
    /// More fields of the response (`headers = { "retry-after" = "120" }`).
    #[serde(default)]
    pub headers: FixedHeaders,
    /// Rules only: the answer is given only while this switch is on (the admin API's
    /// `PUT /_larder/switches/NAME`); otherwise the rule does nothing.
    #[serde(default)]
    pub switch: Option<SwitchName>,
}

impl RespondConfig {
    fn default_status() -> Bounded<100, 999> {
        Bounded(200)
    }
    fn default_type() -> HeaderValueCfg {
        HeaderValueCfg(http::HeaderValue::from_static("text/plain"))
    }
}

/// Fixed response fields, in the order of their names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FixedHeaders(pub Vec<(http::HeaderName, http::HeaderValue)>);

impl<'de> Deserialize<'de> for FixedHeaders {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<String, HeaderValueCfg>::deserialize(d)?;
        let mut out = Vec::with_capacity(map.len());
        for (k, v) in map {
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| de::Error::custom(format!("`{k}` is not a valid header name")))?;
            if matches!(
                name,
                http::header::CONTENT_LENGTH
                    | http::header::TRANSFER_ENCODING
                    | http::header::CONNECTION
            ) {
                return Err(de::Error::custom(format!(
                    "`{k}` is larder's to set (from the body)"
                )));
            }
            out.push((name, v.0));
        }
        Ok(FixedHeaders(out))
    }
}

/// A switch's name: letters, digits, `-`, `_` or `.`, at most 64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchName(pub String);

impl SwitchName {
    pub fn valid(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    }
}

impl<'de> Deserialize<'de> for SwitchName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if SwitchName::valid(&s) {
            Ok(SwitchName(s))
        } else {
            Err(de::Error::custom(format!(
                "`{s}` is not a switch name (letters, digits, `-`, `_`, `.`; at most 64)"
            )))
        }
    }
}
