//! The `[tracing]` section: a span per request, exported to an OpenTelemetry collector over
//! OTLP/HTTP (protobuf). Without the section nothing of it runs.

use std::collections::BTreeMap;

use http::Uri;
use serde::{de, Deserialize, Deserializer};

use super::pool::UpstreamTlsConfig;
use super::units::{Bounded, Dur, Fraction, HOUR_MS};

/// Where spans go and which requests get one.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP endpoint: `"http://127.0.0.1:4318"` (a URL without a path gets
    /// `/v1/traces`, as `OTEL_EXPORTER_OTLP_ENDPOINT` does), or the full URL of the traces path.
    pub otlp_endpoint: OtlpEndpoint,
    /// The `service.name` of the spans' resource.
    #[serde(default = "TracingConfig::default_service_name")]
    pub service_name: String,
    /// The share of requests traced that arrive without a trace context (0 to 1). A request
    /// whose `traceparent` says sampled is traced, one that says not sampled is not, whatever
    /// this says (parent-based sampling).
    #[serde(default = "TracingConfig::default_sample")]
    pub sample: Fraction,
    /// Fields sent with every export (an API key); redacted in `/_larder/config`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How often waiting spans are sent.
    #[serde(default = "TracingConfig::default_flush_interval")]
    pub flush_interval: Dur<10, HOUR_MS>,
    /// Spans waiting to be sent at most; past it spans are dropped, never a request held up.
    #[serde(default = "TracingConfig::default_queue")]
    pub queue: Bounded<1, 1_000_000>,
    /// The longest one export may take.
    #[serde(default = "TracingConfig::default_timeout")]
    pub timeout: Dur<100, HOUR_MS>,
    /// TLS to an `https://` collector: `ca`, `insecure`, `sni`, `client_cert`/`client_key`, as
    /// a pool's `tls`.
    #[serde(default)]
    pub tls: UpstreamTlsConfig,
}

impl TracingConfig {
    fn default_service_name() -> String {
        "larder".into()
    }
    fn default_sample() -> Fraction {
        Fraction(1.0)
    }
    fn default_flush_interval() -> Dur<10, HOUR_MS> {
        Dur(std::time::Duration::from_secs(5))
    }
    fn default_queue() -> Bounded<1, 1_000_000> {
        Bounded(2048)
    }
    fn default_timeout() -> Dur<100, HOUR_MS> {
        Dur(std::time::Duration::from_secs(10))
    }
}

/// An OTLP/HTTP endpoint: an `http://` or `https://` URL, with the traces path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint(pub Uri);

impl std::str::FromStr for OtlpEndpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<OtlpEndpoint, String> {
        let uri: Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http" | "https") if uri.authority().is_some() => {}
            _ => return Err(format!("`{s}` is not an http:// or https:// URL")),
        }
        if uri.query().is_some() {
            return Err(format!("`{s}`: an endpoint has no query"));
        }
        let path = match uri.path() {
            "" | "/" => "/v1/traces",
            p => p,
        };
        let full = format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().map_or("", |a| a.as_str()),
            path
        );
        full.parse()
            .map(OtlpEndpoint)
            .map_err(|e| format!("`{s}` is not a URL: {e}"))
    }
}

impl<'de> Deserialize<'de> for OtlpEndpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_traces_path_unless_they_name_one() {
        let e = |s: &str| s.parse::<OtlpEndpoint>().map(|e| e.0.to_string());
        assert_eq!(
            e("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            e("https://otel.example/").unwrap(),
            "https://otel.example/v1/traces"
        );
        assert_eq!(
            e("http://c:4318/custom/traces").unwrap(),
            "http://c:4318/custom/traces"
        );
        assert!(e("ftp://c/").unwrap_err().contains("http:// or https://"));
        assert!(e("127.0.0.1:4318").is_err());
        assert!(e("http://c/v1/traces?x=1").is_err());
    }
}
