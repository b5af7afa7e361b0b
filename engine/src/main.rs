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
        /// Print once and exit.
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
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RINGFEED_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
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
        Command::Stat { name, interval, once } => cli::stat::run(&name, Duration::from_secs_f64(interval.max(0.05)), once),
        Command::Gc => cli::gc::run(),
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
