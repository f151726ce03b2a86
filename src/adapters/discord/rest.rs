//! Discord's REST API, the calls the adapter makes (`GET /users/@me`,
//! `POST /channels/{id}/messages`, `PATCH /channels/{id}/messages/{id}` for
//! a streamed reply, `GET /channels/{id}/messages` to backfill,
//! `POST /channels/{id}/typing`), over our reqwest, within Discord's rate
//! limits:
//!
//! - per route: each route (its path, channel id included: Discord's major
//!   parameter) remembers `X-RateLimit-Remaining` and
//!   `X-RateLimit-Reset-After`, and a call on an exhausted route waits for
//!   the reset;
//! - global: at most 50 calls a second from this bot, and a 429 with
//!   `global: true` (or `X-RateLimit-Scope: global`) pauses every route for
//!   its `retry_after`;
//! - a 429 is waited out and the same call sent again, at most
//!   [`MAX_429`] times.
//!
//! Must never: put the bot token in an error, a log or a status (it is only
//! ever an `Authorization` header), or keep a platform's error body beyond a
//! short message (it may quote people's text).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::convert::{BotSelf, RawUser};

/// How many 429s one call waits out before it gives up.
pub(crate) const MAX_429: u32 = 5;
/// The longest pause a 429 may ask for that is waited in one go.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);

/// How a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestError {
    /// Discord answered with an error (a missing channel, no permission, a
    /// bad token): sending the same call again would not help.
    #[error("{status} {message}")]
    Api { status: u16, message: String },
    /// No usable answer (connection, timeout, an unreadable body), or 429s
    /// beyond [`MAX_429`].
    #[error("{0}")]
    Transport(String),
    #[error("stopping")]
    Cancelled,
}

/// One route's bucket as Discord last described it.
#[derive(Debug, Clone, Copy)]
struct RouteLimit {
    remaining: u32,
    reset_at: Instant,
}

#[derive(Debug, Default)]
struct Limits {
    global_until: Option<Instant>,
    routes: HashMap<String, RouteLimit>,
}

impl Limits {
    /// How long a call on `route` must wait now.
    fn wait_for(&self, route: &str, now: Instant) -> Duration {
        let global = self
            .global_until
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now));
        let route = self
            .routes
            .get(route)
            .filter(|r| r.remaining == 0)
            .map_or(Duration::ZERO, |r| {
                r.reset_at.saturating_duration_since(now)
            });
        global.max(route)
    }
}

