//! `ringfeed ls` (and `ringfeed stat` with no name): the loaders on this
//! machine that this user may attach to, one line each: name, owner, pid,
//! ranks attached, where the trainers are, state.

use anyhow::{Context, Result};

use crate::cli::say::say_out;
use crate::ring::loaders::{self, Listed};
use crate::ring::observer::Snapshot;
use crate::ring::segment::trust::{describe_uid, TRUST_UID_ENV};
use crate::ring::segment::SHM_DIR;

/// Prints the table, then how many other users' loaders were left out.
pub fn run() -> Result<()> {
    let found = loaders::list().with_context(|| format!("cannot list {SHM_DIR}"))?;
    let rows: Vec<[String; 6]> = found.listed.iter().map(row).collect();
    if rows.is_empty() {
        say_out!("no loader that this user may attach to is running on this machine");
    } else {
        let head = ["NAME", "OWNER", "PID", "RANKS", "PROGRESS", "STATE"].map(str::to_owned);
        let mut widths = head.clone().map(|h| h.len());
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for r in std::iter::once(&head).chain(&rows) {
            let cells: Vec<String> = r
                .iter()
                .zip(widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            say_out!("{}", cells.join("  ").trim_end());
        }
    }
    if found.others > 0 {
        say_out!(
            "({} loader(s) of other users not shown: a trainer here would not attach to them; {TRUST_UID_ENV}=UID shows a user's)",
            found.others
        );
    }
    Ok(())
}

/// One loader's cells: name, owner, pid, ranks attached, progress, state.
fn row(l: &Listed) -> [String; 6] {
    let owner = describe_uid(l.owner);
    match &l.seen {
        Ok(s) => [
            l.name.clone(),
            owner,
            s.loader_pid.to_string(),
            ranks_attached(s),
            s.progress.map_or_else(|| "-".to_owned(), |p| p.words()),
            super::stat::state(s, &l.name).0.to_owned(),
        ],
        Err(e) => [
            l.name.clone(),
            owner,
            "-".into(),
            "-".into(),
            "-".into(),
            format!("cannot be read: {e}"),
        ],
    }
}

/// "2/8 attached".
fn ranks_attached(s: &Snapshot) -> String {
    let attached = s.ranks.iter().filter(|r| r.attached).count();
    format!("{attached}/{} attached", s.ranks.len())
}
