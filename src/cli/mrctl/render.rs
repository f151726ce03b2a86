//! The human-readable rendering of the API's answers.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use super::*;

pub(super) static NULL: Value = Value::Null;

pub(super) fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&NULL)
}

/// A value as one table cell: strings bare, lists comma-joined, absent as `-`.
/// Tabs and newlines become spaces so a cell cannot break the table.
pub(super) fn cell(v: &Value) -> String {
    let s = match v {
        Value::Null => "-".to_owned(),
        Value::String(s) if s.is_empty() => "-".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "-".to_owned(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    };
    s.replace(['\t', '\n', '\r'], " ")
}

/// Timestamps arrive as epoch milliseconds (storage's unit) or as text; both print as RFC 3339.
pub(super) fn time_cell(v: &Value) -> String {
    match v.as_i64() {
        Some(ms) => format_ms(ms),
        None => cell(v),
    }
}

/// Whole seconds, `Z`: the table shows no milliseconds. Beyond chrono's
/// calendar (about ±262,000 years) there is no date to show, so the number stays.
pub(super) fn format_ms(ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::Secs, true),
        None => ms.to_string(),
    }
}

pub(super) fn items<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn row(cells: &[String]) -> String {
    let mut line = cells.join("\t");
    line.push('\n');
    line
}

pub(super) fn message_line(m: &Value) -> String {
    let sender = [
        field(m, "sender_name"),
        field(m, "sender_id"),
        field(m, "role"),
    ]
    .into_iter()
    .find_map(|v| v.as_str().filter(|s| !s.is_empty()))
    .unwrap_or("?");
    let text = field(m, "text").as_str().unwrap_or_default();
    // The id as review reports cite it (`[msg N]`, for `messages show N`).
    // Continuation lines are indented so each message still starts with `[`.
    let id = match field(m, "id") {
        Value::Null => String::new(),
        id => format!("[msg {}] ", cell(id)),
    };
    format!(
        "{id}[{}] {sender}: {}\n",
        time_cell(field(m, "created_at")),
        text.replace('\n', "\n    ")
    )
}

/// `messages show`: the message asked for is marked with `>`, its context
/// indented beside it.
fn message_in_context(v: &Value) -> String {
    let target = field(v, "message_id");
    items(v, "messages")
        .iter()
        .map(|m| {
            let mark = if field(m, "id") == target { "> " } else { "  " };
            format!("{mark}{}", message_line(m))
        })
        .collect()
}

pub(super) fn kv_lines(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
}

