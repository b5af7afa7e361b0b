//! How fast a batch changes hands through the ring. Prints figures; asserts
//! nothing about time (a benchmark, not a test).
//!
//! `cargo bench -p ringfeed --bench handoff`
//!
//! Every figure is taken with the consumer on a thread of this process and
//! with the consumer in a child process (this same executable, started with
//! `RINGFEED_BENCH_CHILD`), which is how trainers really attach; and both with
//! the producer and the consumer pinned to two different CPUs ("pinned") and
//! left to the scheduler ("free"). On a machine with few cores the two differ:
//! after a futex wake the kernel tends to run the consumer on the producer's
//! CPU, where its spin then delays the producer.
//! - (i) ready path: `next()` + `release()` on a batch that is already
//!   published, while a producer thread keeps refilling the ring and the
//!   consumer "trains" 5 µs between batches (so the producer stays ahead);
//! - (ii) wake-up: the producer publishes at random intervals of 0.5–2 ms, so
//!   the consumer is asleep on its futex; latency runs from the producer's
//!   CLOCK_MONOTONIC stamp (written into the payload just before `publish`)
//!   to the consumer's return from `next`;
//! - (iii) spin window: the producer publishes d µs after the consumer began
//!   waiting; below `SPIN_BEFORE_SLEEP` the batch is caught while spinning.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringfeed::ring::consumer::SPIN_BEFORE_SLEEP;
use ringfeed::ring::{AttachOptions, Consumer, Next, Producer, RingGeometry, SampleEntry};

const CHILD_ENV: &str = "RINGFEED_BENCH_CHILD";
const READY_PAIRS: u64 = 100_000;
/// Untimed "training step" between two batches in (i), so that the producer
/// stays ahead and the batches the consumer asks for are already published.
const CONSUMER_WORK: Duration = Duration::from_micros(5);
const WAKE_SAMPLES: u64 = 1_000;
const SPIN_SAMPLES: u64 = 2_000;
const SPIN_DELAYS_US: [u64; 8] = [0, 5, 10, 20, 40, 60, 100, 200];
/// Samples dropped at the start of each run (page faults, first wake-ups).
const WARMUP: usize = 20;

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pins the calling thread to one CPU (None: leave it to the scheduler).
fn pin(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    // SAFETY: cpu_set_t is plain old data; CPU_SET writes inside it; the
    // kernel only reads the set. Failure leaves the thread unpinned.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The first two CPUs this process may run on: (producer, consumer).
fn two_cpus() -> Option<(usize, usize)> {
    // SAFETY: as in `pin`; sched_getaffinity fills the set.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        set
    };
    // SAFETY: CPU_ISSET only reads the set.
    let mut cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) });
    Some((cpus.next()?, cpus.next()?))
}

/// Where the two sides run.
#[derive(Clone, Copy)]
enum Placement {
    /// Producer and consumer pinned to these two CPUs.
    Pinned(usize, usize),
    /// Both left to the scheduler.
    Free,
}

impl Placement {
    fn producer_cpu(self) -> Option<usize> {
        match self {
            Placement::Pinned(p, _) => Some(p),
            Placement::Free => None,
        }
    }
    fn consumer_cpu(self) -> Option<usize> {
        match self {
            Placement::Pinned(_, c) => Some(c),
            Placement::Free => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Placement::Pinned(..) => "pinned",
            Placement::Free => "free",
        }
    }
}

/// What the consumer measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Duration of each next()+release() that found a batch ready.
    Ready,
    /// Time from the producer's stamp to the return of a blocking next().
    Wake,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Ready => "ready",
            Mode::Wake => "wake",
        }
    }
    fn parse(s: &str) -> Mode {
        if s == "ready" {
            Mode::Ready
        } else {
            Mode::Wake
        }
    }
}

/// The consumer's side: runs until END and returns its samples in ns, and
/// for Ready how many batches were not yet published when first asked for.
fn consume(name: &str, mode: Mode, cpu: Option<usize>) -> (Vec<u64>, u64) {
    pin(cpu);
    let mut c = Consumer::attach(
        name,
        0,
        AttachOptions {
            timeout: Some(Duration::from_secs(10)),
        },
    )
    .expect("attach");
    let mut samples = Vec::with_capacity(READY_PAIRS as usize);
    let mut not_ready = 0u64;
    let mut first_ask = true;
    loop {
        match mode {
            Mode::Ready => {
                let t0 = Instant::now();
                // A zero timeout makes next() the pure ready path: it returns the
                // batch if one is published and Timeout otherwise, never sleeping.
                match c.next(Some(Duration::ZERO)).expect("next") {
                    Next::Batch(b) => {
                        c.release(b.slot, b.generation).expect("release");
                        samples.push(t0.elapsed().as_nanos() as u64);
                        not_ready += u64::from(!first_ask);
                        first_ask = true;
                        busy_wait(CONSUMER_WORK);
                    }
                    Next::Timeout => first_ask = false,
                    Next::End => break,
                }
            }
            Mode::Wake => match c.next(None).expect("next") {
                Next::Batch(b) => {
                    let returned = now_ns();
                    // SAFETY: the batch is held and holds the 8-byte stamp at offset 0.
                    let stamp = unsafe { b.sample_bytes(0) };
                    let published = u64::from_le_bytes(stamp[..8].try_into().expect("8 bytes"));
                    samples.push(returned.saturating_sub(published));
                    c.release(b.slot, b.generation).expect("release");
                }
                Next::End => break,
                Next::Timeout => unreachable!("next(None) does not time out"),
            },
        }
    }
    (samples, not_ready)
}

