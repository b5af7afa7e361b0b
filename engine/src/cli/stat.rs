//! `ringfeed stat NAME`: a live view of a running loader.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::remote::RetryCause;
use crate::ring::consumer::AttachError;
use crate::ring::layout::{Counter, Counters};
use crate::ring::observer::{Observer, Snapshot};
use crate::ring::segment::{self, human_bytes};

/// `stat`'s exit status when the loader it reports is gone without having
/// finished its run (killed, or stopped before the end): a health check
/// can tell it from a loader that runs or finished (0) and from no loader
/// of that name, or another error (1).
pub const EXIT_DEAD: u8 = 3;

/// Prints the loader's state every `interval` (once if `once`). Returns the
/// exit status: 0, or [`EXIT_DEAD`] when the last report is of a dead loader.
pub fn run(name: &str, interval: Duration, once: bool) -> Result<u8> {
    // Observer::open reports a missing segment as an attach timeout of
    // 0 ms; for a command that does not wait, say what it means.
    let obs = match Observer::open(name) {
        Err(AttachError::Timeout { path, .. }) => anyhow::bail!(
            "no loader named {name:?} is running here ({path} does not exist): it has not started yet, \
             it has finished, or it was given another --name; {}",
            crate::ring::loaders::name_hint(name)
        ),
        other => other?,
    };
    let mut prev = obs.snapshot();
    let mut prev_at = Instant::now();
    let mut recent_wait: Vec<Duration> = vec![Duration::ZERO; prev.ranks.len()];
    // One report has rates only over an interval: --once waits one, unless
    // the loader is gone and nothing can move.
    if !once || !prev.loader_alive {
        print(name, &prev, &prev, Duration::ZERO, &recent_wait);
        if once || !prev.loader_alive {
            return Ok(exit_status(&prev, name));
        }
    }
    loop {
        std::thread::sleep(interval);
        let now = obs.snapshot();
        let dt = prev_at.elapsed();
        for (i, r) in now.ranks.iter().enumerate() {
            recent_wait[i] = r.wait.saturating_sub(prev.ranks[i].wait);
        }
        print(name, &now, &prev, dt, &recent_wait);
        // Every batch published ("ended") is not the end: trainers still
        // take and release the last ones while the loader waits for them.
        if once || !now.loader_alive {
            return Ok(exit_status(&now, name));
        }
        prev = now;
        prev_at = Instant::now();
    }
}

/// 0 for a loader that runs or finished its run, [`EXIT_DEAD`] for one
/// that is gone without finishing it.
fn exit_status(s: &Snapshot, name: &str) -> u8 {
    if state(s, name).1 {
        EXIT_DEAD
    } else {
        0
    }
}

/// The loader's state as a user reads it: what it is doing, and whether its
/// process is still there. A loader that exits cleanly removes its name from
/// /dev/shm; with the loader dead and the name still there, it was killed.
/// The second part says whether it is dead: gone, its run unfinished.
pub(super) fn state(s: &Snapshot, name: &str) -> (&'static str, bool) {
    let left_behind = || segment::shm_path(name).exists();
    match (s.state_name(), s.loader_alive) {
        ("creating", true) => ("creating the ring", false),
        ("running", true) => ("running", false),
        ("ended", true) => ("running: every batch published, waiting for trainers to take and release the last", false),
        ("ended", false) if left_behind() => (
            "DEAD: the loader was killed after publishing every batch, before its trainers released them all (run `ringfeed gc`)",
            true,
        ),
        ("ended", false) => ("finished: every batch was published and the loader exited", false),
        ("aborted", true) => ("stopping: the run was aborted", false),
        ("aborted", false) => ("aborted: the loader stopped before the end of the run", true),
        (_, false) => ("DEAD: the loader exited without finishing (run `ringfeed gc`)", true),
        _ => ("in an unknown state", false),
    }
}

