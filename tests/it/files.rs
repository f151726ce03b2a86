//! Workspace files and run traces (issue 18) through a real host: the files
//! routes in a space and across read and admin links, `If-Match`, path
//! escapes (including a symlink a turn planted and a FIFO), the quota and the
//! size cap, the audit's hashes, a management agent editing a client's
//! `AGENTS.md` with `mrctl --space client files put`, the trace of a turn's
//! tool calls, an ask's trace, retention, and links for global admins.

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};
use mercury::storage::Query;

fn sha(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    base16ct::lower::encode_string(&Sha256::digest(bytes))
}

async fn put(
    h: &TestHost,
    space: &str,
    path: &str,
    content: &str,
    if_match: Option<&str>,
) -> (u16, Value) {
    let mut headers = vec![("x-mercury-space", space)];
    if let Some(m) = if_match {
        headers.push(("if-match", m));
    }
    h.send(
        Method::PUT,
        &format!("/api/files/{path}"),
        Some(&h.owner_token),
        &headers,
        Some(json!({ "content": content })),
    )
    .await
}

async fn delete(h: &TestHost, space: &str, path: &str, if_match: Option<&str>) -> (u16, Value) {
    let mut headers = vec![("x-mercury-space", space)];
    if let Some(m) = if_match {
        headers.push(("if-match", m));
    }
    h.send(
        Method::DELETE,
        &format!("/api/files/{path}"),
        Some(&h.owner_token),
        &headers,
        None,
    )
    .await
}

/// method, path, status, link id, before, after of an audit row.
type AuditFileRow = (String, String, i64, i64, Option<String>, Option<String>);

fn entry<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

