//! Labels of an image dataset: for a tree of files, the class is the first
//! directory of the key (torchvision's ImageFolder: `root/<class>/.../x.jpg`),
//! classes numbered in byte order of their names.

use crate::manifest::Manifest;

/// `--labels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelChoice {
    /// From directories when every image is inside one, else none.
    Auto,
    /// The first directory of each key (ImageFolder); an image at the top
    /// is an error.
    Dirs,
    /// No labels: every label is -1.
    None,
}

/// The run's classes, and each object's label.
#[derive(Clone, Debug, Default)]
pub struct Labels {
    /// Class names, in byte order; label i names `classes[i]`.
    pub classes: Vec<String>,
    /// The label of each object of the manifest (by file index); empty when
    /// there are no labels.
    by_file: Vec<i64>,
}

impl Labels {
    /// The labels `choice` asks for over `manifest`'s objects.
    pub fn of(manifest: &Manifest, choice: LabelChoice) -> Result<Labels, String> {
        if choice == LabelChoice::None {
            return Ok(Labels::default());
        }
        let files = manifest.files();
        let class_of = |i: usize| -> Option<&[u8]> {
            let key = files.path_bytes(i);
            key.iter().position(|&b| b == b'/').map(|at| &key[..at])
        };
        let mut names: Vec<&[u8]> = Vec::new();
        for i in 0..files.len() {
            match class_of(i) {
                Some(class) => names.push(class),
                None if choice == LabelChoice::Auto => return Ok(Labels::default()),
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
                class_of(i)
                    .and_then(|c| names.binary_search(&c).ok())
                    .map_or(-1, |n| n as i64)
            })
            .collect();
        Ok(Labels {
            classes: names
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect(),
            by_file,
        })
    }

    /// The label of object `file` (-1: none).
    pub fn of_file(&self, file: u32) -> i64 {
        self.by_file.get(file as usize).copied().unwrap_or(-1)
    }

    /// The line that says the classes at start.
    pub fn words(&self) -> String {
        match self.classes.as_slice() {
            [] => "no labels (every label is -1)".to_string(),
            [only] => format!("1 class from directory names ({only})"),
            [first, .., last] => format!(
                "{} classes from directory names ({first} … {last}), numbered in byte order",
                self.classes.len()
            ),
        }
    }
}
