//! `ringfeed gc`.

use anyhow::{Context, Result};

use crate::ring::gc::{collect, GcOutcome};
use crate::ring::segment::{human_bytes, SHM_DIR};

/// Removes segments of dead loaders and says what it did.
pub fn run() -> Result<()> {
    let outcomes = collect().with_context(|| format!("cannot list {SHM_DIR}"))?;
    let mut removed = 0;
    let mut failed = 0;
    for o in &outcomes {
        match o {
            GcOutcome::Removed { name, bytes } => {
                removed += 1;
                println!("removed {SHM_DIR}/ringfeed-{name} ({}), its loader is dead", human_bytes(*bytes));
            }
            GcOutcome::Alive { name } => println!("kept    {SHM_DIR}/ringfeed-{name}: its loader is running"),
            GcOutcome::Failed { name, error } => {
                failed += 1;
                eprintln!("error   {SHM_DIR}/ringfeed-{name}: {error}");
            }
        }
    }
    println!("{removed} segment(s) removed, {} kept", outcomes.len() - removed - failed);
    if failed > 0 {
        anyhow::bail!("{failed} segment(s) could not be inspected or removed (permissions?)");
    }
    Ok(())
}
