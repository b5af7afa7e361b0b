//! A deterministic simulation of many loaders against one throttled prefix,
//! driving the fetch engine's own admission controller
//! (`ringfeed::remote::admission::Controller`) with a virtual clock.
//! Figures, not a test (docs/remote.md, "Many loaders, one store"):
//!
//!     cargo run --release -p ringfeed --example admission_sim              # the scenarios of docs/remote.md
//!     cargo run --release -p ringfeed --example admission_sim -- --loaders 3 --rate 1200 --objects 2400 --rtt-ms 10 --get-ms 12
//!
//! The store: a token bucket of `--rate` GETs/s holding `--burst-ms` of it,
//! shared by every loader (S3 throttles a prefix this way: 5,500 GETs/s);
//! a GET that finds no token is answered 503 SlowDown after one round trip
//! (`--rtt-ms`), one that finds one after `--get-ms` (its first byte and
//! body), each with up to `--jitter-pct` of random extra. A loader: the
//! controller, a retry queue (the engine's backoff: 100 ms doubling, equal
//! jitter), `--objects` reads in batches of `--batch` with `--ahead` batches
//! in flight at most (the ring's slots), consumed at once. With
//! `--restart-at-s T`, loader 0 dies at T (its GETs in flight are lost) and
//! starts again `--restart-down-ms` later with a fresh controller, reading
//! its batches from where its trainer stopped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use ringfeed::remote::admission::{Admit, Controller, Outcome, WindowLimits};

/// The engine's retries before a read fails (`FetchConfig::retries_max`).
const RETRIES_MAX: u32 = 10;
const BACKOFF_BASE_MS: u64 = 100;
const BACKOFF_MAX_MS: u64 = 10_000;

#[derive(Clone, Debug)]
struct Args {
    loaders: usize,
    rate: f64,
    burst_ms: u64,
    rtt_ms: u64,
    get_ms: u64,
    jitter_pct: u64,
    objects: u64,
    batch: u64,
    ahead: u64,
    window_initial: usize,
    restart_at_s: Option<f64>,
    restart_down_ms: u64,
    seed: u64,
    settle_from_s: f64,
}

impl Default for Args {
    fn default() -> Args {
        Args {
            loaders: 64,
            rate: 5500.0,
            burst_ms: 100,
            rtt_ms: 10,
            get_ms: 30,
            jitter_pct: 50,
            objects: 10_000,
            batch: 64,
            ahead: 4,
            window_initial: 256,
            restart_at_s: None,
            restart_down_ms: 5_000,
            seed: 1,
            settle_from_s: 10.0,
        }
    }
}

fn parse_args() -> Result<(Args, bool), String> {
    let mut a = Args::default();
    let mut custom = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag.as_str() {
            "--loaders" => a.loaders = num(value()?)? as usize,
            "--rate" => a.rate = num(value()?)?,
            "--burst-ms" => a.burst_ms = num(value()?)? as u64,
            "--rtt-ms" => a.rtt_ms = num(value()?)? as u64,
            "--get-ms" => a.get_ms = num(value()?)? as u64,
            "--jitter-pct" => a.jitter_pct = num(value()?)? as u64,
            "--objects" => a.objects = num(value()?)? as u64,
            "--batch" => a.batch = num(value()?)? as u64,
            "--ahead" => a.ahead = num(value()?)? as u64,
            "--window" => a.window_initial = num(value()?)? as usize,
            "--restart-at-s" => a.restart_at_s = Some(num(value()?)?),
            "--restart-down-ms" => a.restart_down_ms = num(value()?)? as u64,
            "--seed" => a.seed = num(value()?)? as u64,
            "--settle-from-s" => a.settle_from_s = num(value()?)?,
            "-h" | "--help" => {
                return Err("see the comment at the top of bench/admission_sim.rs".into())
            }
            other => return Err(format!("unknown flag {other}")),
        }
        custom = true;
    }
    if a.loaders == 0 || a.rate <= 0.0 || a.batch == 0 || a.ahead == 0 || a.objects < a.batch {
        return Err(
            "--loaders, --rate, --batch, --ahead must be positive, --objects at least --batch"
                .into(),
        );
    }
    Ok((a, custom))
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Loader asks its controller again (a token is due, or it restarts).
    Wake { loader: usize, life: u32 },
    /// A GET's answer reaches its loader.
    Answer {
        loader: usize,
        life: u32,
        object: u64,
        sent_us: u64,
        ok: bool,
        tries: u32,
    },
    /// Loader 0 dies.
    Kill,
    /// The rate limits are noted (mid-run).
    Sample,
}

