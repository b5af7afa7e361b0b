//! Labels through pack (`--labels`): a tree in torchvision's ImageFolder
//! shape (`root/<class>/.../x.jpg`, every file under a class directory)
//! packs with each sample's class index as a `.cls` member (WebDataset's
//! label field: the decimal index, no newline) and the class names, in
//! class order (byte order of the directory names, as `serve` numbers a
//! tree's classes), in every shard's index. Serving the shards with
//! `--decode image` then gives the labels and names that serving the tree
//! gives.

use crate::manifest::keys::{first_dir, DirClasses, DirClassesBuilder, IMAGE_FIELDS};
use crate::manifest::FileList;
use crate::ring::tar_fields::field_name;
use crate::tar::split_key;

/// `ringfeed pack --labels`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PackLabels {
    /// Labels when the tree is an ImageFolder tree: every file under a
    /// directory, every sample with an image, no sample with a label
    /// member of its own.
    #[default]
    Auto,
    /// Labels from the first directory of every key; a file outside one,
    /// or a sample with a `.cls` member already, is an error.
    Dirs,
    /// No label members.
    None,
}

/// What a label member's entry in `PackPlan::members` adds to the index of
/// its sample's first file: such an entry is not a file but that sample's
/// `.cls` member.
pub const LABEL_MEMBER: usize = 1 << (usize::BITS - 1);

/// The field name of the members pack writes.
pub const LABEL_FIELD: &str = "cls";

/// The classes of a tree packed with labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassMembers {
    /// Class names, byte order.
    pub classes: Vec<Vec<u8>>,
    dirs: DirClasses,
}

impl ClassMembers {
    /// Decides whether `files`, grouped into samples (`groups`: file
    /// indices), get label members under `choice`, and says so in words.
    pub fn decide(
        choice: PackLabels,
        files: &FileList,
        groups: &[Vec<usize>],
    ) -> Result<(Option<ClassMembers>, String), String> {
        if choice == PackLabels::None {
            return Ok((None, "no labels (--labels none)".into()));
        }
        let mut dirs = DirClassesBuilder::default();
        for key in files.paths_bytes() {
            dirs.add(key);
        }
        let dirs = dirs.finish();
        let ext_of = |i: usize| field_name(split_key(files.path_bytes(i)).1).into_owned();
        let labelled = groups
            .iter()
            .find(|g| g.iter().any(|&i| ext_of(i) == LABEL_FIELD.as_bytes()));
        let imageless = groups.iter().find(|g| {
            !g.iter()
                .any(|&i| IMAGE_FIELDS.contains(&ext_of(i).as_slice()))
        });
        let name = |i: usize| String::from_utf8_lossy(files.path_bytes(i)).into_owned();
        let classes = match (&dirs, choice) {
            (DirClasses::All(names), _) if !names.is_empty() => names.clone(),
            (DirClasses::Outside(key), PackLabels::Dirs) => {
                return Err(format!("--labels dirs: {:?} is not inside a class directory (the class is the first directory of each file, as torchvision's ImageFolder reads root/<class>/image); move it, or pass --labels none", String::from_utf8_lossy(key)))
            }
            (DirClasses::TooMany, PackLabels::Dirs) => {
                return Err("--labels dirs: the files' first directories are too many to be classes; pass --labels none".into())
            }
            (DirClasses::Outside(key), _) => {
                return Ok((None, format!("no labels: not an ImageFolder tree ({:?} is not inside a class directory)", String::from_utf8_lossy(key))))
            }
            _ => return Ok((None, "no labels: not an ImageFolder tree".into())),
        };
        match (labelled, imageless, choice) {
            (Some(g), _, PackLabels::Dirs) => {
                return Err(format!("--labels dirs: {:?} is already a .cls member of its sample; pass --labels none to pack the files as they are", name(g[0])))
            }
            (Some(g), _, _) => {
                return Ok((None, format!("no labels written: the samples carry their own .cls members ({:?})", name(g[0]))))
            }
            (None, Some(g), PackLabels::Auto) => {
                return Ok((None, format!("no labels: not an ImageFolder tree (sample {:?} holds no .jpg, .jpeg, .png or .webp); --labels dirs writes them anyway", name(g[0]))))
            }
            _ => {}
        }
        let words = format!(
            "each sample gets a .cls member, its class index among {} classes from directory names ({} … {}, byte order), and every shard's index the class names; --labels none packs the files alone",
            classes.len(),
            String::from_utf8_lossy(&classes[0]),
            String::from_utf8_lossy(&classes[classes.len() - 1])
        );
        Ok((Some(ClassMembers { classes, dirs }), words))
    }

    /// The label member of the sample whose first file is `first`: its
    /// name (the sample's key + `.cls`) and its bytes (the class index).
    pub fn member(&self, files: &FileList, first: usize) -> (Vec<u8>, Vec<u8>) {
        let key = split_key(files.path_bytes(first)).0;
        let mut name = key.to_vec();
        name.extend_from_slice(b".");
        name.extend_from_slice(LABEL_FIELD.as_bytes());
        // `decide` saw every file inside one of the classes.
        let class = first_dir(key)
            .and_then(|_| self.dirs.class_of(key))
            .unwrap_or(0);
        (name, class.to_string().into_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> (FileList, Vec<Vec<usize>>) {
        let mut f = FileList::new();
        for n in names {
            f.push(n.as_bytes(), 1);
        }
        let groups = (0..names.len()).map(|i| vec![i]).collect();
        (f, groups)
    }

    #[test]
    fn an_image_folder_tree_gets_labels_and_others_say_why_not() {
        let (f, g) = files(&["ant/1.jpg", "bee/2.PNG", "cow/x/3.webp"]);
        let (members, words) = ClassMembers::decide(PackLabels::Auto, &f, &g).unwrap();
        let members = members.unwrap();
        assert!(words.contains("3 classes"), "{words}");
        assert_eq!(
            members.member(&f, 1),
            (b"bee/2.cls".to_vec(), b"1".to_vec())
        );
        assert_eq!(
            members.member(&f, 2),
            (b"cow/x/3.cls".to_vec(), b"2".to_vec())
        );
        let (f, g) = files(&["ant/1.jpg", "top.jpg"]);
        let (none, words) = ClassMembers::decide(PackLabels::Auto, &f, &g).unwrap();
        assert!(
            none.is_none() && words.contains("\"top.jpg\" is not inside"),
            "{words}"
        );
        let e = ClassMembers::decide(PackLabels::Dirs, &f, &g).unwrap_err();
        assert!(e.contains("--labels dirs: \"top.jpg\""), "{e}");
        let (f, g) = files(&["ant/1.bin", "bee/2.jpg"]);
        let (none, words) = ClassMembers::decide(PackLabels::Auto, &f, &g).unwrap();
        assert!(none.is_none() && words.contains("holds no .jpg"), "{words}");
        assert!(ClassMembers::decide(PackLabels::Dirs, &f, &g)
            .unwrap()
            .0
            .is_some());
        let mut with_cls = FileList::new();
        with_cls.push(b"ant/1.cls", 1);
        with_cls.push(b"ant/1.jpg", 1);
        let (none, _) = ClassMembers::decide(PackLabels::Auto, &with_cls, &[vec![0, 1]]).unwrap();
        assert!(none.is_none());
        assert!(ClassMembers::decide(PackLabels::Dirs, &with_cls, &[vec![0, 1]]).is_err());
    }
}
