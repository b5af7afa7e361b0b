//! One listing per job (`source::published`) over object_store's in-memory
//! store, nodes played by sources of their own over one store: node 0 lists
//! once and publishes, the others read without listing; a manifest changed
//! after it was published is refused by its hash; a restarted node 0 keeps
//! its job's manifest; the published objects are never samples. The same
//! against real servers, with processes as nodes: tests/python/test_job_manifest.py.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use ringfeed::manifest::ManifestOptions;
use ringfeed::remote::{RemoteRuntime, StoreHandle};
use ringfeed::source::published::{obtain, Place, PublishedError, Publishing, Role};
use ringfeed::source::{ManifestCache, RemoteSource};

/// The in-memory store, counting listings.
#[derive(Debug)]
struct Counting {
    inner: InMemory,
    lists: AtomicUsize,
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(l, o).await
    }
    async fn get_opts(&self, l: &Path, o: GetOptions) -> Result<GetResult> {
        self.inner.get_opts(l, o).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, o: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, o).await
    }
}

const OBJECTS: usize = 300;

struct World {
    store: Arc<Counting>,
    runtime: Arc<RemoteRuntime>,
    caches: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let runtime = Arc::new(RemoteRuntime::new(2).unwrap());
        let store = Arc::new(Counting {
            inner: InMemory::new(),
            lists: AtomicUsize::new(0),
        });
        for i in 0..OBJECTS {
            let path = Path::parse(format!("set/d{}/obj-{i:04}.bin", i % 7)).unwrap();
            runtime
                .block_on(store.put(&path, PutPayload::from(vec![i as u8; 10 + i])))
                .unwrap();
        }
        World {
            store,
            runtime,
            caches: tempfile::tempdir().unwrap(),
        }
    }

    /// A node: a source of its own over the shared store.
    fn node(&self) -> Arc<RemoteSource> {
        let handle = StoreHandle::from_store(
            Arc::clone(&self.store) as Arc<dyn ObjectStore>,
            "set",
            "memory:///set/",
        );
        Arc::new(RemoteSource::over(handle, Arc::clone(&self.runtime), None))
    }

    fn cache(&self, node: u32) -> ManifestCache {
        ManifestCache::at(self.caches.path().join(format!("node{node}")))
    }

    fn lists(&self) -> usize {
        self.store.lists.load(Ordering::SeqCst)
    }

    fn keys_under(&self, prefix: &str) -> Vec<String> {
        use futures::StreamExt;
        let prefix = Path::from(prefix);
        self.runtime.block_on(async {
            self.store
                .inner
                .list(Some(&prefix))
                .map(|m| m.unwrap().location.to_string())
                .collect()
                .await
        })
    }
}

fn publishing(role: Role, job: Option<&str>) -> Publishing {
    Publishing {
        place: Place::Beside,
        explicit: true,
        role,
        job: job.map(str::to_string),
        wait: Duration::from_secs(5),
        max_age: Duration::from_secs(3600),
        refresh: false,
    }
}

fn opts() -> ManifestOptions {
    ManifestOptions {
        record_bytes: None,
        threads: 0,
        progress: false,
    }
}

#[test]
fn node_0_lists_once_and_the_other_nodes_read_its_manifest_without_listing() {
    let w = World::new();
    let node0 = w.node();
    let got0 = obtain(
        &node0,
        &opts(),
        Some(&w.cache(0)),
        &publishing(Role::Publisher, Some("j1")),
    )
    .unwrap();
    assert_eq!(w.lists(), 1, "node 0 lists once");
    assert_eq!(got0.manifest.len(), OBJECTS as u64);
    for node in 1..4 {
        let got = obtain(
            &w.node(),
            &opts(),
            Some(&w.cache(node)),
            &publishing(Role::Reader, Some("j1")),
        )
        .unwrap();
        assert_eq!(got.manifest.digest(), got0.manifest.digest());
        assert!(got
            .words
            .unwrap()
            .contains("read from node 0's, for job j1"));
    }
    assert_eq!(w.lists(), 1, "the other nodes listed");
    let published = w.keys_under("set/.ringfeed");
    assert_eq!(published.len(), 3, "{published:?}");
}

