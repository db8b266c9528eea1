//! Purges the tiers below memory cannot apply by scanning (the disk tier has no key listing; a
//! record in flight to the shared tier may land after a purge): each is kept as a *ban*, Varnish's
//! word for it, a rule with the time it was made. A record read from a lower tier that some later
//! ban matches is a miss, and is dropped.
//!
//! The list is bounded ([`MAX_BANS`]); when the oldest ban is dropped its time becomes the
//! *floor*, and every record received before the floor is a miss too (conservative: an
//! unaffected old record is fetched again, a purged one is never served). With a disk tier the
//! list is written to `bans.json` in its directory, so that a restart keeps it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::entry::Entry;
use super::key::CacheKey;
use super::purge::Purge;

/// Bans kept at most.
pub(super) const MAX_BANS: usize = 4096;

/// One purge, as a lower tier applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Ban {
    /// `url`, `prefix` or `tag`.
    pub kind: String,
    pub target: String,
    /// When it was made, ms since the Unix epoch.
    pub at_ms: u64,
}

impl Ban {
    pub(super) fn of(target: &Purge, at: SystemTime) -> Ban {
        let (kind, target) = match target {
            Purge::Url(k) => ("url", k.as_str().to_owned()),
            Purge::Prefix(p) => ("prefix", p.clone()),
            Purge::Tag(t) => ("tag", t.clone()),
        };
        Ban {
            kind: kind.into(),
            target,
            at_ms: millis(at),
        }
    }

    /// The purge this ban stands for (`None` for a kind this version does not know).
    pub(super) fn purge(&self) -> Option<Purge> {
        Some(match self.kind.as_str() {
            "url" => Purge::Url(CacheKey::from_string(self.target.clone())),
            "prefix" => Purge::Prefix(self.target.clone()),
            "tag" => Purge::Tag(self.target.clone()),
            _ => return None,
        })
    }

    fn matches(&self, key: &CacheKey, entry: &Entry) -> bool {
        match self.kind.as_str() {
            "url" => key.as_str() == self.target,
            "prefix" => key.as_str().starts_with(&self.target),
            "tag" => entry.tags.iter().any(|t| **t == *self.target),
            _ => false,
        }
    }
}

#[derive(Default, Serialize, Deserialize)]
struct List {
    floor_ms: u64,
    bans: VecDeque<Ban>,
}

/// The bans in force.
pub(super) struct Bans {
    list: RwLock<List>,
    /// Whether there is anything to check (the common case is not).
    any: AtomicBool,
    file: Option<PathBuf>,
}

impl Bans {
    /// An empty list, or the one `file` holds (an unreadable file is a floor of `now`: nothing
    /// stored before it is trusted).
    pub(super) fn load(file: Option<PathBuf>, now: SystemTime) -> Bans {
        let list = match &file {
            None => List::default(),
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                    tracing::warn!(path = %path.display(), error = %e,
                        "unreadable purge list: records stored before now are not served");
                    List {
                        floor_ms: millis(now),
                        bans: VecDeque::new(),
                    }
                }),
                Err(_) => List::default(),
            },
        };
        let any = list.floor_ms > 0 || !list.bans.is_empty();
        Bans {
            list: RwLock::new(list),
            any: AtomicBool::new(any),
            file,
        }
    }

    /// Adds a ban (unless it is known already); whether it was new.
    pub(super) fn add(&self, ban: Ban) -> bool {
        self.add_all(vec![ban]) == 1
    }

    /// Adds bans (those not known already), saving the list once; how many were new.
    pub(super) fn add_all(&self, bans: Vec<Ban>) -> usize {
        let mut list = self.list.write().expect("not poisoned");
        let before = list.bans.len();
        let mut new = 0;
        for ban in bans {
            // A replay of the purge stream brings the bans already known.
            if ban.at_ms < list.floor_ms || list.bans.contains(&ban) {
                continue;
            }
            list.bans.push_back(ban);
            new += 1;
        }
        if new == 0 {
            return 0;
        }
        debug_assert!(list.bans.len() >= before);
        while list.bans.len() > MAX_BANS {
            let oldest = list.bans.pop_front().expect("not empty");
            list.floor_ms = list.floor_ms.max(oldest.at_ms);
        }
        self.any.store(true, Ordering::Release);
        if let Some(path) = &self.file {
            // Written whole and renamed over the old list: a crash leaves one or the other.
            let tmp = path.with_extension("tmp");
            let saved = serde_json::to_vec(&*list)
                .map_err(std::io::Error::other)
                .and_then(|bytes| std::fs::write(&tmp, bytes))
                .and_then(|()| std::fs::rename(&tmp, path));
            if let Err(e) = saved {
                tracing::warn!(path = %path.display(), error = %e, "purge list not saved");
            }
        }
        new
    }

    /// Whether a record of `entry` under `key` is purged.
    pub(super) fn bans(&self, key: &CacheKey, entry: &Entry) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let received = millis(entry.freshness.received);
        let list = self.list.read().expect("not poisoned");
        received < list.floor_ms
            || list
                .bans
                .iter()
                .any(|b| received <= b.at_ms && b.matches(key, entry))
    }
}

pub(super) fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::tests_support::fresh;
    use crate::compress::Encoding;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    fn entry(tags: &[&str], received: SystemTime) -> Entry {
        let mut f = fresh();
        f.received = received;
        let mut e = Entry::build(
            StatusCode::OK,
            HeaderMap::new(),
            vec![(Encoding::Identity, Bytes::from_static(b"x"))],
            f,
            false,
        );
        e.tags = tags.iter().map(|t| Box::from(*t)).collect();
        e
    }

    #[test]
    fn a_ban_hides_what_was_stored_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bans.json");
        let bans = Bans::load(Some(file.clone()), SystemTime::now());
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let key = CacheKey::from_parts("http", "h", "/a/1");
        let old = entry(&["red"], t0);
        let new = entry(&["red"], t0 + Duration::from_secs(10));
        assert!(!bans.bans(&key, &old));
        let at = t0 + Duration::from_secs(5);
        assert!(bans.add(Ban::of(&Purge::Tag("red".into()), at)));
        assert!(!bans.add(Ban::of(&Purge::Tag("red".into()), at)));
        assert!(bans.bans(&key, &old));
        assert!(!bans.bans(&key, &new), "stored after the purge");
        bans.add(Ban::of(&Purge::Prefix("http://h/b".into()), at));
        assert!(!bans.bans(&key, &entry(&[], t0)));
        // Kept across a restart.
        let again = Bans::load(Some(file), SystemTime::now());
        assert!(again.bans(&key, &old));
    }

    #[test]
    fn the_oldest_ban_dropped_becomes_the_floor() {
        let bans = Bans::load(None, SystemTime::now());
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for i in 0..=MAX_BANS as u64 {
            let ban = Ban::of(&Purge::Tag(format!("t{i}")), t0 + Duration::from_secs(i));
            bans.add(ban);
        }
        let key = CacheKey::from_parts("http", "h", "/");
        assert!(bans.bans(&key, &entry(&[], t0 - Duration::from_secs(1))));
        assert!(!bans.bans(&key, &entry(&[], t0 + Duration::from_secs(1))));
    }
}
