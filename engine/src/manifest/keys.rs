//! What a run needs to know of its samples' keys beyond where the samples
//! lie: the longest key (to size a slot's key area), the fields samples
//! have (tar shards: is there a label member anywhere?), the classes their
//! first directories name (torchvision's ImageFolder, `root/<class>/x.jpg`),
//! and the class names a packed dataset's indexes record. Gathered once,
//! while listing or indexing; bounded whatever the dataset.

use std::collections::BTreeSet;

/// The fields an image is found in (tar samples without `--image-field`,
/// and what makes a tree an ImageFolder tree for `ringfeed pack`).
pub const IMAGE_FIELDS: [&[u8]; 4] = [b"jpg", b"jpeg", b"png", b"webp"];

/// Most distinct field names kept (a dataset has a handful).
pub const FIELDS_MAX: usize = 1024;
/// Most distinct first directories kept as classes.
pub const DIR_CLASSES_MAX: usize = 1 << 17;

/// The first path component of `key` when the key is inside a directory:
/// its ImageFolder class (`cat/0001.jpg` -> `cat`).
pub fn first_dir(key: &[u8]) -> Option<&[u8]> {
    memchr::memchr(b'/', key).map(|at| &key[..at])
}

/// The classes the keys' first directories name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirClasses {
    /// Every key is inside a directory: the distinct first directories,
    /// sorted byte-wise (class i is the i-th).
    All(Vec<Vec<u8>>),
    /// This key is not inside a directory (the first such seen).
    Outside(Vec<u8>),
    /// More than [`DIR_CLASSES_MAX`] first directories.
    TooMany,
}

impl Default for DirClasses {
    fn default() -> Self {
        DirClasses::All(Vec::new())
    }
}

/// Builds [`DirClasses`] from keys in any order.
#[derive(Clone, Debug, Default)]
pub struct DirClassesBuilder {
    seen: BTreeSet<Vec<u8>>,
    outside: Option<Vec<u8>>,
    too_many: bool,
}

impl DirClassesBuilder {
    /// Counts `key`.
    pub fn add(&mut self, key: &[u8]) {
        if self.outside.is_some() || self.too_many {
            return;
        }
        match first_dir(key) {
            None => self.outside = Some(key.to_vec()),
            Some(dir) if !self.seen.contains(dir) => {
                if self.seen.len() >= DIR_CLASSES_MAX {
                    self.too_many = true;
                    self.seen.clear();
                } else {
                    self.seen.insert(dir.to_vec());
                }
            }
            Some(_) => {}
        }
    }

    /// Merges another builder's keys into this one.
    pub fn merge(&mut self, other: DirClassesBuilder) {
        if self.outside.is_some() || self.too_many {
            return;
        }
        if other.too_many {
            self.too_many = true;
            self.seen.clear();
            return;
        }
        if let Some(key) = other.outside {
            self.outside = Some(key);
            return;
        }
        for dir in other.seen {
            if !self.seen.contains(&dir) {
                if self.seen.len() >= DIR_CLASSES_MAX {
                    self.too_many = true;
                    self.seen.clear();
                    return;
                }
                self.seen.insert(dir);
            }
        }
    }

    /// What the keys counted so far name.
    pub fn finish(self) -> DirClasses {
        match (self.outside, self.too_many) {
            (Some(key), _) => DirClasses::Outside(key),
            (None, true) => DirClasses::TooMany,
            (None, false) => DirClasses::All(self.seen.into_iter().collect()),
        }
    }
}

impl DirClasses {
    /// Class of `key`: its first directory's place among the classes.
    pub fn class_of(&self, key: &[u8]) -> Option<usize> {
        match self {
            DirClasses::All(names) => {
                let dir = first_dir(key)?;
                names.binary_search_by(|n| n.as_slice().cmp(dir)).ok()
            }
            _ => None,
        }
    }
}

/// The facts about a dataset's sample keys that a ranges-mode (tar)
/// manifest carries; a whole-file manifest's come from its file list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyFacts {
    /// Longest sample key, in bytes.
    pub key_bytes_max: u64,
    /// Field names (extensions, lowercased) that some sample has, at most
    /// [`FIELDS_MAX`].
    pub fields: BTreeSet<Vec<u8>>,
    /// The classes of the keys' first directories.
    pub dirs: DirClasses,
    /// Class names the shards' indexes record, in class order (the same in
    /// every index that has them); empty: none.
    pub classes: Vec<String>,
}

impl KeyFacts {
    /// Whether some sample has field `name`.
    pub fn has_field(&self, name: &str) -> bool {
        self.fields.contains(name.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_directories_become_sorted_classes_and_a_key_outside_one_is_named() {
        let mut a = DirClassesBuilder::default();
        for key in ["cow/1", "ant/2", "bee/x/3", "ant/4"] {
            a.add(key.as_bytes());
        }
        let mut b = DirClassesBuilder::default();
        b.add(b"dog/5");
        a.merge(b);
        let classes = a.clone().finish();
        assert_eq!(
            classes,
            DirClasses::All(vec![
                b"ant".to_vec(),
                b"bee".to_vec(),
                b"cow".to_vec(),
                b"dog".to_vec()
            ])
        );
        assert_eq!(classes.class_of(b"bee/x/9"), Some(1));
        assert_eq!(classes.class_of(b"eel/9"), None);
        let mut c = DirClassesBuilder::default();
        c.add(b"top");
        a.merge(c);
        assert_eq!(a.finish(), DirClasses::Outside(b"top".to_vec()));
    }
}
