//! The `[access_log]` section: one line per request, written off the request path.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

use super::units::{Bounded, Fraction};

/// Where and how requests are logged.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogConfig {
    /// The file lines are appended to (created 0640 if missing); `"-"` for standard output.
    pub path: PathBuf,
    /// `"combined"` (nginx's and Apache's), `"json"` (one object a line), or a template with
    /// `{field}` names (docs/config.md lists them).
    #[serde(default)]
    pub format: LogFormat,
    /// The share of requests logged, 0 to 1 (1: every one).
    #[serde(default = "AccessLogConfig::default_sample")]
    pub sample: Fraction,
    /// Lines waiting for the writer at most; past it lines are dropped and counted, never a
    /// request held up.
    #[serde(default = "AccessLogConfig::default_buffer")]
    pub buffer: Bounded<1, 10_000_000>,
}

impl AccessLogConfig {
    fn default_sample() -> Fraction {
        Fraction(1.0)
    }

    fn default_buffer() -> Bounded<1, 10_000_000> {
        Bounded(65_536)
    }
}

/// The fields a template may name, as `{name}`.
pub const LOG_FIELDS: &[&str] = &[
    "remote",
    "time",
    "method",
    "uri",
    "protocol",
    "status",
    "bytes",
    "referer",
    "user_agent",
    "host",
    "duration_ms",
    "duration_us",
    "cache",
    "no_store",
    "route",
    "cache_rule",
    "user",
    "request_id",
    "time_iso",
    "upstream_addr",
    "upstream_time",
    "image_grammar",
    "image_presets",
];

/// How access log lines are written.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum LogFormat {
    /// nginx's and Apache's combined format.
    #[default]
    Combined,
    /// One JSON object a line.
    Json,
    /// Literal text and named fields.
    Template(Vec<LogPiece>),
}

/// A part of a template.
#[derive(Debug, Clone, PartialEq)]
pub enum LogPiece {
    Text(String),
    /// One of [`LOG_FIELDS`].
    Field(&'static str),
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(f: &str) -> Result<LogFormat, String> {
        match f {
            "combined" => return Ok(LogFormat::Combined),
            "json" => return Ok(LogFormat::Json),
            _ => {}
        }
        let mut pieces = Vec::new();
        let mut rest = f;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(LogPiece::Text(rest[..open].to_string()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(format!("unclosed `{{` in {f:?}"));
            };
            let name = &rest[open + 1..open + close];
            let Some(known) = LOG_FIELDS.iter().find(|k| **k == name) else {
                return Err(format!(
                    "unknown field `{{{name}}}`; known: {}",
                    LOG_FIELDS.join(", ")
                ));
            };
            pieces.push(LogPiece::Field(known));
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(LogPiece::Text(rest.to_string()));
        }
        Ok(LogFormat::Template(pieces))
    }
}

impl<'de> Deserialize<'de> for LogFormat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}
