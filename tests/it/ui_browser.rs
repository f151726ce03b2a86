//! The dashboard in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by deploy/setup.sh) driven over WebDriver:
//! an operator's walk through the pages, and planted script payloads that
//! must never run. With `MERCURY_UI_SCREENSHOTS=DIR` the walk saves its
//! screenshots there (docs/img/ holds the committed ones).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use mercury::storage::{messages, runs};
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{free_port, HostOptions, TestHost};

/// A chromedriver of this test, ended with it.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn driver() -> Driver {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver (Debian's chromium-driver; deploy/setup.sh installs it)");
    let d = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = http.get(format!("{}/status", d.url)).send().await {
            if r.status().is_success() {
                return d;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not answer on {}", d.url);
}

async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900", "--no-first-run"]
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("a Chromium session")
}

async fn shot(c: &Client, name: &str) {
    if let Ok(dir) = std::env::var("MERCURY_UI_SCREENSHOTS") {
        let png = c.screenshot().await.expect("a screenshot");
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png)
            .expect("write the screenshot");
    }
}

async fn text_of(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// Clicks `id` (a submit button or a link) and waits for the page it leads to.
async fn follow(c: &Client, locator: Locator<'_>) {
    c.execute("document.documentElement.dataset.left = '1';", vec![])
        .await
        .unwrap();
    c.find(locator).await.unwrap().click().await.unwrap();
    for _ in 0..1200 {
        let ready: Value = c
            .execute(
                "return document.readyState === 'complete' && !document.documentElement.dataset.left;",
                vec![],
            )
            .await
            .unwrap_or(Value::Bool(false));
        if ready == Value::Bool(true) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the click led to no new page");
}

async fn sign_in(c: &Client, host: &TestHost, token: &str) {
    c.goto(&format!("{}/ui/login", host.url)).await.unwrap();
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    follow(c, Locator::Id("sign-in")).await;
}

async fn replace_text(c: &Client, id: &str, text: &str) {
    let el = c.find(Locator::Id(id)).await.unwrap();
    el.clear().await.unwrap();
    el.send_keys(text).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_browser_operator_walkthrough() {
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match_any": "PINEAPPLE-RULE", "reply": "pineapple, as AGENTS.md says"},
            {"reply": "a plain answer"}
        ]}),
        ..Default::default()
    })
    .await;
    host.create_space("alpha").await;
    host.create_space("beta").await;
    let bob = host.token("api:bob", "user").await;
    host.grant("beta", "api:bob", "admin").await;
    let d = driver().await;
    let c = browser(&d).await;

    // Sign in; the overview.
    sign_in(&c, &host, &host.owner_token).await;
    assert_eq!(text_of(&c, "h1").await, "Overview");
    assert_eq!(text_of(&c, "#space-count").await, "2");
    shot(&c, "overview").await;

    // The spaces list, then a space.
    follow(&c, Locator::LinkText("Spaces")).await;
    follow(&c, Locator::LinkText("alpha")).await;
    assert_eq!(text_of(&c, "#space-title").await, "alpha");

    // The chat box: the turn's answer shows among the recent messages.
    replace_text(&c, "chat-text", "hello there").await;
    follow(&c, Locator::Id("chat-send")).await;
    let messages = text_of(&c, "#messages").await;
    assert!(
        messages.contains("hello there") && messages.contains("a plain answer"),
        "{messages}"
    );

    // Edit AGENTS.md; the next turn follows it.
    follow(&c, Locator::LinkText("AGENTS.md")).await;
    replace_text(
        &c,
        "file-editor",
        "Answer every greeting with fruit. PINEAPPLE-RULE",
    )
    .await;
    follow(&c, Locator::Id("file-save")).await;
    assert!(text_of(&c, "#file-content")
        .await
        .contains("PINEAPPLE-RULE"));
    shot(&c, "agents-md").await;
    c.goto(&format!("{}/ui/spaces/alpha", host.url))
        .await
        .unwrap();
    replace_text(&c, "chat-text", "hi again").await;
    follow(&c, Locator::Id("chat-send")).await;
    let messages = text_of(&c, "#messages").await;
    assert!(
        messages.contains("pineapple, as AGENTS.md says"),
        "{messages}"
    );
    shot(&c, "space").await;

    // A run's trace.
    follow(&c, Locator::LinkText("Runs")).await;
    follow(&c, Locator::Css("a.run-link")).await;
    assert_eq!(text_of(&c, "#run-status").await, "done");
    let trace = text_of(&c, "#trace").await;
    assert!(trace.contains("model"), "{trace}");
    shot(&c, "run-trace").await;

    // A stale edit is refused (the If-Match rule): the page's hash is old.
    c.goto(&format!("{}/ui/spaces/alpha/files/AGENTS.md", host.url))
        .await
        .unwrap();
    let (st, _) = host
        .call(
            Method::PUT,
            "/api/files/AGENTS.md",
            Some(&host.owner_token.clone()),
            Some("alpha"),
            Some(json!({"content": "changed elsewhere"})),
        )
        .await;
    assert_eq!(st, 200);
    replace_text(&c, "file-editor", "my stale edit").await;
    follow(&c, Locator::Id("file-save")).await;
    assert!(text_of(&c, "#error-status").await.starts_with("412"));

    // A form posted without its CSRF token is refused and changes nothing.
    c.goto(&format!("{}/ui/spaces/alpha/files/AGENTS.md", host.url))
        .await
        .unwrap();
    c.execute(
        "document.querySelector('form.card input[name=csrf]').remove();",
        vec![],
    )
    .await
    .unwrap();
    replace_text(&c, "file-editor", "forged").await;
    follow(&c, Locator::Id("file-save")).await;
    assert!(text_of(&c, "#error-status").await.starts_with("403"));
    c.goto(&format!("{}/ui/spaces/alpha/files/AGENTS.md", host.url))
        .await
        .unwrap();
    assert_eq!(text_of(&c, "#file-content").await, "changed elsewhere");

    // Sign out: the pages ask for a sign-in again.
    follow(&c, Locator::Id("logout")).await;
    assert_eq!(text_of(&c, "h1").await, "Sign in");
    c.goto(&format!("{}/ui/spaces", host.url)).await.unwrap();
    assert_eq!(text_of(&c, "h1").await, "Sign in");
    shot(&c, "sign-in").await;

    // A space admin of beta is refused alpha's page.
    sign_in(&c, &host, &bob).await;
    c.goto(&format!("{}/ui/spaces/alpha", host.url))
        .await
        .unwrap();
    assert!(text_of(&c, "#error-status").await.starts_with("403"));
    c.goto(&format!("{}/ui/spaces/beta", host.url))
        .await
        .unwrap();
    assert_eq!(text_of(&c, "#space-title").await, "beta");

    c.close().await.unwrap();
    host.stop().await;
}

