//! A real LiteLLM proxy in front of Mercury's two model clients (issue 25,
//! the LiteLLM note in docs/models.md): the proxy from PyPI (installed by
//! deploy/setup.sh), its upstream a fake Anthropic Messages server on
//! loopback. One tool-call round trip through each of the proxy's doors:
//! OpenAI chat completions (`openai:` specs) and Anthropic `/v1/messages`
//! (`anthropic:` specs).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

use crate::common::{free_port, HostOptions, TestHost};

const LITELLM: &str = "/opt/mercury/litellm-venv/bin/litellm";
const MASTER_KEY: &str = "sk-litellm-test-master";
const FINAL: &str = "I wrote hello.txt for you.";

/// The upstream: asks for one `write_file`, then answers once it sees the
/// tool's result. Every request body is kept.
async fn upstream() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = Router::new().route(
        "/v1/messages",
        post({
            let seen = seen.clone();
            move |Json(body): Json<Value>| {
                let seen = seen.clone();
                async move {
                    let answered = body["messages"]
                        .as_array()
                        .and_then(|m| m.last())
                        .and_then(|m| m["content"].as_array())
                        .is_some_and(|c| c.iter().any(|p| p["type"] == "tool_result"));
                    seen.lock().unwrap().push(body);
                    let (content, stop) = if answered {
                        (json!([{"type": "text", "text": FINAL}]), "end_turn")
                    } else {
                        (
                            json!([{"type": "tool_use", "id": "toolu_01", "name": "write_file",
                                    "input": {"path": "hello.txt", "content": "hello from the proxy"}}]),
                            "tool_use",
                        )
                    };
                    Json(json!({"id": "msg_01", "type": "message", "role": "assistant",
                        "model": "claude-fake", "content": content, "stop_reason": stop,
                        "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 6}}))
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

/// A LiteLLM proxy process, killed when dropped.
struct Proxy {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn proxy(upstream: &str) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("litellm.yaml");
    std::fs::write(
        &cfg,
        format!(
            "model_list:\n  - model_name: claude-fake\n    litellm_params:\n      model: anthropic/claude-fake\n      api_base: {upstream}\n      api_key: sk-upstream\ngeneral_settings:\n  master_key: {MASTER_KEY}\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(LITELLM)
        .args(["--config", cfg.to_str().unwrap(), "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{LITELLM} (deploy/setup.sh installs it): {e}"));
    let url = format!("http://127.0.0.1:{port}");
    let proxy = Proxy {
        child,
        url,
        _dir: dir,
    };
    let http = reqwest::Client::new();
    for _ in 0..240 {
        if let Ok(r) = http
            .get(format!("{}/health/liveliness", proxy.url))
            .send()
            .await
        {
            if r.status().is_success() {
                return proxy;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the LiteLLM proxy did not come up in 60 s");
}

async fn round_trip(model: &str, base_key: &'static str, base: String, key_var: &'static str) {
    let (up, seen) = upstream().await;
    let proxy = proxy(&up).await;
    let host = TestHost::start_process(HostOptions {
        config: vec![
            ("model", Yaml::from(model)),
            (base_key, Yaml::from(format!("{}{base}", proxy.url))),
            ("providers.max_retries", Yaml::from(0)),
        ],
        env: vec![(key_var, MASTER_KEY.to_owned())],
        ..Default::default()
    })
    .await;
    host.create_space("proxied").await;
    let v = host.chat("proxied", "please write hello.txt").await;
    assert_eq!(v["reply"], FINAL, "{model}: {v}");
    assert_eq!(
        std::fs::read_to_string(host.data.join("spaces/proxied/hello.txt")).unwrap(),
        "hello from the proxy",
        "{model}: the tool call ran"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{model}: two upstream calls: {seen:?}");
    // The tool reached the upstream as a tool, and its result came back.
    assert!(
        seen[0]["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "write_file")),
        "{model}: {}",
        seen[0]
    );
    let last = seen[1]["messages"].as_array().unwrap().last().unwrap();
    assert!(
        last["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["type"] == "tool_result" && p["tool_use_id"] == "toolu_01"),
        "{model}: {last}"
    );
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litellm_openai_chat_completions_round_trip_a_tool_call() {
    round_trip(
        "openai:claude-fake",
        "providers.openai_base_url",
        "/v1".into(),
        "MERCURY_OPENAI_API_KEY",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn litellm_anthropic_messages_round_trip_a_tool_call() {
    round_trip(
        "anthropic:claude-fake",
        "providers.anthropic_base_url",
        String::new(),
        "MERCURY_ANTHROPIC_API_KEY",
    )
    .await;
}
