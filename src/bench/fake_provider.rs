//! A fake OpenAI-compatible provider for the benches: `POST
//! /v1/chat/completions` on a loopback port, answering by model name after a
//! fixed latency, under a requests-per-minute and tokens-per-minute budget
//! shared by every caller, as one provider key is. Past the budget it answers
//! 429 with `retry-after-ms`, as the real APIs do.
//!
//! The budget is two token buckets (requests, tokens) refilled continuously
//! at a minute's budget per minute and holding at most one second of it, so
//! a burst over the rate is refused within the second, not after a minute.
//! Every answer states the budget as OpenAI does
//! (`x-ratelimit-{limit,remaining}-{requests,tokens}`).
//!
//! Must never: listen anywhere but 127.0.0.1, or bill a refused request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// What one model name answers, and after how long.
#[derive(Debug, Clone)]
pub(crate) struct FakeModel {
    pub latency: Duration,
    pub reply: String,
}

/// Requests and tokens a minute; 0 means no limit on that one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Budget {
    pub rpm: u64,
    pub tpm: u64,
}

/// Calls served and refused, by model name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts {
    pub served: BTreeMap<String, u64>,
    pub refused: BTreeMap<String, u64>,
}

struct Bucket {
    level: f64,
    per_second: f64,
}

impl Bucket {
    fn new(per_minute: u64) -> Self {
        let per_second = per_minute as f64 / 60.0;
        Self {
            level: per_second,
            per_second,
        }
    }

    fn refill(&mut self, seconds: f64) {
        self.level = (self.level + seconds * self.per_second).min(self.per_second);
    }

    /// Seconds until `n` is available (0 when it is now).
    fn wait_for(&self, n: f64) -> f64 {
        if self.level >= n {
            0.0
        } else {
            (n - self.level) / self.per_second.max(1e-9)
        }
    }
}

struct Shared {
    models: BTreeMap<String, FakeModel>,
    buckets: Mutex<(Instant, Option<Bucket>, Option<Bucket>)>,
    counts: Mutex<Counts>,
}

/// A running fake; stops when dropped.
pub(crate) struct FakeProvider {
    /// `http://127.0.0.1:PORT/v1`, for `providers.openai_base_url`.
    pub base_url: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeProvider {
    pub(crate) async fn start(
        models: BTreeMap<String, FakeModel>,
        budget: Budget,
    ) -> anyhow::Result<Self> {
        let bucket = |n: u64| (n > 0).then(|| Bucket::new(n));
        let shared = Arc::new(Shared {
            models,
            buckets: Mutex::new((Instant::now(), bucket(budget.rpm), bucket(budget.tpm))),
            counts: Mutex::new(Counts::default()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        tokio::spawn({
            let stop = stop.clone();
            async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await;
            }
        });
        Ok(Self {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            shared,
            stop,
        })
    }

    pub(crate) fn counts(&self) -> Counts {
        self.shared
            .counts
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }
}

/// Tokens as the bench counts them: a quarter of the characters.
fn tokens_of(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4).max(1)
}

async fn complete(State(shared): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    let Some(fake) = shared.models.get(&model).cloned() else {
        let error = json!({"error": {"message": format!("no model {model}"), "type": "invalid_request_error"}});
        return (StatusCode::NOT_FOUND, Json(error)).into_response();
    };
    let prompt: u64 = body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| tokens_of(m["content"].as_str().unwrap_or_default()))
                .sum()
        })
        .unwrap_or(1);
    let completion = tokens_of(&fake.reply);
    let (wait, stated) = {
        let Ok(mut guard) = shared.buckets.lock() else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let (last, requests, tokens) = &mut *guard;
        let elapsed = last.elapsed().as_secs_f64();
        *last = Instant::now();
        let need = (prompt + completion) as f64;
        let mut wait: f64 = 0.0;
        if let Some(b) = requests.as_mut() {
            b.refill(elapsed);
            wait = wait.max(b.wait_for(1.0));
        }
        if let Some(b) = tokens.as_mut() {
            b.refill(elapsed);
            wait = wait.max(b.wait_for(need.min(b.per_second)));
        }
        if wait == 0.0 {
            if let Some(b) = requests.as_mut() {
                b.level -= 1.0;
            }
            if let Some(b) = tokens.as_mut() {
                b.level -= need.min(b.per_second);
            }
        }
        (wait, stated_headers(requests.as_ref(), tokens.as_ref()))
    };
    if wait > 0.0 {
        if let Ok(mut c) = shared.counts.lock() {
            *c.refused.entry(model).or_default() += 1;
        }
        let error =
            json!({"error": {"message": "Rate limit reached", "type": "rate_limit_exceeded"}});
        let ms = (wait * 1000.0).ceil().max(1.0);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            stated,
            [("retry-after-ms", format!("{ms}"))],
            Json(error),
        )
            .into_response();
    }
    tokio::time::sleep(fake.latency).await;
    if let Ok(mut c) = shared.counts.lock() {
        *c.served.entry(model.clone()).or_default() += 1;
    }
    (
        stated,
        Json(json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": fake.reply}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        })),
    )
        .into_response()
}

/// The budget as OpenAI states it on every answer: each limit a minute and
/// what is left of it when the request was admitted (or refused).
fn stated_headers(requests: Option<&Bucket>, tokens: Option<&Bucket>) -> HeaderMap {
    let mut out = HeaderMap::new();
    let limits = [
        (
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            requests,
        ),
        (
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            tokens,
        ),
    ];
    for (limit, remaining, bucket) in limits {
        if let Some(b) = bucket {
            out.insert(
                limit,
                HeaderValue::from((b.per_second * 60.0).round() as u64),
            );
            out.insert(
                remaining,
                HeaderValue::from(b.level.max(0.0).floor() as u64),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_its_request_budget_it_answers_429_with_a_wait_and_bills_nothing() {
        let models = BTreeMap::from([(
            "m".to_owned(),
            FakeModel {
                latency: Duration::ZERO,
                reply: "ok".into(),
            },
        )]);
        // 120 a minute: two a second, a burst of two.
        let fake = FakeProvider::start(models, Budget { rpm: 120, tpm: 0 })
            .await
            .unwrap();
        let client = reqwest::Client::new();
        let call = || async {
            client
                .post(format!("{}/chat/completions", fake.base_url))
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap()
        };
        let mut statuses = Vec::new();
        let mut waits = Vec::new();
        for _ in 0..4 {
            let r = call().await;
            statuses.push(r.status().as_u16());
            if let Some(w) = r.headers().get("retry-after-ms") {
                waits.push(w.to_str().unwrap().parse::<f64>().unwrap());
            }
        }
        assert_eq!(&statuses[..2], &[200, 200], "{statuses:?}");
        let stated = call().await;
        assert_eq!(stated.headers()["x-ratelimit-limit-requests"], "120");
        assert_eq!(stated.headers()["x-ratelimit-remaining-requests"], "0");
        statuses.push(stated.status().as_u16());
        assert!(statuses[2..].iter().all(|s| *s == 429), "{statuses:?}");
        assert!(waits.iter().all(|w| *w > 0.0 && *w <= 500.0), "{waits:?}");
        let counts = fake.counts();
        assert_eq!(counts.served["m"], 2);
        assert_eq!(counts.refused["m"], 3);
        // After the wait it serves again.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(call().await.status().as_u16(), 200);
    }
}
