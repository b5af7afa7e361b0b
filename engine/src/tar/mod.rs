//! Tar shards (WebDataset) as a source format: how member names group into
//! samples, the sidecar index that lists a shard's members without reading
//! its headers, the header parser, and the indexing of a listing's shards
//! (local or remote, through an index cache) into a ranges-mode manifest.
//! docs/shards.md describes the format, the grouping and the errors.

pub mod cache;
pub mod facts;
pub mod group;
pub mod index;
pub mod local;
pub mod name;
pub mod remote;
pub mod scan;
pub mod shards;

pub use cache::IndexCache;
pub use index::{TarIndex, TarIndexError, TarMember};
pub use name::split_key;
pub use shards::{is_tar_listing, tar_manifest};
