//! What the image proxy's URL grammars ([`super::imgproxy`], [`super::thumbor`]) make of a
//! request path: the processing options, the source, which grammar; and how they refuse one
//! (403 for a signature, 400 for the rest, before any work).

use crate::config::image_options::Options;

pub use super::source::SourceRef;

/// The grammar a request was written in (the access log says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grammar {
    Zimg,
    Imgproxy,
    Thumbor,
}

impl Grammar {
    pub fn name(self) -> &'static str {
        match self {
            Grammar::Zimg => "zimg",
            Grammar::Imgproxy => "imgproxy",
            Grammar::Thumbor => "thumbor",
        }
    }
}

/// A request path parsed by one of the grammars.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub grammar: Grammar,
    pub options: Options,
    pub source: SourceRef,
}

/// Why a grammar refused a path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// Missing or wrong signature, an expired URL, or limits redefined where not allowed: 403.
    #[error("forbidden: {0}")]
    Signature(&'static str),
    /// A malformed option or source: 400 saying which.
    #[error("{0}")]
    Bad(String),
}
