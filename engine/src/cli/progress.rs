//! The run's progress where the loader was started: on a terminal one live
//! line (epoch, step/steps, trainers, samples/s, ETA) that other lines print
//! above; when stderr is not a terminal, the same as a plain line every
//! [`LINE_EVERY`]. Read from the ring's figures (`ring::observer`, the
//! progress words the loader writes every ~100 ms), on a thread of its own:
//! `serve` shows its own ring's, `ringfeed run` its loader's (and then tells
//! the loader, through [`PROGRESS_ENV`], not to show it too).

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::ring::observer::{Observer, Snapshot};

/// `RINGFEED_PROGRESS=off`: `serve` shows no progress (`ringfeed run` sets
/// it for its loader when it shows the line itself).
pub const PROGRESS_ENV: &str = "RINGFEED_PROGRESS";
/// How often the figures are read and the live line redrawn.
const TICK: Duration = Duration::from_millis(250);
/// Without a terminal, one line this often.
pub const LINE_EVERY: Duration = Duration::from_secs(10);
/// The rate is taken over about this long.
const RATE_WINDOW: Duration = Duration::from_secs(20);

/// Where the progress goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    /// A live line on a terminal, else plain lines.
    LineOrLines,
    /// A live line on a terminal, else nothing (`ringfeed run`: its loader
    /// prints the lines, which `run` passes on).
    TerminalOnly,
}

/// The progress display of one loader; stops (and clears its line) when
/// dropped.
pub struct Display {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Display {
    /// Shows loader `name`'s progress as `show` says, unless
    /// `RINGFEED_PROGRESS=off` (or no thread can be started).
    pub fn start(name: &str, show: Show) -> Option<Display> {
        if std::env::var(PROGRESS_ENV).is_ok_and(|v| v == "off") {
            return None;
        }
        let terminal = std::io::stderr().is_terminal();
        if !terminal && show == Show::TerminalOnly {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (name, flag) = (name.to_owned(), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("ringfeed-progress".into())
            .spawn(move || show_until(&name, terminal, &flag))
            .map_err(|e| tracing::debug!("no progress line: cannot start its thread: {e}"))
            .ok()?;
        Some(Display {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Draws until `stop`: the live line on a terminal, else a line every
/// [`LINE_EVERY`].
fn show_until(name: &str, terminal: bool, stop: &AtomicBool) {
    let mut rate = Rate::default();
    let mut bar: Option<ProgressBar> = None;
    let mut last_line: Option<Instant> = None;
    let mut observer: Option<Observer> = None;
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        if !std::mem::take(&mut first) {
            std::thread::sleep(TICK);
        }
        if observer.is_none() {
            observer = Observer::open(name).ok();
        }
        let Some(s) = observer.as_ref().map(Observer::snapshot) else {
            continue;
        };
        let line = rate.line(&s);
        if terminal {
            let b = bar.get_or_insert_with(live_bar);
            if let Some(p) = s.progress {
                let expected = expected_steps(&s);
                if expected != u64::MAX {
                    b.set_length(expected);
                }
                b.set_position(p.steps_done);
            }
            b.set_message(line);
        } else if s.progress.is_some()
            && s.ranks.iter().any(|r| r.attached || r.consumed > 0)
            && last_line.is_none_or(|t| t.elapsed() >= LINE_EVERY)
        {
            last_line = Some(Instant::now());
            tracing::info!("{line}");
        }
    }
    if let Some(b) = bar {
        crate::say::set_live_line(None);
        b.finish_and_clear();
    }
}

/// The live line: a bar of the run's steps and the words.
fn live_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("[{bar:20}] {wide_msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    crate::say::set_live_line(Some(bar.clone()));
    bar
}

/// Steps each rank gets in the run (u64::MAX while unknown).
fn expected_steps(s: &Snapshot) -> u64 {
    s.ranks.first().map_or(u64::MAX, |r| r.batches_expected)
}

/// The steps done over the last [`RATE_WINDOW`], for samples/s and the ETA.
#[derive(Default)]
struct Rate {
    seen: VecDeque<(Instant, u64)>,
}

impl Rate {
    /// The progress line for `s`: "epoch 0 (of 3) step 120/390, 2/2
    /// trainers, 5300 samples/s, ETA 3m20s", or what the loader waits for.
    fn line(&mut self, s: &Snapshot) -> String {
        let attached = s.ranks.iter().filter(|r| r.attached).count();
        let w = s.ranks.len();
        let Some(p) = s.progress else {
            return format!("{attached}/{w} trainer(s) attached");
        };
        if p.steps_done == 0 && attached == 0 && !s.ranks.iter().any(|r| r.consumed > 0) {
            return format!("waiting for {w} trainer(s) to attach");
        }
        let now = Instant::now();
        self.seen.push_back((now, p.steps_done));
        while self
            .seen
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.seen.pop_front();
        }
        let mut words = format!("{}, {attached}/{w} trainer(s)", p.words());
        let (t0, d0) = self.seen.front().copied().unwrap_or((now, p.steps_done));
        let secs = now.duration_since(t0).as_secs_f64();
        if secs >= 1.0 {
            let steps_per_s = p.steps_done.saturating_sub(d0) as f64 / secs;
            let samples = steps_per_s * (p.shape.batch_size * w as u64) as f64;
            words.push_str(&format!(", {samples:.0} samples/s"));
            let expected = expected_steps(s);
            if steps_per_s > 0.0 && expected != u64::MAX {
                let left = expected.saturating_sub(p.steps_done) as f64 / steps_per_s;
                words.push_str(&format!(", ETA {}", eta_words(left)));
            }
        }
        words
    }
}

/// "45s", "3m20s", "2h05m".
fn eta_words(secs: f64) -> String {
    let s = secs.round().clamp(0.0, 1e9) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::layout::{Progress, RunShape};
    use crate::ring::observer::RankSnapshot;

    fn at(steps_done: u64, attached: bool) -> Snapshot {
        let rank = RankSnapshot {
            attached,
            consumed: steps_done,
            batches_expected: 30,
            ..RankSnapshot::default()
        };
        Snapshot {
            ranks: vec![rank; 2],
            progress: Some(Progress {
                shape: RunShape {
                    epochs: 3,
                    epoch_steps: 10,
                    batch_size: 4,
                },
                epoch: steps_done / 10,
                step: steps_done % 10,
                epoch_steps: 10,
                steps_done,
            }),
            ..Snapshot::default()
        }
    }

    #[test]
    fn the_line_says_what_the_loader_waits_for_then_where_the_run_is() {
        let mut rate = Rate::default();
        assert_eq!(
            rate.line(&at(0, false)),
            "waiting for 2 trainer(s) to attach"
        );
        assert_eq!(
            rate.line(&at(12, true)),
            "epoch 1 (of 3) step 2/10, 2/2 trainer(s)"
        );
        // 10 steps in 2 s, 8 samples a step: 40 samples/s; 8 steps left.
        let t0 = Instant::now() - Duration::from_secs(2);
        rate.seen = VecDeque::from([(t0, 12)]);
        assert_eq!(
            rate.line(&at(22, true)),
            "epoch 2 (of 3) step 2/10, 2/2 trainer(s), 40 samples/s, ETA 2s"
        );
    }

    #[test]
    fn an_eta_is_said_in_seconds_minutes_or_hours() {
        assert_eq!(eta_words(45.2), "45s");
        assert_eq!(eta_words(200.0), "3m20s");
        assert_eq!(eta_words(7_500.0), "2h05m");
    }
}
