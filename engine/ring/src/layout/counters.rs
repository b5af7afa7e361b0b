//! The loader-counters block of the header (offset 1288, 32 u64 words):
//! figures the loader writes every ~100 ms for `ringfeed stat`, which reads
//! only the header. Each word is one named [`Counter`]; every word is
//! written and read Relaxed (display figures: nothing synchronizes through
//! them). The block was reserved zeros before it existed, so a loader that
//! predates it leaves all 0 ([`Counter::UpdatedUnixMs`] 0: never written)
//! and the ABI version did not change. docs/ring-layout.md has the table.

/// Offset of the block in the header.
pub const COUNTERS_OFFSET: usize = 1288;
/// Words in the block (named ones, and room for more).
pub const COUNTER_WORDS: usize = 32;

/// One named word of the counters block: its index is its place.
///
/// `Remote*` come from the remote fetch engine; `Cache*` from the disk
/// cache of remote objects. Counters (`_total` in the Prometheus sense)
/// only grow; gauges (in flight, latencies, bytes used, limit) are the
/// figure at the last write.
#[repr(usize)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Unix time in ms of the block's last write (0: never written).
    UpdatedUnixMs = 0,
    /// Gauge: GETs in flight.
    RemoteGetsInFlight = 1,
    /// Body bytes received from the store (retried ranges count again).
    RemoteBytesReceived = 2,
    /// Retries: HTTP 429 or 503 (the store asked to slow down).
    RemoteRetriesThrottled = 3,
    /// Retries: another 5xx.
    RemoteRetriesServerError = 4,
    /// Retries: no connection, or a reset before the response.
    RemoteRetriesConnect = 5,
    /// Retries: no headers or no body bytes for the stall limit.
    RemoteRetriesStall = 6,
    /// Retries: the body broke off mid-transfer.
    RemoteRetriesBodyInterrupted = 7,
    /// Retries: a timeout of the HTTP client.
    RemoteRetriesTimeout = 8,
    /// Retries: any other cause.
    RemoteRetriesOther = 9,
    /// Gauge: median GET latency, µs (within a factor of two).
    RemoteGetLatencyUsP50 = 10,
    /// Gauge: 99th percentile GET latency, µs.
    RemoteGetLatencyUsP99 = 11,
    /// Gauge: the fetch window (most GETs in flight now).
    RemoteWindow = 12,
    /// GETs that delivered their whole range.
    RemoteGetsOk = 13,
    /// Gauge: the store's rate limit, GETs/s (0: none, it never throttled).
    RemoteRateLimit = 14,
    /// Hedges sent: GETs asked again because the first was slow.
    RemoteHedges = 15,
    /// Reads served from the disk cache.
    CacheHits = 16,
    /// Reads the disk cache did not hold (fetched remotely).
    CacheMisses = 17,
    /// Bytes read from the disk cache.
    CacheBytesFromCache = 18,
    /// Bytes fetched from the store for reads the cache missed.
    CacheBytesFromRemote = 19,
    /// Gauge: bytes the disk cache holds now.
    CacheBytesUsed = 20,
    /// Gauge: the disk cache's limit in bytes (0: no cache).
    CacheBytesLimit = 21,
    /// Images the decode stage made (`serve --decode image`).
    ImagesDecoded = 22,
    /// Of them, samples that could not be decoded and were served as zero
    /// images (`--on-bad-sample zero`).
    ImagesBad = 23,
    /// Hedges whose answer came first and was used.
    RemoteHedgesWon = 24,
    /// Times the store throttled and the rate limit was cut.
    RemoteRateCuts = 25,
    /// Gauge: the epoch the trainers are in: of the next step the slowest
    /// rank takes (with `flags::PROGRESS_KNOWN`; `layout::Progress`).
    ProgressEpoch = 26,
    /// Gauge: steps of that epoch every rank has taken.
    ProgressStep = 27,
    /// Gauge: steps each rank gets in that epoch.
    ProgressEpochSteps = 28,
    /// Steps every rank has taken in the run (the fewest any rank took).
    ProgressStepsDone = 29,
}

