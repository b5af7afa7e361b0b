//! What `ringfeed pack` writes where, decided before a byte is written:
//! the samples (objects grouped by key, TAR-INDEX.md), their order, which
//! shard each goes to, and every shard's size and index. A pure function of
//! the input listing and `--shard-size`, so a rerun computes the same plan
//! and can tell which shards are already written.

use std::collections::HashMap;
use std::fmt::Write as _;

use thiserror::Error;

use crate::manifest::{digest_words, FileList};
use crate::tar::index::TAR_BLOCK_BYTES;
use crate::tar::{split_key, TarIndex, TarMember};

use super::header::{member_header_bytes, padding};
use super::labels::{ClassMembers, PackLabels, LABEL_MEMBER};

/// First line of the plan file.
pub const PLAN_MAGIC_LINE: &str = "ringfeed-pack-plan 1";

/// Name of the plan file in DEST.
pub const PLAN_FILE: &str = ".ringfeed-pack.plan";

/// The two zero blocks that end a tar archive.
pub const END_OF_ARCHIVE_BYTES: u64 = 2 * TAR_BLOCK_BYTES;

/// Why the input cannot be packed as it is.
#[derive(Debug, Error)]
pub enum PlanError {
    /// Nothing to pack.
    #[error("{dir} holds no files; pack needs at least one (check --source)")]
    Empty {
        /// The source.
        dir: String,
    },
    /// Two objects of one key with the same extension: one sample cannot hold both.
    #[error("{first:?} and {second:?} are both field {ext:?} of sample {key:?} (a sample's fields are named by what follows the first dot of the file name); rename one of them")]
    DuplicateField {
        /// The first object's key.
        first: String,
        /// The second object's key.
        second: String,
        /// Their common sample key.
        key: String,
        /// Their common extension.
        ext: String,
    },
    /// `--labels` cannot be honoured.
    #[error("{0}")]
    Labels(String),
}

/// One shard of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    /// Its position in `PackPlan::members` of its first member.
    pub first_member: usize,
    /// Members it holds.
    pub members: usize,
    /// Samples it holds.
    pub samples: usize,
    /// Its size in bytes, end-of-archive blocks included.
    pub bytes: u64,
}

/// The whole plan (see the module docs).
#[derive(Clone, Debug)]
pub struct PackPlan {
    /// `--shard-size`.
    pub shard_size: u64,
    /// Objects listed.
    pub input_objects: u64,
    /// Bytes listed.
    pub input_bytes: u64,
    /// Digest of the listing: keys, sizes and versions (mtimes, ETags).
    pub input_digest: u64,
    /// Object indices (into the listing) in tar order; an index with
    /// [`LABEL_MEMBER`] set is the `.cls` member of the sample whose first
    /// object it names ([`PackPlan::label_member`]).
    pub members: Vec<usize>,
    /// The shards, in order.
    pub shards: Vec<ShardPlan>,
    /// The label members' classes (`--labels`), None: no labels written.
    pub labels: Option<ClassMembers>,
    /// What `--labels` decided, in words.
    pub labels_said: String,
}

/// Name of shard `i` in DEST.
pub fn shard_name(i: usize) -> String {
    format!("shard-{i:06}.tar")
}

/// Digest of a listing: every key (as 8-byte words and its length), size,
/// and version word, in listing order.
pub fn listing_digest(files: &FileList, versions: &[u64]) -> u64 {
    let words = files.iter().enumerate().flat_map(|(i, f)| {
        let key = f.rel_path.as_os_str().as_encoded_bytes();
        let key_words = key.chunks(8).map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        key_words.chain([
            key.len() as u64,
            f.size_bytes,
            versions.get(i).copied().unwrap_or(0),
        ])
    });
    digest_words(0x7061_636B, words) // "pack"
}

