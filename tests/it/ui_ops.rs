//! The dashboard's daily actions over plain HTTP (issue 27): pausing and
//! resuming a task, muting and unmuting a sender, stopping a turn; each
//! refused without its CSRF token or the API route's permission, and each
//! leaving the same rows the API would.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{HostOptions, TestHost};
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
