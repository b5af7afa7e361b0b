//! What surrounds the engines and is the same for all: the `--io` words,
//! the file table's checks, and the limits of `ReaderConfig`.

use std::path::PathBuf;

use ringfeed::reader::{open_engine, FileTable, IoChoice, ReadError, ReaderConfig};

use crate::support::table;

#[test]
fn io_choice_parses_the_command_line_words() {
    assert_eq!("auto".parse::<IoChoice>().unwrap(), IoChoice::Auto);
    assert_eq!("uring".parse::<IoChoice>().unwrap(), IoChoice::Uring);
    assert_eq!("io_uring".parse::<IoChoice>().unwrap(), IoChoice::Uring);
    assert_eq!("pread".parse::<IoChoice>().unwrap(), IoChoice::Pread);
    let e = "mmap".parse::<IoChoice>().unwrap_err().to_string();
    assert!(
        e.contains("mmap") && e.contains("auto, uring or pread"),
        "{e}"
    );
    assert_eq!(IoChoice::Uring.to_string(), "uring");
}

#[test]
fn file_table_refuses_relative_paths_and_mismatched_sizes() {
    let relative = FileTable::new(vec![PathBuf::from("data/a.bin")], vec![1], false);
    assert!(matches!(relative, Err(ReadError::InvalidFileTable { .. })));
    let mismatched = FileTable::new(
        vec![PathBuf::from("/a"), PathBuf::from("/b")],
        vec![1],
        false,
    );
    assert!(matches!(
        mismatched,
        Err(ReadError::InvalidFileTable { .. })
    ));
    let ok = FileTable::new(vec![PathBuf::from("/a")], vec![5], true).unwrap();
    assert_eq!(
        (ok.len(), ok.size_bytes(0), ok.path(0), ok.keep_open()),
        (1, Some(5), Some(PathBuf::from("/a")), true)
    );
}

#[test]
fn config_out_of_its_limits_is_refused() {
    let paths = vec![PathBuf::from("/ringfeed-test-unused")];
    for cfg in [
        ReaderConfig {
            queue_depth: 0,
            ..ReaderConfig::default()
        },
        ReaderConfig {
            queue_depth: 1 << 20,
            ..ReaderConfig::default()
        },
        ReaderConfig {
            pread_threads: 0,
            ..ReaderConfig::default()
        },
    ] {
        let result = open_engine(IoChoice::Pread, table(&paths, &[1], false), &cfg);
        assert!(
            matches!(result, Err(ReadError::InvalidConfig { .. })),
            "{cfg:?}"
        );
    }
}

#[test]
fn a_table_under_a_root_refuses_bad_paths_and_a_missing_root() {
    let dir = tempfile::tempdir().unwrap();
    let bad = |rels: &[&[u8]]| {
        let e = FileTable::under_root(dir.path(), rels.iter().copied(), vec![1; rels.len()], false)
            .unwrap_err();
        assert!(matches!(e, ReadError::InvalidFileTable { .. }), "{e:?}");
        e.to_string()
    };
    assert!(bad(&[b"/etc/passwd"]).contains("not a path relative to"));
    assert!(bad(&[b""]).contains("not a path relative to"));
    assert!(bad(&[b"a\0b"]).contains("NUL"));
    let e = FileTable::under_root(dir.path(), [b"a".as_slice()].into_iter(), vec![1, 2], false)
        .unwrap_err();
    assert!(e.to_string().contains("1 paths but 2 sizes"), "{e}");
    let missing = dir.path().join("not-there");
    let e =
        FileTable::under_root(&missing, std::iter::empty::<&[u8]>(), vec![], false).unwrap_err();
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
}