impl PackPlan {
    /// Plans the packing of `files` (byte-wise key order, as listings give
    /// them) into shards of about `shard_size` bytes.
    ///
    /// Samples are the objects grouped by [`split_key`]; they come in the
    /// order of each key's first object, and a sample's members in key order:
    /// where the byte-wise order keeps every key's objects together (always,
    /// for one object per key) this IS the byte-wise order, and otherwise
    /// the objects of a key are moved up behind its first one (`a.x`,
    /// `a-b.y`, `a.z` packs as `a.x`, `a.z`, `a-b.y`), since a sample is a
    /// run of consecutive members. A shard ends before the first sample that
    /// would take it past `shard_size` (a sample is never split: one larger
    /// than `shard_size` gets a shard of its own).
    pub fn new(
        source: &str,
        files: &FileList,
        versions: &[u64],
        shard_size: u64,
        labels: PackLabels,
    ) -> Result<PackPlan, PlanError> {
        if files.is_empty() {
            return Err(PlanError::Empty {
                dir: source.to_string(),
            });
        }
        let mut group_of: HashMap<&[u8], usize> = HashMap::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, key) in files.paths_bytes().enumerate() {
            let (sample_key, _) = split_key(key);
            let next = groups.len();
            let g = *group_of.entry(sample_key).or_insert(next);
            if g == next {
                groups.push(Vec::new());
            }
            groups[g].push(i);
        }
        for group in &groups {
            let mut exts: HashMap<&[u8], usize> = HashMap::new();
            for &i in group {
                let (key, ext) = split_key(files.path_bytes(i));
                if let Some(&first) = exts.get(ext) {
                    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                    return Err(PlanError::DuplicateField {
                        first: lossy(files.path_bytes(first)),
                        second: lossy(files.path_bytes(i)),
                        key: lossy(key),
                        ext: lossy(ext),
                    });
                }
                exts.insert(ext, i);
            }
        }
        let (labels, labels_said) =
            ClassMembers::decide(labels, files, &groups).map_err(PlanError::Labels)?;
        if let Some(classes) = &labels {
            for group in &mut groups {
                insert_label_member(group, files, classes);
            }
        }
        let member_bytes = |i: usize| {
            let (name, size) = match &labels {
                Some(classes) if i & LABEL_MEMBER != 0 => {
                    let (name, data) = classes.member(files, i & !LABEL_MEMBER);
                    (std::borrow::Cow::Owned(name), data.len() as u64)
                }
                _ => (
                    std::borrow::Cow::Borrowed(files.path_bytes(i)),
                    files.size_bytes(i),
                ),
            };
            member_header_bytes(&name, size) + size + padding(size)
        };
        let mut members = Vec::with_capacity(files.len() + groups.len());
        let mut shards: Vec<ShardPlan> = Vec::new();
        let mut open = ShardPlan {
            first_member: 0,
            members: 0,
            samples: 0,
            bytes: END_OF_ARCHIVE_BYTES,
        };
        for group in &groups {
            let sample_bytes: u64 = group.iter().map(|&i| member_bytes(i)).sum();
            if open.samples > 0 && open.bytes + sample_bytes > shard_size {
                let first_member = open.first_member + open.members;
                shards.push(std::mem::replace(
                    &mut open,
                    ShardPlan {
                        first_member,
                        members: 0,
                        samples: 0,
                        bytes: END_OF_ARCHIVE_BYTES,
                    },
                ));
            }
            members.extend_from_slice(group);
            open.members += group.len();
            open.samples += 1;
            open.bytes += sample_bytes;
        }
        shards.push(open);
        Ok(PackPlan {
            shard_size,
            input_objects: files.len() as u64,
            input_bytes: files.sizes().iter().sum(),
            input_digest: listing_digest(files, versions),
            members,
            shards,
            labels,
            labels_said,
        })
    }

    /// The name and bytes of member `m` (an entry of `members`) when it is
    /// a label member, else None (an object of the listing).
    pub fn label_member(&self, files: &FileList, m: usize) -> Option<(Vec<u8>, Vec<u8>)> {
        let classes = self.labels.as_ref().filter(|_| m & LABEL_MEMBER != 0)?;
        Some(classes.member(files, m & !LABEL_MEMBER))
    }

    /// Objects (not label members) of shard `s`.
    pub fn shard_files(&self, s: usize) -> usize {
        let shard = &self.shards[s];
        self.members[shard.first_member..shard.first_member + shard.members]
            .iter()
            .filter(|&&m| self.labels.is_none() || m & LABEL_MEMBER == 0)
            .count()
    }

    /// The index shard `s` will have (TAR-INDEX.md).
    pub fn shard_index(&self, files: &FileList, s: usize) -> TarIndex {
        let shard = &self.shards[s];
        let mut at = 0;
        let members = self.members[shard.first_member..shard.first_member + shard.members]
            .iter()
            .map(|&i| {
                let (name, size) = match self.label_member(files, i) {
                    Some((name, data)) => (name, data.len() as u64),
                    None => (files.path_bytes(i).to_vec(), files.size_bytes(i)),
                };
                let header = member_header_bytes(&name, size);
                let member = TarMember {
                    header_offset: at,
                    data_offset: at + header,
                    size,
                    name,
                };
                at += header + size + padding(size);
                member
            })
            .collect();
        TarIndex {
            shard_bytes: shard.bytes,
            members,
            classes: self
                .labels
                .as_ref()
                .map(|l| l.classes.clone())
                .unwrap_or_default(),
        }
    }

    /// The plan file's text: what a rerun compares (the input and the
    /// shard size) and, for people, the shards.
    pub fn to_text(&self, source: &str) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{PLAN_MAGIC_LINE}");
        let _ = writeln!(s, "source {}", source.escape_debug());
        let _ = writeln!(s, "shard_size {}", self.shard_size);
        let _ = writeln!(s, "{}", self.labels_line());
        let _ = writeln!(
            s,
            "input {} {} {:016x}",
            self.input_objects, self.input_bytes, self.input_digest
        );
        let _ = writeln!(s, "shards {}", self.shards.len());
        for (i, shard) in self.shards.iter().enumerate() {
            let _ = writeln!(
                s,
                "{} {} {} {} {}",
                shard_name(i),
                shard.first_member,
                shard.members,
                shard.samples,
                shard.bytes
            );
        }
        let _ = writeln!(s, "end {:08x}", crc32fast::hash(s.as_bytes()));
        s
    }

    /// Why a plan file found in DEST is not this plan's (None: it is, go on
    /// from it). `dest` names DEST in the message.
    pub fn mismatch(&self, found: &[u8], dest: &str) -> Option<String> {
        let text = String::from_utf8_lossy(found);
        let line = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key).map(str::to_string))
        };
        let fix = format!("pack into an empty DEST, or delete {dest}/{PLAN_FILE} and the shards beside it to start over");
        if !text.starts_with(PLAN_MAGIC_LINE) {
            return Some(format!(
                "{dest}/{PLAN_FILE} is not a ringfeed pack plan; {fix}"
            ));
        }
        let want_input = format!(
            "{} {} {:016x}",
            self.input_objects, self.input_bytes, self.input_digest
        );
        match line("input ") {
            Some(found) if found == want_input => {}
            found => {
                let was = found.unwrap_or_default();
                let mut f = was.split(' ');
                let (objects, bytes) = (f.next().unwrap_or("?"), f.next().unwrap_or("?"));
                return Some(format!(
                    "the input changed since {dest} was planned: it had {objects} files of {bytes} bytes, now {} files of {} bytes{} (files added, removed, resized or modified); {fix}",
                    self.input_objects,
                    self.input_bytes,
                    if objects == self.input_objects.to_string() && bytes == self.input_bytes.to_string() { ", same counts but other names or times" } else { "" }
                ));
            }
        }
        // A plan from before labels has no such line: it wrote none.
        let labels =
            line("labels ").map_or_else(|| "labels 0".to_string(), |l| format!("labels {l}"));
        if labels != self.labels_line() {
            return Some(format!(
                "{dest} was planned {} label members, this run {}; rerun with the --labels of that run, or {fix}",
                if labels == "labels 0" { "without" } else { "with" },
                if self.labels.is_some() { "writes them" } else { "writes none" }
            ));
        }
        match line("shard_size ") {
            Some(found) if found == self.shard_size.to_string() => None,
            found => Some(format!(
                "{dest} was planned with --shard-size {} bytes, this run asks for {}; rerun with --shard-size {0}, or {fix}",
                found.unwrap_or_else(|| "?".into()),
                self.shard_size
            )),
        }
    }
}