/// The human form of an answer: text for stdout and an optional note for stderr.
pub(super) fn render(cmd: &Command, v: &Value) -> (String, Option<String>) {
    let mut note = None;
    let out = match cmd {
        Command::Whoami => {
            let kind = cell(field(v, "token_kind"));
            let admin = if field(v, "global_admin").as_bool() == Some(true) {
                " (global admin)"
            } else {
                ""
            };
            let perms = items(v, "permissions");
            let via = field(v, "via");
            // A shadow says so first: its sends go to a transcript, not to people.
            let shadow = if field(v, "shadow").as_bool() == Some(true) {
                "host: SHADOW (nothing is delivered; sends go to the transcript)\n"
            } else {
                ""
            };
            let body = if via.is_object() {
                kv_lines(&[
                    ("caller", cell(field(v, "caller_id"))),
                    ("token", format!("{kind}{admin}")),
                    ("space", cell(field(v, "space_id"))),
                    (
                        "via",
                        format!(
                            "link {} from {} ({})",
                            cell(field(via, "link_id")),
                            cell(field(via, "holder")),
                            cell(field(via, "level"))
                        ),
                    ),
                ])
            } else {
                let mut pairs = vec![("caller", cell(field(v, "caller_id")))];
                if let Some(p) = field(v, "identity").as_str() {
                    pairs.push(("identity", p.to_owned()));
                }
                pairs.extend([
                    ("token", format!("{kind}{admin}")),
                    ("space", cell(field(v, "space_id"))),
                    ("role", cell(field(v, "role"))),
                    (
                        "permissions",
                        if perms.is_empty() {
                            "(none)".to_owned()
                        } else {
                            perms.iter().map(cell).collect::<Vec<_>>().join(", ")
                        },
                    ),
                ]);
                kv_lines(&pairs)
            };
            format!("{shadow}{body}")
        }
        Command::Spaces(cmd) => match cmd {
            SpacesCmd::List => items(v, "spaces")
                .iter()
                .map(|s| {
                    row(&[
                        cell(field(s, "id")),
                        cell(field(s, "name")),
                        cell(field(s, "tags")),
                    ])
                })
                .collect(),
            SpacesCmd::Create { .. } => {
                let s = field(v, "space");
                format!(
                    "created space {} ({})\n",
                    cell(field(s, "id")),
                    cell(field(s, "name"))
                )
            }
            SpacesCmd::Current => {
                let s = field(v, "space");
                kv_lines(&[
                    ("id", cell(field(s, "id"))),
                    ("name", cell(field(s, "name"))),
                    ("tags", cell(field(s, "tags"))),
                    ("created", time_cell(field(s, "created_at"))),
                    ("updated", time_cell(field(s, "updated_at"))),
                ])
            }
            SpacesCmd::Rename { .. } => {
                format!(
                    "space {} is now named {}\n",
                    cell(field(v, "space_id")),
                    cell(field(v, "name"))
                )
            }
            SpacesCmd::Delete => {
                let removed: Vec<String> = field(v, "removed")
                    .as_object()
                    .map(|m| m.iter().map(|(k, n)| format!("{k} {}", cell(n))).collect())
                    .unwrap_or_default();
                let detail = if removed.is_empty() {
                    String::new()
                } else {
                    format!("; removed {}", removed.join(", "))
                };
                format!("deleted space {}{detail}\n", cell(field(v, "space_id")))
            }
        },
        Command::Conversations(cmd) => match cmd {
            ConversationsCmd::List { .. } => items(v, "conversations")
                .iter()
                .map(|c| {
                    row(&[
                        cell(field(c, "id")),
                        cell(field(c, "platform")),
                        cell(field(c, "external_id")),
                        cell(field(c, "space_id")),
                        cell(field(c, "kind")),
                        cell(field(c, "title")),
                    ])
                })
                .collect(),
            ConversationsCmd::Link { .. } => format!(
                "conversation {} is linked to space {}\n",
                cell(field(v, "conversation_id")),
                cell(field(v, "space_id"))
            ),
            ConversationsCmd::Unlink { .. } => {
                format!(
                    "conversation {} is not linked to any space\n",
                    cell(field(v, "conversation_id"))
                )
            }
        },
        Command::Messages(MessagesCmd::Show { .. }) => message_in_context(v),
        Command::Messages(_) => items(v, "messages").iter().map(message_line).collect(),
        Command::Prefs(cmd) => match cmd {
            PrefsCmd::List => items(v, "preferences")
                .iter()
                .map(|p| row(&[cell(field(p, "key")), cell(field(p, "value"))]))
                .collect(),
            // The bare value, so `$(mrctl prefs get k)` works.
            PrefsCmd::Get { .. } => format!(
                "{}\n",
                field(v, "value")
                    .as_str()
                    .map_or_else(|| cell(field(v, "value")), str::to_owned)
            ),
            PrefsCmd::Set { .. } => {
                format!("{} = {}\n", cell(field(v, "key")), cell(field(v, "value")))
            }
            PrefsCmd::Delete { .. } => format!("deleted preference {}\n", cell(field(v, "key"))),
        },
        Command::Config(cmd) => match cmd {
            ConfigCmd::Get { key: Some(_) } => {
                format!(
                    "{}\n",
                    field(v, "value")
                        .as_str()
                        .map_or_else(|| cell(field(v, "value")), str::to_owned)
                )
            }
            ConfigCmd::Get { key: None } => render_config(v),
            ConfigCmd::Set { .. } => {
                format!("{} = {}\n", cell(field(v, "key")), cell(field(v, "value")))
            }
        },
        Command::Tasks(cmd) => match cmd {
            TasksCmd::List => items(v, "tasks")
                .iter()
                .map(|t| task_row(t, field(v, "timezone")))
                .collect(),
            TasksCmd::Create { .. } | TasksCmd::Pause { .. } | TasksCmd::Resume { .. } => {
                task_row(field(v, "task"), field(v, "timezone"))
            }
            TasksCmd::Run { .. } => format!(
                "task {} fired as message {}\n",
                cell(field(v, "task_id")),
                cell(field(v, "message_id"))
            ),
            TasksCmd::Delete { .. } => format!("deleted task {}\n", cell(field(v, "task_id"))),
        },
        Command::Roles(cmd) => match cmd {
            RolesCmd::List => items(v, "roles")
                .iter()
                .map(|r| {
                    row(&[
                        cell(field(r, "caller_id")),
                        cell(field(r, "role")),
                        cell(field(r, "granted_by")),
                    ])
                })
                .collect(),
            RolesCmd::Grant { .. } => format!(
                "{} now has the role {}\n",
                cell(field(v, "caller_id")),
                cell(field(v, "role"))
            ),
            RolesCmd::Revoke { .. } => {
                if field(v, "revoked").as_bool() == Some(true) {
                    format!("revoked the role of {}\n", cell(field(v, "caller_id")))
                } else {
                    format!("{} had no granted role\n", cell(field(v, "caller_id")))
                }
            }
        },
        Command::Permissions(_) => match field(v, "roles").as_object() {
            Some(roles) => roles
                .iter()
                .map(|(role, perms)| row(&[role.clone(), cell(perms)]))
                .collect(),
            None => row(&[cell(field(v, "role")), cell(field(v, "permissions"))]),
        },
        Command::Mutes(cmd) => match cmd {
            MutesCmd::List => items(v, "mutes").iter().map(mute_row).collect(),
            MutesCmd::Set { .. } => mute_row(field(v, "mute")),
            MutesCmd::Delete { .. } => {
                if field(v, "deleted").as_bool() == Some(true) {
                    format!("unmuted {}\n", cell(field(v, "caller_id")))
                } else {
                    format!("{} was not muted\n", cell(field(v, "caller_id")))
                }
            }
        },
        Command::Ext(cmd) => match cmd {
            ExtCmd::List => items(v, "extensions")
                .iter()
                .map(|e| {
                    let state = if field(e, "enabled").as_bool() == Some(true) {
                        "enabled"
                    } else {
                        "-"
                    };
                    row(&[
                        cell(field(e, "name")),
                        state.to_string(),
                        cell(field(e, "description")),
                    ])
                })
                .collect(),
            ExtCmd::Enable { .. } | ExtCmd::Disable { .. } => {
                let what = if field(v, "enabled").as_bool() == Some(true) {
                    "enabled"
                } else {
                    "disabled"
                };
                format!("{} {what}\n", cell(field(v, "name")))
            }
        },
        Command::Model(cmd) => {
            let chain = items(v, "chain").iter().map(cell).collect::<Vec<_>>();
            match (cmd, chain.is_empty()) {
                (ModelCmd::Set { .. }, true) => {
                    "model chain reset to the host default\n".to_owned()
                }
                (ModelCmd::Set { .. }, false) => format!("model chain: {}\n", chain.join(", ")),
                (ModelCmd::Get, _) => format!(
                    "{} (from the {} setting)\n",
                    chain.join(", "),
                    cell(field(v, "source"))
                ),
            }
        }
        Command::Control(cmd) => match cmd {
            ControlCmd::Stop => {
                let dropped = field(v, "dropped").as_u64().unwrap_or(0);
                let head = if field(v, "stopped").as_bool() == Some(true) {
                    "stopped the running turn"
                } else {
                    "no turn was running"
                };
                format!("{head}; dropped {dropped} queued message(s)\n")
            }
            ControlCmd::Compact => {
                if field(v, "compacted").as_bool() == Some(true) {
                    format!(
                        "compacted the session; summary:\n{}\n",
                        field(v, "summary").as_str().unwrap_or("-")
                    )
                } else {
                    "nothing to compact\n".to_owned()
                }
            }
            ControlCmd::Clear => "cleared the session\n".to_owned(),
        },
        Command::Ui(UiCmd::Login) => {
            let expires = field(v, "expires_at")
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map(|t| t.format("%H:%M:%S UTC").to_string())
                .unwrap_or_default();
            match field(v, "url").as_str() {
                Some(url) => format!("{url}\n(signs in once, until {expires})\n"),
                None => format!(
                    "{}\n(a path on the host's HTTP listener; signs in once, until {expires})\n",
                    cell(field(v, "path"))
                ),
            }
        }
        // A shadow copy delivers nothing: the send is held in its transcript.
        Command::Send { .. } if field(v, "shadow").as_bool() == Some(true) => format!(
            "held (shadow copy: not delivered, written to the shadow's transcript) for conversation {}\n",
            cell(field(v, "conversation_id"))
        ),
        Command::Send { .. } => format!(
            "queued as outbox item {} in conversation {}\n",
            cell(field(v, "outbox_id")),
            cell(field(v, "conversation_id"))
        ),
        Command::Tokens(cmd) => match cmd {
            TokensCmd::Create { .. } => {
                // The token alone on stdout so `mrctl tokens create x > file` captures just it.
                note = Some(format!(
                    "token {} for {} ({}); it is shown only this once",
                    cell(field(v, "id")),
                    cell(field(v, "caller_id")),
                    cell(field(v, "kind"))
                ));
                format!("{}\n", cell(field(v, "token")))
            }
            TokensCmd::List => items(v, "tokens")
                .iter()
                .map(|t| {
                    let state = if field(t, "revoked_at").is_null() {
                        "active".to_owned()
                    } else {
                        format!("revoked {}", time_cell(field(t, "revoked_at")))
                    };
                    row(&[
                        cell(field(t, "id")),
                        cell(field(t, "caller_id")),
                        cell(field(t, "kind")),
                        cell(field(t, "label")),
                        time_cell(field(t, "created_at")),
                        time_cell(field(t, "expires_at")),
                        state,
                    ])
                })
                .collect(),
            TokensCmd::Revoke { .. } => format!("revoked token {}\n", cell(field(v, "id"))),
        },
        Command::Identities(cmd) => match cmd {
            IdentitiesCmd::Link { .. } => {
                let i = field(v, "identity");
                format!(
                    "{} now acts as {}\n",
                    cell(field(i, "platform_id")),
                    cell(field(i, "caller_id"))
                )
            }
            IdentitiesCmd::Unlink { .. } => format!(
                "{} no longer acts as {}\n",
                cell(field(v, "platform_id")),
                cell(field(v, "caller_id"))
            ),
            IdentitiesCmd::List => items(v, "identities")
                .iter()
                .map(|i| {
                    row(&[
                        cell(field(i, "platform_id")),
                        cell(field(i, "caller_id")),
                        cell(field(i, "created_by")),
                        time_cell(field(i, "created_at")),
                    ])
                })
                .collect(),
            IdentitiesCmd::Audit { .. } => items(v, "audit")
                .iter()
                .map(|a| {
                    row(&[
                        time_cell(field(a, "at")),
                        cell(field(a, "by")),
                        cell(field(a, "action")),
                        cell(field(a, "platform_id")),
                        cell(field(a, "caller_id")),
                    ])
                })
                .collect(),
        },
        Command::Pairing(cmd) => match cmd {
            PairingCmd::List => items(v, "pairings")
                .iter()
                .map(|p| {
                    row(&[
                        cell(field(p, "code")),
                        cell(field(p, "platform")),
                        cell(field(p, "sender")),
                        cell(field(p, "name")),
                        time_cell(field(p, "created_at")),
                        time_cell(field(p, "expires_at")),
                    ])
                })
                .collect(),
            PairingCmd::Approve { .. } => format!(
                "approved {}: {} may now talk to the bot (and was told so)\n",
                cell(field(field(v, "pairing"), "code")),
                cell(field(field(v, "pairing"), "sender"))
            ),
            PairingCmd::Deny { .. } => format!(
                "denied {}: nothing from {} is answered from now on\n",
                cell(field(field(v, "pairing"), "code")),
                cell(field(field(v, "pairing"), "sender"))
            ),
        },
        Command::Senders(cmd) => match cmd {
            SendersCmd::List => items(v, "senders")
                .iter()
                .map(|r| {
                    row(&[
                        cell(field(r, "kind")),
                        cell(field(r, "platform")),
                        cell(field(r, "subject")),
                        cell(field(r, "status")),
                        cell(field(r, "decided_by")),
                        time_cell(field(r, "created_at")),
                    ])
                })
                .collect(),
            SendersCmd::Forget { .. } => forgotten(v),
            SendersCmd::Allow { .. } | SendersCmd::Deny { .. } => {
                let r = field(v, "rule");
                format!(
                    "{} {} on {} is now {}\n",
                    cell(field(r, "kind")),
                    cell(field(r, "subject")),
                    cell(field(r, "platform")),
                    cell(field(r, "status"))
                )
            }
        },
        Command::Chat { .. } => match field(v, "reply").as_str() {
            Some(reply) => format!("{reply}\n"),
            None => {
                note = Some(format!(
                    "the turn ended with status {} and no reply (run {})",
                    cell(field(v, "status")),
                    cell(field(v, "run_id"))
                ));
                String::new()
            }
        },
        Command::Links(cmd) => match cmd {
            LinksCmd::List { all: true } => {
                let names = field(v, "space_names");
                let named = |id: &Value| named_space(&cell(id), names.get(cell(id)));
                items(v, "links")
                    .iter()
                    .map(|l| {
                        row(&[
                            format!("link {}", cell(field(l, "id"))),
                            format!(
                                "{} -> {}",
                                named(field(l, "holder_space_id")),
                                named(field(l, "target_space_id"))
                            ),
                            cell(field(l, "level")),
                            if field(l, "revoked_at").is_null() {
                                "active".to_owned()
                            } else {
                                "revoked".to_owned()
                            },
                        ])
                    })
                    .collect()
            }
            LinksCmd::List { all: false } => super::guide::render_links_list(v),
            LinksCmd::Create { .. } | LinksCmd::Inspect { .. } => {
                super::guide::render_links_detail(cmd, v)
            }
            LinksCmd::Audit { .. } => items(v, "audit")
                .iter()
                .map(|a| {
                    row(&[
                        time_cell(field(a, "at")),
                        cell(field(a, "caller_id")),
                        cell(field(a, "action")),
                        format!(
                            "{} -> {}",
                            cell(field(a, "holder_space_id")),
                            cell(field(a, "target_space_id"))
                        ),
                        cell(field(a, "method")),
                        cell(field(a, "route")),
                        cell(field(a, "status")),
                    ])
                })
                .collect(),
            LinksCmd::Revoke { .. } | LinksCmd::Update { .. } => {
                let l = field(v, "link");
                let mut out = format!(
                    "link {} {} -> {} ({}){}\n",
                    cell(field(l, "id")),
                    cell(field(l, "holder_space_id")),
                    cell(field(l, "target_space_id")),
                    cell(field(l, "level")),
                    if field(l, "revoked_at").is_null() {
                        ""
                    } else {
                        ", revoked"
                    }
                );
                for r in items(v, "removed_roles") {
                    out.push_str(&format!(
                        "removed role {} of {} in {}\n",
                        cell(field(r, "role")),
                        cell(field(r, "caller_id")),
                        cell(field(r, "space_id"))
                    ));
                }
                for r in items(v, "restored") {
                    out.push_str(&format!(
                        "restored {}: {} (was {})\n",
                        settled_subject(r),
                        settled_value(field(r, "value")),
                        settled_value(field(r, "replaced"))
                    ));
                }
                for k in items(v, "kept") {
                    out.push_str(&format!(
                        "kept {}: {} ({})\n",
                        settled_subject(k),
                        settled_value(field(k, "value")),
                        field(k, "reason").as_str().unwrap_or("changed since")
                    ));
                }
                out
            }
        },
        Command::Ask { .. } => render_ask(v),
        Command::Budget(_) => render_budget(cmd, v),
        Command::Cost { by, .. } => render_cost(*by, v),
        Command::Runs(RunsCmd::Show { .. }) => render_run_trace(v),
        Command::Files(cmd) => render_files(cmd, v),
        Command::Runs(RunsCmd::List { .. }) => items(v, "runs")
            .iter()
            .map(|r| {
                let ended = [field(r, "finished_at"), field(r, "ended_at")]
                    .into_iter()
                    .find(|x| !x.is_null())
                    .unwrap_or(&NULL);
                row(&[
                    cell(field(r, "id")),
                    cell(field(r, "kind")),
                    cell(field(r, "status")),
                    time_cell(field(r, "started_at")),
                    time_cell(ended),
                ])
            })
            .collect(),
        Command::Review(ReviewCmd::RunNow) => render_review_run(v),
        Command::Completions { .. } | Command::Man { .. } | Command::Bridge { .. } => String::new(),
        Command::Review(ReviewCmd::Reports) => items(v, "reports")
            .iter()
            .map(|r| row(&[cell(field(r, "name")), cell(field(r, "kind"))]))
            .collect(),
        Command::Review(ReviewCmd::Report { .. }) => render_report(v),
        Command::Review(ReviewCmd::Digest) => render_digest(v),
        Command::Review(ReviewCmd::Ledger) => items(v, "rows")
            .iter()
            .map(|r| {
                row(&[
                    cell(field(r, "id")),
                    cell(field(r, "bot")),
                    cell(field(r, "date")),
                    format!("[msg {}]", cell(field(r, "message_id"))),
                    cell(field(r, "proposed")),
                    if field(r, "approved").is_null() {
                        "-".to_owned()
                    } else {
                        cell(field(r, "approved"))
                    },
                    cell(field(r, "summary")),
                ])
            })
            .collect(),
        Command::Review(ReviewCmd::WeeklyNow) => kv_lines(&[
            ("report", cell(field(v, "report_path"))),
            ("clusters", cell(field(v, "clusters"))),
            ("promoted to global", cell(field(v, "promoted"))),
            ("recall", cell(field(field(v, "recall"), "estimate"))),
            ("verdicts", cell(field(field(v, "verdicts"), "n"))),
            ("cost", money(field(v, "cost"), field(v, "currency"))),
        ]),
    };
    // A server's warning about a change it made anyway (a key-less
    // provider, an operator never seen) is for the person, on stderr.
    if note.is_none() {
        note = field(v, "warning")
            .as_str()
            .map(|w| format!("warning: {w}"));
    }
    (out, note)
}