/// The review's intake triage approved from the page (one row rejected,
/// one left out), as `mercury review approve` would; then a rehearsal's
/// diff, reached from the menu.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_browser_approves_an_intake_row_and_views_a_shadow_diff() {
    let root = tempfile::tempdir().unwrap();
    let host = TestHost::start(crate::ui_ops::review_options(vec![
        crate::ui_ops::shadow_root_of(&root),
    ]))
    .await;
    crate::ui_ops::scanned(&host).await;
    let triage = crate::ui_ops::triaged(&host).await;
    let weather = crate::ui_ops::row_of(&triage, "weather");
    let id = crate::ui_ops::rehearse(&host, root.path()).await;
    let d = driver().await;
    let c = browser(&d).await;
    sign_in(&c, &host, &host.owner_token).await;

    follow(&c, Locator::LinkText("Review")).await;
    let rows = text_of(&c, "#triage").await;
    assert!(
        rows.contains("The reply about the weather was curt."),
        "{rows}"
    );
    c.find(Locator::Id(&format!("decide-{weather}")))
        .await
        .unwrap()
        .select_by_value("reject")
        .await
        .unwrap();
    shot(&c, "review").await;
    follow(&c, Locator::Id("approve-chosen")).await;
    let notice = text_of(&c, "#notice").await;
    assert!(notice.starts_with("1 of 2 row(s) approved"), "{notice}");
    let ledger: Value = serde_json::from_str(
        &std::fs::read_to_string(host.data.join("reviews/intake/ledger.json")).unwrap(),
    )
    .unwrap();
    let approved: Vec<&Value> = ledger["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["approved"])
        .collect();
    assert_eq!(approved.len(), 2, "{ledger}");
    assert!(
        approved.contains(&&json!("reject")) && approved.contains(&&Value::Null),
        "{ledger}"
    );

    follow(&c, Locator::LinkText("Rehearsal")).await;
    follow(&c, Locator::LinkText(&id)).await;
    let files = text_of(&c, "#diff-files").await;
    assert!(
        files.contains("- Be brief.") && files.contains("+ Be brief and kind."),
        "{files}"
    );
    let rows = text_of(&c, "#diff-rows").await;
    assert!(
        rows.contains("space_preferences") && !rows.contains("1234 5678"),
        "{rows}"
    );
    let ran: Value = c
        .execute("return window.pwned === undefined;", vec![])
        .await
        .unwrap();
    assert_eq!(ran, Value::Bool(true), "a planted script ran");
    shot(&c, "rehearsal-diff").await;
    c.close().await.unwrap();
    host.stop().await;
}

