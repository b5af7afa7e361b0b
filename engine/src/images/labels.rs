//! Labels of an image dataset, and the rule a served label keeps.
//!
//! Where a label comes from: for a tree of files, the first directory of the
//! key (torchvision's ImageFolder: `root/<class>/.../x.jpg`), classes
//! numbered in byte order of their names; for tar shards, each sample's
//! label member (`.cls`, a decimal class index; class names from the
//! shards' indexes when `ringfeed pack` wrote them), or with `--labels dirs`
//! the first directory of the sample's key.
//!
//! The rule: a label is `0 <= label < classes` when the classes are known
//! (a tree's directories, the indexes' names, `--num-classes`), else at
//! least `>= 0`. A label that breaks it (-1, CrossEntropyLoss's
//! ignore_index -100, -7, 1000 of 1000 classes), or a sample with no label
//! in a labelled dataset, is a bad sample under `--on-bad-sample`, never a
//! silent exclusion from the loss or a crash of an embedding lookup.

use crate::manifest::keys::{first_dir, DirClasses};
use crate::manifest::Manifest;
use crate::ring::tar_fields::next_field;
use crate::tar::split_key;

/// `--labels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelChoice {
    /// A tree: from directories when every image is inside one, else none.
    /// Tar shards: the label member, which some sample must have.
    Auto,
    /// The first directory of each key (ImageFolder); a key outside one
    /// is an error.
    Dirs,
    /// No labels: every label is -1.
    None,
}

/// Where each sample's label comes from.
#[derive(Clone, Debug, Default)]
enum Source {
    /// No labels (-1).
    #[default]
    None,
    /// A tree: each object's class, by object index.
    Files(Vec<i64>),
    /// Tar samples: the member of this field name.
    TarField(String),
    /// Tar samples: the first directory of the key.
    TarDirs(DirClasses),
}

/// A sample as [`Labels::label`] reads it.
#[derive(Clone, Copy, Debug)]
pub enum Sample<'a> {
    /// Object `file` of a tree.
    File(u32),
    /// A tar sample's raw bytes (its members).
    Tar(&'a [u8]),
}

/// The run's classes, and each sample's label.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    /// Class names, in class order; label i names `classes[i]`. Empty when
    /// no names are known (the count may still be).
    pub classes: Vec<String>,
    /// Classes the labels index; 0: not known (then a label is only
    /// checked to be `>= 0`).
    pub count: u32,
    source: Source,
}

impl Labels {
    /// The labels `choice` asks for over `manifest`'s samples: a tree's by
    /// directory, tar samples' from their `label_field` member (or their
    /// keys' directories). `num_classes` (`--num-classes`) says how many
    /// classes there are where nothing else does, and must agree where
    /// something does.
    pub fn of(
        manifest: &Manifest,
        choice: LabelChoice,
        label_field: &str,
        num_classes: Option<u32>,
    ) -> Result<Labels, String> {
        let unlabelled = || {
            match num_classes {
            Some(n) => Err(format!("--num-classes {n}, but this run has no labels (--labels none, or a tree with files outside class directories): drop it, or label the dataset")),
            None => Ok(Labels::default()),
        }
        };
        if choice == LabelChoice::None {
            return unlabelled();
        }
        let labels = match manifest.key_facts() {
            Some(facts) if choice == LabelChoice::Dirs => {
                let names = dir_names(&facts.dirs)?;
                Labels::named(names, Source::TarDirs(facts.dirs.clone()))
            }
            Some(facts) => {
                if !facts.has_field(label_field) {
                    return Err(no_label_member(label_field, &facts.dirs));
                }
                Labels::named(
                    facts.classes.clone(),
                    Source::TarField(label_field.to_string()),
                )
            }
            None => match tree_labels(manifest, choice)? {
                Some(labels) => labels,
                None => return unlabelled(),
            },
        };
        labels.with_count(num_classes)
    }

    fn named(classes: Vec<String>, source: Source) -> Labels {
        Labels {
            count: classes.len() as u32,
            classes,
            source,
        }
    }

    /// `--num-classes`: the count where none is known, else the same one.
    fn with_count(mut self, num_classes: Option<u32>) -> Result<Labels, String> {
        if u32::try_from(self.classes.len()).is_err() {
            return Err("more than 4 billion classes".into());
        }
        match num_classes {
            None => {}
            Some(0) => return Err("--num-classes 0: a dataset with labels has at least 1 class".into()),
            Some(n) if self.classes.is_empty() => self.count = n,
            Some(n) if n as usize == self.classes.len() => {}
            Some(n) => {
                return Err(format!(
                    "--num-classes {n}, but {} name {} classes ({} … {}); drop --num-classes, or fix the dataset",
                    match self.source {
                        Source::Files(_) | Source::TarDirs(_) => "the dataset's class directories",
                        _ => "the shards' indexes",
                    },
                    self.classes.len(),
                    self.classes.first().map_or("", String::as_str),
                    self.classes.last().map_or("", String::as_str),
                ))
            }
        }
        Ok(self)
    }

