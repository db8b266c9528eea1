//! A push store's state under its lock: the committed records (what reads, lists and
//! subscriptions see), the changes staged and not yet committed (what writes see over them),
//! the sequence numbers, the history, the groups' counts, and the moves between them: a change
//! staged ([`State::stage`]), settled once committed ([`State::settle`]), or undone when its
//! commit failed ([`State::unstage`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::fanout::Topic;
use super::groups::Group;
use super::history::History;
use super::record::{Change, Record, Source};

pub struct State {
    /// The committed records: what reads, lists and subscriptions see.
    pub records: BTreeMap<Arc<str>, Arc<Record>>,
    /// Records with changes staged and not yet committed: how many changes, and the value after
    /// the last (None: removed). Writes see these over `records`.
    pub pending: HashMap<Arc<str>, (usize, Option<Arc<Record>>)>,
    /// The sequence number of the last change staged (failed ones leave gaps: an entity-tag
    /// a reader never saw is still never given twice).
    pub staged: u64,
    /// The sequence number of the last change committed.
    pub committed: u64,
    /// Committed changes, for resuming subscribers.
    pub history: History,
    /// Counted over the latest values (staged changes included).
    pub groups: Vec<Group>,
    /// Bytes the live records take in a compacted log (about).
    pub live_bytes: u64,
    /// A compaction lost the log: writes are refused until a restart.
    pub failed: bool,
}

impl State {
    pub fn new(history: History, groups: Vec<Group>) -> State {
        State {
            records: BTreeMap::new(),
            pending: HashMap::new(),
            staged: 0,
            committed: 0,
            history,
            groups,
            live_bytes: 0,
            failed: false,
        }
    }

    /// The records `topic` shows.
    pub fn matching<'a>(
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
    pub fn latest(&self, id: &str) -> Option<Arc<Record>> {
        match self.pending.get(id) {
            Some((_, r)) => r.clone(),
            None => self.records.get(id).cloned(),
        }
    }

    /// `id` as the store holds it already (one allocation per id), or a new one.
    pub fn key(&self, id: &str) -> Arc<str> {
        (self.pending.get_key_value(id).map(|(k, _)| k))
            .or_else(|| self.records.get_key_value(id).map(|(k, _)| k))
            .map_or_else(|| id.into(), Arc::clone)
    }

    /// Stages the change `seq` of `id` to `new` (None: removed) over its latest value, keeping
    /// the groups current; [`State::settle`] makes it seen once it is committed.
    pub fn stage(
        &mut self,
        id: &Arc<str>,
        seq: u64,
        new: Option<Arc<Record>>,
        source: Source,
    ) -> Arc<Change> {
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
            source,
        })
    }

    /// Makes a committed change seen: in the records and the history.
    pub fn settle(&mut self, c: &Arc<Change>) {
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
        self.history.push(c);
    }

    /// Undoes every change staged and not committed (their commit failed).
    pub fn unstage(&mut self) {
        self.pending.clear();
        self.regroup();
    }

    /// Counts the groups' records again from the latest values.
    pub fn regroup(&mut self) {
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

    /// Stages the removal of the oldest records of the groups (of `id`, or all) that hold more
    /// than their maximum.
    pub fn evict_over_max(&mut self, id: Option<&str>) -> Vec<Arc<Change>> {
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
                out.push(self.stage(&oldest, seq, None, Source::Store));
            }
        }
        out
    }

    /// Stages the removal of the records of groups with a `ttl` whose last write is older
    /// than it (at `now`, in milliseconds since the Unix epoch).
    pub fn expire(&mut self, now: u64) -> Vec<Arc<Change>> {
        let mut expired: Vec<Arc<str>> = Vec::new();
        for g in &self.groups {
            let Some(ttl) = g.ttl else { continue };
            for id in g.order.values() {
                let Some(r) = self.latest(id) else {
                    continue;
                };
                if r.t + ttl.as_millis() as u64 > now {
                    break;
                }
                expired.push(Arc::clone(id));
            }
        }
        expired.sort();
        expired.dedup();
        (expired.iter())
            .map(|id| {
                self.staged += 1;
                let seq = self.staged;
                self.stage(id, seq, None, Source::Store)
            })
            .collect()
    }
}
