//! What an operator's purge names ([`Purge`]): read by the façade, the tiers below memory and
//! the bans, so it sits below them all (a file of its own: the files of `cache/` import no file
//! that imports them back).

use super::key::CacheKey;

/// What an operator's purge removes: every variant of the URLs it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    /// One URL.
    Url(CacheKey),
    /// Every URL whose key starts with this (`http://host/path`, host lowercased).
    Prefix(String),
    /// Every URL a stored response of which carries this tag.
    Tag(String),
}