    /// Whether the run has labels (else every label is -1).
    pub fn any(&self) -> bool {
        !matches!(self.source, Source::None)
    }

    /// The label of `sample`, checked: `Err` says why the sample's label
    /// cannot be served (the caller names the sample, and applies the
    /// run's `--on-bad-sample`).
    pub fn label(&self, sample: Sample<'_>) -> Result<i64, String> {
        let label =
            match (&self.source, sample) {
                (Source::None, _) => return Ok(-1),
                (Source::Files(by_file), Sample::File(file)) => {
                    by_file.get(file as usize).copied().unwrap_or(-1)
                }
                (Source::TarField(field), Sample::Tar(raw)) => member_label(raw, field)?,
                (Source::TarDirs(dirs), Sample::Tar(raw)) => {
                    let key = tar_key(raw).ok_or("it has no member to take a key from")?;
                    match dirs.class_of(&key) {
                        Some(class) => class as i64,
                        None => {
                            return Err(format!(
                                "its key {:?} is not inside a class directory (--labels dirs)",
                                String::from_utf8_lossy(&key)
                            ))
                        }
                    }
                }
                (_, _) => return Err(
                    "has no label (an internal mismatch of source and labels; please report it)"
                        .into(),
                ),
            };
        self.check(label)?;
        Ok(label)
    }

    /// The rule a served label keeps (module docs).
    pub fn check(&self, label: i64) -> Result<(), String> {
        let what = match &self.source {
            Source::TarField(field) => format!(" (its .{field} member)"),
            _ => String::new(),
        };
        if label < 0 {
            return Err(format!(
                "has label {label}{what}: a label is a class index, 0 or more{}",
                if label == -100 {
                    " (-100 is CrossEntropyLoss's ignore_index, which would leave it out of the loss unseen)"
                } else {
                    ""
                }
            ));
        }
        if self.count > 0 && label >= i64::from(self.count) {
            return Err(format!(
                "has label {label}{what}, not one of the {} classes 0..{}{}",
                self.count,
                self.count - 1,
                if self.classes.is_empty() {
                    " (--num-classes)"
                } else {
                    ""
                }
            ));
        }
        Ok(())
    }

    /// The line that says the labels at start.
    pub fn words(&self) -> String {
        let from = match &self.source {
            Source::None => return "no labels (every label is -1)".to_string(),
            Source::Files(_) => "from directory names".to_string(),
            Source::TarDirs(_) => "from the first directory of each tar sample's key".to_string(),
            Source::TarField(field) => {
                let classes = match self.classes.as_slice() {
                    [] if self.count > 0 => format!("{} classes (--num-classes), no names", self.count),
                    [] => "classes not known (each label must be 0 or more; --num-classes N checks it is below N)".to_string(),
                    [only] => format!("1 class ({only})"),
                    [first, .., last] => format!("{} classes ({first} … {last})", self.classes.len()),
                };
                return format!("labels from each tar sample's .{field} member, {classes}");
            }
        };
        match self.classes.as_slice() {
            [] => format!("no classes {from}"),
            [only] => format!("1 class {from} ({only})"),
            [first, .., last] => format!(
                "{} classes {from} ({first} … {last}), numbered in byte order",
                self.classes.len()
            ),
        }
    }
}

/// A tree's labels by directory (None: `auto` over a tree with files at
/// its top).
fn tree_labels(manifest: &Manifest, choice: LabelChoice) -> Result<Option<Labels>, String> {
    let files = manifest.files();
    let mut names: Vec<&[u8]> = Vec::new();
    for i in 0..files.len() {
        match first_dir(files.path_bytes(i)) {
            Some(class) => names.push(class),
            None if choice == LabelChoice::Auto => return Ok(None),
            None => {
                return Err(format!(
                    "--labels dirs: {:?} is not inside a class directory (labels come from the first directory of each key, as torchvision's ImageFolder reads root/<class>/image); move it, or pass --labels none",
                    String::from_utf8_lossy(files.path_bytes(i))
                ))
            }
        }
    }
    names.sort_unstable();
    names.dedup();
    let by_file = (0..files.len())
        .map(|i| {
            first_dir(files.path_bytes(i))
                .and_then(|c| names.binary_search(&c).ok())
                .map_or(-1, |n| n as i64)
        })
        .collect();
    let names = names
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    Ok(Some(Labels::named(names, Source::Files(by_file))))
}

