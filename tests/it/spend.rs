//! Spend caps (issue 26) on a real host: a fake OpenAI-compatible provider
//! on loopback that counts the calls it gets and reports usage, the host's
//! own ledger read back through the API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::post;
use axum::{Json, Router};
use chrono::TimeZone;
use reqwest::Method;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use tokio::sync::Semaphore;

use crate::common::{prepare, HostOptions, TestHost};

/// Every answer: 50 output tokens. At the test price (0.01 a token out,
/// nothing in) a call costs 0.50 and, with `turn.max_tokens: 100`, its
/// worst case is 1.00.
const ANSWER: &str = "hello from the fake model";

struct Provider {
    url: String,
    calls: Arc<AtomicUsize>,
    /// Closed when the provider answers at once; otherwise each answer takes
    /// one permit, so a test decides when a call returns.
    gate: Arc<Semaphore>,
}

impl Provider {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn provider(held: bool) -> Provider {
    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(if held { 0 } else { 1 << 20 }));
    let app = Router::new().route(
        "/v1/chat/completions",
        post({
            let (calls, gate) = (calls.clone(), gate.clone());
            move || {
                let (calls, gate) = (calls.clone(), gate.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if let Ok(p) = gate.acquire().await {
                        p.forget();
                    }
                    Json(json!({
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 400, "completion_tokens": 50, "total_tokens": 450}
                    }))
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Provider {
        url: format!("http://127.0.0.1:{}/v1", addr.port()),
        calls,
        gate,
    }
}

fn num(v: f64) -> Yaml {
    Yaml::Number(v.into())
}

fn priced(p: &Provider, extra: Vec<(&'static str, Yaml)>) -> HostOptions {
    let prices: Yaml =
        serde_yaml_ng::from_str(r#"{"openai:gpt-fake": {input: 0.0, output: 10000.0}}"#).unwrap();
    let mut config = vec![
        ("model", Yaml::String("openai:gpt-fake".into())),
        ("providers.openai_base_url", Yaml::String(p.url.clone())),
        ("providers.max_retries", Yaml::Number(0.into())),
        ("prices", prices),
        ("turn.max_tokens", Yaml::Number(100.into())),
    ];
    config.extend(extra);
    HostOptions {
        config,
        ..Default::default()
    }
}

async fn set_budget(host: &TestHost, space: &str, body: Value) -> (u16, Value) {
    host.owner(Method::PUT, "/api/budget", Some(space), Some(body))
        .await
}

async fn cost(host: &TestHost) -> Value {
    let (st, v) = host
        .owner(Method::GET, "/api/cost?since=3650d", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    v
}

/// The owner's platform sender: `review.owner`, whose DM gets the notices.
const OWNER: &str = "test:first";

/// The owner's DM conversation, in a space of its own (`ops`), with one
/// message of the owner's in it (the digest's channel finds the DM by it),
/// answered: one provider call, waited for.
async fn owner_dm(host: &TestHost, p: &Provider) {
    host.create_space("ops").await;
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/senders/allow",
            None,
            Some(json!({"sender": OWNER})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let adapter = host.token("adapter:owner-dm", "adapter").await;
    let (st, v) = host
        .ingest(&adapter, "owner-dm", OWNER, "hello", "dm-1", false)
        .await;
    assert!(st == 200 || st == 202, "{st} {v}");
    let (st, v) = host
        .owner(
            Method::GET,
            "/api/conversations?all=true",
            Some("ops"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let id = v["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["external_id"] == "owner-dm")
        .unwrap_or_else(|| panic!("no DM conversation: {v}"))["id"]
        .as_i64()
        .unwrap();
    let (st, v) = host
        .owner(
            Method::POST,
            &format!("/api/conversations/{id}/link"),
            Some("ops"),
            Some(json!({"space_id": "ops"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = host
        .ingest(&adapter, "owner-dm", OWNER, "are you there?", "dm-2", false)
        .await;
    assert!(st == 200 || st == 202, "{st} {v}");
    for _ in 0..600 {
        if p.calls() == 1 {
            let (_, out) = host.owner(Method::GET, "/api/outbox", None, None).await;
            if out["items"].as_array().is_some_and(|i| !i.is_empty()) {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the owner's DM was not answered");
}

/// The outbox texts queued for the owner's DM, once at least `want` are
/// there (the notice is queued by a task of its own).
async fn owner_notices(host: &TestHost, want: usize) -> Vec<String> {
    for _ in 0..600 {
        let (st, v) = host.owner(Method::GET, "/api/outbox", None, None).await;
        assert_eq!(st, 200, "{v}");
        let texts: Vec<String> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["external_id"] == "owner-dm")
            .filter(|i| {
                i["text"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("Spend cap"))
            })
            .filter_map(|i| i["text"].as_str().map(str::to_owned))
            .collect();
        if texts.len() >= want {
            return texts;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, v) = host.owner(Method::GET, "/api/outbox", None, None).await;
    panic!("fewer than {want} owner notices: {v}");
}

/// The next midnight after now in `tz`, as ms.
fn next_midnight(tz: chrono_tz::Tz, now_ms: i64) -> i64 {
    let local = tz.timestamp_millis_opt(now_ms).unwrap();
    let tomorrow = local.date_naive().succ_opt().unwrap();
    tz.from_local_datetime(&tomorrow.and_hms_opt(0, 0, 0).unwrap())
        .earliest()
        .unwrap()
        .timestamp_millis()
}

async fn advance(host: &TestHost, ms: i64) -> i64 {
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/test/spend-clock",
            None,
            Some(json!({"advance_ms": ms})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v["now_ms"].as_i64().unwrap()
}

#[tokio::test]
async fn spend_over_its_daily_cap_a_space_calls_no_model_answers_once_and_rolls_over_at_local_midnight(
) {
    let p = provider(false).await;
    // A zone far from UTC: its midnight is not the UTC one.
    let host = TestHost::start(priced(
        &p,
        vec![
            ("timezone", Yaml::String("Pacific/Auckland".into())),
            ("ingress.auto_space", Yaml::Bool(false)),
            ("review.owner", Yaml::String(OWNER.into())),
        ],
    ))
    .await;
    host.create_space("family").await;
    owner_dm(&host, &p).await;
    // The owner's DM was answered once: every count below is past it.
    let base = p.calls();
    let (st, v) = set_budget(&host, "family", json!({"daily": 1.2, "monthly": 20})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["daily"].as_f64(), v["monthly"].as_f64()),
        (Some(1.2), Some(20.0))
    );

    // 1.00 reserved of 1.20: called, settled at 0.50.
    let first = host.chat("family", "hi").await;
    assert_eq!(first["reply"], ANSWER, "{first}");
    assert_eq!(p.calls(), base + 1);
    // 0.50 spent + 1.00 worst case > 1.20: not called, the configured sentence.
    let capped = host.chat("family", "and again").await;
    assert_eq!(p.calls(), base + 1, "a capped turn reached the provider");
    assert_eq!(
        capped["reply"],
        mercury::config::DEFAULT_CAPPED_REPLY,
        "{capped}"
    );
    let (st, run) = host
        .owner(
            Method::GET,
            &format!("/api/runs/{}", capped["run_id"].as_str().unwrap()),
            Some("family"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{run}");
    let error = run["run"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("the space's daily cap"), "{error}");
    // Once per period per conversation: the next capped turn says nothing.
    let silent = host.chat("family", "hello?").await;
    assert!(silent["reply"].is_null(), "{silent}");
    assert_eq!(p.calls(), base + 1);
    // The owner heard of it once, in their DM (the digest's channel).
    let notices = owner_notices(&host, 1).await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].starts_with(
            "Spend cap reached (space family): the space's daily cap of 1.20 USD is reached"
        ),
        "{}",
        notices[0]
    );

    // Just before local midnight the day has not turned.
    let now = advance(&host, 0).await;
    let midnight = next_midnight("Pacific/Auckland".parse().unwrap(), now);
    advance(&host, midnight - now - 60_000).await;
    host.chat("family", "still today").await;
    assert_eq!(
        p.calls(),
        base + 1,
        "the period rolled over before local midnight"
    );
    // Past it, the space may spend again.
    advance(&host, 120_000).await;
    let next_day = host.chat("family", "a new day").await;
    assert_eq!(next_day["reply"], ANSWER, "{next_day}");
    assert_eq!(p.calls(), base + 2);

    // The cost is the settled one, by space, purpose and model.
    let c = cost(&host).await;
    // Two turns in family and the owner's DM answered in ops.
    assert_eq!(c["total"].as_f64(), Some(1.5), "{c}");
    assert_eq!(c["by_space"][0]["key"], "family", "{c}");
    assert_eq!(c["by_purpose"][0]["key"], "turn", "{c}");
    assert_eq!(c["by_model"][0]["key"], "openai:gpt-fake", "{c}");
    // /metrics: by purpose and model, never by space.
    let (st, _) = host.owner(Method::GET, "/metrics", None, None).await;
    assert_eq!(st, 200);
    let metrics = host
        .http
        .get(format!("{}/metrics", host.url))
        .bearer_auth(&host.owner_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("mercury_cost_total{"))
        .unwrap_or_else(|| panic!("no mercury_cost_total in\n{metrics}"));
    assert!(
        line.contains("purpose=\"turn\"") && line.contains("model=\"openai:gpt-fake\""),
        "{line}"
    );
    assert!(!line.contains("family"), "a space label: {line}");
    host.stop().await;
}

#[tokio::test]
async fn spend_a_reservation_stops_two_concurrent_turns_that_together_cross_the_cap() {
    let p = provider(true).await;
    // 1.60 a day for the deployment: one call (worst 1.00) fits, two at
    // once (2.00) do not; one after the other (0.50 + 1.00) would.
    let host = TestHost::start(priced(&p, vec![("budgets.global.daily", num(1.6))])).await;
    for s in ["a", "b", "c"] {
        host.create_space(s).await;
    }
    let first = tokio::spawn({
        let (url, token) = (host.url.clone(), host.owner_token.clone());
        async move {
            reqwest::Client::new()
                .post(format!("{url}/api/chat"))
                .bearer_auth(token)
                .header("x-mercury-space", "a")
                .json(&json!({"text": "first"}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    });
    // The first call is at the provider, its reservation held.
    while p.calls() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let second = host.chat("b", "second").await;
    assert_eq!(
        second["reply"],
        mercury::config::DEFAULT_CAPPED_REPLY,
        "{second}"
    );
    assert_eq!(p.calls(), 1, "the second turn reached the provider");
    p.gate.add_permits(1 << 20);
    let first = first.await.unwrap();
    assert_eq!(first["reply"], ANSWER, "{first}");
    // Settled at 0.50, the first leaves room for one more.
    let third = host.chat("c", "third").await;
    assert_eq!(third["reply"], ANSWER, "{third}");
    assert_eq!(p.calls(), 2);
    let (st, b) = host.owner(Method::GET, "/api/budget", None, None).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["caps"][0]["used"].as_f64(), Some(1.0), "{b}");
    host.stop().await;
}

#[tokio::test]
async fn spend_an_unpriced_model_under_a_cap_is_refused_with_a_sentence() {
    let p = provider(false).await;
    let host = TestHost::start(HostOptions {
        config: vec![
            ("model", Yaml::String("openai:gpt-unpriced".into())),
            ("providers.openai_base_url", Yaml::String(p.url.clone())),
            ("budgets.space.daily", num(5.0)),
        ],
        ..Default::default()
    })
    .await;
    host.create_space("family").await;
    let v = host.chat("family", "hi").await;
    assert_eq!(p.calls(), 0, "an unpriced model was called under a cap");
    assert_eq!(v["status"], "failed", "{v}");
    let (_, run) = host
        .owner(
            Method::GET,
            &format!("/api/runs/{}", v["run_id"].as_str().unwrap()),
            Some("family"),
            None,
        )
        .await;
    let error = run["run"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("openai:gpt-unpriced has no price and a spend cap applies"),
        "{error}"
    );
    host.stop().await;
}

#[tokio::test]
async fn spend_budget_routes_refuse_bad_input_and_non_admins() {
    let p = provider(false).await;
    let host = TestHost::start(priced(&p, vec![])).await;
    host.create_space("family").await;
    for bad in [
        json!({"daily": -1}),
        json!({"monthly": 1e12}),
        json!({"timezone": "Mars/Olympus"}),
        json!({}),
        json!({"daily": "2"}),
        json!({"weekly": 3}),
    ] {
        let (st, v) = set_budget(&host, "family", bad.clone()).await;
        assert_eq!(st, 400, "{bad}: {v}");
    }
    let (st, _) = host
        .owner(Method::PUT, "/api/budget", None, Some(json!({"daily": 1})))
        .await;
    assert_eq!(st, 400, "no space named");
    let (st, v) = host
        .owner(Method::GET, "/api/cost?since=yesterday", None, None)
        .await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = host
        .owner(Method::GET, "/api/cost?space=..%2Fx", None, None)
        .await;
    assert_eq!(st, 400, "{v}");
    let member = host.token("alice", "user").await;
    host.grant("family", "alice", "admin").await;
    let (st, _) = host
        .call(
            Method::PUT,
            "/api/budget",
            Some(&member),
            Some("family"),
            Some(json!({"daily": 100})),
        )
        .await;
    assert_eq!(st, 403, "a space admin raised its own cap");
    // `default` puts a cap back to the config's.
    set_budget(&host, "family", json!({"daily": 2})).await;
    let (st, v) = set_budget(&host, "family", json!({"daily": null})).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["daily"].is_null(), "{v}");
    host.stop().await;
}

#[tokio::test]
async fn spend_a_shadow_spends_only_its_own_budget() {
    let p = provider(false).await;
    // 1.60 a day: the live host's one turn (0.50) and one more fit.
    let host = TestHost::start(priced(&p, vec![("budgets.global.daily", num(1.6))])).await;
    host.create_space("family").await;
    assert_eq!(host.chat("family", "live one").await["reply"], ANSWER);
    let (dir, data) = host.stop_keeping().await;

    // The same state served as a shadow (as a snapshot would carry it).
    mercury::config::set_keys(
        &data.join("mercury.yaml"),
        &[
            ("shadow", Yaml::Bool(true)),
            (
                "shadow_root",
                Yaml::String(
                    std::fs::canonicalize(std::env::temp_dir())
                        .unwrap()
                        .display()
                        .to_string(),
                ),
            ),
        ],
    )
    .unwrap();
    let shadow = TestHost::start_on(dir, data).await;
    // The live's 0.50 is not the shadow's: two turns fit (0.50 + 1.00),
    // the third does not (1.00 + 1.00).
    assert_eq!(shadow.chat("family", "shadow one").await["reply"], ANSWER);
    assert_eq!(shadow.chat("family", "shadow two").await["reply"], ANSWER);
    let third = shadow.chat("family", "shadow three").await;
    assert_eq!(third["status"], "failed", "{third}");
    assert_eq!(p.calls(), 3);
    assert_eq!(cost(&shadow).await["total"].as_f64(), Some(1.0));
    let (dir, data) = shadow.stop_keeping().await;

    // Live again: the shadow's 1.00 is not on the live budget.
    mercury::config::set_keys(&data.join("mercury.yaml"), &[("shadow", Yaml::Bool(false))])
        .unwrap();
    let live = TestHost::start_on(dir, data).await;
    assert_eq!(live.chat("family", "live two").await["reply"], ANSWER);
    assert_eq!(p.calls(), 4);
    assert_eq!(cost(&live).await["total"].as_f64(), Some(1.0));
    live.stop().await;
}

#[tokio::test]
async fn spend_a_review_scan_stops_at_its_cap_and_says_so_in_its_report() {
    // Scripted judge answers of 16 characters (4 output tokens) at 1.00 a
    // token out; `turn.max_tokens: 10` makes each call's worst case 10.00.
    let opts = HostOptions {
        model: json!({"rules": [
            {"purpose": "judge", "reply": "{\"findings\": []}"},
            {"reply": "ok"}
        ]}),
        config: vec![
            ("turn.max_tokens", Yaml::Number(10.into())),
            ("review.batch_size", Yaml::Number(1.into())),
            ("review.calls_per_minute", Yaml::Number(6000.into())),
            ("budgets.purposes.judge.daily", num(25.0)),
        ],
        ..Default::default()
    };
    let (dir, data, _) = prepare(&opts).await;
    let spec = mercury::host::settings_of(&data).unwrap().model;
    let mut prices = serde_yaml_ng::Mapping::new();
    prices.insert(
        Yaml::String(spec.clone()),
        serde_yaml_ng::from_str("{input: 0.0, output: 1000000.0}").unwrap(),
    );
    mercury::config::set_keys(
        &data.join("mercury.yaml"),
        &[("prices", Yaml::Mapping(prices))],
    )
    .unwrap();
    let host = TestHost::start_on(dir, data).await;
    host.create_space("chatty").await;
    for i in 0..8 {
        host.chat("chatty", &format!("message {i}")).await;
    }
    let (st, summary) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    let path = summary["report_path"]
        .as_str()
        .unwrap_or_else(|| panic!("no report: {summary:#}"));
    let md = std::fs::read_to_string(path).unwrap();
    // 0, 4, 8, 12 spent: four calls fit under 25 with 10 reserved; the fifth not.
    assert!(md.contains("- judge calls (spawns): 4\n"), "{md}");
    assert!(
        md.contains("- stopped: the judge calls' daily cap of 25.00 USD is reached"),
        "{md}"
    );
    assert!(md.contains("stopped at a spend cap"), "{md}");
    assert!(md.contains("- cost: 16.00 USD"), "{md}");
    host.stop().await;
}

/// A notice written when a cap stopped a call, whose host stopped before
/// handing it to the owner's DM, is sent at the host's next start, once;
/// another host's pending notice is left to that host.
#[tokio::test]
async fn spend_an_owner_notice_left_unsent_by_a_stopped_host_is_sent_at_its_next_start() {
    use mercury::storage::spend as ledger;
    let p = provider(false).await;
    let host = TestHost::start(priced(
        &p,
        vec![
            ("ingress.auto_space", Yaml::Bool(false)),
            ("review.owner", Yaml::String(OWNER.into())),
        ],
    ))
    .await;
    owner_dm(&host, &p).await;
    let (dir, data) = host.stop_keeping().await;
    let paths = mercury::workspace::DataPaths::new(&data);
    let settings = mercury::host::load_settings(&paths).unwrap();
    let store = mercury::storage::Store::open_at(
        &mercury::host::store_location(&settings, &paths).unwrap(),
    )
    .unwrap();
    let ours = mercury::sandbox::instance_id_for(&data).unwrap();
    let now = mercury::clock::now_ms();
    for (instance, key, text) in [
        (
            ours.clone(),
            "cap:global:daily",
            "Spend cap reached: left by the stopped host.",
        ),
        (
            "another-host".to_owned(),
            "cap:global:monthly",
            "Spend cap reached: another host's.",
        ),
    ] {
        store
            .write(move |tx| ledger::note_notice_once(tx, key, now - 1_000, now, &instance, text))
            .await
            .unwrap();
    }
    drop(store);
    let host = TestHost::start_on(dir, data).await;
    let notices = owner_notices(&host, 1).await;
    assert_eq!(
        notices,
        vec!["Spend cap reached: left by the stopped host.".to_owned()]
    );
    let pending =
        |instance: String| host.read(move |conn| ledger::pending_notices(conn, &instance));
    for _ in 0..100 {
        if pending(ours.clone()).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(pending(ours).is_empty(), "the notice is still pending");
    assert_eq!(pending("another-host".to_owned()).len(), 1);
    host.stop().await;
}
