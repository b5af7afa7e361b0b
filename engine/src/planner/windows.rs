//! Windows mode's plan (`crate::manifest::Windows`, docs/tokens.md): each
//! window sits end to end in the payload like any sample; its parts are
//! reads (one piece each, in window order) and separator tokens the loader
//! writes itself; its document starts are kept for the slot's starts region.

use super::{BatchPlan, Fill, Piece, Place, PlanError, Read, Tier};
use crate::manifest::{WindowPart, Windows};

/// Plans the windows `indices` of `windows` into `plan` (cleared by the
/// caller) within `slot_bytes`.
pub(super) fn plan_windows(
    indices: &[u64],
    windows: &dyn Windows,
    slot_bytes: u64,
    tier: Tier,
    plan: &mut BatchPlan,
) -> Result<(), PlanError> {
    let window_bytes = windows.window_bytes();
    let item_bytes = windows.item_bytes();
    let mut offset = 0u64;
    for (position, &index) in indices.iter().enumerate() {
        let end = offset + window_bytes;
        if end > slot_bytes {
            return Err(PlanError::SampleTooLarge {
                index,
                object: windows.first_byte(index).0,
                len_bytes: window_bytes,
                needed_bytes: window_bytes.saturating_mul(indices.len() as u64),
                slot_bytes,
            });
        }
        plan.places.push(Place {
            index,
            offset_bytes: offset,
            len_bytes: window_bytes,
        });
        let sample = u32::try_from(position).expect("a batch holds fewer than 2^32 samples");
        plan.window_parts.clear();
        windows.window(index, &mut plan.window_parts, &mut plan.doc_starts);
        plan.doc_starts_end.push(plan.doc_starts.len());
        let mut dest = offset;
        for part in &plan.window_parts {
            match *part {
                WindowPart::Read {
                    object,
                    offset_bytes,
                    len_bytes,
                } => {
                    let at = plan.pieces.len();
                    plan.pieces.push(Piece {
                        offset_bytes,
                        len_bytes,
                        dest_offset_bytes: dest,
                        sample,
                    });
                    plan.reads.push(Read {
                        tier,
                        object,
                        offset_bytes,
                        len_bytes,
                        pieces: at..at + 1,
                    });
                    dest += len_bytes;
                }
                WindowPart::Token(token) => {
                    plan.fills.push(Fill {
                        dest_offset_bytes: dest,
                        token,
                    });
                    dest += item_bytes;
                }
            }
        }
        debug_assert_eq!(dest, end, "window {index} of {window_bytes} bytes");
        offset = end;
    }
    plan.used_bytes = offset;
    Ok(())
}
