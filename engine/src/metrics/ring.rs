//! The ring's own counters as Prometheus families: what `ringfeed stat`
//! shows, read the same way (a read-only [`Observer`](crate::ring::observer::Observer) snapshot, no lock, no
//! write), so a scrape can never disturb the loader or a trainer.
//!
//! Rates (batches/s, MB/s) are not exported: Prometheus computes them from
//! the counters with `rate()`, over whatever window a dashboard wants.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::metrics::figure::{family, sample, single, Kind, Value};
use crate::ring::layout::{Counter, Progress};
use crate::ring::observer::{RankSnapshot, Snapshot};

/// One per-rank family: its name, kind, HELP text and how to read it from a
/// rank's snapshot (None: no sample for that rank).
struct RankFigure {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&RankSnapshot) -> Option<Value>,
}

/// One family of the whole loader, one sample, read from the snapshot.
struct LoaderFigure {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&Snapshot) -> Value,
}

/// The loader's one-sample families, in exposition order, after the state
/// and the info. One line each to add.
#[rustfmt::skip]
const LOADER_FIGURES: &[LoaderFigure] = &[
    LoaderFigure { name: "ringfeed_reads_in_flight", kind: Kind::Gauge, help: "Reads submitted to the reader and not yet completed.", value: |s| s.reads_in_flight.into() },
    LoaderFigure { name: "ringfeed_batches_published_total", kind: Kind::Counter, help: "Batches the loader published, all ranks together.", value: |s| s.batches_published.into() },
    LoaderFigure { name: "ringfeed_published_bytes_total", kind: Kind::Counter, help: "Payload bytes of the batches the loader published, all ranks together.", value: |s| s.bytes_published.into() },
    LoaderFigure { name: "ringfeed_ring_ranks", kind: Kind::Gauge, help: "Ranks this loader serves (its ring's world size).", value: |s| (s.ranks.len() as u64).into() },
    LoaderFigure { name: "ringfeed_ring_slots_per_rank", kind: Kind::Gauge, help: "Batch slots per rank: how far ahead the loader may read.", value: |s| s.slots_per_rank.into() },
    LoaderFigure { name: "ringfeed_ring_slot_payload_bytes", kind: Kind::Gauge, help: "Payload bytes of one batch slot.", value: |s| s.slot_payload_bytes.into() },
    LoaderFigure { name: "ringfeed_ring_segment_bytes", kind: Kind::Gauge, help: "Size of the shared-memory segment in /dev/shm.", value: |s| s.segment_bytes.into() },
    LoaderFigure { name: "ringfeed_job_world_size", kind: Kind::Gauge, help: "Ranks of the whole training job, all machines together.", value: |s| s.job.job_world_size.into() },
    LoaderFigure { name: "ringfeed_job_first_rank", kind: Kind::Gauge, help: "Job rank of this loader's rank 0 (job rank = this + rank).", value: |s| s.job.first_rank.into() },
    LoaderFigure { name: "ringfeed_images_decoded_total", kind: Kind::Counter, help: "Images the decode stage made (serve --decode image).", value: |s| s.counters.get(Counter::ImagesDecoded).into() },
    LoaderFigure { name: "ringfeed_images_bad_total", kind: Kind::Counter, help: "Samples that could not be decoded, served as zero images (--on-bad-sample zero).", value: |s| s.counters.get(Counter::ImagesBad).into() },
];

/// A family of where the run is (`ring::layout::Progress`): written only
/// when the loader says it (value None: no sample).
struct ProgressFigure {
    name: &'static str,
    help: &'static str,
    value: fn(&Snapshot, &Progress) -> Option<Value>,
}

/// The progress families (gauges), after the loader's. One line each to add.
#[rustfmt::skip]
const PROGRESS_FIGURES: &[ProgressFigure] = &[
    ProgressFigure { name: "ringfeed_progress_epoch", help: "The epoch the trainers are in: of the next step the slowest rank takes (from 0; the run's epochs once every step was taken).", value: |_, p| Some(p.epoch.into()) },
    ProgressFigure { name: "ringfeed_progress_step", help: "Steps of that epoch every rank has taken.", value: |_, p| Some(p.step.into()) },
    ProgressFigure { name: "ringfeed_progress_epoch_steps", help: "Steps each rank gets in that epoch.", value: |_, p| Some(p.epoch_steps.into()) },
    ProgressFigure { name: "ringfeed_progress_epochs", help: "Epochs of the run (--epochs).", value: |_, p| Some(p.shape.epochs.into()) },
    ProgressFigure { name: "ringfeed_progress_steps_done", help: "Steps every rank has taken in the run (the fewest any rank took).", value: |_, p| Some(p.steps_done.into()) },
    ProgressFigure { name: "ringfeed_progress_steps_expected", help: "Steps each rank gets in the whole run: the expected total (absent while unknown).", value: |s, _| s.ranks.first().map(|r| r.batches_expected).filter(|&n| n != u64::MAX).map(Value::from) },
];

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

