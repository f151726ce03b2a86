//! Snapshots (insta) of what the host hands to people and tools: one daily
//! review run's `report.md` and `report.json`, and the JSON bodies of a few
//! API answers, all from a real host with a scripted model.
//!
//! What differs from run to run (ids, tokens, timestamps, durations, token
//! counts, costs) is replaced by a placeholder before the snapshot is taken,
//! so a changed snapshot means a changed shape or wording, never a changed
//! clock. Snapshots live in `tests/it/snapshots/`; a change fails the test
//! (under CI=true insta writes nothing). To accept one: run the test with
//! `INSTA_UPDATE=always` and read the diff (or `cargo insta review`).

use reqwest::Method;
use serde_json::{json, Map, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

/// The judge flags the exchange that asks for the capital of France; every
/// other batch is fine. Turns answer that one wrongly.
fn model() -> Value {
    let finding = json!({
        "message_id": 0, "kind": "wrong_answer", "scope": "space", "target_layer": "memory",
        "severity": 3, "summary": "The assistant named the wrong capital.",
        "evidence": "The capital of France is Lyon.",
        "suggestion": "Answer Paris and keep basic facts in memory."
    })
    .to_string()
    // The scripted provider fills $1 with the id captured from `[msg N]`.
    .replace("\"message_id\":0", "\"message_id\":$1");
    json!({"rules": [
        {"purpose": "judge",
         "match": "\\[msg (\\d+)\\]\\n(?:context: [^\\n]*\\n)*user [^\\n]*capital of France",
         "reply": format!("{{\"findings\": [{finding}]}}")},
        {"purpose": "judge", "reply": "{\"findings\": []}"},
        {"purpose": "turn", "match": "capital of France", "reply": "The capital of France is Lyon."},
        {"purpose": "turn", "reply": "Sure, happy to help."}
    ]})
}

async fn host() -> TestHost {
    TestHost::start(HostOptions {
        model: model(),
        config: vec![
            ("ingress.auto_space", Yaml::Bool(false)),
            ("review.batch_size", Yaml::Number(2.into())),
            ("review.calls_per_minute", Yaml::Number(600.into())),
        ],
        ..Default::default()
    })
    .await
}

/// Replaces every run-dependent value in `v` by a placeholder: host-made
/// ids and tokens by `[id]`/`[token]`, times (`*_at`, RFC 3339 text) and
/// dates by `[time]`/`[date]`, durations (`*_ms`) by `[ms]`, token counts
/// and costs by `[n]`/`[cost]`. Text goes through [`normalise_text`].
fn normalise(v: &mut Value) {
    match v {
        Value::Object(map) => normalise_object(map),
        Value::Array(items) => items.iter_mut().for_each(normalise),
        Value::String(s) => *s = normalise_text(s),
        _ => {}
    }
}

fn normalise_object(map: &mut Map<String, Value>) {
    for (key, value) in map.iter_mut() {
        let placeholder = match key.as_str() {
            "token" | "owner_token" => Some("[token]"),
            // Row ids and run ids the host made depend on what ran before;
            // ids a caller chose (a space, a caller) are kept.
            k if (k == "id" || k.ends_with("_id"))
                && (value.is_number() || is_generated_id(value)) =>
            {
                Some("[id]")
            }
            // Times come as RFC 3339 text or as epoch milliseconds.
            k if k.ends_with("_at") && !value.is_null() => Some("[time]"),
            k if k.ends_with("_ms") && value.is_number() => Some("[ms]"),
            "tokens_in" | "tokens_out" | "input_tokens" | "output_tokens" if value.is_number() => {
                Some("[n]")
            }
            "cost" | "cost_usd" if value.is_number() => Some("[cost]"),
            _ => None,
        };
        match placeholder {
            Some(p) => *value = Value::String(p.into()),
            None => normalise(value),
        }
    }
}

/// A string id the host generated (a UUID), as opposed to a name a caller
/// chose, like a space id.
fn is_generated_id(v: &Value) -> bool {
    v.as_str().is_some_and(|s| uuid::Uuid::parse_str(s).is_ok())
}

/// Times, dates, durations, counts of tokens, costs, `[msg N]` references
/// and UUIDs inside free text.
fn normalise_text(text: &str) -> String {
    let rules: &[(&str, &str)] = &[
        (
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?",
            "[time]",
        ),
        (r"\d{4}-\d{2}-\d{2}", "[date]"),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[uuid]",
        ),
        (r"\[msg \d+\]", "[msg N]"),
        (r"(?m)^- wall clock: .*$", "- wall clock: [duration]"),
        (r"(?m)^- tokens: .*$", "- tokens: [n] in, [n] out"),
        (r"(?m)^- cost: .*$", "- cost: [cost]"),
    ];
    let mut out = text.to_string();
    for (pattern, placeholder) in rules {
        out = regex::Regex::new(pattern)
            .unwrap()
            .replace_all(&out, *placeholder)
            .into_owned();
    }
    out
}

