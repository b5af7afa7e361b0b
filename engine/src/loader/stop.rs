//! What stops a run: a signal to the process, the caller, or a background
//! check that found the source changed. One token per run, handed to
//! [`Loader::run`](super::Loader::run); nothing is compared by address.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::{signals, RunError, STOP_NOT_A_SIGNAL};

/// A run's stop: cheap to clone, shared by the loader and whatever may stop it.
#[derive(Clone, Debug, Default)]
pub struct StopToken(Arc<StopState>);

#[derive(Debug, Default)]
struct StopState {
    /// A signal number, [`STOP_NOT_A_SIGNAL`], or 0.
    code: AtomicU32,
    /// Why [`StopToken::stop_with`] stopped the run.
    reason: Mutex<Option<String>>,
    /// Whether the process's stop signals ([`signals::STOP`]) stop it too.
    on_signals: bool,
}

impl StopToken {
    /// A token only its holders stop.
    pub fn new() -> StopToken {
        StopToken::default()
    }

    /// A token that SIGINT, SIGTERM and SIGHUP stop as well (once
    /// [`signals::install`] turned them into a flag).
    pub fn on_signals() -> StopToken {
        StopToken(Arc::new(StopState {
            on_signals: true,
            ..StopState::default()
        }))
    }

    /// Whether the process's stop signals stop this run.
    pub fn listens_to_signals(&self) -> bool {
        self.0.on_signals
    }

    /// Stops the run as the caller (the trainers see "stopped on an
    /// error"); a stop that came first wins.
    pub fn stop(&self) {
        let _ = self.0.code.compare_exchange(
            0,
            STOP_NOT_A_SIGNAL,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Stops the run as signal `sig` would (a caller forwarding one).
    pub fn stop_by_signal(&self, sig: u32) {
        let _ = self
            .0
            .code
            .compare_exchange(0, sig, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Stops the run with an error of its own (a background check found the
    /// dataset changed): the trainers and the exit are told `reason`. A stop
    /// that came first wins.
    pub fn stop_with(&self, reason: String) {
        if let Ok(mut slot) = self.0.reason.lock() {
            if self.0.code.load(Ordering::Relaxed) == 0 {
                slot.get_or_insert(reason);
            }
            // SYNC POINT: the reason is written under the lock, and read
            // under it by `reason`, after the code is seen set.
            let _ = self.0.code.compare_exchange(
                0,
                STOP_NOT_A_SIGNAL,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// 0, the signal that stopped the run, or [`STOP_NOT_A_SIGNAL`].
    pub fn code(&self) -> u32 {
        match self.0.code.load(Ordering::Relaxed) {
            0 if self.0.on_signals => signals::STOP.load(Ordering::Relaxed),
            code => code,
        }
    }

    /// The reason given to [`stop_with`](Self::stop_with), if that is what
    /// stopped the run: for a check that ends after the last batch.
    pub fn reason(&self) -> Option<String> {
        if self.0.code.load(Ordering::Relaxed) != STOP_NOT_A_SIGNAL {
            return None;
        }
        self.0.reason.lock().ok().and_then(|r| r.clone())
    }

    /// Ok while nothing stopped the run; else the error that says why.
    pub(crate) fn check(&self) -> Result<(), RunError> {
        match self.code() {
            0 => Ok(()),
            STOP_NOT_A_SIGNAL => Err(self
                .reason()
                .map_or(RunError::Stopped, RunError::SourceChanged)),
            sig => Err(RunError::Signal(sig)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_stop_wins_and_says_why() {
        let t = StopToken::new();
        assert!(t.check().is_ok());
        t.stop_with("the prefix changed".into());
        t.stop_by_signal(15);
        t.stop();
        assert!(matches!(t.check(), Err(RunError::SourceChanged(r)) if r == "the prefix changed"));
        let t = StopToken::new();
        t.stop_by_signal(2);
        t.stop_with("late".into());
        assert!(matches!(t.check(), Err(RunError::Signal(2))));
        assert_eq!(t.reason(), None);
    }

    #[test]
    fn two_tokens_do_not_stop_each_other() {
        let (a, b) = (StopToken::new(), StopToken::new());
        a.stop();
        assert!(matches!(a.check(), Err(RunError::Stopped)));
        assert!(b.check().is_ok());
        assert!(matches!(a.clone().check(), Err(RunError::Stopped)));
    }
}
