//! What makes `mrctl` guide a person: headers on lists and `(none)` for an
//! empty one, links in words, paging hints, the server's header errors
//! rewritten as what to set, the "ran but ended failed" verdict (exit 3),
//! and the generated shell completions and man pages.
//!
//! Must never: change what `--json` prints for a success (the server's
//! answer as is), or print a hint on stdout (hints are for the person, on
//! stderr).

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;
use serde_json::Value;

use super::args::*;
use super::render::{cell, field, items, row, time_cell};

/// The column names of a list command's rows.
pub(super) fn list_header(cmd: &Command) -> Option<&'static [&'static str]> {
    Some(match cmd {
        Command::Spaces(SpacesCmd::List) => &["ID", "NAME", "TAGS"],
        Command::Conversations(ConversationsCmd::List { .. }) => {
            &["ID", "PLATFORM", "EXTERNAL ID", "SPACE", "KIND", "TITLE"]
        }
        Command::Prefs(PrefsCmd::List) => &["KEY", "VALUE"],
        Command::Tasks(TasksCmd::List) => &["ID", "SCHEDULE", "STATE", "NEXT", "PROMPT"],
        Command::Roles(RolesCmd::List) => &["CALLER", "ROLE", "GRANTED BY"],
        Command::Mutes(MutesCmd::List) => &["CALLER", "UNTIL", "REASON"],
        Command::Tokens(TokensCmd::List) => &[
            "ID", "CALLER", "KIND", "LABEL", "CREATED", "EXPIRES", "STATE",
        ],
        Command::Identities(IdentitiesCmd::List) => {
            &["PLATFORM ID", "OPERATOR", "CREATED BY", "CREATED"]
        }
        Command::Pairing(PairingCmd::List) => {
            &["CODE", "PLATFORM", "SENDER", "NAME", "CREATED", "EXPIRES"]
        }
        Command::Senders(SendersCmd::List) => &[
            "KIND",
            "PLATFORM",
            "SUBJECT",
            "STATUS",
            "DECIDED BY",
            "DECIDED",
        ],
        Command::Runs(RunsCmd::List { .. }) => &["ID", "KIND", "STATUS", "STARTED", "ENDED"],
        Command::Files(FilesCmd::Ls { .. }) => &["KIND", "SIZE", "HASH", "MODIFIED", "NAME"],
        Command::Links(LinksCmd::List { all: true }) => {
            &["LINK", "HOLDER -> TARGET", "LEVEL", "STATE"]
        }
        Command::Links(LinksCmd::List { all: false }) => {
            &["DIRECTION", "SPACE", "LEVEL", "LINK", "REACH", "DISCLOSURE"]
        }
        Command::Links(LinksCmd::Audit { .. }) => &[
            "AT",
            "CALLER",
            "ACTION",
            "HOLDER -> TARGET",
            "METHOD",
            "ROUTE",
            "STATUS",
        ],
        _ => return None,
    })
}

