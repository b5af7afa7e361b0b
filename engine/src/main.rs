//! `ringfeed`: serve a dataset to every training process on this machine.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use ringfeed::cli;

#[derive(Parser)]
#[command(
    name = "ringfeed",
    version,
    about = "One loader per machine feeding every training process through a zero-copy shared-memory ring"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a dataset to the training processes of this machine.
    Serve(Box<cli::serve::ServeArgs>),
    /// Run torchrun with a loader beside it, sized from torchrun's flags:
    /// ringfeed run [serve flags] -- torchrun [torchrun flags] train.py [args].
    /// Exits with torchrun's status (128 + signal when a signal stopped it).
    Run(cli::run::RunArgs),
    /// Pack a tree of files or objects into WebDataset tar shards with
    /// their index (resumable, deterministic): ringfeed pack --source SRC --dest DEST.
    Pack(cli::pack::PackArgs),
    /// Run the whole path on a synthetic dataset and check every byte (no setup).
    Demo(cli::demo::DemoArgs),
    /// Show a live loader: per-rank queue depth, batches/s, MB/s, time waiting for data.
    /// Exits 0 while it runs or once it finished its run, 3 when it is gone
    /// without finishing (killed, or stopped before the end), 1 when there is
    /// no loader of that name.
    Stat {
        /// The loader's --name.
        name: String,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print one report, its rates taken over one --interval, and exit.
        #[arg(long)]
        once: bool,
    },
    /// Remove shared-memory segments left by loaders that died, and cached
    /// manifests of directories that no longer exist.
    Gc {
        /// The cache directory `serve --cache-dir` was given (default:
        /// RINGFEED_CACHE_DIR, else $XDG_CACHE_HOME/ringfeed, else ~/.cache/ringfeed).
        #[arg(long)]
        cache_dir: Option<std::path::PathBuf>,
    },
    /// The disk data cache of remote objects: `cache list` shows the cached
    /// datasets, `cache clear ID|--all` removes them (docs/cache.md).
    Cache(cli::cache::CacheArgs),
    #[command(hide = true)]
    DemoConsumer(cli::demo::DemoConsumerArgs),
    #[command(hide = true)]
    RingTestProducer(cli::testing::ProducerArgs),
    #[command(hide = true)]
    RingTestConsumer(cli::testing::ConsumerArgs),
}

/// The log filter unless RINGFEED_LOG says otherwise: info, but the AWS
/// SDK's credential chain only at warn (at info it logs each provider it
/// tries, and the key id; ringfeed's own start line names the source).
const DEFAULT_LOG: &str = "info,aws_config=warn,aws_smithy_runtime=warn";

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // First, with one thread: HOME settled, URLs' secrets of the environment known.
    let home = ringfeed::home::settle();
    ringfeed::remote::remember_env_secrets();
    // A RINGFEED_LOG that does not parse falls back to "info"; say so
    // rather than ignore the setting without a word.
    let filter = match std::env::var("RINGFEED_LOG") {
        // Set but empty, as unset: the default.
        Ok(v) if v.trim().is_empty() => DEFAULT_LOG.into(),
        Ok(v) => match tracing_subscriber::EnvFilter::try_new(&v) {
            Ok(filter) => {
                if filter_silences_ringfeed(&v) {
                    let spaces = if v.trim() != v {
                        " (spaces around a word make it part of a module name)"
                    } else {
                        ""
                    };
                    cli::say::err(format_args!(
                        "ringfeed: warning: RINGFEED_LOG={v:?} leaves ringfeed's own log silent, errors included: a word \
                         that is not a level names a module{spaces}; try debug, info, warn or error (or ringfeed=debug)"
                    ));
                }
                filter
            }
            Err(e) => {
                cli::say::err(format_args!("ringfeed: warning: RINGFEED_LOG={v:?} is not a log filter ({e}); using \"info\" (try debug, info, warn or error)"));
                DEFAULT_LOG.into()
            }
        },
        Err(_) => DEFAULT_LOG.into(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| cli::say::QuietStderr)
        // A failed write is dropped: tracing would report it with eprintln!,
        // which panics on a closed pipe and would take the loader down.
        .log_internal_errors(false)
        // Colour codes only for a terminal, not in log files.
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .init();
    ringfeed::home::announce(home);
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => match cli::serve::run(&a) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Run(a) => match cli::run::run(&a) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Pack(a) => cli::pack::run(&a),
        Command::Demo(a) => {
            let result = cli::demo::run(&a);
            // Stopped by a signal: exit as `serve` does, 128 + its number.
            let sig = ringfeed::loader::signals::STOP.load(std::sync::atomic::Ordering::Relaxed);
            if let (Err(e), 1..) = (&result, sig) {
                cli::say::err(format_args!("ringfeed: error: {}", error_chain(e)));
                return ExitCode::from(128u8.saturating_add(u8::try_from(sig).unwrap_or(0)));
            }
            result
        }
        Command::DemoConsumer(a) => cli::demo::run_consumer(&a),
        Command::Stat {
            name,
            interval,
            once,
        } => {
            restore_sigpipe();
            match stat_interval(interval).and_then(|interval| cli::stat::run(&name, interval, once))
            {
                Ok(0) => Ok(()),
                Ok(code) => return ExitCode::from(code),
                Err(e) => Err(e),
            }
        }
        Command::Gc { cache_dir } => {
            restore_sigpipe();
            cli::gc::run(cache_dir)
        }
        Command::Cache(a) => {
            restore_sigpipe();
            cli::cache::run(&a)
        }
        Command::RingTestProducer(a) => cli::testing::run_producer(&a),
        Command::RingTestConsumer(a) => cli::testing::run_consumer(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            cli::say::err(format_args!("ringfeed: error: {}", error_chain(&e)));
            ExitCode::FAILURE
        }
    }
}

