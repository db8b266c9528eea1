//! Where originals live: the [`ImageStore`] trait (a later issue adds a shared store for
//! clusters) and [`LocalDir`], the embedded default: one file per image at
//! `<dir>/<md5[0..2]>/<md5[2..4]>/<md5>`, written atomically (temp file, fsync, rename), so a
//! reader never sees a partial original and two uploads of the same bytes store one file.
//!
//! [`Shared`] keeps originals in the fleet's Redis as well ([`crate::fleet`]'s blobs), so that
//! every node of a fleet can transform every uploaded image.
//!
//! [`InMemory`] fronts any store with a byte-bounded memory cache of recently used originals,
//! so a transform of a hot image reads no file (zimg keeps originals in memcached for the same
//! reason).
//!
//! The trait is synchronous; callers run it on the blocking pool, except for
//! [`ImageStore::get_in_memory`], which never blocks.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::fleet::Fleet;

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
    /// The original if it is at hand without blocking (held in memory); callers on the async
    /// workers try this before going to the blocking pool.
    fn get_in_memory(&self, _md5: &Md5Hex) -> Option<Bytes> {
        None
    }
}

/// Weighs cached originals by their size.
#[derive(Clone)]
struct BySize;

impl quick_cache::Weighter<Md5Hex, Bytes> for BySize {
    fn weight(&self, key: &Md5Hex, val: &Bytes) -> u64 {
        (key.0.len() + val.len()) as u64 + 64
    }
}

/// A store fronted by a memory cache of originals, at most `capacity` bytes (scan-resistant, as
/// the response cache is). Writes and deletes go through to the store below first.
pub struct InMemory<S> {
    below: S,
    held: quick_cache::sync::Cache<Md5Hex, Bytes, BySize>,
}

impl<S: ImageStore> InMemory<S> {
    pub fn new(below: S, capacity: u64) -> InMemory<S> {
        // quick_cache wants an estimate of the item count; assume ~256 KiB per original.
        let estimated = (capacity / (256 * 1024)).clamp(16, 1 << 20) as usize;
        InMemory {
            below,
            held: quick_cache::sync::Cache::with_weighter(estimated, capacity, BySize),
        }
    }
}

impl<S: ImageStore> ImageStore for InMemory<S> {
    fn put(&self, md5: &Md5Hex, data: &[u8]) -> io::Result<bool> {
        // Not held on upload: an upload says nothing about whether the image will be asked for.
        self.below.put(md5, data)
    }

    fn get(&self, md5: &Md5Hex) -> io::Result<Option<Bytes>> {
        if let Some(b) = self.held.get(md5) {
            return Ok(Some(b));
        }
        let found = self.below.get(md5)?;
        if let Some(b) = &found {
            self.held.insert(md5.clone(), b.clone());
        }
        Ok(found)
    }

    fn delete(&self, md5: &Md5Hex) -> io::Result<bool> {
        let existed = self.below.delete(md5);
        self.held.remove(md5);
        existed
    }

    fn describe(&self) -> String {
        format!(
            "{} (originals held in memory up to {} MiB)",
            self.below.describe(),
            self.held.capacity() >> 20
        )
    }

    fn get_in_memory(&self, md5: &Md5Hex) -> Option<Bytes> {
        self.held.get(md5)
    }
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

/// A store whose originals are also kept in the fleet's Redis: a put writes both (the
/// local copy first, fsync'd), a get that misses locally reads the shared copy and keeps it
/// locally, a delete removes both. Its methods block on the shared tier's commands (each
/// bounded by its timeout): run them on the blocking pool, as every store's.
pub struct Shared<S> {
    below: S,
    /// The fleet's connection (none without `[cache.shared]`: then only `below` holds them).
    fleet: Option<std::sync::Arc<Fleet>>,
}

impl<S> Shared<S> {
    pub fn new(below: S, fleet: Option<std::sync::Arc<Fleet>>) -> Shared<S> {
        Shared { below, fleet }
    }

    /// Waits for a command of the shared tier (from the blocking pool, which has the runtime
    /// at hand).
    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Handle::current().block_on(f)
    }

    fn name(md5: &Md5Hex) -> String {
        format!("img:{}", md5.as_str())
    }
}

impl<S: ImageStore> ImageStore for Shared<S> {
    fn put(&self, md5: &Md5Hex, data: &[u8]) -> io::Result<bool> {
        let new = self.below.put(md5, data)?;
        let data = Bytes::copy_from_slice(data);
        let shared = match &self.fleet {
            Some(fleet) => Self::block_on(fleet.put_blob(&Self::name(md5), data)),
            None => false,
        };
        if !shared {
            tracing::warn!(md5 = md5.as_str(), "original not stored in the shared tier");
        }
        Ok(new)
    }

    fn get(&self, md5: &Md5Hex) -> io::Result<Option<Bytes>> {
        if let Some(b) = self.below.get(md5)? {
            return Ok(Some(b));
        }
        let fleet = self.fleet.as_ref();
        let Some(b) = fleet.and_then(|f| Self::block_on(f.get_blob(&Self::name(md5)))) else {
            return Ok(None);
        };
        // Another node's upload: checked against its name before it is kept.
        if Md5Hex::of(&b) != *md5 {
            return Ok(None);
        }
        self.below.put(md5, &b)?;
        Ok(Some(b))
    }

    fn delete(&self, md5: &Md5Hex) -> io::Result<bool> {
        if let Some(fleet) = &self.fleet {
            Self::block_on(fleet.delete_blob(&Self::name(md5)));
        }
        self.below.delete(md5)
    }

    fn describe(&self) -> String {
        format!("{} and the shared tier", self.below.describe())
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

    #[test]
    fn in_memory_front_holds_reads_and_forgets_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let s = InMemory::new(LocalDir::new(dir.path()), 1 << 20);
        let md5 = Md5Hex::of(b"abc");
        assert!(s.put(&md5, b"abc").unwrap());
        assert!(s.get_in_memory(&md5).is_none(), "uploads are not held");
        assert_eq!(&s.get(&md5).unwrap().unwrap()[..], b"abc");
        assert_eq!(&s.get_in_memory(&md5).unwrap()[..], b"abc");
        assert!(s.delete(&md5).unwrap());
        assert!(s.get_in_memory(&md5).is_none());
        assert!(s.get(&md5).unwrap().is_none());
        // An original larger than the whole budget is served but not held.
        let big = vec![7u8; 2 << 20];
        let m2 = Md5Hex::of(&big);
        s.put(&m2, &big).unwrap();
        assert_eq!(s.get(&m2).unwrap().unwrap().len(), big.len());
        assert!(s.get_in_memory(&m2).is_none());
    }
}