fn header_f64(h: &reqwest::header::HeaderMap, name: &str) -> Option<f64> {
    h.get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

fn secs(v: f64) -> Duration {
    Duration::try_from_secs_f64(v)
        .unwrap_or(RETRY_AFTER_CAP)
        .min(RETRY_AFTER_CAP)
}

/// A short, single-line message from an error body.
fn short(message: &str) -> String {
    let one_line: String = message
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    one_line
}

pub(crate) struct DiscordRest {
    http: reqwest::Client,
    /// `https://discord.com/api/v10`, no trailing slash.
    base: String,
    auth: String,
    limits: Mutex<Limits>,
    global: DefaultDirectRateLimiter,
}

impl DiscordRest {
    pub(crate) fn new(base: &str, token: &str) -> Result<Self, RestError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .user_agent(concat!(
                "DiscordBot (https://mercury.invalid, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ))
            .build()
            .map_err(|e| RestError::Transport(e.without_url().to_string()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            auth: format!("Bot {token}"),
            limits: Mutex::new(Limits::default()),
            global: DefaultDirectRateLimiter::direct(Quota::per_second(
                NonZeroU32::new(50).unwrap_or(NonZeroU32::MIN),
            )),
        })
    }

    fn wait_for(&self, route: &str) -> Duration {
        self.limits
            .lock()
            .map(|l| l.wait_for(route, Instant::now()))
            .unwrap_or_default()
    }

    fn note(&self, f: impl FnOnce(&mut Limits)) {
        if let Ok(mut l) = self.limits.lock() {
            f(&mut l);
        }
    }

    /// Sends one call on `path` (`/channels/1/messages`), waiting out the
    /// route's and the global limits first and every 429 after.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        cancel: &CancellationToken,
    ) -> Result<Value, RestError> {
        let payload = body.map_or(Payload::Empty, Payload::Json);
        self.send(method, path, payload, cancel).await
    }

    /// [`Self::call`] with a `multipart/form-data` body (`content_type`
    /// with its boundary): a message carrying a file.
    pub(crate) async fn call_form(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: &[u8],
        cancel: &CancellationToken,
    ) -> Result<Value, RestError> {
        let payload = Payload::Form { content_type, body };
        self.send(method, path, payload, cancel).await
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        payload: Payload<'_>,
        cancel: &CancellationToken,
    ) -> Result<Value, RestError> {
        // The query is no part of the route: every page of a listing shares one bucket.
        let route = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let mut throttled = 0;
        loop {
            let wait = self.wait_for(&route);
            if !wait.is_zero() && !crate::adapters::pause(cancel, wait).await {
                return Err(RestError::Cancelled);
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(RestError::Cancelled),
                _ = self.global.until_ready() => {}
            }
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .header(reqwest::header::AUTHORIZATION, &self.auth);
            match payload {
                Payload::Empty => {}
                Payload::Json(b) => req = req.json(b),
                Payload::Form { content_type, body } => {
                    req = req
                        .header(reqwest::header::CONTENT_TYPE, content_type)
                        .body(body.to_vec());
                }
            }
            let sent = tokio::select! {
                _ = cancel.cancelled() => return Err(RestError::Cancelled),
                r = req.send() => r,
            };
            let res = sent.map_err(|e| RestError::Transport(e.without_url().to_string()))?;
            let status = res.status();
            let headers = res.headers().clone();
            let now = Instant::now();
            if let (Some(remaining), Some(reset)) = (
                header_f64(&headers, "x-ratelimit-remaining"),
                header_f64(&headers, "x-ratelimit-reset-after"),
            ) {
                // Whole numbers from Discord; anything else is read down.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let remaining = remaining.min(f64::from(u32::MAX)) as u32;
                self.note(|l| {
                    l.routes.insert(
                        route.clone(),
                        RouteLimit {
                            remaining,
                            reset_at: now + secs(reset),
                        },
                    );
                });
            }
            let text = res
                .text()
                .await
                .map_err(|e| RestError::Transport(e.without_url().to_string()))?;
            let json: Value = if text.trim().is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).unwrap_or(Value::Null)
            };
            if status == StatusCode::TOO_MANY_REQUESTS {
                throttled += 1;
                let after = json["retry_after"]
                    .as_f64()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .or_else(|| header_f64(&headers, "retry-after"))
                    .map_or(Duration::from_secs(1), secs);
                let global = json["global"].as_bool() == Some(true)
                    || headers
                        .get("x-ratelimit-global")
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
                    || headers
                        .get("x-ratelimit-scope")
                        .is_some_and(|v| v.as_bytes() == b"global");
                tracing::info!(route = %route, global, wait_ms = after.as_millis(), "discord asked to wait");
                self.note(|l| {
                    if global {
                        l.global_until = Some(now + after);
                    } else {
                        l.routes.insert(
                            route.clone(),
                            RouteLimit {
                                remaining: 0,
                                reset_at: now + after,
                            },
                        );
                    }
                });
                if throttled > MAX_429 {
                    return Err(RestError::Transport(format!(
                        "still rate limited after {MAX_429} waits"
                    )));
                }
                continue;
            }
            if !status.is_success() {
                let message = json["message"]
                    .as_str()
                    .map(short)
                    .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_owned());
                return Err(RestError::Api {
                    status: status.as_u16(),
                    message,
                });
            }
            if json.is_null() && status != StatusCode::NO_CONTENT && !text.trim().is_empty() {
                return Err(RestError::Transport("an answer Mercury cannot read".into()));
            }
            return Ok(json);
        }
    }

    /// The bot's own user.
    pub(crate) async fn current_user(
        &self,
        cancel: &CancellationToken,
    ) -> Result<BotSelf, RestError> {
        let v = self.call(Method::GET, "/users/@me", None, cancel).await?;
        let u: RawUser = serde_json::from_value(v)
            .map_err(|e| RestError::Transport(format!("an answer Mercury cannot read: {e}")))?;
        Ok(BotSelf {
            id: u.id,
            username: u.username,
        })
    }
}

/// A call's body.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Empty,
    Json(&'a Value),
    Form {
        content_type: &'a str,
        body: &'a [u8],
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exhausted_route_or_a_global_pause_is_waited_for() {
        let now = Instant::now();
        let mut l = Limits::default();
        assert_eq!(l.wait_for("POST /channels/1/messages", now), Duration::ZERO);
        l.routes.insert(
            "POST /channels/1/messages".into(),
            RouteLimit {
                remaining: 0,
                reset_at: now + Duration::from_millis(700),
            },
        );
        l.routes.insert(
            "POST /channels/2/messages".into(),
            RouteLimit {
                remaining: 3,
                reset_at: now + Duration::from_secs(5),
            },
        );
        assert_eq!(
            l.wait_for("POST /channels/1/messages", now),
            Duration::from_millis(700)
        );
        // Another channel is another bucket, and it has calls left.
        assert_eq!(l.wait_for("POST /channels/2/messages", now), Duration::ZERO);
        l.global_until = Some(now + Duration::from_secs(2));
        assert_eq!(
            l.wait_for("POST /channels/2/messages", now),
            Duration::from_secs(2)
        );
        assert_eq!(
            l.wait_for("POST /channels/1/messages", now + Duration::from_secs(3)),
            Duration::ZERO
        );
    }

    #[test]
    fn odd_retry_values_are_bounded() {
        assert_eq!(secs(0.25), Duration::from_millis(250));
        assert_eq!(secs(1e12), RETRY_AFTER_CAP);
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("retry-after", "NaN".parse().unwrap());
        h.insert("x-ratelimit-reset-after", "-3".parse().unwrap());
        assert_eq!(header_f64(&h, "retry-after"), None);
        assert_eq!(header_f64(&h, "x-ratelimit-reset-after"), None);
        assert_eq!(short("line\nbreak"), "linebreak");
    }
}