/// Whether the RINGFEED_LOG filter `v` (which parses) leaves ringfeed's own
/// log silent, errors included, though the user did not write "off": a word
/// that is not a level is a module name to the filter syntax (`bogus`,
/// `verbose`, `7`), and so is a level with spaces around it (" debug").
/// The parsed filter itself is asked, for each of ringfeed's modules.
fn filter_silences_ringfeed(v: &str) -> bool {
    use tracing_subscriber::layer::SubscriberExt;
    // "off", or ringfeed=off, silences ringfeed on purpose.
    let deliberate = |d: &str| {
        let d = d.trim().to_ascii_lowercase();
        d == "off" || (d.starts_with("ringfeed") && d.ends_with("=off"))
    };
    if v.split(',').any(deliberate) {
        return false;
    }
    let Ok(filter) = tracing_subscriber::EnvFilter::try_new(v) else {
        return false;
    };
    let subscriber = tracing_subscriber::registry().with(filter);
    tracing::subscriber::with_default(subscriber, || {
        use tracing::{enabled, Level};
        let any = enabled!(target: "ringfeed", Level::ERROR)
            || enabled!(target: "ringfeed::cli::serve", Level::ERROR)
            || enabled!(target: "ringfeed::loader", Level::ERROR)
            || enabled!(target: "ringfeed::reader", Level::ERROR)
            || enabled!(target: "ringfeed::manifest", Level::ERROR)
            || enabled!(target: "ringfeed::ring", Level::ERROR);
        !any
    })
}

/// The error and its causes, joined by ": ", leaving out a cause whose text
/// the message already holds: most of ringfeed's errors name their OS error
/// in their own message, and anyhow's `{:#}` printed it twice.
fn error_chain(e: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// `stat` and `gc` print to stdout and hold nothing to clean up: let a closed
/// pipe (`ringfeed stat job | head`) end them quietly, as it ends other
/// tools, instead of a panic on EPIPE. `serve` keeps SIGPIPE ignored: a
/// closed stderr must not kill it before it removes its segment.
fn restore_sigpipe() {
    // SAFETY: setting a signal's disposition to the default; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `stat --interval` in seconds, from 0.05 to 3600.
fn stat_interval(seconds: f64) -> anyhow::Result<Duration> {
    if !(0.05..=3600.0).contains(&seconds) {
        anyhow::bail!(
            "--interval {seconds}: give the seconds between refreshes, from 0.05 to 3600"
        );
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::filter_silences_ringfeed;

    #[test]
    fn a_log_filter_that_leaves_ringfeed_silent_is_named() {
        for silent in [
            "bogus",
            "verbose,tokio=debug",
            " debug",
            "debug ",
            "7",
            "tokio=debug",
            "ringfeedx=debug",
            "Ringfeed=debug",
            "tokio=off",
        ] {
            assert!(
                filter_silences_ringfeed(silent),
                "{silent:?} should be named"
            );
        }
        for fine in [
            "debug",
            "INFO",
            "error",
            "3",
            "warn,hyper=off",
            "ringfeed=debug",
            "ringfeed::loader=trace",
            "info,ringfeed::loader=trace",
            "ringfeed=debug,warn",
            "off",
            "ringfeed=off",
            "info,bogus",
        ] {
            assert!(!filter_silences_ringfeed(fine), "{fine:?} should pass");
        }
    }
}
