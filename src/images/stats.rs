//! What an image route counts into its server's metrics ([`crate::metrics::ImageCounters`],
//! docs/metrics.md, "Images"): transforms by grammar and output format with their time (and
//! its stages': decode, resize, encode) and bytes, the transform pool's queue and refusals, the
//! proxy's originals by outcome, its kept decoded originals (hits, misses, bytes held). A route
//! counts once a server that counts requests (one with an admin listener) observes its router;
//! before that, and without one, each count is one look at an empty cell. Counts go with
//! transforms and loads of originals, never with the delivery of a cached result.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::metrics::{clock, ImageCounters, Metrics, IMAGE_FORMATS};

use super::grammar::Grammar;
use super::pool::{Job, Pool, PoolError};
use super::sniff::ImageFormat;
use super::source::{Original, SourceError};
use super::transform::Timing;

/// A route's link to the metrics it counts into.
#[derive(Default)]
pub struct Stats {
    metrics: OnceLock<Arc<Metrics>>,
    /// The bytes of kept decoded originals last counted into the metrics' gauge (which adds
    /// up every route's).
    decoded_held: AtomicU64,
}

/// The [`IMAGE_FORMATS`] index of `f` (`other` for a format the metrics do not name).
fn format_index(f: ImageFormat) -> usize {
    let name = f.name();
    (IMAGE_FORMATS.iter())
        .position(|n| *n == name)
        .unwrap_or(IMAGE_FORMATS.len() - 1)
}

/// A job in the pool's queue: counted off when it starts or, if it never does, when dropped.
struct Queued {
    counters: Option<Arc<Metrics>>,
    since: u64,
}

impl Queued {
    fn leave(&mut self) {
        if let Some(m) = self.counters.take() {
            m.images().dequeued(clock().saturating_sub(self.since));
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.leave();
    }
}

/// A route gone (a reload replaced it) takes its kept decoded originals, freed with it, out of
/// the gauge that adds up every route's.
impl Drop for Stats {
    fn drop(&mut self) {
        self.decoded_held(0);
    }
}

impl Stats {
    /// Counts into `m` from now on (the first server's metrics that observe the route).
    pub fn count_into(&self, m: &Arc<Metrics>) {
        if self.metrics.set(Arc::clone(m)).is_ok() {
            m.images().enable();
        }
    }

    fn counters(&self) -> Option<&ImageCounters> {
        self.metrics.get().map(|m| m.images())
    }

    /// Counts how the original of a proxy request was had, or why not.
    pub fn source(&self, got: &Result<Original, SourceError>) {
        if let Some(c) = self.counters() {
            c.source(match got {
                Ok(o) => o.had as usize,
                Err(e) => e.outcome(),
            });
        }
    }

    /// Runs `f` on `pool` as `job`, counting its time in the queue, the pool's refusal, and
    /// its run of `f`: `f`'s value and how long it ran, in nanoseconds.
    pub async fn run<T, F>(&self, pool: &Pool, job: Job, f: F) -> Result<(T, u64), PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let metrics = self.metrics.get().cloned();
        if let Some(m) = &metrics {
            m.images().enqueued();
        }
        let mut queued = Queued {
            counters: metrics,
            since: clock(),
        };
        let ran = pool
            .run(job, move || {
                queued.leave();
                let t0 = clock();
                let out = f();
                (out, clock().saturating_sub(t0))
            })
            .await;
        if let (Err(e), Some(c)) = (&ran, self.counters()) {
            match e {
                PoolError::Busy => c.rejected(0),
                PoolError::Waited => c.rejected(1),
                PoolError::OverBudget { .. } => c.rejected(2),
                PoolError::Panicked => {}
            }
        }
        ran
    }

    /// Whether the route counts now: a transform's stages are worth timing
    /// ([`super::pipeline::run`]; without metrics, no clock is read for them).
    pub fn timed(&self) -> bool {
        self.metrics.get().is_some()
    }

