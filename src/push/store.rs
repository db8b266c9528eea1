//! The records of a push route: held in memory (a sorted map by id, so a pattern is a range),
//! every change numbered by one sequence, kept in a bounded history for resuming subscribers,
//! and written to the durable log ([`super::log`]) before it is acknowledged or published.
//!
//! A write is made (a merge patch applied, the value serialized) outside the state's lock,
//! which it takes only to check its preconditions, stage the change and queue its frame; the
//! log's writer thread commits queued frames in groups, then settles the changes (the records
//! that reads, lists and subscriptions see, and the history), publishes them to the subscribers
//! ([`super::fanout`]) in sequence order and acknowledges them. Writes see the staged changes
//! (preconditions, patches and groups apply to the latest value); nothing else sees a change
//! before it is durable. A commit that fails undoes every change staged and not committed
//! (the failed group and those queued behind it, which fail too): no trace is left in memory,
//! with subscribers or in the log (cut back to its last whole frame, [`super::log`]), and the
//! next write tries the log again.
//!
//! The history is bounded by its count of changes (`history`) and by the bytes of the values
//! it holds (`history_bytes`).
//!
//! Groups (`[[...push.group]]`) bound the count of records of an id pattern (the least
//! recently written is removed) and their lifetime (removed `ttl` after their last write).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderValue;
use serde_json::Value;
use tokio::sync::oneshot;

use super::fanout::{self, Event, Fanout, Topic};
use super::filter::IdPattern;
use super::log::{self, Log};
use crate::compress::Encoding;
use crate::config::{CompressionConfig, GroupConfig, PushConfig};

/// A record as stored: its value, its serialized text (what GET and events send), its
/// entity-tag and the sequence number of its last change.
pub struct Record {
    pub value: Value,
    pub json: Bytes,
    pub etag: HeaderValue,
    pub seq: u64,
    /// When it was last written, in milliseconds since the Unix epoch.
    pub t: u64,
    /// Compressed copies for GET, made off the async workers after the first request
    /// that could use them (that one, like a cache fill's first client, gets identity).
    encoded: OnceLock<Vec<(Encoding, Bytes)>>,
    compressing: std::sync::atomic::AtomicBool,
}

/// Records this large or larger are sent compressed to clients that accept it.
pub const COMPRESS_ABOVE: usize = 1024;

impl Record {
    fn new(value: Value, json: Bytes, seq: u64, t: u64) -> Record {
        Record {
            value,
            json,
            etag: HeaderValue::try_from(format!("\"s{seq}\"")).expect("ASCII"),
            seq,
            t,
            encoded: OnceLock::new(),
            compressing: Default::default(),
        }
    }

    /// The record's compressed copies (gzip, br, zstd), smallest first, once made: empty for
    /// small records, and until a blocking-pool thread has made them (the first call for a
    /// large record starts that).
    pub fn encoded(self: &Arc<Self>) -> &[(Encoding, Bytes)] {
        if let Some(v) = self.encoded.get() {
            return v;
        }
        if self.json.len() >= COMPRESS_ABOVE
            && !self
                .compressing
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let r = Arc::clone(self);
            let make = move || {
                r.encoded.get_or_init(|| compress(&r.json));
            };
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(make)),
                Err(_) => make(),
            }
        }
        self.encoded.get().map_or(&[], Vec::as_slice)
    }
}

/// `json` in every compressed coding that makes it smaller, smallest first.
fn compress(json: &[u8]) -> Vec<(Encoding, Bytes)> {
    // Levels that keep a 1 MiB record's compression in the milliseconds.
    let cfg = CompressionConfig {
        brotli_level: crate::config::Bounded(5),
        zstd_level: crate::config::Bounded(6),
        gzip_level: crate::config::Bounded(6),
        ..Default::default()
    };
    let mut v: Vec<(Encoding, Bytes)> = (Encoding::COMPRESSED.iter())
        .map(|&e| (e, crate::compress::encode(json, e, &cfg)))
        .filter(|(_, b)| b.len() < json.len())
        .collect();
    v.sort_by_key(|(_, b)| b.len());
    v
}

