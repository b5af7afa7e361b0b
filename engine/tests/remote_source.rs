//! A remote prefix as a source (`source::RemoteSource`) over object_store's
//! in-memory store: the same tree gives the same manifest as a local
//! directory, markers skipped, keys files honoured, errors named.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use ringfeed::manifest::{ManifestError, ManifestOptions};
use ringfeed::remote::{RemoteRuntime, StoreHandle};
use ringfeed::source::{build_manifest, LocalSource, RemoteSource, Source};

/// A tree whose byte-wise order is not a per-directory walk's.
const TREE: &[(&str, usize)] = &[
    ("a.b", 3),
    ("a/b", 5),
    ("a-", 0),
    ("Z", 7),
    ("d0/e1/f.bin", 4096),
    ("d0/e0/g.bin", 1),
    ("é", 2),
];

fn content(key: &str, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8) ^ (key.len() as u8)).collect()
}

fn options(record_bytes: Option<u64>) -> ManifestOptions {
    ManifestOptions {
        record_bytes,
        threads: 0,
        progress: false,
    }
}

/// The tree in a directory, and in an in-memory store under `set/` with
/// directory markers beside it.
fn both() -> (tempfile::TempDir, RemoteSource) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(RemoteRuntime::new(2).unwrap());
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    for &(key, len) in TREE {
        let path = dir.path().join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content(key, len)).unwrap();
        rt.block_on(mem.put(
            &Path::parse(format!("set/{key}")).unwrap(),
            PutPayload::from(content(key, len)),
        ))
        .unwrap();
    }
    // Markers as consoles make them (object_store strips the trailing '/'),
    // and a key beside the prefix that must not be listed.
    for marker in ["set/d0", "set/d0/e1"] {
        rt.block_on(mem.put(&Path::from(marker), PutPayload::from_static(b"")))
            .unwrap();
    }
    rt.block_on(mem.put(&Path::from("settle/x"), PutPayload::from_static(b"no")))
        .unwrap();
    let store = StoreHandle::from_store(mem, "set", "memory:///set/");
    (dir, RemoteSource::over(store, rt, None))
}

#[test]
fn a_prefix_gives_the_same_manifest_as_the_same_tree_in_a_directory() {
    let (dir, remote) = both();
    let local = build_manifest(&LocalSource::open(dir.path()).unwrap(), &options(None)).unwrap();
    let remote_manifest = build_manifest(&remote, &options(None)).unwrap();
    let keys = |m: &ringfeed::manifest::Manifest| {
        m.files()
            .iter()
            .map(|f| (f.rel_path.to_path_buf(), f.size_bytes))
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(&remote_manifest), keys(&local));
    assert_eq!(remote_manifest.digest(), local.digest());
    assert_eq!(remote_manifest.len(), TREE.len() as u64);
    // The fetch engine's table: the manifest's objects, in its order.
    let objects = remote.objects_for(remote_manifest.files());
    let listed: Vec<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(
        listed,
        ["Z", "a-", "a.b", "a/b", "d0/e0/g.bin", "d0/e1/f.bin", "é"]
    );
    assert!(objects.iter().all(|o| o.etag.is_some()), "{objects:?}");
}

#[test]
fn record_mode_over_objects_names_the_object_that_is_not_whole_records() {
    let (_dir, remote) = both();
    match build_manifest(&remote, &options(Some(2))) {
        Err(ManifestError::NotWholeRecords {
            path, size_bytes, ..
        }) => {
            assert_eq!(path, std::path::Path::new("memory:///set/Z"));
            assert_eq!(size_bytes, 7);
        }
        other => panic!("expected NotWholeRecords naming memory:///set/Z, got {other:?}"),
    }
}

#[test]
fn a_keys_file_lists_its_keys_in_byte_wise_order_and_heads_the_unsized() {
    let (dir, remote) = both();
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, "# chosen\nd0/e1/f.bin\na/b\t5\nZ\n").unwrap();
    let store = remote.store().clone();
    let from_keys = RemoteSource::over(store, Arc::clone(remote.runtime()), Some(&keys));
    let m = build_manifest(&from_keys, &options(None)).unwrap();
    let got: Vec<(String, u64)> = m
        .files()
        .iter()
        .map(|f| (f.rel_path.to_string_lossy().into_owned(), f.size_bytes))
        .collect();
    let want = [("Z", 7), ("a/b", 5), ("d0/e1/f.bin", 4096)];
    assert_eq!(got, want.map(|(k, s)| (k.to_owned(), s)));
}

#[test]
fn an_empty_prefix_is_an_error_that_names_it() {
    let rt = Arc::new(RemoteRuntime::new(1).unwrap());
    let store = StoreHandle::from_store(Arc::new(InMemory::new()), "none", "memory:///none/");
    let err = build_manifest(&RemoteSource::over(store, rt, None), &options(None)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("memory:///none/") && text.contains("no regular files"),
        "{text}"
    );
}

#[test]
fn a_prefix_listing_is_cached_under_its_url_and_a_keys_file_listing_never_is() {
    let (dir, remote) = both();
    // A prefix: its identity names the URL (and any endpoint variables set),
    // so the same bucket name on another server is another cache entry.
    let identity = remote.cache_identity().unwrap();
    let text = String::from_utf8(identity).unwrap();
    assert!(text.starts_with("memory:///set/"), "{text}");
    // A --keys listing is read from its file at every start.
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, "a\n").unwrap();
    let store = StoreHandle::from_store(Arc::new(InMemory::new()), "set", "memory:///set/");
    let from_keys = RemoteSource::over(store, Arc::clone(remote.runtime()), Some(&keys));
    let why = from_keys.cache_identity().unwrap_err();
    assert!(
        why.contains("--keys") && why.contains("every start"),
        "{why}"
    );
}
