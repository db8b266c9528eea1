//! The `static` handler's settings (`static = { root = "..." }` on a route): files from a
//! directory or bundled in the binary, and how they are served.

use std::path::PathBuf;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use super::headers::{is_token, HeaderValueCfg};
use super::units::{yes, ByteSize};

/// Files served from a directory, or from files bundled in the binary.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// Directory served. Exactly one of `root` and `bundled`.
    pub root: Option<PathBuf>,
    /// A file set compiled into larder (`"demo"`), used by the embedded default.
    pub bundled: Option<Bundle>,
    /// Remove the route's path prefix before looking up the file.
    #[serde(default)]
    pub strip_prefix: bool,
    /// Files tried, in order, for a request naming a directory (`/docs/`).
    #[serde(default = "StaticConfig::default_index")]
    pub index: Vec<String>,
    /// Cache-Control sent with every file of this route (unless its extension has its own).
    pub cache_control: Option<HeaderValueCfg>,
    /// Cache-Control by file extension (without the dot, case-insensitive), e.g.
    /// `{ css = "public, max-age=31536000, immutable" }`; overrides `cache_control`.
    #[serde(default)]
    pub cache_control_by_extension: std::collections::BTreeMap<String, HeaderValueCfg>,
    /// Charset added to text types (`text/*`, JavaScript, JSON, XML, SVG); `""` adds none.
    #[serde(
        default = "StaticConfig::default_charset",
        deserialize_with = "charset"
    )]
    pub charset: String,
    /// Files up to this size are held in the memory cache (with their compressed variants);
    /// larger ones are streamed from disk in chunks.
    #[serde(default = "StaticConfig::default_memory_max")]
    pub max_memory_file_size: ByteSize,
    /// Serve `file.br`, `file.zst`, `file.gz` beside `file` to clients accepting them.
    #[serde(default = "yes")]
    pub precompressed: bool,
    /// Follow symlinks that lead outside `root` (symlinks within it are always followed).
    #[serde(default)]
    pub follow_symlinks: bool,
    /// Serve files and directories whose name starts with a dot (hidden by default: 404).
    #[serde(default)]
    pub dotfiles: bool,
    /// An HTML listing for directories without an index file (off by default: 403).
    #[serde(default)]
    pub directory_listing: bool,
}

impl StaticConfig {
    fn default_index() -> Vec<String> {
        vec!["index.html".into()]
    }
    fn default_charset() -> String {
        "utf-8".into()
    }
    fn default_memory_max() -> ByteSize {
        ByteSize(1024 * 1024)
    }
    pub fn new_root(root: PathBuf) -> Self {
        StaticConfig {
            root: Some(root),
            bundled: None,
            strip_prefix: false,
            index: Self::default_index(),
            cache_control: None,
            cache_control_by_extension: Default::default(),
            charset: Self::default_charset(),
            max_memory_file_size: Self::default_memory_max(),
            precompressed: true,
            follow_symlinks: false,
            dotfiles: false,
            directory_listing: false,
        }
    }
}

/// File sets compiled into the binary.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Bundle {
    /// The demo origin's JSON document and HTML pages.
    Demo,
}

/// A charset's name for Content-Type (`utf-8`), or empty for none.
fn charset<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.trim().is_empty() || is_token(s.trim()) {
        Ok(s)
    } else {
        Err(de::Error::custom(format!(
            "`{s}` is not a charset name (e.g. \"utf-8\"; \"\" adds none)"
        )))
    }
}