/// The families with labels, written before [`LOADER_FIGURES`].
const STATE_NAME: &str = "ringfeed_loader_state";
const INFO_NAME: &str = "ringfeed_loader_info";

/// Every family name [`encode`] can write, for the tests and the docs.
pub fn family_names() -> Vec<&'static str> {
    let mut names = vec![STATE_NAME, INFO_NAME];
    names.extend(LOADER_FIGURES.iter().map(|f| f.name));
    names.extend(PROGRESS_FIGURES.iter().map(|f| f.name));
    names.extend(RANK_FIGURES.iter().map(|f| f.name));
    names
}

/// The state in `STATES`' words: the ring's own (`stat`'s), or `starting`.
fn state_word(s: Option<&Snapshot>) -> &'static str {
    s.map_or("starting", Snapshot::state_name)
}

/// How the collector reads the ring now: None before the ring exists.
type ReadRing = Box<dyn Fn() -> Option<Snapshot> + Send + Sync>;

/// The ring's families, read at each scrape with `read`.
pub struct RingFigures {
    name: String,
    read: ReadRing,
}

impl RingFigures {
    /// The families of loader `name`, whose ring `read` snapshots.
    pub fn new(
        name: &str,
        read: impl Fn() -> Option<Snapshot> + Send + Sync + 'static,
    ) -> RingFigures {
        RingFigures {
            name: name.to_owned(),
            read: Box::new(read),
        }
    }
}

impl fmt::Debug for RingFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingFigures")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Collector for RingFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        encode(&self.name, (self.read)().as_ref(), &mut encoder)
    }
}

/// Writes the ring's families for loader `name` from `snapshot` (None
/// before the ring exists: only the state, `starting`).
pub fn encode(
    name: &str,
    snapshot: Option<&Snapshot>,
    out: &mut DescriptorEncoder<'_>,
) -> fmt::Result {
    let now = state_word(snapshot);
    let mut states = family(
        out,
        STATE_NAME,
        "1 for the state the loader is in, 0 for the others.",
        Kind::Gauge,
    )?;
    for st in STATES {
        sample(
            states.encode_family(&[("state", st)])?,
            Kind::Gauge,
            (st == now).into(),
        )?;
    }
    let Some(s) = snapshot else {
        return Ok(());
    };
    let mut info = family(
        out,
        INFO_NAME,
        "Always 1: the loader's name and reader backend as labels.",
        Kind::Gauge,
    )?;
    let labels = [("name", name), ("reader", s.reader_backend.as_str())];
    sample(info.encode_family(&labels)?, Kind::Gauge, 1u64.into())?;
    for f in LOADER_FIGURES {
        single(out, f.name, f.help, f.kind, (f.value)(s))?;
    }
    for f in PROGRESS_FIGURES {
        if let Some(v) = s.progress.as_ref().and_then(|p| (f.value)(s, p)) {
            single(out, f.name, f.help, Kind::Gauge, v)?;
        }
    }
    for f in RANK_FIGURES {
        let mut fam = family(out, f.name, f.help, f.kind)?;
        for (i, r) in s.ranks.iter().enumerate() {
            if let Some(v) = (f.value)(r) {
                sample(fam.encode_family(&[("rank", i.to_string())])?, f.kind, v)?;
            }
        }
    }
    Ok(())
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
            progress: Some(Progress {
                shape: crate::ring::layout::RunShape {
                    epochs: 3,
                    epoch_steps: 10,
                    batch_size: 4,
                },
                epoch: 0,
                step: 3,
                epoch_steps: 10,
                steps_done: 3,
            }),
            ..Snapshot::default()
        }
    }

    fn text(s: Option<&Snapshot>) -> String {
        let s = s.cloned();
        crate::metrics::text_of(RingFigures::new("job\"1", move || s.clone()))
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
            "ringfeed_progress_epoch 0\n",
            "ringfeed_progress_step 3\n",
            "ringfeed_progress_epoch_steps 10\n",
            "ringfeed_progress_epochs 3\n",
            "ringfeed_progress_steps_done 3\n",
            "ringfeed_progress_steps_expected 10\n",
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
    fn counters_past_two_to_the_53_are_written_exactly() {
        let s = Snapshot {
            batches_published: u64::MAX,
            ..two_ranks()
        };
        let t = text(Some(&s));
        assert!(
            t.contains("\nringfeed_batches_published_total 18446744073709551615\n"),
            "{t}"
        );
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
