//! Tar shards made by real tools (GNU tar in gnu and posix formats, Python's
//! tarfile), indexed from their headers, from sidecars and from the index
//! cache; malformed shards crafted from real ones are errors naming the
//! shard and the byte offset.

use std::path::{Path, PathBuf};
use std::process::Command;

use ringfeed::manifest::{Manifest, ManifestError, ManifestOptions};
use ringfeed::source::SourceSpec;
use ringfeed::tar::local::scan_file;
use ringfeed::tar::scan::{scan_bytes, Fault};
use ringfeed::tar::{tar_manifest, IndexCache, TarIndex};

const LONG_DIR: &str = "a-directory-name-long-enough-that-the-whole-path-passes-one-hundred-bytes/and-more/and-more-again";

/// The files of a small WebDataset: two fields per sample, nested keys, a
/// path past 100 bytes, an empty member.
fn dataset(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        ("000000.jpg".to_string(), b"jpeg bytes 0".repeat(100)),
        ("000000.cls".to_string(), b"7".to_vec()),
        ("000001.jpg".to_string(), vec![0xff; 513]),
        ("000001.cls".to_string(), Vec::new()),
        ("sub/dir/000002.seg.png".to_string(), (0..=255u8).collect()),
        ("sub/dir/000002.json".to_string(), br#"{"k": 2}"#.to_vec()),
        (format!("{LONG_DIR}/000003.txt"), b"long name".to_vec()),
    ];
    files.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, bytes) in &files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    files
}

/// A shard of `files` (relative to `src`) made by GNU tar in `format`.
fn gnu_tar(src: &Path, files: &[(String, Vec<u8>)], format: &str, out: &Path) {
    let status = Command::new("tar")
        .arg(format!("--format={format}"))
        .args(["--no-recursion", "-cf"])
        .arg(out)
        .arg("-C")
        .arg(src)
        .args(files.iter().map(|(n, _)| n))
        .status()
        .expect("GNU tar runs");
    assert!(status.success());
}

fn python_tar(src: &Path, files: &[(String, Vec<u8>)], format: &str, out: &Path) {
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let script = format!(
        "import tarfile, os, sys\nos.chdir({src:?})\nwith tarfile.open({out:?}, 'w', format=tarfile.{format}) as t:\n    for n in {names:?}: t.add(n, recursive=False)\n",
        src = src.to_str().unwrap(),
        out = out.to_str().unwrap(),
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .status()
        .expect("python3 runs");
    assert!(status.success());
}

fn check_members(shard: &Path, files: &[(String, Vec<u8>)]) -> TarIndex {
    let bytes = std::fs::read(shard).unwrap();
    let index = scan_file(shard, bytes.len() as u64).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(index, scan_bytes(&bytes).unwrap());
    let names: Vec<String> = index
        .members
        .iter()
        .map(|m| String::from_utf8(m.name.clone()).unwrap())
        .collect();
    let expected: Vec<&String> = files.iter().map(|(n, _)| n).collect();
    assert_eq!(
        names.iter().collect::<Vec<_>>(),
        expected,
        "{}",
        shard.display()
    );
    for (m, (_, content)) in index.members.iter().zip(files) {
        let data = &bytes[m.data_offset as usize..m.data_end() as usize];
        assert_eq!(data, &content[..], "{}", String::from_utf8_lossy(&m.name));
    }
    index
}

#[test]
fn shards_from_gnu_tar_and_python_tarfile_list_every_member_with_its_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = dataset(&src);
    for format in ["gnu", "posix", "ustar"] {
        let shard = tmp.path().join(format!("gnu-{format}.tar"));
        gnu_tar(&src, &files, format, &shard);
        check_members(&shard, &files);
    }
    for format in ["GNU_FORMAT", "PAX_FORMAT", "USTAR_FORMAT"] {
        let shard = tmp.path().join(format!("py-{format}.tar"));
        python_tar(&src, &files, format, &shard);
        check_members(&shard, &files);
    }
}

fn local_manifest(dir: &Path, cache: Option<&IndexCache>) -> Result<Manifest, ManifestError> {
    let source = SourceSpec::Local(dir.to_path_buf()).open()?;
    let listed = source.build_manifest(&ManifestOptions::default())?;
    tar_manifest(&source, &listed, cache)
}

