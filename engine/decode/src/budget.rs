//! `MemoryBudget`: one bound on the memory of every decode that shares it,
//! whatever the number of threads (issue 36, item 7).
//!
//! A decode first reads its image's header and works out, from the pixels it
//! will produce, the most its format decoder, its source buffer and the
//! resize can hold at once (`probe::Need`). It then takes that many bytes
//! from the budget, waiting in line while other decodes hold them, and gives
//! them back when done. The pixel buffers are lent out of the budget too: a
//! buffer given back stays allocated (and counted) as a spare for the next
//! decode, on whichever thread, until a decode that cannot fit otherwise
//! frees it. So the bytes held by decodes and spares never pass `total`.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The stage's default: at most this many bytes for every decode of a
/// loader together (docs/images.md).
pub const DEFAULT_MEMORY_BUDGET: u64 = 256 << 20;

/// The most pixels a budget of `bytes` can hold at all: 3 bytes a pixel,
/// the RGB source every decode makes. `--max-pixels` may not pass it (the
/// default, Pillow's `MAX_IMAGE_PIXELS`, is exactly what the default
/// budget holds). An image under it whose format needs more per pixel (a
/// progressive JPEG, alpha) can still be over the budget: its decode says so.
pub fn max_pixels_within(bytes: u64) -> u64 {
    bytes / 3
}

/// A spare buffer larger than this is freed when given back rather than
/// kept: one huge source does not keep its memory for the run.
const SPARE_BYTES_MAX: usize = 64 << 20;

/// How often a decode waiting in line looks at its stop condition.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// One memory bound shared by decoders (`Decoder::with_budget`), usually
/// one per loader across all of its decode threads.
#[derive(Debug)]
pub struct MemoryBudget {
    total: u64,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes granted to decodes under way, plus the spares' capacities.
    used: u64,
    /// The most `used` ever was (for tests and figures).
    peak: u64,
    /// Decodes waiting, first come first served.
    line: VecDeque<u64>,
    next_ticket: u64,
    /// Buffers given back, still allocated and counted in `used`.
    spares: Vec<Vec<u8>>,
}

/// Why `MemoryBudget::take` gave nothing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TakeError {
    /// The stop condition became true while waiting.
    Stopped,
}

/// What one decode holds: `bytes` of the budget for its decoder's own
/// allocations, and its buffers (each counted by its capacity, or by the
/// length it was promised before it was allocated).
#[derive(Debug)]
pub(crate) struct Grant<'a> {
    budget: &'a MemoryBudget,
    bytes: u64,
    /// The buffers lent, and the bytes counted for each.
    pub(crate) buffers: Vec<(Vec<u8>, u64)>,
}

