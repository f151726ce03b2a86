//! `mercury shadow diff` (issue 23, item 7): held sends, changed rows and
//! their authors go through the review's redactor and identifier gate like
//! message lines do; `--raw` prints them as stored only for a global admin
//! of the shadow, by its own token, and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

const NAME: &str = "Olivia Bakker";
const WA: &str = "whatsapp:31612345678@s.whatsapp.net";
const EMAIL: &str = "olivia.bakker@example.com";
const WA_PHONE: &str = "+31 6 1234 5678";

fn mercury_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("MERCURY_LOG", "warn")
        .stdin(Stdio::null());
    c
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = mercury_cmd()
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn diff(root: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let root = root.to_str().unwrap();
    let mut args = vec!["shadow", "diff", "--root", root];
    args.extend_from_slice(extra);
    run(&args, env)
}

/// What of the planted values `text` holds: the phone's and the WhatsApp
/// id's digits with every separator dropped, the e-mail, the name parts.
fn leaks(text: &str) -> Vec<&'static str> {
    let digits: String = text
        .chars()
        .filter_map(|c| {
            if c.is_ascii_digit() {
                Some(c)
            } else if c.is_alphabetic() || c == '\n' {
                Some('|')
            } else {
                None
            }
        })
        .collect();
    let lower = text.to_lowercase();
    let mut found = Vec::new();
    for (what, hit) in [
        (
            "the phone",
            digits.contains("0612345678") || digits.contains("31612345678"),
        ),
        ("the e-mail", lower.contains("example.com")),
        (
            "the name",
            lower.contains("olivia") || lower.contains("bakker"),
        ),
        ("the whatsapp id", lower.contains("s.whatsapp.net")),
    ] {
        if hit {
            found.push(what);
        }
    }
    found
}

