//! The bounded pool transforms run on: at most `workers` at once on tokio's blocking threads
//! (never on the async workers), at most `queue` more waiting; beyond that a request is refused
//! at once (503 with Retry-After) instead of queueing without bound.
//!
//! Both permits move into the blocking closure, so a transform whose client went away still
//! counts until it really finishes.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Why the pool did not run a job.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("transform queue is full")]
    Busy,
    #[error("transform failed unexpectedly")]
    Panicked,
}

pub struct Pool {
    /// Running plus waiting jobs.
    admission: Arc<Semaphore>,
    /// Running jobs.
    workers: Arc<Semaphore>,
}

impl Pool {
    /// `workers` 0 means one per core.
    pub fn new(workers: usize, queue: usize) -> Pool {
        let workers = if workers == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            workers
        };
        Pool {
            admission: Arc::new(Semaphore::new(workers + queue)),
            workers: Arc::new(Semaphore::new(workers)),
        }
    }

    /// Runs `f` on a blocking thread when a worker is free; `Busy` at once if the queue is full.
    pub async fn run<T, F>(&self, f: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let admitted = Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| PoolError::Busy)?;
        let worker = Arc::clone(&self.workers)
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        tokio::task::spawn_blocking(move || {
            let _held = (admitted, worker);
            f()
        })
        .await
        .map_err(|_| PoolError::Panicked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread")]
    async fn full_queue_is_refused_at_once() {
        let pool = Arc::new(Pool::new(1, 1));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let mut jobs = Vec::new();
        for _ in 0..2 {
            let (pool, rx) = (Arc::clone(&pool), Arc::clone(&rx));
            jobs.push(tokio::spawn(async move {
                pool.run(move || rx.lock().unwrap().recv().ok()).await
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(matches!(pool.run(|| ()).await, Err(PoolError::Busy)));
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        for j in jobs {
            assert!(j.await.unwrap().is_ok());
        }
        assert!(pool.run(|| ()).await.is_ok());
    }
}
