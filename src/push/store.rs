//! A push route's store: its records held in memory (a sorted map by id, so a pattern is a
//! range), every change numbered by one sequence, and written to the durable log
//! ([`super::log`]) before it is acknowledged or seen. This file is the store's face: opening
//! it (replaying its log), writes (preconditions, the value made, the change staged and queued
//! for the writer), reads, lists and subscriptions, groups' expiry, and the observers of its
//! commits. Below it, as a ladder: [`super::writer`] (the group-commit thread and compaction),
//! [`super::state`] (what the lock guards: records, staged changes, sequence numbers),
//! [`super::history`], [`super::groups`], [`super::patch`] (merge patch, member set) and
//! [`super::record`] (records, changes, the [`Observer`] trait).
//!
//! A write is made (a merge patch applied, the value serialized) outside the state's lock,
//! which it takes only to check its preconditions, stage the change and queue it for the
//! writer, which commits queued changes in groups, settles them and hands them to the
//! observers ([`Store::observe`]: the subscribers' fan-out, the fleet's log) in sequence
//! order, then acknowledges them. Writes see the staged changes (preconditions, patches and
//! groups apply to the latest value); nothing else sees a change before it is durable. A
//! commit that fails undoes every change staged and not committed (the failed group and those
//! queued behind it, which fail too): no trace is left in memory, with observers or in the
//! log (cut back to its last whole frame, [`super::log`]), and the next write tries the log
//! again.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use serde_json::Value;
use tokio::sync::oneshot;

use super::fanout::{self, Event, Fanout, Publisher, Topic};
use super::groups::Group;
use super::history::History;
use super::log::{self, Log};
use super::patch::{merge_patch, set_member};
use super::record::now_ms;
pub use super::record::{Change, Named, Observer, Record, Source, COMPRESS_ABOVE};
use super::state::State;
use super::writer::{self, Job, Observers};
use crate::config::PushConfig;

/// What a write does to its record.
pub enum Write {
    Put(Value),
    /// A JSON merge patch (RFC 7396).
    Patch(Value),
    /// Sets one member (a path of object keys) of an existing record.
    Member(Vec<String>, Value),
    Delete,
}

/// The preconditions of a write.
#[derive(Default)]
pub struct Conditions {
    pub if_match: Option<HeaderValue>,
    pub if_none_match: Option<HeaderValue>,
}

#[derive(Debug)]
pub enum WriteError {
    NotFound,
    PreconditionFailed,
    /// A member path through a value that is not an object.
    Conflict(String),
    TooLarge(usize),
    /// The log could not be written (the write left no trace).
    Storage,
}

pub enum Written {
    Created(Arc<Record>),
    Replaced(Arc<Record>),
    Deleted,
}

/// A subscription's start: its receiver (taken before anything was read, so nothing falls
/// between), the events to send first, and the sequence number that the first live event
/// must pass (earlier ones are already in what is sent first).
pub struct Start {
    pub rx: fanout::Receiver,
    pub first: Vec<Arc<Event>>,
    pub skip_to: u64,
}

/// A push route's records.
pub struct Store {
    state: Arc<Mutex<State>>,
    pub fanout: Arc<Fanout>,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Told of every committed change, in commit order (the fan-out first).
    observers: Observers,
    /// The observer that shares its changes with the other nodes, when its route does
    /// (`share = true`): started once, kept across reloads.
    fleet: OnceLock<Arc<dyn Observer>>,
    max_record: AtomicUsize,
    /// Between heartbeats, in milliseconds.
    heartbeat_ms: AtomicU64,
    dir: PathBuf,
}

/// Stores open in this process, by directory: the guard that two stores never append to one
/// log. It is process-wide because what it guards is (a directory on disk): two servers in
/// one process naming one directory, or a reload that keeps a push route, get the store
/// already open there. It only finds a store by its directory; which stores a server shows
/// (status, metrics) is that server's own list ([`super::Stores`]).
fn open_stores() -> &'static Mutex<HashMap<PathBuf, Weak<Store>>> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Store>>>> = OnceLock::new();
    OPEN.get_or_init(Mutex::default)
}

