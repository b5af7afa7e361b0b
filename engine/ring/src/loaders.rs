//! The loaders on this machine that this user may attach to: what `ringfeed
//! ls` lists, and the names a trainer waiting for a name that does not exist
//! is told, closest first (a misspelled `RINGFEED_NAME` would otherwise cost
//! its whole timeout in silence).
//!
//! Only segments whose owner a trainer trusts (`segment::trust`) are looked
//! at; other users' are counted, not opened. Names come from /dev/shm's
//! entries and are shown only when they are valid loader names
//! (`segment::validate_name`: letters, digits, `._-`).

use std::io;

use crate::consumer::AttachError;
use crate::observer::{Observer, Snapshot};
use crate::segment::{self, SEGMENT_PREFIX, SHM_DIR};

/// Most names a hint gives (closest first); the rest are counted.
const HINT_NAMES_MAX: usize = 8;

/// One segment of a user this one trusts.
#[derive(Debug)]
pub struct Listed {
    /// The loader's name.
    pub name: String,
    /// Its owner.
    pub owner: u32,
    /// What it shows, or why it cannot be read (not a ring, another
    /// version's, ...).
    pub seen: Result<Snapshot, AttachError>,
}

/// The loaders of /dev/shm.
#[derive(Debug, Default)]
pub struct Loaders {
    /// Those this user may attach to, by name.
    pub listed: Vec<Listed>,
    /// Segments of other users, not shown.
    pub others: usize,
}

/// Every ring name in /dev/shm that is a valid loader name, sorted.
fn names_in_shm() -> io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(SHM_DIR)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(SEGMENT_PREFIX))
                .filter(|n| segment::validate_name(n).is_ok())
                .map(str::to_string)
        })
        .collect();
    names.sort();
    Ok(names)
}

/// The loaders of /dev/shm: those this user may attach to, each looked at,
/// and how many other users' there are.
pub fn list() -> io::Result<Loaders> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Loaders::default();
    for name in names_in_shm()? {
        // Not followed: a link under a ring's name is no loader.
        let Ok(meta) = std::fs::symlink_metadata(segment::shm_path(&name)) else {
            continue; // gone meanwhile
        };
        if !meta.file_type().is_file() {
            continue;
        }
        if !segment::trust::owner_trusted(meta.uid()) {
            out.others += 1;
            continue;
        }
        let seen = Observer::open(&name).map(|o| o.snapshot());
        out.listed.push(Listed {
            owner: meta.uid(),
            name,
            seen,
        });
    }
    Ok(out)
}

/// The names of the live loaders this user may attach to.
pub fn running_names() -> Vec<String> {
    list()
        .map(|l| {
            l.listed
                .into_iter()
                .filter(|x| x.seen.as_ref().is_ok_and(|s| s.loader_alive))
                .map(|x| x.name)
                .collect()
        })
        .unwrap_or_default()
}

/// `names`, the closest to `name` first (edit distance, then name).
pub fn closest_first(name: &str, names: &[String]) -> Vec<String> {
    let mut scored: Vec<(usize, &String)> = names
        .iter()
        .map(|n| (edit_distance(name.as_bytes(), n.as_bytes()), n))
        .collect();
    scored.sort();
    scored.into_iter().map(|(_, n)| n.clone()).collect()
}

/// Levenshtein distance between two byte strings (loader names are at most
/// 64 bytes: one row of 65 numbers).
fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// What a trainer waiting for loader `name`, which does not exist, is told:
/// the names that do, closest first, or that there are none.
pub fn name_hint(name: &str) -> String {
    hint_for(name, &running_names())
}

fn hint_for(name: &str, running: &[String]) -> String {
    let others: Vec<String> = running.iter().filter(|n| *n != name).cloned().collect();
    if others.is_empty() {
        return "no loader that this user may attach to is running on this machine".to_owned();
    }
    let near = closest_first(name, &others);
    let shown: Vec<String> = near
        .iter()
        .take(HINT_NAMES_MAX)
        .map(|n| format!("{n:?}"))
        .collect();
    let more = match near.len().saturating_sub(HINT_NAMES_MAX) {
        0 => String::new(),
        n => format!(" and {n} more (`ringfeed ls`)"),
    };
    format!(
        "loaders running here, closest first: {}{more}",
        shown.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_closest_first_then_by_name() {
        let names: Vec<String> = ["train-b", "job1", "jbo1x", "job2", "eval"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            closest_first("jbo1", &names),
            ["jbo1x", "job1", "job2", "eval", "train-b"]
        );
        assert_eq!(edit_distance(b"", b"abc"), 3);
        assert_eq!(edit_distance(b"kitten", b"sitting"), 3);
    }

    #[test]
    fn a_hint_names_the_running_loaders_or_says_there_are_none() {
        assert_eq!(
            hint_for("jbo1", &[]),
            "no loader that this user may attach to is running on this machine"
        );
        let running = vec!["job1".to_string(), "other".to_string()];
        assert_eq!(
            hint_for("jbo1", &running),
            "loaders running here, closest first: \"job1\", \"other\""
        );
        let many: Vec<String> = (0..10).map(|i| format!("job{i}")).collect();
        assert!(hint_for("job", &many).ends_with(" and 2 more (`ringfeed ls`)"));
    }
}
