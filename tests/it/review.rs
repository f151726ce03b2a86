//! Conversation review, milestone 1, end to end on a real host: the roadmap's
//! checkpoint (a planted wrong answer is flagged with the right message id,
//! the report is redacted, the digest reaches the owner's DM conversation,
//! the footer adds up), the fail-closed gate on the judge's own answer, the
//! route's permission, and the daily scheduler.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

/// `review.owner`: the caller who gets the digest, on their own phone.
const OWNER: &str = "31655501234@s.whatsapp.net";
const OWNER_NAME: &str = "Olivia Bakker";
const ANNA: (&str, &str) = ("31612345678@s.whatsapp.net", "Anna de Vries");
const BRAM: (&str, &str) = ("31687654321@lid", "Bram Jansen");
const GROUP: &str = "120363041234567890@g.us";

const WRONG_ANSWER: &str = "The capital of France is Lyon.";

/// Every seeded identifier (and its parts), as one regex.
const RAW_IDENTIFIERS: &str = concat!(
    r"(?i)\+31 6 1234 5678|06-87654321|31612345678|31687654321|31655501234|120363041234567890",
    r"|@s\.whatsapp\.net|@lid|@g\.us|@example\.|Olivia|Bakker|Anna|Vries|Bram|Jansen|[0-9]{7,}",
);

/// The judge flags the exchange whose user line asks for the capital of
/// France, with `evidence` as given; every other batch is fine.
fn model(evidence: &str) -> Value {
    let finding = json!({
        "message_id": 0, "kind": "wrong_answer", "scope": "space", "target_layer": "memory",
        "severity": 3, "summary": "The assistant named the wrong capital.",
        "evidence": evidence, "suggestion": "Answer Paris and keep basic facts in memory."
    })
    .to_string()
    // The scripted provider fills $1 with the id captured from `[msg N]`.
    .replace("\"message_id\":0", "\"message_id\":$1");
    json!({"rules": [
        // Were anything seeded to reach the judge unredacted, its batch would
        // get an unparsable answer, twice, and be skipped: the checkpoint's
        // counts would not add up.
        {"purpose": "judge", "match_any": RAW_IDENTIFIERS, "reply": "raw identifiers in the prompt"},
        {"purpose": "judge",
         "match": "\\[msg (\\d+)\\]\\n(?:context: [^\\n]*\\n)*user [^\\n]*capital of France",
         "reply": format!("{{\"findings\": [{finding}]}}")},
        {"purpose": "judge", "reply": "{\"findings\": []}"},
        {"purpose": "turn", "match": "capital of France", "reply": WRONG_ANSWER},
        {"purpose": "turn", "reply": "Sure, happy to help."}
    ]})
}

fn options(model: Value, extra: Vec<(&'static str, Yaml)>) -> HostOptions {
    let mut config = vec![
        ("ingress.auto_space", Yaml::Bool(false)),
        // Reviewed conversations come from strangers the tests then link:
        // an open bot (the sender policy has its own tests, tests/it/pairing.rs).
        ("ingress.dm_policy", Yaml::String("open".into())),
        ("review.owner", Yaml::String(OWNER.into())),
        (
            "review.owner_names",
            Yaml::Sequence(vec![Yaml::String(OWNER_NAME.into())]),
        ),
        ("review.batch_size", Yaml::Number(2.into())),
        ("review.calls_per_minute", Yaml::Number(600.into())),
    ];
    config.extend(extra);
    HostOptions {
        model,
        config,
        ..Default::default()
    }
}

/// A fixed-offset zone whose local time is now between 00:00 and 01:00, so
/// a `review.daily_at` of 23:00 there is nearly a day away whenever the test
/// runs (the default 04:00 UTC has passed for most of the day).
fn zone_just_past_midnight() -> String {
    use chrono::Timelike;
    let hour = chrono::Utc::now().hour() as i32;
    // Local = UTC + offset; tz's `Etc/GMT-k` is UTC+k (the sign is POSIX's).
    let offset = if hour <= 12 { -hour } else { 24 - hour };
    match offset {
        0 => "Etc/GMT".into(),
        k if k > 0 => format!("Etc/GMT-{k}"),
        k => format!("Etc/GMT+{}", -k),
    }
}

struct Seeded {
    /// The user message that got the planted wrong answer.
    capital_id: i64,
    capital_reply_id: i64,
    /// The owner's DM conversation.
    owner_conversation: i64,
}

async fn ingress(
    host: &TestHost,
    adapter: &str,
    conversation: &str,
    sender: (&str, &str),
    text: &str,
    mid: &str,
    group: bool,
) -> Value {
    let (st, v) = host
        .call(
            Method::POST,
            "/api/ingress",
            Some(adapter),
            None,
            Some(json!({
                "platform": "whatsapp", "conversation": conversation, "sender_id": sender.0,
                "sender_name": sender.1, "text": text, "message_id": mid, "is_group": group,
                "mentions_bot": group && text.contains("@mercury"),
            })),
        )
        .await;
    assert!(st == 202 || st == 200, "ingress {mid}: {st} {v}");
    v
}

/// Sends a message that the bot answers and waits for the answer.
async fn ask(
    host: &TestHost,
    adapter: &str,
    conversation: &str,
    sender: (&str, &str),
    text: &str,
    mid: &str,
    group: bool,
) -> i64 {
    let replies = host.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'");
    let v = ingress(host, adapter, conversation, sender, text, mid, group).await;
    assert_eq!(v["status"], "queued", "{v}");
    let n = host
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            replies + 1,
            30,
        )
        .await;
    assert_eq!(n, replies + 1, "no reply to {mid}");
    v["message_id"].as_i64().unwrap()
}

