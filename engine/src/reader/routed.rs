//! Several engines behind one: a mixture's corpora may lie in different
//! places (a local directory and a remote prefix, two stores), each read by
//! its own engine with its own cache and retries. Object indices run engine
//! after engine: engine i serves objects `first[i] .. first[i + 1]`, and a
//! read is handed to its engine with the object index made its own.

use std::time::{Duration, Instant};

use super::{Completion, ReadEngine, ReadError, ReadOp};

/// Longest wait on one engine while another may complete first.
const SLICE: Duration = Duration::from_millis(1);

/// See the module documentation.
pub struct RoutedEngine {
    /// Each engine, with the first object it serves (ascending, from 0).
    routes: Vec<(u32, Box<dyn ReadEngine>)>,
    /// Where the next blocking wait starts (round-robin).
    next: usize,
}

impl std::fmt::Debug for RoutedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<(u32, &str)> = self
            .routes
            .iter()
            .map(|(first, e)| (*first, e.backend_name()))
            .collect();
        f.debug_struct("RoutedEngine")
            .field("routes", &names)
            .finish()
    }
}

impl RoutedEngine {
    /// Engines and the first object each serves (the first from 0,
    /// ascending).
    pub fn new(routes: Vec<(u32, Box<dyn ReadEngine>)>) -> RoutedEngine {
        debug_assert!(routes.first().is_some_and(|(f, _)| *f == 0));
        debug_assert!(routes.windows(2).all(|w| w[0].0 < w[1].0));
        RoutedEngine { routes, next: 0 }
    }

    fn route_of(&self, object: u32) -> usize {
        self.routes.partition_point(|(first, _)| *first <= object) - 1
    }
}

impl ReadEngine for RoutedEngine {
    fn backend_name(&self) -> &'static str {
        "mixed"
    }

    fn in_flight(&self) -> usize {
        self.routes.iter().map(|(_, e)| e.in_flight()).sum()
    }

    /// The smallest engine's: the caller's reads may all go to one engine,
    /// which must never be asked past its own limit.
    fn max_in_flight(&self) -> usize {
        self.routes
            .iter()
            .map(|(_, e)| e.max_in_flight())
            .min()
            .unwrap_or(0)
    }

    unsafe fn submit(&mut self, ops: &[ReadOp]) -> Result<(), ReadError> {
        let in_flight = self.in_flight();
        let max = self.max_in_flight();
        if in_flight + ops.len() > max {
            return Err(ReadError::Busy {
                in_flight,
                requested: ops.len(),
                max_in_flight: max,
            });
        }
        let mut split: Vec<Vec<ReadOp>> = self.routes.iter().map(|_| Vec::new()).collect();
        for op in ops {
            let r = self.route_of(op.file);
            let mut own = *op;
            own.file -= self.routes[r].0;
            split[r].push(own);
        }
        for ((_, engine), own) in self.routes.iter_mut().zip(&split) {
            if !own.is_empty() {
                // SAFETY: the caller's contract on each op's `dest` passes on
                // unchanged; only the object index is made the engine's own.
                unsafe { engine.submit(own) }?;
            }
        }
        Ok(())
    }

    fn reap(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        timeout: Option<Duration>,
    ) -> Result<usize, ReadError> {
        let started = Instant::now();
        let mut got = 0;
        loop {
            for (_, engine) in &mut self.routes {
                if engine.in_flight() > 0 {
                    got += engine.reap(out, 0, Some(Duration::ZERO))?;
                }
            }
            if got >= min_complete || self.in_flight() == 0 {
                return Ok(got);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(started.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(got),
                },
                None => SLICE,
            };
            // Wait a slice on the next engine with reads under way.
            let n = self.routes.len();
            let busy = (0..n)
                .map(|i| (self.next + i) % n)
                .find(|&i| self.routes[i].1.in_flight() > 0);
            if let Some(i) = busy {
                self.next = (i + 1) % n;
                got += self.routes[i].1.reap(out, 1, Some(left.min(SLICE)))?;
            }
        }
    }
}
