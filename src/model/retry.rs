//! The retry policy shared by the HTTP providers (OpenAI-compatible and
//! Anthropic): which answers are worth another attempt, how long to wait
//! before it, and the send loop that applies both.
//!
//! Must never: retry without bound, wait longer than `retry_after_cap` for a
//! single step (whatever a server's `Retry-After` says), or retry an answer
//! that will not change (a 4xx other than 429).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, RETRY_AFTER};

use super::gate::{BudgetFamily, StatedBudget, StatedLimit};
use super::{ModelError, ProviderSettings};

/// Statuses that mean "try again later": rate limits, overload (Anthropic's
/// 529) and the gateway-style 5xx answers that are usually transient.
const RETRYABLE_STATUSES: [u16; 6] = [429, 500, 502, 503, 504, 529];

/// Longest body excerpt kept in an error message; enough to read the
/// provider's complaint without dumping a whole HTML error page.
const ERROR_BODY_LIMIT: usize = 500;

#[derive(Clone, Debug)]
pub(super) struct RetryPolicy {
    pub max_retries: u32,
    pub base: Duration,
    pub cap: Duration,
    /// Told of every rate-limit or overload answer (429, 529), retried or
    /// not: the model gate slows background calls on it.
    pub throttles: super::gate::ThrottleSignal,
}

impl RetryPolicy {
    pub(super) fn from_settings(settings: &ProviderSettings) -> Self {
        Self {
            max_retries: settings.max_retries,
            base: settings.retry_base,
            cap: settings.retry_after_cap,
            throttles: settings.throttles.clone(),
        }
    }
}

pub(super) fn is_retryable_status(status: u16) -> bool {
    RETRYABLE_STATUSES.contains(&status)
}

/// How long to wait before retry number `attempt` (0 for the first retry).
///
/// A server's `retry_after` is honoured as given, but never beyond `cap`.
/// Otherwise the backoff is `base * 2^attempt` (itself capped) with full
/// jitter: a uniform pick in `[0, backoff]` taken from `random`, so that many
/// clients throttled at once do not come back in lock-step.
pub(super) fn wait_before_retry(
    attempt: u32,
    base: Duration,
    cap: Duration,
    retry_after: Option<Duration>,
    random: u64,
) -> Duration {
    if let Some(asked) = retry_after {
        return asked.min(cap);
    }
    let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
    let backoff = base.checked_mul(factor).unwrap_or(Duration::MAX).min(cap);
    let span = backoff.as_nanos().min(u128::from(u64::MAX));
    let picked = u128::from(random) % (span + 1);
    // `picked <= span <= u64::MAX`, so the conversion cannot fail.
    Duration::from_nanos(u64::try_from(picked).unwrap_or(u64::MAX))
}

/// Reads the server's wish from the headers: OpenAI's `retry-after-ms`
/// (finer grained) when present, else the standard `Retry-After`.
pub(super) fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let millis = header_number(headers, "retry-after-ms")
        .map(|ms| Duration::from_secs_f64((ms / 1000.0).min(u32::MAX as f64)));
    millis.or_else(|| {
        headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now))
    })
}

/// A header's value as a finite, non-negative number; anything else is
/// as if the header were absent.
fn header_number(headers: &HeaderMap, name: &str) -> Option<f64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|n| n.is_finite() && *n >= 0.0)
}

/// The rate-limit budget a provider states in an answer's headers, when it
/// states one: OpenAI's `x-ratelimit-{limit,remaining}-{requests,tokens}`
/// or Anthropic's `anthropic-ratelimit-{requests,tokens}-{limit,remaining}`.
/// Both document their limits as a minute's worth. A value that is not a
/// finite non-negative number is ignored, as is a limit of zero.
pub(super) fn stated_budget_from_headers(headers: &HeaderMap) -> Option<StatedBudget> {
    let number = |name: &str| header_number(headers, name);
    let limit = |limit: &str, remaining: &str| match (number(limit), number(remaining)) {
        (Some(per_minute), Some(remaining)) if per_minute > 0.0 => Some(StatedLimit {
            per_minute,
            remaining: remaining.min(per_minute),
        }),
        _ => None,
    };
    let families = [
        (
            BudgetFamily::OpenAi,
            limit(
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
            ),
            limit("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"),
        ),
        (
            BudgetFamily::Anthropic,
            limit(
                "anthropic-ratelimit-requests-limit",
                "anthropic-ratelimit-requests-remaining",
            ),
            limit(
                "anthropic-ratelimit-tokens-limit",
                "anthropic-ratelimit-tokens-remaining",
            ),
        ),
    ];
    families
        .into_iter()
        .find(|(_, requests, tokens)| requests.is_some() || tokens.is_some())
        .map(|(family, requests, tokens)| StatedBudget {
            family,
            requests,
            tokens,
            at: Instant::now(),
        })
}