/// `--labels dirs` over tar samples: the classes their keys' first
/// directories name.
fn dir_names(dirs: &DirClasses) -> Result<Vec<String>, String> {
    match dirs {
        DirClasses::All(names) => Ok(names
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()),
        DirClasses::Outside(key) => Err(format!(
            "--labels dirs: tar sample {:?} is not inside a class directory (the class is the first directory of each sample's key); pack the tree with its class directories, use its label member (--labels auto), or pass --labels none",
            String::from_utf8_lossy(key)
        )),
        DirClasses::TooMany => Err(format!(
            "--labels dirs: the tar samples' keys name more than {} first directories; those are not classes (use the label member, or --labels none)",
            crate::manifest::keys::DIR_CLASSES_MAX
        )),
    }
}

/// The error of tar shards with images but no label member anywhere.
fn no_label_member(field: &str, dirs: &DirClasses) -> String {
    let dirs_hint = match dirs {
        DirClasses::All(names) if !names.is_empty() => format!(
            "; every key is inside a directory ({} of them): --labels dirs takes the class from it",
            names.len()
        ),
        _ => String::new(),
    };
    format!(
        "--decode image: no sample of the tar shards has a .{field} member, so no label is known{dirs_hint}; \
         name the label member with --label-field EXT, repack an ImageFolder tree with ringfeed pack (which writes .cls members), \
         or pass --labels none to serve every label as -1"
    )
}

/// A tar sample's label: its `field` member, a decimal integer.
fn member_label(raw: &[u8], field: &str) -> Result<i64, String> {
    let mut cursor = 0;
    while let Some(f) =
        next_field(raw, &mut cursor).map_err(|e| format!("its tar members cannot be read: {e}"))?
    {
        if f.field_name().as_ref() != field.as_bytes() {
            continue;
        }
        let text = String::from_utf8_lossy(f.data);
        return text.trim().parse::<i64>().map_err(|_| {
            format!(
                "has a .{field} member {:?} that is not a whole number (a class index)",
                text.chars().take(40).collect::<String>()
            )
        });
    }
    Err(format!(
        "has no .{field} member (its label), where other samples have one"
    ))
}

/// A tar sample's key: its first member's name before the extension.
pub fn tar_key(raw: &[u8]) -> Option<Vec<u8>> {
    let mut cursor = 0;
    let f = next_field(raw, &mut cursor).ok()??;
    let mut name = Vec::with_capacity(f.name_prefix.len() + 1 + f.name.len());
    if !f.name_prefix.is_empty() {
        name.extend_from_slice(f.name_prefix);
        name.push(b'/');
    }
    name.extend_from_slice(f.name);
    let key_len = split_key(&name).0.len();
    name.truncate(key_len);
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(count: u32, source: Source) -> Labels {
        Labels {
            classes: Vec::new(),
            count,
            source,
        }
    }

    #[test]
    fn a_label_outside_the_classes_or_below_zero_is_refused_saying_which() {
        let known = with(5, Source::TarField("cls".into()));
        assert!(known.check(0).is_ok() && known.check(4).is_ok());
        let e = known.check(5).unwrap_err();
        assert!(
            e.contains("has label 5 (its .cls member), not one of the 5 classes 0..4"),
            "{e}"
        );
        let e = known.check(-100).unwrap_err();
        assert!(e.contains("ignore_index"), "{e}");
        let unknown = with(0, Source::TarField("cls".into()));
        assert!(unknown.check(1_000_000).is_ok());
        for bad in [-1, -7, i64::MIN] {
            assert!(unknown
                .check(bad)
                .unwrap_err()
                .contains(&format!("has label {bad}")));
        }
        assert_eq!(
            Labels::default().label(Sample::File(3)),
            Ok(-1),
            "no labels: -1 is the rule"
        );
    }

    #[test]
    fn num_classes_gives_a_count_where_none_is_known_and_must_agree_where_one_is() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let tar = Labels::named(Vec::new(), Source::TarField("cls".into()));
        assert_eq!(tar.clone().with_count(Some(7)).unwrap().count, 7);
        assert!(tar.with_count(Some(0)).is_err());
        let tree = Labels::named(names(&["ant", "bee"]), Source::Files(vec![0, 1]));
        assert_eq!(tree.clone().with_count(Some(2)).unwrap().count, 2);
        let e = tree.with_count(Some(3)).unwrap_err();
        assert!(
            e.contains(
                "--num-classes 3, but the dataset's class directories name 2 classes (ant … bee)"
            ),
            "{e}"
        );
    }
}
