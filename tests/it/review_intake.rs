//! Conversation review, milestone 2, on real hosts: the reports over the API
//! (`GET /api/review/reports[/{name}]`) for global admins and `review.read`
//! tokens only.

use reqwest::Method;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

use crate::common::{HostOptions, TestHost};

fn options() -> HostOptions {
    HostOptions {
        model: json!({"rules": [{"purpose": "judge", "reply": "{\"findings\": []}"}]}),
        ..Default::default()
    }
}

#[tokio::test]
async fn review_reports_are_read_by_admins_and_review_read_tokens_only() {
    let host = TestHost::start(options()).await;
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{run}");
    let date = run["date"].as_str().unwrap().to_owned();

    // The owner (a global admin) lists and reads.
    let (st, v) = host
        .owner(Method::GET, "/api/review/reports", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["reports"],
        json!([{"date": date, "kind": "daily", "name": date}]),
        "{v}"
    );

    // A review.read token, minted with mrctl, reads the same and nothing else.
    let out = output(host.mrctl(&host.owner_token, None).args([
        "tokens",
        "create",
        "api:puller",
        "--scope",
        "review.read",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let reader = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(reader.starts_with("mrc_"), "{reader}");
    let (st, v) = host
        .call(
            Method::GET,
            "/api/review/reports",
            Some(&reader),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["reports"][0]["name"], date.as_str());
    let (st, v) = host
        .call(
            Method::GET,
            &format!("/api/review/reports/{date}"),
            Some(&reader),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["date"].as_str(), v["kind"].as_str()),
        (Some(date.as_str()), Some("daily"))
    );
    assert_eq!(v["report"]["date"], date.as_str());
    assert_eq!(v["report"]["footer"]["exchanges_judged"], 0);
    let on_disk: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            host.data
                .join("reviews")
                .join(format!("{date}-daily"))
                .join("report.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(v["report"], on_disk, "the report is served as written");

    // The scope is all it can do: no scan, no other route, no space.
    for (method, path, space) in [
        (Method::POST, "/api/review/run", None),
        (Method::GET, "/api/spaces", None),
        (Method::GET, "/api/tokens", None),
        (Method::GET, "/api/review/reports", Some("main")),
    ] {
        let (st, v) = host
            .call(method.clone(), path, Some(&reader), space, None)
            .await;
        assert_eq!(st, 403, "{method} {path} with review.read: {v}");
    }
    assert_eq!(
        host.count("SELECT COUNT(*) FROM runs WHERE kind = 'review'"),
        1,
        "the review.read token started no scan"
    );

    // Any other token is refused.
    let alice = host.token("api:alice", "user").await;
    let adapter = host.token("bridge", "adapter").await;
    for token in [&alice, &adapter] {
        for path in [
            "/api/review/reports".to_owned(),
            format!("/api/review/reports/{date}"),
        ] {
            let (st, v) = host.call(Method::GET, &path, Some(token), None, None).await;
            assert_eq!(st, 403, "{path}: {v}");
        }
    }
    let (st, _) = host
        .call(Method::GET, "/api/review/reports", None, None, None)
        .await;
    assert_eq!(st, 401);

    // Bad names are the client's; a missing report is a 404.
    for (name, want) in [
        ("2026-13-40", 400),
        ("..%2F..%2Fstate.db", 400),
        ("2001-01-01", 404),
        ("2001-01-01-weekly", 404),
    ] {
        let (st, v) = host
            .owner(
                Method::GET,
                &format!("/api/review/reports/{name}"),
                None,
                None,
            )
            .await;
        assert_eq!(st, want, "{name}: {v}");
    }

    // Scopes are for user tokens, and only known ones.
    for body in [
        json!({"caller_id": "api:x", "scope": "review.write"}),
        json!({"caller_id": "bridge2", "kind": "adapter", "platform": "test", "scope": "review.read"}),
    ] {
        let (st, v) = host
            .owner(Method::POST, "/api/tokens", None, Some(body))
            .await;
        assert_eq!(st, 400, "{v}");
    }
    let (st, v) = host.owner(Method::GET, "/api/tokens", None, None).await;
    assert_eq!(st, 200);
    let scoped: Vec<&str> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["scope"] == "review.read")
        .map(|t| t["caller_id"].as_str().unwrap())
        .collect();
    assert_eq!(scoped, ["api:puller"], "{v}");
    host.stop().await;
}

/// The judge's answer for the exchange whose user line matches `user_re`.
pub(crate) fn judge_rule(
    user_re: &str,
    kind: &str,
    layer: &str,
    summary: &str,
) -> serde_json::Value {
    let finding = json!({
        "message_id": 0, "kind": kind, "scope": "space", "target_layer": layer,
        "severity": 2, "summary": summary, "evidence": "see the reply",
        "suggestion": "answer correctly"
    })
    .to_string()
    .replace("\"message_id\":0", "\"message_id\":$1");
    json!({"purpose": "judge",
           "match": format!("\\[msg (\\d+)\\]\\n(?:context: [^\\n]*\\n)*user [^\\n]*{user_re}"),
           "reply": format!("{{\"findings\": [{finding}]}}")})
}

fn turn_rules() -> Vec<serde_json::Value> {
    vec![
        json!({"purpose": "turn", "match": "capital of France", "reply": "Lyon."}),
        json!({"purpose": "turn", "match": "weather", "reply": "Sunny."}),
        json!({"purpose": "turn", "match": "miles", "reply": "Five miles are three kilometres."}),
        json!({"purpose": "turn", "match": "reminder", "reply": "I cannot set reminders."}),
        json!({"purpose": "turn", "match": "joke", "reply": "No."}),
        json!({"purpose": "turn", "reply": "Sure."}),
    ]
}

fn host_options(judge: Vec<serde_json::Value>, tz: &str) -> HostOptions {
    let mut rules = judge;
    rules.push(json!({"purpose": "judge", "reply": "{\"findings\": []}"}));
    // The intake's verify step (run with this host's config): the weather
    // finding is re-judged fine, every other one real.
    // The exchange itself reaches the verify step (alpha is read from its
    // data dir): the rule needs the bot's reply, which no report holds.
    rules.push(json!({"purpose": "intake", "match": r"weather(?s).*exchange:\nuser: [^\n]*weather[^\n]*\nassistant: Sunny\.",
                      "reply": "{\"real\": false, \"reason\": \"The short reply answered the question.\"}"}));
    rules.push(json!({"purpose": "intake", "reply": "{\"real\": true, \"reason\": \"The reply is wrong.\"}"}));
    rules.extend(turn_rules());
    HostOptions {
        model: json!({ "rules": rules }),
        config: vec![
            ("review.batch_size", Yaml::Number(1.into())),
            ("review.calls_per_minute", Yaml::Number(600.into())),
            ("review.timezone", Yaml::String(tz.into())),
            (
                "review.owner_names",
                Yaml::Sequence(vec![Yaml::String(OWNER_NAME.into())]),
            ),
        ],
        ..Default::default()
    }
}

const OWNER_NAME: &str = "Olivia Bakker";
/// What must appear in no file the intake writes.
const RAW_IDENTIFIERS: &str =
    r"(?i)\+31 6 1234 5678|31612345678|Olivia|Bakker|@s\.whatsapp\.net|[0-9]{7,}";

async fn scan(host: &TestHost, space: &str, questions: &[&str]) -> String {
    host.create_space(space).await;
    for q in questions {
        host.chat(space, q).await;
    }
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!(st, 200, "{run}");
    assert_eq!(run["status"], "done", "{run}");
    run["date"].as_str().unwrap().to_owned()
}

/// Runs a command off the runtime (the hosts it calls run in this process).
async fn output(cmd: &mut std::process::Command) -> std::process::Output {
    let mut cmd = std::mem::replace(cmd, std::process::Command::new("true"));
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap()
}

async fn mercury(args: &[&str], token: Option<&str>) -> std::process::Output {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .args(args);
    if let Some(t) = token {
        c.env("MERCURY_INTAKE_TOKEN", t);
    }
    output(&mut c).await
}

fn write(dir: &std::path::Path, rel: &str, body: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
}

fn no_identifiers(path: &std::path::Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let re = regex::Regex::new(RAW_IDENTIFIERS).unwrap();
    assert!(
        !re.is_match(&text),
        "{} holds an identifier:\n{text}",
        path.display()
    );
}

/// Checkpoint M2: two hosts with scripted judges write daily reports; the
/// intake pulls both (one over HTTP), re-gates them (a third, leaking
/// report is refused and named), and the triage shows a reject, an attach,
/// a fixed-not-deployed and a duplicate (the same finding on a later day,
/// another host, other wording) that follows the earlier decision. Only
/// approved rows are applied; every row is in ledger.json.
#[tokio::test]
async fn review_intake_checkpoint_m2_triages_two_hosts_and_applies_only_approved_rows_and_rejects_feed_back(
) {
    // UTC-12 and UTC+14: alpha's report date is always before beta's.
    // Once the owner rejected the weather finding, it is a counter-example
    // in the judge's instructions: this rule shows that it arrived.
    let mut saw_counter_example = judge_rule(
        "capital of France",
        "wrong_answer",
        "memory",
        "Counter-example seen: the assistant named the wrong capital of France.",
    );
    saw_counter_example["match_any"] =
        json!("(?s)NOT to be problems.*- tone: The reply about the weather was curt");
    let alpha = TestHost::start(host_options(
        vec![
            saw_counter_example,
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
        ],
        "Etc/GMT+12",
    ))
    .await;
    let beta = TestHost::start(host_options(
        vec![
            judge_rule(
                "capital of France",
                "wrong_answer",
                "memory",
                "Wrong capital of France named by the assistant again.",
            ),
            judge_rule(
                "miles",
                "wrong_answer",
                "tool",
                "The assistant converted miles to kilometres with the wrong factor.",
            ),
            judge_rule(
                "joke",
                "tone",
                "character",
                "The assistant answered a request for a joke curtly.",
            ),
            judge_rule(
                "reminder",
                "unjustified_refusal",
                "agents_md",
                "The assistant refused to set a dentist reminder.",
            ),
        ],
        "Etc/GMT-14",
    ))
    .await;
    let day1 = scan(
        &alpha,
        "family",
        &["What is the capital of France?", "How is the weather?"],
    )
    .await;
    let day2 = scan(
        &beta,
        "family",
        &[
            "What is the capital of France?",
            "Convert 5 miles please",
            "Set a reminder for the dentist",
            "Tell me a joke",
        ],
    )
    .await;
    assert!(day1 < day2, "{day1} {day2}");

    // The operator's review directory: an open bug and a landed item.
    let intake = alpha.data.join("reviews").join("intake");
    write(&intake, "bugs/capital-cities.md", "# Wrong capital cities\n\nThe assistant names the wrong capital of a country. Keep capital facts in memory.\n");
    write(
        &intake,
        "ideas/recipes.md",
        "# Recipe cards\n\nShow recipes as cards.\n",
    );
    let landed = "# Unit conversion tool\n\ndeployed: false\n\nThe assistant converts miles to kilometres with the conversion tool, not from memory.\n";
    write(&intake, "landed/unit-conversion.md", landed);
    // A third bot whose report leaks a phone number and the owner's name.
    let gamma = tempfile::tempdir().unwrap();
    write(
        gamma.path(),
        "reviews/2026-01-05-daily/report.json",
        &json!({"date": "2026-01-05", "findings": [{"space": "x", "message_id": 1, "reply_id": 2,
            "kind": "tone", "scope": "space", "target_layer": "character", "severity": 1,
            "summary": "Olivia Bakker was told to call +31 6 1234 5678", "evidence": "", "suggestion": ""}]})
        .to_string(),
    );

    let out = output(beta.mrctl(&beta.owner_token, None).args([
        "tokens",
        "create",
        "api:alpha-intake",
        "--scope",
        "review.read",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let data = alpha.data.to_str().unwrap().to_owned();
    let from_alpha = format!("alpha={data}");
    let from_beta = format!("beta={}", beta.url);
    let from_gamma = format!("gamma={}", gamma.path().display());
    let args = [
        "review",
        "intake",
        "--data-dir",
        &data,
        "--from",
        &from_alpha,
        "--from",
        &from_beta,
        "--from",
        &from_gamma,
    ];
    let out = mercury(&args, Some(&token)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr.contains("not taken in: gamma 2026-01-05: blocked by the identifier gate (")
            && stderr.contains("phone")
            && stderr.contains("name"),
        "{stderr}"
    );
    assert!(
        !intake.join("reports/gamma").exists(),
        "a refused report is not stored"
    );
    for (bot, day) in [("alpha", &day1), ("beta", &day2)] {
        assert!(
            intake
                .join(format!("reports/{bot}/{day}/report.json"))
                .is_file(),
            "{bot} not stored"
        );
    }

    let triage: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake.join("triage.json")).unwrap())
            .unwrap();
    let rows = triage["rows"].as_array().unwrap();
    let by_summary = |needle: &str| {
        rows.iter()
            .find(|r| r["finding"]["summary"].as_str().unwrap().contains(needle))
            .unwrap_or_else(|| panic!("no row for {needle}: {triage}"))
    };
    let capital = by_summary("named the wrong capital");
    let weather = by_summary("weather");
    let capital_again = by_summary("again");
    let miles = by_summary("miles");
    let reminder = by_summary("dentist");
    let joke = by_summary("joke");
    assert_eq!(rows.len(), 6, "{triage}");
    assert_eq!(joke["proposed"], "new", "{joke}");
    assert_eq!(capital["proposed"], "attach", "{capital}");
    assert_eq!(capital["paths"][0], "bugs/capital-cities.md");
    assert_eq!(weather["proposed"], "reject", "{weather}");
    assert!(
        weather["reason"]
            .as_str()
            .unwrap()
            .starts_with("re-judged fine"),
        "{weather}"
    );
    assert_eq!(miles["proposed"], "fixed-not-deployed", "{miles}");
    assert_eq!(miles["paths"][0], "landed/unit-conversion.md");
    assert_eq!(reminder["proposed"], "new", "{reminder}");
    assert_eq!(capital_again["proposed"], "duplicate", "{capital_again}");
    assert_eq!(capital_again["finding"]["bot"], "beta");
    assert_eq!(capital_again["follows"]["row"], capital["row"]);
    assert_eq!(capital_again["follows"]["decision"], "attach");
    let md = std::fs::read_to_string(intake.join("triage.md")).unwrap();
    for want in [
        "| attach |",
        "| reject |",
        "| fixed-not-deployed |",
        "| duplicate |",
        "| new |",
        "bugs/capital-cities.md",
        "landed/unit-conversion.md",
        "gamma 2026-01-05",
    ] {
        assert!(md.contains(want), "{want} missing in\n{md}");
    }

    // Approve the attach, its duplicate and the reject as proposed, and the
    // reminder with --set as new; the fixed-not-deployed row stays unapproved.
    let n = |r: &serde_json::Value| r["row"].as_u64().unwrap().to_string();
    let rows_arg = format!(
        "{},{},{},{}",
        n(capital),
        n(capital_again),
        n(weather),
        n(joke)
    );
    let set_arg = format!("{}=new", n(reminder));
    let out = mercury(
        &[
            "review",
            "approve",
            "--data-dir",
            &data,
            "--rows",
            &rows_arg,
            "--set",
            &set_arg,
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let bug = std::fs::read_to_string(intake.join("bugs/capital-cities.md")).unwrap();
    let refs: Vec<&str> = bug.lines().filter(|l| l.starts_with("- ")).collect();
    assert_eq!(
        refs.len(),
        2,
        "the attach and the duplicate that follows it:\n{bug}"
    );
    assert!(
        refs[0].contains(&format!("{day1} alpha")) && refs[1].contains(&format!("{day2} beta")),
        "{bug}"
    );
    assert_eq!(
        std::fs::read_to_string(intake.join("landed/unit-conversion.md")).unwrap(),
        landed,
        "an unapproved row is not applied"
    );
    let new_bug = std::fs::read_dir(intake.join("bugs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap() != "capital-cities.md")
        .expect("the new bug file");
    let text = std::fs::read_to_string(&new_bug).unwrap();
    assert!(
        text.starts_with("# The assistant refused to set a dentist reminder."),
        "{text}"
    );
    assert!(
        text.contains("fingerprint: family unjustified_refusal agents_md "),
        "{text}"
    );

    let ledger: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake.join("ledger.json")).unwrap())
            .unwrap();
    let lrows = ledger["rows"].as_array().unwrap();
    assert_eq!(lrows.len(), 6, "every row is in the ledger: {ledger}");
    let applied: Vec<(&str, Option<&str>, bool)> = lrows
        .iter()
        .map(|r| {
            (
                r["proposed"].as_str().unwrap(),
                r["approved"].as_str(),
                r["applied"].as_bool().unwrap(),
            )
        })
        .collect();
    for want in [
        ("attach", Some("attach"), true),
        ("reject", Some("reject"), true),
        ("duplicate", Some("duplicate"), true),
        ("new", Some("new"), true),
        ("fixed-not-deployed", None, false),
    ] {
        assert!(applied.contains(&want), "{want:?} not in {applied:?}");
    }
    for r in lrows {
        for field in ["id", "bot", "date", "who", "when"] {
            assert!(
                r[field].as_str().is_some_and(|s| !s.is_empty()),
                "{field} in {r}"
            );
        }
        assert!(
            r["message_id"].as_i64().is_some() && r["fingerprint"]["summary_minhash"].is_string(),
            "{r}"
        );
    }
    // A second approve has nothing to do; the triage is spent.
    let out = mercury(&["review", "approve", "--data-dir", &data, "--all"], None).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Checkpoint M3 (verdict feedback): the rejected finding does not come
    // back in alpha's next daily report; it is dropped and counted, and the
    // judge was shown it as a counter-example.
    let (st, run) = alpha
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!((st, run["status"].as_str()), (200, Some("done")), "{run}");
    let (st, v) = alpha
        .owner(
            Method::GET,
            &format!("/api/review/reports/{}", run["date"].as_str().unwrap()),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let summaries: Vec<&str> = v["report"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["summary"].as_str().unwrap())
        .collect();
    assert!(
        !summaries.iter().any(|s| s.contains("weather")),
        "{summaries:?}"
    );
    assert!(
        summaries
            .iter()
            .any(|s| s.starts_with("Counter-example seen")),
        "{summaries:?}"
    );
    assert_eq!(v["report"]["footer"]["suppressed_rejected"], 1, "{v}");
    let md = std::fs::read_to_string(alpha.data.join(format!(
        "reviews/{}-daily/report.md",
        run["date"].as_str().unwrap()
    )))
    .unwrap();
    assert!(
        md.contains("- findings rejected at intake before (dropped): 1"),
        "{md}"
    );

    // The gate ran on everything written.
    for f in [
        "triage.md",
        "triage.json",
        "ledger.json",
        "bugs/capital-cities.md",
    ] {
        no_identifiers(&intake.join(f));
    }
    no_identifiers(&new_bug);
    // A tone finding approved as new is an idea, pre-filled the same way.
    let ideas: Vec<std::path::PathBuf> = std::fs::read_dir(intake.join("ideas"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "recipes.md")
        .collect();
    assert_eq!(ideas.len(), 1, "{ideas:?}");
    let idea = std::fs::read_to_string(&ideas[0]).unwrap();
    assert!(
        idea.contains("fingerprint: family tone character "),
        "{idea}"
    );
    no_identifiers(&ideas[0]);
    alpha.stop().await;
    beta.stop().await;
}

/// A ledger row as the intake writes it (for seeding a week of verdicts).
fn ledger_row(i: usize, proposed: &str, approved: &str) -> serde_json::Value {
    json!({"id": format!("row{}", "abcdefghijkl".chars().nth(i).unwrap()),
           "fingerprint": {"space": "family", "kind": "tone", "target_layer": "character",
                           "summary_minhash": "a".repeat(256)},
           "bot": "local", "date": "2026-09-20", "message_id": i, "space": "family", "kind": "tone",
           "summary": format!("finding {}", "abcdefghijkl".chars().nth(i).unwrap()),
           "proposed": proposed, "approved": approved, "applied": true, "who": "owner",
           "when": "2026-09-21T08:00:00Z", "paths": []})
}

/// Checkpoint M3: the weekly report lists a cluster spanning two spaces,
/// promoted to global, and the measured recall with its counts; with a
/// week of verdicts in the ledger it states precision and κ with the
/// confusion matrix and n (and "not enough verdicts" before).
#[tokio::test]
async fn review_weekly_checkpoint_m3_clusters_promotes_measures_recall_and_agreement() {
    let weekly_rules = tempfile::tempdir().unwrap();
    let weekly_model = weekly_rules.path().join("weekly.json");
    // The weekly judge also flags the weather answer the daily judge let pass.
    std::fs::write(
        &weekly_model,
        json!({"rules": [
            judge_rule("weather", "tone", "character", "The reply about the weather was curt."),
            {"purpose": "judge", "reply": "{\"findings\": []}"}
        ]})
        .to_string(),
    )
    .unwrap();
    let mut opts = host_options(
        vec![judge_rule(
            "capital of France",
            "wrong_answer",
            "memory",
            "The assistant named the wrong capital of France.",
        )],
        "UTC",
    );
    opts.config.push((
        "review.weekly_model",
        Yaml::String(format!("scripted:{}", weekly_model.display())),
    ));
    let host = TestHost::start(opts).await;
    for space in ["family", "work"] {
        host.create_space(space).await;
        host.chat(space, "What is the capital of France?").await;
        host.chat(space, "Hello there").await;
    }
    host.chat("family", "How is the weather?").await;
    let (st, run) = host
        .owner(Method::POST, "/api/review/run", None, None)
        .await;
    assert_eq!((st, run["findings"].as_u64()), (200, Some(2)), "{run}");

    let out = output(
        host.mrctl(&host.owner_token, None)
            .args(["--json", "review", "weekly-now"]),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (summary["clusters"].as_u64(), summary["promoted"].as_u64()),
        (Some(1), Some(1)),
        "{summary}"
    );
    let r = &summary["recall"];
    // 2 flagged; 3 not flagged (two greetings and the weather), all sampled; 1 missed.
    assert_eq!(
        (
            r["flagged"].as_u64(),
            r["unflagged"].as_u64(),
            r["sampled"].as_u64(),
            r["missed_in_sample"].as_u64()
        ),
        (Some(2), Some(3), Some(3), Some(1)),
        "{summary}"
    );
    assert!(
        (r["estimate"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9,
        "{summary}"
    );
    assert_eq!(summary["verdicts"]["enough"], false);
    let date = summary["date"].as_str().unwrap().to_owned();
    let dir = host.data.join(format!("reviews/{date}-weekly"));
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for want in [
        "### 1. wrong_answer / memory (2 findings)",
        "- scope: global (promoted from space: it spans two or more spaces)",
        "- spaces: family, work",
        "- exchanges flagged by the daily judge: 2",
        "- not flagged: 3",
        "- sampled and re-judged: 3",
        "- recall: 0.67 (95 % Wilson interval",
        "- not enough verdicts: 0 of the 10 needed",
    ] {
        assert!(md.contains(want), "{want} missing in\n{md}");
    }

    // A week of owner verdicts: 12 rows, 6 agreed real, 3 agreed fine, 2
    // the judge kept but the owner rejected, 1 the other way round.
    let mut rows = Vec::new();
    for i in 0..12 {
        let (p, a) = match i {
            0..=5 => ("attach", "attach"),
            6..=8 => ("reject", "reject"),
            9 | 10 => ("new", "reject"),
            _ => ("reject", "new"),
        };
        rows.push(ledger_row(i, p, a));
    }
    write(
        &host.data.join("reviews/intake"),
        "ledger.json",
        &json!({"rows": rows}).to_string(),
    );
    let (st, v) = host
        .owner(Method::GET, "/api/review/ledger", None, None)
        .await;
    assert_eq!(
        (st, v["rows"].as_array().map(Vec::len)),
        (200, Some(12)),
        "{v}"
    );
    let (st, v) = host
        .owner(Method::POST, "/api/review/weekly", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    let verdicts = &v["verdicts"];
    assert_eq!(
        (verdicts["n"].as_u64(), verdicts["enough"].as_bool()),
        (Some(12), Some(true)),
        "{v}"
    );
    // Owner real: 6 + 1 of 12.
    assert_eq!(
        (
            verdicts["precision"]["real"].as_u64(),
            verdicts["precision"]["judged"].as_u64()
        ),
        (Some(7), Some(12))
    );
    assert_eq!(
        verdicts["confusion"],
        json!({"both_real": 6, "judge_only": 2, "owner_only": 1, "both_fine": 3})
    );
    assert!(
        (verdicts["kappa"].as_f64().unwrap() - 0.4706).abs() < 1e-3,
        "{v}"
    );
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for want in [
        "- precision: 0.58 (7 of 12 judged findings approved as real)",
        "- Cohen's kappa (judge vs approver): 0.47, n = 12",
        "| judge: real | 6 | 2 |",
        "| judge: fine | 1 | 3 |",
    ] {
        assert!(md.contains(want), "{want} missing in\n{md}");
    }
    // The same through mrctl: the list, one report's JSON, the ledger.
    let out = output(
        host.mrctl(&host.owner_token, None)
            .args(["review", "reports"]),
    )
    .await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success()
            && text.contains(&format!("{date}\tdaily"))
            && text.contains(&format!("{date}-weekly\tweekly")),
        "{text}"
    );
    let name = format!("{date}-weekly");
    let out = output(
        host.mrctl(&host.owner_token, None)
            .args(["--json", "review", "report", &name]),
    )
    .await;
    let weekly: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let weekly = weekly["report"].clone();
    assert_eq!(weekly["verdicts"]["n"], 12, "{weekly}");
    let out = output(
        host.mrctl(&host.owner_token, None)
            .args(["review", "ledger"]),
    )
    .await;
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 12, "{text}");
    assert!(
        text.lines()
            .all(|l| l.contains("\tlocal\t2026-09-20\t[msg ")),
        "{text}"
    );

    // The report over the API, and the gate's work on it.
    let (st, v) = host
        .owner(
            Method::GET,
            &format!("/api/review/reports/{date}-weekly"),
            None,
            None,
        )
        .await;
    assert_eq!((st, v["kind"].as_str()), (200, Some("weekly")), "{v}");
    no_identifiers(&dir.join("report.md"));
    // In the JSON, numbers are counts and ratios the host computed (as in
    // the daily's); every string is checked.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let re = regex::Regex::new(RAW_IDENTIFIERS).unwrap();
    fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(a) => a.iter().for_each(|i| strings(i, out)),
            serde_json::Value::Object(m) => m.values().for_each(|i| strings(i, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    strings(&json, &mut all);
    assert!(all.iter().all(|s| !re.is_match(s)), "{all:?}");

    // Trends: the same daily findings two weeks ago, and another bot's
    // report (taken in by an intake) three weeks ago about a subject not
    // seen since. The weekly counts eight weeks, across bots.
    let day = chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d").unwrap();
    let ago = |d: i64| {
        (day - chrono::Duration::days(d))
            .format("%Y-%m-%d")
            .to_string()
    };
    let daily =
        std::fs::read_to_string(host.data.join(format!("reviews/{date}-daily/report.json")))
            .unwrap();
    write(
        &host.data.join(format!("reviews/{}-daily", ago(14))),
        "report.json",
        &daily,
    );
    let dentist = json!({"findings": [{"space": "work", "message_id": 7, "kind": "wrong_answer",
        "scope": "space", "target_layer": "memory", "severity": 2,
        "summary": "The reminder for the dentist was refused."}]});
    write(
        &host
            .data
            .join(format!("reviews/intake/reports/beta/{}", ago(21))),
        "report.json",
        &dentist.to_string(),
    );
    let (st, v) = host
        .owner(Method::POST, "/api/review/weekly", None, None)
        .await;
    assert_eq!(st, 200, "{v}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(
        json["clusters"][0]["weeks"],
        json!([0, 0, 0, 0, 0, 2, 0, 2]),
        "{json}"
    );
    assert_eq!(
        json["clusters"][0]["findings"], 2,
        "this week's alone: {json}"
    );
    assert_eq!(
        json["quiet"][0]["weeks"],
        json!([0, 0, 0, 0, 1, 0, 0, 0]),
        "{json}"
    );
    assert_eq!(json["quiet"][0]["bots"], json!(["beta"]), "{json}");
    assert_eq!(json["trend_weeks"][7], json!(date), "{json}");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for want in [
        "- per week, oldest first: 0, 0, 0, 0, 0, 2, 0, 2 (·····█·█)".to_owned(),
        "## Quiet this week (1)".to_owned(),
        format!("0, 0, 0, 0, 1, 0, 0, 0 (····█···); last seen {}\n", ago(21)),
    ] {
        assert!(md.contains(&want), "{want} missing in\n{md}");
    }
    no_identifiers(&dir.join("report.md"));
    host.stop().await;
}

/// A daily report with `n` findings, each about its own message and, for
/// the first eight, its own subject (so none is a duplicate of another).
fn report_with(date: &str, n: usize, offset: usize) -> String {
    const SUBJECTS: [&str; 8] = [
        "The weather forecast reply ignored the rain warning.",
        "A recipe answer listed butter twice and forgot the flour.",
        "Train departure times were quoted from last winter's timetable.",
        "The birthday reminder fired on the wrong weekday.",
        "A maths homework hint gave away the whole solution.",
        "Garden advice recommended pruning roses in midsummer heat.",
        "The museum opening hours ignored the public holiday closure.",
        "A translation into Spanish mixed formal and informal address.",
    ];
    let findings: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            json!({"space": "family", "message_id": i + 1, "reply_id": i + 2, "kind": "wrong_answer",
                "scope": "space", "target_layer": "memory", "severity": 1,
                "summary": SUBJECTS[(i + offset) % SUBJECTS.len()],
                "evidence": "", "suggestion": ""})
        })
        .collect();
    json!({"date": date, "findings": findings}).to_string()
}

#[tokio::test]
async fn review_intake_refuses_a_flooding_source_by_name_and_stops_at_its_call_budget() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    // The verify model is a real OpenAI-compatible server on loopback, so
    // every paid call it would have cost is counted where it arrives.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"message": {"role": "assistant",
                "content": "{\"real\": true, \"reason\": \"The reply was curt.\"}"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}
        })))
        .mount(&server)
        .await;
    let (_dir, data, _) = crate::common::prepare(&HostOptions {
        config: vec![
            ("review.model", Yaml::from("openai:verify-model")),
            (
                "providers.openai_base_url",
                Yaml::from(format!("{}/v1", server.uri())),
            ),
            ("review.calls_per_minute", Yaml::from(60_000)),
            ("review.intake_max_findings", Yaml::from(50)),
            ("review.intake_max_calls", Yaml::from(4)),
        ],
        ..Default::default()
    })
    .await;
    let hostile = tempfile::tempdir().unwrap();
    write(
        hostile.path(),
        "reviews/2026-01-05-daily/report.json",
        &report_with("2026-01-05", 4_000, 0),
    );
    let fair = tempfile::tempdir().unwrap();
    write(
        fair.path(),
        "reviews/2026-01-06-daily/report.json",
        &report_with("2026-01-06", 3, 0),
    );
    write(
        fair.path(),
        "reviews/2026-01-07-daily/report.json",
        &report_with("2026-01-07", 3, 3),
    );
    let data_s = data.to_str().unwrap().to_owned();
    let from_hostile = format!("hostile={}", hostile.path().display());
    let from_fair = format!("fair={}", fair.path().display());
    let intake = |data: String, a: String, b: String| async move {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"));
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("MERCURY_OPENAI_API_KEY", "sk-test-verify")
            .stdin(std::process::Stdio::null())
            .args([
                "review",
                "intake",
                "--data-dir",
                &data,
                "--from",
                &a,
                "--from",
                &b,
            ]);
        output(&mut c).await
    };
    let out = intake(data_s.clone(), from_hostile.clone(), from_fair.clone()).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr.contains(
            "not taken in: hostile 2026-01-05: has 4000 findings, more than \
             review.intake_max_findings = 50 in one report"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopped after review.intake_max_calls = 4 verify calls; the reports from fair/2026-01-07 on are left for the next intake"),
        "{stderr}"
    );
    // Four calls were paid, not 4,000; the report cut short is left whole.
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
    let intake_dir = data.join("reviews/intake");
    let triage: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake_dir.join("triage.json")).unwrap())
            .unwrap();
    assert_eq!(triage["rows"].as_array().unwrap().len(), 3, "{triage}");
    assert_eq!(triage["taken_in"], json!(["fair/2026-01-06"]));
    assert!(!intake_dir.join("reports/hostile").exists());
    assert!(!intake_dir.join("reports/fair/2026-01-07").exists());
    // After approval, the next intake takes the rest in (three more calls).
    let out = mercury(&["review", "approve", "--data-dir", &data_s, "--all"], None).await;
    assert!(out.status.success(), "{out:?}");
    let out = intake(data_s.clone(), from_hostile, from_fair).await;
    assert!(out.status.success(), "{out:?}");
    let triage: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(intake_dir.join("triage.json")).unwrap())
            .unwrap();
    assert_eq!(triage["taken_in"], json!(["fair/2026-01-07"]), "{triage}");
    assert_eq!(server.received_requests().await.unwrap().len(), 7);
}

