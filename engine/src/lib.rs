//! ringfeed: one loader per machine feeds every training process through a
//! lock-free shared-memory ring of fixed-size batch slots.
//!
//! The data path, top to bottom (see docs/design.md):
//! `source` (where objects live, how they are listed) → `manifest` (which
//! samples exist) → `sampler` (which samples form rank r's batch at step s)
//! → `planner` (a batch's slot places and reads) → `reader` (bytes land in
//! slot memory) → `ring` (hand the slot to the trainer without a copy).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod cache;
pub mod cli;
pub mod home;
pub mod images;
pub mod loader;
pub mod manifest;
pub mod metrics;
pub mod pack;
pub mod planner;
pub mod reader;
pub mod remote;
pub use ringfeed_ring as ring;
pub mod sampler;
pub mod say;
pub mod source;
pub mod tar;
pub mod tokens;
