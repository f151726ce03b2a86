//! Drafted fixes (issue 31, item 4) on a real host with scripted models: a
//! bad `AGENTS.md` line makes the bot answer wrongly, the daily review
//! flags it on the `agents_md` layer, the intake drafts a diff of the
//! space's `AGENTS.md`, and approval applies it through the files API
//! (`If-Match` on the drafted-from hash): the next turn answers right, and
//! a draft whose file changed since is refused with nothing written.

use reqwest::Method;
use serde_json::json;

use crate::common::{HostOptions, TestHost};
use crate::review_intake::judge_rule;

const BAD: &str = "The capital of France is Lyon.";
const GOOD: &str = "The capital of France is Paris.";

fn options() -> HostOptions {
    let rules = vec![
        judge_rule(
            "capital of France",
            "wrong_answer",
            "agents_md",
            "The assistant named the wrong capital of France, as its instructions say.",
        ),
        json!({"purpose": "judge", "reply": "{\"findings\": []}"}),
        // Had the drafter seen a phone number of a file, its answer would
        // be no JSON (so the row would say so).
        json!({"purpose": "intake", "match": "1234 5678", "reply": "LEAKED"}),
        // The drafter sees the file's numbered lines: line 2 is the bad one.
        json!({"purpose": "intake", "match": "(?s)^user: Draft a change to AGENTS\\.md.*   2\\| The capital of France is Lyon\\.",
               "reply": format!("{{\"remove\": [2], \"add\": [\"{GOOD}\"], \"after\": 2, \"reason\": \"The line named the wrong capital.\"}}")}),
        json!({"purpose": "intake", "reply": "{\"real\": true, \"reason\": \"The reply is wrong.\"}"}),
        // The live model follows its instructions: wrong only while the bad
        // line is in AGENTS.md.
        json!({"purpose": "turn", "match": "capital of France", "match_any": "capital of France is Lyon", "reply": "Lyon."}),
        json!({"purpose": "turn", "match": "capital of France", "reply": "Paris."}),
        json!({"purpose": "turn", "reply": "Sure."}),
    ];
    HostOptions {
        model: json!({ "rules": rules }),
        config: vec![
            ("review.batch_size", serde_yaml_ng::Value::Number(1.into())),
            (
                "review.calls_per_minute",
                serde_yaml_ng::Value::Number(600.into()),
            ),
        ],
        ..Default::default()
    }
}

async fn output(mut cmd: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap()
}

fn mercury(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .args(args);
    c
}

async fn put_agents(host: &TestHost, space: &str, content: &str) {
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/files/AGENTS.md",
            Some(space),
            Some(json!({ "content": content })),
        )
        .await;
    assert_eq!(st, 200, "{v}");
}