/// A list's rows under their header, or `(none)`.
pub(super) fn with_header(cmd: &Command, text: String) -> String {
    match list_header(cmd) {
        Some(_) if text.trim().is_empty() => "(none)\n".to_owned(),
        Some(cols) => format!(
            "{}{text}",
            row(&cols.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
        ),
        None => text,
    }
}

/// `links list`: each reach in words (who, level, link, wildcard or one
/// conversation).
pub(super) fn render_links_list(v: &Value) -> String {
    let reach = |key: &str, arrow: &str| -> String {
        items(v, key)
            .iter()
            .map(|r| {
                let scope = if field(r, "wildcard").as_bool() == Some(true) {
                    "every space (*)".to_owned()
                } else if let Some(c) = field(r, "conversation_id").as_i64() {
                    format!("conversation {c} only")
                } else {
                    "whole space".to_owned()
                };
                // The full rows (`links`) carry what the target side was told.
                let disclosure = items(v, "links")
                    .iter()
                    .find(|l| field(l, "id") == field(r, "link_id"))
                    .and_then(|l| field(l, "disclosure").as_str())
                    .unwrap_or("(none recorded)")
                    .to_owned();
                row(&[
                    arrow.to_owned(),
                    super::render::named_space(&cell(field(r, "space")), r.get("name")),
                    cell(field(r, "level")),
                    cell(field(r, "link_id")),
                    scope,
                    disclosure,
                ])
            })
            .collect()
    };
    format!(
        "{}{}",
        reach("outbound", "reaches"),
        reach("inbound", "reached by")
    )
}

/// One link in words: `link 3: family -> work (read), whole space; told: …`.
pub(super) fn link_line(l: &Value) -> String {
    let target = cell(field(l, "target_space_id"));
    let scope = if target == "*" {
        "wildcard: every space".to_owned()
    } else if let Some(c) = field(l, "target_conversation_id").as_i64() {
        format!("conversation {c} only")
    } else {
        "whole space".to_owned()
    };
    let mut line = format!(
        "link {}: {} -> {} ({}), {scope}",
        cell(field(l, "id")),
        cell(field(l, "holder_space_id")),
        target,
        cell(field(l, "level")),
    );
    match field(l, "disclosure").as_str() {
        Some(d) => line.push_str(&format!("; disclosure: {d}")),
        None => line.push_str("; disclosure: (none recorded)"),
    }
    if !field(l, "revoked_at").is_null() {
        line.push_str(&format!("; revoked {}", time_cell(field(l, "revoked_at"))));
    }
    line.push('\n');
    line
}

/// `links create` / `links inspect` in words.
pub(super) fn render_links_detail(cmd: &LinksCmd, v: &Value) -> String {
    match cmd {
        LinksCmd::Create { .. } => {
            let links = items(v, "links");
            let mut out: String = links.iter().map(link_line).collect();
            if links.is_empty() {
                out.push_str("(none)\n");
            }
            out
        }
        _ => {
            let mut out = link_line(field(v, "link"));
            for r in items(v, "granted_roles") {
                out.push_str(&format!(
                    "grants role {} to {} in {}\n",
                    cell(field(r, "role")),
                    cell(field(r, "caller_id")),
                    cell(field(r, "space_id"))
                ));
            }
            // What the link changed (issue 23), each with the value it replaced.
            let shown = |x: &Value| {
                x.as_str()
                    .map_or_else(|| "(none)".to_owned(), str::to_owned)
            };
            for c in items(v, "changes") {
                out.push_str(&format!(
                    "changed {} {} in {}: {} -> {}{}\n",
                    cell(field(c, "kind")),
                    cell(field(c, "key")),
                    cell(field(c, "space_id")),
                    shown(field(c, "before_value")),
                    shown(field(c, "after_value")),
                    match field(c, "outcome").as_str() {
                        Some(o) => format!(" ({o})"),
                        None if field(c, "superseded").as_bool() == Some(true) => {
                            " (written since)".to_owned()
                        }
                        None => String::new(),
                    }
                ));
            }
            out
        }
    }
}

/// A hint when a page is not the last one (`messages recent` without `--all`).
pub(super) fn paging_hint(cmd: &Command, v: &Value) -> Option<String> {
    let Command::Messages(MessagesCmd::Recent { all: false, .. }) = cmd else {
        return None;
    };
    let next = field(v, "next_cursor").as_str().filter(|c| !c.is_empty())?;
    Some(format!(
        "more messages: add --cursor {next} for the next page, or --all for every page"
    ))
}

/// Whether the server's sentence says the request named no working space
/// (or no holder for `--space`).
pub(super) fn is_missing_space(message: &str) -> bool {
    message.contains("x-mercury-space header naming a space")
        || message.contains("acting in another space needs a holder")
}

/// The server's sentences about the request headers, as what to set here.
pub(super) fn rewrite_header_message(message: &str) -> String {
    if message.contains("x-mercury-space header naming a space") {
        return "this command works in a space: give --in <space id> or set \
                MERCURY_SPACE=<space id> (inside a turn the run token names it)"
            .to_owned();
    }
    if message.contains("acting in another space needs a holder") {
        return "--space acts through a link from the working space: give \
                --in <holder space> (or set MERCURY_SPACE) as well"
            .to_owned();
    }
    if message.contains("x-mercury-act-as names the holder space itself") {
        return "--space names the working space itself (--in / MERCURY_SPACE): drop --space"
            .to_owned();
    }
    message
        .replace("x-mercury-act-as", "--space")
        .replace("x-mercury-space", "MERCURY_SPACE")
}

/// Why a request that succeeded still ended badly (exit 3): a failed chat
/// turn, a failed ask, a blocked or failed review.
pub(super) fn ended_badly(cmd: &Command, v: &Value) -> Option<String> {
    let status = field(v, "status").as_str().unwrap_or_default();
    match cmd {
        Command::Chat { .. } if matches!(status, "failed" | "stopped" | "interrupted") => {
            Some(format!(
                "the turn ended {status} (run {}; its reason is in the host's log and runs.error)",
                cell(field(v, "run_id"))
            ))
        }
        Command::Ask { .. } if matches!(status, "failed" | "stopped") => {
            Some(format!("the ask ended {status}"))
        }
        Command::Review(ReviewCmd::RunNow) if matches!(status, "blocked" | "failed") => {
            Some(format!("the review run ended {status}"))
        }
        _ => None,
    }
}

/// `mrctl completions SHELL`: the completion script on `out`.
pub(super) fn completions(shell: CompletionShell, out: &mut dyn Write) {
    let mut cmd = Cli::command();
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "mrctl", out);
}

