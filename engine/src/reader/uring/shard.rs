//! A shard: one thread that owns one `Ring`, takes batches of reads from a
//! channel and sends their completions back.
//!
//! A shard that has reads in flight sleeps in `io_uring_enter`, not on its
//! channel, so new batches must wake it: the ring always holds a READ of the
//! shard's eventfd, and the engine writes that eventfd after sending a batch
//! to a shard that said it is about to sleep (`Wake::sleeping`), so a busy
//! shard costs the engine no system call.

use std::io;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::ring::Ring;
use super::wake::Wake;
use super::BACKEND;
use crate::reader::{Completion, ReadError, ReadOp};

/// Reads on their way to a shard.
pub(super) struct Batch(pub(super) Vec<ReadOp>);

// SAFETY: the only non-Send fields are the `dest` pointers. `submit`'s
// contract gives the engine exclusive use of that memory until the
// completion is reaped; the batch goes to exactly one shard, which only
// hands the pointers to the kernel.
unsafe impl Send for Batch {}

/// What a shard tells the engine.
pub(super) enum ShardMsg {
    /// Reads of shard `shard` that finished.
    Done {
        shard: usize,
        completions: Vec<Completion>,
    },
    /// The shard's ring failed; its reads in flight will not complete.
    Failed(ReadError),
}

/// Starts shard `id` on its own thread.
pub(super) fn spawn(
    id: usize,
    ring: Ring,
    wake: Arc<Wake>,
    batches: Receiver<Batch>,
    msgs: Sender<ShardMsg>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("ringfeed-uring-{id}"))
        .spawn(move || {
            let failed = msgs.clone();
            // A panic must not leave the engine waiting for completions that
            // will never come: report it. The ring is dropped while unwinding,
            // which waits for its reads in flight.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(move || {
                run(id, ring, &wake, &batches, &msgs)
            }));
            let error = match outcome {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e,
                Err(_) => ReadError::Engine {
                    backend: BACKEND,
                    op: "run a reader shard",
                    source: io::Error::other("the io_uring shard thread panicked"),
                },
            };
            tracing::error!(shard = id, error = %error, "io_uring reader shard failed");
            let _ = failed.send(ShardMsg::Failed(error));
        })
}

fn run(
    id: usize,
    mut ring: Ring,
    wake: &Wake,
    batches: &Receiver<Batch>,
    msgs: &Sender<ShardMsg>,
) -> Result<(), ReadError> {
    ring.arm_wake()?;
    let mut out = Vec::new();
    loop {
        let first = if ring.in_flight() == 0 {
            match batches.recv() {
                Ok(batch) => Some(batch),
                Err(_) => return Ok(()),
            }
        } else {
            None
        };
        for batch in first
            .into_iter()
            .chain(std::iter::from_fn(|| batches.try_recv().ok()))
        {
            if wake.closing.load(Ordering::SeqCst) {
                return Ok(());
            }
            // SAFETY: the engine's `submit` contract covers every batch.
            unsafe { ring.accept(&batch.0) }?;
        }
        // SYNC POINT: pairs with `poke_if_sleeping`: announce the sleep,
        // then look at the channel once more before sleeping.
        wake.sleeping.store(true, Ordering::SeqCst);
        if !batches.is_empty() {
            wake.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        ring.reap(&mut out, 1)?;
        wake.sleeping.store(false, Ordering::SeqCst);
        if !out.is_empty() {
            // Fails only when the engine is gone, and then nobody wants them.
            let _ = msgs.send(ShardMsg::Done {
                shard: id,
                completions: std::mem::take(&mut out),
            });
        }
    }
}
