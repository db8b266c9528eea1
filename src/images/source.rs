//! Where an image proxy request's original comes from: a path relative to the route's
//! `origin` (fetched over HTTP) or `root` (a directory), or an absolute URL from the
//! `allow_sources` list; and the loading of it, limited to `max_source_size`.

use std::path::{Component, Path, PathBuf};

use bytes::Bytes;

use crate::config::ImagesConfig;

/// A source as a URL names it (after imgproxy's base64 or percent decoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRef {
    /// Relative to the route's `origin` or `root` (`photo.jpg`, `a/b.png`).
    Relative(String),
    /// An absolute `http://` or `https://` URL (allowed only by `allow_sources`).
    Absolute(String),
    /// imgproxy's `local:///path`: under the route's `root`.
    Local(String),
}

/// A loaded original.
#[derive(Debug, Clone)]
pub struct Original {
    pub data: Bytes,
    /// Names these bytes in result cache keys: a new original makes new keys.
    pub id: String,
}

/// Why an original could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("no such image")]
    NotFound,
    #[error("source not allowed: {0}")]
    NotAllowed(String),
    #[error("original larger than {0} bytes")]
    TooLarge(u64),
    #[error("fetching the original failed: {0}")]
    Failed(String),
}

/// The route's sources.
pub struct Sources {
    root: Option<PathBuf>,
    max_size: u64,
}

impl Sources {
    pub fn new(cfg: &ImagesConfig) -> Sources {
        Sources {
            root: cfg.root.clone(),
            max_size: cfg.max_source_size.0,
        }
    }

    /// Loads `r`'s bytes.
    pub async fn load(&self, r: &SourceRef) -> Result<Original, SourceError> {
        match r {
            SourceRef::Relative(p) | SourceRef::Local(p) => {
                let Some(root) = &self.root else {
                    return Err(SourceError::NotAllowed(
                        "this route has no `root` for relative sources".into(),
                    ));
                };
                let path = under(root, p).ok_or(SourceError::NotFound)?;
                let max = self.max_size;
                let id = format!("local:{p}");
                let data = tokio::task::spawn_blocking(move || read_limited(&path, max))
                    .await
                    .map_err(|_| SourceError::Failed("reader failed".into()))??;
                Ok(Original { data, id })
            }
            SourceRef::Absolute(u) => Err(SourceError::NotAllowed(u.clone())),
        }
    }
}

/// `rel` under `root`, or None when it would leave it (`..`, an absolute path, a prefix).
fn under(root: &Path, rel: &str) -> Option<PathBuf> {
    let rel = Path::new(rel.trim_start_matches('/'));
    let mut out = root.to_path_buf();
    for c in rel.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

fn read_limited(path: &Path, max: u64) -> Result<Bytes, SourceError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SourceError::NotFound,
        _ => SourceError::Failed(e.to_string()),
    })?;
    let meta = f
        .metadata()
        .map_err(|e| SourceError::Failed(e.to_string()))?;
    if !meta.is_file() {
        return Err(SourceError::NotFound);
    }
    if meta.len() > max {
        return Err(SourceError::TooLarge(max));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1)
        .read_to_end(&mut data)
        .map_err(|e| SourceError::Failed(e.to_string()))?;
    if data.len() as u64 > max {
        return Err(SourceError::TooLarge(max));
    }
    Ok(Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_leave_the_root() {
        let root = Path::new("/srv/img");
        assert_eq!(
            under(root, "a/b.jpg"),
            Some(PathBuf::from("/srv/img/a/b.jpg"))
        );
        assert_eq!(under(root, "/a.jpg"), Some(PathBuf::from("/srv/img/a.jpg")));
        assert_eq!(
            under(root, "./a.jpg"),
            Some(PathBuf::from("/srv/img/a.jpg"))
        );
        assert_eq!(under(root, "../etc/passwd"), None);
        assert_eq!(under(root, "a/../../x"), None);
    }
}
