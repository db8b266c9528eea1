//! Background services: work that runs beside the connections for the server's whole life
//! (returning freed memory today; health checks, metrics and reload watchers next), as pingora
//! runs its background services. Each is registered by name when the server starts and runs as
//! a task of its own with the shutdown signal; on shutdown each returns, and [`Background::stop`]
//! waits for them (aborting, past the grace period, one that does not).

use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The services running beside the connections.
pub struct Background {
    /// Handed to each service: it changes (or closes, when the server's `Handle` is dropped)
    /// once the server shuts down.
    shutdown: watch::Receiver<bool>,
    running: Vec<(&'static str, JoinHandle<()>)>,
}

impl Background {
    pub fn new(shutdown: watch::Receiver<bool>) -> Background {
        Background {
            shutdown,
            running: Vec::new(),
        }
    }

    /// Starts `service` on the current runtime under `name`. It gets the shutdown signal and
    /// must return soon after the signal changes or closes.
    pub fn register<F, S>(&mut self, name: &'static str, service: S)
    where
        S: FnOnce(watch::Receiver<bool>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let task = tokio::spawn(service(self.shutdown.clone()));
        self.running.push((name, task));
    }

    /// The services' names, in the order they were registered.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.running.iter().map(|(name, _)| *name)
    }

    /// After the shutdown signal: waits for every service to return, until `deadline`; those
    /// still running then are aborted. Returns the names of the aborted ones.
    pub async fn stop(self, deadline: tokio::time::Instant) -> Vec<&'static str> {
        let mut aborted = Vec::new();
        for (name, mut task) in self.running {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(service = name, error = %e, "background service failed")
                }
                Err(_) => {
                    task.abort();
                    tracing::warn!(service = name, "background service did not stop; aborted");
                    aborted.push(name);
                }
            }
        }
        aborted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn services_stop_at_the_signal_and_a_stuck_one_is_aborted_at_the_deadline() {
        let (tx, rx) = watch::channel(false);
        let mut bg = Background::new(rx);
        bg.register("polite", |mut shutdown| async move {
            let _ = shutdown.changed().await;
        });
        bg.register("stuck", |_| std::future::pending());
        assert_eq!(bg.names().collect::<Vec<_>>(), ["polite", "stuck"]);
        let _ = tx.send(true);
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        assert_eq!(bg.stop(deadline).await, ["stuck"]);
    }

    #[tokio::test]
    async fn a_dropped_signal_stops_them_too() {
        let (tx, rx) = watch::channel(false);
        let mut bg = Background::new(rx);
        bg.register("polite", |mut shutdown| async move {
            let _ = shutdown.changed().await;
        });
        drop(tx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        assert!(bg.stop(deadline).await.is_empty());
    }
}