impl PackPlan {
    /// The plan file's record of the label members: their class count and
    /// a digest of the names ("labels 0": none).
    fn labels_line(&self) -> String {
        match &self.labels {
            None => "labels 0".to_string(),
            Some(l) => {
                let words = l
                    .classes
                    .iter()
                    .flat_map(|c| c.iter().map(|&b| u64::from(b)).chain([u64::MAX]));
                format!(
                    "labels {} {:016x}",
                    l.classes.len(),
                    digest_words(0x636c_6173, words)
                )
            }
        }
    }
}

/// Puts the sample's label member among its objects in byte order of
/// names (a sample's members are in that order).
fn insert_label_member(group: &mut Vec<usize>, files: &FileList, classes: &ClassMembers) {
    let first = group[0];
    let (name, _) = classes.member(files, first);
    let at = group
        .iter()
        .position(|&i| files.path_bytes(i) > name.as_slice())
        .unwrap_or(group.len());
    group.insert(at, LABEL_MEMBER | first);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, u64)]) -> FileList {
        let mut f = FileList::new();
        for (name, size) in entries {
            f.push(name.as_bytes(), *size);
        }
        f
    }

    #[test]
    fn objects_of_one_key_become_one_sample_even_where_byte_order_splits_them() {
        // Byte-wise: "a-b.y" (0x2d) sorts between "a.x" and "a.z" (0x2e).
        let f = files(&[("a-b.y", 1), ("a.x", 1), ("a.z", 1), ("b.x", 1)]);
        let plan = PackPlan::new("src", &f, &[], 1 << 20, PackLabels::None).unwrap();
        let names: Vec<&[u8]> = plan.members.iter().map(|&i| f.path_bytes(i)).collect();
        assert_eq!(names, [&b"a-b.y"[..], b"a.x", b"a.z", b"b.x"]);
        assert_eq!(plan.shards[0].samples, 3);
        let f = files(&[("a.x", 1), ("a-b.y", 1), ("a.z", 1)]);
        let plan = PackPlan::new("src", &f, &[], 1 << 20, PackLabels::None).unwrap();
        assert_eq!(plan.members, [0, 2, 1]);
    }

    #[test]
    fn a_shard_closes_before_the_sample_that_would_pass_the_size_and_a_large_sample_stands_alone() {
        // Each 1000-byte object is 512 + 1024 = 1536 bytes in the tar.
        let f = files(&[
            ("a.x", 1000),
            ("a.y", 1000),
            ("b.x", 1000),
            ("c.x", 9000),
            ("d.x", 1),
        ]);
        let plan = PackPlan::new("src", &f, &[], 1024 + 3 * 1536, PackLabels::None).unwrap();
        let shape: Vec<(usize, usize)> =
            plan.shards.iter().map(|s| (s.members, s.samples)).collect();
        assert_eq!(shape, [(3, 2), (1, 1), (1, 1)]);
        assert_eq!(plan.shards[0].bytes, 1024 + 3 * 1536);
        let index = plan.shard_index(&f, 0);
        assert_eq!(index.members[2].header_offset, 2 * 1536);
        index.check().unwrap();
    }

    #[test]
    fn two_files_that_are_one_field_of_one_sample_are_refused_naming_both() {
        let f = files(&[("x", 1), ("x.", 1)]);
        let e = PackPlan::new("src", &f, &[], 1 << 20, PackLabels::None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"x\" and \"x.\"") && e.contains("rename one"),
            "{e}"
        );
    }

    #[test]
    fn a_plan_file_of_other_input_or_shard_size_is_named_as_such() {
        let f = files(&[("a.x", 10)]);
        let plan = PackPlan::new("src", &f, &[7], 4096, PackLabels::None).unwrap();
        assert_eq!(plan.mismatch(plan.to_text("src").as_bytes(), "D"), None);
        let other = PackPlan::new("src", &f, &[8], 4096, PackLabels::None).unwrap();
        let e = other.mismatch(plan.to_text("src").as_bytes(), "D").unwrap();
        assert!(
            e.contains("input changed") && e.contains("other names or times"),
            "{e}"
        );
        let other = PackPlan::new("src", &f, &[7], 8192, PackLabels::None).unwrap();
        let e = other.mismatch(plan.to_text("src").as_bytes(), "D").unwrap();
        assert!(e.contains("--shard-size 4096"), "{e}");
    }
}
