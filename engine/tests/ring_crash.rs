//! Crash acceptance of the ring, with real processes killed by SIGKILL:
//! - a consumer that dies holding slots gets them reclaimed by the loader
//!   within a second, its rank continues with the next undelivered batch, and
//!   the other ranks never stall meanwhile;
//! - a loader that dies makes every consumer's `next` fail with `LoaderGone`
//!   within a second, whether it was already waiting or calls afterwards, and
//!   `ringfeed gc` removes what it left in /dev/shm;
//! - a loader that ends cleanly gives `End`, one that aborts names the signal.
//!
//! The processes are the hidden `ring-test-producer` / `ring-test-consumer`
//! subcommands of the `ringfeed` binary (their contract: tests/README.md).
//! Every wait is bounded by `HANG`, so a hang fails the test instead of
//! stalling CI. The latencies measured are printed (`-- --nocapture`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringfeed::cli::testing::check_batch;
use ringfeed::ring::observer::Observer;
use ringfeed::ring::{
    AttachError, AttachOptions, Consumer, Next, NextError, Producer, RingGeometry, SampleEntry,
};

const BIN: &str = env!("CARGO_BIN_EXE_ringfeed");
/// Samples per batch and bytes per sample: the test subcommands' defaults.
const B: u32 = 4;
const L: u64 = 64;
/// How many times each crash is repeated.
const ROUNDS: usize = 100;
/// What the design promises: reclaim and loader-gone within about a second.
const PROMISE: Duration = Duration::from_secs(1);
/// Any single wait longer than this is a hang, and fails the test.
const HANG: Duration = Duration::from_secs(10);

fn unique_name(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "crash-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn opts(timeout: Duration) -> AttachOptions {
    AttachOptions {
        timeout: Some(timeout),
    }
}

/// Removes `/dev/shm/ringfeed-NAME` when dropped, whatever the test's outcome.
struct Segment(String);

impl Segment {
    fn path(&self) -> String {
        format!("/dev/shm/ringfeed-{}", self.0)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
    }
}

