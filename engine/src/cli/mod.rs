//! The `ringfeed` command line.

pub mod gc;
pub mod stat;
pub mod testing;
