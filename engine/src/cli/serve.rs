//! `ringfeed serve`.

use std::sync::atomic::Ordering;

use anyhow::Result;

use crate::cli::say::say_err;
use crate::loader::{build, signals, Finished, JobConfig, StopToken};
use crate::ring::outcome::{Outcome, OutcomeKind};
use crate::ring::segment::human_bytes;

pub use super::serve_args::*;

/// Runs a loader until every batch was delivered and released. Returns the
/// exit code: 0, or 128 + signal when stopped by SIGINT, SIGTERM or SIGHUP.
///
/// Whatever the end, it leaves the loader's last word for trainers that
/// attach later (`ring::outcome`): they report it at once instead of waiting
/// out their timeout for a loader that is not coming.
pub fn run(args: &ServeArgs) -> Result<u8> {
    signals::unignore_stop_signals();
    let job = args.into_config()?;
    let cfg = &job.serve;
    // A previous loader's word, or its segment if it died, is stale once a
    // new loader of the name starts: trainers now wait for this one. So is
    // anything planted at the outcome's place (a directory a rename cannot
    // replace): removed if this user may, else said now.
    match Outcome::clear(&cfg.name) {
        Ok(None) => {}
        Ok(Some(removed)) => tracing::warn!("{removed}"),
        Err(why) => tracing::warn!("{why}"),
    }
    if let Err(e) = crate::ring::Producer::remove_dead_segment(&cfg.name) {
        tracing::debug!("a dead loader's segment stays until the ring is made: {e}");
    }
    // A panic anywhere (any thread) still leaves the outcome, so trainers
    // fail at once with the message instead of waiting out their timeout.
    let name = cfg.name.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        let message = format!("the loader panicked, a bug of ringfeed (please report it): {info}");
        let _ = Outcome::now(OutcomeKind::Failed, &crate::remote::scrub(&message)).write(&name);
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_configured(&job)))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(anyhow::anyhow!(
                "the loader panicked, a bug of ringfeed (please report it): {what}"
            ))
        });
    let outcome = match &result {
        Ok(0) => Outcome::now(OutcomeKind::Ended, "it served its whole run and exited"),
        Ok(code) => Outcome::now(
            OutcomeKind::Failed,
            &format!("it was stopped by signal {}", code.saturating_sub(128)),
        ),
        Err(e) => Outcome::now(
            OutcomeKind::Failed,
            &crate::remote::scrub(&format!("{e:#}")),
        ),
    };
    if let Err(e) = outcome.write(&cfg.name) {
        tracing::warn!("cannot leave this loader's outcome for trainers that attach later: {e}");
    }
    result
}

/// Builds the job and serves it; prints the outcome. The exit code: 0, or
/// 128 + signal when stopped by one.
fn run_configured(job: &JobConfig) -> Result<u8> {
    let stop = StopToken::on_signals();
    let built = build(job, &stop)?;
    match built.finish(&stop) {
        Ok(Finished {
            report,
            cache_stats,
        }) => {
            let secs = report.elapsed.as_secs_f64();
            say_err!(
                "ringfeed: done: {} batches, {} samples, {} in {:.2} s ({:.2} GB/s, reader {})",
                report.batches,
                report.samples,
                human_bytes(report.bytes),
                secs,
                report.bytes as f64 / secs.max(1e-9) / 1e9,
                report.backend
            );
            if let Some((decoded, bad)) = report.images {
                say_err!("ringfeed: decoded {decoded} images ({bad} could not be decoded and were served as zero images, flagged in batch.bad)");
            }
            if let Some(line) = crate::metrics::remote::summary_line() {
                say_err!("ringfeed: {line}");
            }
            // A cache that could not be opened said so at start.
            if let Some(stats) = cache_stats.filter(|s| s.opened.load(Ordering::Relaxed) > 0) {
                say_err!("ringfeed: {}", crate::cache::summary_line(&stats));
            }
            Ok(0)
        }
        Err(err) => match err.signal() {
            Some(sig) => {
                say_err!("ringfeed: stopped by signal {sig}: trainers were told (once they have taken what was published, next fails with \"stopped before the end of the run\"), segment removed");
                Ok(128u8.saturating_add(sig as u8))
            }
            None => Err(err.into()),
        },
    }
}
