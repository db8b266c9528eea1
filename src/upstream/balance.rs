//! Choosing a backend: smooth weighted round-robin (a schedule computed once, walked by an
//! atomic counter: no lock on the request path), least requests in flight against weight, and
//! consistent hashing on a ketama ring (pingora-ketama, nginx's ring). Each takes a predicate
//! saying which backends may be chosen now (up, not yet tried by this request).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};

use pingora_ketama::{Bucket, Continuum};

/// Longest round-robin schedule: weights are scaled down past it.
const MAX_SCHEDULE: u32 = 1 << 16;

/// Smooth weighted round-robin over some backends (nginx's order: with weights 5, 1, 1 it
/// sends a, a, b, a, c, a, a rather than five a in a row).
pub struct RoundRobin {
    schedule: Box<[usize]>,
    next: AtomicUsize,
}

impl RoundRobin {
    /// A schedule over `members`: (backend index, weight).
    pub fn new(members: &[(usize, u32)]) -> RoundRobin {
        let gcd = members.iter().fold(0, |g, &(_, w)| gcd(g, w)).max(1);
        let total: u32 = members.iter().map(|&(_, w)| w / gcd).sum();
        let scale = total.div_ceil(MAX_SCHEDULE).max(1);
        let weights: Vec<i64> = (members.iter())
            .map(|&(_, w)| i64::from((w / gcd / scale).max(1)))
            .collect();
        let total: i64 = weights.iter().sum();
        let mut current = vec![0i64; members.len()];
        let mut schedule = Vec::with_capacity(total as usize);
        for _ in 0..total {
            let mut best = 0;
            for (i, w) in weights.iter().enumerate() {
                current[i] += w;
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            schedule.push(members[best].0);
        }
        RoundRobin {
            schedule: schedule.into_boxed_slice(),
            next: AtomicUsize::new(0),
        }
    }

    /// The next backend in the schedule that `ok` accepts.
    pub fn pick(&self, mut ok: impl FnMut(usize) -> bool) -> Option<usize> {
        let len = self.schedule.len();
        if len == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..len)
            .map(|k| self.schedule[(start + k) % len])
            .find(|&i| ok(i))
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Among `members` (backend index, weight) that `ok` accepts, the one with the fewest requests
/// in flight against its weight; ties go round-robin from `rotate`.
pub fn least_loaded(
    members: &[(usize, u32)],
    rotate: &AtomicUsize,
    inflight: impl Fn(usize) -> usize,
    mut ok: impl FnMut(usize) -> bool,
) -> Option<usize> {
    let n = members.len();
    if n == 0 {
        return None;
    }
    let start = rotate.fetch_add(1, Ordering::Relaxed);
    let mut best: Option<(usize, u64, u64)> = None;
    for k in 0..n {
        let (i, w) = members[(start + k) % n];
        let load = inflight(i) as u64;
        // load / w < best_load / best_w, without division.
        if best.is_none_or(|(_, bl, bw)| load * bw < bl * u64::from(w)) && ok(i) {
            best = Some((i, load, u64::from(w)));
        }
    }
    best.map(|(i, _, _)| i)
}

/// A ketama ring over some backends.
pub struct Ring {
    continuum: Continuum,
    /// The ring names nodes by address: each backend's (its IP and port when it is given as
    /// an address, as nginx hashes it; else one derived from its name, stable across DNS
    /// changes).
    index: HashMap<SocketAddr, usize>,
}

/// Points of the ring visited for one key before giving up (every backend refused).
const MAX_WALK: usize = 4096;

impl Ring {
    /// A ring over `members`: (backend index, its `host:port`, weight).
    pub fn new(members: &[(usize, String, u32)]) -> Ring {
        let mut index = HashMap::new();
        let buckets: Vec<Bucket> = (members.iter())
            .map(|(i, authority, w)| {
                let addr = node_address(authority);
                index.insert(addr, *i);
                Bucket::new(addr, *w)
            })
            .collect();
        Ring {
            continuum: Continuum::new(&buckets),
            index,
        }
    }

    /// The backend `key` belongs to, or walking on along the ring, the first that `ok`
    /// accepts: a key whose backend is down moves to the next one and comes back after.
    pub fn pick(&self, key: &[u8], mut ok: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut refused = BackendSet::default();
        for addr in self.continuum.node_iter(key).take(MAX_WALK) {
            let &i = self.index.get(addr)?;
            if refused.contains(i) {
                continue;
            }
            if ok(i) {
                return Some(i);
            }
            refused.insert(i);
            if refused.len() == self.index.len() {
                return None;
            }
        }
        None
    }
}

/// A set of a pool's backends by index (those a request has tried): the first 128 in one
/// word, the rest of a larger pool in words allocated when one of them is added. (A plain
/// `u128` lost every backend past the 128th: a failed one could be chosen again.)
#[derive(Debug, Default, Clone)]
pub struct BackendSet {
    low: u128,
    high: Vec<u64>,
}

impl BackendSet {
    pub fn insert(&mut self, i: usize) {
        let Some(j) = i.checked_sub(128) else {
            self.low |= 1 << i;
            return;
        };
        if self.high.len() <= j / 64 {
            self.high.resize(j / 64 + 1, 0);
        }
        self.high[j / 64] |= 1 << (j % 64);
    }

    pub fn contains(&self, i: usize) -> bool {
        match i.checked_sub(128) {
            None => self.low & (1 << i) != 0,
            Some(j) => (self.high.get(j / 64)).is_some_and(|w| w & (1 << (j % 64)) != 0),
        }
    }

    /// How many backends the set holds.
    pub fn len(&self) -> usize {
        let high: u32 = self.high.iter().map(|w| w.count_ones()).sum();
        (self.low.count_ones() + high) as usize
    }
}

/// The address a backend has on the ring.
fn node_address(authority: &str) -> SocketAddr {
    if let Ok(addr) = authority.parse::<SocketAddr>() {
        return addr;
    }
    // A name: an address in fd00::/8 (unique local, never a real backend here) from its hash.
    let h = fnv1a(authority.as_bytes());
    let ip = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, (h >> 16) as u16, h as u16);
    SocketAddr::new(IpAddr::V6(ip), 0)
}

/// FNV-1a, enough to tell names apart.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_set_holds_any_index() {
        let mut s = BackendSet::default();
        for i in [0, 1, 127, 128, 129, 191, 192, 300, 1000] {
            assert!(!s.contains(i), "{i}");
            s.insert(i);
            s.insert(i);
            assert!(s.contains(i), "{i}");
        }
        assert_eq!(s.len(), 9);
        assert!(!s.contains(2) && !s.contains(130) && !s.contains(999) && !s.contains(5000));
    }

    #[test]
    fn the_ring_walks_past_refused_backends_beyond_the_128th() {
        let members: Vec<(usize, String, u32)> = (0..200)
            .map(|i| (i, format!("10.0.{}.{}:80", i / 256, i % 256), 1))
            .collect();
        let ring = Ring::new(&members);
        // Only the last backend takes requests: every key walks to it.
        for key in [&b"a"[..], b"b", b"some/path"] {
            assert_eq!(ring.pick(key, |i| i == 199), Some(199));
        }
        assert_eq!(ring.pick(b"a", |_| false), None);
    }

    #[test]
    fn round_robin_is_smooth_and_weighted() {
        let rr = RoundRobin::new(&[(0, 5), (1, 1), (2, 1)]);
        let order: Vec<usize> = (0..7).map(|_| rr.pick(|_| true).unwrap()).collect();
        assert_eq!(order, [0, 0, 1, 0, 2, 0, 0]);
        let rr = RoundRobin::new(&[(0, 2), (1, 2)]);
        let order: Vec<usize> = (0..4).map(|_| rr.pick(|_| true).unwrap()).collect();
        assert_eq!(order, [0, 1, 0, 1]);
    }

    #[test]
    fn round_robin_skips_what_is_refused() {
        let rr = RoundRobin::new(&[(0, 1), (1, 1), (2, 1)]);
        for _ in 0..10 {
            assert_ne!(rr.pick(|i| i != 1), Some(1));
        }
        assert_eq!(rr.pick(|_| false), None);
    }

    #[test]
    fn huge_weights_make_a_bounded_schedule() {
        let members: Vec<(usize, u32)> = (0..200).map(|i| (i, 997 - (i as u32 % 3))).collect();
        let rr = RoundRobin::new(&members);
        assert!(rr.schedule.len() <= MAX_SCHEDULE as usize + members.len());
    }

    #[test]
    fn least_loaded_weighs_in_flight() {
        let rotate = AtomicUsize::new(0);
        let inflight = [4usize, 1, 3];
        let pick = |ok: &dyn Fn(usize) -> bool| {
            least_loaded(&[(0, 1), (1, 1), (2, 1)], &rotate, |i| inflight[i], ok)
        };
        assert_eq!(pick(&|_| true), Some(1));
        assert_eq!(pick(&|i| i != 1), Some(2));
        // Weight 4 with 4 in flight is lighter than weight 1 with 1.
        let w = least_loaded(&[(0, 4), (1, 1)], &rotate, |i| [4, 2][i], |_| true);
        assert_eq!(w, Some(0));
    }

    #[test]
    fn ring_moves_only_the_removed_backends_keys() {
        let names = |n: usize| -> Vec<(usize, String, u32)> {
            (0..n)
                .map(|i| (i, format!("127.0.0.{}:80", i + 1), 1))
                .collect()
        };
        let four = Ring::new(&names(4));
        let three = Ring::new(&names(3));
        let keys: Vec<String> = (0..2000).map(|k| format!("/object/{k}")).collect();
        let mut moved = 0;
        for k in &keys {
            let a = four.pick(k.as_bytes(), |_| true).unwrap();
            let b = three.pick(k.as_bytes(), |_| true).unwrap();
            if a != 3 {
                assert_eq!(a, b, "{k} moved though its backend stayed");
            } else {
                moved += 1;
            }
        }
        // The fourth backend held about a quarter of the keys.
        assert!((300..700).contains(&moved), "{moved}");
    }

    #[test]
    fn ring_walks_past_refused_backends() {
        let ring = Ring::new(&[(0, "a:1".into(), 1), (1, "b:1".into(), 1)]);
        for k in 0..100 {
            let key = format!("k{k}");
            let first = ring.pick(key.as_bytes(), |_| true).unwrap();
            let other = ring.pick(key.as_bytes(), |i| i != first).unwrap();
            assert_ne!(first, other);
        }
        assert_eq!(ring.pick(b"x", |_| false), None);
    }
}