impl Counter {
    /// Every named counter, in block order.
    pub const ALL: [Counter; 30] = [
        Counter::UpdatedUnixMs,
        Counter::RemoteGetsInFlight,
        Counter::RemoteBytesReceived,
        Counter::RemoteRetriesThrottled,
        Counter::RemoteRetriesServerError,
        Counter::RemoteRetriesConnect,
        Counter::RemoteRetriesStall,
        Counter::RemoteRetriesBodyInterrupted,
        Counter::RemoteRetriesTimeout,
        Counter::RemoteRetriesOther,
        Counter::RemoteGetLatencyUsP50,
        Counter::RemoteGetLatencyUsP99,
        Counter::RemoteWindow,
        Counter::RemoteGetsOk,
        Counter::RemoteRateLimit,
        Counter::RemoteHedges,
        Counter::CacheHits,
        Counter::CacheMisses,
        Counter::CacheBytesFromCache,
        Counter::CacheBytesFromRemote,
        Counter::CacheBytesUsed,
        Counter::CacheBytesLimit,
        Counter::ImagesDecoded,
        Counter::ImagesBad,
        Counter::RemoteHedgesWon,
        Counter::RemoteRateCuts,
        Counter::ProgressEpoch,
        Counter::ProgressStep,
        Counter::ProgressEpochSteps,
        Counter::ProgressStepsDone,
    ];

    /// The retry counters, in the order of the remote engine's
    /// `RetryCause::ALL`.
    pub const REMOTE_RETRIES: [Counter; 7] = [
        Counter::RemoteRetriesThrottled,
        Counter::RemoteRetriesServerError,
        Counter::RemoteRetriesConnect,
        Counter::RemoteRetriesStall,
        Counter::RemoteRetriesBodyInterrupted,
        Counter::RemoteRetriesTimeout,
        Counter::RemoteRetriesOther,
    ];

    /// Its word in the block.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The block's words as read at one moment (`Observer::snapshot`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters(pub [u64; COUNTER_WORDS]);

impl Counters {
    /// One counter's value.
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter.index()]
    }

    /// Whether the loader ever wrote the block.
    pub fn written(&self) -> bool {
        self.get(Counter::UpdatedUnixMs) != 0
    }
}

const _: () = {
    let mut i = 0;
    while i < Counter::ALL.len() {
        assert!(Counter::ALL[i].index() < COUNTER_WORDS);
        if i > 0 {
            assert!(Counter::ALL[i - 1].index() < Counter::ALL[i].index());
        }
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of docs/ring-layout.md, "Loader counters": a name's word
    /// never moves (a stat of another build reads it there).
    #[test]
    fn every_counter_sits_at_the_word_docs_ring_layout_md_gives() {
        let words: Vec<(Counter, usize)> = Counter::ALL.iter().map(|&c| (c, c.index())).collect();
        assert_eq!(
            words,
            [
                (Counter::UpdatedUnixMs, 0),
                (Counter::RemoteGetsInFlight, 1),
                (Counter::RemoteBytesReceived, 2),
                (Counter::RemoteRetriesThrottled, 3),
                (Counter::RemoteRetriesServerError, 4),
                (Counter::RemoteRetriesConnect, 5),
                (Counter::RemoteRetriesStall, 6),
                (Counter::RemoteRetriesBodyInterrupted, 7),
                (Counter::RemoteRetriesTimeout, 8),
                (Counter::RemoteRetriesOther, 9),
                (Counter::RemoteGetLatencyUsP50, 10),
                (Counter::RemoteGetLatencyUsP99, 11),
                (Counter::RemoteWindow, 12),
                (Counter::RemoteGetsOk, 13),
                (Counter::RemoteRateLimit, 14),
                (Counter::RemoteHedges, 15),
                (Counter::CacheHits, 16),
                (Counter::CacheMisses, 17),
                (Counter::CacheBytesFromCache, 18),
                (Counter::CacheBytesFromRemote, 19),
                (Counter::CacheBytesUsed, 20),
                (Counter::CacheBytesLimit, 21),
                (Counter::ImagesDecoded, 22),
                (Counter::ImagesBad, 23),
                (Counter::RemoteHedgesWon, 24),
                (Counter::RemoteRateCuts, 25),
                (Counter::ProgressEpoch, 26),
                (Counter::ProgressStep, 27),
                (Counter::ProgressEpochSteps, 28),
                (Counter::ProgressStepsDone, 29),
            ]
        );
    }
}
