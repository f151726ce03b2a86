//! `mercury demo`: starts a real host on a temp data dir with the scripted
//! model shipped in `deploy/demo/model.json`, drives a short conversation
//! (one turn with a tool call) through the HTTP API, prints what happened and
//! exits. It is what a fresh machine can run before any model is configured.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use hyper::Method;

use crate::cli::mrctl::{request, Connection, Endpoint};

const DEMO_MODEL: &str = include_str!("../deploy/demo/model.json");

pub async fn run(keep: bool) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("mercury-demo-").tempdir()?;
    let data = dir.path().join("data");
    crate::host::init(&data, "owner").await?;
    let model = dir.path().join("model.json");
    std::fs::write(&model, DEMO_MODEL)?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let config = std::fs::read_to_string(data.join("mercury.yaml"))?
        .replace(
            "model: \"openai:gpt-4o-mini\"",
            &format!("model: \"scripted:{}\"", model.display()),
        )
        .replace(
            "bind: \"127.0.0.1:8787\"",
            &format!("bind: \"127.0.0.1:{port}\""),
        );
    std::fs::write(data.join("mercury.yaml"), config)?;
    let shutdown = CancellationToken::new();
    let host = tokio::spawn({
        let (data, shutdown) = (data.clone(), shutdown.clone());
        async move { crate::host::serve(&data, None, shutdown).await }
    });
    let token = std::fs::read_to_string(data.join("global/owner.token"))?;
    let url = format!("http://127.0.0.1:{port}");
    let mut conn = Connection {
        endpoint: Endpoint::parse_url(&url)?,
        token: Some(token.trim().to_owned()),
        space: None,
        act_as: None,
        timeout: Duration::from_secs(600),
    };
    // Wait for the host to listen.
    let mut ready = false;
    for _ in 0..100 {
        if request(&conn, Method::GET, "/api/whoami", None)
            .await
            .is_ok()
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ready {
        shutdown.cancel();
        bail!("the demo host did not start listening on {url}");
    }
    let step = |what: &str, v: &Value| {
        println!("{what}: {}", serde_json::to_string(v).unwrap_or_default())
    };
    let (st, v) = request(
        &conn,
        Method::POST,
        "/api/spaces",
        Some(json!({"id": "demo", "name": "Demo space"})),
    )
    .await?;
    if st != 201 {
        bail!("creating the demo space answered {st}: {v}");
    }
    step("space created", &v["space"]);
    conn.space = Some("demo".into());
    for text in ["hello", "please note that the demo works"] {
        println!("\nyou: {text}");
        let (st, v) = request(
            &conn,
            Method::POST,
            "/api/chat",
            Some(json!({"text": text})),
        )
        .await?;
        if st != 200 {
            bail!("chat answered {st}: {v}");
        }
        println!("mercury: {}", v["reply"].as_str().unwrap_or(""));
    }
    let note = data.join("spaces/demo/note.txt");
    let written = std::fs::read_to_string(&note)
        .with_context(|| format!("the tool call should have written {}", note.display()))?;
    println!(
        "\nthe agent's tool call wrote {}: {:?}",
        note.display(),
        written.trim()
    );
    let (_, runs) = request(&conn, Method::GET, "/api/runs", None).await?;
    for r in runs["runs"].as_array().into_iter().flatten() {
        println!(
            "run {} {} sandbox={}",
            r["id"].as_str().unwrap_or(""),
            r["status"].as_str().unwrap_or(""),
            r["container_id"].as_str().unwrap_or("none (no tool call)")
        );
    }
    shutdown.cancel();
    host.await.context("demo host task")??;
    if keep {
        let kept = dir.keep();
        println!("\ndata dir kept at {}", kept.join("data").display());
    }
    Ok(())
}