fn print(name: &str, s: &Snapshot, prev: &Snapshot, dt: Duration, recent_wait: &[Duration]) {
    let secs = dt.as_secs_f64();
    // The first frame has no interval: no rate yet.
    let rate = |now: u64, before: u64, scale: f64| {
        if secs > 0.0 {
            format!("{:.1}", (now - before.min(now)) as f64 / secs / scale)
        } else {
            "-".to_owned()
        }
    };
    // A loader that exited left its last count behind: no read is under way.
    let in_flight = if s.loader_alive {
        s.reads_in_flight.to_string()
    } else {
        "no".to_string()
    };
    println!(
        "loader {name:?} of {} pid {} {} | reader {} ({in_flight} reads in flight) | {} slots/rank × {} | ring {}",
        crate::ring::segment::trust::describe_uid(s.owner),
        s.loader_pid,
        state(s, name).0,
        if s.reader_backend.is_empty() { "-" } else { &s.reader_backend },
        s.slots_per_rank,
        human_bytes(s.slot_payload_bytes),
        human_bytes(s.segment_bytes),
    );
    let w = s.ranks.len() as u32;
    if !s.job.is_single_machine(w) {
        let first = s.job.first_rank;
        println!(
            "  part of a job of {} ranks on several machines: this loader serves job ranks {first} to {} (rank r below is job rank {first} + r)",
            s.job.job_world_size,
            first + w.saturating_sub(1)
        );
    }
    println!(
        "  total {} batches/s, {} MB/s, {} batches, {}",
        rate(s.batches_published, prev.batches_published, 1.0),
        rate(s.bytes_published, prev.bytes_published, 1e6),
        s.batches_published,
        human_bytes(s.bytes_published)
    );
    print_progress(s);
    print_counters(&s.counters, &prev.counters, secs);
    let recent = if secs > 0.0 {
        format!("waited(last {secs:.1}s)")
    } else {
        "waited(recent)".to_owned()
    };
    println!(
        "  {:>4}  {:<9} {:>7}  {:>15}  {:>9}  {:>9}  {:>8}  {:>14}  {recent:>17}",
        "rank", "consumer", "queued", "published", "consumed", "batches/s", "MB/s", "waited(total)"
    );
    for (i, r) in s.ranks.iter().enumerate() {
        let consumer = if r.attached {
            format!("pid {}", r.consumer_pid)
        } else {
            "none".to_string()
        };
        let expected = if r.batches_expected == u64::MAX {
            String::new()
        } else {
            format!("/{}", r.batches_expected)
        };
        let p = prev.ranks.get(i).copied().unwrap_or_default();
        // A consumer built before bytes_consumed existed leaves it 0.
        let mbps = if r.consumed > p.consumed && r.bytes_consumed == p.bytes_consumed {
            "-".to_string()
        } else {
            rate(r.bytes_consumed, p.bytes_consumed, 1e6)
        };
        // A consumer adds its wait when each wait slice ends, so the growth
        // over one interval can exceed it by a slice: it waited all of it.
        let recent = if secs > 0.0 {
            format!(
                "{:.3}s",
                recent_wait
                    .get(i)
                    .copied()
                    .unwrap_or_default()
                    .min(dt)
                    .as_secs_f64()
            )
        } else {
            "-".to_owned()
        };
        println!(
            "  {i:>4}  {consumer:<9} {:>7}  {:>15}  {:>9}  {:>9}  {mbps:>8}  {:>13.3}s  {recent:>17}",
            r.published.saturating_sub(r.consumed),
            format!("{}{expected}", r.published),
            r.consumed,
            rate(r.consumed, p.consumed, 1.0),
            r.wait.as_secs_f64(),
        );
    }
}

/// Where the run is, when the loader says it.
fn print_progress(s: &Snapshot) {
    let Some(p) = &s.progress else {
        return;
    };
    let expected = s.ranks.first().map_or(u64::MAX, |r| r.batches_expected);
    let of = if expected == u64::MAX {
        String::new()
    } else {
        format!(" of {expected}")
    };
    println!(
        "  progress: {}, {}{of} steps taken by every rank",
        p.words(),
        p.steps_done
    );
}

/// The loader's counters block: the remote engine's line when it fetched
/// anything, the disk cache's when it holds or missed anything. A loader
/// that predates the block (or serves a local directory) prints neither.
fn print_counters(c: &Counters, prev: &Counters, secs: f64) {
    if !c.written() {
        return;
    }
    for line in counter_lines(c, prev, secs) {
        println!("  {line}");
    }
}

/// The lines `print_counters` prints (tests read them).
fn counter_lines(c: &Counters, prev: &Counters, secs: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let got = |k: Counter| c.get(k);
    let rate = |k: Counter| {
        if secs > 0.0 {
            let before = prev.get(k).min(c.get(k));
            format!("{:.1} MB/s", (c.get(k) - before) as f64 / secs / 1e6)
        } else {
            "- MB/s".to_owned()
        }
    };
    if got(Counter::RemoteGetsOk) > 0
        || got(Counter::RemoteGetsInFlight) > 0
        || got(Counter::RemoteBytesReceived) > 0
    {
        let retries: Vec<String> = RetryCause::ALL
            .iter()
            .zip(Counter::REMOTE_RETRIES)
            .filter(|(_, k)| got(*k) > 0)
            .map(|(cause, k)| format!("{} {}", cause.name(), got(k)))
            .collect();
        let limits = limit_words(c);
        lines.push(format!(
            "remote: {} GETs in flight (window {}{limits}), {}, {} GETs, {} received, GET latency p50 {:.1} ms p99 {:.1} ms, retries: {}",
            got(Counter::RemoteGetsInFlight),
            got(Counter::RemoteWindow),
            rate(Counter::RemoteBytesReceived),
            got(Counter::RemoteGetsOk),
            human_bytes(got(Counter::RemoteBytesReceived)),
            got(Counter::RemoteGetLatencyUsP50) as f64 / 1e3,
            got(Counter::RemoteGetLatencyUsP99) as f64 / 1e3,
            if retries.is_empty() {
                "none".to_owned()
            } else {
                retries.join(", ")
            }
        ));
    }
    let (hits, misses) = (got(Counter::CacheHits), got(Counter::CacheMisses));
    if hits + misses > 0 || got(Counter::CacheBytesLimit) > 0 {
        let ratio = if hits + misses > 0 {
            format!("{:.0}% hits", hits as f64 * 100.0 / (hits + misses) as f64)
        } else {
            "no reads yet".to_owned()
        };
        lines.push(format!(
            "cache: {ratio} ({hits} hits, {misses} misses), {} from cache, {} from remote, {} of {} used",
            human_bytes(got(Counter::CacheBytesFromCache)),
            human_bytes(got(Counter::CacheBytesFromRemote)),
            human_bytes(got(Counter::CacheBytesUsed)),
            human_bytes(got(Counter::CacheBytesLimit)),
        ));
    }
    let decoded = got(Counter::ImagesDecoded);
    if decoded > 0 {
        lines.push(format!(
            "images: {decoded} decoded, {} not decodable (served as zero images, flagged in batch.bad)",
            got(Counter::ImagesBad)
        ));
    }
    lines
}

