//! The manifest cache: a valid cache gives the same manifest as a listing,
//! and every change to the tree that a listing would see makes it miss.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::Duration;

use ringfeed::manifest::{Manifest, ManifestError, ManifestOptions, ManifestOrigin, ObjectNames};
use ringfeed::source::{LocalSource, ManifestCache, OpenedSource};

/// Longer than a file-system clock tick (at most 10 ms with HZ=100, or a
/// whole second on a file system without sub-second times): a change made
/// after it gets a different timestamp than one made before.
fn tick() -> Duration {
    static TICK: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let whole_seconds = (0..3).all(|i| {
            let path = dir.path().join(i.to_string());
            fs::write(&path, b"").unwrap();
            sleep(Duration::from_millis(7));
            fs::metadata(&path).unwrap().mtime_nsec() == 0
        });
        if whole_seconds {
            Duration::from_millis(1100)
        } else {
            Duration::from_millis(30)
        }
    })
}

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn opts(record_bytes: Option<u64>) -> ManifestOptions {
    ManifestOptions {
        record_bytes,
        threads: 2,
        progress: false,
    }
}

/// A cache that stores trees made a moment ago (the tests wait `TICK`
/// after each change instead of the default 2 s window).
fn cache_in(dir: &Path) -> ManifestCache {
    ManifestCache {
        racy_window: Duration::ZERO,
        ..ManifestCache::at(dir.join("manifests"))
    }
}

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for rel in ["a/x", "a/b/y", "a/b/c/z", "top"] {
        write(dir.path(), rel, rel.as_bytes());
    }
    sleep(tick());
    dir
}

fn build(root: &Path, cache: &ManifestCache) -> (Manifest, ManifestOrigin) {
    Manifest::build_cached(root, &opts(None), cache, false).unwrap()
}

/// As `build`, following links to files outside the tree
/// (`--follow-links-outside`).
fn build_following(root: &Path, cache: &ManifestCache) -> (Manifest, ManifestOrigin) {
    OpenedSource::Local(LocalSource::open(root).unwrap().follow_links_outside(true))
        .build_manifest_cached(&opts(None), cache, false)
        .unwrap()
}

fn rel_paths(m: &Manifest) -> Vec<String> {
    m.files()
        .iter()
        .map(|f| f.rel_path.to_str().unwrap().to_owned())
        .collect()
}

fn assert_listed(origin: &ManifestOrigin, miss_mentions: &str) {
    match origin {
        ManifestOrigin::Listed { cache_miss, .. } => assert!(
            cache_miss.contains(miss_mentions),
            "miss reason {cache_miss:?} does not mention {miss_mentions:?}"
        ),
        other => panic!("expected a listing, got {other:?}"),
    }
}

fn assert_cached(origin: &ManifestOrigin) {
    assert!(
        matches!(origin, ManifestOrigin::Cached { .. }),
        "expected the cache, got {origin:?}"
    );
}

/// A listing is stored, and the next build takes the same manifest from it.
fn listed_then_cached(root: &Path, cache: &ManifestCache) -> Manifest {
    let (listed, origin) = build(root, cache);
    match &origin {
        ManifestOrigin::Listed {
            path: Some(_),
            not_stored: None,
            ..
        } => {}
        other => panic!("expected a stored listing, got {other:?}"),
    }
    let (cached, origin) = build(root, cache);
    assert_cached(&origin);
    assert_eq!(cached.files(), listed.files());
    cached
}

/// After a listing that followed a change: the next build uses its store.
fn cached_again(root: &Path, cache: &ManifestCache) {
    sleep(tick());
    assert_cached(&build(root, cache).1);
}

#[test]
fn an_unchanged_tree_comes_from_the_cache_with_every_directory_checked() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    let (first, origin) = build(data.path(), &cache);
    assert_listed(&origin, "no cached manifest");
    let (second, origin) = build(data.path(), &cache);
    assert_eq!(
        origin,
        ManifestOrigin::Cached {
            path: cache.entry_path(&fs::canonicalize(data.path()).unwrap()),
            dirs_checked: 4,
            files_checked: 4
        }
    );
    assert_eq!(second.files(), first.files());
    assert_eq!(second.len(), 4);
    assert_eq!(second.total_bytes(), first.total_bytes());
}

#[test]
fn adding_removing_or_renaming_a_file_anywhere_in_the_tree_lists_again() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);

    write(data.path(), "a/b/c/new", b"n");
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "a/b/c changed");
    assert!(rel_paths(&m).contains(&"a/b/c/new".to_owned()));
    cached_again(data.path(), &cache);

    fs::remove_file(data.path().join("a/x")).unwrap();
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "changed");
    assert!(!rel_paths(&m).contains(&"a/x".to_owned()));
    cached_again(data.path(), &cache);

    fs::rename(data.path().join("a/b/y"), data.path().join("a/b/w")).unwrap();
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "a/b changed");
    assert_eq!(rel_paths(&m), ["a/b/c/new", "a/b/c/z", "a/b/w", "top"]);
}

