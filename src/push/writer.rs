//! The group-commit writer of a push store: a thread of its own that takes the changes staged
//! by writes ([`Job`]s, queued under the state's lock, so in sequence order), commits them to
//! the durable log ([`super::log`]) in groups, then settles them (the records that reads see,
//! the history), hands them to the store's observers ([`Observer`]: the subscribers' fan-out,
//! the fleet's log) in commit order, and acknowledges them. A commit that fails undoes every
//! change staged and not committed (the failed group and those queued behind it, which fail
//! too). The writer compacts the log when it has grown past twice the live records.

use std::io;
use std::sync::{mpsc, Arc, Mutex};

use tokio::sync::oneshot;

use super::log::{self, Log};
use super::record::{now_ms, Change, Observer, Record};
use super::state::State;

/// The observers registered on a store, which the writer calls in turn.
pub type Observers = Arc<Mutex<Vec<Arc<dyn Observer>>>>;

/// Staged changes for the writer: their frames, and the acknowledgement a write waits for.
pub struct Job {
    frames: Vec<u8>,
    changes: Vec<Arc<Change>>,
    ack: Option<oneshot::Sender<io::Result<()>>>,
}

impl Job {
    /// `changes` framed for the log.
    pub fn new(changes: &[Arc<Change>], ack: Option<oneshot::Sender<io::Result<()>>>) -> Job {
        let mut frames = Vec::new();
        for c in changes {
            let t = c.new.as_ref().map_or_else(now_ms, |r| r.t);
            log::frame(
                &mut frames,
                c.seq,
                &c.id,
                t,
                c.new.as_ref().map(|r| &r.json[..]),
            );
        }
        Job {
            frames,
            changes: changes.to_vec(),
            ack,
        }
    }
}

/// Starts the writer of `log` on its own thread: the queue to send it jobs (it ends when the
/// queue's sender is dropped).
pub fn start(
    log: Log,
    state: Arc<Mutex<State>>,
    observers: Observers,
) -> io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("larder-push-log".into())
        .spawn(move || writer(rx, log, state, observers))?;
    Ok(tx)
}

fn writer(rx: mpsc::Receiver<Job>, mut log: Log, state: Arc<Mutex<State>>, observers: Observers) {
    const COMPACT_MIN: u64 = 8 << 20;
    let mut retry_compact_at = 0;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < 4096 {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let frames: Vec<u8> = if jobs.len() == 1 {
            std::mem::take(&mut jobs[0].frames)
        } else {
            jobs.iter().flat_map(|j| j.frames.iter().copied()).collect()
        };
        let res = log.commit(&frames);
        if let Err(e) = &res {
            // Every change staged and not committed is in `jobs` or queued behind them (they
            // are queued under the state's lock, held here): all of them fail, and are undone.
            let mut st = state.lock().expect("state");
            while let Ok(j) = rx.try_recv() {
                jobs.push(j);
            }
            st.unstage();
            drop(st);
            tracing::error!(error = %e, writes = jobs.len(), "push: the change log could not be written; the writes failed and were undone");
        } else {
            let committed: Vec<Arc<Change>> = (jobs.iter())
                .flat_map(|j| j.changes.iter().cloned())
                .collect();
            {
                let mut st = state.lock().expect("state");
                for c in &committed {
                    st.settle(c);
                }
            }
            let observers = observers.lock().expect("observers").clone();
            for o in &observers {
                o.committed(&committed);
            }
        }
        for j in jobs {
            if let Some(ack) = j.ack {
                let _ = ack.send(match &res {
                    Ok(()) => Ok(()),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                });
            }
        }
        if res.is_err() {
            continue;
        }
        let live = state.lock().expect("state").live_bytes;
        if log.len > COMPACT_MIN.max(2 * live).max(retry_compact_at) {
            let (seq, records) = {
                let st = state.lock().expect("state");
                let records: Vec<(Arc<str>, Arc<Record>)> = (st.records.iter())
                    .map(|(k, v)| (Arc::clone(k), Arc::clone(v)))
                    .collect();
                // The committed records, as of the last committed change: changes staged
                // after it are appended after the snapshot.
                (st.committed, records)
            };
            let mut frames = Vec::with_capacity(live as usize);
            for (id, r) in &records {
                log::frame(&mut frames, r.seq, id, r.t, Some(&r.json));
            }
            match log.compact(seq, records.len(), &frames) {
                Ok(()) => tracing::debug!(bytes = log.len, "push: change log compacted"),
                Err(e) if log.broken => {
                    tracing::error!(error = %e, "push: the compacted change log could not be opened; writes are refused until restart");
                    state.lock().expect("state").failed = true;
                }
                Err(e) => {
                    // The log is as it was; tried again once it has grown by COMPACT_MIN.
                    tracing::error!(error = %e, "push: compacting the change log failed");
                    retry_compact_at = log.len + COMPACT_MIN;
                }
            }
        }
    }
}
