//! What a shard's index says of its samples' keys (manifest::KeyFacts):
//! the longest key, the fields, the first directories, and the class names
//! its index records; merged over every shard, with the class names of all
//! indexes that have them required to agree.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::index::TarIndex;
use super::name::split_key;
use crate::manifest::keys::{DirClassesBuilder, FIELDS_MAX};
use crate::manifest::KeyFacts;
use crate::ring::tar_fields::field_name;

/// One shard's part of the facts.
#[derive(Clone, Debug, Default)]
pub struct ShardFacts {
    key_bytes_max: u64,
    fields: BTreeSet<Vec<u8>>,
    dirs: DirClassesBuilder,
    classes: Option<Arc<Vec<Vec<u8>>>>,
}

/// One copy of each distinct class list the shards' indexes record (every
/// shard of a packed dataset has the same: a thousand names, not a thousand
/// copies of them).
#[derive(Debug, Default)]
pub struct ClassLists(Mutex<Vec<Arc<Vec<Vec<u8>>>>>);

impl ClassLists {
    /// The shared copy of `classes` (None: an index without names).
    fn intern(&self, classes: &[Vec<u8>]) -> Option<Arc<Vec<Vec<u8>>>> {
        if classes.is_empty() {
            return None;
        }
        let Ok(mut seen) = self.0.lock() else {
            return Some(Arc::new(classes.to_vec()));
        };
        if let Some(same) = seen.iter().find(|s| s.as_slice() == classes) {
            return Some(Arc::clone(same));
        }
        let new = Arc::new(classes.to_vec());
        seen.push(Arc::clone(&new));
        Some(new)
    }
}

impl ShardFacts {
    /// The facts of `index`'s members (a sample's key is its members' key),
    /// its class names shared through `lists`.
    pub fn of(index: &TarIndex, lists: &ClassLists) -> ShardFacts {
        let mut facts = ShardFacts {
            classes: lists.intern(&index.classes),
            ..ShardFacts::default()
        };
        let mut last_key: &[u8] = &[];
        for (i, member) in index.members.iter().enumerate() {
            let (key, ext) = split_key(&member.name);
            if i == 0 || key != last_key {
                facts.key_bytes_max = facts.key_bytes_max.max(key.len() as u64);
                facts.dirs.add(key);
                last_key = key;
            }
            if facts.fields.len() < FIELDS_MAX {
                let field = field_name(ext);
                if !facts.fields.contains(field.as_ref()) {
                    facts.fields.insert(field.into_owned());
                }
            }
        }
        facts
    }
}

/// Merges shards' facts (in shard order; `names[i]` names shard i in a
/// message): refuses indexes whose class names differ.
pub fn merge(shards: Vec<(String, ShardFacts)>) -> Result<KeyFacts, String> {
    let mut out = KeyFacts::default();
    let mut dirs = DirClassesBuilder::default();
    let mut classes: Option<(String, Arc<Vec<Vec<u8>>>)> = None;
    for (name, shard) in shards {
        out.key_bytes_max = out.key_bytes_max.max(shard.key_bytes_max);
        for field in shard.fields {
            if out.fields.len() >= FIELDS_MAX {
                break;
            }
            out.fields.insert(field);
        }
        dirs.merge(shard.dirs);
        let Some(these) = shard.classes else {
            continue;
        };
        match &classes {
            None => classes = Some((name, these)),
            Some((first, theirs)) if *theirs != these => {
                return Err(format!(
                    "the indexes of tar shards {first} and {name} record different class names ({} and {} classes{}): \
                     they are not one dataset's; pack the dataset again into one DEST, or serve them apart",
                    theirs.len(),
                    these.len(),
                    first_difference(theirs, &these)
                ));
            }
            Some(_) => {}
        }
    }
    out.dirs = dirs.finish();
    out.classes = classes
        .map(|(_, names)| {
            names
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect()
        })
        .unwrap_or_default();
    Ok(out)
}

fn first_difference(a: &[Vec<u8>], b: &[Vec<u8>]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "; class {i} is {:?} in one, {:?} in the other",
            String::from_utf8_lossy(&a[i]),
            String::from_utf8_lossy(&b[i])
        ),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::keys::DirClasses;
    use crate::tar::TarMember;

    fn index(names: &[&str], classes: &[&str]) -> TarIndex {
        let members = names
            .iter()
            .enumerate()
            .map(|(i, n)| TarMember {
                header_offset: i as u64 * 1024,
                data_offset: i as u64 * 1024 + 512,
                size: 1,
                name: n.as_bytes().to_vec(),
            })
            .collect();
        TarIndex {
            shard_bytes: names.len() as u64 * 1024,
            members,
            classes: classes.iter().map(|c| c.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn facts_of_two_shards_merge_and_their_class_names_round_trip_through_the_index() {
        let a = index(
            &["cat/0001.JPG", "cat/0001.cls", "dog/long-key-here.png"],
            &["cat", "dog"],
        );
        let b = index(&["dog/0002.webp"], &["cat", "dog"]);
        // The class lines make a version 2 index, which reads back whole.
        let mut bytes = Vec::new();
        a.write(&mut bytes).unwrap();
        assert!(
            bytes.starts_with(b"ringfeed-tar-index 2\nshard_bytes 3072\nclass cat\nclass dog\n")
        );
        assert_eq!(TarIndex::parse(&bytes).unwrap(), a);
        let lists = ClassLists::default();
        let (fa, fb) = (ShardFacts::of(&a, &lists), ShardFacts::of(&b, &lists));
        assert!(
            Arc::ptr_eq(fa.classes.as_ref().unwrap(), fb.classes.as_ref().unwrap()),
            "one copy"
        );
        let facts = merge(vec![("a".into(), fa), ("b".into(), fb)]).unwrap();
        assert_eq!(facts.key_bytes_max, "dog/long-key-here".len() as u64);
        assert!(facts.has_field("jpg") && facts.has_field("cls") && facts.has_field("webp"));
        assert_eq!(
            facts.dirs,
            DirClasses::All(vec![b"cat".to_vec(), b"dog".to_vec()])
        );
        assert_eq!(facts.classes, ["cat", "dog"]);
        // A shard without names (indexed from its headers) takes the others'.
        let c = index(&["top.jpg"], &[]);
        let facts = merge(vec![
            ("c".into(), ShardFacts::of(&c, &lists)),
            ("a".into(), ShardFacts::of(&a, &lists)),
        ])
        .unwrap();
        assert_eq!(facts.classes, ["cat", "dog"]);
        assert_eq!(facts.dirs, DirClasses::Outside(b"top".to_vec()));
        let other = index(&["x/1.jpg"], &["cat", "emu"]);
        let e = merge(vec![
            ("a".into(), ShardFacts::of(&a, &lists)),
            ("o".into(), ShardFacts::of(&other, &lists)),
        ])
        .unwrap_err();
        assert!(
            e.contains("class 1 is \"dog\" in one, \"emu\" in the other"),
            "{e}"
        );
    }

    #[test]
    fn a_version_2_index_with_bad_class_lines_is_refused() {
        for bad in [
            &b"ringfeed-tar-index 2\nshard_bytes 1024\n0 512 1 a.x\nclass late\nend 1 00000000\n"[..],
            b"ringfeed-tar-index 2\nshard_bytes 1024\nclass \nend 0 00000000\n",
            b"ringfeed-tar-index 1\nshard_bytes 1024\nclass v1\nend 0 00000000\n",
        ] {
            assert!(
                TarIndex::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let empty_name = index(&["a.x"], &[""]);
        assert!(empty_name.write(&mut Vec::new()).is_err());
    }
}
