//! A file that rules read (an htpasswd, a keys file, a JWKS), read again when it changes: on
//! the request path its stamp (modification time, length, inode) is looked at at most once a
//! second of the cache's clock (its monotonic reading, which tests move; one `stat`), and only a
//! changed file is read and parsed again.
//! A file that cannot be read or parsed any more keeps what was read before (a half-written
//! file is not taken); one that could never be read holds nothing, and the rule refuses every
//! request (fails closed).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwapOption;

use crate::clock::Clock;
use crate::config::rules_auth::read_auth_file;
use crate::phases::Cx;

/// The whole seconds of a monotonic reading.
fn second(ns: u64) -> u64 {
    ns / 1_000_000_000
}

/// What identifies a version of a file without reading it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode: m.ino(),
    })
}

/// One reading of the file: what it held, parsed.
struct Loaded<T> {
    stamp: Stamp,
    value: Arc<T>,
}

/// A watched file whose contents are parsed into a `T`.
pub struct Watched<T> {
    path: PathBuf,
    clock: Clock,
    parse: fn(&str) -> Result<T, String>,
    current: ArcSwapOption<Loaded<T>>,
    /// The clock's second (of its monotonic reading) when the stamp was last looked at.
    looked: AtomicU64,
}

impl<T: Send + Sync + 'static> Watched<T> {
    /// Reads `path` now (a failure is logged; the file is looked at again later).
    pub fn open(path: &Path, clock: &Clock, parse: fn(&str) -> Result<T, String>) -> Watched<T> {
        let w = Watched {
            path: path.to_path_buf(),
            clock: clock.clone(),
            parse,
            current: ArcSwapOption::empty(),
            looked: AtomicU64::new(0),
        };
        w.looked
            .store(second(w.clock.monotonic_ns()), Ordering::Relaxed);
        w.read_if_changed();
        w
    }

    /// What the file holds now (None: it was never read), looking at its stamp first if that
    /// was not done this second.
    pub fn get(&self) -> Option<Arc<T>> {
        self.get_at(self.clock.monotonic_ns())
    }

    /// [`Watched::get`] at ① of the request `cx` (its one reading of the clock).
    pub fn get_in(&self, cx: &mut Cx) -> Option<Arc<T>> {
        self.get_at(cx.monotonic_ns(&self.clock))
    }

    /// [`Watched::get`] at `now_ns` of the clock's monotonic reading.
    fn get_at(&self, now_ns: u64) -> Option<Arc<T>> {
        let now = second(now_ns);
        let before = self.looked.load(Ordering::Relaxed);
        if before != now
            && (self.looked)
                .compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.read_if_changed();
        }
        self.current.load().as_ref().map(|l| Arc::clone(&l.value))
    }

    /// Reads and parses the file if its stamp is not the one read last.
    fn read_if_changed(&self) {
        let Some(now) = stamp(&self.path) else {
            if self.current.load().is_none() {
                tracing::warn!(file = %self.path.display(), "a rule's file cannot be read: its requests are refused");
            }
            return;
        };
        if (self.current.load().as_ref()).is_some_and(|l| l.stamp == now) {
            return;
        }
        match read_auth_file(&self.path).and_then(|t| (self.parse)(&t)) {
            Ok(value) => {
                tracing::info!(file = %self.path.display(), "a rule's file read");
                self.current.store(Some(Arc::new(Loaded {
                    stamp: now,
                    value: Arc::new(value),
                })));
            }
            Err(e) => tracing::warn!(
                file = %self.path.display(),
                error = %e,
                "a rule's file changed but cannot be used: what was read before stays"
            ),
        }
    }
}