/// What opening a store found.
#[derive(Debug, Default)]
pub struct Opened {
    pub records: usize,
    pub changes: usize,
    pub cut: u64,
}

impl Store {
    /// Opens the store in `cfg.dir` (creating it), replaying its log; or the one already open
    /// there (whose settings [`Store::configure`] changes).
    pub fn open(cfg: &PushConfig) -> io::Result<(Arc<Store>, Opened)> {
        let dir = &cfg.dir;
        let heartbeat = cfg.heartbeat.0;
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let key = dir.canonicalize()?;
        let mut open = open_stores().lock().expect("stores");
        if let Some(s) = open.get(&key).and_then(Weak::upgrade) {
            return Ok((s, Opened::default()));
        }
        let path = log::path(&key);
        let rec = log::recover(&path)?;
        let mut st = State::new(
            History::new(cfg.history.0 as usize, cfg.history_bytes.0),
            Group::all(&cfg.groups),
        );
        let opened = Opened {
            changes: rec.changes.len(),
            cut: rec.cut,
            records: 0,
        };
        for c in rec.changes {
            let new = c.value.map(|v| {
                let json = Bytes::from(serde_json::to_vec(&v).expect("a value serializes"));
                Arc::new(Record::new(v, json, c.seq, c.t))
            });
            let id: Arc<str> = c.id.into();
            st.staged = st.staged.max(c.seq);
            let change = st.stage(&id, c.seq, new, Source::Store);
            st.settle(&change);
        }
        let opened = Opened {
            records: st.records.len(),
            ..opened
        };
        let log = Log::open(&path, rec.valid_len)?;
        let state = Arc::new(Mutex::new(st));
        let fanout = Arc::new(Fanout::new(cfg.queue.0 as usize));
        fanout.set_queue_bytes(cfg.queue_bytes.0);
        let publisher: Arc<dyn Observer> = Arc::new(Publisher::new(&fanout));
        let observers: Observers = Arc::new(Mutex::new(vec![publisher]));
        let tx = writer::start(log, Arc::clone(&state), Arc::clone(&observers))?;
        let store = Arc::new(Store {
            state,
            fanout,
            jobs: Mutex::new(tx),
            observers,
            fleet: OnceLock::new(),
            max_record: AtomicUsize::new(cfg.max_record_size.0 as usize),
            heartbeat_ms: AtomicU64::new(heartbeat.as_millis() as u64),
            dir: key.clone(),
        });
        open.insert(key, Arc::downgrade(&store));
        // Heartbeats to idle subscribers and expiry of groups' records, until the store goes.
        let weak = Arc::downgrade(&store);
        let tick_of = |heartbeat: Duration| {
            heartbeat.clamp(Duration::from_millis(10), Duration::from_secs(1))
        };
        let mut tick = tick_of(heartbeat);
        std::thread::Builder::new()
            .name("larder-push-tick".into())
            .spawn(move || {
                let mut since_beat = Duration::ZERO;
                loop {
                    std::thread::sleep(tick);
                    let Some(store) = weak.upgrade() else { return };
                    since_beat += tick;
                    // A reload may have changed it.
                    let heartbeat =
                        Duration::from_millis(store.heartbeat_ms.load(Ordering::Relaxed));
                    tick = tick_of(heartbeat);
                    if since_beat >= heartbeat {
                        since_beat = Duration::ZERO;
                        store.fanout.heartbeat();
                    }
                    store.expire();
                }
            })?;
        Ok((store, opened))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Registers `o`: from the next commit on, it is told of every committed change, in commit
    /// order ([`Observer`]).
    pub fn observe(&self, o: Arc<dyn Observer>) {
        self.observers.lock().expect("observers").push(o);
    }

    /// Registers the observer that shares this store's changes with the other nodes, made by
    /// `start` the first time only (a reload keeps the one there is).
    pub fn share_with(&self, start: impl FnOnce() -> Arc<dyn Observer>) {
        self.fleet.get_or_init(|| {
            let o = start();
            self.observe(Arc::clone(&o));
            o
        });
    }

    /// Whether its changes are shared with the other nodes.
    pub fn shared(&self) -> bool {
        self.fleet.get().is_some()
    }

    /// Applies a push route's settings to its open store (a reload): the history's length and
    /// bytes (shortened at once), the ring (events and bytes) of topics made from now on, the
    /// largest record, the heartbeat, and the groups (their records counted again; those over
    /// a new maximum are removed now, as changes like any other; a new TTL applies at the next
    /// second's expiry).
    pub fn configure(&self, cfg: &PushConfig) {
        (self.max_record).store(cfg.max_record_size.0 as usize, Ordering::Relaxed);
        (self.heartbeat_ms).store(cfg.heartbeat.0.as_millis() as u64, Ordering::Relaxed);
        self.fanout.set_queue(cfg.queue.0 as usize);
        self.fanout.set_queue_bytes(cfg.queue_bytes.0);
        let mut st = self.state.lock().expect("state");
        st.history
            .bound(cfg.history.0 as usize, cfg.history_bytes.0);
        let fresh = Group::all(&cfg.groups);
        let same = fresh.len() == st.groups.len()
            && fresh.iter().zip(&st.groups).all(|(a, b)| a.same_limits(b));
        if same || st.failed {
            return;
        }
        st.groups = fresh;
        st.regroup();
        let changes = st.evict_over_max(None);
        if !changes.is_empty() {
            self.submit(&changes, None);
        }
    }

    /// The record `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Record>> {
        self.state.lock().expect("state").records.get(id).cloned()
    }