/// Parses a `Retry-After` value: delay-seconds or an IMF-fixdate
/// (`Sun, 06 Nov 1994 08:49:37 GMT`). A date in the past means "now".
pub(super) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // An absurdly long number still means "wait a long time"; the cap
        // then decides.
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let at = parse_imf_fixdate(value)?;
    let now_secs = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now_secs)))
}

/// Seconds since the Unix epoch for an IMF-fixdate, the only date form
/// HTTP/1.1 senders may generate.
fn parse_imf_fixdate(value: &str) -> Option<u64> {
    let parts: Vec<&str> = value.split_ascii_whitespace().collect();
    let [_weekday, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u64 = day.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as u64
        + 1;
    let year: u64 = year.parse().ok()?;
    let mut hms = time.split(':').map(|p| p.parse::<u64>().ok());
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some() || !(1..=31).contains(&day) || year < 1970 || h > 23 || m > 59 || s > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3_600 + m * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (year >= 1970),
/// after Howard Hinnant's civil-calendar algorithm.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).saturating_sub(719_468)
}

/// A process-wide xorshift64 stream. Jitter needs spread between concurrent
/// callers, not unpredictability, so a clock-seeded generator is enough.
fn next_random() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let step = |mut x: u64| {
        if x == 0 {
            x = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x9E37_79B9_7F4A_7C15)
                | 1;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // The last run of the closure is the one that was stored, so its output
    // is this caller's own draw (re-stepping the old value could re-seed
    // from a different clock reading).
    let mut drawn = 0;
    let _ = STATE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| {
        drawn = step(x);
        Some(drawn)
    });
    drawn
}

/// Cuts `text` to at most `limit` characters, on a character boundary.
pub(super) fn excerpt(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The provider's own complaint from an error body: both OpenAI and
/// Anthropic send `{"error": {"type": .., "message": ..}}`; anything else is
/// shown as a short excerpt of the raw body.
pub(super) fn error_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str());
    match (
        error.and_then(|e| e.get("type")).and_then(|t| t.as_str()),
        message,
    ) {
        (Some(kind), Some(message)) => excerpt(&format!("{kind}: {message}"), ERROR_BODY_LIMIT),
        (None, Some(message)) => excerpt(message, ERROR_BODY_LIMIT),
        _ if body.trim().is_empty() => "(empty body)".to_string(),
        _ => excerpt(body.trim(), ERROR_BODY_LIMIT),
    }
}

