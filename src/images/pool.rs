//! The bounded pool transforms run on: at most `workers` at once on tokio's blocking threads
//! (never on the async workers), at most `queue` more waiting (beyond, a request is refused at
//! once: 503 with Retry-After), within a memory budget shared by the route's transforms, and in
//! a fair order by estimated cost.
//!
//! Each job comes with its estimated peak memory and CPU cost ([`Job`], from
//! `transform::prepare`). A job over the whole memory budget is refused before it queues (422);
//! any other waits until a worker is idle *and* its memory is free, at most `wait` (then 503).
//! Waiting jobs start in self-clocked fair queueing order: each job's tag is the pool's virtual
//! clock when it arrived plus its cost, the smallest tag starts first, and the clock moves to
//! the tag of each job started. A cheap job that arrives behind many expensive ones therefore
//! waits for the running ones only, while an expensive job is never starved: every job started
//! after it arrived carries a smaller tag, so the jobs that overtake it add up to at most its
//! own cost. The job with the smallest tag is never overtaken for memory: when its memory is
//! not free it waits for the running jobs to give theirs back, so a large image is not starved
//! by a stream of small ones either.
//!
//! What a running job holds (its admission, its worker, its memory) moves into the blocking
//! closure, so a transform whose client went away still counts until it really finishes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Semaphore};

/// Why the pool did not run a job.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("transform queue is full")]
    Busy,
    #[error("no worker and memory came free in time")]
    Waited,
    #[error("the transform needs {need} bytes, more than the budget of {budget}")]
    OverBudget { need: u64, budget: u64 },
    #[error("transform failed unexpectedly")]
    Panicked,
}

/// What a job is estimated to take.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    /// Peak heap bytes, held from the budget while the job runs.
    pub memory: u64,
    /// CPU cost in any unit common to all jobs (the fair order's weight).
    pub cost: u64,
}

pub struct Pool {
    /// Running plus waiting jobs.
    admission: Arc<Semaphore>,
    shared: Arc<Shared>,
    /// Longest wait for a worker and memory.
    wait: Duration,
}

struct Shared {
    state: Mutex<State>,
    budget: u64,
}

struct State {
    /// Workers without a job.
    idle: usize,
    /// Bytes of the budget not held by a running job.
    memory: u64,
    /// The virtual clock: the tag of the latest job started.
    clock: u64,
    /// Arrival order, to break ties between equal tags.
    seq: u64,
    waiting: BinaryHeap<Waiting>,
}

/// A queued job: its tag, its memory, and where to send its grant.
struct Waiting {
    tag: u64,
    seq: u64,
    memory: u64,
    grant: oneshot::Sender<Grant>,
}

impl Waiting {
    fn key(&self) -> (u64, u64) {
        (self.tag, self.seq)
    }
}

// BinaryHeap pops its greatest element: the smallest (tag, arrival) is the greatest here.
impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Waiting {}

/// A worker and `memory` bytes of the budget, given back when dropped.
struct Grant {
    shared: Option<Arc<Shared>>,
    memory: u64,
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let mut st = shared.state.lock().expect("pool state");
            st.idle += 1;
            st.memory += self.memory;
            Shared::dispatch(&shared, &mut st);
        }
    }
}

impl Shared {
    /// Starts waiting jobs in tag order while a worker is idle and the first one's memory is
    /// free. Called with the state locked; never drops a live [`Grant`] while it is.
    fn dispatch(this: &Arc<Shared>, st: &mut State) {
        while st.idle > 0 {
            let Some(first) = st.waiting.peek() else {
                return;
            };
            if !first.grant.is_closed() && first.memory > st.memory {
                return;
            }
            let w = st.waiting.pop().expect("peeked");
            if w.grant.is_closed() {
                continue; // its request gave up waiting
            }
            st.idle -= 1;
            st.memory -= w.memory;
            st.clock = st.clock.max(w.tag);
            let grant = Grant {
                shared: Some(Arc::clone(this)),
                memory: w.memory,
            };
            if let Err(mut unsent) = w.grant.send(grant) {
                // Gone since the check: take the grant back here, under the lock.
                unsent.shared = None;
                st.idle += 1;
                st.memory += w.memory;
            }
        }
    }
}

