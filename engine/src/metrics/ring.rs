//! The ring's own counters as Prometheus families: what `ringfeed stat`
//! shows, read the same way (a read-only [`Observer`](crate::ring::observer::Observer) snapshot, no lock, no
//! write), so a scrape can never disturb the loader or a trainer.
//!
//! Rates (batches/s, MB/s) are not exported: Prometheus computes them from
//! the counters with `rate()`, over whatever window a dashboard wants.

use crate::metrics::text::{Exposition, Kind, Value};
use crate::ring::observer::{RankSnapshot, Snapshot};

/// One per-rank family: its name, kind, HELP text and how to read it from a
/// rank's snapshot (None: no sample for that rank).
struct RankFigure {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&RankSnapshot) -> Option<Value>,
}

/// The per-rank families, in exposition order. One line each to add.
#[rustfmt::skip]
const RANK_FIGURES: &[RankFigure] = &[
    RankFigure { name: "ringfeed_rank_batches_published_total", kind: Kind::Counter, help: "Batches the loader published to the rank.", value: |r| Some(r.published.into()) },
    RankFigure { name: "ringfeed_rank_batches_delivered_total", kind: Kind::Counter, help: "Batches the rank's trainer took (next returned them).", value: |r| Some(r.consumed.into()) },
    RankFigure { name: "ringfeed_rank_batches_released_total", kind: Kind::Counter, help: "Batches the rank's trainer released, giving their slot back.", value: |r| Some(r.released.into()) },
    RankFigure { name: "ringfeed_rank_delivered_bytes_total", kind: Kind::Counter, help: "Payload bytes of the batches the rank's trainer took.", value: |r| Some(r.bytes_consumed.into()) },
    RankFigure { name: "ringfeed_rank_wait_seconds_total", kind: Kind::Counter, help: "Time the rank's trainer spent waiting for data inside next.", value: |r| Some(r.wait.as_secs_f64().into()) },
    RankFigure { name: "ringfeed_rank_queued_batches", kind: Kind::Gauge, help: "Queue depth: batches published to the rank and not yet taken.", value: |r| Some(r.published.saturating_sub(r.consumed).into()) },
    RankFigure { name: "ringfeed_rank_held_batches", kind: Kind::Gauge, help: "Batches the rank's trainer took and has not released yet.", value: |r| Some(r.consumed.saturating_sub(r.released).into()) },
    RankFigure { name: "ringfeed_rank_batches_expected", kind: Kind::Gauge, help: "Batches the rank gets in the whole run (absent while unknown).", value: |r| (r.batches_expected != u64::MAX).then(|| r.batches_expected.into()) },
    RankFigure { name: "ringfeed_rank_consumer_attached", kind: Kind::Gauge, help: "1 while a trainer is attached to the rank, else 0.", value: |r| Some(r.attached.into()) },
    RankFigure { name: "ringfeed_rank_consumer_pid", kind: Kind::Gauge, help: "Process id of the rank's trainer (0 while none is attached).", value: |r| Some(r.consumer_pid.into()) },
    RankFigure { name: "ringfeed_rank_finished", kind: Kind::Gauge, help: "1 once the loader has published the rank's last batch, else 0.", value: |r| Some(r.finished.into()) },
];

/// The loader's states, as `ringfeed_loader_state{state=...}` names them.
/// `starting`: no ring yet (the dataset is being listed and planned).
pub const STATES: [&str; 6] = [
    "starting", "creating", "running", "ended", "aborted", "unknown",
];

/// Every family name [`collect`] can write, for the tests and the docs.
pub fn family_names() -> Vec<&'static str> {
    let mut names = vec![
        "ringfeed_loader_state",
        "ringfeed_loader_info",
        "ringfeed_reads_in_flight",
        "ringfeed_batches_published_total",
        "ringfeed_published_bytes_total",
        "ringfeed_ring_ranks",
        "ringfeed_ring_slots_per_rank",
        "ringfeed_ring_slot_payload_bytes",
        "ringfeed_ring_segment_bytes",
        "ringfeed_job_world_size",
        "ringfeed_job_first_rank",
    ];
    names.extend(RANK_FIGURES.iter().map(|f| f.name));
    names
}

/// The state in `STATES`' words: the ring's own (`stat`'s), or `starting`.
fn state_word(s: Option<&Snapshot>) -> &'static str {
    s.map_or("starting", Snapshot::state_name)
}

fn gauge(out: &mut Exposition, name: &str, help: &str, v: impl Into<Value>) {
    out.family(name, Kind::Gauge, help);
    out.sample(name, &[], v);
}

fn counter(out: &mut Exposition, name: &str, help: &str, v: impl Into<Value>) {
    out.family(name, Kind::Counter, help);
    out.sample(name, &[], v);
}