/// `v` with the host's data dir (a fresh temp dir each run) written `[data]`.
fn in_data_dir(v: Value, host: &TestHost) -> Value {
    let data = host.data.display().to_string();
    serde_json::from_str(&v.to_string().replace(&data, "[data]")).unwrap()
}

fn normalised(mut v: Value) -> Value {
    normalise(&mut v);
    v
}

#[test]
fn normaliser_replaces_what_changes_between_runs() {
    let v = normalised(json!({
        "id": 42, "space": {"id": "snap"}, "run_id": "0190f3c2-7a1b-7c3d-8e4f-001122334455",
        "created_at": "2026-12-01T11:22:33.123Z", "updated_at": 1_796_124_334_137_i64, "date": "2026-12-01",
        "wall_clock_ms": 17, "tokens_in": 1234, "cost": 0.5, "token": "secret",
        "text": "see [msg 17] at 2026-12-01 11:22:33",
        "link_id": 1, "caller_id": "owner", "count": 3
    }));
    assert_eq!(
        v,
        json!({
            "id": "[id]", "space": {"id": "snap"}, "run_id": "[id]",
            "created_at": "[time]", "updated_at": "[time]", "date": "[date]",
            "wall_clock_ms": "[ms]", "tokens_in": "[n]", "cost": "[cost]", "token": "[token]",
            "text": "see [msg N] at [time]",
            "link_id": "[id]", "caller_id": "owner", "count": 3
        })
    );
}

#[tokio::test]
async fn snapshots_daily_review_report() {
    let host = host().await;
    host.create_space("snap").await;
    for text in [
        "hello, can you help me plan the week?",
        "what is the capital of France?",
        "thanks, that is all",
    ] {
        host.chat("snap", text).await;
    }
    let (st, summary) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    assert_eq!(summary["status"], "done", "{summary:#}");
    assert_eq!(summary["findings"], 1, "{summary:#}");

    let dir = host
        .data
        .join("reviews")
        .join(format!("{}-daily", summary["date"].as_str().unwrap()));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    insta::assert_snapshot!("review_report_md", normalise_text(&md));
    insta::assert_json_snapshot!("review_report_json", normalised(report));
    insta::assert_json_snapshot!(
        "review_run_summary",
        normalised(in_data_dir(summary, &host))
    );
    host.stop().await;
}

#[tokio::test]
async fn snapshots_api_bodies() {
    let host = host().await;
    host.create_space("snap").await;
    host.create_space("snap-peer").await;
    host.link("snap", "snap-peer", "read").await;

    let (st, whoami) = host
        .owner(Method::GET, "/api/whoami", Some("snap"), None)
        .await;
    assert_eq!(st, 200, "{whoami}");
    insta::assert_json_snapshot!("api_whoami", normalised(whoami));

    let (st, current) = host
        .owner(Method::GET, "/api/spaces/current", Some("snap"), None)
        .await;
    assert_eq!(st, 200, "{current}");
    insta::assert_json_snapshot!("api_spaces_current", normalised(current));

    let (st, links) = host
        .owner(Method::GET, "/api/links", Some("snap"), None)
        .await;
    assert_eq!(st, 200, "{links}");
    insta::assert_json_snapshot!("api_links", normalised(links));

    let (st, permissions) = host
        .owner(Method::GET, "/api/permissions", Some("snap"), None)
        .await;
    assert_eq!(st, 200, "{permissions}");
    insta::assert_json_snapshot!("api_permissions", normalised(permissions));

    // A 4xx: a link at a level that does not exist.
    let (st, error) = host
        .owner(
            Method::POST,
            "/api/links",
            None,
            Some(json!({"holder": "snap", "target": "snap-peer", "level": "everything"})),
        )
        .await;
    assert_eq!(st, 400, "{error}");
    insta::assert_json_snapshot!("api_error_bad_link_level", normalised(error));

    // A 4xx without a token.
    let (st, error) = host
        .call(Method::GET, "/api/whoami", None, Some("snap"), None)
        .await;
    assert_eq!(st, 401, "{error}");
    insta::assert_json_snapshot!("api_error_no_token", normalised(error));
    host.stop().await;
}