#[tokio::test]
async fn files_are_listed_read_written_and_deleted_in_a_space_with_if_match() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("s").await;
    let ws = h.data.join("spaces/s");

    let (st, v) = put(&h, "s", "notes/a.md", "one", None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["hash"], sha(b"one"));
    assert_eq!(v["created"], true);
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/a.md")).unwrap(),
        "one"
    );

    let (st, top) = h.owner(Method::GET, "/api/files", Some("s"), None).await;
    assert_eq!(st, 200, "{top}");
    assert_eq!(entry(&top, "notes")["kind"], "dir");
    let agents = entry(&top, "AGENTS.md");
    assert_eq!(agents["kind"], "file");
    let on_disk = std::fs::read(ws.join("AGENTS.md")).unwrap();
    assert_eq!(agents["hash"], sha(&on_disk));
    assert_eq!(agents["size"], on_disk.len());
    assert!(agents["modified"].as_i64().unwrap() > 0);
    let (st, notes) = h
        .owner(Method::GET, "/api/files?path=notes", Some("s"), None)
        .await;
    assert_eq!(st, 200, "{notes}");
    assert_eq!(entry(&notes, "a.md")["hash"], sha(b"one"));

    let (st, v) = h
        .owner(Method::GET, "/api/files/notes/a.md", Some("s"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["content"].as_str(), v["size"].as_u64()),
        (Some("one"), Some(3))
    );

    // A stale hash: 412, nothing written; the current one: written.
    let (st, v) = put(&h, "s", "notes/a.md", "two", Some(&sha(b"zero"))).await;
    assert_eq!(st, 412, "{v}");
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/a.md")).unwrap(),
        "one"
    );
    let (st, v) = put(&h, "s", "notes/a.md", "two", Some(&sha(b"one"))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["before_hash"].clone(), v["created"].clone()),
        (json!(sha(b"one")), json!(false))
    );
    let (st, v) = put(&h, "s", "notes/new.md", "x", Some(&sha(b"x"))).await;
    assert_eq!(st, 412, "If-Match on a missing file: {v}");
    assert!(!ws.join("notes/new.md").exists());

    let (st, v) = delete(&h, "s", "notes/a.md", Some(&sha(b"one"))).await;
    assert_eq!(st, 412, "{v}");
    assert!(ws.join("notes/a.md").exists());
    let (st, v) = delete(&h, "s", "notes/a.md", Some(&sha(b"two"))).await;
    assert_eq!(st, 200, "{v}");
    assert!(!ws.join("notes/a.md").exists());
    let (st, _) = h
        .owner(Method::GET, "/api/files/notes/a.md", Some("s"), None)
        .await;
    assert_eq!(st, 404);
    let (st, _) = delete(&h, "s", "notes/a.md", None).await;
    assert_eq!(st, 404);
    let (st, v) = delete(&h, "s", "notes", None).await;
    assert_eq!(st, 400, "a directory is not a file: {v}");
    assert!(ws.join("notes").is_dir());

    // Text only: a binary file lists (with its hash) but does not read.
    std::fs::write(ws.join("blob.bin"), [0xff, 0xfe, 0x00]).unwrap();
    let (st, v) = h
        .owner(Method::GET, "/api/files/blob.bin", Some("s"), None)
        .await;
    assert_eq!(st, 415, "{v}");

    // files.read / files.write are admin's by default: a member has neither.
    h.grant("s", "bob", "member").await;
    let bob = h.token("bob", "user").await;
    let (st, v) = h
        .call(Method::GET, "/api/files", Some(&bob), Some("s"), None)
        .await;
    assert_eq!(st, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("files.read"),
        "{v}"
    );
    let (st, _) = h
        .call(
            Method::PUT,
            "/api/files/x.md",
            Some(&bob),
            Some("s"),
            Some(json!({"content": "x"})),
        )
        .await;
    assert_eq!(st, 403);
    assert!(!ws.join("x.md").exists());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_escapes_symlinks_a_turn_planted_and_fifos_are_refused_and_nothing_is_read() {
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^user: plant",
             "tool_calls": [{"name": "shell", "arguments": {"command": "ln -s /proc/self/root/etc/hostname planted.md && ln -s ../../canary.txt rel.md && echo planted"}}]},
            {"purpose": "turn", "match": "^tool_result\\(shell\\)", "reply": "planted"},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    })
    .await;
    h.create_space("s").await;
    let ws = h.data.join("spaces/s");
    std::fs::write(h.data.join("canary.txt"), "CANARY-SECRET").unwrap();
    // The turn plants two links; its layer is merged with them as links.
    let v = h.chat("s", "plant").await;
    assert_eq!(v["reply"], "planted", "{v}");
    assert!(std::fs::symlink_metadata(ws.join("planted.md"))
        .unwrap()
        .file_type()
        .is_symlink());
    // And more, planted straight on disk: a link to a directory and a FIFO.
    std::os::unix::fs::symlink(h.data.join("canary.txt"), ws.join("knowledge/link.md")).unwrap();
    std::os::unix::fs::symlink(&h.data, ws.join("up")).unwrap();
    let fifo = std::ffi::CString::new(ws.join("pipe").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);

    for (path, want) in [
        ("/api/files/planted.md", 403),
        ("/api/files/rel.md", 403),
        ("/api/files/knowledge/link.md", 403),
        ("/api/files/up/canary.txt", 403),
        ("/api/files/pipe", 400),
        ("/api/files/knowledge", 400),
        ("/api/files/..%2F..%2Fcanary.txt", 400),
        ("/api/files/knowledge%2F..%2F..%2F..%2Fcanary.txt", 400),
        ("/api/files/%2Fetc%2Fhostname", 400),
        ("/api/files?path=..", 400),
        ("/api/files?path=%2Fetc", 400),
        ("/api/files?path=up", 403),
        ("/api/files?path=AGENTS.md", 400),
    ] {
        let (st, v) = h.owner(Method::GET, path, Some("s"), None).await;
        assert_eq!(st, want, "{path}: {v}");
        let text = v.to_string();
        assert!(
            !text.contains("CANARY") && !text.contains("canary.txt\",\"kind"),
            "{path}: {v}"
        );
    }
    // Listing shows the links as links (never followed) and the FIFO as other.
    let (st, top) = h.owner(Method::GET, "/api/files", Some("s"), None).await;
    assert_eq!(st, 200, "{top}");
    assert_eq!(entry(&top, "planted.md")["kind"], "symlink");
    assert_eq!(entry(&top, "planted.md")["hash"], Value::Null);
    assert_eq!(entry(&top, "pipe")["kind"], "other");
    // Writes refuse the same paths and change nothing outside.
    for path in [
        "planted.md",
        "knowledge/link.md",
        "up/canary.txt",
        "..%2Fcanary.txt",
        "pipe",
    ] {
        let (st, v) = put(&h, "s", path, "overwritten", None).await;
        assert!((400..500).contains(&st), "{path}: {st} {v}");
        let (st, v) = delete(&h, "s", path, None).await;
        assert!((400..500).contains(&st), "{path}: {st} {v}");
    }
    assert_eq!(
        std::fs::read_to_string(h.data.join("canary.txt")).unwrap(),
        "CANARY-SECRET"
    );
    assert!(std::fs::symlink_metadata(ws.join("planted.md"))
        .unwrap()
        .file_type()
        .is_symlink());
    h.stop().await;
}