/// A space id with its name beside it, when it has one other than the id.
pub(super) fn named_space(id: &str, name: Option<&Value>) -> String {
    match name.and_then(Value::as_str) {
        Some(n) if n != id => format!("{id} ({n})"),
        _ => id.to_owned(),
    }
}

/// What a revoke or downgrade settled: `permissions of member in t`.
fn settled_subject(v: &Value) -> String {
    let key = field(v, "key").as_str().unwrap_or_default();
    let what = match field(v, "kind").as_str() {
        Some("permissions") => format!(
            "permissions of {}",
            key.strip_prefix("role.")
                .and_then(|k| k.strip_suffix(".permissions"))
                .unwrap_or(key)
        ),
        Some("role") => format!("role of {key}"),
        Some("preference") => format!("preference {key}"),
        _ => format!("config {key}"),
    };
    format!("{what} in {}", cell(field(v, "space_id")))
}

fn settled_value(v: &Value) -> String {
    v.as_str()
        .map_or_else(|| "(none)".to_owned(), str::to_owned)
}

/// `runs show`: the run, then one line per step (a tool call with its
/// arguments and exit code, its output indented below).
pub(super) fn render_run_trace(v: &Value) -> String {
    let r = field(v, "run");
    let u = field(v, "usage");
    let mut out = kv_lines(&[
        ("run", cell(field(r, "id"))),
        ("space", cell(field(r, "space_id"))),
        (
            "kind",
            format!("{}, {}", cell(field(r, "kind")), cell(field(r, "status"))),
        ),
        ("started", time_cell(field(r, "started_at"))),
        ("finished", time_cell(field(r, "finished_at"))),
        (
            "tokens",
            format!(
                "{} in, {} out",
                cell(field(u, "tokens_in")),
                cell(field(u, "tokens_out"))
            ),
        ),
        ("cost", money(field(u, "cost"), field(v, "currency"))),
    ]);
    if let Some(e) = field(r, "error").as_str() {
        out.push_str(&format!(
            "error: {e}
"
        ));
    }
    // Through a link (`source_space` at the top) every line says whose data
    // it is: the run's header the target's, each step its own source.
    let via = field(v, "source_space").as_str();
    if let Some(source) = via {
        out = out
            .lines()
            .map(|l| format!("[from {source}] {l}\n"))
            .collect();
    }
    for s in items(v, "steps") {
        let sources: Vec<&str> = items(s, "source_spaces")
            .iter()
            .filter_map(|x| x.as_str())
            .collect();
        let tag = match field(s, "source_space").as_str() {
            Some(t) => Some(t.to_owned()),
            None if !sources.is_empty() => Some(sources.join(", ")),
            None => via.map(str::to_owned),
        };
        let mut lines = String::new();
        let head = match field(s, "kind").as_str() {
            Some("tool") => format!(
                "#{} tool {} {} exit {} ({} ms, {} bytes out)",
                cell(field(s, "seq")),
                cell(field(s, "name")),
                if field(s, "withheld").as_bool() == Some(true) {
                    "[arguments withheld]"
                } else {
                    field(s, "arguments").as_str().unwrap_or("{}")
                },
                cell(field(s, "exit_code")),
                cell(field(s, "duration_ms")),
                cell(field(s, "output_bytes")),
            ),
            _ => format!(
                "#{} model {} ({} in, {} out, {} ms)",
                cell(field(s, "seq")),
                cell(field(s, "name")),
                cell(field(s, "tokens_in")),
                cell(field(s, "tokens_out")),
                cell(field(s, "duration_ms")),
            ),
        };
        lines.push_str(&head);
        lines.push('\n');
        if let Some(e) = field(s, "error").as_str() {
            lines.push_str(&format!("    error: {e}\n"));
        }
        if let Some(o) = field(s, "output").as_str().filter(|o| !o.is_empty()) {
            for line in o.lines() {
                lines.push_str(&format!("    {line}\n"));
            }
        }
        match tag {
            Some(t) => lines
                .lines()
                .for_each(|l| out.push_str(&format!("[from {t}] {l}\n"))),
            None => out.push_str(&lines),
        }
    }
    out
}

