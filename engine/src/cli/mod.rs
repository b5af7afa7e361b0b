//! The `ringfeed` command line.

pub mod demo;
pub mod gc;
pub mod pack;
pub mod run;
pub mod say;
pub mod serve;
pub mod stat;
pub mod testing;