async fn agents(host: &TestHost, space: &str) -> String {
    let (st, v) = host
        .owner(Method::GET, "/api/files/AGENTS.md", Some(space), None)
        .await;
    assert_eq!(st, 200, "{v}");
    v["content"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_drafts_a_fix_and_approval_applies_it_or_refuses_a_stale_one() {
    let host = TestHost::start(options()).await;
    let base = format!("# Family bot\n{BAD}\nBe brief.\n");
    // `club`'s file holds a phone number next to the bad line.
    let club = format!("# Club bot\n{BAD}\nBook on +31 6 1234 5678.\n");
    for (space, text) in [("family", &base), ("work", &base), ("club", &club)] {
        host.create_space(space).await;
        put_agents(&host, space, text).await;
        let r = host.chat(space, "What is the capital of France?").await;
        assert_eq!(r["reply"], "Lyon.", "{r}");
    }
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!((st, run["findings"].as_u64()), (200, Some(3)), "{run}");

    let data = host.data.to_str().unwrap().to_owned();
    let out = output(mercury(&["review", "intake", "--data-dir", &data])).await;
    assert!(out.status.success(), "{out:?}");
    let intake = host.data.join("reviews/intake");
    let triage: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake.join("triage.json")).unwrap())
            .unwrap();
    let rows = triage["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{triage}");
    // The model saw the club's file redacted; the diff would show the
    // number as context, so there is no draft, and the triage says why.
    let (club_row, rows): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r["draft"].is_null());
    assert_eq!(club_row.len(), 1, "{triage}");
    assert_eq!(
        club_row[0]["draft_note"], "not drafted: the draft would hold an identifier",
        "{triage}"
    );
    for f in ["triage.json", "triage.md"] {
        let text = std::fs::read_to_string(intake.join(f)).unwrap();
        assert!(!text.contains("1234") && !text.contains("5678"), "{text}");
    }
    for r in rows {
        let d = &r["draft"];
        assert_eq!(d["file"], "AGENTS.md", "{r}");
        assert_eq!(
            d["diff"],
            format!(
                "--- a/AGENTS.md\n+++ b/AGENTS.md\n@@ -1,3 +1,3 @@\n # Family bot\n-{BAD}\n+{GOOD}\n Be brief.\n"
            ),
            "{r}"
        );
        assert_eq!(d["edit"], json!({"remove": [2], "add": [GOOD], "after": 2}));
    }
    let md = std::fs::read_to_string(intake.join("triage.md")).unwrap();
    assert!(md.contains("## Drafted fixes"), "{md}");
    assert!(md.contains("```diff\n--- a/AGENTS.md"), "{md}");

    // Without a running host answering, nothing is approved.
    let socket = host.data.join("api.sock");
    let aside = host.data.join("api.sock.aside");
    std::fs::rename(&socket, &aside).unwrap();
    let out = output(mercury(&[
        "review",
        "approve",
        "--data-dir",
        &data,
        "--all",
    ]))
    .await;
    std::fs::rename(&aside, &socket).unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("carries a drafted change") && err.contains("nothing was approved"),
        "{err}"
    );
    assert!(!intake.join("ledger.json").exists(), "nothing was written");

    // `work`'s file changes after the draft: its draft is stale.
    let changed = format!("{base}Answer in French.\n");
    put_agents(&host, "work", &changed).await;
    let out = output(mercury(&[
        "review",
        "approve",
        "--data-dir",
        &data,
        "--all",
    ]))
    .await;
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(1),
        "one draft was not applied: {out:?}"
    );
    assert!(said.contains(": applied"), "{said}");
    assert!(
        said.contains(": stale: AGENTS.md changed since the draft"),
        "{said}"
    );
    assert_eq!(
        agents(&host, "family").await,
        format!("# Family bot\n{GOOD}\nBe brief.\n")
    );
    assert_eq!(
        agents(&host, "work").await,
        changed,
        "a stale draft writes nothing"
    );
    let ledger: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake.join("ledger.json")).unwrap())
            .unwrap();
    let mut outcomes: Vec<String> = ledger["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["draft"]["outcome"].as_str().map(str::to_owned))
        .collect();
    outcomes.sort();
    assert_eq!(outcomes.len(), 2, "{ledger}");
    assert_eq!(outcomes[0], "applied", "{ledger}");
    assert!(outcomes[1].starts_with("stale: "), "{ledger}");

    // The next live turn reads the fixed instructions.
    let r = host.chat("family", "What is the capital of France?").await;
    assert_eq!(r["reply"], "Paris.", "{r}");
    let r = host.chat("work", "What is the capital of France?").await;
    assert_eq!(r["reply"], "Lyon.", "{r}");
    host.stop().await;
}

/// The dashboard shows a triage row's drafted diff, and approving it there
/// applies it through the space's writer, as the CLI does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_draft_approved_on_the_dashboard_is_applied_by_the_host() {
    use crate::ui::{csrf_of, get, no_redirects, post_form, sign_in};
    let host = TestHost::start(options()).await;
    host.create_space("family").await;
    put_agents(
        &host,
        "family",
        &format!("# Family bot\n{BAD}\nBe brief.\n"),
    )
    .await;
    host.chat("family", "What is the capital of France?").await;
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!((st, run["findings"].as_u64()), (200, Some(1)), "{run}");
    let data = host.data.to_str().unwrap().to_owned();
    let out = output(mercury(&["review", "intake", "--data-dir", &data])).await;
    assert!(out.status.success(), "{out:?}");

    let http = no_redirects();
    let cookie = sign_in(&host, &http, &host.owner_token).await;
    let (st, page) = get(&host, &http, "/ui/review", &cookie).await;
    assert_eq!(st, reqwest::StatusCode::OK);
    let at = page.find("id=\"draft-1\"").expect("the row's draft");
    let shown = &page[at..at + page[at..].find("</details>").unwrap()];
    assert!(shown.contains(&format!("-{BAD}\n+{GOOD}")), "{shown}");
    assert!(
        shown.contains("Not rehearsed: <code>mercury review rehearse 1</code>"),
        "{shown}"
    );
    let csrf = csrf_of(&page);
    let (st, to) = post_form(
        &host,
        &http,
        "/ui/review/approve",
        &cookie,
        &[("csrf", csrf.as_str()), ("all", "1")],
    )
    .await;
    assert_eq!(st, reqwest::StatusCode::SEE_OTHER);
    assert!(to.ends_with("&drafts=1-of-1"), "{to}");
    assert_eq!(
        agents(&host, "family").await,
        format!("# Family bot\n{GOOD}\nBe brief.\n")
    );
    let r = host.chat("family", "What is the capital of France?").await;
    assert_eq!(r["reply"], "Paris.", "{r}");
    host.stop().await;
}