#[test]
fn a_new_directory_is_seen_through_its_parent() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    write(data.path(), "a/b/c/d/e/deep", b"d");
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "a/b/c changed");
    assert!(rel_paths(&m).contains(&"a/b/c/d/e/deep".to_owned()));
}

#[test]
fn setting_a_directorys_mtime_back_does_not_hide_a_change() {
    // rsync -a and touch -d set mtime; ctime still moves.
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    let dir = data.path().join("a");
    let before = fs::metadata(&dir).unwrap();
    sleep(tick());
    write(data.path(), "a/sneaky", b"s");
    set_mtime(&dir, before.modified().unwrap());
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "changed");
    assert!(rel_paths(&m).contains(&"a/sneaky".to_owned()));
}

fn set_mtime(path: &Path, to: std::time::SystemTime) {
    let since = to.duration_since(std::time::UNIX_EPOCH).unwrap();
    let t = libc::timespec {
        tv_sec: since.as_secs() as libc::time_t,
        tv_nsec: since.subsec_nanos() as libc::c_long,
    };
    let times = [t, t];
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat: {}", std::io::Error::last_os_error());
}

#[test]
fn a_file_changed_in_place_is_seen_while_files_are_few_and_not_past_the_limit() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    // Same path, same inode, new size: no directory changes.
    fs::write(data.path().join("a/b/y"), b"a longer content").unwrap();
    let (m, origin) = build(data.path(), &cache);
    assert_listed(
        &origin,
        "a/b/y changed since it was listed (5 bytes then, 16 now)",
    );
    assert_eq!(m.files().size_bytes(1), 16);
    cached_again(data.path(), &cache);
    // Past stat_files_max only the directories are checked: the stale size
    // is what the readers then catch (ReadError::ChangedSize / Grew).
    let blind = ManifestCache {
        stat_files_max: 3,
        ..cache.clone()
    };
    fs::write(data.path().join("a/b/y"), b"short").unwrap();
    let (m, origin) = build(data.path(), &blind);
    assert!(
        matches!(
            origin,
            ManifestOrigin::Cached {
                files_checked: 0,
                ..
            }
        ),
        "{origin:?}"
    );
    assert_eq!(m.files().size_bytes(1), 16);
    assert!(blind
        .forget(&fs::canonicalize(data.path()).unwrap())
        .unwrap());
    let (m, origin) = build(data.path(), &blind);
    assert_listed(&origin, "no cached manifest");
    assert_eq!(m.files().size_bytes(1), 5);
}

#[test]
fn a_tree_changed_just_before_its_listing_is_not_stored() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ManifestCache::at(cache_dir.path().join("manifests"));
    let (_, origin) = build(data.path(), &cache);
    match origin {
        ManifestOrigin::Listed {
            not_stored: Some(why),
            ..
        } => assert!(
            why.contains("changed less than 2s before the listing began"),
            "{why}"
        ),
        other => panic!("expected no store, got {other:?}"),
    }
    let (_, origin) = build(data.path(), &cache);
    assert_listed(&origin, "no cached manifest");
}

#[test]
fn a_damaged_cache_file_is_a_miss_and_is_written_again() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    let file = cache.entry_path(&fs::canonicalize(data.path()).unwrap());
    let mut bytes = fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 1;
    fs::write(&file, &bytes).unwrap();
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "checksum does not match");
    assert_eq!(m.len(), 4);
    cached_again(data.path(), &cache);
    fs::write(&file, b"").unwrap();
    assert_listed(&build(data.path(), &cache).1, "too short");
}

#[test]
fn an_unwritable_cache_only_costs_the_listing() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    // A file where the cache directory should be.
    fs::write(cache_dir.path().join("manifests"), b"").unwrap();
    let cache = cache_in(cache_dir.path());
    let (m, origin) = build(data.path(), &cache);
    assert_eq!(m.len(), 4);
    match origin {
        ManifestOrigin::Listed {
            not_stored: Some(why),
            ..
        } => assert!(why.contains("cannot write in"), "{why}"),
        other => panic!("expected no store, got {other:?}"),
    }
}

#[test]
fn relist_lists_a_valid_cache_again_and_stores_it() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    let (_, origin) = Manifest::build_cached(data.path(), &opts(None), &cache, true).unwrap();
    assert!(
        matches!(&origin, ManifestOrigin::Listed { cache_miss, not_stored: None, .. } if cache_miss == "asked to list again"),
        "{origin:?}"
    );
}

