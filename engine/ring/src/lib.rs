//! The shared-memory ring: one loader hands fixed-size batch slots to every
//! training process on the machine, without copying and without locks.
//!
//! - [`layout`]: the versioned byte layout and its checked geometry.
//! - [`protocol`]: the slot handoff on the shared blocks (loom-checked).
//! - [`segment`]: the POSIX shared-memory object and the kernel liveness locks.
//! - [`producer`] / [`consumer`]: the loader's and the trainer's API.
//! - [`gc`]: removal of segments whose loader died.
//! - [`sync`]: the one door to atomics, so that loom can model the handoff.
//!
//! This crate is all that `libringfeed` (ffi/) and so every trainer builds:
//! no tokio, no TLS, no object store client.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod consumer;
pub mod futex;
pub mod gc;
pub mod layout;
pub mod message;
pub mod name_tag;
pub mod observer;
pub mod outcome;
pub mod producer;
pub mod protocol;
pub mod resume;
pub mod safe_dir;
pub mod safe_file;
pub mod segment;
pub mod start;
pub mod sync;
pub mod tar_fields;
mod view;

pub use consumer::{
    AttachError, AttachOptions, BatchRef, Consumer, Next, NextError, ReleaseError, StartError,
    StartMode,
};
pub use layout::{Layout, RingGeometry};
pub use producer::{CreateError, Producer, PublishError, Reclaimed, SlotClaim};

/// One sample of a batch: where its bytes lie in the slot payload, and which
/// sample of the manifest it is. Same layout as `rf_sample` in the C header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleEntry {
    /// Offset of the sample's first byte from the start of the payload.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Index of the sample in the manifest.
    pub index: u64,
}
