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
use crate::storage::{messages, Conn, StoreError, StoreResult};
use crate::workspace::read_capped;

const FILE_CAP: usize = 32 * 1024;

#[derive(Debug, Clone)]
pub(crate) struct PromptInputs {
    pub space_id: String,
    /// Directory holding `AGENTS.md` and `MEMORY.md` (the workspace or its copy).
    pub files_dir: PathBuf,
    /// History is read from messages with an id below this one.
    pub history_before: Option<i64>,
    /// Add the space-links paragraph (the caller holds `links.act`; D-012).
    pub links_paragraph: bool,
}

pub(crate) fn platform_block(space_id: &str, now: &str) -> String {
    format!(
        "You are Mercury, an assistant serving the space `{space_id}`. The time is {now}.\n\
         Your tools run in the space's workspace (the current directory): `shell`, `read_file`, \
         `write_file`, `list_files`, and `mrctl` to act on this space through its API \
         (tasks, preferences, messages) with the permissions of the person who asked.\n\
         Keep durable facts in MEMORY.md. Answer in plain text."
    )
}

/// The text a model reads for a message that opened with a trigger word:
/// `@mercury what is…` → `what is…`. Only a leading trigger word (standing
/// alone, with the punctuation that follows it) is cut; a mention inside the
/// text stays, and a message that is nothing but the word stays whole.
pub(crate) fn strip_trigger<'a>(
    text: &'a str,
    patterns: &[String],
    case_sensitive: bool,
) -> &'a str {
    let trimmed = text.trim_start();
    for p in patterns {
        let Some(head) = trimmed.get(..p.len()) else {
            continue;
        };
        let same = if case_sensitive {
            head == p
        } else {
            head.to_lowercase() == p.to_lowercase()
        };
        if !same {
            continue;
        }
        let rest = &trimmed[p.len()..];
        let rest = rest.trim_start_matches([',', ':', ';', '.', '!', '?']);
        if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
            continue;
        }
        let rest = rest.trim_start();
        if !rest.is_empty() {
            return rest;
        }
    }
    text
}

/// What a prompt reads from the store. A live turn reads them in the write
/// that opens its run (the writer's page cache is warm, and a read of their
/// own would be one more hand-off per turn); other turns read them here.
#[derive(Debug)]
pub(crate) struct PromptRows {
    prefs: Vec<spaces::KvEntry>,
    summary: Option<String>,
    history: Vec<messages::Message>,
}

impl PromptRows {
    /// The space's preferences, its session summary and the bounded history
    /// above its session boundary, of messages before `before`.
    pub(crate) fn read(conn: &Conn, space: &str, before: i64, limit: u32) -> StoreResult<Self> {
        let prefs = spaces::kv_list(conn, KvTable::Preferences, space)?;
        let (boundary, summary) = spaces::session_boundary(conn, space)?;
        let history = messages::history(conn, space, boundary, before, limit)?;
        Ok(Self {
            prefs,
            summary,
            history,
        })
    }
}

/// The prompt of a turn: `rows` when the turn read them already, else
/// read now.
pub(crate) async fn build(
    rt: &Arc<Runtime>,
    inputs: &PromptInputs,
    user_text: &str,
    rows: Option<PromptRows>,
) -> Result<Vec<ChatMessage>, StoreError> {
    let agents = read_capped(&inputs.files_dir, "AGENTS.md", FILE_CAP);
    let memory = read_capped(&inputs.files_dir, "MEMORY.md", FILE_CAP);
    let PromptRows {
        prefs,
        summary,
        history,
    } = match rows {
        Some(rows) => rows,
        None => {
            let space = inputs.space_id.clone();
            let before = inputs.history_before.unwrap_or(i64::MAX);
            let limit = rt.settings.turn.history_limit;
            rt.store
                .read(move |c| PromptRows::read(c, &space, before, limit))
                .await?
        }
    };
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

#[cfg(test)]
mod tests {
    use super::strip_trigger;

    fn words() -> Vec<String> {
        crate::config::trigger_patterns("@mercury,mercury")
    }

    #[test]
    fn a_leading_trigger_word_is_cut() {
        let w = words();
        assert_eq!(
            strip_trigger("@mercury what is 2+2?", &w, false),
            "what is 2+2?"
        );
        assert_eq!(
            strip_trigger("  Mercury, what is it", &w, false),
            "what is it"
        );
        assert_eq!(strip_trigger("@MERCURY: hi", &w, false), "hi");
        assert_eq!(strip_trigger("@MERCURY hi", &w, true), "@MERCURY hi");
    }

    #[test]
    fn anything_else_stays_whole() {
        let w = words();
        assert_eq!(
            strip_trigger("hey mercury, help", &w, false),
            "hey mercury, help"
        );
        assert_eq!(strip_trigger("mercurial mood", &w, false), "mercurial mood");
        assert_eq!(strip_trigger("@mercury", &w, false), "@mercury");
        assert_eq!(
            strip_trigger("ünïcödé @mercury x", &w, false),
            "ünïcödé @mercury x"
        );
        assert_eq!(strip_trigger("é", &w, false), "é");
    }
}
