//! `mercury demo`: starts a real host on a temp data dir with the scripted
//! model shipped in `deploy/demo/model.json`, drives a short conversation
//! (one turn with a tool call) through the HTTP API, prints what happened and
//! exits. It is what a fresh machine can run before any model is configured.

use anyhow::{bail, Context};
use hyper::Method;
use serde_json::json;

use crate::host::temp_host::TempHost;

const DEMO_MODEL: &str = include_str!("../../deploy/demo/model.json");

pub async fn run(keep: bool) -> anyhow::Result<()> {
    let host = TempHost::start(DEMO_MODEL, "auto").await?;
    let conn = host.connection(None);
    let v = host
        .ok(
            &conn,
            Method::POST,
            "/api/spaces",
            Some(json!({"id": "demo", "name": "Demo space"})),
        )
        .await?;
    println!("space created: {}", v["space"]);
    let conn = host.connection(Some("demo"));
    for text in ["hello", "please note that the demo works"] {
        println!("\nyou: {text}");
        let v = host
            .ok(
                &conn,
                Method::POST,
                "/api/chat",
                Some(json!({"text": text})),
            )
            .await?;
        if v["status"] != "done" {
            bail!("the turn ended with status {}: {v}", v["status"]);
        }
        println!("mercury: {}", v["reply"].as_str().unwrap_or(""));
    }
    let note = host.data.join("spaces/demo/note.txt");
    let written = std::fs::read_to_string(&note)
        .with_context(|| format!("the tool call should have written {}", note.display()))?;
    println!(
        "\nthe agent's tool call wrote {}: {:?}",
        note.display(),
        written.trim()
    );
    let runs = host.ok(&conn, Method::GET, "/api/runs", None).await?;
    for r in runs["runs"].as_array().into_iter().flatten() {
        println!(
            "run {} {} sandbox={}",
            r["id"].as_str().unwrap_or(""),
            r["status"].as_str().unwrap_or(""),
            r["container_id"].as_str().unwrap_or("none (no tool call)")
        );
    }
    if keep {
        let data = host.stop_and_keep().await?;
        println!("\ndata dir kept at {}", data.display());
    } else {
        host.stop().await?;
    }
    Ok(())
}