/// A crashed intake leaves its reservations open; the next intake on the
/// same data dir releases them before it calls, and never another
/// instance's; two intakes on one data dir cannot run at once.
#[tokio::test]
async fn review_intake_releases_what_a_crashed_intake_reserved_and_runs_one_at_a_time() {
    use mercury::storage::spend::{self as ledger, NewReservation};
    let (_dir, data, _) = crate::common::prepare(&options()).await;
    let paths = mercury::workspace::DataPaths::new(&data);
    let settings = mercury::host::load_settings(&paths).unwrap();
    let store = mercury::storage::Store::open_at(
        &mercury::host::store_location(&settings, &paths).unwrap(),
    )
    .unwrap();
    let ours = format!(
        "intake:{}",
        mercury::sandbox::instance_id_for(&data).unwrap()
    );
    for instance in [ours.clone(), "a-live-host".to_owned()] {
        store
            .write(move |tx| {
                ledger::reserve(
                    tx,
                    &NewReservation {
                        at: mercury::clock::now_ms(),
                        instance: &instance,
                        shadow: false,
                        space_id: None,
                        purpose: "intake",
                        model: "scripted:x",
                        amount: 5_000,
                    },
                )
            })
            .await
            .unwrap();
    }
    let open = || store.read(ledger::open_reservations);
    assert_eq!(open().await.unwrap(), 2);
    let data_s = data.to_str().unwrap().to_owned();
    // While another intake holds the data dir, this one refuses, touching nothing.
    let held = mercury::workspace::data_dir::lock_intake(&paths).unwrap();
    let out = mercury(&["review", "intake", "--data-dir", &data_s], None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr.contains("is held by another mercury review intake (pid "),
        "{stderr}"
    );
    assert_eq!(open().await.unwrap(), 2);
    drop(held);
    let out = mercury(&["review", "intake", "--data-dir", &data_s], None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr.contains("released 1 reservation(s) a crashed intake left open"),
        "{stderr}"
    );
    // The live host's reservation is its own to release at its start.
    assert_eq!(open().await.unwrap(), 1);
}

/// With a host running on the data dir, the intake verifies with the
/// host's own judge model, not one this shell's environment names (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_intake_verifies_with_the_running_hosts_judge_model() {
    let host = TestHost::start(options()).await;
    let data = host.data.to_str().unwrap().to_owned();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_mercury"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // This shell names a judge the host does not use (and has no key for).
        .env("MERCURY_REVIEW_MODEL", "openai:gpt-not-the-hosts")
        .stdin(std::process::Stdio::null())
        .args(["review", "intake", "--data-dir", &data]);
    let out = output(&mut c).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr.contains("verifying with the running host's judge model scripted:")
            && stderr.contains("(this shell's config says \"openai:gpt-not-the-hosts\")"),
        "{stderr}"
    );
    host.stop().await;
}
