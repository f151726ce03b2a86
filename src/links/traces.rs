//! A run trace read through a space link (issue 23, D-003, D-014). A step
//! that reached another space carries that space's data; the holder may see
//! it only if it has a link of its own to that space (no transitivity), so
//! the step's arguments, output and error are withheld otherwise. Every step
//! is tagged with the space its data came from.
//!
//! Must never: show a step's arguments, output or error from a space the
//! reader has no unfiltered active edge to, or tag a step with a source it
//! did not have.

use std::collections::BTreeMap;

use crate::storage::Conn as Connection;

use super::active_grants;
use crate::storage::runs::RunStep;
use crate::storage::StoreResult;

/// What a withheld step shows in place of its output.
pub const WITHHELD: &str = "[output from another space withheld]";

/// Tags each step of a run of `run_space` with its true source and withholds
/// what came from a space `holder` has no link to. A conversation-filtered
/// edge does not count: it reaches one conversation, a step's output
/// anything of the space.
pub fn withhold_steps(
    conn: &Connection,
    holder: &str,
    run_space: &str,
    steps: &mut [RunStep],
) -> StoreResult<()> {
    let mut reach: BTreeMap<String, bool> = BTreeMap::new();
    for step in steps.iter_mut() {
        let mut hidden = false;
        for source in &step.source_spaces {
            if source == holder || source == run_space {
                continue;
            }
            let ok = match reach.get(source) {
                Some(ok) => *ok,
                None => {
                    let ok = active_grants(conn, holder, source)?
                        .iter()
                        .any(|g| g.conversation.is_none());
                    reach.insert(source.clone(), ok);
                    ok
                }
            };
            hidden |= !ok;
        }
        step.source_space = Some(if step.source_spaces.is_empty() {
            run_space.to_owned()
        } else {
            step.source_spaces.join(", ")
        });
        if hidden {
            step.withheld = true;
            step.arguments = None;
            step.error = None;
            step.output = Some(WITHHELD.to_owned());
        }
    }
    Ok(())
}