/// Describes a reqwest error with its whole source chain: the top-level
/// message alone ("error sending request") hides the actual cause.
fn describe_transport(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Sends the request `build` makes, retrying per `policy`, and returns the
/// body of the first successful (2xx) answer.
///
/// `build` is called once per attempt because a sent request is consumed.
/// `what` names the endpoint in logs and error messages.
pub(super) async fn send_with_retry(
    policy: &RetryPolicy,
    what: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<String, ModelError> {
    send_with_retry_reading(policy, what, build, |response| async move {
        match response.text().await {
            Ok(body) => BodyRead::Done(body),
            Err(err) => BodyRead::Broken(format!("body unreadable: {}", describe_transport(&err))),
        }
    })
    .await
}

/// What reading a successful answer's body came to.
pub(super) enum BodyRead<T> {
    Done(T),
    /// The connection broke mid-body: as transient as a failed connect.
    Broken(String),
    /// The body says something that another attempt will not change.
    Refused(ModelError),
}

/// [`send_with_retry`] with the successful answer's body read by `read` (a
/// streaming call reads it piece by piece): a body that breaks off is
/// retried like a failed connection, a body `read` refuses is not.
pub(super) async fn send_with_retry_reading<T, Read, Fut>(
    policy: &RetryPolicy,
    what: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
    read: Read,
) -> Result<T, ModelError>
where
    Read: Fn(reqwest::Response) -> Fut,
    Fut: std::future::Future<Output = BodyRead<T>>,
{
    let mut attempt: u32 = 0;
    loop {
        let (last, retry_after) = match build().send().await {
            Err(err) => (format!("{what}: {}", describe_transport(&err)), None),
            Ok(response) => {
                let status = response.status().as_u16();
                if matches!(status, 429 | 529) {
                    policy.throttles.note();
                }
                if let Some(stated) = stated_budget_from_headers(response.headers()) {
                    policy.throttles.note_stated(stated);
                }
                let retry_after = retry_after_from_headers(response.headers(), SystemTime::now());
                if (200..300).contains(&status) {
                    match read(response).await {
                        BodyRead::Done(v) => return Ok(v),
                        BodyRead::Refused(e) => return Err(e),
                        BodyRead::Broken(why) => (format!("{what}: HTTP {status}, {why}"), None),
                    }
                } else {
                    match response.text().await {
                        Ok(body) if !is_retryable_status(status) => {
                            return Err(ModelError::Http {
                                status,
                                message: format!("{what}: {}", error_message(&body)),
                            });
                        }
                        Ok(body) => (
                            format!("{what}: HTTP {status}: {}", error_message(&body)),
                            retry_after,
                        ),
                        Err(err) => (
                            format!(
                                "{what}: HTTP {status}, body unreadable: {}",
                                describe_transport(&err)
                            ),
                            None,
                        ),
                    }
                }
            }
        };
        if attempt >= policy.max_retries {
            return Err(ModelError::RetriesExhausted {
                attempts: attempt + 1,
                last,
            });
        }
        let wait = wait_before_retry(attempt, policy.base, policy.cap, retry_after, next_random());
        tracing::warn!(
            attempt = attempt + 1,
            max_retries = policy.max_retries,
            wait_ms = wait.as_millis() as u64,
            error = %last,
            "model call failed; retrying"
        );
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// A streamed answer being put together from its events' data.
pub(super) trait StreamedAnswer: Default + Send {
    /// Takes one event's data, telling `sink` the text so far when it grew;
    /// `Ok(true)` at the stream's end marker; `Err((retry, why))` to stop.
    fn take(&mut self, data: &str, sink: &super::TextSink) -> Result<bool, (bool, String)>;
}

/// A streaming call: the request `build` makes, retried per `policy`; each
/// attempt's event stream read into a fresh `A` (so a retried attempt's
/// text starts again from nothing).
pub(super) async fn stream_with_retry<A: StreamedAnswer>(
    policy: &RetryPolicy,
    what: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
    sink: &super::TextSink,
) -> Result<A, ModelError> {
    send_with_retry_reading(policy, what, build, |response| async move {
        let mut acc = A::default();
        match read_events(response, |e| acc.take(&e.data, sink)).await {
            BodyRead::Done(()) => BodyRead::Done(acc),
            BodyRead::Broken(why) => BodyRead::Broken(why),
            BodyRead::Refused(e) => BodyRead::Refused(e),
        }
    })
    .await
}

/// Reads an event-stream body, handing each event to `take` as it comes:
/// `take` answers `Ok(true)` once the stream's own end marker came. A body
/// that breaks off is [`BodyRead::Broken`]; an event `take` refuses is
/// [`BodyRead::Refused`] unless it said to retry (`Err((true, why))`).
pub(super) async fn read_events(
    mut response: reqwest::Response,
    mut take: impl FnMut(super::sse::Event) -> Result<bool, (bool, String)>,
) -> BodyRead<()> {
    let mut decoder = super::sse::Decoder::default();
    let mut handle = |events: Vec<super::sse::Event>| -> Option<BodyRead<()>> {
        for event in events {
            match take(event) {
                Ok(true) => return Some(BodyRead::Done(())),
                Ok(false) => {}
                Err((true, why)) => return Some(BodyRead::Broken(why)),
                Err((false, why)) => return Some(BodyRead::Refused(ModelError::Protocol(why))),
            }
        }
        None
    };
    loop {
        match response.chunk().await {
            Ok(Some(bytes)) => {
                let events = match decoder.push(&bytes) {
                    Ok(e) => e,
                    Err(why) => return BodyRead::Refused(ModelError::Protocol(why)),
                };
                if let Some(end) = handle(events) {
                    return end;
                }
            }
            Ok(None) => {
                if let Some(end) = handle(decoder.finish().into_iter().collect()) {
                    return end;
                }
                return BodyRead::Broken("the event stream ended before its last event".into());
            }
            Err(err) => {
                return BodyRead::Broken(format!(
                    "the event stream broke off: {}",
                    describe_transport(&err)
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_stated_budget_is_read_from_either_familys_headers() {
        let mut h = HeaderMap::new();
        assert_eq!(stated_budget_from_headers(&h), None);
        h.insert("x-ratelimit-limit-requests", "3600".parse().unwrap());
        h.insert("x-ratelimit-remaining-requests", "59".parse().unwrap());
        h.insert("x-ratelimit-limit-tokens", "NaN".parse().unwrap());
        h.insert("x-ratelimit-remaining-tokens", "10".parse().unwrap());
        let openai = stated_budget_from_headers(&h).unwrap();
        assert_eq!(openai.family, BudgetFamily::OpenAi);
        assert_eq!(
            openai.requests,
            Some(StatedLimit {
                per_minute: 3600.0,
                remaining: 59.0
            })
        );
        assert_eq!(
            openai.tokens, None,
            "a limit that is not a number is ignored"
        );

        let mut h = HeaderMap::new();
        h.insert("anthropic-ratelimit-requests-limit", "0".parse().unwrap());
        h.insert(
            "anthropic-ratelimit-requests-remaining",
            "0".parse().unwrap(),
        );
        assert_eq!(
            stated_budget_from_headers(&h),
            None,
            "a limit of zero states nothing"
        );
        h.insert("anthropic-ratelimit-tokens-limit", "80000".parse().unwrap());
        h.insert(
            "anthropic-ratelimit-tokens-remaining",
            "99999".parse().unwrap(),
        );
        let anthropic = stated_budget_from_headers(&h).unwrap();
        assert_eq!(anthropic.family, BudgetFamily::Anthropic);
        assert_eq!(anthropic.requests, None);
        assert_eq!(
            anthropic.tokens,
            Some(StatedLimit {
                per_minute: 80000.0,
                remaining: 80000.0
            }),
            "what is left is never more than the limit"
        );
    }

    #[test]
    fn retry_after_is_capped() {
        let cap = Duration::from_secs(30);
        let wait = wait_before_retry(0, MS, cap, Some(Duration::from_secs(3_600)), 7);
        assert_eq!(wait, cap);
        let wait = wait_before_retry(0, MS, cap, Some(Duration::from_secs(2)), 7);
        assert_eq!(wait, Duration::from_secs(2));
    }

    #[test]
    fn jitter_stays_within_backoff() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(60);
        for attempt in 0..5u32 {
            let backoff = base * 2u32.pow(attempt);
            for random in [0, 1, 12_345, u64::MAX / 3, u64::MAX - 1, u64::MAX] {
                let wait = wait_before_retry(attempt, base, cap, None, random);
                assert!(wait <= backoff, "attempt {attempt}: {wait:?} > {backoff:?}");
            }
            // Both ends of the range are reachable.
            assert_eq!(
                wait_before_retry(attempt, base, cap, None, 0),
                Duration::ZERO
            );
            let top = backoff.as_nanos() as u64;
            assert_eq!(wait_before_retry(attempt, base, cap, None, top), backoff);
        }
    }

    #[test]
    fn backoff_is_capped_even_for_huge_attempts() {
        let cap = Duration::from_secs(30);
        for attempt in [20, 31, 32, 64, u32::MAX] {
            let wait = wait_before_retry(attempt, Duration::from_secs(1), cap, None, u64::MAX);
            assert!(wait <= cap, "attempt {attempt}: {wait:?}");
        }
    }

    #[test]
    fn random_stream_varies() {
        let picks: std::collections::HashSet<u64> = (0..32).map(|_| next_random()).collect();
        assert!(picks.len() > 30);
    }

    #[test]
    fn parses_retry_after_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
        assert_eq!(parse_retry_after("", now), None);
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(parse_imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_imf_fixdate("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(951_825_600)
        );
    }

    #[test]
    fn retry_after_ms_header_wins() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "5".parse().unwrap());
        assert_eq!(
            retry_after_from_headers(&headers, SystemTime::now()),
            Some(Duration::from_secs(5))
        );
        headers.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(
            retry_after_from_headers(&headers, SystemTime::now()),
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn retryable_statuses() {
        for status in [429, 500, 502, 503, 504, 529] {
            assert!(is_retryable_status(status), "{status}");
        }
        for status in [200, 400, 401, 403, 404, 408, 413, 422, 501] {
            assert!(!is_retryable_status(status), "{status}");
        }
    }

    #[test]
    fn error_messages_prefer_the_provider_text() {
        let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: required"}}"#;
        assert_eq!(
            error_message(body),
            "invalid_request_error: max_tokens: required"
        );
        assert_eq!(
            error_message(r#"{"error":{"message":"slow down"}}"#),
            "slow down"
        );
        assert_eq!(error_message("  "), "(empty body)");
        let long = "x".repeat(2_000);
        assert_eq!(error_message(&long).chars().count(), ERROR_BODY_LIMIT + 1);
    }

    #[tokio::test]
    async fn transport_errors_are_retried_then_exhausted() {
        // A port that was just free: connecting to it is refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let client = reqwest::Client::new();
        let policy = RetryPolicy {
            max_retries: 2,
            base: MS,
            cap: Duration::from_secs(1),
            throttles: Default::default(),
        };
        let url = format!("http://{addr}/nothing");
        let err = send_with_retry(&policy, "test endpoint", || client.get(&url))
            .await
            .unwrap_err();
        match err {
            ModelError::RetriesExhausted { attempts, last } => {
                assert_eq!(attempts, 3);
                assert!(last.starts_with("test endpoint: "), "{last}");
            }
            other => panic!("unexpected error: {other:?}"),
        }
    }
}