/// `files ls|cat|put|rm` (`edit` prints its own line).
pub(super) fn render_files(cmd: &FilesCmd, v: &Value) -> String {
    match cmd {
        FilesCmd::Ls { .. } => items(v, "entries")
            .iter()
            .map(|e| {
                let name = match field(e, "kind").as_str() {
                    Some("dir") => format!("{}/", cell(field(e, "name"))),
                    _ => cell(field(e, "name")),
                };
                row(&[
                    cell(field(e, "kind")),
                    cell(field(e, "size")),
                    super::files::short_hash(field(e, "hash")),
                    time_cell(field(e, "modified")),
                    name,
                ])
            })
            .collect(),
        FilesCmd::Cat { .. } | FilesCmd::Edit { .. } => {
            field(v, "content").as_str().unwrap_or_default().to_owned()
        }
        FilesCmd::Put { .. } => format!(
            "wrote {} ({} bytes, hash {}){}\n",
            cell(field(v, "path")),
            cell(field(v, "size")),
            super::files::short_hash(field(v, "hash")),
            if field(v, "created").as_bool() == Some(true) {
                ", new file"
            } else {
                ""
            }
        ),
        FilesCmd::Rm { .. } => format!("deleted {}\n", cell(field(v, "path"))),
    }
}

/// `ask`: the reply labelled with the space, then the refusals, what the
/// throwaway copy was written (discarded), then the cost.
pub(super) fn render_ask(v: &Value) -> String {
    let source = match field(v, "source_space") {
        Value::Null => field(v, "space_id"),
        s => s,
    };
    let mut out = format!(
        "[{}] {}\n",
        cell(source),
        field(v, "reply").as_str().unwrap_or("(no reply)")
    );
    let refusals = items(v, "refusals");
    if refusals.is_empty() {
        out.push_str("\nrefused writes: none\n");
    } else {
        out.push_str("\nrefused writes:\n");
        for r in refusals {
            out.push_str(&format!(
                "- {}\n",
                field(r, "summary").as_str().unwrap_or_default()
            ));
        }
    }
    let discarded = field(v, "discarded");
    let changes = items(discarded, "changes");
    if changes.is_empty() {
        out.push_str("\nwritten in the throwaway copy (discarded): nothing\n");
    } else {
        out.push_str("\nwritten in the throwaway copy (discarded):\n");
        for c in changes {
            out.push_str(&format!(
                "- {} {}\n",
                cell(field(c, "kind")),
                cell(field(c, "path"))
            ));
        }
        if field(discarded, "more").as_bool() == Some(true) {
            out.push_str("- … and more, not listed\n");
        }
    }
    out.push_str(&format!(
        "\ntokens: {} in, {} out; cost: {}\n",
        cell(field(v, "tokens_in")),
        cell(field(v, "tokens_out")),
        money(field(v, "cost"), field(v, "currency"))
    ));
    out
}

