//! The manifest of a local directory: order, indexes, record mode, errors,
//! and a listing that does not depend on the thread count.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use ringfeed::manifest::{Manifest, ManifestError, ManifestOptions, ObjectNames, SampleLoc};
use ringfeed::source::LocalSource;

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

fn whole_files() -> ManifestOptions {
    ManifestOptions {
        record_bytes: None,
        threads: 4,
        progress: false,
    }
}

fn records_of(record_bytes: u64) -> ManifestOptions {
    ManifestOptions {
        record_bytes: Some(record_bytes),
        threads: 4,
        progress: false,
    }
}

fn rel_paths(manifest: &Manifest) -> Vec<String> {
    manifest
        .files()
        .iter()
        .map(|f| f.rel_path.to_str().unwrap().to_owned())
        .collect()
}

#[test]
fn files_are_listed_in_bytewise_order_of_their_relative_paths_across_nested_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for rel in [
        "a/b", "a.b", "A", "a-", "é", "z", "a/b.c/d", "a/b-", "B/x", "a0",
    ] {
        write(root, rel, rel.as_bytes());
    }
    // A link to a file is that file, under the link's own name.
    symlink(root.join("z"), root.join("a/link")).unwrap();
    // A link to a directory is not followed.
    symlink(root.join("B"), root.join("dirlink")).unwrap();

    let manifest = Manifest::build(root, &whole_files()).unwrap();

    // '-' 0x2D < '.' 0x2E < '/' 0x2F < '0' 0x30 < 'A' < 'B' < 'a' < 'z' < 'é' (0xC3 0xA9).
    let expected = [
        "A", "B/x", "a-", "a.b", "a/b", "a/b-", "a/b.c/d", "a/link", "a0", "z", "é",
    ];
    assert_eq!(rel_paths(&manifest), expected);
    assert_eq!(manifest.len(), expected.len() as u64);
    let link = manifest
        .files()
        .iter()
        .position(|f| f.rel_path == Path::new("a/link"))
        .unwrap();
    assert_eq!(
        manifest.files().size_bytes(link),
        1,
        "a link has its target's size"
    );
}

#[test]
fn a_sample_index_is_the_files_position_in_manifest_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b", b"bb");
    write(dir.path(), "a/x", b"x");
    write(dir.path(), "c", b"");
    write(dir.path(), "a/yyy", b"yyy");

    let manifest = Manifest::build(dir.path(), &whole_files()).unwrap();

    assert_eq!(rel_paths(&manifest), ["a/x", "a/yyy", "b", "c"]);
    assert_eq!(manifest.len(), 4);
    assert_eq!(
        manifest.sample(1),
        SampleLoc {
            file: 1,
            offset_bytes: 0,
            len_bytes: 3
        }
    );
    assert_eq!(
        LocalSource::at(dir.path()).object_name(manifest.files().path_bytes(2)),
        dir.path().join("b")
    );
    // The empty file is kept as a sample of length 0.
    assert_eq!(
        manifest.sample(3),
        SampleLoc {
            file: 3,
            offset_bytes: 0,
            len_bytes: 0
        }
    );
    assert_eq!(manifest.total_bytes(), 6);
    assert_eq!(manifest.max_sample_bytes(), 3);
    assert_eq!(manifest.largest_samples_total_bytes(2), 5);
    assert_eq!(manifest.record_bytes(), None);
}

#[test]
fn records_are_numbered_across_file_boundaries_in_manifest_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "shard-1", &[1; 12]); // records 0, 1, 2
    write(dir.path(), "shard-2", b""); // no record
    write(dir.path(), "shard-3", &[3; 4]); // record 3
    write(dir.path(), "shard-4/part", &[4; 8]); // records 4, 5

    let manifest = Manifest::build(dir.path(), &records_of(4)).unwrap();

    assert_eq!(manifest.len(), 6);
    let locs: Vec<(u32, u64)> = (0..6)
        .map(|i| manifest.sample(i))
        .map(|s| (s.file, s.offset_bytes))
        .collect();
    assert_eq!(locs, [(0, 0), (0, 4), (0, 8), (2, 0), (3, 0), (3, 4)]);
    assert!((0..6).all(|i| manifest.sample(i).len_bytes == 4));
    assert_eq!(manifest.max_sample_bytes(), 4);
    assert_eq!(manifest.largest_samples_total_bytes(3), 12);
    assert_eq!(manifest.total_bytes(), 24);
}