/// Writes the ring's families for loader `name` from `snapshot` (None
/// before the ring exists: only the state, `starting`).
pub fn collect(name: &str, snapshot: Option<&Snapshot>, out: &mut Exposition) {
    let now = state_word(snapshot);
    out.family(
        "ringfeed_loader_state",
        Kind::Gauge,
        "1 for the state the loader is in, 0 for the others.",
    );
    for st in STATES {
        out.sample("ringfeed_loader_state", &[("state", st)], st == now);
    }
    let Some(s) = snapshot else {
        return;
    };
    out.family(
        "ringfeed_loader_info",
        Kind::Gauge,
        "Always 1: the loader's name and reader backend as labels.",
    );
    out.sample(
        "ringfeed_loader_info",
        &[("name", name), ("reader", &s.reader_backend)],
        1u64,
    );
    gauge(
        out,
        "ringfeed_reads_in_flight",
        "Reads submitted to the reader and not yet completed.",
        s.reads_in_flight,
    );
    counter(
        out,
        "ringfeed_batches_published_total",
        "Batches the loader published, all ranks together.",
        s.batches_published,
    );
    counter(
        out,
        "ringfeed_published_bytes_total",
        "Payload bytes of the batches the loader published, all ranks together.",
        s.bytes_published,
    );
    gauge(
        out,
        "ringfeed_ring_ranks",
        "Ranks this loader serves (its ring's world size).",
        s.ranks.len() as u64,
    );
    gauge(
        out,
        "ringfeed_ring_slots_per_rank",
        "Batch slots per rank: how far ahead the loader may read.",
        s.slots_per_rank,
    );
    gauge(
        out,
        "ringfeed_ring_slot_payload_bytes",
        "Payload bytes of one batch slot.",
        s.slot_payload_bytes,
    );
    gauge(
        out,
        "ringfeed_ring_segment_bytes",
        "Size of the shared-memory segment in /dev/shm.",
        s.segment_bytes,
    );
    gauge(
        out,
        "ringfeed_job_world_size",
        "Ranks of the whole training job, all machines together.",
        s.job.job_world_size,
    );
    gauge(
        out,
        "ringfeed_job_first_rank",
        "Job rank of this loader's rank 0 (job rank = this + rank).",
        s.job.first_rank,
    );
    let mut rank_label = String::new();
    for f in RANK_FIGURES {
        out.family(f.name, f.kind, f.help);
        for (i, r) in s.ranks.iter().enumerate() {
            if let Some(v) = (f.value)(r) {
                rank_label.clear();
                rank_label.push_str(&i.to_string());
                out.sample(f.name, &[("rank", &rank_label)], v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::layout::state;
    use std::time::Duration;

    fn two_ranks() -> Snapshot {
        Snapshot {
            loader_pid: 7,
            loader_alive: true,
            state: state::READY,
            reader_backend: "io_uring".into(),
            reads_in_flight: 12,
            batches_published: 9,
            bytes_published: 9000,
            slots_per_rank: 4,
            slot_payload_bytes: 4096,
            segment_bytes: 1 << 20,
            ranks: vec![
                RankSnapshot {
                    published: 5,
                    consumed: 3,
                    released: 2,
                    bytes_consumed: 3000,
                    batches_expected: 10,
                    wait: Duration::from_millis(1500),
                    attached: true,
                    consumer_pid: 42,
                    finished: false,
                },
                RankSnapshot {
                    published: 4,
                    batches_expected: u64::MAX,
                    ..RankSnapshot::default()
                },
            ],
            ..Snapshot::default()
        }
    }

    fn text(s: Option<&Snapshot>) -> String {
        let mut e = Exposition::new();
        collect("job\"1", s, &mut e);
        e.into_string()
    }

    #[test]
    fn per_rank_figures_carry_the_rank_label_and_the_snapshots_values() {
        let t = text(Some(&two_ranks()));
        for line in [
            "ringfeed_rank_batches_delivered_total{rank=\"0\"} 3\n",
            "ringfeed_rank_batches_delivered_total{rank=\"1\"} 0\n",
            "ringfeed_rank_queued_batches{rank=\"0\"} 2\n",
            "ringfeed_rank_queued_batches{rank=\"1\"} 4\n",
            "ringfeed_rank_held_batches{rank=\"0\"} 1\n",
            "ringfeed_rank_wait_seconds_total{rank=\"0\"} 1.5\n",
            "ringfeed_rank_delivered_bytes_total{rank=\"0\"} 3000\n",
            "ringfeed_rank_consumer_pid{rank=\"0\"} 42\n",
            "ringfeed_rank_batches_expected{rank=\"0\"} 10\n",
            "ringfeed_reads_in_flight 12\n",
            "ringfeed_loader_state{state=\"running\"} 1\n",
            "ringfeed_loader_state{state=\"ended\"} 0\n",
            "# TYPE ringfeed_rank_wait_seconds_total counter\n",
            "# TYPE ringfeed_rank_queued_batches gauge\n",
        ] {
            assert!(t.contains(line), "no {line:?} in\n{t}");
        }
        // A rank whose expected count is unknown has no sample, not u64::MAX.
        assert!(!t.contains("ringfeed_rank_batches_expected{rank=\"1\"}"));
    }

    #[test]
    fn the_loader_name_is_escaped_in_its_info_label() {
        let t = text(Some(&two_ranks()));
        assert!(
            t.contains("ringfeed_loader_info{name=\"job\\\"1\",reader=\"io_uring\"} 1\n"),
            "{t}"
        );
    }

    #[test]
    fn before_the_ring_exists_only_the_starting_state_is_written() {
        let t = text(None);
        assert!(t.contains("ringfeed_loader_state{state=\"starting\"} 1\n"));
        assert!(t.contains("ringfeed_loader_state{state=\"running\"} 0\n"));
        assert!(!t.contains("ringfeed_rank_"));
    }

    #[test]
    fn every_state_the_ring_names_is_one_of_the_states_written() {
        for st in [
            state::CREATING,
            state::READY,
            state::ENDED,
            state::ABORTED,
            99,
        ] {
            let s = Snapshot {
                state: st,
                ..Snapshot::default()
            };
            assert!(STATES.contains(&state_word(Some(&s))), "{st}");
        }
    }

    #[test]
    fn every_family_collect_writes_is_in_family_names() {
        let t = text(Some(&two_ranks()));
        let written: Vec<&str> = t
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert_eq!(written, family_names());
    }
}