async fn link(host: &TestHost, external_id: &str, space: &str) -> i64 {
    let (st, v) = host
        .owner(
            Method::GET,
            "/api/conversations?all=true",
            Some(space),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let id = v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["external_id"] == external_id)
        .unwrap_or_else(|| panic!("no conversation {external_id}: {v}"))["id"]
        .as_i64()
        .unwrap();
    let (st, v) = host
        .owner(
            Method::POST,
            &format!("/api/conversations/{id}/link"),
            Some(space),
            Some(json!({"space_id": space})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    id
}

/// The checkpoint's test space: a group in `review-test` with a planted wrong
/// answer among normal exchanges and identifiers of every kind, the owner's
/// DM in `owner-dm`, and a `client`-tagged space the scan must skip.
async fn seed(host: &TestHost) -> Seeded {
    let adapter = host.adapter_token("adapter:whatsapp", "whatsapp").await;
    for space in ["review-test", "owner-dm"] {
        host.create_space(space).await;
    }
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/spaces",
            None,
            Some(json!({"id": "client-acme", "tags": ["client"]})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    // auto_space is off: the first message only makes the conversation known.
    let v = ingress(host, &adapter, GROUP, ANNA, "@mercury hello", "g0", true).await;
    assert_eq!(v["status"], "unlinked", "{v}");
    let v = ingress(
        host,
        &adapter,
        OWNER,
        (OWNER, OWNER_NAME),
        "hello",
        "d0",
        false,
    )
    .await;
    assert_eq!(v["status"], "unlinked", "{v}");
    link(host, GROUP, "review-test").await;
    let owner_conversation = link(host, OWNER, "owner-dm").await;

    ask(
        host,
        &adapter,
        OWNER,
        (OWNER, OWNER_NAME),
        "hi, this is Olivia Bakker, mail me at olivia.bakker@example.com",
        "d1",
        false,
    )
    .await;
    ask(
        host,
        &adapter,
        GROUP,
        ANNA,
        "@mercury remind me to call Bram at +31 6 1234 5678 tomorrow",
        "g1",
        true,
    )
    .await;
    let v = ingress(
        host,
        &adapter,
        GROUP,
        BRAM,
        "my email is bram.jansen@example.org, or call 06-87654321",
        "g2",
        true,
    )
    .await;
    assert_eq!(v["status"], "ambient", "{v}");
    let capital_id = ask(
        host,
        &adapter,
        GROUP,
        ANNA,
        "@mercury what is the capital of France?",
        "g3",
        true,
    )
    .await;
    ask(
        host,
        &adapter,
        GROUP,
        BRAM,
        "@mercury Olivia Bakker wants the notes at olivia.bakker@example.com",
        "g4",
        true,
    )
    .await;
    ask(
        host,
        &adapter,
        GROUP,
        ANNA,
        "@mercury thanks, and tell 31687654321@lid and 31612345678@s.whatsapp.net too",
        "g5",
        true,
    )
    .await;
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/chat",
            Some("client-acme"),
            Some(json!({"text": "hello from the client"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let capital_reply_id: i64 = host.read(|c| {
        c.query_row(
            "SELECT id FROM messages WHERE reply_to = ?1",
            &[&capital_id],
            |r| r.get(0),
        )
    });
    let reply: String = host.read(|c| {
        c.query_row(
            "SELECT text FROM messages WHERE id = ?1",
            &[&capital_reply_id],
            |r| r.get(0),
        )
    });
    assert_eq!(reply, WRONG_ANSWER);
    Seeded {
        capital_id,
        capital_reply_id,
        owner_conversation,
    }
}

/// `mrctl --json review run-now` with the owner's token.
async fn run_now_with_mrctl(host: &TestHost) -> Value {
    let mut cmd = host.mrctl(&host.owner_token, None);
    cmd.args(["--json", "review", "run-now"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "mrctl review run-now: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn report_dir(host: &TestHost, summary: &Value) -> PathBuf {
    host.data
        .join("reviews")
        .join(format!("{}-daily", summary["date"].as_str().unwrap()))
}

/// `1234567` → `1,234,567`, as the report writes counts.
fn grouped(n: i64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The checkpoint's `grep -E` for every seeded identifier; true if it found any.
fn grep_identifiers(file: &Path) -> bool {
    // grep -E has no inline flags; -i stands in for the regex's (?i).
    let pattern = RAW_IDENTIFIERS.trim_start_matches("(?i)");
    let status = std::process::Command::new("grep")
        .args(["-E", "-i", "-q", pattern])
        .arg(file)
        .status()
        .expect("grep");
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("grep failed on {}: {other:?}", file.display()),
    }
}

async fn outbox_item(host: &TestHost, outbox_id: i64) -> Value {
    let (st, v) = host
        .owner(
            Method::GET,
            &format!("/api/outbox?after={}", outbox_id - 1),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == outbox_id)
        .cloned()
        .unwrap_or_else(|| panic!("no outbox item {outbox_id}: {v}"))
}

#[tokio::test]
async fn review_checkpoint_flags_the_planted_wrong_answer_and_digests_to_the_owner() {
    let host = TestHost::start(options(model("The capital of France is Lyon."), vec![])).await;
    let seeded = seed(&host).await;

    let summary = run_now_with_mrctl(&host).await;
    assert_eq!(summary["status"], "done", "{summary:#}");
    assert_eq!(summary["findings"], 1, "{summary:#}");
    assert_eq!(
        summary["spaces_judged"], 2,
        "review-test and owner-dm: {summary:#}"
    );
    assert_eq!(summary["exchanges_judged"], 5, "{summary:#}");
    // review-test: 4 exchanges in batches of 2; owner-dm: 1.
    assert_eq!(summary["judge_calls"], 3, "{summary:#}");
    assert_eq!(
        summary["skipped"],
        json!([{"what": "client-acme", "reason": "tagged client (review.include_clients is false)", "count": 0}])
    );

    // report.md exists where the roadmap says and flags the right exchange.
    let dir = report_dir(&host, &summary);
    let md_path = dir.join("report.md");
    assert_eq!(summary["report_path"], md_path.display().to_string());
    let md = std::fs::read_to_string(&md_path).unwrap();
    for want in [
        "## Findings (1)".to_owned(),
        "- kind: wrong_answer".to_owned(),
        "- scope: space".to_owned(),
        "- target layer: memory".to_owned(),
        "- space: review-test".to_owned(),
        format!(
            "- message: [msg {}] (reply [msg {}])",
            seeded.capital_id, seeded.capital_reply_id
        ),
        "- evidence: The capital of France is Lyon.".to_owned(),
    ] {
        assert!(md.contains(&want), "{want:?} missing in\n{md}");
    }
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let f = &json["findings"][0];
    assert_eq!(
        (f["message_id"].as_i64(), f["reply_id"].as_i64()),
        (Some(seeded.capital_id), Some(seeded.capital_reply_id))
    );
    assert_eq!(
        (
            f["kind"].as_str(),
            f["scope"].as_str(),
            f["target_layer"].as_str(),
            f["space"].as_str()
        ),
        (
            Some("wrong_answer"),
            Some("space"),
            Some("memory"),
            Some("review-test")
        )
    );

    // The footer's numbers are the scan's, and the judge's usage is recorded.
    let run_id = summary["run_id"].as_str().unwrap();
    let (calls, tokens_in, tokens_out): (i64, i64, i64) = host
        .read(|c| c.query_row(
            "SELECT COUNT(*), SUM(tokens_in), SUM(tokens_out) FROM token_usage WHERE kind = 'review' AND run_id = ?1",
            &[&run_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))));
    assert_eq!(calls, 3);
    for want in [
        "- spaces judged: 2".to_owned(),
        "- exchanges judged: 5".to_owned(),
        "  - client-acme: tagged client (review.include_clients is false)".to_owned(),
        "- judge calls (spawns): 3".to_owned(),
        format!(
            "- tokens: {} in, {} out",
            grouped(tokens_in),
            grouped(tokens_out)
        ),
        "- wall clock: ".to_owned(),
        "- cost: 0.0000 USD".to_owned(),
    ] {
        assert!(
            md.contains(&want),
            "{want:?} missing in the footer of\n{md}"
        );
    }
    let (status, kind): (String, String) = host.read(|c| {
        c.query_row(
            "SELECT status, kind FROM runs WHERE id = ?1",
            &[&run_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!((status.as_str(), kind.as_str()), ("done", "review"));

    // grep -E finds no seeded phone number, WhatsApp id, e-mail or name.
    assert!(
        !grep_identifiers(&md_path),
        "an identifier survived in report.md:\n{md}"
    );
    assert!(
        !grep_identifiers(&dir.join("report.json")),
        "an identifier survived in report.json"
    );

    // The digest is queued for the owner's DM conversation.
    let digest = &summary["digest"];
    assert_eq!(digest["sent"], true, "{digest}");
    assert_eq!(digest["conversation_id"], seeded.owner_conversation);
    let item = outbox_item(&host, digest["outbox_id"].as_i64().unwrap()).await;
    assert_eq!(item["conversation_id"], seeded.owner_conversation);
    assert_eq!(item["external_id"], OWNER);
    let text = item["text"].as_str().unwrap();
    assert!(
        text.contains("1 finding in 5 exchanges (2 spaces judged)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "1. wrong_answer (severity 3, space, memory) in review-test at [msg {}]",
            seeded.capital_id
        )),
        "{text}"
    );
    // Issue 25: the last line is a command, not a server path.
    assert!(
        text.ends_with(&format!(
            "The whole report: mrctl review report {}",
            summary["date"].as_str().unwrap()
        )),
        "{text}"
    );
    assert!(!text.contains(&md_path.display().to_string()), "{text}");
    host.stop().await;
}

#[tokio::test]
async fn review_judge_quoting_a_phone_number_gets_the_report_blocked() {
    let host = TestHost::start(options(
        model("the user asked to call +31 6 1234 5678"),
        vec![],
    ))
    .await;
    let seeded = seed(&host).await;

    let (st, summary) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    assert_eq!(summary["status"], "blocked", "{summary:#}");
    assert_eq!(
        summary["error"],
        "blocked by the identifier gate (phone found)"
    );
    assert!(summary["report_path"].is_null());
    // Nothing was written: not the markdown, not the JSON.
    let dir = report_dir(&host, &summary);
    assert!(
        !dir.join("report.md").exists(),
        "a blocked report was written"
    );
    assert!(
        !dir.join("report.json").exists(),
        "a blocked report was written"
    );
    let (status, error): (String, String) = host.read(|c| {
        c.query_row(
            "SELECT status, error FROM runs WHERE id = ?1",
            &[&summary["run_id"].as_str().unwrap()],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(status, "blocked");
    assert!(error.contains("blocked by the identifier gate"), "{error}");

    // The digest says so, without any content.
    let digest = &summary["digest"];
    assert_eq!(
        (digest["sent"].as_bool(), digest["blocked"].as_bool()),
        (Some(true), Some(true)),
        "{digest}"
    );
    let item = outbox_item(&host, digest["outbox_id"].as_i64().unwrap()).await;
    assert_eq!(item["conversation_id"], seeded.owner_conversation);
    let text = item["text"].as_str().unwrap();
    assert!(
        text.contains("blocked by the identifier gate (phone found"),
        "{text}"
    );
    for leaked in [
        "wrong_answer",
        "capital",
        "Lyon",
        "+31",
        "1234",
        &format!("[msg {}]", seeded.capital_id),
    ] {
        assert!(
            !text.contains(leaked),
            "the blocked digest carries {leaked:?}: {text}"
        );
    }
    host.stop().await;
}

#[tokio::test]
async fn review_run_now_is_for_global_admins_only() {
    let host = TestHost::start(options(model("x"), vec![])).await;
    let alice = host.token("api:alice", "user").await;
    let (st, v) = host
        .call(Method::POST, "/api/review/run", Some(&alice), None, None)
        .await;
    assert_eq!(st, 403, "{v}");
    let (st, _) = host
        .call(Method::POST, "/api/review/run", None, None, None)
        .await;
    assert_eq!(st, 401);
    assert_eq!(
        host.count("SELECT COUNT(*) FROM runs WHERE kind = 'review'"),
        0
    );
    // With nothing in the window the scan still reports, and says so.
    let (st, v) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["exchanges_judged"].as_i64()),
        (Some("done"), Some(0)),
        "{v}"
    );
    assert!(
        v["digest"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("review.owner has no DM with the bot on a chat platform"),
        "{v}"
    );
    host.stop().await;
}

/// Issue 25 item 2, the two setups where the digest went nowhere: an owner
/// who only used the console chat (it was "queued" to the console, which
/// nothing delivers), and an owner whose phone is linked to their operator
/// id with `identities link` (the DM was looked up under the operator id
/// only). The first is said at start-up, in `/api/status` and in the scan's
/// answer, and the digest stays readable (`GET /api/review/digest`,
/// `mrctl review digest`); the second reaches the phone's DM.
#[tokio::test]
async fn review_digest_reaches_the_owners_linked_dm_and_is_kept_when_there_is_none() {
    let host = TestHost::start_process_captured(options(
        model("n/a"),
        vec![
            ("review.owner", Yaml::String("owner".into())),
            ("review.enabled", Yaml::Bool(true)),
            // Today's scan is not due yet: a host started past it runs it
            // at once, and the first assertion is "no digest before a scan".
            ("review.timezone", Yaml::String(zone_just_past_midnight())),
            ("review.daily_at", Yaml::String("23:00".into())),
        ],
    ))
    .await;
    host.create_space("home").await;
    // The owner talks to the bot on the console only.
    host.chat("home", "hello from the console").await;
    let (st, v) = host
        .owner(Method::GET, "/api/review/digest", None, None)
        .await;
    assert_eq!(st, 404, "no digest before the first scan: {v}");
    let (st, status) = host.owner(Method::GET, "/api/status", None, None).await;
    assert_eq!(st, 200, "{status}");
    let why = status["review"]["digest_undeliverable"]
        .as_str()
        .unwrap_or_default();
    assert!(
        why.contains("has no DM with the bot on a chat platform"),
        "{status}"
    );
    assert!(
        host.stderr()
            .contains("review digest: review.owner \"owner\" has no DM"),
        "the start-up log says so:\n{}",
        host.stderr()
    );
    let printed = crate::common::mercury_status(&host).await;
    assert!(
        printed.contains("review digest: not delivered: review.owner \"owner\" has no DM"),
        "{printed}"
    );
    let (st, v) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["digest"]["sent"], false,
        "never queued to the console: {v}"
    );
    let (st, latest) = host
        .owner(Method::GET, "/api/review/digest", None, None)
        .await;
    assert_eq!(st, 200, "{latest}");
    assert_eq!(latest["sent"], false);
    assert_eq!(latest["date"], v["date"]);
    let text = latest["text"].as_str().unwrap();
    assert!(text.starts_with("Conversation review "), "{text}");
    assert!(!text.lines().last().unwrap().contains('/'), "{text}");
    // No outbox row went to the console.
    assert_eq!(host.count("SELECT COUNT(*) FROM outbox"), 0);
    let mut cmd = host.mrctl(&host.owner_token, None);
    cmd.args(["review", "digest"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.starts_with(text), "{shown}");
    assert!(
        shown.contains("delivered: no (review.owner has no DM"),
        "{shown}"
    );

    // The owner's phone, linked to the operator id, writes a DM.
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/identities",
            None,
            Some(json!({"platform_id": format!("whatsapp:{OWNER}"), "caller_id": "owner"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let adapter = host.adapter_token("adapter:whatsapp", "whatsapp").await;
    ingress(
        &host,
        &adapter,
        OWNER,
        (OWNER, OWNER_NAME),
        "hi",
        "p0",
        false,
    )
    .await;
    host.create_space("owner-dm").await;
    let dm = link(&host, OWNER, "owner-dm").await;
    ask(
        &host,
        &adapter,
        OWNER,
        (OWNER, OWNER_NAME),
        "hello again",
        "p1",
        false,
    )
    .await;
    let (_, status) = host.owner(Method::GET, "/api/status", None, None).await;
    assert!(
        status["review"]["digest_undeliverable"].is_null(),
        "{status}"
    );
    let (st, v) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    let digest = &v["digest"];
    assert_eq!(
        (digest["sent"].as_bool(), digest["platform"].as_str()),
        (Some(true), Some("whatsapp")),
        "{v}"
    );
    let item = outbox_item(&host, digest["outbox_id"].as_i64().unwrap()).await;
    assert_eq!(item["external_id"], OWNER);
    assert_eq!(item["platform"], "whatsapp");
    assert_eq!(digest["conversation_id"], dm);
    let (_, latest) = host
        .owner(Method::GET, "/api/review/digest", None, None)
        .await;
    assert_eq!(
        (latest["sent"].as_bool(), latest["platform"].as_str()),
        (Some(true), Some("whatsapp"))
    );
    host.stop().await;
}

#[tokio::test]
async fn review_scheduler_fires_once_the_daily_time_has_passed() {
    let now = chrono::Utc::now();
    if now.format("%H:%M").to_string() == "00:00" {
        // "A minute ago" would be yesterday; wait for a time that is today.
        tokio::time::sleep(Duration::from_secs(61)).await;
    }
    let at = (chrono::Utc::now() - chrono::Duration::minutes(1))
        .format("%H:%M")
        .to_string();
    let host = TestHost::start(options(
        model("x"),
        vec![
            ("review.enabled", Yaml::Bool(true)),
            ("review.daily_at", Yaml::String(at)),
            ("review.timezone", Yaml::String("UTC".into())),
        ],
    ))
    .await;
    let done = host
        .wait_count("SELECT COUNT(*) FROM runs WHERE kind = 'review' AND status = 'done' AND caller_id = 'system'", 1, 30)
        .await;
    assert_eq!(done, 1, "the daily scan did not fire");
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let md = host
        .data
        .join("reviews")
        .join(format!("{date}-daily"))
        .join("report.md");
    assert!(md.exists(), "{} missing", md.display());
    // Fired once for the day: a run-now is a second run, not a third.
    let (st, v) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        host.count("SELECT COUNT(*) FROM runs WHERE kind = 'review'"),
        2
    );
    host.stop().await;
}

/// What a tool's stderr says in the trace test: a phone number and an
/// e-mail address that must reach neither the judge nor the report.
const TOOL_ERROR_PHONE: &str = "+31 6 1234 5678";
const TOOL_ERROR_EMAIL: &str = "ops.desk@example.com";

/// The judge and the bot of the trace test (issue 31, items 1 and 2). The
/// judge cites the failed `shell` step of the exchange whose trace shows it
/// and whose friction line says the user corrected the reply (so the
/// finding proves it saw both), quoting the step's error as it got it;
/// it cites a step that was never sent for the plant-watering exchange.
fn trace_model() -> Value {
    let cited = json!({
        "message_id": 0, "kind": "tool_failure", "scope": "space", "target_layer": "tool",
        "severity": 2, "summary": "The assistant said the server was fine although its check failed.",
        "evidence": "EVIDENCE", "suggestion": "Report a failed check instead of guessing.",
        "trace_step": 0
    })
    .to_string()
    .replace("\"message_id\":0", "\"message_id\":$1")
    .replace("\"trace_step\":0", "\"trace_step\":$2")
    .replace("EVIDENCE", "$3");
    let fabricated = json!({
        "message_id": 0, "kind": "other", "scope": "space", "target_layer": "agents_md",
        "severity": 1, "summary": "The reminder was not confirmed.",
        "evidence": "water the plants", "suggestion": "Confirm reminders.", "trace_step": 7
    })
    .to_string()
    .replace("\"message_id\":0", "\"message_id\":$1");
    let shell = format!(
        "echo 'ping failed: call {TOOL_ERROR_PHONE} or mail {TOOL_ERROR_EMAIL}' >&2; exit 3"
    );
    json!({"rules": [
        {"purpose": "judge", "match_any": RAW_IDENTIFIERS, "reply": "raw identifiers in the prompt"},
        {"purpose": "judge",
         "match": "\\[msg (\\d+)\\]\\n(?:[^\\n]*\\n)*?step (\\d+): shell, exit 3, error: ([^\\n]*)\\n(?:[^\\n]*\\n)*?friction: correction",
         "reply": format!("{{\"findings\": [{cited}]}}")},
        {"purpose": "judge",
         "match": "\\[msg (\\d+)\\]\\n(?:[^\\n]*\\n)*?user [^\\n]*water the plants tomorrow morning",
         "reply": format!("{{\"findings\": [{fabricated}]}}")},
        {"purpose": "judge", "reply": "{\"findings\": []}"},
        {"purpose": "turn", "match": "check the server", "tool_calls": [{"name": "shell", "arguments": {"command": shell}}]},
        {"purpose": "turn", "match": "^tool_result\\(shell\\)", "reply": "The server is fine."},
        // An unknown tool, called until the turn runs out of steps: a failed turn.
        {"purpose": "turn", "match": "book the table|^tool_result\\(frob\\)", "tool_calls": [{"name": "frob", "arguments": {}}]},
        {"purpose": "turn", "reply": "Sure, happy to help."}
    ]})
}

/// Issue 31, items 1 and 2 on a real host: the judge's batch carries each
/// exchange's trace (redacted) and friction signals; a finding citing a
/// trace step reaches the report with its run and step, and the dashboard
/// and `mrctl` link to that step; a citation of a step never sent is
/// dropped; the phone number and e-mail in a tool's error reach neither the
/// judge nor the report; the planted conversation's friction signals are in
/// the daily report and counted per space in the weekly one.
#[tokio::test]
async fn review_findings_cite_trace_steps_and_friction_signals_reach_the_reports() {
    let host = TestHost::start(options(
        trace_model(),
        vec![("review.batch_size", Yaml::Number(1.into()))],
    ))
    .await;
    let adapter = host.adapter_token("adapter:whatsapp", "whatsapp").await;
    host.create_space("review-test").await;
    let v = ingress(&host, &adapter, GROUP, BRAM, "@mercury hello", "t0", true).await;
    assert_eq!(v["status"], "unlinked", "{v}");
    link(&host, GROUP, "review-test").await;
    let say = |text: &'static str, mid: &'static str| {
        let (host, adapter) = (&host, &adapter);
        async move { ask(host, adapter, GROUP, BRAM, text, mid, true).await }
    };
    // The planted conversation, one signal each (on the exchange it is evidence against).
    let checked = say("@mercury check the server status", "t1").await;
    say("@mercury no, that's wrong, the server is down", "t2").await; // correction of t1
    let plants = say(
        "@mercury remind me to water the plants tomorrow morning",
        "t3",
    )
    .await;
    let again = say(
        "@mercury please remind me tomorrow morning to water my plants",
        "t4",
    )
    .await; // rephrased: t3
    say("@mercury you didn't answer my question", "t5").await; // not_answered: t4
    let booked = say("@mercury book the table for eight", "t6").await; // failed, then silence

    let (run, status): (String, String) = host.read(|c| {
        c.query_row(
            "SELECT run_id, status FROM messages WHERE id = ?1",
            &[&booked],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    });
    assert_eq!(status, "failed", "the planted failed turn failed ({run})");
    let run: String = host.read(|c| {
        c.query_row(
            "SELECT run_id FROM messages WHERE id = ?1",
            &[&checked],
            |r| r.get(0),
        )
    });
    let step: i64 = host.read(|c| {
        c.query_row(
            "SELECT seq FROM run_steps WHERE run_id = ?1 AND name = 'shell' AND exit_code = 3",
            &[&run],
            |r| r.get(0),
        )
    });

    let summary = run_now_with_mrctl(&host).await;
    assert_eq!(summary["status"], "done", "{summary:#}");
    let dir = report_dir(&host, &summary);
    let md_path = dir.join("report.md");
    let md = std::fs::read_to_string(&md_path).unwrap();
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();

    // The finding that cites the failed step, with the run id the host added.
    let cited = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["message_id"] == checked)
        .unwrap_or_else(|| panic!("no finding on the checked exchange: {json:#}"));
    assert_eq!(cited["kind"], "tool_failure");
    assert_eq!(
        cited["trace"],
        json!({"run_id": run, "step": step, "tool": "shell", "exit_code": 3})
    );
    assert_eq!(cited["friction"], json!(["correction"]));
    for want in [
        format!("- trace: run {run} step {step} (tool shell, exit 3)"),
        "- friction: correction".to_owned(),
        // The judge quoted the error as it got it: redacted.
        "- evidence: exit code 3 stderr: ping failed: call [PHONE_1] or mail [EMAIL_1]".to_owned(),
    ] {
        assert!(md.contains(&want), "{want:?} missing in\n{md}");
    }
    // The fabricated citation is dropped; its finding stays, without a trace.
    let fabricated = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["message_id"] == plants)
        .unwrap_or_else(|| panic!("no finding on the plants exchange: {json:#}"));
    assert!(fabricated.get("trace").is_none(), "{fabricated}");
    assert_eq!(json["findings"].as_array().unwrap().len(), 2, "{json:#}");
    assert_eq!(json["footer"]["dropped_citations"], 1);
    assert!(
        md.contains("- trace citations dropped (step not in the batch; finding kept): 1"),
        "{md}"
    );
    assert_eq!(md.matches("- trace: run").count(), 1, "{md}");

    // The tool's phone number and e-mail reached neither file.
    for raw in ["1234 5678", "12345678", "ops.desk", "example.com"] {
        assert!(!md.contains(raw), "{raw} in report.md:\n{md}");
        assert!(!json.to_string().contains(raw), "{raw} in report.json");
    }
    // The cited run id is the host's own hex id, which may hold a digit run
    // the checkpoint's grep takes for a phone (the gate masks exactly the
    // cited ids): left out of the text grepped here.
    let scratch = tempfile::tempdir().unwrap();
    for (name, text) in [("report.md", md.clone()), ("report.json", json.to_string())] {
        let path = scratch.path().join(name);
        std::fs::write(&path, text.replace(&run, "[run]")).unwrap();
        assert!(
            !grep_identifiers(&path),
            "an identifier survived in {name}:\n{text}"
        );
    }

    // The planted conversation's friction signals, each on its exchange.
    for want in [
        format!("- [msg {checked}] in review-test: correction"),
        format!("- [msg {plants}] in review-test: rephrased"),
        format!("- [msg {again}] in review-test: not_answered"),
        format!("- [msg {booked}] in review-test: failed_turn, abandoned"),
        "- review-test: 1 correction, 1 rephrased, 1 not_answered, 1 failed_turn, 1 abandoned"
            .to_owned(),
    ] {
        assert!(md.contains(&want), "{want:?} missing in\n{md}");
    }
    assert_eq!(
        json["friction"]["counts"]["review-test"],
        json!({"correction": 1, "rephrased": 1, "not_answered": 1, "failed_turn": 1, "abandoned": 1})
    );

    // `mrctl review report` names the step and the command that shows it;
    // `mrctl runs show` shows that step.
    let date = summary["date"].as_str().unwrap().to_owned();
    let mut cmd = host.mrctl(&host.owner_token, None);
    cmd.args(["review", "report", &date]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains(&format!(
            "trace: run {run} step {step} (tool shell, exit 3): mrctl runs show {run}"
        )),
        "{shown}"
    );
    let mut cmd = host.mrctl(&host.owner_token, Some("review-test"));
    cmd.args(["runs", "show", &run]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains(&format!("#{step} tool shell")), "{shown}");

    // The dashboard's report links the finding to the step's anchor.
    let http = crate::ui::no_redirects();
    let cookie = crate::ui::sign_in(&host, &http, &host.owner_token).await;
    let (st, page) =
        crate::ui::get(&host, &http, &format!("/ui/review/reports/{date}"), &cookie).await;
    assert_eq!(st, 200, "{page}");
    assert!(
        page.contains(&format!("/ui/runs/{run}#step-{step}")),
        "{page}"
    );
    let (st, page) = crate::ui::get(&host, &http, &format!("/ui/runs/{run}"), &cookie).await;
    assert_eq!(st, 200, "{page}");
    assert!(page.contains(&format!("id=\"step-{step}\"")), "{page}");

    // The weekly report counts the week's signals per space.
    let (st, weekly) = host
        .owner(Method::POST, "/api/review/weekly", None, None)
        .await;
    assert_eq!(st, 200, "{weekly}");
    let weekly_md = std::fs::read_to_string(weekly["report_path"].as_str().unwrap()).unwrap();
    assert!(
        weekly_md.contains(
            "- review-test: 1 correction, 1 rephrased, 1 not_answered, 1 failed_turn, 1 abandoned"
        ),
        "{weekly_md}"
    );
    host.stop().await;
}

/// `mercury bench review-quality` on the planted set: every planted failing
/// tool step is cited by its finding, every planted friction signal is
/// listed on its exchange with none that was not planted, and both planted
/// rehearsals (a fix that works, a finding that does not reproduce) get the
/// verdict planted (issue 31). Not a timing: the figures are counts.
#[tokio::test]
async fn review_quality_bench_scores_trace_citations_friction_and_rehearsals() {
    let out = tokio::task::spawn_blocking(|| {
        std::process::Command::new(env!("CARGO_BIN_EXE_mercury"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .args(["bench", "review-quality"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for want in [
        "trace citations 1.000 (2 of 2 planted failing steps cited by their finding)",
        "friction recall 1.000 (3 of 3 planted signals on their exchange; 0 not planted)",
        "recall    0.917 (11 of 12 planted flagged)",
        "rehearsal agreement 1.000 (2 of 2 planted verdicts: 3 replays an arm in shadows)",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}