/// A record with its id.
pub type Named = (Arc<str>, Arc<Record>);

/// One change: the record before and after (None: absent).
pub struct Change {
    pub seq: u64,
    pub id: Arc<str>,
    pub old: Option<Arc<Record>>,
    pub new: Option<Arc<Record>>,
}

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

struct Group {
    pattern: IdPattern,
    max: Option<usize>,
    ttl: Option<Duration>,
    /// The group's records by the sequence number of their last write: oldest first.
    order: BTreeMap<u64, Arc<str>>,
}

impl Group {
    /// The groups of `cfg`, with no records yet.
    fn all(cfg: &[GroupConfig]) -> Vec<Group> {
        (cfg.iter())
            .map(|g| Group {
                pattern: g.pattern.clone(),
                max: g.max.map(|m| m.0 as usize),
                ttl: g.ttl.map(|t| t.0),
                order: BTreeMap::new(),
            })
            .collect()
    }

    /// Whether `other` has the same pattern and limits (whatever records each counts).
    fn same_limits(&self, other: &Group) -> bool {
        self.pattern == other.pattern && self.max == other.max && self.ttl == other.ttl
    }
}

struct State {
    /// The committed records: what reads, lists and subscriptions see.
    records: BTreeMap<Arc<str>, Arc<Record>>,
    /// Records with changes staged and not yet committed: how many changes, and the value after
    /// the last (None: removed). Writes see these over `records`.
    pending: HashMap<Arc<str>, (usize, Option<Arc<Record>>)>,
    /// The sequence number of the last change staged (failed ones leave gaps: an entity-tag
    /// a reader never saw is still never given twice).
    staged: u64,
    /// The sequence number of the last change committed.
    committed: u64,
    /// Committed changes, oldest first, for resuming subscribers.
    history: VecDeque<Arc<Change>>,
    history_max: usize,
    /// The bytes of the values the history holds ([`Change::weight`]), and their bound.
    history_bytes: u64,
    history_bytes_max: u64,
    /// Counted over the latest values (staged changes included).
    groups: Vec<Group>,
    /// Bytes the live records take in a compacted log (about).
    live_bytes: u64,
    /// A compaction lost the log: writes are refused until a restart.
    failed: bool,
}

impl Change {
    /// What the change holds in the history: its id and the JSON text of its values before
    /// and after (an upper bound: a value may be held by two changes).
    pub fn weight(&self) -> u64 {
        let v = |r: &Option<Arc<Record>>| r.as_ref().map_or(0, |r| r.json.len());
        (self.id.len() + v(&self.old) + v(&self.new)) as u64
    }
}

struct Job {
    frames: Vec<u8>,
    changes: Vec<Arc<Change>>,
    ack: Option<oneshot::Sender<io::Result<()>>>,
}

/// A push route's records.
pub struct Store {
    state: Arc<Mutex<State>>,
    pub fanout: Arc<Fanout>,
    jobs: Mutex<mpsc::Sender<Job>>,
    max_record: AtomicUsize,
    /// Between heartbeats, in milliseconds.
    heartbeat_ms: AtomicU64,
    dir: PathBuf,
    /// Its link to the other nodes, when its route shares its records (`share = true`).
    pub replica: OnceLock<Arc<super::replicate::Replica>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Stores open in this process, by directory: a reload that keeps a push route keeps its
/// store (two stores must never append to one log).
fn open_stores() -> &'static Mutex<HashMap<PathBuf, Weak<Store>>> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Store>>>> = OnceLock::new();
    OPEN.get_or_init(Mutex::default)
}

