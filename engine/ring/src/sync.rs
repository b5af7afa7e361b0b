//! The one door through which ring code reaches atomics and fences.
//!
//! Under `--cfg loom` these are loom's model-checked types, so the slot
//! handoff in `ring::protocol` runs unchanged inside a loom model; otherwise
//! they are `std`'s, which have the same in-memory representation as the
//! plain integers of the documented byte layout (docs/ring-layout.md).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