/// `budget show` / `budget set`.
fn render_budget(cmd: &Command, v: &Value) -> String {
    if let Command::Budget(BudgetCmd::Set { .. }) = cmd {
        let show = |x: &Value| match x.as_f64() {
            None => "default".to_owned(),
            Some(0.0) => "no cap".to_owned(),
            Some(_) => cell(x),
        };
        return kv_lines(&[
            ("space", cell(field(v, "space_id"))),
            ("daily", show(field(v, "daily"))),
            ("monthly", show(field(v, "monthly"))),
            (
                "timezone",
                field(v, "timezone")
                    .as_str()
                    .unwrap_or("default")
                    .to_owned(),
            ),
        ]);
    }
    let currency = field(v, "currency");
    let mut out = format!(
        "currency: {}, time zone: {}{}\n",
        cell(currency),
        cell(field(v, "timezone")),
        if field(v, "allow_unpriced").as_bool() == Some(true) {
            ", unpriced models allowed"
        } else {
            ""
        }
    );
    let caps = items(v, "caps");
    if caps.is_empty() {
        out.push_str("no cap is set\n");
    }
    for c in caps {
        out.push_str(&format!(
            "{}: {} of {} used since {}\n",
            cell(field(c, "cap")),
            money(field(c, "used"), currency),
            money(field(c, "limit"), currency),
            cell(field(c, "since"))
        ));
    }
    out
}

