//! `--idle-timeout`: a loader that no trainer has been attached to for that
//! long (none came since it started, or none since the last one left) stops,
//! saying so, instead of waiting for ever with its ring in /dev/shm.

use std::time::{Duration, Instant};

use super::{Loader, RunError};

/// How often the ranks' attachments are looked at (one lock test per rank).
const IDLE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// When the loader last had a trainer attached.
pub(super) struct IdleWatch {
    /// The limit; None: no limit.
    pub(super) limit: Option<Duration>,
    /// The last time a trainer was seen attached (or the ring was made).
    since: Instant,
    /// The attaches counted at the last look: a trainer that came and left
    /// between two looks still counts.
    attaches: u64,
    /// Some trainer has attached in this run.
    ever: bool,
    /// A trainer was attached at the last look: the idle time starts at
    /// the first look that finds none (never before the last one left).
    was_attached: bool,
    /// The last look.
    looked: Instant,
}

impl IdleWatch {
    pub(super) fn new(limit: Option<Duration>) -> IdleWatch {
        IdleWatch {
            limit,
            since: Instant::now(),
            attaches: 0,
            ever: false,
            was_attached: false,
            looked: Instant::now(),
        }
    }
}

impl Loader {
    /// Sets the run's `--idle-timeout` (None: none), counted from now.
    pub fn set_idle_timeout(&mut self, limit: Option<Duration>) {
        self.idle = IdleWatch::new(limit);
    }

    /// Fails with [`RunError::Idle`] once no trainer has been attached for
    /// the limit. Looks at most every [`IDLE_CHECK_EVERY`].
    pub(super) fn check_idle(&mut self) -> Result<(), RunError> {
        let Some(limit) = self.idle.limit else {
            return Ok(());
        };
        if self.idle.looked.elapsed() < IDLE_CHECK_EVERY {
            return Ok(());
        }
        self.idle.looked = Instant::now();
        let world = self.plan.cfg.world_size;
        let attaches = (0..world).map(|r| self.producer.attach_count(r)).sum();
        let attached = (0..world).any(|r| self.producer.consumer_attached(r));
        let came_or_left = attached || self.idle.was_attached || attaches != self.idle.attaches;
        self.idle.was_attached = attached;
        if came_or_left {
            self.idle.since = Instant::now();
            self.idle.attaches = attaches;
            self.idle.ever = true;
            return Ok(());
        }
        if self.idle.since.elapsed() < limit {
            return Ok(());
        }
        Err(RunError::Idle {
            limit,
            since_start: !self.idle.ever,
        })
    }
}

/// What an idle loader saw: no trainer came, or none came back.
pub(super) fn idle_words(since_start: bool, limit: Duration) -> String {
    let d = duration_words(limit);
    if since_start {
        format!("no trainer attached in the {d} since the loader started")
    } else {
        format!("no trainer has been attached for {d}, since the last one left")
    }
}

/// A duration as `--idle-timeout` takes it: 90s, 10m, 2h, 1d.
pub(super) fn duration_words(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_said_as_the_flag_takes_it() {
        assert_eq!(duration_words(Duration::from_secs(600)), "10m");
        assert_eq!(duration_words(Duration::from_secs(90)), "90s");
        assert_eq!(duration_words(Duration::from_secs(7_200)), "2h");
        assert_eq!(duration_words(Duration::from_secs(86_400)), "1d");
    }
}