struct Loader {
    ctl: Controller,
    life: u32,
    alive: bool,
    /// Objects not yet asked, in order.
    next_object: u64,
    /// Objects (with their tries so far) waiting to be asked again, by due time.
    retries: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// Done flags of the objects of the batches in flight.
    done: Vec<bool>,
    /// Batches published (consumed at once).
    published: u64,
    wake_at: Option<u64>,
    first_batch_us: Option<u64>,
    /// When it came back after a restart, and its first batch after that.
    restarted_us: Option<u64>,
    first_batch_after_restart_us: Option<u64>,
    finished_us: Option<u64>,
    requests: u64,
    throttled: u64,
    failed: u64,
    answered: u64,
    /// Sum of in-flight GETs × µs, over the settled span.
    in_flight_area: f64,
    last_area_us: u64,
}

struct Sim {
    a: Args,
    t0: Instant,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    rng: Rng,
    tokens: f64,
    tokens_at_us: u64,
    loaders: Vec<Loader>,
    /// Store answers (GETs that took a token) per 100 ms, for the figures.
    admitted: Vec<u64>,
    /// The loaders' rate limits at the middle of the run.
    sampled_rates: Vec<f64>,
}

impl Sim {
    fn new(a: Args) -> Sim {
        let t0 = Instant::now();
        let limits = WindowLimits {
            initial: a.window_initial,
            min: 8,
            max: 1024,
        };
        let loaders = (0..a.loaders)
            .map(|i| Loader {
                ctl: Controller::new(limits, t0, a.seed.wrapping_mul(1000).wrapping_add(i as u64)),
                life: 0,
                alive: true,
                next_object: 0,
                retries: BinaryHeap::new(),
                done: vec![false; a.objects as usize],
                published: 0,
                wake_at: None,
                first_batch_us: None,
                restarted_us: None,
                first_batch_after_restart_us: None,
                finished_us: None,
                requests: 0,
                throttled: 0,
                failed: 0,
                answered: 0,
                in_flight_area: 0.0,
                last_area_us: 0,
            })
            .collect();
        let tokens = a.rate * a.burst_ms as f64 / 1000.0;
        Sim {
            rng: Rng(a.seed),
            a,
            t0,
            events: BinaryHeap::new(),
            seq: 0,
            tokens,
            tokens_at_us: 0,
            loaders,
            admitted: Vec::new(),
            sampled_rates: Vec::new(),
        }
    }

    fn at(&self, us: u64) -> Instant {
        self.t0 + Duration::from_micros(us)
    }