fn sample_bytes(dir: &Path, m: &Manifest, i: u64) -> Vec<u8> {
    let loc = m.sample(i);
    let bytes = std::fs::read(
        dir.join(std::str::from_utf8(m.files().path_bytes(loc.file as usize)).unwrap()),
    )
    .unwrap();
    bytes[loc.offset_bytes as usize..(loc.offset_bytes + loc.len_bytes) as usize].to_vec()
}

#[test]
fn consecutive_members_sharing_a_key_are_one_sample_whose_bytes_are_the_raw_tar_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let files = dataset(&src);
    let shards = tmp.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    gnu_tar(&src, &files, "gnu", &shards.join("a.tar"));
    python_tar(&src, &files[..2], "PAX_FORMAT", &shards.join("b.tar"));
    let m = local_manifest(&shards, None).unwrap();
    // a.tar: 000000, 000001, a-directory.../000003, sub/dir/000002; b.tar: 000000.
    assert_eq!(m.len(), 5);
    assert_eq!(m.files().len(), 2);
    let a = std::fs::read(shards.join("a.tar")).unwrap();
    let index = scan_bytes(&a).unwrap();
    let first = m.sample(0);
    assert_eq!((first.file, first.offset_bytes), (0, 0));
    // To the end of its last member's data, padded to a 512-byte block, so
    // the next sample starts right after it.
    assert_eq!(
        first.len_bytes,
        index.members[1].data_end().div_ceil(512) * 512
    );
    assert_eq!(first.len_bytes, m.sample(1).offset_bytes);
    // The long-name sample starts at its GNU long-name header, not at its ustar one.
    let long = m.sample(2);
    assert_eq!(long.offset_bytes, index.members[4].header_offset);
    assert!(index.members[4].data_offset - index.members[4].header_offset > 512);
    let long_end = (index.members[4].data_end() - long.offset_bytes) as usize;
    assert_eq!(long.len_bytes as usize, long_end.div_ceil(512) * 512);
    let long_bytes = sample_bytes(&shards, &m, 2);
    assert_eq!(&long_bytes[long_end - 9..long_end], b"long name");
    assert!(long_bytes[long_end..].iter().all(|&b| b == 0));
    assert_eq!(m.sample(4).file, 1);
    assert_eq!(
        m.max_sample_bytes(),
        (0..5).map(|i| m.sample(i).len_bytes).max().unwrap()
    );
    assert_eq!(
        m.total_bytes(),
        (0..5).map(|i| m.sample(i).len_bytes).sum::<u64>()
    );
    assert_eq!(m.largest_samples_total_bytes(2), {
        let mut lens: Vec<u64> = (0..5).map(|i| m.sample(i).len_bytes).collect();
        lens.sort_unstable();
        lens[3] + lens[4]
    });
}

/// A shard of the dataset and its bytes, for crafting faults.
fn good_shard(tmp: &Path) -> (PathBuf, Vec<u8>, TarIndex) {
    let src = tmp.join("src");
    let files = dataset(&src);
    let shards = tmp.join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    let shard = shards.join("s.tar");
    gnu_tar(&src, &files, "gnu", &shard);
    let bytes = std::fs::read(&shard).unwrap();
    let index = scan_bytes(&bytes).unwrap();
    (shard, bytes, index)
}

fn error_of(shards: &Path) -> String {
    match local_manifest(shards, None) {
        Err(ManifestError::Shard(msg)) => msg,
        other => panic!("expected a shard error, got {other:?}"),
    }
}

#[test]
fn a_shard_cut_inside_a_members_data_is_an_error_naming_the_shard_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, bytes, index) = good_shard(tmp.path());
    let m = &index.members[3]; // 000001.jpg, 513 bytes
    assert!(m.name.ends_with(b"000001.jpg"));
    std::fs::write(&shard, &bytes[..m.data_offset as usize + 100]).unwrap();
    let msg = error_of(shard.parent().unwrap());
    assert!(msg.contains(&shard.display().to_string()), "{msg}");
    assert!(
        msg.contains(&format!("at byte {}", m.data_offset - 512)),
        "{msg}"
    );
    assert!(
        msg.contains("000001.jpg") && msg.contains("truncated"),
        "{msg}"
    );
}

