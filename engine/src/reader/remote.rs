//! The remote fetch engine as a [`ReadEngine`]: the loader reads object
//! ranges of a remote source with the same calls as local files.
//!
//! A `ReadOp`'s `file` is the object's index in the manifest (the engine's
//! object table is the manifest's objects in the same order), its range
//! `offset_bytes..offset_bytes + len_bytes`. The fetch engine runs on the
//! remote runtime's threads; this adapter only sends reads into its channel
//! and drains completions, so the loader thread stays one thread and never
//! runs tokio. `spare_byte` is not used: a remote read learns an object's
//! size and ETag from its response headers, and a changed object is an
//! error naming its key (`ReadError::Remote`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Completion, ReadEngine, ReadError, ReadOp};
use crate::remote::{
    FetchCompletion, FetchConfig, FetchEngine, FetchRead, RemoteError, RemoteObject, RemoteRuntime,
    StoreHandle,
};

/// `ReadEngine::backend_name` of the remote engine.
pub const REMOTE_BACKEND: &str = "remote";
/// Longest wait of a `reap` with no timeout before it looks again (the
/// fetch engine's `reap` takes a finite timeout).
const REAP_FOREVER_SLICE: Duration = Duration::from_secs(3600);

/// Reads of remote objects through `remote::FetchEngine`.
pub struct RemoteReadEngine {
    fetch: FetchEngine,
    objects: Arc<Vec<RemoteObject>>,
    /// Read id (the fetch tag) → (the caller's `user_data`, the object).
    outstanding: HashMap<u64, (u64, u32)>,
    next_id: u64,
    max_in_flight: usize,
    reaped: Vec<FetchCompletion>,
    /// Body chunks of completed reads submitted with `keep`, by `user_data`,
    /// until `take_kept` (the data cache's fill).
    kept: HashMap<u64, Vec<bytes::Bytes>>,
    /// `keep` of the `submit_keeping` under way.
    keep_next: Vec<bool>,
}

impl std::fmt::Debug for RemoteReadEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteReadEngine")
            .field("fetch", &self.fetch)
            .field("in_flight", &self.outstanding.len())
            .finish()
    }
}

impl RemoteReadEngine {
    /// Starts a fetch engine on `runtime` over `objects` of `store` (the
    /// manifest's objects, in its order) that takes up to `max_in_flight`
    /// reads at once (`--queue-depth`; the fetch engine's own window then
    /// decides how many GETs of them are in flight).
    pub fn start(
        runtime: Arc<RemoteRuntime>,
        store: StoreHandle,
        objects: Arc<Vec<RemoteObject>>,
        cfg: FetchConfig,
        max_in_flight: usize,
    ) -> Result<RemoteReadEngine, ReadError> {
        let fetch = FetchEngine::start(runtime, store, Arc::clone(&objects), cfg).map_err(|e| {
            ReadError::InvalidConfig {
                reason: e.to_string(),
            }
        })?;
        let max_in_flight = fetch.max_outstanding().min(max_in_flight.max(1));
        Ok(RemoteReadEngine {
            fetch,
            objects,
            outstanding: HashMap::new(),
            next_id: 0,
            max_in_flight,
            reaped: Vec::new(),
            kept: HashMap::new(),
            keep_next: Vec::new(),
        })
    }

    /// The counters of the engine's store (GETs in flight, bytes, retries).
    pub fn metrics(&self) -> &Arc<crate::remote::RemoteMetrics> {
        self.fetch.metrics()
    }

    fn completion(&mut self, c: FetchCompletion) -> Option<Completion> {
        // Every tag came from `submit`; one that did not is not ours to report.
        let (user_data, object) = self.outstanding.remove(&c.tag)?;
        if !c.chunks.is_empty() {
            self.kept.insert(user_data, c.chunks);
        }
        let result = c.result.map_err(|e| self.read_error(object, e));
        Some(Completion { user_data, result })
    }