/// Removes a job that stopped waiting (timed out, or its request went away) from the queue, so
/// that the queue never holds more than the admitted jobs, and lets the next ones start.
struct Queued<'a> {
    shared: &'a Arc<Shared>,
    rx: Option<oneshot::Receiver<Grant>>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        // Dropped before locking: a grant sent meanwhile gives itself back, taking the lock.
        if let Some(rx) = self.rx.take() {
            drop(rx);
            let mut st = self.shared.state.lock().expect("pool state");
            st.waiting.retain(|w| !w.grant.is_closed());
            Shared::dispatch(self.shared, &mut st);
        }
    }
}

impl Pool {
    /// `workers` 0 means one per core; `memory` is the budget in bytes; `wait` bounds how long a
    /// job waits for a worker and its memory.
    pub fn new(workers: usize, queue: usize, memory: u64, wait: Duration) -> Pool {
        let workers = if workers == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            workers
        };
        Pool {
            admission: Arc::new(Semaphore::new(workers + queue)),
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    idle: workers,
                    memory,
                    clock: 0,
                    seq: 0,
                    waiting: BinaryHeap::new(),
                }),
                budget: memory,
            }),
            wait,
        }
    }

    /// Runs `f` on a blocking thread once a worker and `job.memory` are free, in fair order;
    /// `Busy` at once if the queue is full, `OverBudget` at once if the memory can never be
    /// free, `Waited` after waiting `wait` in vain.
    pub async fn run<T, F>(&self, job: Job, f: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if job.memory > self.shared.budget {
            return Err(PoolError::OverBudget {
                need: job.memory,
                budget: self.shared.budget,
            });
        }
        let admitted = Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| PoolError::Busy)?;
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.state.lock().expect("pool state");
            st.seq += 1;
            let w = Waiting {
                tag: st.clock.saturating_add(job.cost),
                seq: st.seq,
                memory: job.memory,
                grant: tx,
            };
            st.waiting.push(w);
            Shared::dispatch(&self.shared, &mut st);
        }
        let mut queued = Queued {
            shared: &self.shared,
            rx: Some(rx),
        };
        let rx = queued.rx.as_mut().expect("set above");
        let grant = match tokio::time::timeout(self.wait, rx).await {
            Ok(Ok(grant)) => grant,
            // The sender is only dropped unsent for a receiver that is closed: not this one.
            Ok(Err(_)) => return Err(PoolError::Panicked),
            Err(_) => return Err(PoolError::Waited),
        };
        queued.rx = None;
        tokio::task::spawn_blocking(move || {
            let _held = (admitted, grant);
            f()
        })
        .await
        .map_err(|_| PoolError::Panicked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const SMALL: Job = Job { memory: 1, cost: 1 };

    /// A job that runs until `rx` gets a message.
    fn blocking(rx: &Arc<Mutex<mpsc::Receiver<()>>>) -> impl FnOnce() + Send + 'static {
        let rx = Arc::clone(rx);
        move || {
            let _ = rx.lock().unwrap().recv();
        }
    }

    /// Lets spawned requests reach the pool's queue.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn full_queue_is_refused_at_once() {
        let pool = Arc::new(Pool::new(1, 1, 1 << 20, Duration::from_secs(10)));
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let mut jobs = Vec::new();
        for _ in 0..2 {
            let (pool, f) = (Arc::clone(&pool), blocking(&rx));
            jobs.push(tokio::spawn(async move { pool.run(SMALL, f).await }));
        }
        settle().await;
        assert!(matches!(pool.run(SMALL, || ()).await, Err(PoolError::Busy)));
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        for j in jobs {
            assert!(j.await.unwrap().is_ok());
        }
        assert!(pool.run(SMALL, || ()).await.is_ok());
    }

    /// #12 item 9: transforms ran first come, first served, so a 1 ms transform waited behind
    /// every expensive one queued before it (27 s behind four AVIF encodes).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_cheap_job_overtakes_queued_expensive_ones() {
        let pool = Arc::new(Pool::new(1, 16, 1 << 20, Duration::from_secs(10)));
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let done = Arc::new(Mutex::new(Vec::new()));
        // The only worker is busy; four expensive jobs queue, then a cheap one.
        let first = {
            let (pool, f) = (Arc::clone(&pool), blocking(&rx));
            tokio::spawn(async move { pool.run(SMALL, f).await })
        };
        settle().await;
        let mut jobs = Vec::new();
        for (name, cost) in [
            ("e1", 1000),
            ("e2", 1000),
            ("e3", 1000),
            ("e4", 1000),
            ("c", 1),
        ] {
            let (pool, done) = (Arc::clone(&pool), Arc::clone(&done));
            jobs.push(tokio::spawn(async move {
                let job = Job { memory: 1, cost };
                pool.run(job, move || done.lock().unwrap().push(name)).await
            }));
            settle().await;
        }
        tx.send(()).unwrap();
        first.await.unwrap().unwrap();
        for j in jobs {
            j.await.unwrap().unwrap();
        }
        assert_eq!(*done.lock().unwrap(), ["c", "e1", "e2", "e3", "e4"]);
    }

    /// Expensive jobs are not starved by a stream of cheap ones: cheap jobs overtake one only
    /// until the clock reaches its tag.
    #[tokio::test(flavor = "multi_thread")]
    async fn expensive_job_is_not_starved() {
        let pool = Arc::new(Pool::new(1, 64, 1 << 20, Duration::from_secs(10)));
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let done = Arc::new(Mutex::new(Vec::new()));
        let mut jobs = Vec::new();
        // Each job but E runs until the test says so; each is queued once the one before started.
        let mut start = |name: &'static str, cost: u64| {
            let (pool, done, rx) = (Arc::clone(&pool), Arc::clone(&done), Arc::clone(&rx));
            jobs.push(tokio::spawn(async move {
                pool.run(Job { memory: 1, cost }, move || {
                    if name != "E" {
                        let _ = rx.lock().unwrap().recv();
                    }
                    done.lock().unwrap().push(name);
                })
                .await
            }));
        };
        start("B", 1); // clock 1
        settle().await;
        start("E", 30); // tag 31
        settle().await;
        for name in ["c1", "c2", "c3"] {
            start(name, 10); // tags 11, 21, 31 (after E's)
            settle().await;
            tx.send(()).unwrap();
            settle().await;
        }
        tx.send(()).unwrap();
        for j in jobs {
            j.await.unwrap().unwrap();
        }
        assert_eq!(*done.lock().unwrap(), ["B", "c1", "c2", "E", "c3"]);
    }

    /// #12 item 9: decoding had no memory bound shared by the workers (a 16-bit 7000×7000 PNG
    /// took 570 MB per request, whatever the others held).
    #[tokio::test(flavor = "multi_thread")]
    async fn regression_memory_budget_waits_then_refuses() {
        let pool = Arc::new(Pool::new(4, 16, 100, Duration::from_millis(100)));
        // Never fits: refused at once, without queueing.
        let over = pool
            .run(
                Job {
                    memory: 101,
                    cost: 1,
                },
                || (),
            )
            .await;
        assert!(matches!(
            over,
            Err(PoolError::OverBudget {
                need: 101,
                budget: 100
            })
        ));
        // 80 of the 100 bytes held: a job needing 30 waits (workers are idle), then gives up.
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let big = {
            let (pool, f) = (Arc::clone(&pool), blocking(&rx));
            tokio::spawn(async move {
                pool.run(
                    Job {
                        memory: 80,
                        cost: 1,
                    },
                    f,
                )
                .await
            })
        };
        settle().await;
        let ran = Arc::new(Mutex::new(false));
        let r = Arc::clone(&ran);
        let waited = pool
            .run(
                Job {
                    memory: 30,
                    cost: 1,
                },
                move || *r.lock().unwrap() = true,
            )
            .await;
        assert!(matches!(waited, Err(PoolError::Waited)), "{waited:?}");
        assert!(!*ran.lock().unwrap());
        // One that fits beside it runs at once; once the big one ends, the 30 fits too.
        assert!(pool
            .run(
                Job {
                    memory: 20,
                    cost: 1
                },
                || ()
            )
            .await
            .is_ok());
        let later = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                pool.run(
                    Job {
                        memory: 30,
                        cost: 1,
                    },
                    || (),
                )
                .await
            })
        };
        settle().await;
        tx.send(()).unwrap();
        big.await.unwrap().unwrap();
        later.await.unwrap().unwrap();
        // Everything was given back, and the timed-out job left no trace in the queue.
        let st = pool.shared.state.lock().unwrap();
        assert_eq!((st.idle, st.memory, st.waiting.len()), (4, 100, 0));
    }
}