#[tokio::test]
async fn over_quota_and_over_the_size_cap_is_413_and_nothing_is_written() {
    let h = TestHost::start(HostOptions {
        config: vec![
            ("sandbox.workspace_mb", Yaml::Number(1.into())),
            ("files.max_bytes", Yaml::Number(700_000.into())),
            ("http.body_limit_bytes", Yaml::Number(4_000_000.into())),
        ],
        ..Default::default()
    })
    .await;
    h.create_space("s").await;
    let ws = h.data.join("spaces/s");
    let big = "a".repeat(600_000);
    let (st, v) = put(&h, "s", "a.txt", &big, None).await;
    assert_eq!(st, 200, "{v}");
    let before = h.workspace_hashes("s");
    let (st, v) = put(&h, "s", "b.txt", &big, None).await;
    assert_eq!(st, 413, "past the quota: {v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("quota"),
        "{v}"
    );
    assert!(!ws.join("b.txt").exists());
    // Replacing a.txt with the same size stays within the quota.
    let (st, v) = put(&h, "s", "a.txt", &"b".repeat(600_000), None).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = put(&h, "s", "c.txt", &"c".repeat(700_001), None).await;
    assert_eq!(st, 413, "past files.max_bytes: {v}");
    assert!(!ws.join("c.txt").exists());
    assert_ne!(h.workspace_hashes("s"), before);
    let leftovers: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".mercury-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A file larger than the cap is not read either.
    std::fs::write(ws.join("huge.txt"), "h".repeat(700_001)).unwrap();
    let (st, v) = h
        .owner(Method::GET, "/api/files/huge.txt", Some("s"), None)
        .await;
    assert_eq!(st, 413, "{v}");
    h.stop().await;
}