/// Checkpoint of issue 31: a known bad `AGENTS.md` line makes the bot
/// answer wrongly; the daily review flags it, the intake drafts the fix,
/// `mercury review rehearse` replays the message in six shadows (current
/// fails 3/3, candidate passes 3/3, no side effects) without touching the
/// live bot, approval applies the diff, and the next live turn is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_rehearsal_checkpoint_current_fails_candidate_passes_then_approval_fixes_live() {
    let mut opts = options();
    let compare = [
        json!({"purpose": "judge", "match": "(?s)^user: Compare a replayed reply.*assistant: Lyon",
               "reply": "{\"still\": true, \"reason\": \"It names Lyon again.\"}"}),
        json!({"purpose": "judge", "match": "(?s)^user: Compare a replayed reply",
               "reply": "{\"still\": false, \"reason\": \"It names Paris.\"}"}),
    ];
    let rules = opts.model["rules"].as_array_mut().unwrap();
    for (i, r) in compare.into_iter().enumerate() {
        rules.insert(i, r);
    }
    let host = TestHost::start(opts).await;
    let base = format!("# Family bot\n{BAD}\nBe brief.\n");
    host.create_space("family").await;
    put_agents(&host, "family", &base).await;
    host.chat("family", "What is the capital of France?").await;
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!((st, run["findings"].as_u64()), (200, Some(1)), "{run}");
    let data = host.data.to_str().unwrap().to_owned();
    let out = output(mercury(&["review", "intake", "--data-dir", &data])).await;
    assert!(out.status.success(), "{out:?}");
    let intake = host.data.join("reviews/intake");
    let triage_path = intake.join("triage.json");

    let root_dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(root_dir.path()).unwrap();
    let root = root.to_str().unwrap().to_owned();
    let rehearse = |row: &str| {
        let mut c = mercury(&[
            "review",
            "rehearse",
            row,
            "--data-dir",
            &data,
            "--root",
            &root,
        ]);
        c.env("HOME", &root);
        c
    };
    // A row that is not there, and a finding of another source, are refused.
    let out = output(rehearse("9")).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let saved = std::fs::read_to_string(&triage_path).unwrap();
    std::fs::write(
        &triage_path,
        saved.replace("\"bot\": \"local\"", "\"bot\": \"beta\""),
    )
    .unwrap();
    let out = output(rehearse("1")).await;
    std::fs::write(&triage_path, &saved).unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a finding of beta, taken in from another source"),
        "{err}"
    );

    let out = output(rehearse("1")).await;
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    assert!(
        said.contains(
            "row 1: the candidate fixes it: current failed 3 of 3, candidate passed 3 of 3"
        ),
        "{said}"
    );
    let triage: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&triage_path).unwrap()).unwrap();
    let r = &triage["rows"][0]["rehearsal"];
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "{r}");
    for (i, run) in runs.iter().enumerate() {
        let (arm, answer, still) = if i < 3 {
            ("current", "Lyon.", true)
        } else {
            ("candidate", "Paris.", false)
        };
        assert_eq!(
            (
                run["arm"].as_str(),
                run["answer"].as_str(),
                run["still"].as_bool()
            ),
            (Some(arm), Some(answer), Some(still)),
            "{r}"
        );
        assert_eq!(run["side_effects"], json!([]), "no side effects: {r}");
    }
    // The live bot was not touched: its file, and its answer, are as before;
    // no shadow is left running and the copies are gone.
    assert_eq!(agents(&host, "family").await, base);
    let r = host.chat("family", "What is the capital of France?").await;
    assert_eq!(r["reply"], "Lyon.", "{r}");
    let left: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !left
            .iter()
            .any(|n| n.starts_with("rehearse-") || n == "running.json"),
        "{left:?}"
    );

    // Approval carries the rehearsal into the ledger and applies the diff.
    let out = output(mercury(&[
        "review",
        "approve",
        "--data-dir",
        &data,
        "--rows",
        "1",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let ledger: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake.join("ledger.json")).unwrap())
            .unwrap();
    assert_eq!(
        ledger["rows"][0]["rehearsal"]["candidate_passed"], 3,
        "{ledger}"
    );
    assert_eq!(ledger["rows"][0]["draft"]["outcome"], "applied", "{ledger}");
    let r = host.chat("family", "What is the capital of France?").await;
    assert_eq!(r["reply"], "Paris.", "{r}");
    host.stop().await;
}
