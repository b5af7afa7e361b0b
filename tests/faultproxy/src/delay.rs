//! A delay line in front of a socket's write half: every piece is written a
//! fixed time after it was queued. Pieces queue up behind each other without
//! waiting for the ones before them to be written, so a delay adds latency to
//! each piece but does not cap throughput (up to `DELAY_LINE_PIECES_MAX`
//! pieces, 32 MiB, in flight per direction).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::stats::Stats;

/// Pieces queued in one direction before the reader waits (each at most
/// `http::READ_CHUNK_BYTES`): the bandwidth-delay product it allows is
/// 512 x 64 KiB = 32 MiB, 1.6 GB/s at 20 ms.
pub const DELAY_LINE_PIECES_MAX: usize = 512;

/// What the writer does with an item when its time comes.
#[derive(Debug)]
pub enum Item {
    /// Write these bytes.
    Data(Vec<u8>),
    /// Shut down the write direction (FIN): the sender has ended.
    Shutdown,
    /// Reset the connection (RST): a fault.
    Reset,
}

/// How a delay line's writer ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its input ended or it shut the socket down.
    Closed,
    /// It reset the connection: the other tasks of the connection must end now
    /// so that the socket is closed (with linger 0, hence RST).
    Reset,
}

/// The sending side of a delay line.
#[derive(Clone)]
pub struct DelayLine {
    tx: mpsc::Sender<(Instant, Item)>,
    delay: Duration,
}

impl DelayLine {
    /// A delay line of `delay` in front of `socket`, and its writer task's future.
    pub fn new(
        socket: OwnedWriteHalf,
        delay: Duration,
        stats: Arc<Stats>,
        to_upstream: bool,
    ) -> (Self, impl std::future::Future<Output = io::Result<Ended>>) {
        let (tx, rx) = mpsc::channel(DELAY_LINE_PIECES_MAX);
        (
            DelayLine { tx, delay },
            write_when_due(socket, rx, stats, to_upstream),
        )
    }

    /// Queues `item` to be done `delay` (plus `extra`) from now. An error: the
    /// writer has ended (its socket failed or was reset).
    pub async fn send_after(&self, item: Item, extra: Duration) -> io::Result<()> {
        let due = Instant::now() + self.delay + extra;
        self.tx.send((due, item)).await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the other side of the connection has closed",
            )
        })
    }

    /// Queues `item` to be done `delay` from now.
    pub async fn send(&self, item: Item) -> io::Result<()> {
        self.send_after(item, Duration::ZERO).await
    }
}

async fn write_when_due(
    mut socket: OwnedWriteHalf,
    mut rx: mpsc::Receiver<(Instant, Item)>,
    stats: Arc<Stats>,
    to_upstream: bool,
) -> io::Result<Ended> {
    let counter = if to_upstream {
        &stats.bytes_to_upstream
    } else {
        &stats.bytes_to_client
    };
    while let Some((due, item)) = rx.recv().await {
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        match item {
            Item::Data(bytes) => {
                socket.write_all(&bytes).await?;
                Stats::add(counter, bytes.len() as u64);
            }
            Item::Shutdown => {
                socket.shutdown().await?;
                return Ok(Ended::Closed);
            }
            Item::Reset => {
                // Linger 0 makes the close that follows send RST instead of FIN;
                // forget() leaves the close to the moment the read half drops.
                socket.as_ref().set_zero_linger()?;
                socket.forget();
                return Ok(Ended::Reset);
            }
        }
    }
    Ok(Ended::Closed)
}