#[tokio::test]
async fn read_and_admin_links_reach_files_and_every_write_is_audited_with_hashes() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["m", "t"] {
        h.create_space(s).await;
    }
    h.grant("m", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let ws = h.data.join("spaces/t");
    std::fs::write(ws.join("AGENTS.md"), "be kind\u{200B}\u{202E} always").unwrap();
    let old_hash = sha("be kind\u{200B}\u{202E} always".as_bytes());
    let read = h.link("m", "t", "read").await;
    let rows_before = h.rows_mentioning("t", &["space_link_audit"]);
    let files_before = h.workspace_hashes("t");

    let (st, v) = h
        .act_as(Method::GET, "/api/files", &alice, "m", "t", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["source_space"], "t");
    assert_eq!(entry(&v, "AGENTS.md")["hash"], old_hash);
    let (st, v) = h
        .act_as(Method::GET, "/api/files/AGENTS.md", &alice, "m", "t", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["content"], "be kind always",
        "stripped of invisible characters: {v}"
    );
    assert_eq!(v["source_space"], "t");
    assert_eq!(v["hash"], old_hash, "the hash is the file's own");
    // A read link cannot write.
    let (st, v) = h
        .act_as(
            Method::PUT,
            "/api/files/AGENTS.md",
            &alice,
            "m",
            "t",
            Some(json!({"content": "evil"})),
        )
        .await;
    assert_eq!(st, 403, "{v}");
    let (st, _) = h
        .act_as(
            Method::DELETE,
            "/api/files/AGENTS.md",
            &alice,
            "m",
            "t",
            None,
        )
        .await;
    assert_eq!(st, 403);
    assert_eq!(h.rows_mentioning("t", &["space_link_audit"]), rows_before);
    assert_eq!(
        h.workspace_hashes("t"),
        files_before,
        "reads and refusals leave t as it was"
    );

    // An admin link writes and deletes, each audited with the hashes.
    let (st, _) = h
        .owner(Method::DELETE, &format!("/api/links/{read}"), None, None)
        .await;
    assert_eq!(st, 200);
    let admin = h.link("m", "t", "admin").await;
    let hdr = [
        ("x-mercury-space", "m"),
        ("x-mercury-act-as", "t"),
        ("if-match", old_hash.as_str()),
    ];
    let (st, v) = h
        .send(
            Method::PUT,
            "/api/files/AGENTS.md",
            Some(&alice),
            &hdr,
            Some(json!({"content": "be brief"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        std::fs::read_to_string(ws.join("AGENTS.md")).unwrap(),
        "be brief"
    );
    let (st, v) = h
        .send(
            Method::PUT,
            "/api/files/AGENTS.md",
            Some(&alice),
            &hdr,
            Some(json!({"content": "again"})),
        )
        .await;
    assert_eq!(st, 412, "the hash is stale now: {v}");
    let (st, v) = h
        .act_as(
            Method::PUT,
            "/api/files/knowledge/leads.md",
            &alice,
            "m",
            "t",
            Some(json!({"content": "l"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = h
        .act_as(
            Method::DELETE,
            "/api/files/knowledge/leads.md",
            &alice,
            "m",
            "t",
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    // An admin route's row is completed after the answer: wait for all six.
    let done = h
        .wait_count(
            "SELECT COUNT(*) FROM space_link_audit WHERE route = '/api/files/{*path}' AND method IN ('PUT','DELETE') AND status IS NOT NULL",
            6,
            10,
        )
        .await;
    assert_eq!(done, 6);
    let rows: Vec<AuditFileRow> = {
        h.read(|c| c.query_all("SELECT method, path, status, link_id, before_value, after_value FROM space_link_audit
                 WHERE route = '/api/files/{*path}' AND method IN ('PUT','DELETE') ORDER BY id", &[], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        }))
    };
    let statuses: Vec<(String, String, i64)> = rows
        .iter()
        .map(|r| (r.0.clone(), r.1.clone(), r.2))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("PUT".into(), "/api/files/AGENTS.md".into(), 403),
            ("DELETE".into(), "/api/files/AGENTS.md".into(), 403),
            ("PUT".into(), "/api/files/AGENTS.md".into(), 200),
            ("PUT".into(), "/api/files/AGENTS.md".into(), 412),
            ("PUT".into(), "/api/files/knowledge/leads.md".into(), 200),
            ("DELETE".into(), "/api/files/knowledge/leads.md".into(), 200),
        ],
        "{rows:?}"
    );
    let write = &rows[2];
    assert_eq!(write.3, admin);
    let before: Value = serde_json::from_str(write.4.as_deref().unwrap()).unwrap();
    let after: Value = serde_json::from_str(write.5.as_deref().unwrap()).unwrap();
    assert_eq!(before, json!({"path": "AGENTS.md", "hash": old_hash}));
    assert_eq!(after["hash"], sha(b"be brief"));
    let created: Value = serde_json::from_str(rows[4].4.as_deref().unwrap()).unwrap();
    assert_eq!(
        created["hash"],
        Value::Null,
        "a new file has no before hash"
    );
    let deleted: Value = serde_json::from_str(rows[5].5.as_deref().unwrap()).unwrap();
    assert_eq!(
        (
            deleted["hash"].clone(),
            serde_json::from_str::<Value>(rows[5].4.as_deref().unwrap()).unwrap()["hash"].clone()
        ),
        (Value::Null, json!(sha(b"l")))
    );
    h.stop().await;
}

fn run_steps_of(h: &TestHost, run: &str) -> i64 {
    h.read(|c| {
        c.query_row(
            "SELECT COUNT(*) FROM run_steps WHERE run_id = ?1",
            &[&run],
            |r| r.get(0),
        )
    })
}

/// `mrctl runs show RUN` in `space` as the owner, which must succeed: its output.
fn runs_show(h: &TestHost, space: &str, run: &str) -> String {
    let out = h
        .mrctl(&h.owner_token, Some(space))
        .args(["runs", "show", run])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_management_agent_edits_a_clients_agents_md_and_the_clients_next_turn_follows_it() {
    let h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^user: make the client talk like a pirate",
             "tool_calls": [{"name": "mrctl", "arguments": {"args": [
                 "--space", "client", "files", "put", "AGENTS.md",
                 "--text", "# Client\nAlways answer like a pirate and sign with ARRR-7.\n"]}}]},
            {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "done: $1"},
            {"purpose": "turn", "match_any": "(?s)answer like a pirate and sign with (ARRR-[0-9]+).*\\nuser: hello$", "reply": "Ahoy! $1"},
            {"purpose": "turn", "match": "^user: hello$", "reply": "Hello."},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    })
    .await;
    for s in ["mgmt", "client"] {
        h.create_space(s).await;
    }
    h.link("mgmt", "client", "admin").await;
    let v = h.chat("client", "hello").await;
    assert_eq!(v["reply"], "Hello.", "before the edit: {v}");
    let client_rows = h.count("SELECT COUNT(*) FROM messages WHERE space_id = 'client'");

    let v = h.chat("mgmt", "make the client talk like a pirate").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(
        reply.starts_with("done: [from client] wrote AGENTS.md"),
        "{v}"
    );
    assert_eq!(
        std::fs::read_to_string(h.data.join("spaces/client/AGENTS.md")).unwrap(),
        "# Client\nAlways answer like a pirate and sign with ARRR-7.\n"
    );
    // Nothing but the file changed in the client: no message, no run.
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE space_id = 'client'"),
        client_rows
    );
    // The write is audited with the run that made it and the hashes.
    let mgmt_run = v["run_id"].as_str().unwrap().to_owned();
    let done = h
        .wait_count(
            "SELECT COUNT(*) FROM space_link_audit WHERE method = 'PUT' AND status = 200 AND after_value IS NOT NULL",
            1,
            10,
        )
        .await;
    assert_eq!(done, 1);
    let (run, path, after): (String, String, String) = h
        .read(|c| c.query_row(
            "SELECT run_id, path, after_value FROM space_link_audit WHERE method = 'PUT' AND route = '/api/files/{*path}'",
            &[],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))));
    assert_eq!(
        (run.as_str(), path.as_str()),
        (mgmt_run.as_str(), "/api/files/AGENTS.md")
    );
    assert!(
        after.contains(&sha(
            b"# Client\nAlways answer like a pirate and sign with ARRR-7.\n"
        )),
        "{after}"
    );
    // The trace shows the command the agent chose (D-017).
    let text = runs_show(&h, "mgmt", &mgmt_run);
    assert!(
        text.contains(
            "tool mrctl {\"args\":[\"--space\",\"client\",\"files\",\"put\",\"AGENTS.md\""
        ) && text.contains("exit 0"),
        "{text}"
    );

    // The client's next turn follows its new instructions.
    let v = h.chat("client", "hello").await;
    assert_eq!(v["reply"], "Ahoy! ARRR-7", "{v}");
    h.stop().await;
}

// mrctl runs as a blocking child process: the in-process host needs its own worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_two_tool_calls_shows_both_in_runs_show_with_arguments_and_exit_codes() {
    let h = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^user: two tools",
             "tool_calls": [
                 {"name": "shell", "arguments": {"command": "echo first-output"}},
                 {"name": "shell", "arguments": {"command": "echo second-output; exit 3"}}
             ]},
            {"purpose": "turn", "match": "^tool_result\\(shell\\)", "reply": "both ran"},
            {"reply": "ok"}
        ]}),
        config: vec![("runs.keep_days", Yaml::Number(1.into()))],
        ..Default::default()
    })
    .await;
    h.create_space("s").await;
    // A step older than runs.keep_days, to be pruned by the next commit.
    h.write(|tx| {
 tx.execute("INSERT INTO run_steps (run_id, seq, kind, name, started_at) VALUES ('ancient', 1, 'model', 'm', 0)", &[])?;
 Ok(())
 });
    let v = h.chat("s", "two tools").await;
    assert_eq!(v["reply"], "both ran", "{v}");
    let run = v["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        run_steps_of(&h, "ancient"),
        0,
        "runs.keep_days pruned the old trace"
    );

    let text = runs_show(&h, "s", &run);
    let steps: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(steps.len(), 4, "{text}");
    assert!(steps[0].starts_with("#1 model scripted:"), "{text}");
    assert!(
        steps[1].starts_with("#2 tool shell {\"command\":\"echo first-output\"} exit 0"),
        "{text}"
    );
    assert!(
        steps[2].starts_with("#3 tool shell {\"command\":\"echo second-output; exit 3\"} exit 3"),
        "{text}"
    );
    assert!(steps[3].starts_with("#4 model scripted:"), "{text}");
    assert!(
        text.contains("    first-output") && text.contains("    second-output"),
        "{text}"
    );

    let out = h
        .mrctl(&h.owner_token, Some("s"))
        .args(["--json", "runs", "show", &run])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["run"]["status"], "done");
    let tools: Vec<(Value, Value)> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "tool")
        .map(|s| (s["exit_code"].clone(), s["output_bytes"].clone()))
        .collect();
    assert_eq!(tools.len(), 2);
    assert_eq!(
        (tools[0].0.clone(), tools[1].0.clone()),
        (json!(0), json!(3))
    );
    assert!(v["steps"][0]["tokens_in"].as_u64().unwrap() > 0, "{v}");
    // Another space cannot read this run.
    h.create_space("other").await;
    let (st, _) = h
        .owner(
            Method::GET,
            &format!("/api/runs/{run}"),
            Some("other"),
            None,
        )
        .await;
    assert_eq!(st, 404);
    h.stop().await;
}

