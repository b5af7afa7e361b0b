//! The `ringfeed` command line.

pub mod cache;
pub mod demo;
pub mod gc;
pub mod pack;
pub mod run;
pub use crate::say;
pub mod serve;
mod serve_args;
mod serve_remote;
pub mod stat;
pub mod testing;