const FLAG: &str = "window.__mercury_pwned";

/// Payloads that set [`FLAG`] if any of them ever runs.
fn payloads() -> Vec<String> {
    vec![
        "<script>window.__mercury_pwned=1</script>".into(),
        "<img src=x onerror=\"window.__mercury_pwned=2\">".into(),
        "\"><svg onload=window.__mercury_pwned=3>".into(),
        "</textarea><script>window.__mercury_pwned=4</script>".into(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_browser_planted_payloads_never_run() {
    let host = TestHost::start(HostOptions::default()).await;
    let p = payloads();
    // A space name.
    let (st, v) = host
        .owner(
            Method::POST,
            "/api/spaces",
            None,
            Some(json!({"id": "evil", "name": p[1]})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    // A message and a sender name; a tool call's file name and output.
    let (text, sender, file, output) = (p[0].clone(), p[2].clone(), p[2].clone(), p[1].clone());
    host.write(move |tx| {
        messages::insert(
            tx,
            &messages::NewMessage {
                space_id: "evil",
                sender_id: Some("telegram:666"),
                sender_name: Some(&sender),
                role: "user",
                text: &text,
                created_at: 1,
                status: Some("done"),
                ..Default::default()
            },
        )?;
        runs::start(tx, "run-evil", "evil", "turn", Some("telegram:666"), None)?;
        runs::record_steps(
            tx,
            "run-evil",
            &[runs::RunStep {
                seq: 1,
                kind: "tool".into(),
                name: "write_file".into(),
                arguments: Some(json!({"path": file}).to_string()),
                exit_code: Some(0),
                output: Some(output),
                ..Default::default()
            }],
        )?;
        runs::finish(tx, "run-evil", "done", None)
    });
    // A file's content.
    let (st, v) = host
        .call(
            Method::PUT,
            "/api/files/AGENTS.md",
            Some(&host.owner_token.clone()),
            Some("evil"),
            Some(json!({"content": p[3]})),
        )
        .await;
    assert_eq!(st, 200, "{v}");

    let d = driver().await;
    let c = browser(&d).await;
    sign_in(&c, &host, &host.owner_token).await;
    let pages = [
        ("/ui/spaces", p[1].as_str()),
        ("/ui/spaces/evil", p[0].as_str()),
        ("/ui/spaces/evil/files/AGENTS.md", p[3].as_str()),
        ("/ui/runs/run-evil", "onerror"),
    ];
    for (path, shown) in pages {
        c.goto(&format!("{}{path}", host.url)).await.unwrap();
        // Give any handler that might fire (an image's onerror) its moment.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ran: Value = c
            .execute(
                &format!("return {FLAG} === undefined ? null : {FLAG};"),
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(ran, Value::Null, "a payload ran on {path}");
        let planted: Value = c
            .execute(
                "return document.querySelectorAll('main script, main img, main svg').length;",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(planted, json!(0), "a payload became an element on {path}");
        let body = text_of(&c, "main").await;
        assert!(
            body.contains(shown),
            "{path} does not show the text {shown:?}: {body}"
        );
    }
    c.goto(&format!("{}/ui/spaces/evil", host.url))
        .await
        .unwrap();
    assert!(text_of(&c, "#messages .sender")
        .await
        .contains("<svg onload"));
    c.goto(&format!("{}/ui/runs/run-evil", host.url))
        .await
        .unwrap();
    assert!(text_of(&c, "#trace").await.contains("<svg onload"));
    c.close().await.unwrap();
    host.stop().await;
}