#[test]
fn a_restarted_node_0_keeps_its_jobs_manifest_and_a_new_job_takes_the_young_latest() {
    let w = World::new();
    let first = obtain(
        &w.node(),
        &opts(),
        Some(&w.cache(0)),
        &publishing(Role::Publisher, Some("j1")),
    )
    .unwrap();
    // The dataset grows; node 0 of the same job restarts: the job's manifest stands.
    w.runtime
        .block_on(w.store.put(
            &Path::from("set/zz-new.bin"),
            PutPayload::from_static(b"new"),
        ))
        .unwrap();
    let again = obtain(
        &w.node(),
        &opts(),
        Some(&w.cache(9)),
        &publishing(Role::Publisher, Some("j1")),
    )
    .unwrap();
    assert_eq!(again.manifest.digest(), first.manifest.digest());
    assert!(again.words.unwrap().contains("node 0 restarted"));
    assert_eq!(w.lists(), 1);
    // A new job takes the latest listing while it is young (and lists it
    // again in the background, which the loader starts): no listing now.
    let next = obtain(
        &w.node(),
        &opts(),
        Some(&w.cache(8)),
        &publishing(Role::Publisher, Some("j2")),
    )
    .unwrap();
    assert_eq!(next.manifest.digest(), first.manifest.digest());
    assert!(next.published.unwrap().relist);
    assert_eq!(w.lists(), 1);
    let reader = obtain(
        &w.node(),
        &opts(),
        None,
        &publishing(Role::Reader, Some("j2")),
    )
    .unwrap();
    assert_eq!(reader.manifest.digest(), first.manifest.digest());
    // Asked to list afresh, node 0 sees the new object, and never the published ones.
    let mut fresh = publishing(Role::Publisher, Some("j3"));
    fresh.refresh = true;
    let listed = obtain(&w.node(), &opts(), Some(&w.cache(7)), &fresh).unwrap();
    assert_eq!(listed.manifest.len(), OBJECTS as u64 + 1);
    assert_eq!(w.lists(), 2);
}

#[test]
fn a_manifest_changed_after_it_was_published_is_refused_by_its_hash() {
    let w = World::new();
    obtain(
        &w.node(),
        &opts(),
        Some(&w.cache(0)),
        &publishing(Role::Publisher, Some("j1")),
    )
    .unwrap();
    let blob = w
        .keys_under("set/.ringfeed")
        .into_iter()
        .find(|k| k.ends_with(".rfm"))
        .unwrap();
    let path = Path::from(blob.as_str());
    let good = w
        .runtime
        .block_on(async { w.store.get(&path).await.unwrap().bytes().await.unwrap() });
    let mut bad = good.to_vec();
    let last = bad.len() - 10;
    bad[last] ^= 0x40;
    w.runtime
        .block_on(w.store.put(&path, PutPayload::from(bad)))
        .unwrap();
    let err = obtain(
        &w.node(),
        &opts(),
        None,
        &publishing(Role::Reader, Some("j1")),
    )
    .err()
    .expect("a tampered manifest was read");
    let text = err.to_string();
    assert!(matches!(err, PublishedError::Refused { .. }), "{text}");
    assert!(
        text.contains("hash to SHA-256") && text.contains("tampered, or a stale copy"),
        "{text}"
    );
    // Node 0 of a new job refuses it too, lists afresh and publishes it again.
    let lists = w.lists();
    let got = obtain(
        &w.node(),
        &opts(),
        Some(&w.cache(5)),
        &publishing(Role::Publisher, Some("j2")),
    )
    .unwrap();
    assert_eq!(w.lists(), lists + 1);
    assert_eq!(got.manifest.len(), OBJECTS as u64);
    let reread = w
        .runtime
        .block_on(async { w.store.get(&path).await.unwrap().bytes().await.unwrap() });
    assert_eq!(reread, good, "the manifest was not published again");
}

#[test]
fn a_reader_with_a_place_given_waits_for_node_0_then_fails_naming_it() {
    let w = World::new();
    let mut p = publishing(Role::Reader, Some("nobody"));
    p.wait = Duration::from_millis(600);
    let started = std::time::Instant::now();
    let err = obtain(&w.node(), &opts(), None, &p)
        .err()
        .expect("read a manifest nobody published");
    assert!(matches!(err, PublishedError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("node 0 did not publish"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(w.lists(), 0);
    // Left to auto, it lists itself instead.
    p.explicit = false;
    let got = obtain(&w.node(), &opts(), None, &p).unwrap();
    assert_eq!(got.manifest.len(), OBJECTS as u64);
    assert!(got.published.is_none());
    assert_eq!(w.lists(), 1);
}

#[test]
fn a_directory_place_holds_private_files_and_serves_the_readers() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let place = w.caches.path().join("shared").join("manifests");
    let mut p = publishing(Role::Publisher, Some("jd"));
    p.place = Place::Dir(place.clone());
    let got0 = obtain(&w.node(), &opts(), None, &p).unwrap();
    p.role = Role::Reader;
    let got1 = obtain(&w.node(), &opts(), None, &p).unwrap();
    assert_eq!(got0.manifest.digest(), got1.manifest.digest());
    assert_eq!(
        std::fs::metadata(&place).unwrap().permissions().mode() & 0o777,
        0o700
    );
    for entry in std::fs::read_dir(&place).unwrap() {
        let mode = entry.unwrap().metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    assert_eq!(w.lists(), 1);
}
