//! The loader's counters block in the ring header (`ring::layout::Counter`),
//! rewritten every `run::COUNTERS_EVERY` from the loop's thread, so that
//! `ringfeed stat`, which reads only the header, shows the remote engine's
//! figures, the disk cache's and the decode stage's.

use std::sync::atomic::Ordering;

use super::run::Loader;
use crate::cache::CacheStats;
use crate::remote::RemoteMetrics;
use crate::ring::layout::Counter;
use crate::ring::Producer;
use crate::source::OpenedSource;

impl Loader {
    /// Writes the counters block from the sources' own figures, and where
    /// the trainers are.
    pub(super) fn write_counters(&mut self) {
        self.write_progress();
        if let OpenedSource::Remote(remote) = &self.plan.source {
            write_remote_counters(&self.producer, &remote.store().metrics);
        }
        if let Some(stats) = self.plan.cache_stats() {
            write_cache_counters(&self.producer, stats);
        }
        if let Some(stage) = &self.decode {
            self.producer
                .set_counter(Counter::ImagesDecoded, stage.decoded);
            self.producer.set_counter(Counter::ImagesBad, stage.bad);
        }
        self.producer.stamp_counters();
    }
}

/// The disk data cache's figures into the counters block (words the
/// counters block keeps for it; `stat` prints them once any is non-zero).
pub fn write_cache_counters(producer: &Producer, stats: &CacheStats) {
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    producer.set_counter(Counter::CacheHits, get(&stats.hits));
    producer.set_counter(Counter::CacheMisses, get(&stats.misses));
    producer.set_counter(Counter::CacheBytesFromCache, get(&stats.bytes_from_cache));
    producer.set_counter(Counter::CacheBytesFromRemote, get(&stats.bytes_from_remote));
    producer.set_counter(Counter::CacheBytesUsed, get(&stats.used_bytes));
    producer.set_counter(Counter::CacheBytesLimit, get(&stats.limit_bytes));
}

/// The remote engine's figures into the counters block.
pub fn write_remote_counters(producer: &Producer, metrics: &RemoteMetrics) {
    let s = metrics.snapshot();
    producer.set_counter(Counter::RemoteGetsInFlight, s.gets_in_flight);
    producer.set_counter(Counter::RemoteWindow, s.window);
    producer.set_counter(Counter::RemoteBytesReceived, s.bytes_received);
    producer.set_counter(
        Counter::RemoteGetsOk,
        metrics.gets_ok.load(Ordering::Relaxed),
    );
    for (counter, value) in Counter::REMOTE_RETRIES.iter().zip(s.retries) {
        producer.set_counter(*counter, value);
    }
    producer.set_counter(Counter::RemoteRateLimit, s.rate_limit_per_s);
    producer.set_counter(Counter::RemoteRateCuts, s.rate_cuts);
    producer.set_counter(Counter::RemoteHedges, s.hedges);
    producer.set_counter(Counter::RemoteHedgesWon, s.hedges_won);
    producer.set_counter(Counter::RemoteGetLatencyUsP50, s.get_latency_us_p50);
    producer.set_counter(Counter::RemoteGetLatencyUsP99, s.get_latency_us_p99);
}
