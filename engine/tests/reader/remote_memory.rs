//! The remote engine (`RemoteReadEngine` over `remote::FetchEngine`) in the
//! conformance suite, over object_store's in-memory store.
//!
//! The factory uploads the table's files, as they are when the engine is
//! opened, to an in-memory store, one object per file (key: its index), and
//! opens the remote engine over them with the table's recorded sizes. The
//! behaviours of the `changes` group change files on disk after that (or
//! expect local error variants: `Vanished`, `ChangedSize`, `Grew`,
//! `SizeAtOpen`); the store never sees those changes, so they are skipped
//! here, saying why. The remote engine's own checks of changed objects
//! (ETag, size, 404) are in engine/tests/remote_fetch.rs.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use ringfeed::reader::{FileTable, ReadEngine, ReaderConfig, RemoteReadEngine, REMOTE_BACKEND};
use ringfeed::remote::{FetchConfig, RemoteObject, RemoteRuntime, StoreHandle};

use crate::conformance::EngineFactory;

/// The remote engine over an in-memory copy of the files.
pub struct RemoteMemory;

impl EngineFactory for RemoteMemory {
    const BACKEND: &'static str = REMOTE_BACKEND;

    fn open(files: Arc<FileTable>, cfg: &ReaderConfig) -> Option<Box<dyn ReadEngine>> {
        let runtime = Arc::new(RemoteRuntime::new(2).expect("a runtime of 2 threads"));
        let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut objects = Vec::with_capacity(files.len());
        for i in 0..files.len() as u32 {
            let key = format!("{i:08}");
            // A file gone already is an object never uploaded: its reads 404.
            if let Some(content) = files.path(i).and_then(|p| std::fs::read(p).ok()) {
                runtime
                    .block_on(mem.put(&Path::from(format!("t/{key}")), PutPayload::from(content)))
                    .expect("a put into the in-memory store");
            }
            objects.push(RemoteObject {
                key,
                size: files.size_bytes(i).unwrap_or(0),
                etag: None,
            });
        }
        let store = StoreHandle::from_store(mem, "t", "memory:///t");
        let fetch = FetchConfig {
            window_max: (cfg.queue_depth as usize).max(8),
            window_initial: (cfg.queue_depth as usize).max(8),
            ..FetchConfig::default()
        };
        let engine = RemoteReadEngine::start(
            runtime,
            store,
            Arc::new(objects),
            fetch,
            cfg.queue_depth as usize,
        )
        .expect("the remote engine starts");
        Some(Box::new(engine))
    }

    fn skip(group: &str, behaviour: &str) -> Option<&'static str> {
        match (group, behaviour) {
            (
                "bytes",
                "reads_files_under_a_root_byte_exact_and_errors_name_the_full_path"
                | "read_longer_than_one_chunk_is_split",
            ) => Some(
                "its second half removes or appends to a file after the engine opened, and the \
                 in-memory copy does not change with it",
            ),
            ("changes", _) => Some(
                "files are copied into the in-memory store when the engine opens, so changes made \
                 on disk afterwards are not seen (remote_fetch.rs tests changed objects)",
            ),
            _ => None,
        }
    }
}