/// A live host, snapshotted, and the shadow's rows and transcript changed as
/// a rehearsal would change them: a role and a mute for a WhatsApp caller,
/// a preference naming a person, a held send and a refusal with a phone
/// number, an e-mail and a name in them.
async fn rehearsed() -> (TestHost, tempfile::TempDir, PathBuf, PathBuf) {
    let live = TestHost::start(HostOptions {
        config: vec![(
            "review.owner_names",
            Yaml::Sequence(vec![Yaml::String(NAME.into())]),
        )],
        ..Default::default()
    })
    .await;
    live.create_space("alpha").await;
    live.chat("alpha", "hello").await;
    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let (code, out, err) = run(
        &[
            "shadow",
            "snapshot",
            "--data-dir",
            live.data.to_str().unwrap(),
            "--root",
            root.to_str().unwrap(),
            "--admins",
            "api:rehearser",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let snap = std::fs::canonicalize(root.join("current")).unwrap();
    // The baseline holds what the diff compares, the spaces and members
    // its redaction names: not a second copy of the whole database.
    let base = mercury::storage::open_read_only_conn(&snap.join("shadow/baseline.db")).unwrap();
    let mut tables = mercury::storage::inspect::tables(&base).unwrap();
    tables.sort();
    assert_eq!(
        tables,
        [
            "extension_state",
            "members",
            "mutes",
            "space_config",
            "space_preferences",
            "space_roles",
            "spaces",
            "tasks"
        ],
        "the diff baseline's tables"
    );
    assert_eq!(
        mercury::storage::inspect::row_count(&base, "spaces").unwrap(),
        1,
        "the live's one space"
    );
    drop(base);
    mercury::storage::inspect::execute_script_on_file(&snap.join("state.db"), &format!(
        "INSERT INTO space_roles (space_id, caller_id, role, granted_by, created_at, updated_at)
           VALUES ('alpha', '{WA}', 'member', '{WA}', 1, 1);
         INSERT INTO mutes (space_id, caller_id, until, reason, updated_by, updated_at)
           VALUES ('alpha', 'telegram:987654321', 1764600000000, 'spammed 06|1234|5678', 'owner', 1);
         INSERT INTO space_preferences (space_id, key, value, updated_by, updated_at)
           VALUES ('alpha', 'contact', 'ask O l i v i a at olivia.bakker&#64;example.com', '{WA}', 1);"
    ))
    .unwrap();
    let transcript = snap.join("shadow/transcript.jsonl");
    let lines = [
        json!({"kind": "send", "time": 1, "space": "alpha", "conversation": 1,
               "platform": "whatsapp", "external_id": "31612345678@s.whatsapp.net",
               "text": format!("Hi {NAME}, call 06;12;34;56;78 or mail {EMAIL}"),
               "source": "send"}),
        json!({"kind": "refusal", "time": 2, "space": "alpha", "conversation": null,
               "platform": null, "external_id": null,
               "text": "mint an adapter token for +31 6 1234 5678", "source": "tokens"}),
    ];
    let mut text = std::fs::read_to_string(&transcript).unwrap_or_default();
    for l in lines {
        text.push_str(&format!("{l}\n"));
    }
    std::fs::write(&transcript, text).unwrap();
    (live, root_dir, root, snap)
}

#[tokio::test]
async fn shadow_diff_redacts_sends_rows_and_authors_and_raw_needs_a_global_admin() {
    let (live, _keep, root, snap) = rehearsed().await;

    // Redacted, human and JSON: nothing of them, placeholders instead.
    let (code, human, err) = diff(&root, &[], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(leaks(&human).is_empty(), "{:?} in:\n{human}", leaks(&human));
    assert!(
        human.contains("[SENDER_") || human.contains("[WA_"),
        "{human}"
    );
    assert!(human.contains("[PERSON_"), "{human}");
    assert!(
        human.contains("sends held in the transcript (1)"),
        "{human}"
    );
    assert!(human.contains("space_roles"), "{human}");
    let (code, out, err) = diff(&root, &["--json"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(leaks(&out).is_empty(), "{:?} in:\n{out}", leaks(&out));
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["raw"], false);
    assert_eq!(d["rows"].as_array().unwrap().len(), 3, "{d:#}");
    assert_eq!(d["sends"][0]["space"], "alpha", "{d:#}");

    // The diff as stored holds every planted value: what the check sees.
    let token = std::fs::read_to_string(snap.join("global/owner.token"))
        .unwrap()
        .trim()
        .to_owned();
    let (code, raw, err) = diff(&root, &["--raw"], &[("MERCURY_TOKEN", &token)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(raw.contains("as stored, not redacted"), "{raw}");
    assert!(err.contains("--raw"), "{err}");
    assert_eq!(
        leaks(&raw),
        vec!["the phone", "the e-mail", "the name", "the whatsapp id"],
        "{raw}"
    );

    // --raw without a token, or with the live owner's (unknown to the
    // shadow), is refused with a sentence and prints nothing.
    for env in [vec![], vec![("MERCURY_TOKEN", live.owner_token.as_str())]] {
        let (code, out, err) = diff(&root, &["--raw"], &env);
        assert_eq!(code, Some(2), "{out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("global admin"), "{err}");
        assert!(leaks(&err).is_empty(), "{err}");
    }
}

/// `shadow diff` shows the changed lines of AGENTS.md, MEMORY.md and
/// knowledge/; `shadow promote --file` puts one rehearsed file into the
/// live workspace through the live host's audited write, only while the
/// live file is what the snapshot saw (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_diff_shows_content_changes_and_promote_writes_one_file_only_if_the_live_is_unchanged(
) {
    let live = TestHost::start(HostOptions::default()).await;
    live.create_space("alpha").await;
    let ws = live.data.join("spaces/alpha");
    std::fs::write(
        ws.join("AGENTS.md"),
        "# Alpha\nBe brief.\nAnswer in English.\n",
    )
    .unwrap();
    std::fs::create_dir_all(ws.join("knowledge")).unwrap();
    std::fs::write(ws.join("knowledge/faq.md"), "Q: hours?\nA: nine to five\n").unwrap();
    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let root_s = root.to_str().unwrap();
    let (code, out, err) = run(
        &[
            "shadow",
            "snapshot",
            "--data-dir",
            live.data.to_str().unwrap(),
            "--root",
            root_s,
            "--admins",
            "api:rehearser",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    // The rehearsal: one instruction changed, a page added, one removed.
    let shadow_ws = std::fs::canonicalize(root.join("current"))
        .unwrap()
        .join("spaces/alpha");
    std::fs::write(
        shadow_ws.join("AGENTS.md"),
        "# Alpha\nBe brief and kind.\nAnswer in English.\n",
    )
    .unwrap();
    std::fs::write(shadow_ws.join("knowledge/new.md"), "fresh page\n").unwrap();
    std::fs::remove_file(shadow_ws.join("knowledge/faq.md")).unwrap();

    let (code, out, err) = diff(&root, &[], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let want = "  Changed alpha/AGENTS.md [agents]\n      @@ line 2\n      - Be brief.\n      + Be brief and kind.\n";
    assert!(out.contains(want), "{out}");
    assert!(
        out.contains("  Removed alpha/knowledge/faq.md [knowledge]\n      @@ line 1\n      - Q: hours?\n      - A: nine to five\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "  Added alpha/knowledge/new.md [knowledge]\n      @@ line 1\n      + fresh page\n"
        ),
        "{out}"
    );

    // Every added message, a page at a time, redacted like the rest.
    let snap_db = std::fs::canonicalize(root.join("current"))
        .unwrap()
        .join("state.db");
    let mut script = String::new();
    for i in 1..=60 {
        let text = if i == 55 {
            format!("call {WA_PHONE} tomorrow")
        } else {
            format!("msg {i}")
        };
        script.push_str(&format!(
            "INSERT INTO messages (space_id, role, text, created_at) VALUES ('alpha', 'user', '{text}', {i});\n"
        ));
    }
    // An extension's state the rehearsal wrote is a changed row like the rest.
    script.push_str(
        "INSERT INTO extension_state (extension, space_id, key, value, updated_at) VALUES ('notes', 'alpha', 'last', '\"tidy up\"', 1);\n",
    );
    mercury::storage::inspect::execute_script_on_file(&snap_db, &script).unwrap();
    let (code, out, err) = diff(&root, &[], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("  alpha extension_state notes.last: (none) -> \"\\\"tidy up\\\"\" by extension notes\n"),
        "{out}"
    );
    let (code, out, err) = diff(&root, &["--messages-page", "2"], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("messages added, page 2 of 2 (60 in all):\n  alpha user: msg 51\n"),
        "{out}"
    );
    assert!(
        !out.contains("msg 50\n") && out.contains("  alpha user: msg 60\n"),
        "{out}"
    );
    assert!(leaks(&out).is_empty(), "{:?} in {out}", leaks(&out));
    let (code, out, err) = diff(&root, &["--messages-page", "1"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("  (next: --messages-page 2)"), "{out}");
    let (code, _, err) = diff(&root, &["--messages-page", "3"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("there are 2 page(s) of 50 (60 messages added)"),
        "{err}"
    );

    let promote = |file: &str| {
        run(
            &["shadow", "promote", "--root", root_s, "--file", file],
            &[],
        )
    };
    let (code, out, err) = promote("alpha/AGENTS.md");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with("promoted alpha/AGENTS.md: written in the live workspace"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("AGENTS.md")).unwrap(),
        "# Alpha\nBe brief and kind.\nAnswer in English.\n"
    );
    // The live file is no longer what the snapshot saw: a second promotion is refused.
    let (code, out, err) = promote("alpha/AGENTS.md");
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("changed since the snapshot") && err.contains("nothing was written"),
        "{err}"
    );
    // An added page goes in only while the live has none; a removed one is removed.
    std::fs::write(ws.join("knowledge/new.md"), "the live's own\n").unwrap();
    let (code, _, err) = promote("alpha/knowledge/new.md");
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        std::fs::read_to_string(ws.join("knowledge/new.md")).unwrap(),
        "the live's own\n"
    );
    std::fs::remove_file(ws.join("knowledge/new.md")).unwrap();
    let (code, out, err) = promote("alpha/knowledge/new.md");
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(ws.join("knowledge/new.md")).unwrap(),
        "fresh page\n"
    );
    let (code, out, err) = promote("alpha/knowledge/faq.md");
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(": deleted in the live workspace"), "{out}");
    assert!(!ws.join("knowledge/faq.md").exists());
    // Bad input is a sentence and touches nothing.
    for (file, says) in [
        ("AGENTS.md", "must be SPACE/PATH"),
        ("alpha/../../etc/passwd", "alpha/../../etc/passwd"),
        (
            "alpha/keep.txt",
            "neither in the snapshot nor in the shadow",
        ),
    ] {
        let (code, _, err) = promote(file);
        assert_eq!(code, Some(2), "{file}: {err}");
        assert!(err.contains(says), "{file}: {err}");
    }
    live.stop().await;
}
