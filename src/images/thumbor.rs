//! thumbor's URL grammar: `/unsafe/` or an HMAC-SHA1 signature, `trim`, manual crop
//! `AxB:CxD`, `fit-in`, `-WxH` (flips), `halign`/`valign`, `smart`, `filters:...`, the image
//! path; parsed into the processing options the pipeline runs.

use crate::config::ThumborConfig;

use super::grammar::{GrammarError, Parsed};

/// Parses `path` (the part after the route's prefix, without the leading `/`), checking its
/// signature with `cfg.key` when one is set.
pub fn parse(path: &str, cfg: &ThumborConfig) -> Result<Parsed, GrammarError> {
    let _ = (path, cfg);
    Err(GrammarError::Bad(
        "thumbor URLs are not implemented yet".into(),
    ))
}
