//! `ringfeed`: serve a dataset to every training process on this machine.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use ringfeed::cli;

#[derive(Parser)]
#[command(name = "ringfeed", version, about = "One loader per machine feeding every training process through a zero-copy shared-memory ring")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a dataset to the training processes of this machine.
    Serve(cli::serve::ServeArgs),
    /// Run the whole path on a synthetic dataset and check every byte (no setup).
    Demo(cli::demo::DemoArgs),
    /// Show a live loader: per-rank queue depth, batches/s, MB/s, time waiting for data.
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
    /// Remove shared-memory segments left by loaders that died.
    Gc,
    #[command(hide = true)]
    DemoConsumer(cli::demo::DemoConsumerArgs),
    #[command(hide = true)]
    RingTestProducer(cli::testing::ProducerArgs),
    #[command(hide = true)]
    RingTestConsumer(cli::testing::ConsumerArgs),
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    // A RINGFEED_LOG that does not parse falls back to "info"; say so
    // rather than ignore the setting without a word.
    let filter = match std::env::var("RINGFEED_LOG") {
        Ok(v) => match tracing_subscriber::EnvFilter::try_new(&v) {
            Ok(filter) => {
                if let Some(word) = silencing_directive(&v) {
                    eprintln!(
                        "ringfeed: warning: RINGFEED_LOG={v:?}: {word:?} is neither a level nor a ringfeed module, so ringfeed's \
                         own log stays silent; try debug, info, warn or error (or ringfeed=debug)"
                    );
                }
                filter
            }
            Err(e) => {
                eprintln!("ringfeed: warning: RINGFEED_LOG={v:?} is not a log filter ({e}); using \"info\" (try debug, info, warn or error)");
                "info".into()
            }
        },
        Err(_) => "info".into(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, not in log files.
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(a) => match cli::serve::run(&a) {
            Ok(0) => Ok(()),
            Ok(code) => return ExitCode::from(code),
            Err(e) => Err(e),
        },
        Command::Demo(a) => cli::demo::run(&a),
        Command::DemoConsumer(a) => cli::demo::run_consumer(&a),
        Command::Stat { name, interval, once } => {
            restore_sigpipe();
            stat_interval(interval).and_then(|interval| cli::stat::run(&name, interval, once))
        }
        Command::Gc => {
            restore_sigpipe();
            cli::gc::run()
        }
        Command::RingTestProducer(a) => cli::testing::run_producer(&a),
        Command::RingTestConsumer(a) => cli::testing::run_consumer(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringfeed: error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// A directive of a RINGFEED_LOG filter that the filter syntax takes as a
/// module name although the user likely meant a level (`verbose`, `bogus`):
/// such a filter parses, and ringfeed's own log then says nothing at all.
fn silencing_directive(filter: &str) -> Option<&str> {
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    let mut suspect = None;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        // `target=level`, `target[span]=level` or a span filter: deliberate.
        if directive.contains('=') || directive.contains('[') {
            if directive.starts_with("ringfeed") || directive.starts_with('[') {
                return None;
            }
            continue;
        }
        if LEVELS.iter().any(|l| directive.eq_ignore_ascii_case(l)) || directive.parse::<u8>().is_ok() || directive.starts_with("ringfeed") {
            return None;
        }
        suspect.get_or_insert(directive);
    }
    suspect
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
        anyhow::bail!("--interval {seconds}: give the seconds between refreshes, from 0.05 to 3600");
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::silencing_directive;

    #[test]
    fn a_log_filter_that_leaves_ringfeed_silent_is_named() {
        assert_eq!(silencing_directive("bogus"), Some("bogus"));
        assert_eq!(silencing_directive("verbose,tokio=debug"), Some("verbose"));
        for ok in ["debug", "INFO", "warn,hyper=off", "ringfeed=debug", "ringfeed::loader", "info,bogus", "3", "[serve]=debug", ""] {
            assert_eq!(silencing_directive(ok), None, "{ok}");
        }
    }
}
