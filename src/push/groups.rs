//! Groups of a push route's records (`[[...push.group]]`): an id pattern whose count of records
//! is bounded (`max`: the least recently written is removed) and whose records live `ttl` after
//! their last write. A group counts its records by the sequence number of their last write;
//! the store ([`super::state`]) keeps the counts current and makes the removals.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::filter::IdPattern;
use crate::config::GroupConfig;

pub struct Group {
    pub pattern: IdPattern,
    pub max: Option<usize>,
    pub ttl: Option<Duration>,
    /// The group's records by the sequence number of their last write: oldest first.
    pub order: BTreeMap<u64, Arc<str>>,
}

impl Group {
    /// The groups of `cfg`, with no records yet.
    pub fn all(cfg: &[GroupConfig]) -> Vec<Group> {
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
    pub fn same_limits(&self, other: &Group) -> bool {
        self.pattern == other.pattern && self.max == other.max && self.ttl == other.ttl
    }
}