/// When the producer publishes each batch.
#[derive(Clone, Copy)]
enum Pace {
    /// As fast as slots free up, spinning while the ring is full.
    Flat,
    /// As fast as slots free up, sleeping on the release futex while the ring
    /// is full: the real loader's way, so each release may have to wake it.
    FlatSleeping,
    /// After a random pause of 0.5 to 2 ms.
    Random,
    /// `d` µs after the consumer released the previous batch (the moment it
    /// began waiting for the next one); K must be 1.
    After(Duration),
}

fn busy_wait(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// The producer's side: publishes `n` batches stamped with CLOCK_MONOTONIC.
fn produce(p: &mut Producer, n: u64, pace: Pace, cpu: Option<usize>) {
    pin(cpu);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..n {
        if let Pace::Random = pace {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_micros(500 + rng % 1500));
        }
        let mut claim = loop {
            if let Some(c) = p.try_claim(0).expect("claim") {
                break c;
            }
            if let Pace::FlatSleeping = pace {
                p.wait_for_release(&[0], Duration::from_millis(100), |p| !p.can_claim(0));
            } else {
                std::hint::spin_loop();
            }
        };
        if let Pace::After(d) = pace {
            busy_wait(d);
        }
        let seq = claim.seq();
        let payload = claim.payload_mut();
        payload[..8].copy_from_slice(&now_ns().to_le_bytes());
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
    p.finish();
}

/// Runs one scenario with the consumer on a thread or in a child process.
/// The producer runs on a thread of its own, so that pinning it ends with it.
fn run(
    mode: Mode,
    pace: Pace,
    slots: u32,
    n: u64,
    in_child: bool,
    place: Placement,
) -> (Vec<u64>, u64) {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "bench-handoff-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let g = RingGeometry {
        world_size: 1,
        slots_per_rank: slots,
        max_samples_per_slot: 1,
        slot_payload_bytes: 4096,
    };
    let mut p = Producer::create(&name, g).expect("create the ring");
    let result = if in_child {
        let exe = std::env::current_exe().expect("current_exe");
        let cpu = place
            .consumer_cpu()
            .map_or("-".to_string(), |c| c.to_string());
        let mut child = Command::new(exe)
            .env(CHILD_ENV, format!("{}:{cpu}:{name}", mode.name()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the consumer process");
        wait_attached(&p);
        std::thread::scope(|s| {
            s.spawn(|| produce(&mut p, n, pace, place.producer_cpu()))
                .join()
                .expect("producer thread")
        });
        let mut lines = BufReader::new(child.stdout.take().expect("piped"))
            .lines()
            .map_while(Result::ok);
        let not_ready = lines
            .next()
            .and_then(|l| l.parse().ok())
            .expect("the child's first line");
        let samples = lines.filter_map(|l| l.parse().ok()).collect();
        assert!(
            child.wait().expect("reap").success(),
            "the consumer process failed"
        );
        (samples, not_ready)
    } else {
        std::thread::scope(|s| {
            let consumer = s.spawn(|| consume(&name, mode, place.consumer_cpu()));
            wait_attached(&p);
            s.spawn(|| produce(&mut p, n, pace, place.producer_cpu()))
                .join()
                .expect("producer thread");
            consumer.join().expect("consumer thread")
        })
    };
    drop(p);
    result
}

fn wait_attached(p: &Producer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.consumer_attached(0) {
        assert!(Instant::now() < deadline, "the consumer did not attach");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Child mode: consume, then print the not-ready count and one sample per line.
fn child_main(spec: &str) {
    let mut parts = spec.splitn(3, ':');
    let (mode, cpu, name) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("-"),
        parts.next().expect("MODE:CPU:NAME"),
    );
    let (samples, not_ready) = consume(name, Mode::parse(mode), cpu.parse().ok());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(out, "{not_ready}").expect("stdout");
    for s in samples {
        writeln!(out, "{s}").expect("stdout");
    }
}

struct Stats {
    n: usize,
    median: u64,
    p99: u64,
    p999: u64,
    max: u64,
    mean: f64,
}

fn stats(mut v: Vec<u64>) -> Stats {
    let v = {
        let skip = WARMUP.min(v.len().saturating_sub(1));
        v.drain(..skip);
        v.sort_unstable();
        v
    };
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Stats {
        n: v.len(),
        median: at(0.5),
        p99: at(0.99),
        p999: at(0.999),
        max: v[v.len() - 1],
        mean: v.iter().sum::<u64>() as f64 / v.len() as f64,
    }
}

fn us(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 10_000 {
        format!("{:.2} µs", ns as f64 / 1e3)
    } else {
        format!("{:.1} µs", ns as f64 / 1e3)
    }
}

fn where_(in_child: bool) -> &'static str {
    if in_child {
        "process"
    } else {
        "thread"
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    format!(
        "{cpus} CPUs ({model}), Linux {} {}",
        kernel.trim(),
        std::env::consts::ARCH
    )
}

fn timer_overhead_ns() -> u64 {
    let mut v: Vec<u64> = (0..10_000)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child_main(&spec);
        return;
    }
    let placements: Vec<Placement> = match two_cpus() {
        Some((p, c)) => vec![Placement::Pinned(p, c), Placement::Free],
        None => vec![Placement::Free],
    };
    println!("ringfeed handoff benchmark");
    println!("machine: {}", machine());
    println!(
        "timer: Instant::now() pair costs {} ns (included in (i)); spin window SPIN_BEFORE_SLEEP = {} µs",
        timer_overhead_ns(),
        SPIN_BEFORE_SLEEP.as_micros()
    );
    println!("consumer: 'thread' = a thread of this process, 'process' = a child process attached by name");
    match placements[0] {
        Placement::Pinned(p, c) => println!("placement: 'pinned' = producer on CPU {p}, consumer on CPU {c}; 'free' = left to the scheduler"),
        Placement::Free => println!("placement: only one CPU available, nothing pinned"),
    }
    println!();
    println!(
        "(i) ready path: next()+release() of an already published batch, K = 4, producer thread refilling, consumer working {} µs between batches ({READY_PAIRS} batches)",
        CONSUMER_WORK.as_micros()
    );
    println!(
        "  {:<7} {:<8} {:<9} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "place", "consumer", "producer", "ahead%", "median", "p99", "p99.9", "mean"
    );
    for &place in &placements {
        for (pace, producer) in [(Pace::Flat, "spins"), (Pace::FlatSleeping, "sleeps")] {
            for in_child in [false, true] {
                let (samples, not_ready) = run(Mode::Ready, pace, 4, READY_PAIRS, in_child, place);
                let ready_pct = 100.0 * (1.0 - not_ready as f64 / samples.len().max(1) as f64);
                let s = stats(samples);
                let mean = us(s.mean.round() as u64);
                println!(
                    "  {:<7} {:<8} {:<9} {:>7.1}% {:>10} {:>10} {:>10} {:>10}",
                    place.name(),
                    where_(in_child),
                    producer,
                    ready_pct,
                    us(s.median),
                    us(s.p99),
                    us(s.p999),
                    mean
                );
            }
        }
    }
    println!("  (producer 'spins' = polls for a free slot; 'sleeps' = sleeps on the release futex when the ring is full, as a loader does,");
    println!("   so a release may pay a FUTEX_WAKE)");
    println!("  (ahead% = batches already published when first asked for; only next() calls that returned a batch are timed)");
    println!();
    println!("(ii) wake-up of a sleeping consumer: publish at random 0.5–2 ms intervals, publish → next() returns ({WAKE_SAMPLES} batches)");
    println!(
        "  {:<7} {:<8} {:>6} {:>10} {:>10} {:>10} {:>10}",
        "place", "consumer", "n", "median", "p99", "p99.9", "max"
    );
    for &place in &placements {
        for in_child in [false, true] {
            let s = stats(run(Mode::Wake, Pace::Random, 4, WAKE_SAMPLES, in_child, place).0);
            println!(
                "  {:<7} {:<8} {:>6} {:>10} {:>10} {:>10} {:>10}",
                place.name(),
                where_(in_child),
                s.n,
                us(s.median),
                us(s.p99),
                us(s.p999),
                us(s.max)
            );
        }
    }
    println!();
    println!("(iii) spin window: publish d µs after the consumer began waiting, publish → next() returns ({SPIN_SAMPLES} batches each, K = 1)");
    print!("  {:>6}", "d");
    for &place in &placements {
        for in_child in [false, true] {
            print!(
                "   {:>18}",
                format!("{} {}", place.name(), where_(in_child))
            );
        }
    }
    println!();
    print!("  {:>6}", "");
    for _ in 0..placements.len() * 2 {
        print!("   {:>8} {:>9}", "median", "p99");
    }
    println!();
    for d in SPIN_DELAYS_US {
        print!("  {:>3} µs", d);
        for &place in &placements {
            for in_child in [false, true] {
                let s = stats(
                    run(
                        Mode::Wake,
                        Pace::After(Duration::from_micros(d)),
                        1,
                        SPIN_SAMPLES,
                        in_child,
                        place,
                    )
                    .0,
                );
                print!("   {:>8} {:>9}", us(s.median), us(s.p99));
            }
        }
        println!();
    }
}