/// `mrctl man DIR`: one page per command (`mrctl.1`, `mrctl-links-create.1`, …).
pub(super) fn man_pages(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    fn walk(
        cmd: &clap::Command,
        path: &[String],
        dir: &Path,
        n: &mut usize,
    ) -> std::io::Result<()> {
        let page = cmd.clone().name(path.join("-")).bin_name(path.join(" "));
        let mut buf = Vec::new();
        clap_mangen::Man::new(page).render(&mut buf)?;
        std::fs::write(dir.join(format!("{}.1", path.join("-"))), buf)?;
        *n += 1;
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut next = path.to_vec();
            next.push(sub.get_name().to_owned());
            walk(sub, &next, dir, n)?;
        }
        Ok(())
    }
    let mut n = 0;
    let mut root = Cli::command();
    root.build();
    walk(&root, &["mrctl".to_owned()], dir, &mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn links_read_as_words_with_level_wildcard_and_disclosure() {
        let v = json!({
            "links": [
                {"id": 1, "holder_space_id": "mgmt", "target_space_id": "*", "level": "read",
                 "disclosure": "told everyone on 1 May", "revoked_at": null},
                {"id": 2, "holder_space_id": "family", "target_space_id": "mgmt", "level": "admin",
                 "target_conversation_id": 7, "disclosure": null, "revoked_at": null}
            ],
            "outbound": [{"space": "*", "level": "read", "link_id": 1, "wildcard": true}],
            "inbound": [{"space": "family", "level": "admin", "link_id": 2, "conversation_id": 7}]
        });
        assert_eq!(
            render_links_list(&v),
            "reaches\t*\tread\t1\tevery space (*)\ttold everyone on 1 May\n\
             reached by\tfamily\tadmin\t2\tconversation 7 only\t(none recorded)\n"
        );
        assert_eq!(
            link_line(&v["links"][0]),
            "link 1: mgmt -> * (read), wildcard: every space; disclosure: told everyone on 1 May\n"
        );
        let list = Command::Links(LinksCmd::List { all: false });
        assert_eq!(with_header(&list, String::new()), "(none)\n");
        assert!(with_header(&list, "x\n".into()).starts_with("DIRECTION\tSPACE\tLEVEL"));
    }

    #[test]
    fn only_failed_or_blocked_runs_end_badly() {
        let chat = Command::Chat {
            text: "x".into(),
            conversation: None,
        };
        assert!(ended_badly(&chat, &json!({"status": "done"})).is_none());
        assert!(ended_badly(&chat, &json!({"status": "failed", "run_id": "r"})).is_some());
        let review = Command::Review(ReviewCmd::RunNow);
        assert!(ended_badly(&review, &json!({"status": "blocked"})).is_some());
        assert!(ended_badly(&review, &json!({"status": "done"})).is_none());
    }
}