impl MemoryBudget {
    /// A budget of `total_bytes` (at least 1).
    pub fn new(total_bytes: u64) -> MemoryBudget {
        MemoryBudget {
            total: total_bytes.max(1),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// The bound, in bytes.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes held now by decodes under way and by spare buffers.
    pub fn in_use(&self) -> u64 {
        self.lock().used
    }

    /// The most bytes ever held at once.
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// The spare buffers' (address, capacity), for tests.
    #[cfg(test)]
    pub(crate) fn spares(&self) -> Vec<(usize, usize)> {
        self.lock()
            .spares
            .iter()
            .map(|b| (b.as_ptr() as usize, b.capacity()))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A decode that panicked while holding the lock left consistent
        // numbers (every update is one statement): go on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `bytes` for a decoder's own use and one buffer of at least
    /// each of `buffer_lens` bytes (a spare if one fits, else an empty
    /// `Vec` to be grown to that length, the length counted already).
    /// Waits in line while the budget is short, giving up when `stop()`
    /// becomes true. The caller checked that the whole fits `total`.
    pub(crate) fn take(
        &self,
        bytes: u64,
        buffer_lens: &[usize],
        stop: &dyn Fn() -> bool,
    ) -> Result<Grant<'_>, TakeError> {
        let mut state = self.lock();
        let mut ticket = None;
        loop {
            let first = match ticket {
                None => state.line.is_empty(),
                Some(t) => state.line.front() == Some(&t),
            };
            if first {
                if let Some(buffers) = fit(&mut state, self.total, bytes, buffer_lens) {
                    if let Some(t) = ticket {
                        state.line.retain(|&w| w != t);
                        // The next in line may fit now.
                        self.changed.notify_all();
                    }
                    return Ok(Grant {
                        budget: self,
                        bytes,
                        buffers,
                    });
                }
            }
            if stop() {
                if let Some(t) = ticket {
                    state.line.retain(|&w| w != t);
                    self.changed.notify_all();
                }
                return Err(TakeError::Stopped);
            }
            if ticket.is_none() {
                let t = state.next_ticket;
                state.next_ticket += 1;
                state.line.push_back(t);
                ticket = Some(t);
            }
            state = self
                .changed
                .wait_timeout(state, WAIT_SLICE)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn give_back(&self, bytes: u64, buffers: Vec<(Vec<u8>, u64)>) {
        let mut state = self.lock();
        state.used = state.used.saturating_sub(bytes);
        for (buf, counted) in buffers {
            let capacity = buf.capacity() as u64;
            state.used = state.used.saturating_sub(counted);
            if capacity > 0
                && buf.capacity() <= SPARE_BYTES_MAX
                && state.used + capacity <= self.total
            {
                state.used += capacity;
                state.spares.push(buf);
            }
        }
        drop(state);
        self.changed.notify_all();
    }
}

/// Lends spares that fit `buffer_lens` (the smallest fitting each), frees
/// other spares while `bytes` and the new buffers do not fit, and counts
/// what it grants; None (and nothing changed but freed spares) when it
/// still does not fit.
fn fit(
    state: &mut State,
    total: u64,
    bytes: u64,
    buffer_lens: &[usize],
) -> Option<Vec<(Vec<u8>, u64)>> {
    let mut picked: Vec<Option<usize>> = Vec::with_capacity(buffer_lens.len());
    for &len in buffer_lens {
        let best = (0..state.spares.len())
            .filter(|i| !picked.contains(&Some(*i)) && state.spares[*i].capacity() >= len)
            .min_by_key(|&i| state.spares[i].capacity());
        picked.push(best);
    }
    let new_bytes: u64 = buffer_lens
        .iter()
        .zip(&picked)
        .filter(|(_, p)| p.is_none())
        .map(|(&len, _)| len as u64)
        .sum();
    let need = bytes.saturating_add(new_bytes);
    // Free the spares not picked, largest first, until it fits.
    while state.used.saturating_add(need) > total {
        let largest = (0..state.spares.len())
            .filter(|i| !picked.contains(&Some(*i)))
            .max_by_key(|&i| state.spares[i].capacity())?;
        let freed = state.spares.swap_remove(largest);
        state.used = state.used.saturating_sub(freed.capacity() as u64);
        // swap_remove moved the last spare to `largest`.
        let last = state.spares.len();
        for p in picked.iter_mut().flatten() {
            if *p == last {
                *p = largest;
            }
        }
    }
    state.used += need;
    state.peak = state.peak.max(state.used);
    // Take the picked spares out, highest index first so the others stay put.
    let mut order: Vec<(usize, usize)> = picked
        .iter()
        .enumerate()
        .filter_map(|(slot, p)| p.map(|i| (i, slot)))
        .collect();
    order.sort_unstable_by_key(|b| std::cmp::Reverse(b.0));
    let mut out: Vec<(Vec<u8>, u64)> = buffer_lens
        .iter()
        .map(|&len| (Vec::new(), len as u64))
        .collect();
    for (i, slot) in order {
        let buf = state.spares.swap_remove(i);
        let counted = buf.capacity() as u64;
        out[slot] = (buf, counted);
    }
    Some(out)
}

impl Grant<'_> {
    /// Buffer `i`, grown (fallibly) to `len` bytes; its bytes are whatever
    /// the last decode left (the decoders overwrite every byte they use).
    pub(crate) fn buffer(&mut self, i: usize, len: usize) -> Result<&mut [u8], usize> {
        let (buf, _) = &mut self.buffers[i];
        if buf.len() < len {
            if buf.capacity() < len {
                buf.try_reserve_exact(len - buf.len()).map_err(|_| len)?;
            }
            buf.resize(len, 0);
        }
        Ok(&mut buf[..len])
    }

    /// Two buffers at once.
    pub(crate) fn buffers2(
        &mut self,
        lens: (usize, usize),
    ) -> Result<(&mut [u8], &mut [u8]), usize> {
        self.buffer(0, lens.0)?;
        self.buffer(1, lens.1)?;
        let (a, b) = self.buffers.split_at_mut(1);
        Ok((&mut a[0].0[..lens.0], &mut b[0].0[..lens.1]))
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        let buffers = std::mem::take(&mut self.buffers);
        self.budget.give_back(self.bytes, buffers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const NEVER: &dyn Fn() -> bool = &|| false;

    #[test]
    fn a_grant_counts_its_bytes_and_buffers_and_gives_them_back() {
        let b = MemoryBudget::new(1000);
        let mut g = b.take(100, &[300], NEVER).unwrap();
        assert_eq!(b.in_use(), 400);
        assert_eq!(g.buffer(0, 300).unwrap().len(), 300);
        drop(g);
        // The buffer stays as a spare, counted.
        assert_eq!(b.in_use(), 300);
        let mut g = b.take(100, &[200], NEVER).unwrap();
        assert_eq!(b.in_use(), 400, "the spare was lent, not a new buffer");
        let ptr = g.buffer(0, 200).unwrap().as_ptr();
        drop(g);
        let mut g = b.take(0, &[250], NEVER).unwrap();
        assert_eq!(
            g.buffer(0, 250).unwrap().as_ptr(),
            ptr,
            "the same spare again"
        );
        drop(g);
        assert_eq!(b.peak(), 400);
    }

    #[test]
    fn spares_are_freed_for_a_decode_that_needs_their_room() {
        let b = MemoryBudget::new(1000);
        let mut g = b.take(0, &[600], NEVER).unwrap();
        g.buffer(0, 600).unwrap();
        drop(g);
        assert_eq!(b.in_use(), 600);
        let g = b.take(700, &[], NEVER).unwrap();
        assert_eq!(b.in_use(), 700, "the 600-byte spare was freed");
        drop(g);
        assert!(b.peak() <= 1000);
    }

    #[test]
    fn threads_wait_in_line_and_never_hold_more_than_the_total() {
        let b = Arc::new(MemoryBudget::new(1000));
        let held = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (b, held) = (Arc::clone(&b), Arc::clone(&held));
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let bytes = 100 + ((t * 37 + i * 11) % 8) * 100;
                        let g = b.take(bytes, &[], NEVER).unwrap();
                        let now = held.fetch_add(bytes, Ordering::SeqCst) + bytes;
                        assert!(now <= 1000, "{now} bytes held at once");
                        std::thread::yield_now();
                        held.fetch_sub(bytes, Ordering::SeqCst);
                        drop(g);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(b.peak() <= 1000 && b.in_use() == 0);
    }

    #[test]
    fn a_waiting_decode_gives_up_when_stopped() {
        let b = Arc::new(MemoryBudget::new(1000));
        let g = b.take(900, &[], NEVER).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (b, stop) = (Arc::clone(&b), Arc::clone(&stop));
            std::thread::spawn(move || {
                b.take(500, &[], &|| stop.load(Ordering::Relaxed))
                    .map(|_| ())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(waiter.join().unwrap(), Err(TakeError::Stopped));
        drop(g);
        // Nobody is left in line: the next take goes through at once.
        assert!(b.take(1000, &[], NEVER).is_ok());
    }
}