/// `cost`: the total, then each breakdown (or the one `--by` names).
fn render_cost(by: Option<CostBy>, v: &Value) -> String {
    let currency = field(v, "currency");
    let mut out = format!(
        "since {}: {} in {} call(s)\n",
        cell(field(v, "since")),
        money(field(v, "total"), currency),
        cell(field(v, "calls"))
    );
    for (which, key, title) in [
        (CostBy::Space, "by_space", "space"),
        (CostBy::Day, "by_day", "day"),
        (CostBy::Purpose, "by_purpose", "purpose"),
        (CostBy::Model, "by_model", "model"),
    ] {
        if by.is_some_and(|b| b != which) {
            continue;
        }
        out.push_str(&format!("\nby {title}:\n"));
        for l in items(v, key) {
            out.push_str(&format!(
                "  {}  {}  {} call(s), {} in / {} out\n",
                cell(field(l, "key")),
                money(field(l, "cost"), currency),
                cell(field(l, "calls")),
                cell(field(l, "tokens_in")),
                cell(field(l, "tokens_out"))
            ));
        }
    }
    out
}

/// An amount in the one currency format (`crate::spend::format_amount`).
pub(super) fn money(amount: &Value, currency: &Value) -> String {
    crate::spend::format_amount(
        amount.as_f64().unwrap_or(0.0),
        currency.as_str().unwrap_or("USD"),
    )
}