// A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asks_steps_come_back_to_the_asker_and_leave_nothing_in_the_target() {
    let h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "ask", "match": "^user: look", "tool_calls": [{"name": "shell", "arguments": {"command": "cat AGENTS.md | head -1"}}]},
            {"purpose": "ask", "match": "^tool_result\\(shell\\)",
             "tool_calls": [{"name": "mrctl", "arguments": {"args": ["files", "put", "notes.md", "--text", "abc"]}}]},
            {"purpose": "ask", "match": "^tool_result\\(mrctl\\)", "reply": "looked"},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    })
    .await;
    for s in ["mgmt", "x"] {
        h.create_space(s).await;
    }
    h.link("mgmt", "x", "admin").await;
    let rows_before = h.rows_mentioning("x", &["token_usage", "spend_ledger", "space_link_audit"]);
    let steps_before = h.count("SELECT COUNT(*) FROM run_steps");
    let (st, v) = h
        .act_as(
            Method::POST,
            "/api/ask",
            &h.owner_token,
            "mgmt",
            "x",
            Some(json!({"message": "look"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reply"], "looked");
    let steps = v["steps"].as_array().unwrap();
    let kinds: Vec<&str> = steps.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        vec!["model", "tool", "model", "tool", "model"],
        "{v}"
    );
    assert_eq!(steps[1]["name"], "shell");
    assert_eq!(
        steps[1]["arguments"],
        "{\"command\":\"cat AGENTS.md | head -1\"}"
    );
    assert_eq!(steps[1]["exit_code"], 0);
    assert_eq!(steps[3]["name"], "mrctl");
    assert_eq!(steps[3]["exit_code"], 1, "the write was refused: {v}");
    assert_eq!(
        v["refusals"][0]["summary"], "would have written the file notes.md (3 bytes)",
        "{v}"
    );
    assert!(!h.data.join("spaces/x/notes.md").exists());
    assert_eq!(
        h.count("SELECT COUNT(*) FROM run_steps"),
        steps_before,
        "nothing stored"
    );
    assert_eq!(run_steps_of(&h, v["run_id"].as_str().unwrap()), 0);
    assert_eq!(
        h.rows_mentioning("x", &["token_usage", "spend_ledger", "space_link_audit"]),
        rows_before
    );
    h.stop().await;
}

// mrctl runs as a blocking child process: the in-process host needs its own worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrctl_files_ls_cat_put_rm_and_edit_with_if_match() {
    let h = TestHost::start(HostOptions::default()).await;
    h.create_space("s").await;
    let ws = h.data.join("spaces/s");
    let local = h.dir.path().join("local.md");
    std::fs::write(&local, "from a file\n").unwrap();
    let mrctl = |args: &[&str]| {
        h.mrctl(&h.owner_token, Some("s"))
            .args(args)
            .output()
            .unwrap()
    };
    let ok = |o: &std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = ok(&mrctl(&[
        "files",
        "put",
        "notes/n.md",
        "--from",
        local.to_str().unwrap(),
    ]));
    assert!(
        out.starts_with("wrote notes/n.md (12 bytes, hash "),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/n.md")).unwrap(),
        "from a file\n"
    );
    let out = ok(&mrctl(&["files", "ls", "notes"]));
    assert!(
        out.contains(&sha(b"from a file\n")[..12]) && out.contains("n.md"),
        "{out}"
    );
    assert_eq!(ok(&mrctl(&["files", "cat", "notes/n.md"])), "from a file\n");
    // --from - reads stdin.
    let mut child = h
        .mrctl(&h.owner_token, Some("s"))
        .args(["files", "put", "notes/stdin.md", "--from", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"piped in\n")
            .unwrap();
    }
    assert!(child.wait_with_output().unwrap().status.success());
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/stdin.md")).unwrap(),
        "piped in\n"
    );
    // A stale --if-match is the server's 412: exit 1, nothing written.
    let o = mrctl(&[
        "files",
        "put",
        "notes/n.md",
        "--text",
        "x",
        "--if-match",
        &sha(b"old"),
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("412"));
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/n.md")).unwrap(),
        "from a file\n"
    );
    // edit: $EDITOR changes a temporary copy, which is PUT with If-Match.
    let o = h
        .mrctl(&h.owner_token, Some("s"))
        .env("EDITOR", "sed -i s/file/editor/")
        .env_remove("VISUAL")
        .args(["files", "edit", "notes/n.md"])
        .output()
        .unwrap();
    assert!(ok(&o).starts_with("wrote notes/n.md"));
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/n.md")).unwrap(),
        "from a editor\n"
    );
    let o = h
        .mrctl(&h.owner_token, Some("s"))
        .env("EDITOR", "true")
        .env_remove("VISUAL")
        .args(["files", "edit", "notes/n.md"])
        .output()
        .unwrap();
    assert!(ok(&o).contains("no change"));
    let o = h
        .mrctl(&h.owner_token, Some("s"))
        .env("EDITOR", "false")
        .env_remove("VISUAL")
        .args(["files", "edit", "notes/n.md"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "a failed editor writes nothing");
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/n.md")).unwrap(),
        "from a editor\n"
    );
    ok(&mrctl(&["files", "rm", "notes/n.md"]));
    assert!(!ws.join("notes/n.md").exists());
    let o = mrctl(&["files", "cat", "../x"]);
    assert_eq!(o.status.code(), Some(1), "the server refuses ..");
    h.stop().await;
}