#[test]
fn a_file_that_is_not_whole_records_is_an_error_naming_it_its_size_and_the_record_size() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "good", &[0; 8]);
    write(dir.path(), "nested/bad.bin", &[0; 10]);

    let err = Manifest::build(dir.path(), &records_of(4)).unwrap_err();

    assert!(matches!(
        err,
        ManifestError::NotWholeRecords {
            size_bytes: 10,
            record_bytes: 4,
            ..
        }
    ));
    let message = err.to_string();
    assert!(
        message.contains(&dir.path().join("nested/bad.bin").display().to_string()),
        "{message}"
    );
    assert!(
        message.contains("10 bytes") && message.contains("--record-bytes 4"),
        "{message}"
    );
}

#[test]
fn a_missing_source_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");

    let err = Manifest::build(&missing, &whole_files()).unwrap_err();

    assert!(matches!(err, ManifestError::SourceMissing { .. }));
    assert!(err.to_string().contains(&missing.display().to_string()));
    assert!(err.to_string().contains("must name an existing directory"));
}

#[test]
fn a_source_that_is_a_file_is_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "file", b"x");

    let err = Manifest::build(&dir.path().join("file"), &whole_files()).unwrap_err();

    assert!(matches!(err, ManifestError::NotADirectory { .. }), "{err}");
}

#[test]
fn a_source_with_only_directories_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("a/b/c")).unwrap();

    let err = Manifest::build(dir.path(), &whole_files()).unwrap_err();

    assert!(matches!(err, ManifestError::Empty { .. }), "{err}");
    assert!(err.to_string().contains("no regular files"));
}

#[test]
fn a_dangling_link_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a", b"x");
    symlink(dir.path().join("gone"), dir.path().join("dangling")).unwrap();

    let err = Manifest::build(dir.path(), &whole_files()).unwrap_err();

    assert!(matches!(err, ManifestError::Metadata { .. }), "{err}");
    assert!(err.to_string().contains("dangling"), "{err}");
}

#[test]
fn zero_record_bytes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a", b"x");

    let err = Manifest::build(dir.path(), &records_of(0)).unwrap_err();

    assert!(matches!(err, ManifestError::ZeroRecordBytes));
}

#[test]
fn a_tree_of_20k_files_lists_the_same_with_1_thread_and_8_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected: Vec<PathBuf> = Vec::new();
    for top in 0..20 {
        for mid in 0..10 {
            let sub = dir.path().join(format!("d{top}/m{mid}"));
            fs::create_dir_all(&sub).unwrap();
            for leaf in 0..100 {
                let name = format!("f{leaf}");
                fs::write(sub.join(&name), [0u8; 3]).unwrap();
                expected.push(format!("d{top}/m{mid}/{name}").into());
            }
        }
    }
    expected.sort_by(|a, b| {
        a.as_os_str()
            .as_encoded_bytes()
            .cmp(b.as_os_str().as_encoded_bytes())
    });

    let one = Manifest::build(
        dir.path(),
        &ManifestOptions {
            threads: 1,
            ..whole_files()
        },
    )
    .unwrap();
    let eight = Manifest::build(
        dir.path(),
        &ManifestOptions {
            threads: 8,
            ..whole_files()
        },
    )
    .unwrap();

    assert_eq!(one.len(), 20_000);
    assert_eq!(one.files(), eight.files());
    let listed: Vec<&Path> = one.files().iter().map(|f| f.rel_path).collect();
    assert_eq!(
        listed,
        expected.iter().map(PathBuf::as_path).collect::<Vec<_>>()
    );
}

#[test]
fn a_flat_directory_of_many_files_and_links_is_stat_ed_in_chunks_by_every_thread_with_the_same_result(
) {
    // More names in one directory than one stat job holds (1024): the
    // listing hands chunks of them to the other threads.
    let dir = tempfile::tempdir().unwrap();
    let flat = dir.path().join("flat");
    fs::create_dir(&flat).unwrap();
    let mut expected: Vec<(String, u64)> = Vec::new();
    for i in 0..5000u64 {
        let name = format!("f{i:05}");
        fs::write(flat.join(&name), vec![7u8; (i % 13) as usize]).unwrap();
        expected.push((format!("flat/{name}"), i % 13));
    }
    for i in (0..5000u64).step_by(97) {
        // A link to a file is listed with the target's size; one to a
        // directory is left out.
        symlink(format!("f{i:05}"), flat.join(format!("l{i:05}"))).unwrap();
        expected.push((format!("flat/l{i:05}"), i % 13));
    }
    symlink(".", flat.join("loop")).unwrap();
    expected.sort();

    let list = |threads| {
        Manifest::build(
            dir.path(),
            &ManifestOptions {
                threads,
                ..whole_files()
            },
        )
        .unwrap()
    };
    let (one, four) = (list(1), list(4));
    assert_eq!(one.files(), four.files());
    let listed: Vec<(String, u64)> = four
        .files()
        .iter()
        .map(|f| (f.rel_path.to_str().unwrap().to_owned(), f.size_bytes))
        .collect();
    assert_eq!(listed, expected);
}