    /// Counts the time of a transform's stages.
    pub fn stages(&self, t: &Timing) {
        if let Some(c) = self.counters() {
            for (i, d) in [t.decode, t.resize, t.encode].into_iter().enumerate() {
                c.stage(i, u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
            }
        }
    }

    /// Counts a look for a kept decoded original: found (`hit`) or decoded.
    pub fn decoded_lookup(&self, hit: bool) {
        if let Some(c) = self.counters() {
            c.decoded_lookup(hit);
        }
    }

    /// The route's kept decoded originals hold `bytes` now.
    pub fn decoded_held(&self, bytes: u64) {
        if let Some(c) = self.counters() {
            c.decoded_held(self.decoded_held.swap(bytes, Ordering::Relaxed), bytes);
        }
    }

    /// Counts a transform of `grammar` to `format` that ran `nanos`, from `source` bytes to
    /// `output` bytes.
    pub fn transformed(
        &self,
        grammar: Grammar,
        format: ImageFormat,
        nanos: u64,
        source: usize,
        output: usize,
    ) {
        if let Some(c) = self.counters() {
            c.transformed(
                grammar as usize,
                format_index(format),
                nanos,
                source as u64,
                output as u64,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_grammars_index_the_metrics_labels() {
        for f in [
            ImageFormat::Jpeg,
            ImageFormat::Png,
            ImageFormat::Gif,
            ImageFormat::Webp,
            ImageFormat::Avif,
        ] {
            assert_eq!(IMAGE_FORMATS[format_index(f)], f.name());
        }
        for g in [Grammar::Zimg, Grammar::Imgproxy, Grammar::Thumbor] {
            assert_eq!(crate::metrics::GRAMMARS[g as usize], g.name());
        }
    }

    #[tokio::test]
    async fn a_route_counts_only_once_observed_and_the_queue_empties() {
        let stats = Stats::default();
        assert!(!stats.timed(), "nothing counts: no stage is timed");
        let pool = Pool::new(1, 1, 1 << 20, std::time::Duration::from_secs(1));
        let job = Job { memory: 1, cost: 1 };
        assert_eq!(stats.run(&pool, job, || 7).await.unwrap().0, 7);
        stats.transformed(Grammar::Imgproxy, ImageFormat::Webp, 1, 10, 4);
        let m = Metrics::new();
        assert!(m.images().totals().is_none(), "no image route: nothing");
        assert!(!m.render().contains("larder_image"));
        stats.count_into(&m);
        stats.run(&pool, job, || ()).await.unwrap();
        stats.transformed(Grammar::Imgproxy, ImageFormat::Webp, 3_000_000, 1000, 400);
        assert!(stats.timed());
        stats.stages(&Timing {
            decode: std::time::Duration::from_millis(2),
            resize: std::time::Duration::from_micros(300),
            encode: std::time::Duration::from_millis(40),
        });
        let over = Job {
            memory: 2 << 20,
            cost: 1,
        };
        assert!(stats.run(&pool, over, || ()).await.is_err());
        let t = m.images().totals().unwrap();
        assert_eq!(
            (t.transforms, t.queued, t.rejected, t.saved),
            (1, 0, 1, 600)
        );
        let text = m.render();
        for line in [
            "larder_image_transforms_total{grammar=\"imgproxy\",format=\"webp\"} 1",
            "larder_image_transform_duration_seconds_bucket{le=\"0.005\"} 1",
            "larder_image_queue_depth 0",
            "larder_image_rejections_total{reason=\"over_budget\"} 1",
            "larder_image_saved_bytes_total 600",
            "larder_image_stage_duration_seconds_bucket{le=\"0.005\",stage=\"decode\"} 1",
            "larder_image_stage_duration_seconds_bucket{le=\"0.025\",stage=\"encode\"} 0",
            "larder_image_stage_duration_seconds_bucket{le=\"0.05\",stage=\"encode\"} 1",
            "larder_image_stage_duration_seconds_sum{stage=\"resize\"} 0.0003",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