/// `review run-now`: the outcome, the report path and the footer counts.
pub(super) fn render_review_run(v: &Value) -> String {
    let status = cell(field(v, "status"));
    if status == "running" {
        return format!(
            "review run {} is still running; the report and the digest follow when it ends\n",
            cell(field(v, "run_id"))
        );
    }
    let mut pairs = vec![("run", cell(field(v, "run_id"))), ("status", status)];
    if !field(v, "error").is_null() {
        pairs.push(("reason", cell(field(v, "error"))));
    }
    pairs.extend([
        ("report", cell(field(v, "report_path"))),
        ("findings", cell(field(v, "findings"))),
        ("spaces judged", cell(field(v, "spaces_judged"))),
        ("exchanges judged", cell(field(v, "exchanges_judged"))),
        ("judge calls", cell(field(v, "judge_calls"))),
    ]);
    let skipped: Vec<String> = items(v, "skipped")
        .iter()
        .map(|s| format!("{} ({})", cell(field(s, "what")), cell(field(s, "reason"))))
        .collect();
    if !skipped.is_empty() {
        pairs.push(("skipped", skipped.join("; ")));
    }
    let digest = field(v, "digest");
    pairs.push((
        "digest",
        if field(digest, "sent").as_bool() == Some(true) {
            format!(
                "queued to the owner's {} DM (outbox {})",
                cell(field(digest, "platform")),
                cell(field(digest, "outbox_id"))
            )
        } else {
            format!("not sent: {}", cell(field(digest, "reason")))
        },
    ));
    kv_lines(&pairs)
}

/// `review digest`: the text as sent, then where it went.
fn render_digest(v: &Value) -> String {
    let mut out = format!("{}\n\n", field(v, "text").as_str().unwrap_or_default());
    out.push_str(&format!("made: {}\n", cell(field(v, "at"))));
    if field(v, "sent").as_bool() == Some(true) {
        out.push_str(&format!(
            "delivered: queued to the owner's {} DM (conversation {})\n",
            cell(field(v, "platform")),
            cell(field(v, "conversation_id"))
        ));
    } else {
        out.push_str(&format!("delivered: no ({})\n", cell(field(v, "reason"))));
    }
    out
}

/// `review report DATE`: a daily report as a person reads it (each finding
/// with the `[msg N]` that `messages show N` opens); a weekly one by its
/// headline numbers. The whole JSON is `--json`.
fn render_report(v: &Value) -> String {
    let r = field(v, "report");
    let date = cell(field(v, "date"));
    let kind = cell(field(v, "kind"));
    let mut out = format!("Conversation review {date} ({kind})\n");
    if let (Some(since), Some(until)) = (
        field(r, "window_since").as_str(),
        field(r, "window_until").as_str(),
    ) {
        out.push_str(&format!("window: {since} to {until}\n"));
    }
    let Some(findings) = field(r, "findings").as_array() else {
        // Not a daily report: its scalar fields, one a line.
        if let Some(map) = r.as_object() {
            for (k, x) in map {
                match x {
                    Value::Object(o) => {
                        let inner: Vec<String> = o
                            .iter()
                            .filter(|(_, y)| !y.is_object() && !y.is_array())
                            .map(|(ik, y)| format!("{ik} {}", cell(y)))
                            .collect();
                        if !inner.is_empty() {
                            out.push_str(&format!("{k}: {}\n", inner.join(", ")));
                        }
                    }
                    Value::Array(a) => out.push_str(&format!("{k}: {} entries\n", a.len())),
                    _ => out.push_str(&format!("{k}: {}\n", cell(x))),
                }
            }
        }
        return out;
    };
    out.push_str(&format!("findings: {}\n", findings.len()));
    for (i, f) in findings.iter().enumerate() {
        out.push_str(&format!(
            "\n{}. {} (severity {}, {}, {}) in {} at [msg {}] (reply [msg {}])\n",
            i + 1,
            cell(field(f, "kind")),
            cell(field(f, "severity")),
            cell(field(f, "scope")),
            cell(field(f, "target_layer")),
            cell(field(f, "space")),
            cell(field(f, "message_id")),
            cell(field(f, "reply_id")),
        ));
        for (label, key) in [
            ("", "summary"),
            ("evidence: ", "evidence"),
            ("suggestion: ", "suggestion"),
        ] {
            if let Some(text) = field(f, key).as_str().filter(|s| !s.is_empty()) {
                out.push_str(&format!("   {label}{}\n", text.replace('\n', "\n   ")));
            }
        }
        // The cited trace step, and the command that shows it.
        let t = field(f, "trace");
        if let Some(run) = field(t, "run_id").as_str() {
            let exit = match field(t, "exit_code").as_i64() {
                Some(c) => format!(", exit {c}"),
                None => ", no exit code".to_owned(),
            };
            out.push_str(&format!(
                "   trace: run {run} step {} (tool {}{exit}): mrctl runs show {run}\n",
                cell(field(t, "step")),
                cell(field(t, "tool")),
            ));
        }
        let signals: Vec<String> = items(f, "friction").iter().map(cell).collect();
        if !signals.is_empty() {
            out.push_str(&format!("   friction: {}\n", signals.join(", ")));
        }
    }
    if let Some(counts) = field(field(r, "friction"), "counts").as_object() {
        if !counts.is_empty() {
            out.push_str("\nfriction signals:\n");
        }
        for (space, per) in counts {
            let line: Vec<String> = per
                .as_object()
                .into_iter()
                .flatten()
                .map(|(signal, n)| format!("{} {signal}", cell(n)))
                .collect();
            out.push_str(&format!("  {space}: {}\n", line.join(", ")));
        }
    }
    let footer = field(r, "footer");
    if footer.is_object() {
        out.push_str(&format!(
            "\n{} exchanges in {} spaces judged, {} judge calls, cost {}\n",
            cell(field(footer, "exchanges_judged")),
            cell(field(footer, "spaces_judged")),
            cell(field(footer, "judge_calls")),
            money(field(footer, "cost"), field(footer, "currency")),
        ));
        if findings.iter().any(|f| !field(f, "message_id").is_null()) {
            out.push_str("a finding's message: mrctl --in SPACE messages show N --context 3\n");
        }
    }
    out
}