/// The rate limit and the hedges of the remote line, once there are any
/// (a loader that predates them leaves their words 0).
fn limit_words(c: &Counters) -> String {
    let mut words = String::new();
    if c.get(Counter::RemoteRateCuts) > 0 {
        words.push_str(&format!(
            ", rate limit {} GETs/s (cut {} times)",
            c.get(Counter::RemoteRateLimit),
            c.get(Counter::RemoteRateCuts)
        ));
    }
    if c.get(Counter::RemoteHedges) > 0 {
        words.push_str(&format!(
            ", hedges {} ({} won)",
            c.get(Counter::RemoteHedges),
            c.get(Counter::RemoteHedgesWon)
        ));
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limit_and_hedges_show_once_the_store_throttled_or_a_get_was_hedged() {
        let quiet = counters(&[(Counter::RemoteGetsOk, 10), (Counter::RemoteWindow, 256)]);
        let line = counter_lines(&quiet, &quiet, 1.0).remove(0);
        assert!(
            !line.contains("rate limit") && !line.contains("hedges"),
            "{line}"
        );
        let busy = counters(&[
            (Counter::RemoteGetsOk, 10),
            (Counter::RemoteWindow, 256),
            (Counter::RemoteRateLimit, 412),
            (Counter::RemoteRateCuts, 7),
            (Counter::RemoteHedges, 5),
            (Counter::RemoteHedgesWon, 4),
        ]);
        let line = counter_lines(&busy, &busy, 1.0).remove(0);
        assert!(
            line.contains("(window 256, rate limit 412 GETs/s (cut 7 times), hedges 5 (4 won))"),
            "{line}"
        );
    }

    fn counters(values: &[(Counter, u64)]) -> Counters {
        let mut c = Counters::default();
        c.0[Counter::UpdatedUnixMs.index()] = 1;
        for &(k, v) in values {
            c.0[k.index()] = v;
        }
        c
    }

    #[test]
    fn a_local_loader_prints_no_remote_or_cache_line() {
        assert!(counter_lines(&counters(&[]), &counters(&[]), 1.0).is_empty());
    }

    #[test]
    fn remote_figures_show_rate_latency_and_retries_by_cause() {
        let prev = counters(&[(Counter::RemoteBytesReceived, 1_000_000)]);
        let now = counters(&[
            (Counter::RemoteGetsInFlight, 37),
            (Counter::RemoteWindow, 256),
            (Counter::RemoteBytesReceived, 21_000_000),
            (Counter::RemoteGetsOk, 900),
            (Counter::RemoteGetLatencyUsP50, 32_768),
            (Counter::RemoteGetLatencyUsP99, 131_072),
            (Counter::RemoteRetriesThrottled, 4),
            (Counter::RemoteRetriesStall, 1),
        ]);
        let lines = counter_lines(&now, &prev, 2.0);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        for want in [
            "37 GETs in flight (window 256)",
            "10.0 MB/s",
            "900 GETs",
            "p50 32.8 ms p99 131.1 ms",
            "retries: throttled (429/503) 4, stall 1",
        ] {
            assert!(line.contains(want), "{want:?} not in {line}");
        }
    }

    #[test]
    fn cache_figures_show_when_the_cache_wrote_them() {
        let now = counters(&[
            (Counter::CacheHits, 75),
            (Counter::CacheMisses, 25),
            (Counter::CacheBytesLimit, 1 << 30),
        ]);
        let lines = counter_lines(&now, &now, 1.0);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("cache: 75% hits (75 hits, 25 misses)"),
            "{}",
            lines[0]
        );
    }
}