    fn push(&mut self, us: u64, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((us, self.seq, e)));
    }

    fn jittered_us(&mut self, ms: u64) -> u64 {
        let extra = self.rng.unit() * self.a.jitter_pct as f64 / 100.0;
        (ms as f64 * 1000.0 * (1.0 + extra)) as u64
    }

    /// The store's bucket at `us`: takes a token if there is one.
    fn take_token(&mut self, us: u64) -> bool {
        let burst = (self.a.rate * self.a.burst_ms as f64 / 1000.0).max(1.0);
        let dt = (us.saturating_sub(self.tokens_at_us)) as f64 / 1e6;
        self.tokens = (self.tokens + dt * self.a.rate).min(burst);
        self.tokens_at_us = self.tokens_at_us.max(us);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            let slot = (us / 100_000) as usize;
            if self.admitted.len() <= slot {
                self.admitted.resize(slot + 1, 0);
            }
            self.admitted[slot] += 1;
            true
        } else {
            false
        }
    }

    fn account(&mut self, i: usize, us: u64) {
        let settle_us = (self.a.settle_from_s * 1e6) as u64;
        let l = &mut self.loaders[i];
        let from = l.last_area_us.max(settle_us);
        if us > from && l.alive && l.finished_us.is_none() {
            l.in_flight_area += l.ctl.limits().in_flight as f64 * (us - from) as f64;
        }
        l.last_area_us = us;
    }

    /// The next object loader `i` may ask for: a due retry first, then the
    /// next one within the batches its ring has room for.
    fn next_work(&mut self, i: usize, us: u64) -> Option<(u64, u32)> {
        let limit = ((self.loaders[i].published + self.a.ahead) * self.a.batch).min(self.a.objects);
        let l = &mut self.loaders[i];
        if let Some(&Reverse((due, object, tries))) = l.retries.peek() {
            if due <= us {
                l.retries.pop();
                return Some((object, tries));
            }
        }
        if l.next_object < limit {
            l.next_object += 1;
            return Some((l.next_object - 1, 0));
        }
        None
    }

    fn pump(&mut self, i: usize, us: u64) {
        if !self.loaders[i].alive {
            return;
        }
        loop {
            let now = self.at(us);
            let has_work = {
                let l = &self.loaders[i];
                let limit = ((l.published + self.a.ahead) * self.a.batch).min(self.a.objects);
                l.retries.peek().is_some_and(|r| r.0 .0 <= us) || l.next_object < limit
            };
            if !has_work {
                break;
            }
            match self.loaders[i].ctl.try_admit(now) {
                Admit::Go => {
                    let Some((object, tries)) = self.next_work(i, us) else {
                        self.loaders[i].ctl.done(now, now, Outcome::Cancelled);
                        break;
                    };
                    self.account(i, us);
                    self.loaders[i].requests += 1;
                    let half = self.a.rtt_ms * 500;
                    let ok = self.take_token(us + half);
                    let back = if ok {
                        self.jittered_us(self.a.get_ms)
                    } else {
                        self.jittered_us(self.a.rtt_ms)
                    };
                    let life = self.loaders[i].life;
                    self.push(
                        us + back,
                        Event::Answer {
                            loader: i,
                            life,
                            object,
                            sent_us: us,
                            ok,
                            tries,
                        },
                    );
                }
                Admit::Full => break,
                Admit::Until(t) => {
                    let due = (t - self.t0).as_micros() as u64;
                    self.wake(i, due.max(us + 1));
                    break;
                }
            }
        }
        // A retry due later wakes the loader then.
        if let Some(&Reverse((due, _, _))) = self.loaders[i].retries.peek() {
            if due > us {
                self.wake(i, due);
            }
        }
    }

    fn wake(&mut self, i: usize, us: u64) {
        let l = &mut self.loaders[i];
        if l.wake_at.is_some_and(|w| w <= us && w > 0) {
            return;
        }
        l.wake_at = Some(us);
        let life = l.life;
        self.push(us, Event::Wake { loader: i, life });
    }

    fn backoff_us(&mut self, tries: u32) -> u64 {
        let ceiling = (BACKOFF_BASE_MS << tries.saturating_sub(1).min(20)).min(BACKOFF_MAX_MS);
        let half = ceiling / 2;
        (half as f64 + self.rng.unit() * (ceiling - half) as f64) as u64 * 1000
    }

    fn answer(&mut self, i: usize, us: u64, object: u64, sent_us: u64, ok: bool, tries: u32) {
        let now = self.at(us);
        self.account(i, us);
        let outcome = if ok {
            Outcome::Answered
        } else {
            Outcome::Throttled { retry_after: None }
        };
        let sent = self.at(sent_us);
        self.loaders[i].ctl.done(now, sent, outcome);
        if ok {
            self.loaders[i].answered += 1;
            self.loaders[i].done[object as usize] = true;
            self.publish(i, us);
        } else {
            self.loaders[i].throttled += 1;
            if tries + 1 > RETRIES_MAX {
                self.loaders[i].failed += 1;
                self.loaders[i].done[object as usize] = true;
                self.publish(i, us);
            } else {
                let due = us + self.backoff_us(tries + 1);
                self.loaders[i]
                    .retries
                    .push(Reverse((due, object, tries + 1)));
            }
        }
    }

    fn publish(&mut self, i: usize, us: u64) {
        let (batch, objects) = (self.a.batch, self.a.objects);
        let l = &mut self.loaders[i];
        loop {
            let start = l.published * batch;
            if start >= objects {
                break;
            }
            let end = (start + batch).min(objects);
            if !(start..end).all(|o| l.done[o as usize]) {
                break;
            }
            l.published += 1;
            if l.first_batch_us.is_none() {
                l.first_batch_us = Some(us);
            }
            if l.restarted_us.is_some() && l.first_batch_after_restart_us.is_none() {
                l.first_batch_after_restart_us = Some(us);
            }
        }
        if l.published * batch >= objects && l.finished_us.is_none() {
            l.finished_us = Some(us);
        }
    }

    fn kill(&mut self, us: u64) {
        let restart = us + self.a.restart_down_ms * 1000;
        let restart_at = self.at(restart);
        let l = &mut self.loaders[0];
        l.alive = false;
        l.life += 1;
        // What the trainer had: every published batch. The rest is asked again.
        l.next_object = l.published * self.a.batch;
        for o in l.next_object..self.a.objects {
            l.done[o as usize] = false;
        }
        l.retries.clear();
        l.wake_at = None;
        let limits = WindowLimits {
            initial: self.a.window_initial,
            min: 8,
            max: 1024,
        };
        l.ctl = Controller::new(limits, restart_at, self.a.seed ^ 0xdead);
        l.restarted_us = Some(restart);
        let life = l.life;
        self.push(restart, Event::Wake { loader: 0, life });
    }

    fn run(&mut self) -> u64 {
        for i in 0..self.loaders.len() {
            self.pump(i, 0);
        }
        if let Some(t) = self.a.restart_at_s {
            self.push((t * 1e6) as u64, Event::Kill);
        }
        let middle_s = self.a.loaders as f64 * self.a.objects as f64 / self.a.rate / 2.0;
        self.push((middle_s * 1e6) as u64, Event::Sample);
        let mut last = 0;
        while let Some(Reverse((us, _, event))) = self.events.pop() {
            last = us;
            match event {
                Event::Wake { loader, life } => {
                    let l = &mut self.loaders[loader];
                    if life != l.life {
                        continue;
                    }
                    if !l.alive {
                        l.alive = true;
                    }
                    if l.wake_at == Some(us) {
                        l.wake_at = None;
                    }
                    self.pump(loader, us);
                }
                Event::Answer {
                    loader,
                    life,
                    object,
                    sent_us,
                    ok,
                    tries,
                } => {
                    if life != self.loaders[loader].life {
                        continue; // its loader died: nobody reads the answer
                    }
                    self.answer(loader, us, object, sent_us, ok, tries);
                    self.pump(loader, us);
                }
                Event::Kill => self.kill(us),
                Event::Sample => {
                    self.sampled_rates = self
                        .loaders
                        .iter()
                        .filter(|l| l.alive && l.finished_us.is_none())
                        .filter_map(|l| l.ctl.limits().rate_per_s)
                        .collect();
                }
            }
            if self.loaders.iter().all(|l| l.finished_us.is_some()) {
                break;
            }
        }
        last
    }
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn report(title: &str, a: &Args, sim: &Sim, end_us: u64) {
    let secs = end_us as f64 / 1e6;
    let objects = a.loaders as u64 * a.objects;
    let requests: u64 = sim.loaders.iter().map(|l| l.requests).sum();
    let throttled: u64 = sim.loaders.iter().map(|l| l.throttled).sum();
    let failed: u64 = sim.loaders.iter().map(|l| l.failed).sum();
    let answered: u64 = sim.loaders.iter().map(|l| l.answered).sum();
    println!("## {title}\n");
    println!(
        "{} loaders, store {:.0} GETs/s (burst {} ms), round trip {} ms, GET {} ms (+0..{}%), {} objects each, batch {}, {} batches ahead, window {}",
        a.loaders, a.rate, a.burst_ms, a.rtt_ms, a.get_ms, a.jitter_pct, a.objects, a.batch, a.ahead, a.window_initial
    );
    println!(
        "- run: {secs:.2} s; goodput {:.0} GETs/s = {:.1}% of the rate; {:.3} requests per object ({throttled} answered 503); {failed} reads failed after {RETRIES_MAX} retries",
        answered as f64 / secs,
        answered as f64 / secs / a.rate * 100.0,
        requests as f64 / objects as f64,
    );
    let settle_us = (a.settle_from_s * 1e6) as u64;
    let mut in_flight: Vec<f64> = sim
        .loaders
        .iter()
        .filter_map(|l| {
            let until = l.finished_us.unwrap_or(end_us);
            (until > settle_us).then(|| l.in_flight_area / (until - settle_us) as f64)
        })
        .collect();
    if !in_flight.is_empty() {
        println!(
            "- GETs in flight per loader from {:.0} s on (time average): min {:.2}, median {:.2}, max {:.2} (share: {:.2} at {} ms)",
            a.settle_from_s,
            quantile(&mut in_flight, 0.0),
            quantile(&mut in_flight, 0.5),
            quantile(&mut in_flight, 1.0),
            a.rate / a.loaders as f64 * a.get_ms as f64 * (1.0 + a.jitter_pct as f64 / 200.0) / 1000.0,
            a.get_ms
        );
    }
    let mut rates = sim.sampled_rates.clone();
    if !rates.is_empty() {
        println!(
            "- rate limits mid-run: min {:.0}, median {:.0}, max {:.0} GETs/s (fair share {:.0})",
            quantile(&mut rates, 0.0),
            quantile(&mut rates, 0.5),
            quantile(&mut rates, 1.0),
            a.rate / a.loaders as f64
        );
    }
    let mut ttfb: Vec<f64> = sim
        .loaders
        .iter()
        .filter_map(|l| l.first_batch_us)
        .map(|u| u as f64 / 1e3)
        .collect();
    println!(
        "- time to first batch: min {:.0} ms, median {:.0} ms, max {:.0} ms",
        quantile(&mut ttfb, 0.0),
        quantile(&mut ttfb, 0.5),
        quantile(&mut ttfb, 1.0)
    );
    let mut done: Vec<f64> = sim
        .loaders
        .iter()
        .filter_map(|l| l.finished_us)
        .map(|u| u as f64 / 1e6)
        .collect();
    println!(
        "- epoch done: first loader {:.1} s, median {:.1} s, last {:.1} s",
        quantile(&mut done, 0.0),
        quantile(&mut done, 0.5),
        quantile(&mut done, 1.0)
    );
    if let Some(t) = a.restart_at_s {
        let l0 = &sim.loaders[0];
        let slot = |s: f64| (s * 10.0) as usize;
        let used = |from: f64, to: f64| {
            let v =
                &sim.admitted[slot(from).min(sim.admitted.len())..slot(to).min(sim.admitted.len())];
            v.iter().sum::<u64>() as f64 / (to - from) / a.rate * 100.0
        };
        let back = t + a.restart_down_ms as f64 / 1000.0;
        println!(
            "- loader 0 died at {t:.1} s and came back at {back:.1} s: store used {:.1}% in the second before, {:.1}% while it was down, {:.1}% in the 2 s after it came back; it made {} requests ({} answered 503), its first batch after the restart came {:.0} ms after it, it finished at {:.1} s",
            used(t - 1.0, t),
            used(t, back),
            used(back, back + 2.0),
            l0.requests,
            l0.throttled,
            l0.first_batch_after_restart_us.map_or(f64::NAN, |u| (u - l0.restarted_us.unwrap_or(u)) as f64 / 1e3),
            l0.finished_us.unwrap_or(0) as f64 / 1e6,
        );
    }
    println!();
}

fn scenario(title: &str, a: Args) {
    let mut sim = Sim::new(a.clone());
    let end = sim.run();
    report(title, &a, &sim, end);
}

fn main() {
    let (args, custom) = match parse_args() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("admission_sim: {e}");
            std::process::exit(2);
        }
    };
    if custom {
        scenario("as asked", args);
        return;
    }
    scenario(
        "the bench's check: 3 loaders, 1,200 GETs/s, 10 ms",
        Args {
            loaders: 3,
            rate: 1200.0,
            objects: 2400,
            rtt_ms: 10,
            get_ms: 12,
            jitter_pct: 30,
            settle_from_s: 1.0,
            ..Args::default()
        },
    );
    scenario(
        "the same at 600 GETs/s",
        Args {
            loaders: 3,
            rate: 600.0,
            objects: 2400,
            rtt_ms: 10,
            get_ms: 12,
            jitter_pct: 30,
            settle_from_s: 1.0,
            ..Args::default()
        },
    );
    scenario("64 loaders, one S3 prefix (5,500 GETs/s)", Args::default());
    scenario(
        "64 loaders, one restarts mid-epoch (down 5 s)",
        Args {
            restart_at_s: Some(40.0),
            ..Args::default()
        },
    );
}
