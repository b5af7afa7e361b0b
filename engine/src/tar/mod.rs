//! Tar shards (WebDataset): how member names group into samples and the
//! sidecar index that lists a shard's members without reading its headers.
//! docs/shards.md describes the format, the grouping and the errors.

pub mod index;
pub mod name;

pub use index::{TarIndex, TarIndexError, TarMember};
pub use name::split_key;
