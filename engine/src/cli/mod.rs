//! The `ringfeed` command line.

pub mod cache;
mod decode_args;
pub mod demo;
pub mod gc;
pub mod job_manifest_args;
pub mod ls;
pub mod manifest;
mod max_age;
pub mod pack;
pub mod progress;
pub mod run;
pub use crate::say;
pub mod serve;
mod serve_args;
pub mod stat;
pub mod testing;
mod token_args;
