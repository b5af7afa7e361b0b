//! The loader's counters block in the ring header (`ring::layout::Counter`),
//! rewritten every [`COUNTERS_EVERY`] from the loop's thread, so that
//! `ringfeed stat`, which reads only the header, shows the remote engine's
//! figures (and the disk cache's, once it writes them here).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::run::Loader;
use crate::remote::RemoteMetrics;
use crate::ring::layout::Counter;
use crate::ring::Producer;
use crate::source::OpenedSource;

/// How often the loader rewrites the counters block.
pub(super) const COUNTERS_EVERY: Duration = Duration::from_millis(100);

impl Loader {
    /// Writes the counters block from the sources' own figures.
    pub(super) fn write_counters(&self) {
        if let OpenedSource::Remote(remote) = &self.plan.source {
            write_remote_counters(&self.producer, &remote.store().metrics);
        }
        self.producer.stamp_counters();
    }
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
    producer.set_counter(Counter::RemoteGetLatencyUsP50, s.get_latency_us_p50);
    producer.set_counter(Counter::RemoteGetLatencyUsP99, s.get_latency_us_p99);
}