#[test]
fn a_shard_cut_inside_a_header_is_an_error_naming_the_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, bytes, index) = good_shard(tmp.path());
    let at = index.members[3].header_offset as usize;
    std::fs::write(&shard, &bytes[..at + 200]).unwrap();
    let err = scan_bytes(&bytes[..at + 200]).unwrap_err();
    assert_eq!(err.offset, at as u64);
    assert!(
        matches!(err.fault, Fault::TruncatedHeader { .. }),
        "{err:?}"
    );
    let msg = error_of(shard.parent().unwrap());
    assert!(
        msg.contains(&format!("at byte {at}")) && msg.contains("inside a header"),
        "{msg}"
    );
}

#[test]
fn a_header_with_a_bad_checksum_is_an_error_at_that_header() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, mut bytes, index) = good_shard(tmp.path());
    let at = index.members[1].header_offset as usize;
    bytes[at] ^= 0x01; // one bit of the name
    std::fs::write(&shard, &bytes).unwrap();
    let err = scan_bytes(&bytes).unwrap_err();
    assert_eq!(err.offset, at as u64);
    assert!(matches!(err.fault, Fault::BadChecksum { .. }), "{err:?}");
    let msg = error_of(shard.parent().unwrap());
    assert!(
        msg.contains(&format!("at byte {at}")) && msg.contains("checksum"),
        "{msg}"
    );
}

/// Sets a header's octal size field and fixes its checksum, as a tool that
/// wrote a wrong size would.
fn set_size(header: &mut [u8], size: u64) {
    let field = format!("{size:011o}\0");
    header[124..136].copy_from_slice(field.as_bytes());
    header[148..156].copy_from_slice(b"        ");
    let sum: u64 = header[..512].iter().map(|&b| u64::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

#[test]
fn a_member_larger_than_its_shard_is_an_error_at_its_header() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, mut bytes, index) = good_shard(tmp.path());
    let at = index.members[2].header_offset as usize;
    let len = bytes.len() as u64;
    set_size(&mut bytes[at..at + 512], len * 2);
    std::fs::write(&shard, &bytes).unwrap();
    let err = scan_bytes(&bytes).unwrap_err();
    assert_eq!(err.offset, at as u64);
    assert!(
        matches!(err.fault, Fault::LargerThanShard { .. }),
        "{err:?}"
    );
    let msg = error_of(shard.parent().unwrap());
    assert!(
        msg.contains("larger than the whole shard") && msg.contains(&format!("at byte {at}")),
        "{msg}"
    );
}

#[test]
fn a_member_whose_size_runs_past_the_end_is_an_error_at_its_header() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, mut bytes, index) = good_shard(tmp.path());
    let m = &index.members[6];
    let at = m.header_offset as usize;
    let past = bytes.len() as u64 - m.data_offset + 1;
    set_size(&mut bytes[at..at + 512], past);
    let err = scan_bytes(&bytes).unwrap_err();
    assert_eq!(err.offset, at as u64);
    assert!(
        matches!(err.fault, Fault::TruncatedMember { .. }),
        "{err:?}"
    );
}

#[test]
fn two_members_of_one_sample_with_the_same_extension_are_an_error_at_the_second() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("x")).unwrap();
    std::fs::write(src.join("000001.jpg"), b"one").unwrap();
    std::fs::write(src.join("x/000001.jpg"), b"other key").unwrap();
    std::fs::write(src.join("000002.jpg"), b"a").unwrap();
    std::fs::write(src.join("000002.cls"), b"b").unwrap();
    let shards = tmp.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let shard = shards.join("dup.tar");
    // Python's tarfile writes what it is told: 000002.jpg twice, two files.
    let script = format!(
        "import tarfile, os\nos.chdir({src:?})\nwith tarfile.open({out:?}, 'w') as t:\n    for n, a in [('000001.jpg', '000001.jpg'), ('x/000001.jpg', 'x/000001.jpg'), ('000002.jpg', '000002.jpg'), ('000002.cls', '000002.cls'), ('000001.jpg', '000002.jpg')]: t.add(n, arcname=a)\n",
        src = src.to_str().unwrap(),
        out = shard.to_str().unwrap(),
    );
    assert!(Command::new("python3")
        .args(["-c", &script])
        .status()
        .unwrap()
        .success());
    let index = scan_bytes(&std::fs::read(&shard).unwrap()).unwrap();
    let msg = error_of(&shards);
    assert!(
        msg.contains("dup.tar") && msg.contains("repeats extension \"jpg\""),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("at byte {}", index.members[4].header_offset)),
        "{msg}"
    );
}

