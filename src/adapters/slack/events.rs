//! The Events API, Slack's alternative to Socket Mode
//! (`adapters.slack.mode: events`): Slack posts each event to the host's
//! `POST /api/adapters/slack/events`, where `crate::api` checks the request
//! with [`signature_ok`] (the signing secret's HMAC-SHA256 over
//! `v0:<timestamp>:<body>`, the timestamp within five minutes) before a byte
//! of the body is parsed, answers the `url_verification` handshake, and
//! hands every other body to [`intake`]. The 2xx goes back only once the
//! event's row is committed; Slack retries an unanswered event, and the
//! retry (the same channel and `ts`) is kept once by ingress.
//!
//! Must never: parse, store or answer a body whose signature is not the
//! signing secret's, take a request signed more than five minutes away
//! from now (a replayed one), or compare a signature in time that depends
//! on where it differs.

use std::sync::Arc;

use hmac::{KeyInit, Mac};

use super::{take, Ctx, SlackError, ADAPTER};

/// The header Slack signs every request with (`v0=<hex>`).
pub(crate) const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The header with the request's time (Unix seconds), part of what is signed.
pub(crate) const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// How far a request's timestamp may be from now, either way.
const MAX_SKEW_SECS: u64 = 300;

/// Whether `signature` (`v0=<hex>`) is the HMAC-SHA256 of
/// `v0:<timestamp>:<body>` under `signing_secret`, compared in constant
/// time, and `timestamp` is within five minutes of `now_secs`.
pub(crate) fn signature_ok(
    signing_secret: &str,
    timestamp: &[u8],
    signature: &[u8],
    body: &[u8],
    now_secs: i64,
) -> bool {
    let Some(at) = std::str::from_utf8(timestamp)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
    else {
        return false;
    };
    if now_secs
        .checked_sub(at)
        .is_none_or(|d| d.unsigned_abs() > MAX_SKEW_SECS)
    {
        return false;
    }
    let Some(hex) = signature.strip_prefix(b"v0=") else {
        return false;
    };
    let Ok(given) = base16ct::mixed::decode_vec(hex) else {
        return false;
    };
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(signing_secret.as_bytes()) else {
        return false;
    };
    mac.update(b"v0:");
    mac.update(timestamp);
    mac.update(b":");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

/// Takes the events `crate::api` passes on (signed, parsed) until the
/// adapter stops, on every host of a deployment; a store that fails
/// answers the request 503 (Slack retries) and restarts the adapter.
pub(super) async fn intake(ctx: &Arc<Ctx>, signing_secret: String) -> Result<(), SlackError> {
    let take = |body: serde_json::Value| async move { take(ctx, &body).await };
    let (board, cancel) = (&ctx.app.adapters, &ctx.cancel);
    super::super::take_webhook_calls(board, ADAPTER, signing_secret, None, cancel, take).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, ts: &str, body: &[u8]) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("v0:{ts}:").as_bytes());
        mac.update(body);
        format!(
            "v0={}",
            base16ct::lower::encode_string(&mac.finalize().into_bytes())
        )
    }

    #[test]
    fn only_a_fresh_request_signed_with_the_secret_passes() {
        let body = br#"{"type":"event_callback"}"#;
        let now = 1_700_000_000;
        let ts = now.to_string();
        let good = sign("s3cret", &ts, body);
        assert!(signature_ok(
            "s3cret",
            ts.as_bytes(),
            good.as_bytes(),
            body,
            now
        ));
        // Another secret, another body, a changed timestamp.
        assert!(!signature_ok(
            "other",
            ts.as_bytes(),
            good.as_bytes(),
            body,
            now
        ));
        assert!(!signature_ok(
            "s3cret",
            ts.as_bytes(),
            good.as_bytes(),
            b"{}",
            now
        ));
        assert!(!signature_ok(
            "s3cret",
            b"1700000001",
            good.as_bytes(),
            body,
            now
        ));
        // Signed right, but replayed six minutes later (or dated ahead).
        assert!(!signature_ok(
            "s3cret",
            ts.as_bytes(),
            good.as_bytes(),
            body,
            now + 360
        ));
        assert!(!signature_ok(
            "s3cret",
            ts.as_bytes(),
            good.as_bytes(),
            body,
            now - 360
        ));
        assert!(signature_ok(
            "s3cret",
            ts.as_bytes(),
            good.as_bytes(),
            body,
            now + 299
        ));
        // Shapes that are not a signature or a time.
        let bare = good.trim_start_matches("v0=");
        assert!(!signature_ok(
            "s3cret",
            ts.as_bytes(),
            bare.as_bytes(),
            body,
            now
        ));
        assert!(!signature_ok("s3cret", b"soon", good.as_bytes(), body, now));
        assert!(!signature_ok(
            "s3cret",
            b"-9223372036854775808",
            good.as_bytes(),
            body,
            now
        ));
        assert!(!signature_ok("s3cret", ts.as_bytes(), b"v0=zz", body, now));
    }
}
