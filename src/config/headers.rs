//! Header names and values given in settings, checked to be valid HTTP.

use http::header::HeaderName;
use serde::de::{self, Deserializer};
use serde::Deserialize;

/// An RFC 9110 token: a content type's parts, a charset's name.
pub(super) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A response header name given in the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNameCfg(pub HeaderName);

impl<'de> Deserialize<'de> for HeaderNameCfg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        HeaderName::from_bytes(s.as_bytes())
            .map(HeaderNameCfg)
            .map_err(|_| de::Error::custom(format!("`{s}` is not a valid header name")))
    }
}

/// A valid HTTP header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderValueCfg(pub http::HeaderValue);

impl<'de> Deserialize<'de> for HeaderValueCfg {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderValue::from_str(s.trim())
            .map(HeaderValueCfg)
            .map_err(|_| de::Error::custom(format!("`{s}` is not a valid header value")))
    }
}