/// The stores open now.
pub fn open() -> Vec<Arc<Store>> {
    let open = open_stores().lock().expect("stores");
    let mut v: Vec<Arc<Store>> = open.values().filter_map(Weak::upgrade).collect();
    v.sort_by(|a, b| a.dir.cmp(&b.dir));
    v
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
        let mut st = State {
            records: BTreeMap::new(),
            pending: HashMap::new(),
            staged: 0,
            committed: 0,
            history: VecDeque::new(),
            history_max: cfg.history.0 as usize,
            history_bytes: 0,
            history_bytes_max: cfg.history_bytes.0,
            groups: Group::all(&cfg.groups),
            live_bytes: 0,
            failed: false,
        };
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
            let change = st.stage(&id, c.seq, new);
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
        let (tx, rx) = mpsc::channel();
        let (w_state, w_fanout) = (Arc::clone(&state), Arc::clone(&fanout));
        // Committed changes are published from a task on the server's runtime when there is
        // one: the subscribers it wakes go to that worker's own queue, not the runtime's
        // shared one (as wakes from another thread would).
        let publish = match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Arc<Change>>>();
                let f = Arc::clone(&fanout);
                rt.spawn(async move {
                    while let Some(changes) = rx.recv().await {
                        f.publish(&changes);
                    }
                });
                Publish::Task(tx)
            }
            Err(_) => Publish::Here,
        };
        std::thread::Builder::new()
            .name("larder-push-log".into())
            .spawn(move || writer(rx, log, w_state, w_fanout, publish))?;
        let store = Arc::new(Store {
            state,
            fanout,
            jobs: Mutex::new(tx),
            max_record: AtomicUsize::new(cfg.max_record_size.0 as usize),
            heartbeat_ms: AtomicU64::new(heartbeat.as_millis() as u64),
            dir: key.clone(),
            replica: OnceLock::new(),
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
        st.history_max = cfg.history.0 as usize;
        st.history_bytes_max = cfg.history_bytes.0;
        st.trim_history();
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
        let st = self.state.lock().expect("state");
        (st.history.len(), st.history_bytes)
    }

    pub fn len(&self) -> usize {
        self.state.lock().expect("state").records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `w` to the record `id` once `cond` holds, and returns when the change is durable.
    pub async fn write(
        &self,
        id: &str,
        w: Write,
        cond: &Conditions,
    ) -> Result<Written, WriteError> {
        let (ack, written) = self.stage_write(id, w, cond)?;
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
            let mut changes = vec![st.stage(&id, seq, new)];
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
        let now = now_ms();
        let mut expired: Vec<Arc<str>> = Vec::new();
        for g in &st.groups {
            let Some(ttl) = g.ttl else { continue };
            for id in g.order.values() {
                let Some(r) = st.latest(id) else {
                    continue;
                };
                if r.t + ttl.as_millis() as u64 > now {
                    break;
                }
                expired.push(Arc::clone(id));
            }
        }
        if expired.is_empty() {
            return;
        }
        expired.sort();
        expired.dedup();
        let changes: Vec<Arc<Change>> = (expired.iter())
            .map(|id| {
                st.staged += 1;
                let seq = st.staged;
                st.stage(id, seq, None)
            })
            .collect();
        self.submit(&changes, None);
    }

    /// Queues `changes` (staged, under the state's lock: so every change staged and not yet
    /// committed is with the writer or in its queue) for the log's writer.
    fn submit(&self, changes: &[Arc<Change>], ack: Option<oneshot::Sender<io::Result<()>>>) {
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
        let job = Job {
            frames,
            changes: changes.to_vec(),
            ack,
        };
        // The writer ends only when the store is dropped.
        let _ = self.jobs.lock().expect("jobs").send(job);
    }

    /// Starts a subscription to `topic`: from now (with the matching records first when
    /// `init`), or resuming after the change `since` (from the history; a `reset` and the
    /// matching records when the history no longer reaches back that far).
    pub fn subscribe(&self, topic: &Arc<Topic>, since: Option<u64>, init: bool) -> Start {
        let st = self.state.lock().expect("state");
        let rx = topic.subscribe();
        let now = st.committed;
        let mut first = Vec::new();
        let covered =
            |l: u64| l == now || (l < now && st.history.front().is_some_and(|c| c.seq <= l + 1));
        match since {
            Some(l) if covered(l) => {
                for c in st.history.iter().filter(|c| c.seq > l) {
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

impl State {
    /// The records `topic` shows.
    fn matching<'a>(
        &'a self,
        topic: &'a Topic,
    ) -> impl Iterator<Item = (Arc<str>, Arc<Record>)> + 'a {
        let p = topic.pattern.as_str();
        let prefix = &p[..p.find('*').unwrap_or(p.len())];
        (self.records.range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        )))
        .take_while(move |(id, _)| id.starts_with(prefix))
        .filter(|(id, r)| topic.shows(id, Some(r)))
        .map(|(id, r)| (Arc::clone(id), Arc::clone(r)))
    }

    /// The latest value of `id`: staged, or else committed.
    fn latest(&self, id: &str) -> Option<Arc<Record>> {
        match self.pending.get(id) {
            Some((_, r)) => r.clone(),
            None => self.records.get(id).cloned(),
        }
    }

    /// `id` as the store holds it already (one allocation per id), or a new one.
    fn key(&self, id: &str) -> Arc<str> {
        (self.pending.get_key_value(id).map(|(k, _)| k))
            .or_else(|| self.records.get_key_value(id).map(|(k, _)| k))
            .map_or_else(|| id.into(), Arc::clone)
    }

    /// Stages the change `seq` of `id` to `new` (None: removed) over its latest value, keeping
    /// the groups current; [`State::settle`] makes it seen once it is committed.
    fn stage(&mut self, id: &Arc<str>, seq: u64, new: Option<Arc<Record>>) -> Arc<Change> {
        let old = self.latest(id);
        let p = self.pending.entry(Arc::clone(id)).or_insert((0, None));
        p.0 += 1;
        p.1 = new.clone();
        for g in &mut self.groups {
            if !g.pattern.matches(id) {
                continue;
            }
            if let Some(o) = &old {
                g.order.remove(&o.seq);
            }
            if let Some(n) = &new {
                g.order.insert(n.seq, Arc::clone(id));
            }
        }
        Arc::new(Change {
            seq,
            id: Arc::clone(id),
            old,
            new,
        })
    }

    /// Makes a committed change seen: in the records and the history.
    fn settle(&mut self, c: &Arc<Change>) {
        let id = &c.id;
        let old = match &c.new {
            Some(r) => self.records.insert(Arc::clone(id), Arc::clone(r)),
            None => self.records.remove(id),
        };
        if let Some(o) = &old {
            self.live_bytes = self
                .live_bytes
                .saturating_sub((o.json.len() + id.len() + 48) as u64);
        }
        if let Some(n) = &c.new {
            self.live_bytes += (n.json.len() + id.len() + 48) as u64;
        }
        if let Some(p) = self.pending.get_mut(id) {
            p.0 -= 1;
            if p.0 == 0 {
                self.pending.remove(id);
            }
        }
        self.committed = c.seq;
        self.history_bytes += c.weight();
        self.history.push_back(Arc::clone(c));
        self.trim_history();
    }

    /// Drops the oldest changes of the history while it holds more than its bounds.
    fn trim_history(&mut self) {
        while self.history.len() > self.history_max || self.history_bytes > self.history_bytes_max {
            let Some(c) = self.history.pop_front() else {
                break;
            };
            self.history_bytes -= c.weight();
        }
    }

    /// Undoes every change staged and not committed (their commit failed).
    fn unstage(&mut self) {
        self.pending.clear();
        self.regroup();
    }

    /// Counts the groups' records again from the latest values.
    fn regroup(&mut self) {
        let mut ids: Vec<Arc<str>> = self.records.keys().cloned().collect();
        ids.extend(self.pending.keys().cloned());
        let mut groups = std::mem::take(&mut self.groups);
        for g in &mut groups {
            g.order.clear();
            for id in &ids {
                if !g.pattern.matches(id) {
                    continue;
                }
                if let Some(r) = self.latest(id) {
                    g.order.insert(r.seq, Arc::clone(id));
                }
            }
        }
        self.groups = groups;
    }

    /// Removes the oldest records of the groups (of `id`, or all) that hold more than their
    /// maximum.
    fn evict_over_max(&mut self, id: Option<&str>) -> Vec<Arc<Change>> {
        let mut out = Vec::new();
        for gi in 0..self.groups.len() {
            let g = &self.groups[gi];
            let Some(max) = g.max else { continue };
            if id.is_some_and(|id| !g.pattern.matches(id)) {
                continue;
            }
            while self.groups[gi].order.len() > max {
                let (_, oldest) = self.groups[gi]
                    .order
                    .first_key_value()
                    .map(|(k, v)| (*k, Arc::clone(v)))
                    .expect("over max, so not empty");
                self.staged += 1;
                let seq = self.staged;
                out.push(self.stage(&oldest, seq, None));
            }
        }
        out
    }
}

/// Where the writer publishes committed changes.
enum Publish {
    /// On the runtime, through this task.
    Task(tokio::sync::mpsc::UnboundedSender<Vec<Arc<Change>>>),
    /// From the writer thread itself (no runtime: tools and tests of the store alone).
    Here,
}

/// The log's writer: commits queued changes in groups, then settles, publishes and
/// acknowledges them (or, when a commit fails, undoes and fails them and every change queued
/// behind); compacts the log when it has grown past twice the live records.
fn writer(
    rx: mpsc::Receiver<Job>,
    mut log: Log,
    state: Arc<Mutex<State>>,
    fanout: Arc<Fanout>,
    publish: Publish,
) {
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
            {
                let mut st = state.lock().expect("state");
                for c in jobs.iter().flat_map(|j| &j.changes) {
                    st.settle(c);
                }
            }
            match &publish {
                Publish::Task(tx) => {
                    let all: Vec<Arc<Change>> = jobs
                        .iter()
                        .flat_map(|j| j.changes.iter().cloned())
                        .collect();
                    if tx.send(all).is_err() {
                        for j in &jobs {
                            fanout.publish(&j.changes);
                        }
                    }
                }
                Publish::Here => {
                    for j in &jobs {
                        fanout.publish(&j.changes);
                    }
                }
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
            set_member(&mut v, path, m.clone())?;
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

/// Applies a JSON merge patch (RFC 7396) to `target`.
pub fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let obj = target.as_object_mut().expect("made an object");
    for (k, v) in patch {
        if v.is_null() {
            obj.remove(&k);
        } else {
            merge_patch(obj.entry(k).or_insert(Value::Null), v);
        }
    }
}

/// Sets the member at `path` (object keys, objects made where missing) to `v`.
fn set_member(target: &mut Value, path: &[String], v: Value) -> Result<(), WriteError> {
    let mut at = target;
    for (i, key) in path.iter().enumerate() {
        let Value::Object(obj) = at else {
            return Err(WriteError::Conflict(path[..i].join("/")));
        };
        at = obj
            .entry(key.clone())
            .or_insert(Value::Object(Default::default()));
    }
    *at = v;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        // The examples of RFC 7396 appendix A.
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, p);
            assert_eq!(t, want);
        }
    }

    fn store_in(dir: &Path, f: impl FnOnce(&mut PushConfig)) -> Arc<Store> {
        let mut cfg = PushConfig::new_dir(dir.to_path_buf(), None);
        f(&mut cfg);
        Store::open(&cfg).unwrap().0
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
        assert_eq!(st.history.back().unwrap().seq, 300);
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
        let mnt = dir.path().join("small");
        std::fs::create_dir(&mnt).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=128k", "tmpfs"])
            .arg(&mnt)
            .status()
            .expect("mount runs");
        assert!(
            st.success(),
            "mounting a tmpfs for the test failed (needs root)"
        );
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
        let _unmount = Unmount(mnt.clone());
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

    #[test]
    fn members_are_set_through_objects_only() {
        let mut v = json!({"a": {"b": 1}, "n": 3});
        set_member(&mut v, &["a".into(), "c".into()], json!(2)).unwrap();
        set_member(&mut v, &["x".into(), "y".into()], json!(true)).unwrap();
        assert_eq!(v, json!({"a": {"b": 1, "c": 2}, "n": 3, "x": {"y": true}}));
        assert!(matches!(
            set_member(&mut v, &["n".into(), "z".into()], json!(0)),
            Err(WriteError::Conflict(p)) if p == "n"
        ));
    }
}
