//! Compressed variants on their way. Right after a fill stores a compressible body identity
//! only, [`crate::cache::Cache::spawn_variants`] builds gzip, zstd and br in the background and
//! publishes each (a new entry swapped in for the previous one) as soon as it is ready. The
//! entries of that sequence share one [`Pending`]: what has been tried and published so far, and
//! the latest entry. A delivery that would give identity to a client accepting a coding still
//! being built waits on it, briefly, for the entry that holds one ([`Pending::settled`]).
//!
//! Only entries of a sequence still in progress carry a `Pending`: the last one published has
//! none, so a hit in the steady state only checks that the field is empty.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::Entry;
use crate::compress::{AcceptEncoding, Encoding};

/// The progress of one entry's compressed variants.
#[derive(Debug)]
pub struct Pending {
    tx: watch::Sender<Progress>,
}

#[derive(Debug, Default)]
struct Progress {
    /// The work holds a compression permit (it is not queued behind other bodies').
    started: bool,
    /// Codings built (published or dropped for not making the body smaller), one bit each.
    tried: u8,
    /// Codings published.
    published: u8,
    /// Nothing more will come (every coding tried, or the sequence stopped).
    done: bool,
    /// The latest entry published (weak: entries hold their `Pending`).
    latest: Weak<Entry>,
}

fn bit(e: Encoding) -> u8 {
    1 << e as u8
}

impl Pending {
    pub fn new() -> Arc<Pending> {
        Arc::new(Pending {
            tx: watch::Sender::new(Progress::default()),
        })
    }

    /// The work got its compression permit and runs.
    pub fn start(&self) {
        self.tx.send_modify(|p| p.started = true);
    }

    /// `enc` was built: `published` is the entry now holding it, None if it was dropped.
    pub fn tried(&self, enc: Encoding, published: Option<&Arc<Entry>>) {
        self.tx.send_modify(|p| {
            p.tried |= bit(enc);
            if let Some(e) = published {
                p.published |= bit(enc);
                p.latest = Arc::downgrade(e);
            }
        });
    }

    /// Nothing more will be published (also when the work stopped or failed).
    pub fn finish(&self) {
        self.tx.send_modify(|p| p.done = true);
    }

    /// The entry of this sequence to deliver to a client with `accept`: `entry` itself when it
    /// holds a compressed coding the client accepts, the client accepts none, or the work is
    /// queued behind other bodies' (not started, and `can_start` says no permit is free: then
    /// identity at once beats a wait of unknown length); otherwise the latest entry once one the
    /// client accepts is published, every coding it accepts was tried, or `timeout` passed.
    pub async fn settled(
        &self,
        entry: &Arc<Entry>,
        accept: &AcceptEncoding,
        can_start: bool,
        timeout: Duration,
    ) -> Arc<Entry> {
        let wanted = Encoding::COMPRESSED
            .iter()
            .filter(|e| accept.accepts(**e))
            .fold(0, |m, e| m | bit(*e));
        let has_one = entry
            .by_size()
            .iter()
            .any(|e| *e != Encoding::Identity && accept.accepts(*e));
        if wanted == 0 || has_one {
            return Arc::clone(entry);
        }
        let mut rx = self.tx.subscribe();
        if !rx.borrow().started && !can_start {
            return Arc::clone(entry);
        }
        let ready =
            |p: &Progress| p.done || p.published & wanted != 0 || p.tried & wanted == wanted;
        let _ = tokio::time::timeout(timeout, rx.wait_for(ready)).await;
        let latest = rx.borrow().latest.upgrade();
        latest.unwrap_or_else(|| Arc::clone(entry))
    }
}

/// Marks a [`Pending`] done when dropped, however the work ends.
pub struct Finish(pub Option<Arc<Pending>>);

