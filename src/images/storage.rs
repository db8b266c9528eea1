//! Where originals live: the [`ImageStore`] trait (a later issue adds a shared store for
//! clusters) and [`LocalDir`], the embedded default: one file per image at
//! `<dir>/<md5[0..2]>/<md5[2..4]>/<md5>`, written atomically (temp file, fsync, rename), so a
//! reader never sees a partial original and two uploads of the same bytes store one file.
//!
//! The trait is synchronous; callers run it on the blocking pool.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// An image's MD5 as 32 lowercase hex digits (zimg's URL form).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Md5Hex(String);

impl Md5Hex {
    /// The MD5 of `data`.
    pub fn of(data: &[u8]) -> Md5Hex {
        use md5::{Digest, Md5};
        let d = Md5::digest(data);
        let mut s = String::with_capacity(32);
        for b in d {
            s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        Md5Hex(s)
    }

    /// Parses 32 hex digits (any case).
    pub fn parse(s: &str) -> Option<Md5Hex> {
        (s.len() == 32 && s.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| Md5Hex(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Storage of originals by MD5.
pub trait ImageStore: Send + Sync {
    /// Stores `data` under `md5` unless present; true if it was new.
    fn put(&self, md5: &Md5Hex, data: &[u8]) -> io::Result<bool>;
    /// The original, if stored.
    fn get(&self, md5: &Md5Hex) -> io::Result<Option<Bytes>>;
    /// Removes the original; true if it existed.
    fn delete(&self, md5: &Md5Hex) -> io::Result<bool>;
    /// Where the images are, for logs.
    fn describe(&self) -> String;
}

/// Originals in a local directory, sharded two levels deep.
pub struct LocalDir {
    root: PathBuf,
    /// Distinguishes temp files of concurrent writers in this process.
    seq: AtomicU64,
}

impl LocalDir {
    /// Uses `root`; it is created with the first stored image (so merely starting larder with
    /// the embedded default leaves no directory behind).
    pub fn new(root: &Path) -> LocalDir {
        LocalDir {
            root: root.to_path_buf(),
            seq: AtomicU64::new(0),
        }
    }

    fn path(&self, md5: &Md5Hex) -> PathBuf {
        let s = md5.as_str();
        self.root.join(&s[0..2]).join(&s[2..4]).join(s)
    }
}

impl ImageStore for LocalDir {
    fn put(&self, md5: &Md5Hex, data: &[u8]) -> io::Result<bool> {
        let path = self.path(md5);
        if path.exists() {
            return Ok(false);
        }
        let dir = path.parent().expect("sharded path has a parent");
        fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            md5.as_str(),
            std::process::id(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename is durable once the directory is.
            fs::File::open(dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| true)
    }

    fn get(&self, md5: &Md5Hex) -> io::Result<Option<Bytes>> {
        match fs::read(self.path(md5)) {
            Ok(v) => Ok(Some(Bytes::from(v))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn delete(&self, md5: &Md5Hex) -> io::Result<bool> {
        match fs::remove_file(self.path(md5)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_delete_dedup() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDir::new(dir.path());
        let md5 = Md5Hex::of(b"abc");
        assert_eq!(md5.as_str(), "900150983cd24fb0d6963f7d28e17f72");
        assert!(s.put(&md5, b"abc").unwrap());
        assert!(!s.put(&md5, b"abc").unwrap());
        assert_eq!(&s.get(&md5).unwrap().unwrap()[..], b"abc");
        assert!(dir.path().join("90/01").is_dir());
        assert!(s.delete(&md5).unwrap());
        assert!(s.get(&md5).unwrap().is_none());
        assert!(Md5Hex::parse("XYZ").is_none());
    }
}
