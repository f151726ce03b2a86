//! Many hosts, one deployment (issue 28): real `mercury serve` processes on
//! loopback ports sharing one PostgreSQL database and one workspaces
//! directory. Traffic through every host's ingress, a host killed with
//! SIGKILL mid-traffic, a host paused past its lease: every message is
//! answered exactly once, no space runs two turns at once, a dead host's
//! spaces move within the lease time, a paused host commits nothing, and a
//! task fires once per deployment.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mercury::clock::now_ms;
use mercury::storage::inspect;
use reqwest::Method;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

const LEASE_SECS: i64 = 3;

fn cluster_opts(rules: serde_json::Value) -> HostOptions {
    HostOptions {
        model: rules,
        config: vec![
            ("ingress.dm_policy", Yaml::String("open".into())),
            ("cluster.lease_secs", Yaml::Number(LEASE_SECS.into())),
            ("cluster.poll_ms", Yaml::Number(100.into())),
            // Every message of this test is its own caller's: none is slowed.
            ("ingress.per_caller_per_minute", Yaml::Number(10_000.into())),
        ],
        ..HostOptions::default()
    }
}

fn rows(h: &TestHost, sql: &str) -> Vec<Vec<String>> {
    let sql = sql.to_owned();
    h.read(move |c| inspect::query_text(c, &sql))
}

fn host_id(h: &TestHost, name: &str) -> String {
    rows(
        h,
        &format!(
            "SELECT host_id FROM cluster_hosts WHERE name = '{name}' ORDER BY started_at DESC"
        ),
    )
    .first()
    .map(|r| r[0].clone())
    .unwrap_or_else(|| panic!("host {name} joined"))
}

/// Posts one platform message through `h`; it must be taken in.
async fn post(h: &TestHost, token: &str, space: usize, n: usize) {
    let (st, v) = h
        .ingest(
            token,
            &format!("c{space}"),
            &format!("test:{space}"),
            &format!("message {n} for {space}"),
            &format!("m{space}-{n}"),
            false,
        )
        .await;
    assert!(st == 202 || st == 200, "ingress {st}: {v}");
}

/// No space ran two turns at once: each of its runs started after the one
/// before it ended (a killed host's runs end when another host claims the
/// space), and every run has ended.
fn assert_no_overlap(h: &TestHost) {
    let runs = rows(
        h,
        "SELECT space_id, started_at, COALESCE(finished_at, -1), status, COALESCE(host_id, ''), COALESCE(trigger_message_id, 0), id
         FROM runs WHERE kind = 'live' ORDER BY space_id, started_at, id",
    );
    assert!(!runs.is_empty());
    let mut last: BTreeMap<String, (i64, String)> = BTreeMap::new();
    for r in &runs {
        let (started, finished): (i64, i64) = (r[1].parse().unwrap(), r[2].parse().unwrap());
        assert!(finished >= 0, "a run was left open: {r:?}");
        if let Some((prev_end, prev)) = last.get(&r[0]) {
            assert!(
                started >= *prev_end,
                "space {} ran two turns at once: {prev} ended at {prev_end}, {r:?} started before",
                r[0]
            );
        }
        last.insert(r[0].clone(), (finished, format!("{r:?}")));
    }
}

