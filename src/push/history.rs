//! The history of a push route's committed changes, oldest first, kept for subscribers that
//! resume after a change they saw (`Last-Event-ID`): bounded by its count of changes
//! (`history`) and by the bytes of the values it holds (`history_bytes`, [`Change::weight`]).

use std::collections::VecDeque;
use std::sync::Arc;

use super::record::Change;

pub struct History {
    changes: VecDeque<Arc<Change>>,
    max: usize,
    /// The bytes of the values held, and their bound.
    bytes: u64,
    bytes_max: u64,
}

impl History {
    pub fn new(max: usize, bytes_max: u64) -> History {
        History {
            changes: VecDeque::new(),
            max,
            bytes: 0,
            bytes_max,
        }
    }

    /// Changes its bounds, dropping the oldest changes over them now.
    pub fn bound(&mut self, max: usize, bytes_max: u64) {
        (self.max, self.bytes_max) = (max, bytes_max);
        self.trim();
    }

    /// Adds the newest committed change.
    pub fn push(&mut self, c: &Arc<Change>) {
        self.bytes += c.weight();
        self.changes.push_back(Arc::clone(c));
        self.trim();
    }

    /// Drops the oldest changes while it holds more than its bounds.
    fn trim(&mut self) {
        while self.changes.len() > self.max || self.bytes > self.bytes_max {
            let Some(c) = self.changes.pop_front() else {
                break;
            };
            self.bytes -= c.weight();
        }
    }

    /// Whether it holds every change after `seen` up to `now` (the last committed).
    pub fn covers(&self, seen: u64, now: u64) -> bool {
        seen == now || (seen < now && self.changes.front().is_some_and(|c| c.seq <= seen + 1))
    }

    /// The changes after `seen`, oldest first.
    pub fn after(&self, seen: u64) -> impl Iterator<Item = &Arc<Change>> {
        self.changes.iter().filter(move |c| c.seq > seen)
    }

    /// The changes held, and the bytes of their values.
    pub fn size(&self) -> (usize, u64) {
        (self.changes.len(), self.bytes)
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Change>> {
        self.changes.iter()
    }
}
