//! `web_fetch` (issue 29 item 6) against a real HTTP server on a loopback
//! port (a std `TcpListener` answering by path): a page fetched and reduced
//! to its text in a turn, only where the space's admin turned it on, each
//! fetch a step of the run and counted in the space's budget; and the
//! egress policy and caps on the fetch itself: a redirect to a private
//! address, a name resolving to loopback, a 100 MB body and a slow body
//! each refused or cut off with a sentence. Loopback is reached only
//! because each test allows `127.0.0.1` in `web.allow`, by address.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use mercury::config::web::WebConfig;
use mercury::extensions::web::{fetch, WebError};

use crate::common::{HostOptions, TestHost};

const PAGE: &str = "<html><head><title>Fish &amp; Chips</title><style>body{color:red}</style></head>\
<body><script>var secret = 'SCRIPT-TEXT';</script><h1>Menu</h1><p>Cod &amp; chips &#8212; 4&nbsp;pounds</p>\
<!-- hidden comment --></body></html>";

/// Serves, on a loopback port: `/page` (HTML), `/to-private` (a redirect to
/// 192.168.77.1), `/to-localhost` (a redirect to this server by the name
/// `localhost`), `/huge` (100 MB, no length), `/slow` (a byte a second).
fn server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            std::thread::spawn(move || answer(conn, port));
        }
    });
    port
}

fn answer(mut conn: TcpStream, port: u16) {
    let mut line = String::new();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    if reader.read_line(&mut line).is_err() {
        return;
    }
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let head = |status: &str, extra: &str| {
        format!("HTTP/1.1 {status}\r\nConnection: close\r\n{extra}\r\n")
    };
    let _ = match path.as_str() {
        "/page" => conn.write_all(
            format!(
                "{}{PAGE}",
                head(
                    "200 OK",
                    &format!(
                        "Content-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n",
                        PAGE.len()
                    )
                )
            )
            .as_bytes(),
        ),
        "/to-private" => conn.write_all(
            head(
                "302 Found",
                "Location: http://192.168.77.1/inside\r\nContent-Length: 0\r\n",
            )
            .as_bytes(),
        ),
        "/to-localhost" => conn.write_all(
            head(
                "302 Found",
                &format!("Location: http://localhost:{port}/page\r\nContent-Length: 0\r\n"),
            )
            .as_bytes(),
        ),
        "/huge" => {
            // 100 MB, no length: the reader has to stop on its own.
            let _ = conn.write_all(head("200 OK", "Content-Type: text/plain\r\n").as_bytes());
            let chunk = vec![b'a'; 64 << 10];
            for _ in 0..1600 {
                if conn.write_all(&chunk).is_err() {
                    break;
                }
            }
            Ok(())
        }
        "/slow" => {
            let _ = conn.write_all(head("200 OK", "Content-Type: text/plain\r\n").as_bytes());
            for _ in 0..60 {
                if conn.write_all(b"x").and_then(|()| conn.flush()).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            Ok(())
        }
        _ => conn.write_all(head("404 Not Found", "Content-Length: 0\r\n").as_bytes()),
    };
}

fn loopback_allowed() -> WebConfig {
    WebConfig {
        allow: vec!["127.0.0.1".into()],
        max_bytes: 1 << 20,
        timeout_secs: 3,
        ..Default::default()
    }
}

#[tokio::test]
async fn web_fetch_a_page_is_fetched_and_reduced_to_its_text() {
    let port = server();
    let page = fetch(
        &loopback_allowed(),
        &format!("http://127.0.0.1:{port}/page"),
    )
    .await
    .unwrap();
    assert_eq!(page.status, 200);
    assert_eq!(page.title.as_deref(), Some("Fish & Chips"));
    assert_eq!(page.text, "Menu\nCod & chips — 4 pounds");
    assert!(page.cut_off.is_none());
    // Without the allow rule the same loopback URL is refused.
    let e = fetch(
        &WebConfig::default(),
        &format!("http://127.0.0.1:{port}/page"),
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("127.0.0.1 is a loopback address"),
        "{e}"
    );
}

#[tokio::test]
async fn web_fetch_refuses_a_redirect_to_a_private_address() {
    let port = server();
    let e = fetch(
        &loopback_allowed(),
        &format!("http://127.0.0.1:{port}/to-private"),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, WebError::Refused(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "192.168.77.1 is a private address, and web.allow does not name it; nothing was fetched"
    );
}

#[tokio::test]
async fn web_fetch_refuses_a_name_that_resolves_to_loopback() {
    let port = server();
    // Directly, and as a redirect's target: an address rule lets no name in.
    for url in [
        format!("http://localhost:{port}/page"),
        format!("http://127.0.0.1:{port}/to-localhost"),
    ] {
        let e = fetch(&loopback_allowed(), &url).await.unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, WebError::Refused(_)), "{msg}");
        assert!(msg.starts_with("localhost resolves to "), "{msg}");
        assert!(
            msg.contains("a loopback address, and web.allow does not name it"),
            "{msg}"
        );
    }
}

