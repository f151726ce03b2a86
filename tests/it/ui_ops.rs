//! The dashboard's daily actions over plain HTTP (issue 27): pausing and
//! resuming a task, muting and unmuting a sender, stopping a turn; each
//! refused without its CSRF token or the API route's permission, and each
//! leaving the same rows the API would.

use reqwest::{Method, StatusCode};
use serde_json::json;

use mercury::storage::Query;

use crate::common::{HostOptions, TestHost};
use crate::review_intake::judge_rule;
use crate::ui::{csrf_of, get, no_redirects, post_form, sign_in};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_task_mute_and_stop_actions() {
    let host = TestHost::start(HostOptions::default()).await;
    let http = no_redirects();
    host.create_space("ops").await;
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/tasks",
            Some("ops"),
            Some(json!({"cron": "0 9 * * *", "prompt": "morning summary"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let task = v["task"]["id"].as_i64().unwrap();
    let cookie = sign_in(&host, &http, &host.owner_token).await;
    let (st, page) = get(&host, &http, "/ui/spaces/ops", &cookie).await;
    assert_eq!(st, StatusCode::OK);
    let csrf = csrf_of(&page);
    let pause = format!("/ui/spaces/ops/tasks/{task}/pause");
    assert!(page.contains(&pause), "no pause form: {page}");
    let task_state = || {
        host.read(move |c| mercury::storage::tasks::get(c, "ops", task))
            .unwrap()
            .state
    };

    // Without the CSRF token nothing changes.
    let (st, _) = post_form(&host, &http, &pause, &cookie, &[]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(task_state(), "active");

    let (st, to) = post_form(&host, &http, &pause, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(st, StatusCode::SEE_OTHER);
    assert_eq!(to, "/ui/spaces/ops?did=paused");
    assert_eq!(task_state(), "paused");
    let (_, page) = get(&host, &http, &to, &cookie).await;
    assert!(page.contains("The task is paused."), "{page}");
    assert!(page.contains(&format!("/ui/spaces/ops/tasks/{task}/resume")));

    // Resuming moves its next time to the next 09:00 from now.
    let resume = format!("/ui/spaces/ops/tasks/{task}/resume");
    let (st, _) = post_form(&host, &http, &resume, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(st, StatusCode::SEE_OTHER);
    let t = host
        .read(move |c| mercury::storage::tasks::get(c, "ops", task))
        .unwrap();
    assert_eq!(t.state, "active");
    assert!(t.next_run_at.unwrap() > mercury::clock::now_ms());

    // A task of another space, a word that is no action: refused, nothing changed.
    host.create_space("other").await;
    let (st, _) = post_form(
        &host,
        &http,
        &format!("/ui/spaces/other/tasks/{task}/pause"),
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = post_form(
        &host,
        &http,
        &format!("/ui/spaces/ops/tasks/{task}/delete"),
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(task_state(), "active");

    // Mute for an hour, with a reason; the API lists it; unmute.
    let (st, to) = post_form(
        &host,
        &http,
        "/ui/spaces/ops/mutes",
        &cookie,
        &[
            ("csrf", &csrf),
            ("caller_id", "telegram:42"),
            ("for", "1h"),
            ("reason", "flooding"),
        ],
    )
    .await;
    assert_eq!(st, StatusCode::SEE_OTHER, "{to}");
    let (_, v) = host
        .owner(Method::GET, "/api/mutes", Some("ops"), None)
        .await;
    let mutes = v["mutes"].as_array().unwrap();
    assert_eq!(mutes.len(), 1, "{v}");
    assert_eq!(mutes[0]["caller_id"], "telegram:42");
    assert_eq!(mutes[0]["reason"], "flooding");
    let until = mutes[0]["until"].as_i64().unwrap();
    let hour = until - mercury::clock::now_ms();
    assert!(hour > 3_500_000 && hour <= 3_600_000, "{hour}");
    let (_, page) = get(&host, &http, "/ui/spaces/ops", &cookie).await;
    assert!(page.contains("data-muted=\"telegram:42\""), "{page}");
    // Bad input is a 400 with nothing written.
    for form in [
        vec![("csrf", csrf.as_str()), ("caller_id", "")],
        vec![
            ("csrf", csrf.as_str()),
            ("caller_id", "telegram:7"),
            ("for", "soon"),
        ],
    ] {
        let (st, _) = post_form(&host, &http, "/ui/spaces/ops/mutes", &cookie, &form).await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
    }
    let (st, to) = post_form(
        &host,
        &http,
        "/ui/spaces/ops/unmute",
        &cookie,
        &[("csrf", &csrf), ("caller_id", "telegram:42")],
    )
    .await;
    assert_eq!(
        (st, to.as_str()),
        (StatusCode::SEE_OTHER, "/ui/spaces/ops?did=unmuted")
    );
    let (_, v) = host
        .owner(Method::GET, "/api/mutes", Some("ops"), None)
        .await;
    assert_eq!(v["mutes"].as_array().unwrap().len(), 0, "{v}");

    // Stop with no turn running says so.
    let (st, to) = post_form(
        &host,
        &http,
        "/ui/spaces/ops/stop",
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        (st, to.as_str()),
        (StatusCode::SEE_OTHER, "/ui/spaces/ops?did=idle")
    );

    // A reader (no admin permission) sees the space but none of the forms,
    // and a hand-made post is refused as the API refuses it.
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("ops"),
            Some(json!({"role": "reader", "permissions": ["messages.read", "tasks.list", "mutes.list"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let carol = host.token("api:carol", "user").await;
    host.grant("ops", "api:carol", "reader").await;
    let carol_cookie = sign_in(&host, &http, &carol).await;
    let (st, page) = get(&host, &http, "/ui/spaces/ops", &carol_cookie).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        !page.contains(&pause) && !page.contains("/ui/spaces/ops/mutes"),
        "{page}"
    );
    let carol_csrf = csrf_of(&page);
    for path in [pause.as_str(), "/ui/spaces/ops/stop"] {
        let (st, _) = post_form(&host, &http, path, &carol_cookie, &[("csrf", &carol_csrf)]).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}");
    }
    let (st, _) = post_form(
        &host,
        &http,
        "/ui/spaces/ops/mutes",
        &carol_cookie,
        &[("csrf", &carol_csrf), ("caller_id", "api:owner")],
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(task_state(), "active");
    host.stop().await;
}

async fn dm_in(h: &TestHost, adapter: &str, conv: &str, sender: &str, mid: &str) {
    let (st, v) = h.ingest(adapter, conv, sender, "hello", mid, false).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["status"], "pairing", "{v}");
}

fn pending_codes(h: &TestHost) -> Vec<(String, String)> {
    let now = mercury::clock::now_ms();
    h.read(move |c| mercury::storage::pairings::list(c, now))
        .into_iter()
        .map(|p| (p.sender, p.code))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_pairing_requests_are_approved_and_denied_by_global_admins_only() {
    let host = TestHost::start(HostOptions::default()).await;
    let http = no_redirects();
    let adapter = host.adapter_token("bridge", "test").await;
    dm_in(&host, &adapter, "dm-ada", "ada", "a-1").await;
    dm_in(&host, &adapter, "dm-bo", "bo", "b-1").await;
    let codes = pending_codes(&host);
    let code_of = |who: &str| {
        codes
            .iter()
            .find(|(s, _)| s == &format!("test:{who}"))
            .unwrap()
            .1
            .clone()
    };
    let cookie = sign_in(&host, &http, &host.owner_token).await;
    let (st, page) = get(&host, &http, "/ui/pairings", &cookie).await;
    assert_eq!(st, StatusCode::OK);
    let csrf = csrf_of(&page);
    for who in ["ada", "bo"] {
        assert!(
            page.contains(&format!("data-code=\"{}\"", code_of(who))),
            "{page}"
        );
    }

    // A space admin is refused the page and the decision.
    host.create_space("beta").await;
    let bob = host.token("api:bob", "user").await;
    host.grant("beta", "api:bob", "admin").await;
    let bob_cookie = sign_in(&host, &http, &bob).await;
    assert_eq!(
        get(&host, &http, "/ui/pairings", &bob_cookie).await.0,
        StatusCode::FORBIDDEN
    );
    let (_, bob_page) = get(&host, &http, "/ui/spaces/beta", &bob_cookie).await;
    let bob_csrf = csrf_of(&bob_page);
    let approve_ada = format!("/ui/pairings/{}/approve", code_of("ada"));
    let (st, _) = post_form(
        &host,
        &http,
        &approve_ada,
        &bob_cookie,
        &[("csrf", &bob_csrf)],
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // Without the CSRF token: refused too.
    let (st, _) = post_form(&host, &http, &approve_ada, &cookie, &[]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(pending_codes(&host).len(), 2);

    // Approve ada: allowed, told once; deny bo: denied, told nothing.
    let (st, to) = post_form(&host, &http, &approve_ada, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(
        (st, to.as_str()),
        (StatusCode::SEE_OTHER, "/ui/pairings?did=approved")
    );
    let deny_bo = format!("/ui/pairings/{}/deny", code_of("bo"));
    let (st, _) = post_form(&host, &http, &deny_bo, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(st, StatusCode::SEE_OTHER);
    assert!(pending_codes(&host).is_empty());
    let (_, v) = host.owner(Method::GET, "/api/senders", None, None).await;
    let rules = v["senders"].as_array().unwrap();
    let decision = |who: &str| {
        rules
            .iter()
            .find(|r| r["subject"] == format!("test:{who}"))
            .map(|r| r["status"].as_str().unwrap().to_owned())
    };
    assert_eq!(decision("ada").as_deref(), Some("allowed"), "{v}");
    assert_eq!(decision("bo").as_deref(), Some("denied"), "{v}");
    let told = |conv: &'static str| -> Vec<String> {
        host.read(move |c| {
            c.query_all(
                "SELECT text FROM outbox WHERE external_id = ?1 ORDER BY id",
                &[&conv],
                |r| r.get(0),
            )
        })
    };
    let ada_told = told("dm-ada");
    assert!(
        ada_told.last().unwrap().contains("You are approved"),
        "{ada_told:?}"
    );
    assert!(!told("dm-bo").iter().any(|t| t.contains("You are approved")));

    // A decided (or malformed) code: a clear 404 (or 400), nothing changed.
    let (st, _) = post_form(&host, &http, &approve_ada, &cookie, &[("csrf", &csrf)]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = post_form(
        &host,
        &http,
        "/ui/pairings/0OIL/approve",
        &cookie,
        &[("csrf", &csrf)],
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert_eq!(told("dm-ada").len(), ada_told.len());
    host.stop().await;
}

/// Runs a command off the runtime (the host it calls runs in this process).
async fn output(mut cmd: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap()
}

fn mercury_cmd(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .args(args);
    c
}

/// A host whose judge flags two exchanges (a wrong capital, a curt weather
/// reply) and whose intake finds every finding real; `extra` config too.
pub(crate) fn review_options(extra: Vec<(&'static str, serde_yaml_ng::Value)>) -> HostOptions {
    let rules = vec![
        judge_rule(
            "capital of France",
            "wrong_answer",
            "memory",
            "The assistant named the wrong capital of France.",
        ),
        judge_rule(
            "weather",
            "tone",
            "character",
            "The reply about the weather was curt.",
        ),
        json!({"purpose": "judge", "reply": "{\"findings\": []}"}),
        json!({"purpose": "intake", "reply": "{\"real\": true, \"reason\": \"The reply is wrong.\"}"}),
        json!({"purpose": "turn", "match": "capital of France", "reply": "Lyon."}),
        json!({"purpose": "turn", "reply": "Sunny."}),
    ];
    let mut config = vec![
        ("review.batch_size", serde_yaml_ng::Value::Number(1.into())),
        (
            "review.calls_per_minute",
            serde_yaml_ng::Value::Number(600.into()),
        ),
    ];
    config.extend(extra);
    HostOptions {
        model: json!({ "rules": rules }),
        config,
        ..Default::default()
    }
}

/// Two exchanges in `family`, the day's scan; the report's date.
pub(crate) async fn scanned(host: &TestHost) -> String {
    host.create_space("family").await;
    host.chat("family", "What is the capital of France?").await;
    host.chat("family", "How is the weather today?").await;
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{run}");
    run["date"].as_str().unwrap().to_owned()
}

/// `mercury review intake` on the host's data dir; the triage it wrote.
pub(crate) async fn triaged(host: &TestHost) -> serde_json::Value {
    let data = host.data.to_str().unwrap().to_owned();
    let out = output(mercury_cmd(&["review", "intake", "--data-dir", &data])).await;
    assert!(out.status.success(), "{out:?}");
    let path = host.data.join("reviews/intake/triage.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The triage row whose finding's summary holds `needle`.
pub(crate) fn row_of(triage: &serde_json::Value, needle: &str) -> String {
    triage["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["finding"]["summary"].as_str().unwrap().contains(needle))
        .unwrap()["row"]
        .as_u64()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_review_reports_link_their_runs_and_the_triage_is_approved_as_the_cli_does() {
    let host = TestHost::start(review_options(Vec::new())).await;
    let http = no_redirects();
    let date = scanned(&host).await;

    let cookie = sign_in(&host, &http, &host.owner_token).await;
    let (st, page) = get(&host, &http, "/ui/review", &cookie).await;
    assert_eq!(st, StatusCode::OK);
    assert!(page.contains("id=\"no-triage\""), "{page}");
    assert!(
        page.contains(&format!("/ui/review/reports/{date}")),
        "{page}"
    );
    let csrf = csrf_of(&page);

    // The daily report: each finding links to its exchange and to the
    // trace of the run that answered it.
    let (st, report) = get(&host, &http, &format!("/ui/review/reports/{date}"), &cookie).await;
    assert_eq!(st, StatusCode::OK, "{report}");
    assert!(
        report.contains("The assistant named the wrong capital of France."),
        "{report}"
    );
    let at = report.find("href=\"/ui/runs/").expect("a trace link") + "href=\"/ui/runs/".len();
    let run_id = &report[at..at + report[at..].find('"').unwrap()];
    let (st, trace) = get(&host, &http, &format!("/ui/runs/{run_id}"), &cookie).await;
    assert_eq!(st, StatusCode::OK, "{trace}");
    assert!(report.contains("/ui/spaces/family#m"), "{report}");
    let (st, _) = get(&host, &http, "/ui/review/reports/not-a-date", &cookie).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    // The weekly report's trends: each cluster's findings per week, as
    // counts and as a bar chart (one bar a week, this week's the last).
    let (st, v) = host
        .owner(Method::POST, "/api/review/weekly", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, weekly) = get(
        &host,
        &http,
        &format!("/ui/review/reports/{date}-weekly"),
        &cookie,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{weekly}");
    let trends = &weekly[weekly
        .find("<table id=\"trends\">")
        .expect("a trends table")..];
    let trends = &trends[..trends.find("</table>").unwrap()];
    assert!(trends.contains("0, 0, 0, 0, 0, 0, 0, 1"), "{trends}");
    // Two clusters (the capital, the weather), a bar a week each.
    assert_eq!(trends.matches("<rect ").count(), 16, "{trends}");
    assert!(
        trends.contains("<rect x=\"70\" y=\"0\" width=\"8\" height=\"24\">"),
        "{trends}"
    );

    // The intake makes the triage; the page shows its rows.
    let triage = triaged(&host).await;
    let intake = host.data.join("reviews/intake");
    let (capital, weather) = (row_of(&triage, "capital"), row_of(&triage, "weather"));
    let (_, page) = get(&host, &http, "/ui/review", &cookie).await;
    assert!(page.contains(&format!("name=\"row-{capital}\"")), "{page}");
    assert!(page.contains(&format!("name=\"row-{weather}\"")), "{page}");

    // Refused without the CSRF token, with a decision that is no word, and
    // while an intake holds the lock: nothing is written.
    let capital_field = format!("row-{capital}");
    let weather_field = format!("row-{weather}");
    let chosen = |csrf: &'static str| {
        vec![
            ("csrf", csrf),
            (capital_field.as_str(), "proposed"),
            (weather_field.as_str(), "reject"),
        ]
    };
    let (st, _) = post_form(&host, &http, "/ui/review/approve", &cookie, &chosen("")).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let csrf: &'static str = Box::leak(csrf.into_boxed_str());
    let (st, _) = post_form(
        &host,
        &http,
        "/ui/review/approve",
        &cookie,
        &[("csrf", csrf), (capital_field.as_str(), "maybe")],
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    {
        let paths = mercury::workspace::DataPaths::new(&host.data);
        let _held = mercury::workspace::data_dir::lock_intake(&paths).unwrap();
        let (st, _) = post_form(&host, &http, "/ui/review/approve", &cookie, &chosen(csrf)).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert!(!intake.join("ledger.json").exists());

    // A space admin is refused the page and the approval.
    host.create_space("beta").await;
    let bob = host.token("api:bob", "user").await;
    host.grant("beta", "api:bob", "admin").await;
    let bob_cookie = sign_in(&host, &http, &bob).await;
    assert_eq!(
        get(&host, &http, "/ui/review", &bob_cookie).await.0,
        StatusCode::FORBIDDEN
    );
    let (_, bob_page) = get(&host, &http, "/ui/spaces/beta", &bob_cookie).await;
    let bob_csrf: &'static str = Box::leak(csrf_of(&bob_page).into_boxed_str());
    let (st, _) = post_form(
        &host,
        &http,
        "/ui/review/approve",
        &bob_cookie,
        &chosen(bob_csrf),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    // Approved: the capital row as proposed (a new bug), the weather row
    // rejected; every row is in the ledger, as `mercury review approve` does.
    let (st, to) = post_form(&host, &http, "/ui/review/approve", &cookie, &chosen(csrf)).await;
    assert_eq!(
        (st, to.as_str()),
        (StatusCode::SEE_OTHER, "/ui/review?did=approved-2-of-2")
    );
    let ledger: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake.join("ledger.json")).unwrap())
            .unwrap();
    let rows = ledger["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{ledger}");
    let approved_as = |needle: &str| {
        rows.iter()
            .find(|r| r["summary"].as_str().unwrap().contains(needle))
            .unwrap()["approved"]
            .clone()
    };
    assert_eq!(approved_as("capital"), json!("new"));
    assert_eq!(approved_as("weather"), json!("reject"));
    assert!(std::fs::read_dir(intake.join("bugs")).unwrap().count() >= 1);
    let (_, page) = get(&host, &http, &to, &cookie).await;
    assert!(page.contains("2 of 2 row(s) approved"), "{page}");
    assert!(page.contains("id=\"no-triage\""), "{page}");
    // Nothing is waiting now: a second post is a clear 400.
    let (st, _) = post_form(&host, &http, "/ui/review/approve", &cookie, &chosen(csrf)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    host.stop().await;
}

/// A live host whose `shadow_root` is a fresh directory, a snapshot of it
/// taken with `mercury shadow snapshot`, and the shadow's copy changed as a
/// rehearsal would change it: an instruction, a preference naming a phone
/// number, a held send.
pub(crate) async fn rehearsed_host() -> (TestHost, tempfile::TempDir, String) {
    let root_dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(HostOptions {
        config: vec![shadow_root_of(&root_dir)],
        ..Default::default()
    })
    .await;
    let id = rehearse(&host, root_dir.path()).await;
    (host, root_dir, id)
}

/// The `shadow_root` config key naming `dir`.
pub(crate) fn shadow_root_of(dir: &tempfile::TempDir) -> (&'static str, serde_yaml_ng::Value) {
    let root = std::fs::canonicalize(dir.path()).unwrap();
    (
        "shadow_root",
        serde_yaml_ng::Value::from(root.display().to_string()),
    )
}

/// Snapshots `host` under `root` and changes the copy; the snapshot's id.
pub(crate) async fn rehearse(host: &TestHost, root: &std::path::Path) -> String {
    let root = std::fs::canonicalize(root).unwrap();
    host.create_space("alpha").await;
    std::fs::write(
        host.data.join("spaces/alpha/AGENTS.md"),
        "# Alpha\nBe brief.\nAnswer in English.\n",
    )
    .unwrap();
    host.chat("alpha", "hello").await;
    let data = host.data.to_str().unwrap().to_owned();
    let root_s = root.to_str().unwrap().to_owned();
    let out = output(mercury_cmd(&[
        "shadow",
        "snapshot",
        "--data-dir",
        &data,
        "--root",
        &root_s,
        "--admins",
        "api:rehearser",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let snap = std::fs::canonicalize(root.join("current")).unwrap();
    let id = snap.file_name().unwrap().to_str().unwrap().to_owned();
    std::fs::write(
        snap.join("spaces/alpha/AGENTS.md"),
        "# Alpha\nBe brief and kind.\nAnswer in English.\n",
    )
    .unwrap();
    mercury::storage::inspect::execute_script_on_file(
        &snap.join("state.db"),
        "INSERT INTO space_preferences (space_id, key, value, updated_by, updated_at)
           VALUES ('alpha', 'contact', 'call +31 6 1234 5678 <script>window.pwned=1</script>', 'owner', 1);",
    )
    .unwrap();
    let send = json!({"kind": "send", "time": 1, "space": "alpha", "conversation": 1,
        "platform": "telegram", "external_id": "42", "text": "Held: see you at nine", "source": "send"});
    let transcript = snap.join("shadow/transcript.jsonl");
    let mut text = std::fs::read_to_string(&transcript).unwrap_or_default();
    text.push_str(&format!("{send}\n"));
    std::fs::write(&transcript, text).unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_rehearsal_lists_snapshots_and_shows_a_redacted_diff_side_by_side() {
    let (host, _root, id) = rehearsed_host().await;
    let http = no_redirects();
    let cookie = sign_in(&host, &http, &host.owner_token).await;
    let (st, page) = get(&host, &http, "/ui/rehearsal", &cookie).await;
    assert_eq!(st, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("data-snapshot=\"{id}\"")), "{page}");
    assert!(page.contains("No shadow runs."), "{page}");
    // The overview says so too, and when the next review scan fires.
    let (_, overview) = get(&host, &http, "/ui/", &cookie).await;
    assert!(
        overview.contains("<span id=\"shadow\">none</span>"),
        "{overview}"
    );
    // (Test hosts run with review off; the review test's host has it on.)
    assert!(
        overview.contains("id=\"next-review\">off (review.enabled is false)</span>"),
        "{overview}"
    );

    let (st, diff) = get(&host, &http, &format!("/ui/rehearsal/{id}"), &cookie).await;
    assert_eq!(st, StatusCode::OK, "{diff}");
    assert!(diff.contains("data-file=\"alpha/AGENTS.md\""), "{diff}");
    assert!(
        diff.contains("<span class=\"del\">- Be brief.</span>"),
        "{diff}"
    );
    assert!(
        diff.contains("<span class=\"add\">+ Be brief and kind.</span>"),
        "{diff}"
    );
    assert!(diff.contains("space_preferences"), "{diff}");
    assert!(diff.contains("Held: see you at nine"), "{diff}");
    // Redacted as `mercury shadow diff` is, and escaped on output.
    assert!(
        !diff.contains("1234 5678") && !diff.contains("612345678"),
        "{diff}"
    );
    assert!(!diff.contains("<script>window"), "{diff}");
    let (_, only_beta) = get(
        &host,
        &http,
        &format!("/ui/rehearsal/{id}?space=beta"),
        &cookie,
    )
    .await;
    assert!(
        !only_beta.contains("data-file=\"alpha/AGENTS.md\""),
        "{only_beta}"
    );

    // Only a snapshot id under the root: anything else is refused.
    // (A bare `..`, even percent-encoded, never reaches the host: the URL resolves it.)
    for bad in [".hidden", "nosuch", "%2e%2e%2fetc"] {
        let (st, _) = get(&host, &http, &format!("/ui/rehearsal/{bad}"), &cookie).await;
        assert!(
            st == StatusCode::NOT_FOUND || st == StatusCode::BAD_REQUEST,
            "{bad}: {st}"
        );
    }
    let (st, _) = get(&host, &http, &format!("/ui/rehearsal/{id}?page=9"), &cookie).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    // A space admin is refused both pages.
    host.create_space("beta").await;
    let bob = host.token("api:bob", "user").await;
    host.grant("beta", "api:bob", "admin").await;
    let bob_cookie = sign_in(&host, &http, &bob).await;
    for path in ["/ui/rehearsal".to_owned(), format!("/ui/rehearsal/{id}")] {
        assert_eq!(
            get(&host, &http, &path, &bob_cookie).await.0,
            StatusCode::FORBIDDEN
        );
    }
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_link_reach_is_read_only_audited_tagged_and_ends_with_the_link() {
    let host = TestHost::start(HostOptions::default()).await;
    let http = no_redirects();
    host.create_space("alpha").await;
    host.create_space("beta").await;
    // Zero-width characters hidden in alpha's text are stripped across the link.
    host.chat("alpha", "the code word is sec\u{200b}ret").await;
    let bob = host.token("api:bob", "user").await;
    host.grant("beta", "api:bob", "admin").await;
    let bob_cookie = sign_in(&host, &http, &bob).await;
    assert_eq!(
        get(&host, &http, "/ui/spaces/alpha?via=beta", &bob_cookie)
            .await
            .0,
        StatusCode::FORBIDDEN,
        "no link yet"
    );
    let link = host.link("beta", "alpha", "read").await;

    // The holder's page lists the link and opens the target through it.
    let (_, beta) = get(&host, &http, "/ui/spaces/beta", &bob_cookie).await;
    assert!(
        beta.contains("href=\"/ui/spaces/alpha?via=beta\""),
        "{beta}"
    );
    assert!(beta.contains(&format!("#{link}")), "{beta}");
    // Without `via` alpha stays refused; with it the page is alpha's, tagged.
    assert_eq!(
        get(&host, &http, "/ui/spaces/alpha", &bob_cookie).await.0,
        StatusCode::FORBIDDEN
    );
    let audits = || {
        host.read(|c| mercury::storage::links::audit_for(c, "alpha", 100))
            .into_iter()
            .filter(|a| a.route.as_deref() == Some("/ui/spaces/{space}"))
            .collect::<Vec<_>>()
    };
    assert!(audits().is_empty());
    let (st, page) = get(&host, &http, "/ui/spaces/alpha?via=beta", &bob_cookie).await;
    assert_eq!(st, StatusCode::OK, "{page}");
    assert!(
        page.contains("id=\"reach\"") && page.contains(&format!("link #{link}")),
        "{page}"
    );
    assert!(page.contains("data-source-space=\"alpha\""), "{page}");
    assert!(page.contains("the code word is secret"), "{page}");
    assert!(!page.contains('\u{200b}'));
    // Read-only: no chat box, no action forms.
    for form in [
        "/ui/spaces/alpha/chat",
        "/ui/spaces/alpha/stop",
        "/ui/spaces/alpha/mutes",
    ] {
        assert!(!page.contains(form), "{form} offered across a read link");
    }
    let rows = audits();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].caller_id, "api:bob");
    assert_eq!(rows[0].holder_space_id.as_deref(), Some("beta"));
    assert_eq!(rows[0].link_id, Some(link));
    assert_eq!(rows[0].level.as_deref(), Some("read"));
    // A write posted across the link anyway is refused.
    let csrf = csrf_of(&page);
    let (st, _) = post_form(
        &host,
        &http,
        "/ui/spaces/alpha/chat",
        &bob_cookie,
        &[("csrf", &csrf), ("text", "hi")],
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    // A reader of beta without links.act gets nothing through the link.
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("beta"),
            Some(json!({"role": "reader", "permissions": ["messages.read"]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let carol = host.token("api:carol", "user").await;
    host.grant("beta", "api:carol", "reader").await;
    let carol_cookie = sign_in(&host, &http, &carol).await;
    assert_eq!(
        get(&host, &http, "/ui/spaces/alpha?via=beta", &carol_cookie)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // Revoked: the very next page is refused.
    let (st, v) = host
        .owner(
            Method::DELETE,
            &format!("/api/links/{link}"),
            Some("beta"),
            None,
        )
        .await;
    assert!(st == 200 || st == 204, "{st} {v}");
    assert_eq!(
        get(&host, &http, "/ui/spaces/alpha?via=beta", &bob_cookie)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(audits().len(), 1);
    host.stop().await;
}