#[test]
fn a_link_to_the_root_shares_the_cache_of_the_real_path() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    let real = listed_then_cached(data.path(), &cache);
    let link_dir = tempfile::tempdir().unwrap();
    let link = link_dir.path().join("dataset");
    symlink(data.path(), &link).unwrap();
    let (m, origin) = build(&link, &cache);
    assert_cached(&origin);
    // The manifest holds keys only: the root as given (for messages and
    // reads) is the source's, so one cached listing serves both paths.
    assert_eq!(m.files(), real.files());
    assert_eq!(
        LocalSource::at(&link).object_name(m.files().path_bytes(0)),
        link.join(m.files().path(0))
    );
}

#[test]
fn record_mode_over_a_cached_listing_checks_records_as_a_listing_does() {
    let data = tempfile::tempdir().unwrap();
    write(data.path(), "r0", &[0; 12]);
    write(data.path(), "r1", &[0; 10]);
    sleep(tick());
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    let (m, origin) = Manifest::build_cached(data.path(), &opts(Some(2)), &cache, false).unwrap();
    assert_cached(&origin);
    assert_eq!(m.len(), 11);
    let err = Manifest::build_cached(data.path(), &opts(Some(4)), &cache, false).unwrap_err();
    assert!(
        matches!(&err, ManifestError::NotWholeRecords { path, .. } if path.ends_with("r1")),
        "{err}"
    );
}

#[test]
fn cached_sizes_that_do_not_make_records_are_listed_again_not_reported() {
    // Past stat_files_max a file rewritten in place keeps its cached size;
    // if that size is what breaks the records, a listing decides.
    let data = tempfile::tempdir().unwrap();
    write(data.path(), "r0", &[0; 12]);
    write(data.path(), "r1", &[0; 10]);
    sleep(tick());
    let cache_dir = tempfile::tempdir().unwrap();
    let blind = ManifestCache {
        stat_files_max: 0,
        ..cache_in(cache_dir.path())
    };
    listed_then_cached(data.path(), &blind);
    fs::write(data.path().join("r1"), [0; 12]).unwrap();
    let (m, origin) = Manifest::build_cached(data.path(), &opts(Some(4)), &blind, false).unwrap();
    assert_listed(&origin, "the cached files do not make a manifest");
    assert_eq!(m.len(), 6);
}

#[test]
fn a_link_whose_target_outside_the_tree_changes_is_seen() {
    let outside = tempfile::tempdir().unwrap();
    fs::create_dir(outside.path().join("d")).unwrap();
    fs::write(outside.path().join("f"), b"1234").unwrap();
    let data = tree();
    symlink(outside.path().join("d"), data.path().join("to_dir")).unwrap();
    symlink(outside.path().join("f"), data.path().join("to_file")).unwrap();
    sleep(tick());
    let cache_dir = tempfile::tempdir().unwrap();
    // Files are not checked one by one: only the links are.
    let cache = ManifestCache {
        stat_files_max: 0,
        ..cache_in(cache_dir.path())
    };
    let (listed, _) = build_following(data.path(), &cache);
    let (m, origin) = build_following(data.path(), &cache);
    assert_cached(&origin);
    assert_eq!(m.files(), listed.files());
    assert!(!rel_paths(&m).contains(&"to_dir".to_owned()));
    assert!(rel_paths(&m).contains(&"to_file".to_owned()));

    // The directory a link pointed to becomes a file: the link is a sample now.
    fs::remove_dir(outside.path().join("d")).unwrap();
    fs::write(outside.path().join("d"), b"now a file").unwrap();
    let (m, origin) = build_following(data.path(), &cache);
    assert_listed(&origin, "the target of link");
    assert!(rel_paths(&m).contains(&"to_dir".to_owned()));
    sleep(tick());
    assert_cached(&build_following(data.path(), &cache).1);

    // The file a link points to is replaced by a larger one.
    fs::write(outside.path().join("f2"), b"123456789").unwrap();
    fs::rename(outside.path().join("f2"), outside.path().join("f")).unwrap();
    let (m, origin) = build_following(data.path(), &cache);
    assert_listed(&origin, "to_file");
    let to_file = m
        .files()
        .iter()
        .find(|f| f.rel_path == Path::new("to_file"))
        .unwrap();
    assert_eq!(to_file.size_bytes, 9);
}