// mrctl runs as a blocking child process: the in-process host needs its own worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_links_are_409_and_global_admins_list_and_audit_everything() {
    let h = TestHost::start(HostOptions::default()).await;
    for s in ["h", "t", "u"] {
        h.create_space(s).await;
    }
    let (st, _) = h
        .owner(
            Method::PUT,
            "/api/spaces/current/name",
            Some("t"),
            Some(json!({"name": "Tea Shop"})),
        )
        .await;
    assert_eq!(st, 200);
    let first = h.link("h", "t", "read").await;
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/links",
            None,
            Some(json!({"holder": "h", "target": "t", "level": "admin"})),
        )
        .await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("link {first}")),
        "{v}"
    );
    let (st, v) = h
        .owner(
            Method::POST,
            "/api/links",
            None,
            Some(json!({"holder": "t", "target": "h", "level": "read", "both": true})),
        )
        .await;
    assert_eq!(st, 409, "--both meets the existing h -> t: {v}");
    assert_eq!(
        h.count("SELECT COUNT(*) FROM space_links"),
        1,
        "nothing half-created"
    );
    let (st, _) = h
        .owner(Method::DELETE, &format!("/api/links/{first}"), None, None)
        .await;
    assert_eq!(st, 200);
    h.link("h", "t", "admin").await;
    h.link("u", "h", "read").await;

    h.grant("h", "alice", "admin").await;
    let alice = h.token("alice", "user").await;
    let (st, _) = h
        .call(
            Method::GET,
            "/api/links?all=true",
            Some(&alice),
            Some("h"),
            None,
        )
        .await;
    assert_eq!(st, 403, "--all is for global admins");
    let (st, _) = h
        .call(
            Method::GET,
            "/api/links/audit?all=true",
            Some(&alice),
            Some("h"),
            None,
        )
        .await;
    assert_eq!(st, 403);
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["links", "list", "--all"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 4, "a header and three links: {text}");
    assert!(text.starts_with("LINK\tHOLDER -> TARGET"), "{text}");
    assert!(text.contains("h -> t (Tea Shop)\tadmin\tactive"), "{text}");
    assert!(text.contains("\tread\trevoked"), "{text}");
    let out = h
        .mrctl(&h.owner_token, None)
        .args(["--json", "links", "audit", "--all"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let actions: Vec<&str> = v["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, vec!["create", "create", "revoke", "create"], "{v}");
    // `links list` in a space shows names beside ids.
    let out = h
        .mrctl(&alice, Some("h"))
        .args(["links", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("reaches\tt (Tea Shop)\tadmin"), "{text}");
    h.stop().await;
}

// A child-process host, so the `mrctl` built beside `mercury` is on the tool's PATH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_the_running_turn_and_a_turn_cannot_write_its_own_space_through_the_api()
{
    let h = TestHost::start_process(HostOptions {
        model: json!({"rules": [
            {"purpose": "turn", "match": "^user: slow", "latency_ms": 1500, "reply": "slow done"},
            {"purpose": "turn", "match": "^user: self",
             "tool_calls": [{"name": "mrctl", "arguments": {"args": ["files", "put", "self.md", "--text", "x"]}}]},
            {"purpose": "turn", "match": "^tool_result\\(mrctl\\): (?s)(.*)$", "reply": "tool said: $1"},
            {"reply": "ok"}
        ]}),
        ..Default::default()
    })
    .await;
    h.create_space("s").await;
    let slow = {
        let (url, token) = (h.url.clone(), h.owner_token.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{url}/api/chat"))
                .bearer_auth(token)
                .header("x-mercury-space", "s")
                .json(&json!({"text": "slow"}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let n = h
        .wait_count(
            "SELECT COUNT(*) FROM runs WHERE space_id = 's' AND status = 'running'",
            1,
            10,
        )
        .await;
    assert_eq!(n, 1, "the turn should be running");
    let (st, v) = put(&h, "s", "during.md", "written between turns", None).await;
    assert_eq!(st, 200, "{v}");
    // The write was applied only once the turn had ended and been committed.
    assert_eq!(
        h.count("SELECT COUNT(*) FROM runs WHERE space_id = 's' AND status = 'running'"),
        0
    );
    assert_eq!(slow.await.unwrap()["reply"], "slow done");
    assert_eq!(
        std::fs::read_to_string(h.data.join("spaces/s/during.md")).unwrap(),
        "written between turns"
    );

    let v = h.chat("s", "self").await;
    let reply = v["reply"].as_str().unwrap();
    assert!(
        reply.contains("write_file") && reply.contains("409"),
        "{reply}"
    );
    assert!(!h.data.join("spaces/s/self.md").exists());
    h.stop().await;
}