/// Every user message answered, each exactly once.
fn assert_answered_once(h: &TestHost, want: i64) {
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE role = 'user'"),
        want
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE role = 'user' AND status = 'pending'"),
        0
    );
    assert_eq!(
        h.count("SELECT COUNT(*) FROM messages WHERE role = 'assistant'"),
        want,
        "one reply per message"
    );
    assert_eq!(
        h.count("SELECT COUNT(DISTINCT reply_to) FROM messages WHERE role = 'assistant'"),
        want,
        "no message answered twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_hosts_spaces_move_and_every_message_is_answered_once() {
    const SPACES: usize = 50;
    let mut hosts = TestHost::start_cluster(
        3,
        cluster_opts(json!({"rules": [{"reply": "answered", "latency_ms": 150}]})),
    )
    .await;
    let token = hosts[0].adapter_token("bridge", "test").await;
    // Every space's first message, spread over the three hosts.
    let mut sends = Vec::new();
    for s in 0..SPACES {
        let h = &hosts[s % 3];
        sends.push(post(h, &token, s, 1));
    }
    futures_util::future::join_all(sends).await;
    let h1 = host_id(&hosts[1], "h1");
    // A second round, and h1 dies in the middle of it (turns in flight).
    let mut sends = Vec::new();
    for s in 0..SPACES / 2 {
        sends.push(post(&hosts[(s + 1) % 3], &token, s, 2));
    }
    futures_util::future::join_all(sends).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    hosts[0].kill();
    let killed_at = now_ms();
    let held_by_h1: BTreeSet<String> = rows(
        &hosts[1],
        &format!(
            "SELECT space_id FROM space_leases WHERE host_id = '{h1}' AND expires_at > {killed_at}"
        ),
    )
    .into_iter()
    .map(|r| r[0].clone())
    .collect();
    assert!(!held_by_h1.is_empty(), "h1 held spaces when it died");
    let mut sends = Vec::new();
    for s in SPACES / 2..SPACES {
        sends.push(post(&hosts[1 + s % 2], &token, s, 2));
    }
    futures_util::future::join_all(sends).await;
    // A third round through the survivors, to every space.
    let mut sends = Vec::new();
    for s in 0..SPACES {
        sends.push(post(&hosts[1 + s % 2], &token, s, 3));
    }
    futures_util::future::join_all(sends).await;
    let want = (SPACES * 3) as i64;
    let answered = hosts[1]
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            want,
            90,
        )
        .await;
    assert_eq!(answered, want, "every message answered");
    assert_answered_once(&hosts[1], want);
    assert_no_overlap(&hosts[1]);
    // Each space h1 held was run by another host within the lease time
    // (plus two seconds) of its death.
    for space in &held_by_h1 {
        let first = rows(
            &hosts[1],
            &format!(
                "SELECT MIN(started_at) FROM runs WHERE space_id = '{space}'
                 AND host_id <> '{h1}' AND started_at > {killed_at}"
            ),
        );
        let started: i64 = first[0][0]
            .parse()
            .unwrap_or_else(|_| panic!("space {space} was never run after h1 died"));
        assert!(
            started - killed_at <= (LEASE_SECS + 2) * 1000,
            "space {space} waited {} ms after h1 died",
            started - killed_at
        );
    }
    // The survivors did every run after the kill.
    assert_eq!(
        hosts[1].count(&format!(
            "SELECT COUNT(*) FROM runs WHERE host_id = '{h1}' AND started_at > {killed_at}"
        )),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_host_commits_nothing_and_a_task_fires_once() {
    let mut opts = cluster_opts(json!({"rules": [
        {"match": "slow", "reply": "slow answer", "latency_ms": 2500},
        {"reply": "answered"}
    ]}));
    // Today's daily scan is due from the start on both hosts.
    opts.config.push(("review.enabled", Yaml::Bool(true)));
    opts.config
        .push(("review.daily_at", Yaml::String("00:00".into())));
    let hosts = TestHost::start_cluster(2, opts).await;
    let token = hosts[0].adapter_token("bridge", "test").await;
    // Tasks: twenty one-shot tasks due at the same moment, made through
    // both hosts; both schedulers tick every second.
    let due = mercury::clock::ms_to_rfc3339((now_ms() / 1000 + 4) * 1000);
    for i in 0..20 {
        let h = &hosts[i % 2];
        let space = format!("tasks-{i}");
        h.create_space(&space).await;
        let (st, v) = h
            .owner(
                Method::POST,
                "/api/tasks",
                Some(&space),
                Some(json!({"at": due, "prompt": "tick", "silent": true})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
    }
    let fired = hosts[1]
        .wait_count("SELECT COUNT(*) FROM task_runs", 20, 30)
        .await;
    assert_eq!(fired, 20);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        hosts[1].count("SELECT COUNT(*) FROM task_runs"),
        20,
        "a due task fired once per deployment"
    );
    // A slow turn, and the host running it is paused past its lease in
    // the middle of it.
    let (st, v) = hosts[1]
        .ingest(
            &token,
            "c-slow",
            "test:slow",
            "slow please",
            "m-slow",
            false,
        )
        .await;
    assert_eq!(st, 202, "{v}");
    let running = hosts[0]
        .wait_count(
            "SELECT COUNT(*) FROM runs WHERE status = 'running' AND kind = 'live'",
            1,
            20,
        )
        .await;
    assert_eq!(running, 1, "the slow turn runs");
    let runner = rows(
        &hosts[0],
        "SELECT h.name, h.host_id FROM runs r JOIN cluster_hosts h ON h.host_id = r.host_id
         WHERE r.status = 'running' AND r.kind = 'live'",
    );
    let (paused, paused_id) = (runner[0][0].clone(), runner[0][1].clone());
    let (p, other) = if paused == "h1" { (0, 1) } else { (1, 0) };
    hosts[p].signal("STOP");
    let stopped_at = now_ms();
    // The other host takes the space after the lease and answers.
    let answered = hosts[other]
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant' AND text = 'slow answer'",
            1,
            30,
        )
        .await;
    assert_eq!(
        answered, 1,
        "another host answered the paused host's message"
    );
    hosts[p].signal("CONT");
    // The paused host wakes, ends its turn and finds its lease gone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        hosts[other].count(&format!(
            "SELECT COUNT(*) FROM runs WHERE host_id = '{paused_id}' AND status <> 'interrupted' AND started_at < {stopped_at} AND kind = 'live'"
        )),
        0,
        "the paused host's run committed nothing"
    );
    assert_eq!(
        hosts[other].count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant' AND text = 'slow answer'"
        ),
        1,
        "the message was answered once"
    );
    assert_no_overlap(&hosts[other]);
    // The paused host serves again and runs the spaces it is given.
    hosts[p].wait_ready().await;
    post(&hosts[p], &token, 8, 1).await;
    let want = hosts[0].count("SELECT COUNT(*) FROM messages WHERE role = 'user'");
    let got = hosts[0]
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant' AND reply_to IN (SELECT id FROM messages WHERE role = 'user')",
            want,
            30,
        )
        .await;
    assert_eq!(got, want);
    // A write for a space the other host runs is forwarded to it whole
    // (it needs the space's actor, which runs only there).
    let holder = rows(
        &hosts[0],
        &format!(
            "SELECT h.name FROM space_leases l JOIN cluster_hosts h ON h.host_id = l.host_id
             WHERE l.space_id = 'tasks-0' AND l.expires_at > {}",
            now_ms()
        ),
    );
    let via = if holder[0][0] == "h1" { 1 } else { 0 };
    let answer = hosts[via]
        .http
        .post(format!("{}/api/tasks", hosts[via].url))
        .bearer_auth(&hosts[via].owner_token)
        .header("x-mercury-space", "tasks-0")
        .json(&json!({"cron": "0 9 * * *", "prompt": "forwarded"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    // So is a dashboard form (its sign-in and CSRF token are in the
    // database, so the space's host takes them as its own).
    let browser = crate::ui::no_redirects();
    let cookie = crate::ui::sign_in(&hosts[via], &browser, &hosts[via].owner_token).await;
    let (st, page) = crate::ui::get(&hosts[via], &browser, "/ui/spaces/tasks-0", &cookie).await;
    assert_eq!(st, 200);
    let csrf = crate::ui::csrf_of(&page);
    let (st, to) = crate::ui::post_form(
        &hosts[via],
        &browser,
        "/ui/spaces/tasks-0/mutes",
        &cookie,
        &[
            ("csrf", csrf.as_str()),
            ("caller_id", "test:99"),
            ("for", ""),
            ("reason", ""),
        ],
    )
    .await;
    assert_eq!(st, 303, "the form was answered by the space's host: {to}");
    assert_eq!(
        hosts[via].count(
            "SELECT COUNT(*) FROM mutes WHERE space_id = 'tasks-0' AND caller_id = 'test:99'"
        ),
        1
    );
    // The daily scan ran once for the deployment (both schedulers ticked).
    let scans = hosts[0]
        .wait_count("SELECT COUNT(*) FROM runs WHERE kind = 'review'", 1, 30)
        .await;
    assert_eq!(scans, 1, "the daily review scan ran");
    assert_eq!(
        answer.headers()["x-mercury-served-by"]
            .to_str()
            .unwrap()
            .split('-')
            .next(),
        Some(holder[0][0].as_str()),
        "the space's own host answered"
    );
    assert_eq!(
        hosts[via].count(
            "SELECT COUNT(*) FROM tasks WHERE prompt = 'forwarded' AND space_id = 'tasks-0'"
        ),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_stored_on_another_host_wakes_the_spaces_host_at_once() {
    let mut opts = cluster_opts(json!({"rules": [{"reply": "answered"}]}));
    // A look once a minute: only the notification can wake the holder in time.
    opts.config.retain(|(k, _)| *k != "cluster.poll_ms");
    opts.config
        .push(("cluster.poll_ms", Yaml::Number(60_000.into())));
    let hosts = TestHost::start_cluster(2, opts).await;
    let token = hosts[0].adapter_token("bridge", "test").await;
    post(&hosts[0], &token, 1, 1).await;
    let first = hosts[0]
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            1,
            20,
        )
        .await;
    assert_eq!(first, 1, "the first host runs the space");
    let h1 = host_id(&hosts[0], "h1");
    assert_eq!(
        hosts[0].count(&format!(
            "SELECT COUNT(*) FROM space_leases WHERE host_id = '{h1}' AND expires_at > {}",
            now_ms()
        )),
        1
    );
    // The second message arrives at the other host.
    let sent = std::time::Instant::now();
    post(&hosts[1], &token, 1, 2).await;
    let both = hosts[0]
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            2,
            20,
        )
        .await;
    assert_eq!(both, 2);
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "answered {:?} after it was stored elsewhere (the look is a minute away)",
        sent.elapsed()
    );
    assert_answered_once(&hosts[0], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_posted_to_the_host_without_the_adapters_lease_is_stored_and_answered_once() {
    let (graph_url, graph) = crate::whatsapp::graph().await;
    let whatsapp = crate::whatsapp::options(&graph_url, "");
    let mut opts = cluster_opts(json!({"rules": [{"reply": "answered"}]}));
    opts.config.extend(whatsapp.config);
    opts.env = whatsapp.env;
    let hosts = TestHost::start_cluster(2, opts).await;
    // One host delivers (it holds the adapter's lease); the other only takes webhooks.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let holder = loop {
        let r = rows(
            &hosts[0],
            "SELECT host_id FROM deployment_leases WHERE name = 'adapter:whatsapp'",
        );
        if let Some(r) = r.first() {
            break r[0].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no host took the adapter"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let standby = if holder == host_id(&hosts[0], "h1") {
        1
    } else {
        0
    };
    let note = crate::whatsapp::text_message(
        "wamid.CLUSTER1",
        "16315551181",
        "hello from anywhere",
        crate::whatsapp::now_secs(),
    );
    // Meta posts to whichever host its URL reaches: the standby one here.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = crate::whatsapp::post_signed(&hosts[standby], &note).await;
        if st == 200 {
            break;
        }
        assert_eq!(
            st, 404,
            "the webhook is refused only until it is registered"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the standby host never took the webhook"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A redelivery to the lease holder is the same message, kept once.
    assert_eq!(
        crate::whatsapp::post_signed(&hosts[1 - standby], &note).await,
        200
    );
    hosts[0]
        .wait_count(
            "SELECT COUNT(*) FROM outbox WHERE delivered_at IS NOT NULL",
            1,
            30,
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = graph.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["text"]["body"], "answered");
    assert_answered_once(&hosts[0], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_telegram_webhook_call_is_taken_by_either_host_with_the_secret_the_holder_set() {
    let fake = crate::telegram::FakeBotApi::start().await;
    let telegram = crate::telegram::host_options(
        &fake,
        json!({}),
        vec![
            ("adapters.telegram.mode", Yaml::String("webhook".into())),
            (
                "adapters.telegram.webhook_url",
                Yaml::String("https://bot.example/api/adapters/telegram/webhook".into()),
            ),
        ],
    );
    let mut opts = cluster_opts(json!({"rules": [{"reply": "answered"}]}));
    opts.config.extend(telegram.config);
    opts.env = telegram.env;
    let hosts = TestHost::start_cluster(2, opts).await;
    fake.until(30, "setWebhook", |f| !f.calls("setWebhook").is_empty())
        .await;
    let secret = fake.calls("setWebhook").remove(0).params["secret_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = "/api/adapters/telegram/webhook";
    let header = [("X-Telegram-Bot-Api-Secret-Token", secret.as_str())];
    // Telegram posts to whichever host its URL reaches: each takes it with
    // the one secret, and the same update through both is kept once.
    for (i, h) in hosts.iter().enumerate() {
        let update = crate::telegram::dm(1, 10, 42, "hello from anywhere");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (st, v) = h
                .send(Method::POST, path, None, &header, Some(update.clone()))
                .await;
            if st == 200 {
                break;
            }
            assert_eq!(st, 404, "host {i}: refused only until registered: {v}");
            assert!(
                std::time::Instant::now() < deadline,
                "host {i} never took the webhook"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (st, _) = h
            .send(
                Method::POST,
                path,
                None,
                &[("X-Telegram-Bot-Api-Secret-Token", "not-the-secret")],
                Some(crate::telegram::dm(2, 11, 42, "forged")),
            )
            .await;
        assert_eq!(st, 401, "host {i}");
    }
    fake.until(60, "the reply", |f| f.replies().contains_key(&10))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.replies()[&10].len(), 1, "answered once");
    assert_eq!(
        hosts[0].count("SELECT COUNT(*) FROM messages WHERE sender_id = 'telegram:42'"),
        1
    );
    assert_eq!(fake.calls("setWebhook").len(), 1, "only the holder sets it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callers_limit_is_one_for_the_deployment_whichever_host_their_messages_reach() {
    let mut opts = cluster_opts(json!({"rules": [{"reply": "answered"}]}));
    opts.config
        .retain(|(k, _)| *k != "ingress.per_caller_per_minute");
    opts.config
        .push(("ingress.per_caller_per_minute", Yaml::Number(3.into())));
    let hosts = TestHost::start_cluster(2, opts).await;
    let token = hosts[0].adapter_token("bridge", "test").await;
    // The window is a clock minute: start well inside one.
    let into = now_ms() % 60_000;
    if into > 50_000 {
        tokio::time::sleep(Duration::from_millis((60_100 - into) as u64)).await;
    }
    let mut statuses = Vec::new();
    // Four turns of one caller within a minute, alternating hosts: a
    // limit per host (3 each) would take all four.
    for n in 0..4 {
        let (st, v) = hosts[n % 2]
            .ingest(
                &token,
                "c-limit",
                "test:sam",
                &format!("turn {n}"),
                &format!("lim-{n}"),
                false,
            )
            .await;
        assert!(st == 202 || st == 200, "ingress {st}: {v}");
        statuses.push(v["status"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(
        statuses.iter().filter(|s| *s == "rate_limited").count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(statuses[3], "rate_limited", "{statuses:?}");
    // The window is one row for the pair, counted across both hosts.
    assert_eq!(
        rows(
            &hosts[1],
            "SELECT used FROM caller_windows WHERE caller_id = 'test:sam'"
        ),
        vec![vec!["4".to_string()]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_the_shared_dir_holds_reports_models_and_the_owner_token_serves_every_host() {
    let hosts = TestHost::start_cluster(
        2,
        cluster_opts(json!({"rules": [
            {"purpose": "judge", "reply": "{\"findings\": []}"},
            {"reply": "answered"}
        ]})),
    )
    .await;
    let token = hosts[0].adapter_token("bridge", "test").await;
    post(&hosts[0], &token, 1, 1).await;
    hosts[0]
        .wait_count(
            "SELECT COUNT(*) FROM messages WHERE role = 'assistant'",
            1,
            20,
        )
        .await;
    let (st, summary) = hosts[0]
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{summary}");
    let listed = |h: usize| {
        let h = &hosts[h];
        async move {
            let (st, v) = h
                .owner(Method::GET, "/api/review/reports", None, None)
                .await;
            assert_eq!(st, 200, "{v}");
            v
        }
    };
    let (here, there) = (listed(0).await, listed(1).await);
    assert!(
        here["reports"].as_array().is_some_and(|r| !r.is_empty()),
        "{here}"
    );
    assert_eq!(here, there, "the other host serves the same reports");

    // models/ is the shared dir's: a rules file put there once may be a
    // space's chain on any host, and whichever host runs its turn reads it.
    let rules = hosts[0].shared_dir().join("models/shared-rules.json");
    std::fs::write(
        &rules,
        r#"{"rules": [{"reply": "from the shared models"}]}"#,
    )
    .unwrap();
    hosts[0].create_space("team").await;
    let (st, v) = hosts[1]
        .owner(
            Method::PUT,
            "/api/model",
            Some("team"),
            Some(json!({"chain": [format!("scripted:{}", rules.display())]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    for h in &hosts {
        let v = h.chat("team", "hello").await;
        assert_eq!(v["reply"], "from the shared models", "{v}");
    }
}