    fn read_error(&self, object: u32, e: RemoteError) -> ReadError {
        let key = self
            .objects
            .get(object as usize)
            .map_or_else(|| format!("#{object}"), |o| o.key.clone());
        ReadError::Remote {
            key,
            cause: Arc::new(e),
        }
    }
}

impl RemoteReadEngine {
    /// The body chunks of the completed read `user_data` that was
    /// submitted with `keep` (see `submit_keeping`), once.
    pub fn take_kept(&mut self, user_data: u64) -> Option<Vec<bytes::Bytes>> {
        self.kept.remove(&user_data)
    }

    /// `ReadEngine::submit`, where `keep[i]` (false past its end) asks to
    /// keep read i's body chunks for `take_kept` (only a read fetched in
    /// one GET gets them).
    ///
    /// # Safety
    /// As for `ReadEngine::submit`.
    pub unsafe fn submit_keeping(
        &mut self,
        ops: &[ReadOp],
        keep: &[bool],
    ) -> Result<(), ReadError> {
        self.keep_next = keep.to_vec();
        // SAFETY: the caller's contract is `submit`'s.
        let r = unsafe { self.submit(ops) };
        self.keep_next.clear();
        r
    }
}

impl ReadEngine for RemoteReadEngine {
    fn backend_name(&self) -> &'static str {
        REMOTE_BACKEND
    }

    fn in_flight(&self) -> usize {
        self.outstanding.len()
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        // The fetch engine checks too, but names no read: the first bad
        // one's `user_data` goes back, as the local engines do.
        let objects = &self.objects;
        super::admit_sized(
            self.outstanding.len(),
            self.max_in_flight,
            ops,
            |i| objects.get(i as usize).map(|o| o.size),
            objects.len(),
        )?;
        let first_id = self.next_id;
        let mut reads = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let end =
                op.offset_bytes
                    .checked_add(op.len_bytes)
                    .ok_or_else(|| ReadError::InvalidOp {
                        user_data: op.user_data,
                        reason: format!(
                            "{} bytes at offset {} pass 2^64",
                            op.len_bytes, op.offset_bytes
                        ),
                    })?;
            reads.push(FetchRead {
                object: op.file,
                range: op.offset_bytes..end,
                dest: op.dest,
                tag: first_id + i as u64,
            });
        }
        // SAFETY: the caller's contract on `dest` (valid for `len_bytes`
        // writes, untouched until reaped or the engine is dropped) is the
        // fetch engine's; its drop waits for every GET, as ours must.
        let submitted = unsafe { self.fetch.submit_keeping(&reads, &self.keep_next) };
        submitted.map_err(|e| match e {
            RemoteError::InvalidRead { reason } => ReadError::InvalidOp {
                user_data: ops.first().map_or(0, |op| op.user_data),
                reason,
            },
            RemoteError::Busy { queued, max_queued } => ReadError::Busy {
                in_flight: queued,
                requested: ops.len(),
                max_in_flight: max_queued,
            },
            other => ReadError::Remote {
                key: String::new(),
                cause: Arc::new(other),
            },
        })?;
        for (i, op) in ops.iter().enumerate() {
            self.outstanding
                .insert(first_id + i as u64, (op.user_data, op.file));
        }
        self.next_id = first_id + ops.len() as u64;
        Ok(())
    }

    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        let mut got = 0;
        loop {
            let wait = timeout.unwrap_or(REAP_FOREVER_SLICE);
            let mut reaped = std::mem::take(&mut self.reaped);
            self.fetch
                .reap(&mut reaped, min_complete.saturating_sub(got), wait);
            for c in reaped.drain(..) {
                if let Some(done) = self.completion(c) {
                    out.push(done);
                    got += 1;
                }
            }
            self.reaped = reaped;
            if timeout.is_some() || got >= min_complete || self.outstanding.is_empty() {
                return Ok(got);
            }
        }
    }
}