/// One table for `config get`: every available key with its value in this
/// space (or `(default)`) and its description, plus any set key the server
/// did not list as available.
pub(super) fn render_config(v: &Value) -> String {
    let set = items(v, "config");
    let value_of = |key: &str| {
        set.iter()
            .find(|e| field(e, "key").as_str() == Some(key))
            .map(|e| cell(field(e, "value")))
    };
    let available = items(v, "available");
    let mut out = String::new();
    for a in available {
        let key = field(a, "key").as_str().unwrap_or_default();
        let value = value_of(key).unwrap_or_else(|| "(default)".to_owned());
        out.push_str(&row(&[
            key.to_owned(),
            value,
            cell(field(a, "description")),
        ]));
    }
    for e in set {
        let key = field(e, "key").as_str().unwrap_or_default();
        if !available
            .iter()
            .any(|a| field(a, "key").as_str() == Some(key))
        {
            out.push_str(&row(&[key.to_owned(), cell(field(e, "value"))]));
        }
    }
    out
}

/// One task: its cron expression with the zone it is read in (the space's
/// clock), its state (`active`, `paused`, `done`), its next run (UTC).
pub(super) fn task_row(t: &Value, zone: &Value) -> String {
    let schedule = match (field(t, "cron").as_str(), zone.as_str()) {
        (Some(c), Some(z)) => format!("cron {c} ({z})"),
        (Some(c), None) => format!("cron {c}"),
        (None, _) => format!("at {}", time_cell(field(t, "at"))),
    };
    let mut state = match field(t, "state").as_str() {
        Some(s) => s.to_owned(),
        None if field(t, "active").as_bool() == Some(false) => "paused".to_owned(),
        None => "active".to_owned(),
    };
    if field(t, "silent").as_bool() == Some(true) {
        state.push_str(",silent");
    }
    row(&[
        cell(field(t, "id")),
        schedule,
        state,
        format!("next {}", time_cell(field(t, "next_run_at"))),
        cell(field(t, "prompt")),
    ])
}

pub(super) fn mute_row(m: &Value) -> String {
    let until = field(m, "until");
    let until = if until.is_null() {
        "indefinitely".to_owned()
    } else {
        format!("until {}", time_cell(until))
    };
    row(&[cell(field(m, "caller_id")), until, cell(field(m, "reason"))])
}

/// `senders forget`: each space's deletions, the instance's, then what is
/// left for the operator (a kept deny, a linked operator, citing reports).
fn forgotten(v: &Value) -> String {
    let count = |r: &Value, k: &str| field(r, k).as_u64().unwrap_or(0);
    let mut out = format!("forgot {}\n", cell(field(v, "sender")));
    let spaces = items(v, "spaces");
    if spaces.is_empty() {
        out.push_str("no space held a row of theirs\n");
    }
    for s in spaces {
        out.push_str(&format!(
            "space {}: {} messages, {} memberships, {} runs, {} queued replies, {} attachments ({} inbox files) deleted\n",
            cell(field(s, "space_id")),
            count(s, "messages"),
            count(s, "memberships"),
            count(s, "runs"),
            count(s, "outbox"),
            count(s, "attachments"),
            count(s, "inbox_files"),
        ));
    }
    let i = field(v, "instance");
    out.push_str(&format!(
        "instance: {} direct conversations, {} pairing requests, {} allow decisions deleted\n",
        count(i, "conversations"),
        count(i, "pairings"),
        count(i, "allowed"),
    ));
    if field(i, "deny_kept").as_bool() == Some(true) {
        out.push_str("kept: the deny decision about them (mrctl senders list)\n");
    }
    if let Some(op) = field(i, "linked_to").as_str() {
        out.push_str(&format!(
            "kept: their id is linked to operator {} (mrctl identities unlink)\n",
            cell(&Value::String(op.to_owned()))
        ));
    }
    let reports = items(v, "reports");
    if reports.is_empty() {
        out.push_str("no review report cites their messages\n");
    } else {
        out.push_str("review reports citing their messages (read, then delete by hand):\n");
        for r in reports {
            out.push_str(&format!("  {}\n", cell(field(r, "name"))));
        }
    }
    out
}