impl Drop for Finish {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::tests_support::fresh;
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, StatusCode};

    fn entry(encodings: &[Encoding]) -> Arc<Entry> {
        let bodies = encodings
            .iter()
            .map(|e| (*e, Bytes::from(vec![b'x'; 100 - *e as usize])))
            .collect();
        Arc::new(Entry::build(
            StatusCode::OK,
            HeaderMap::new(),
            bodies,
            fresh(),
            true,
        ))
    }

    fn ae(s: &str) -> AcceptEncoding {
        AcceptEncoding::parse(Some(&HeaderValue::from_str(s).unwrap()))
    }

    const LONG: Duration = Duration::from_secs(30);

    /// A gzip client waiting on `p` from `first`, in a task that has started waiting.
    async fn gzip_client(
        p: &Arc<Pending>,
        first: &Arc<Entry>,
        can_start: bool,
    ) -> tokio::task::JoinHandle<Arc<Entry>> {
        let (p, first) = (Arc::clone(p), Arc::clone(first));
        let waiter =
            tokio::spawn(async move { p.settled(&first, &ae("gzip"), can_start, LONG).await });
        tokio::task::yield_now().await;
        waiter
    }

    #[tokio::test]
    async fn no_wait_when_nothing_better_can_come() {
        let p = Pending::new();
        let identity = entry(&[Encoding::Identity]);
        let with_gzip = entry(&[Encoding::Identity, Encoding::Gzip]);
        // Accepts no coding; already holds one the client accepts.
        for (e, accept) in [(&identity, "identity"), (&with_gzip, "gzip, br")] {
            let got = p.settled(e, &ae(accept), true, LONG).await;
            assert!(Arc::ptr_eq(&got, e), "{accept}");
        }
    }

    #[tokio::test]
    async fn wakes_on_the_first_accepted_coding_published() {
        let p = Pending::new();
        let first = entry(&[Encoding::Identity]);
        let zstd = entry(&[Encoding::Identity, Encoding::Zstd]);
        let gzip = entry(&[Encoding::Identity, Encoding::Zstd, Encoding::Gzip]);
        let waiter = gzip_client(&p, &first, true).await;
        p.tried(Encoding::Zstd, Some(&zstd)); // not accepted: keeps waiting
        p.tried(Encoding::Gzip, Some(&gzip));
        assert!(Arc::ptr_eq(&waiter.await.unwrap(), &gzip));
    }

    #[tokio::test]
    async fn wakes_when_every_accepted_coding_was_tried_or_the_work_ends() {
        let p = Pending::new();
        let first = entry(&[Encoding::Identity]);
        // gzip dropped (not smaller): the gzip-only client gets what there is.
        p.tried(Encoding::Gzip, None);
        assert!(Arc::ptr_eq(
            &p.settled(&first, &ae("gzip"), true, LONG).await,
            &first
        ));
        // The work stops (the entry was replaced): the br client is released.
        drop(Finish(Some(Arc::clone(&p))));
        assert!(Arc::ptr_eq(
            &p.settled(&first, &ae("br"), true, LONG).await,
            &first
        ));
    }

    #[tokio::test]
    async fn no_wait_behind_other_bodies_compressions() {
        let p = Pending::new();
        let first = entry(&[Encoding::Identity]);
        // Queued: not started and no permit free.
        let got = p.settled(&first, &ae("gzip"), false, LONG).await;
        assert!(Arc::ptr_eq(&got, &first));
        // Once it runs, a client waits for its coding.
        p.start();
        let gzip = entry(&[Encoding::Identity, Encoding::Gzip]);
        let waiter = gzip_client(&p, &first, false).await;
        p.tried(Encoding::Gzip, Some(&gzip));
        assert!(Arc::ptr_eq(&waiter.await.unwrap(), &gzip));
    }

    #[tokio::test]
    async fn the_wait_is_bounded() {
        let p = Pending::new();
        let first = entry(&[Encoding::Identity]);
        let got = p
            .settled(&first, &ae("br"), true, Duration::from_millis(20))
            .await;
        assert!(Arc::ptr_eq(&got, &first));
    }
}
