//! The reader stack of a run, built in one place: what the loader reads
//! (`ReadTarget`: local files, or a remote prefix with its disk cache and
//! chunk layer) and the engine that reads it (`open_engine_for`: io_uring or
//! pread for files; the remote engine, under the data cache, under the chunk
//! layer, for objects). The readers and the cache know nothing of each other
//! above this room: `reader/` opens engines, `cache/` wraps one.

use std::sync::Arc;

use crate::cache::engine::with_cache;
use crate::cache::{CacheConfig, DataCache};
use crate::reader::chunked::{ChunkConfig, ChunkedEngine};
use crate::reader::{
    open_engine, FileTable, IoChoice, OpenedEngine, ReadError, ReaderConfig, RemoteReadEngine,
};
use crate::remote::{FetchConfig, RemoteObject, RemoteRuntime, StoreHandle};

/// What a loader reads: the files of a local directory, or the objects of
/// a remote prefix.
#[derive(Clone)]
pub enum ReadTarget {
    /// Local files, read by io_uring or pread.
    Files(Arc<FileTable>),
    /// Remote objects, read by the fetch engine.
    Remote(Box<RemoteTarget>),
    /// A mixture's corpora in several places: each target serves the
    /// objects from its first index (ascending, from 0) to the next's.
    Routed(Vec<(u32, ReadTarget)>),
}

/// The remote objects a loader reads, and how.
#[derive(Clone)]
pub struct RemoteTarget {
    /// The runtime the source listed on (its connection pool).
    pub runtime: Arc<RemoteRuntime>,
    /// The store and prefix.
    pub store: StoreHandle,
    /// The manifest's objects, in its order, with the listed ETags.
    pub objects: Arc<Vec<RemoteObject>>,
    /// Tuning of the fetch engine.
    pub fetch: FetchConfig,
    /// The disk data cache in front of the store, if any.
    pub cache: Option<CacheConfig>,
    /// Small reads served out of larger ranged reads (`reader::chunked`),
    /// if the order clusters its reads (the block order over shards).
    pub chunk: Option<ChunkConfig>,
}

impl std::fmt::Debug for ReadTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadTarget::Files(files) => f.debug_tuple("Files").field(&files.len()).finish(),
            ReadTarget::Remote(remote) => f
                .debug_struct("Remote")
                .field("store", &remote.store.display)
                .field("objects", &remote.objects.len())
                .finish(),
            ReadTarget::Routed(routes) => f.debug_tuple("Routed").field(routes).finish(),
        }
    }
}

impl ReadTarget {
    /// The local file table, if the target is one.
    pub fn files(&self) -> Option<&Arc<FileTable>> {
        match self {
            ReadTarget::Files(files) => Some(files),
            ReadTarget::Remote(_) | ReadTarget::Routed(_) => None,
        }
    }
}

/// Opens the engine for `target`: `open_engine` for local files (`choice`
/// picks the backend), the remote fetch engine for remote objects (where
/// `choice` must be `Auto`: `--io` names local backends).
pub fn open_engine_for(
    choice: IoChoice,
    target: &ReadTarget,
    cfg: &ReaderConfig,
) -> Result<OpenedEngine, ReadError> {
    match target {
        ReadTarget::Files(files) => open_engine(choice, Arc::clone(files), cfg),
        ReadTarget::Routed(routes) => {
            let mut engines = Vec::with_capacity(routes.len());
            let mut fallback_warning = None;
            for (first, target) in routes {
                // `--io` picks the local targets' backend; the remote ones
                // take theirs.
                let pick = match target {
                    ReadTarget::Files(_) => choice,
                    _ => IoChoice::Auto,
                };
                let opened = open_engine_for(pick, target, cfg)?;
                fallback_warning = fallback_warning.or(opened.fallback_warning);
                engines.push((*first, opened.engine));
            }
            Ok(OpenedEngine {
                engine: Box::new(crate::reader::routed::RoutedEngine::new(engines)),
                fallback_warning,
            })
        }
        ReadTarget::Remote(remote) => {
            let RemoteTarget {
                runtime,
                store,
                objects,
                fetch,
                cache,
                chunk,
            } = remote.as_ref();
            if choice != IoChoice::Auto {
                return Err(ReadError::InvalidConfig {
                    reason: format!(
                        "--io {choice} picks a reader of local files, and {} is remote (read by the remote engine); leave --io out",
                        store.display
                    ),
                });
            }
            cfg.validate()?;
            let engine = RemoteReadEngine::start(
                Arc::clone(runtime),
                store.clone(),
                Arc::clone(objects),
                fetch.clone(),
                cfg.queue_depth as usize,
            )?;
            // A cache that cannot be opened is a warning: the run reads remote.
            // Under the block order the chunk layer reads the same ranges
            // each epoch: the cache keeps them as entries of their own.
            let ranges = chunk.as_ref().map_or_else(Vec::new, |c| {
                let sizes: Vec<u64> = objects.iter().map(|o| o.size).collect();
                c.geometry.ranges(&sizes)
            });
            let cache = cache.as_ref().and_then(|c| {
                DataCache::open_with_ranges(c, &store.display, Arc::clone(objects), ranges)
                    .map_err(|e| {
                        tracing::warn!(
                            "{e}; reading everything from remote (fix it, or pass --cache off)"
                        )
                    })
                    .ok()
            });
            let mut engine = with_cache(engine, cache, cfg)?;
            if let Some(chunk) = chunk {
                let sizes = objects.iter().map(|o| o.size).collect();
                engine = Box::new(ChunkedEngine::new(engine, sizes, chunk.clone()));
            }
            Ok(OpenedEngine {
                engine,
                fallback_warning: None,
            })
        }
    }
}