#[test]
fn a_link_to_a_file_outside_the_tree_is_left_out_and_the_cache_knows_it() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"not yours").unwrap();
    let data = tree();
    symlink(outside.path().join("secret"), data.path().join("leak")).unwrap();
    symlink(data.path().join("top"), data.path().join("inside")).unwrap();
    sleep(tick());
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ManifestCache {
        stat_files_max: 0,
        ..cache_in(cache_dir.path())
    };
    let m = listed_then_cached(data.path(), &cache);
    assert!(!rel_paths(&m).contains(&"leak".to_owned()));
    assert!(rel_paths(&m).contains(&"inside".to_owned()));
    // Asked for: listed, and a cache of the other kind is not taken as is.
    let (m, origin) = build_following(data.path(), &cache);
    assert_listed(&origin, "leak");
    assert!(rel_paths(&m).contains(&"leak".to_owned()));
    sleep(tick());
    // Back to the default: the followed link is out again.
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "leak");
    assert!(!rel_paths(&m).contains(&"leak".to_owned()));
    cached_again(data.path(), &cache);
    // The link's target moves into the tree (same size): now listed.
    fs::write(data.path().join("a/secret"), b"not yours").unwrap();
    sleep(tick());
    fs::remove_file(outside.path().join("secret")).unwrap();
    symlink(outside.path().join("gone"), outside.path().join("secret")).unwrap();
    fs::remove_file(outside.path().join("secret")).unwrap();
    symlink(data.path().join("a/secret"), outside.path().join("secret")).unwrap();
    let (m, origin) = build(data.path(), &cache);
    assert_listed(&origin, "");
    assert!(rel_paths(&m).contains(&"leak".to_owned()));
}

#[test]
fn a_root_replaced_by_a_copy_with_the_same_times_is_seen_by_its_inode() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("data");
    write(&root, "a/x", b"x");
    sleep(tick());
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(&root, &cache);
    // `cp -a` keeps mtimes; the copy holds one more file.
    let copy = parent.path().join("copy");
    write(&copy, "a/x", b"x");
    write(&copy, "a/y", b"y");
    fs::rename(&root, parent.path().join("old")).unwrap();
    fs::rename(&copy, &root).unwrap();
    let (m, origin) = build(&root, &cache);
    assert_listed(&origin, "changed since it was listed (inode");
    assert_eq!(rel_paths(&m), ["a/x", "a/y"]);
}

#[test]
fn a_directory_with_a_future_mtime_is_still_cached() {
    // Archives unpacked from a machine with a skewed clock: only ctime
    // tells when the directory last changed here.
    let data = tree();
    set_mtime(
        &data.path().join("a"),
        std::time::SystemTime::now() + Duration::from_secs(3 * 3600),
    );
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ManifestCache {
        racy_window: Duration::from_millis(1),
        ..cache_in(cache_dir.path())
    };
    sleep(tick());
    listed_then_cached(data.path(), &cache);
}

#[test]
fn loaders_storing_the_same_directory_at_once_all_succeed() {
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..20)
                        .map(|_| {
                            Manifest::build_cached(data.path(), &opts(None), &cache, true)
                                .unwrap()
                                .1
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for origin in handles.into_iter().flat_map(|h| h.join().unwrap()) {
            assert!(
                matches!(
                    origin,
                    ManifestOrigin::Listed {
                        not_stored: None,
                        ..
                    }
                ),
                "{origin:?}"
            );
        }
    });
    assert_cached(&build(data.path(), &cache).1);
    let leftovers: Vec<_> = fs::read_dir(&cache.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
}

#[test]
fn a_missing_source_is_still_named_before_any_cache_lookup() {
    let cache_dir = tempfile::tempdir().unwrap();
    let missing = PathBuf::from("/nonexistent/ringfeed-dataset");
    let err = Manifest::build_cached(&missing, &opts(None), &cache_in(cache_dir.path()), false)
        .unwrap_err();
    assert!(matches!(err, ManifestError::SourceMissing { .. }), "{err}");
}

// Issue 32: the manifests directory was used whoever owned it and whoever
// could write to it (only its files were checked); it now follows the data
// cache's rule.
#[test]
fn a_manifests_directory_another_user_may_write_to_is_neither_read_nor_written() {
    use std::os::unix::fs::PermissionsExt;
    let data = tree();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_in(cache_dir.path());
    listed_then_cached(data.path(), &cache);
    fs::set_permissions(cache_dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let (m, origin) = build(data.path(), &cache);
    assert_eq!(m.len(), 4);
    assert_listed(&origin, "writable by every user and not sticky");
    match origin {
        ManifestOrigin::Listed {
            not_stored: Some(why),
            ..
        } => assert!(why.contains("not sticky"), "{why}"),
        other => panic!("expected no store, got {other:?}"),
    }
    // Ours again: listed (the refused run removed its entry, as any listing
    // it could not store does), stored, then taken from the cache.
    fs::set_permissions(cache_dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    listed_then_cached(data.path(), &cache);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(cache_dir.path().join("manifests"), Some(65534), Some(65534))
            .unwrap();
        assert_listed(&build(data.path(), &cache).1, "uid 65534");
    }
}