#[tokio::test]
async fn web_fetch_cuts_off_a_100_mb_body_at_the_cap() {
    let port = server();
    let started = Instant::now();
    let page = fetch(
        &loopback_allowed(),
        &format!("http://127.0.0.1:{port}/huge"),
    )
    .await
    .unwrap();
    assert_eq!(page.text.len(), 1 << 20);
    assert_eq!(
        page.cut_off.as_deref(),
        Some("the page is larger than web.max_bytes (1048576 bytes); the rest was cut off")
    );
    assert!(page.render().ends_with("the rest was cut off]"));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn web_fetch_cuts_off_a_slow_body_at_the_time_limit() {
    let port = server();
    let started = Instant::now();
    let e = fetch(
        &loopback_allowed(),
        &format!("http://127.0.0.1:{port}/slow"),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, WebError::Timeout(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "the fetch did not finish within 3s; it was cut off"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_fetch_in_a_turn_only_where_enabled_traced_and_counted_in_the_budget() {
    let port = server();
    let host = TestHost::start(HostOptions {
        model: json!({"rules": [
            {"match": "^user: fetch (\\S+)", "tool_calls": [{"name": "web_fetch", "arguments": {"url": "$1"}}]},
            {"match": "(?s)^tool_result\\(([a-z_]+)\\): (.*)", "reply": "[$1] $2"},
            {"reply": "ok"}
        ]}),
        sandbox: "process",
        config: vec![
            ("web.allow", serde_yaml_ng::from_str("['127.0.0.1']").unwrap()),
            ("web.timeout_secs", 3.into()),
            ("web.fetch_cost", 0.6.into()),
            ("budgets.space.daily", 1.0.into()),
            ("budgets.allow_unpriced", true.into()),
        ],
        ..Default::default()
    })
    .await;
    host.create_space("w").await;
    let url = format!("http://127.0.0.1:{port}/page");
    // Off until the space's admin turns it on: the tool does not exist.
    let v = host.chat("w", &format!("fetch {url}")).await;
    assert!(
        v["reply"]
            .as_str()
            .unwrap()
            .contains("there is no tool named"),
        "{v}"
    );
    // A member may not turn it on (config.set is an admin's).
    host.grant("w", "bob", "member").await;
    let bob = host.token("bob", "user").await;
    let on = json!({"key": "web.fetch", "value": "on"});
    let (st, _) = host
        .call(
            Method::PUT,
            "/api/config",
            Some(&bob),
            Some("w"),
            Some(on.clone()),
        )
        .await;
    assert_eq!(st, 403);
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/config",
            Some("w"),
            Some(json!({"key": "web.fetch", "value": "yes"})),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = host
        .owner(Method::PUT, "/api/config", Some("w"), Some(on))
        .await;
    assert_eq!(st, 200, "{v}");

    // A refusal reaches the model as a sentence (and, giving no page,
    // costs nothing: its reservation is released).
    let v = host
        .chat("w", &format!("fetch http://localhost:{port}/page"))
        .await;
    let reply = v["reply"].as_str().unwrap();
    assert!(
        reply.contains("error: web_fetch: localhost resolves to"),
        "{v}"
    );

    let v = host.chat("w", &format!("fetch {url}")).await;
    let reply = v["reply"].as_str().unwrap();
    assert!(reply.starts_with("[web_fetch] URL: "), "{v}");
    assert!(reply.contains("Title: Fish & Chips"), "{v}");
    assert!(reply.contains("Cod & chips — 4 pounds"), "{v}");
    assert!(
        !reply.contains("SCRIPT-TEXT") && !reply.contains("color:red"),
        "{v}"
    );
    let (st, trace) = host
        .owner(
            Method::GET,
            &format!("/api/runs/{}", v["run_id"].as_str().unwrap()),
            Some("w"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{trace}");
    let step = trace["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "web_fetch")
        .expect("the fetch is a step of the run")
        .clone();
    assert_eq!(step["kind"], "tool");
    assert!(step["arguments"].as_str().unwrap().contains(&url), "{step}");
    assert!(
        step["output"].as_str().unwrap().contains("Cod & chips"),
        "{step}"
    );

    // The page's fetch spent 0.6 of the space's daily 1.0: another 0.6
    // would cross it, so the next fetch is refused before anything is fetched.
    let v = host.chat("w", &format!("fetch {url}")).await;
    let reply = v["reply"].as_str().unwrap();
    assert!(
        reply.contains("error: web_fetch: the space's daily cap of")
            && reply.contains("nothing was fetched"),
        "{v}"
    );
    host.stop().await;
}