    /// The longest id among the stored records that is a proper segment prefix of `path`,
    /// and the rest of the path (a member path).
    pub fn split_member<'p>(&self, path: &'p str) -> Option<(&'p str, &'p str)> {
        let st = self.state.lock().expect("state");
        let mut cut = path.len();
        while let Some(i) = path[..cut].rfind('/') {
            cut = i;
            if st.records.contains_key(&path[..i]) {
                return Some((&path[..i], &path[i + 1..]));
            }
        }
        None
    }

    /// The records of `topic` now, and the sequence number they are current at.
    pub fn list(&self, topic: &Topic) -> (Vec<Named>, u64) {
        let st = self.state.lock().expect("state");
        (st.matching(topic).collect(), st.committed)
    }

    /// The sequence number of the last change committed.
    pub fn seq(&self) -> u64 {
        self.state.lock().expect("state").committed
    }

    /// The changes the history holds, and the bytes of their values ([`Change::weight`]).
    pub fn history(&self) -> (usize, u64) {
        self.state.lock().expect("state").history.size()
    }

    pub fn len(&self) -> usize {
        self.state.lock().expect("state").records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `w` to the record `id` once `cond` holds (a client's write, [`Source::Write`]),
    /// and returns when the change is durable. The change is committed and observed once it
    /// is staged, whether or not this future is still awaited.
    pub async fn write(
        &self,
        id: &str,
        w: Write,
        cond: &Conditions,
    ) -> Result<Written, WriteError> {
        self.write_from(id, w, cond, Source::Write).await
    }

    /// [`Store::write`] of a change from `source`.
    pub async fn write_from(
        &self,
        id: &str,
        w: Write,
        cond: &Conditions,
        source: Source,
    ) -> Result<Written, WriteError> {
        let (ack, written) = self.stage_write(id, w, cond, source)?;
        match ack.await {
            Ok(Ok(())) => Ok(written),
            _ => Err(WriteError::Storage),
        }
    }

    /// Stages `w` and queues its frame: the acknowledgement to wait for, and what it does.
    /// The new value is made (a patch applied, the value serialized) outside the state's lock,
    /// from the latest value; if another write changed the record meanwhile, a patch is made
    /// again from the new value (a PUT or DELETE only checks its preconditions again).
    fn stage_write(
        &self,
        id: &str,
        w: Write,
        cond: &Conditions,
        source: Source,
    ) -> Result<(oneshot::Receiver<io::Result<()>>, Written), WriteError> {
        /// Attempts made outside the lock before a patch is made under it.
        const TRIES: usize = 8;
        let max_record = self.max_record.load(Ordering::Relaxed);
        let mut seen = {
            let st = self.state.lock().expect("state");
            if st.failed {
                return Err(WriteError::Storage);
            }
            st.latest(id)
        };
        let mut made = None;
        for attempt in 0..=TRIES {
            if made.is_none() {
                check(cond, seen.as_deref(), &w)?;
                made = Some(make(seen.as_deref(), &w, max_record)?);
            }
            let mut st = self.state.lock().expect("state");
            if st.failed {
                return Err(WriteError::Storage);
            }
            let now = st.latest(id);
            if !same(&now, &seen) {
                seen = now;
                check(cond, seen.as_deref(), &w)?;
                if matches!(w, Write::Patch(_) | Write::Member(..)) {
                    if attempt < TRIES {
                        made = None;
                        continue;
                    }
                    made = Some(make(seen.as_deref(), &w, max_record)?);
                }
            }
            st.staged += 1;
            let seq = st.staged;
            let new = match (made.take().expect("made"), w) {
                (None, _) => None,
                // A PUT's value is its own: taken, not copied.
                (Some((None, json)), Write::Put(v)) | (Some((Some(v), json)), _) => {
                    Some(Arc::new(Record::new(v, json.into(), seq, now_ms())))
                }
                (Some((None, _)), _) => unreachable!("only a put's value is not made"),
            };
            let written = match (&new, &seen) {
                (Some(r), None) => Written::Created(Arc::clone(r)),
                (Some(r), Some(_)) => Written::Replaced(Arc::clone(r)),
                (None, _) => Written::Deleted,
            };
            let id = st.key(id);
            let mut changes = vec![st.stage(&id, seq, new, source)];
            changes.extend(st.evict_over_max(Some(&id)));
            let (tx, rx) = oneshot::channel();
            self.submit(&changes, Some(tx));
            return Ok((rx, written));
        }
        unreachable!("the last attempt makes its value under the lock")
    }

    /// Removes the records of groups with a `ttl` whose last write is older than it.
    pub fn expire(&self) {
        let mut st = self.state.lock().expect("state");
        if st.failed {
            return;
        }
        let changes = st.expire(now_ms());
        if !changes.is_empty() {
            self.submit(&changes, None);
        }
    }

    /// Queues `changes` (staged, under the state's lock: so every change staged and not yet
    /// committed is with the writer or in its queue) for the log's writer.
    fn submit(&self, changes: &[Arc<Change>], ack: Option<oneshot::Sender<io::Result<()>>>) {
        // The writer ends only when the store is dropped.
        let _ = self.jobs.lock().expect("jobs").send(Job::new(changes, ack));
    }

    /// Starts a subscription to `topic`: from now (with the matching records first when
    /// `init`), or resuming after the change `since` (from the history; a `reset` and the
    /// matching records when the history no longer reaches back that far).
    pub fn subscribe(&self, topic: &Arc<Topic>, since: Option<u64>, init: bool) -> Start {
        let st = self.state.lock().expect("state");
        let rx = topic.subscribe();
        let now = st.committed;
        let mut first = Vec::new();
        match since {
            Some(l) if st.history.covers(l, now) => {
                for c in st.history.after(l) {
                    match topic.sees(c) {
                        Some(true) => first.push(Arc::new(fanout::render(
                            c.seq,
                            "set",
                            &c.id,
                            c.new.as_ref().map(|r| &r.json[..]),
                        ))),
                        Some(false) => {
                            first.push(Arc::new(fanout::render(c.seq, "remove", &c.id, None)))
                        }
                        None => {}
                    }
                }
            }
            _ => {
                if since.is_some() {
                    first.push(Arc::new(fanout::control(
                        0,
                        "reset",
                        "{\"reason\":\"gap\"}",
                    )));
                }
                if init || since.is_some() {
                    for (id, r) in st.matching(topic) {
                        first.push(Arc::new(fanout::render(0, "set", &id, Some(&r.json))));
                    }
                }
                first.push(Arc::new(fanout::control(
                    now,
                    "init",
                    &format!("{{\"seq\":{now}}}"),
                )));
            }
        }
        Start {
            rx,
            first,
            skip_to: now,
        }
    }
}

/// Whether `w` may be written over `old` under `cond` (its preconditions, and a record to
/// change or delete).
fn check(cond: &Conditions, old: Option<&Record>, w: &Write) -> Result<(), WriteError> {
    let etag = old.map(|r| &r.etag);
    if let Some(im) = &cond.if_match {
        if !crate::http::etag::list_matches(im, etag, true) {
            return Err(WriteError::PreconditionFailed);
        }
    }
    if let Some(inm) = &cond.if_none_match {
        if crate::http::etag::list_matches(inm, etag, false) {
            return Err(WriteError::PreconditionFailed);
        }
    }
    match w {
        Write::Put(_) => Ok(()),
        _ if old.is_none() => Err(WriteError::NotFound),
        _ => Ok(()),
    }
}

/// The value `w` makes of `old` and its JSON text (None: a removal). A PUT's value is not
/// copied (None beside its text): the write takes it.
type Made = Option<(Option<Value>, Vec<u8>)>;

fn make(old: Option<&Record>, w: &Write, max_record: usize) -> Result<Made, WriteError> {
    let value = match (w, old) {
        (Write::Delete, _) => return Ok(None),
        (Write::Put(_), _) => None,
        (_, None) => return Err(WriteError::NotFound),
        (Write::Patch(p), Some(old)) => {
            let mut v = old.value.clone();
            merge_patch(&mut v, p.clone());
            Some(v)
        }
        (Write::Member(path, m), Some(old)) => {
            let mut v = old.value.clone();
            set_member(&mut v, path, m.clone()).map_err(WriteError::Conflict)?;
            Some(v)
        }
    };
    let json = match (&value, w) {
        (Some(v), _) | (None, Write::Put(v)) => serde_json::to_vec(v).expect("a value serializes"),
        (None, _) => unreachable!("made above"),
    };
    if json.len() > max_record {
        return Err(WriteError::TooLarge(max_record));
    }
    Ok(Some((value, json)))
}

/// Whether two reads found the same version of a record.
fn same(a: &Option<Arc<Record>>, b: &Option<Arc<Record>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store_in(dir: &Path, f: impl FnOnce(&mut PushConfig)) -> Arc<Store> {
        let mut cfg = PushConfig::new_dir(dir.to_path_buf(), None);
        f(&mut cfg);
        Store::open(&cfg).unwrap().0
    }

    /// Records what it is told of.
    #[derive(Default)]
    struct Seen(Mutex<Vec<(u64, String, Source)>>);

    impl Observer for Seen {
        fn committed(&self, changes: &[Arc<Change>]) {
            let mut seen = self.0.lock().unwrap();
            seen.extend(changes.iter().map(|c| (c.seq, c.id.to_string(), c.source)));
        }
    }

    /// An observer is told of every committed change in sequence order, with its source,
    /// those of writes whose futures were dropped once staged included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn observers_get_every_commit_in_order_whoever_waits_for_it() {
        use futures_util::FutureExt;
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), |_| {});
        let seen = Arc::new(Seen::default());
        store.observe(Arc::clone(&seen) as Arc<dyn Observer>);
        let tasks: Vec<_> = (0..4)
            .map(|t| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let none = Conditions::default();
                    for i in 0..50 {
                        let w = Write::Put(json!({ "t": t, "i": i }));
                        let id = format!("r/{}", i % 3);
                        if i % 2 == 0 {
                            // Staged on its first poll, then dropped: the request gone. (It
                            // may be done by then, if the writer thread was quick: either way
                            // the change is observed once.)
                            let _ = store.write(&id, w, &none).now_or_never();
                        } else {
                            store
                                .write_from(&id, w, &none, Source::Fleet)
                                .await
                                .unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // Acknowledged after every change staged before it.
        let none = Conditions::default();
        store
            .write("last", Write::Put(json!(1)), &none)
            .await
            .unwrap();
        let seen = seen.0.lock().unwrap();
        let seqs: Vec<u64> = seen.iter().map(|c| c.0).collect();
        assert_eq!(seqs, (1..=201).collect::<Vec<_>>());
        let from = |s| seen.iter().filter(|c| c.2 == s).count();
        assert_eq!((from(Source::Write), from(Source::Fleet)), (101, 100));
        assert_eq!(store.seq(), 201);
    }

    /// Many large records written over a few ids: the history keeps its bytes under
    /// `history_bytes` (dropping its oldest changes), and counts them exactly.
    #[tokio::test(flavor = "current_thread")]
    async fn the_history_is_bounded_in_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let bound = 256 * 1024;
        let store = store_in(dir.path(), |c| {
            c.history_bytes = crate::config::ByteSize(bound);
        });
        let blob = "x".repeat(20_000);
        let none = Conditions::default();
        for i in 0..300 {
            let v = json!({"i": i, "blob": blob});
            let id = format!("k/{}", i % 10);
            assert!(store.write(&id, Write::Put(v), &none).await.is_ok());
        }
        let (changes, bytes) = store.history();
        assert!(bytes <= bound, "{bytes} bytes held, bound {bound}");
        assert!(changes >= 5, "the newest changes are kept: {changes}");
        let st = store.state.lock().unwrap();
        assert_eq!(bytes, st.history.iter().map(|c| c.weight()).sum::<u64>());
        assert_eq!(st.history.iter().last().unwrap().seq, 300);
    }

    /// Patches made outside the lock from many tasks at once: none is lost (a patch made from
    /// a value another write replaced meanwhile is made again).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_patches_of_one_record_are_all_applied() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path(), |_| {});
        let none = Conditions::default();
        store
            .write("r", Write::Put(json!({})), &none)
            .await
            .unwrap();
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let none = Conditions::default();
                    for i in 0..25 {
                        let p = json!({ format!("t{t}i{i}"): i });
                        let w = store.write("r", Write::Patch(p), &none);
                        assert!(w.await.is_ok());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let r = store.get("r").unwrap();
        assert_eq!(r.value.as_object().unwrap().len(), 8 * 25);
        assert_eq!(r.seq, 1 + 8 * 25);
    }

    /// With the log on a full file system (a tmpfs mounted for the test), concurrent writes
    /// all fail, those queued behind the first failed commit included, and leave nothing in
    /// memory; once there is room, the next write succeeds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_that_fail_to_commit_leave_nothing_and_writing_resumes() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let small = super::super::log::Tmpfs::mount(dir.path(), "128k");
        let mnt = small.0.clone();
        let store = store_in(&mnt, |_| {});
        let none = Conditions::default();
        store.write("a", Write::Put(json!(1)), &none).await.unwrap();
        let filler = mnt.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write(&[0u8; 4096]).is_ok_and(|n| n > 0) {}
        // Every frame larger than the room left in the log's last page.
        let big = json!("z".repeat(30_000));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (store, big) = (Arc::clone(&store), big.clone());
                tokio::spawn(async move {
                    let none = Conditions::default();
                    let w = if i % 2 == 0 {
                        Write::Put(big)
                    } else {
                        Write::Patch(json!({ "p": big }))
                    };
                    let id = if i % 4 == 1 {
                        "a".to_string()
                    } else {
                        format!("n/{i}")
                    };
                    store.write(&id, w, &none).await
                })
            })
            .collect();
        for t in tasks {
            let r = t.await.unwrap();
            assert!(
                matches!(r, Err(WriteError::Storage) | Err(WriteError::NotFound)),
                "{:?}",
                r.as_ref().err()
            );
        }
        assert_eq!(store.len(), 1);
        assert_eq!(store.get("a").unwrap().value, json!(1));
        assert_eq!((store.seq(), store.history().0), (1, 1));
        assert!(store.state.lock().unwrap().pending.is_empty());
        drop(f);
        std::fs::remove_file(&filler).unwrap();
        let w = store.write("b", Write::Put(big.clone()), &none).await;
        assert!(matches!(w, Ok(Written::Created(_))));
        assert_eq!(store.get("b").unwrap().value, big);
    }
}