#[test]
fn a_valid_sidecar_is_used_and_a_stale_one_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, bytes, mut index) = good_shard(tmp.path());
    let shards = shard.parent().unwrap();
    let sidecar = shards.join("s.tar.idx");
    // A sidecar listing only the first sample's members: a manifest of one
    // sample proves it was read instead of the headers.
    index.members.truncate(2);
    let mut out = Vec::new();
    index.write(&mut out).unwrap();
    std::fs::write(&sidecar, &out).unwrap();
    assert_eq!(local_manifest(shards, None).unwrap().len(), 1);
    // The same sidecar for a shard of another size: ignored, headers read.
    index.shard_bytes = bytes.len() as u64 + 512;
    let mut out = Vec::new();
    index.write(&mut out).unwrap();
    std::fs::write(&sidecar, &out).unwrap();
    assert_eq!(local_manifest(shards, None).unwrap().len(), 4);
    // A sidecar with a damaged byte: ignored.
    std::fs::write(
        &sidecar,
        b"ringfeed-tar-index 1\nshard_bytes 3\nend 0 00000000\n",
    )
    .unwrap();
    assert_eq!(local_manifest(shards, None).unwrap().len(), 4);
}

#[test]
fn the_index_cache_serves_the_next_start_and_a_changed_shard_is_indexed_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, bytes, _) = good_shard(tmp.path());
    let shards = shard.parent().unwrap();
    let cache = IndexCache::beside(&tmp.path().join("cache/manifests"));
    let first = local_manifest(shards, Some(&cache)).unwrap();
    let kept: Vec<_> = std::fs::read_dir(tmp.path().join("cache/tar-index"))
        .unwrap()
        .collect();
    assert_eq!(kept.len(), 1);
    let kept = kept.into_iter().next().unwrap().unwrap().path();
    // Replace the kept index with one of a single sample: the next start
    // must take it from the cache, not from the headers.
    let mut index = scan_bytes(&bytes).unwrap();
    index.members.truncate(2);
    let mut out = Vec::new();
    index.write(&mut out).unwrap();
    std::fs::write(&kept, &out).unwrap();
    assert_eq!(local_manifest(shards, Some(&cache)).unwrap().len(), 1);
    // A corrupt cache file is a miss.
    std::fs::write(&kept, b"garbage").unwrap();
    assert_eq!(
        local_manifest(shards, Some(&cache)).unwrap().len(),
        first.len()
    );
    // A shard rewritten (new mtime/inode) is another identity: indexed again.
    std::fs::write(&kept, &out).unwrap();
    std::fs::remove_file(&shard).unwrap();
    std::fs::write(&shard, &bytes).unwrap();
    assert_eq!(
        local_manifest(shards, Some(&cache)).unwrap().len(),
        first.len()
    );
}

/// A bad shard among many indexed on several threads stops the others and
/// is the one named. (The story: remote indexing stops at the first failure
/// while earlier shards may still be in flight, and the manifest then named
/// an earlier shard as "not indexed" instead of the bad one; the first
/// failure is now reported before anything else.)
#[test]
fn among_many_shards_the_bad_one_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, bytes, _) = good_shard(tmp.path());
    let shards = shard.parent().unwrap();
    for i in 0..40 {
        std::fs::write(shards.join(format!("t{i:02}.tar")), &bytes).unwrap();
    }
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    std::fs::write(shards.join("t03.tar"), &bad).unwrap();
    let msg = error_of(shards);
    assert!(
        msg.contains("t03.tar, header at byte 0") && msg.contains("checksum"),
        "{msg}"
    );
}
