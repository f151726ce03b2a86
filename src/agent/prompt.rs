//! Prompt assembly: the platform block, the space's `AGENTS.md`, `MEMORY.md`,
//! preferences and session summary as the system message, then the recent
//! history (bounded, above the session boundary), then the user's text.
//!
//! Must never: include another space's data, the link audit, or anything
//! unbounded (every file and the history are capped).

use std::path::PathBuf;
use std::sync::Arc;

use crate::model::{ChatMessage, Role};
use crate::runtime::Runtime;
use crate::storage::spaces::{self, KvTable};
use crate::storage::{messages, StoreError};
use crate::workspace::read_capped;

const FILE_CAP: usize = 32 * 1024;

#[derive(Debug, Clone)]
pub struct PromptInputs {
    pub space_id: String,
    /// Directory holding `AGENTS.md` and `MEMORY.md` (the workspace or its copy).
    pub files_dir: PathBuf,
    /// History is read from messages with an id below this one.
    pub history_before: Option<i64>,
    /// Add the space-links paragraph (the caller holds `links.act`; D-012).
    pub links_paragraph: bool,
}

pub fn platform_block(space_id: &str, now: &str) -> String {
    format!(
        "You are Mercury, an assistant serving the space `{space_id}`. The time is {now}.\n\
         Your tools run in the space's workspace (the current directory): `shell`, `read_file`, \
         `write_file`, `list_files`, and `mrctl` to act on this space through its API \
         (tasks, preferences, messages) with the permissions of the person who asked.\n\
         Keep durable facts in MEMORY.md. Answer in plain text."
    )
}

pub async fn build(
    rt: &Arc<Runtime>,
    inputs: &PromptInputs,
    user_text: &str,
) -> Result<Vec<ChatMessage>, StoreError> {
    let agents = read_capped(&inputs.files_dir, "AGENTS.md", FILE_CAP);
    let memory = read_capped(&inputs.files_dir, "MEMORY.md", FILE_CAP);
    let space = inputs.space_id.clone();
    let before = inputs.history_before.unwrap_or(i64::MAX);
    let limit = rt.settings.turn.history_limit;
    let (prefs, summary, history) = rt
        .store
        .read(move |c| {
            let prefs = spaces::kv_list(c, KvTable::Preferences, &space)?;
            let (boundary, summary) = spaces::session_boundary(c, &space)?;
            let history = messages::history(c, &space, boundary, before, limit)?;
            Ok((prefs, summary, history))
        })
        .await?;
    let mut system = platform_block(&inputs.space_id, &chrono::Utc::now().to_rfc3339());
    if inputs.links_paragraph {
        system.push_str("\n\n");
        system.push_str(crate::links::LINKS_PARAGRAPH);
    }
    system.push_str("\n\n# Space instructions (AGENTS.md)\n");
    system.push_str(&agents);
    system.push_str("\n\n# Memory (MEMORY.md)\n");
    system.push_str(&memory);
    if !prefs.is_empty() {
        system.push_str("\n\n# Preferences\n");
        for p in &prefs {
            system.push_str(&format!("- {}: {}\n", p.key, p.value));
        }
    }
    if let Some(summary) = summary.filter(|s| !s.is_empty()) {
        system.push_str("\n\n# Summary of the earlier conversation\n");
        system.push_str(&summary);
    }
    let mut out = vec![ChatMessage::text(Role::System, system)];
    for m in history {
        match m.role.as_str() {
            "assistant" => out.push(ChatMessage::text(Role::Assistant, m.text)),
            "ambient" => out.push(ChatMessage::text(
                Role::User,
                format!(
                    "(said in the chat by {}, not addressed to you) {}",
                    m.sender_name.as_deref().unwrap_or("someone"),
                    m.text
                ),
            )),
            _ => out.push(ChatMessage::text(Role::User, m.text)),
        }
    }
    out.push(ChatMessage::text(Role::User, user_text));
    Ok(out)
}