/// A `ringfeed` child process whose stdout lines arrive on a channel; killed
/// and reaped when dropped, so a failing test leaves no process behind.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(args: &[String]) -> Proc {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ringfeed");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    fn producer(name: &str, world_size: u32, slots_per_rank: u32, batches: u64) -> Proc {
        let args = format!("ring-test-producer --name {name} --world-size {world_size} --slots-per-rank {slots_per_rank} --batches {batches}");
        let mut p = Proc::spawn(&args.split(' ').map(String::from).collect::<Vec<_>>());
        p.expect_line("ready");
        p
    }

    /// Waits (bounded) for a line equal to `want`.
    fn expect_line(&mut self, want: &str) {
        let deadline = Instant::now() + HANG;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line.trim() == want => return,
                Ok(_) => continue,
                Err(e) => panic!(
                    "no {want:?} line from ringfeed ({e}); exit status so far: {:?}",
                    self.child.try_wait()
                ),
            }
        }
    }

    /// SIGKILL, then reap. Returns the instant just before the signal.
    fn kill9(&mut self) -> Instant {
        let t0 = Instant::now();
        self.child.kill().expect("SIGKILL the child");
        self.child.wait().expect("reap the child");
        t0
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "ringfeed did not exit within {HANG:?}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` until it holds; panics after `HANG`. Returns when it held.
fn poll_until(what: &str, mut done: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + HANG;
    loop {
        if done() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{what}: not within {HANG:?}");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// "n=100 median 98.1 ms p90 .. max .." for a list of durations.
fn summary(mut d: Vec<Duration>) -> String {
    d.sort();
    let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    let ms = |x: Duration| x.as_secs_f64() * 1e3;
    format!(
        "n={} min {:.1} ms, median {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        d.len(),
        ms(d[0]),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(d[d.len() - 1])
    )
}

/// Takes the next batch within `HANG`, or panics saying what came instead.
fn take(c: &mut Consumer) -> ringfeed::ring::BatchRef {
    match c.next(Some(HANG)) {
        Ok(Next::Batch(b)) => b,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// Consumes rank `rank` continuously, checking every batch, until `stop`.
/// Returns how many batches it took and the longest gap between two of them.
fn consume_continuously(
    name: String,
    rank: u32,
    world_size: u32,
    stop: Arc<AtomicBool>,
) -> Result<(u64, Duration), String> {
    let mut c = Consumer::attach(&name, rank, opts(HANG)).map_err(|e| e.to_string())?;
    let mut n = 0u64;
    let mut last = Instant::now();
    let mut longest_gap = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        match c.next(Some(Duration::from_millis(50))) {
            Ok(Next::Batch(b)) => {
                check_batch(&b, rank, world_size, B, L)
                    .map_err(|e| format!("rank {rank} batch {n}: {e:#}"))?;
                if b.seq != n {
                    return Err(format!(
                        "rank {rank}: batch {} delivered as the {n}-th",
                        b.seq
                    ));
                }
                c.release(b.slot, b.generation).map_err(|e| e.to_string())?;
                n += 1;
                longest_gap = longest_gap.max(last.elapsed());
                last = Instant::now();
            }
            Ok(Next::Timeout) => {}
            other => return Err(format!("rank {rank}: unexpected {other:?}")),
        }
    }
    Ok((n, longest_gap.max(last.elapsed())))
}

#[test]
fn consumer_killed_holding_slots_gets_them_reclaimed_within_a_second_100_times() {
    let name = unique_name("consumer");
    let _segment = Segment(name.clone());
    let mut producer = Proc::producer(&name, 2, 2, 1 << 40);
    let stop = Arc::new(AtomicBool::new(false));
    let rank1 = {
        let (name, stop) = (name.clone(), stop.clone());
        std::thread::spawn(move || consume_continuously(name, 1, 2, stop))
    };
    let observer = Observer::open(&name).expect("observe the ring");
    let hang_args: Vec<String> =
        format!("ring-test-consumer --name {name} --rank 0 --world-size 2 --take-and-hang 2")
            .split(' ')
            .map(String::from)
            .collect();
    let mut reclaim = Vec::with_capacity(ROUNDS);
    let mut taken_by_rank0 = 0u64;
    for round in 0..ROUNDS {
        let mut consumer = Proc::spawn(&hang_args);
        consumer.expect_line("holding");
        let killed_at = consumer.kill9();
        // Read after the kill: the dead consumer can take nothing more now.
        let consumed = observer.snapshot().ranks[0].consumed;
        assert_eq!(
            consumed,
            taken_by_rank0 + 2,
            "round {round}: the dead consumer took its 2 batches"
        );
        // The loader publishes to rank 0 again only once it reclaimed both
        // slots: that is the moment we measure, without attaching anything.
        let reclaimed_at = poll_until("reclaim", || {
            observer.snapshot().ranks[0].published > consumed
        });
        let latency = reclaimed_at - killed_at;
        assert!(latency < PROMISE, "round {round}: reclaim took {latency:?}");
        reclaim.push(latency);
        // A replacement continues with the first batch nobody took, intact.
        let mut replacement =
            Consumer::attach(&name, 0, opts(HANG)).expect("attach a replacement for rank 0");
        let b = take(&mut replacement);
        assert_eq!(
            b.seq, consumed,
            "round {round}: the replacement continues with the next undelivered batch"
        );
        check_batch(&b, 0, 2, B, L).expect("the replacement's batch is intact");
        replacement.release(b.slot, b.generation).expect("release");
        drop(replacement);
        taken_by_rank0 = consumed + 1;
    }
    stop.store(true, Ordering::Relaxed);
    let (rank1_batches, longest_gap) = rank1
        .join()
        .expect("rank 1 thread")
        .expect("rank 1 consumed correctly");
    println!("consumer kill -9 → slots reclaimed: {}", summary(reclaim));
    println!(
        "rank 1 meanwhile: {rank1_batches} batches, longest gap {:.1} ms",
        longest_gap.as_secs_f64() * 1e3
    );
    assert!(
        longest_gap < PROMISE,
        "rank 1 stalled for {longest_gap:?} while rank 0's consumers died"
    );
    assert!(
        producer.child.try_wait().expect("try_wait").is_none(),
        "the loader survived every consumer crash"
    );
}

#[test]
fn loader_killed_makes_consumers_fail_with_loader_gone_within_a_second_100_times() {
    let mut waiting = Vec::with_capacity(ROUNDS);
    let mut late = Vec::with_capacity(ROUNDS);
    let mut left_for_gc = Vec::new();
    for round in 0..ROUNDS {
        let name = unique_name("loader");
        let mut producer = Proc::producer(&name, 2, 2, 10);
        // Rank 0 takes and gives back all 10 of its batches; rank 1 takes
        // two and holds them (K = 2), so the run cannot end, and rank 0's
        // next waits, holding nothing, for a batch that cannot come.
        let mut c0 = Consumer::attach(&name, 0, opts(HANG)).expect("attach rank 0");
        let mut c1 = Consumer::attach(&name, 1, opts(HANG)).expect("attach rank 1");
        for _ in 0..10 {
            let b = take(&mut c0);
            c0.release(b.slot, b.generation).expect("release");
        }
        let held = [take(&mut c1), take(&mut c1)];
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // A batch is not Send (it points into this consumer's mapping): send its description.
            let r = c0.next(None).map(|n| format!("{n:?}"));
            let _ = tx.send((r, Instant::now()));
            c0
        });
        // Vary how long the waiter has slept before the kill (0 to 150 ms),
        // so that the kill lands anywhere in its 100 ms wait slices.
        std::thread::sleep(Duration::from_micros((round as u64 * 1_517) % 150_000));
        let killed_at = producer.kill9();
        // A consumer that calls next only after the loader died, still
        // holding the slot its next batch needs: the death is the news.
        let late_result = c1.next(Some(HANG));
        for b in held {
            c1.release(b.slot, b.generation)
                .expect("release after the loader died");
        }
        let late_latency = killed_at.elapsed();
        assert!(
            matches!(late_result, Err(NextError::LoaderGone { .. })),
            "round {round}: a late next gave {late_result:?}"
        );
        late.push(late_latency);
        let (result, returned_at) = rx
            .recv_timeout(HANG)
            .expect("the waiting next returned (no hang)");
        let latency = returned_at.saturating_duration_since(killed_at);
        match &result {
            Err(e @ NextError::LoaderGone { pid, .. }) => {
                assert_eq!(
                    *pid,
                    producer.child.id(),
                    "the error names the dead loader's pid"
                );
                assert!(
                    e.to_string().contains(&name),
                    "the error names the loader: {e}"
                );
            }
            other => panic!("round {round}: waiting next gave {other:?}"),
        }
        assert!(
            latency < PROMISE && late_latency < PROMISE,
            "round {round}: loader-gone after {latency:?} / {late_latency:?}"
        );
        waiting.push(latency);
        let c0 = waiter.join().expect("waiter thread");
        drop((c0, c1));
        // Nobody can attach to a dead loader's ring (attach waits out its
        // timeout for a restarted loader, then says the loader is gone).
        match Consumer::attach(&name, 0, opts(Duration::from_millis(20))) {
            Err(AttachError::LoaderGone { .. }) => {}
            Err(e) => panic!("attach to a dead loader: {e}"),
            Ok(_) => panic!("attach to a dead loader succeeded"),
        }
        // Keep the last few segments for `ringfeed gc`; remove the rest now.
        let segment = Segment(name);
        if round + 3 >= ROUNDS {
            left_for_gc.push(segment);
        } else {
            drop(segment);
        }
    }
    println!(
        "loader kill -9 → waiting next() gets LoaderGone: {}",
        summary(waiting)
    );
    println!(
        "loader kill -9 → next() called afterwards gets LoaderGone: {}",
        summary(late)
    );

    let out = Command::new(BIN)
        .arg("gc")
        .output()
        .expect("run ringfeed gc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for segment in &left_for_gc {
        let gone = !std::path::Path::new(&segment.path()).exists();
        assert!(
            gone,
            "{} is still there after ringfeed gc:\n{stdout}",
            segment.path()
        );
        // Named as removed, unless a gc run by someone else on this machine
        // got there first (then it is not named at all).
        match stdout.lines().find(|l| l.contains(&segment.path())) {
            Some(line) => assert!(
                line.starts_with("removed"),
                "ringfeed gc on {}: {line}",
                segment.path()
            ),
            None => println!("note: {} was removed before our gc ran", segment.path()),
        }
    }
}

#[test]
fn loader_that_finishes_cleanly_gives_end_even_after_it_exited() {
    let name = unique_name("end");
    let _segment = Segment(name.clone());
    let mut producer = Proc::producer(&name, 1, 2, 5);
    let mut c = Consumer::attach(&name, 0, opts(HANG)).expect("attach");
    for seq in 0..5 {
        let b = take(&mut c);
        assert_eq!(b.seq, seq);
        check_batch(&b, 0, 1, B, L).expect("intact batch");
        c.release(b.slot, b.generation).expect("release");
    }
    assert!(
        matches!(c.next(Some(HANG)), Ok(Next::End)),
        "END once every batch was taken"
    );
    // The loader exits 0 once everything is released; END does not turn into
    // LoaderGone after that.
    assert!(producer.wait_exit().success(), "the loader exits cleanly");
    let after = c.next(Some(HANG));
    assert!(
        matches!(after, Ok(Next::End)),
        "after the loader exited: {after:?}"
    );
}

fn in_process_ring(name: &str) -> Producer {
    let g = RingGeometry {
        world_size: 1,
        slots_per_rank: 2,
        max_samples_per_slot: 1,
        slot_payload_bytes: 4096,
    };
    Producer::create(name, g).expect("create ring")
}

fn publish_one(p: &mut Producer) {
    let mut claim = p.try_claim(0).expect("claim").expect("a free slot");
    let seq = claim.seq();
    claim.payload_mut()[..8].copy_from_slice(&seq.to_le_bytes());
    p.publish(
        claim,
        0,
        seq,
        &[SampleEntry {
            offset: 0,
            len: 8,
            index: seq,
        }],
    )
    .expect("publish");
}

#[test]
fn finish_with_everything_released_gives_end() {
    let name = unique_name("finish");
    let mut p = in_process_ring(&name);
    let mut c = Consumer::attach(&name, 0, opts(HANG)).expect("attach");
    for _ in 0..3 {
        publish_one(&mut p);
        let b = take(&mut c);
        c.release(b.slot, b.generation).expect("release");
    }
    p.finish();
    assert!(matches!(c.next(Some(HANG)), Ok(Next::End)));
    assert!(p.all_released());
}

#[test]
fn abort_on_a_signal_gives_aborted_naming_it_to_a_waiting_consumer() {
    let name = unique_name("abort");
    let mut p = in_process_ring(&name);
    let mut c = Consumer::attach(&name, 0, opts(HANG)).expect("attach");
    publish_one(&mut p);
    let b = take(&mut c);
    c.release(b.slot, b.generation).expect("release");
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send((c.next(None).map(|n| format!("{n:?}")), Instant::now()));
    });
    std::thread::sleep(Duration::from_millis(20));
    let aborted_at = Instant::now();
    p.abort(15);
    let (result, returned_at) = rx.recv_timeout(HANG).expect("the waiting next returned");
    waiter.join().expect("waiter thread");
    match result {
        Err(NextError::Aborted { reason, .. }) => {
            assert!(reason.contains("signal 15"), "reason: {reason}")
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    // The abort wakes the sleeper through its futex: no wait slice is lost.
    let latency = returned_at.saturating_duration_since(aborted_at);
    println!(
        "abort(15) → waiting next() gets Aborted after {:.3} ms",
        latency.as_secs_f64() * 1e3
    );
    assert!(latency < PROMISE);
}

// Bug story: a loader creates its segment with shm_open(O_CREAT | O_EXCL) and
// takes its liveness lock right after. A trainer that polled in between (the
// usual start-up of a job: torchrun and `ringfeed serve` launched together)
// found an empty segment with no lock, took it for garbage left by a dead
// loader, and failed attach at once with "not a valid ringfeed segment: it is
// 0 bytes" instead of waiting for the loader as its timeout allowed. An empty
// unlocked segment is now retried until the timeout, like a locked one.
#[test]
fn consumer_attaching_while_the_loader_creates_its_segment_waits_for_it() {
    let name = unique_name("creating");
    let segment = Segment(name.clone());
    // The state between the loader's shm_open and its lock: empty, unlocked;
    // dated a minute back, so the loader below takes it for a dead one's.
    let empty = std::fs::File::create(segment.path()).expect("create an empty segment");
    empty
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
        .expect("date it back");
    let attacher = {
        let name = name.clone();
        std::thread::spawn(move || Consumer::attach(&name, 0, opts(HANG)).map(|c| c.rank()))
    };
    std::thread::sleep(Duration::from_millis(50));
    // The loader goes on: it replaces the unlocked segment with its ring.
    let p = in_process_ring(&name);
    let attached = attacher.join().expect("attach thread");
    assert!(
        matches!(attached, Ok(0)),
        "attach during the loader's creation: {attached:?}"
    );
    drop(p);
}

// A loader makes its segment unnamed, locks and sizes it, and only then names
// it (issue 32, item 13): an empty unlocked segment under a ring's name is
// never a loader still creating it, only one that died (or garbage), and a
// new loader replaces it at once (it used to refuse one younger than 5 s as
// "creating its segment right now").
#[test]
fn a_loader_replaces_an_empty_unlocked_segment_at_once() {
    let name = unique_name("racing");
    let segment = Segment(name.clone());
    std::fs::File::create(segment.path()).expect("create an empty segment");
    let g = RingGeometry {
        world_size: 1,
        slots_per_rank: 2,
        max_samples_per_slot: 1,
        slot_payload_bytes: 4096,
    };
    let p = Producer::create(&name, g).expect("replaces the dead loader's empty segment");
    assert!(
        std::fs::metadata(segment.path())
            .expect("the new ring")
            .len()
            > 0
    );
    drop(p);
}

// Bug story: `next` meant to check the loader's liveness before its first
// sleep (`|| now == start`), but by then it had spun for 50 µs, so `now` was
// never `start` and the first check came only after a whole 100 ms wait slice
// with nobody left to wake it. A trainer that called `next` after its loader
// died always waited the full slice before LoaderGone. The first sleep now
// checks first; a slice can only be lost by a loader that dies mid-wait.
#[test]
fn next_called_after_the_loader_died_fails_at_once_not_after_a_wait_slice() {
    let name = unique_name("dead-before-next");
    let _segment = Segment(name.clone());
    let p = in_process_ring(&name);
    let mut c = Consumer::attach(&name, 0, opts(HANG)).expect("attach");
    p.abandon();
    let started = Instant::now();
    let result = c.next(Some(HANG));
    let took = started.elapsed();
    assert!(
        matches!(result, Err(NextError::LoaderGone { .. })),
        "{result:?}"
    );
    // Before the fix this took at least one whole slice, deterministically.
    assert!(
        took < ringfeed::ring::consumer::WAIT_SLICE * 9 / 10,
        "LoaderGone after {took:?}"
    );
}
