//! The one scrubber of stored, served and logged error text: URL userinfo
//! removed, every secret this process was configured with (model keys,
//! adapter tokens, the Telegram webhook secret, a provider URL's password)
//! replaced, `Bearer …` and `Basic …` values,
//! `sk-…` keys and Telegram `bot<id>:<token>` path segments replaced, and
//! stored errors cut to [`MAX_ERROR_CHARS`].
//!
//! The secret list is process-wide: the log writer (set up by the command
//! line before any host exists) and every host of the process read the same
//! one, and the host adds its secrets to it as it reads them ([`register`]).
//! A list shared by two hosts of one process scrubs more, never less.
//!
//! Used where an error is stored (`runs.error`, run steps, adapters'
//! `last_error`), where one is served (every API error body) and by the log
//! writer. The model and storage layers below build their errors as they
//! must and never see the list.
//!
//! Must never: keep a secret anywhere but this list, return or log a secret
//! (not even in `Debug`), or drop text other than what it replaces.

use std::sync::{LazyLock, RwLock};

use regex::Regex;

/// Longest stored or served error, in characters.
pub const MAX_ERROR_CHARS: usize = 1000;
/// Configured secrets shorter than this are not listed: replacing a short
/// string everywhere would garble ordinary text and hides nothing.
pub const MIN_SECRET_CHARS: usize = 8;
/// What a removed secret reads as.
pub const REPLACEMENT: &str = "[redacted]";

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// `scheme://user:password@` (or `scheme://token@`): the userinfo goes.
static USERINFO: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@"));
/// A bearer credential, in a header dump or a sentence.
static BEARER: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"(?i)\b(bearer)(?:\s+|%20)[A-Za-z0-9._~+/=:-]{8,}"));
/// A basic credential (what a URL's `user:password@` becomes on the wire).
static BASIC: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"\b(Basic)(?:\s+|%20)[A-Za-z0-9+/]{12,}={0,2}"));
/// OpenAI/Anthropic-shaped keys (`sk-…`, `sk-ant-…`, `sk-proj-…`).
static SK_KEY: LazyLock<Regex> = LazyLock::new(|| super::constant_regex(r"\bsk-[A-Za-z0-9_-]{8,}"));
/// A Telegram Bot API path segment: `bot123456:AA…`.
static TELEGRAM_PATH: LazyLock<Regex> =
    LazyLock::new(|| super::constant_regex(r"\bbot[0-9]{3,}:[A-Za-z0-9_-]{8,}"));

/// Adds `secret` to the process's list (trimmed; ignored when shorter than
/// [`MIN_SECRET_CHARS`] or already listed).
pub fn register(secret: &str) {
    let secret = secret.trim();
    if secret.chars().count() < MIN_SECRET_CHARS {
        return;
    }
    if let Ok(mut list) = SECRETS.write() {
        if !list.iter().any(|s| s == secret) {
            list.push(secret.to_owned());
            // Longest first: a secret that contains another is replaced whole.
            list.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }
}

/// `text` with every secret and secret-shaped string replaced and URL
/// userinfo removed; nothing cut (the log's lines stay whole).
pub fn scrub(text: &str) -> String {
    let mut out = text.to_owned();
    if let Ok(list) = SECRETS.read() {
        for secret in list.iter() {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), REPLACEMENT);
            }
        }
    }
    let out = USERINFO.replace_all(&out, "${1}");
    let out = BEARER.replace_all(&out, "${1} [redacted]");
    let out = BASIC.replace_all(&out, "${1} [redacted]");
    let out = SK_KEY.replace_all(&out, REPLACEMENT);
    let out = TELEGRAM_PATH.replace_all(&out, "bot[redacted]");
    out.into_owned()
}

/// [`scrub`], then cut to [`MAX_ERROR_CHARS`]: what an error is stored,
/// shown and served as.
pub fn scrub_error(text: &str) -> String {
    let clean = scrub(text);
    match clean.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}… (cut)", &clean[..cut]),
        None => clean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_secrets_shapes_and_userinfo_are_scrubbed() {
        register("local-proxy-key-0123456789");
        register("short");
        let text = "model endpoint answered 401: auth: bad header \
            Authorization: Bearer abc.DEF-ghi_jkl0123, Basic YWxpY2U6aHVudGVyMnBhc3M= and key local-proxy-key-0123456789, \
            x-api-key: sk-ant-api03-AAAAAAAAAAAA at https://alice:hunter2pass@proxy.example/v1 \
            and http://tok3n@h.example/x, GET /bot123456:ABCdef_ghiJKL/getMe, short";
        let out = scrub(text);
        for gone in [
            "abc.DEF-ghi_jkl0123",
            "YWxpY2U6aHVudGVyMnBhc3M",
            "local-proxy-key-0123456789",
            "sk-ant-api03",
            "alice",
            "hunter2pass",
            "tok3n",
            "ABCdef_ghiJKL",
        ] {
            assert!(!out.contains(gone), "{gone} left in {out}");
        }
        for kept in [
            "model endpoint answered 401",
            "https://proxy.example/v1",
            "http://h.example/x",
            "Bearer [redacted]",
            "/bot[redacted]/getMe",
            "short",
        ] {
            assert!(out.contains(kept), "{kept} missing from {out}");
        }
    }

    #[test]
    fn stored_errors_are_cut_and_plain_text_is_left_alone() {
        let long = "x".repeat(MAX_ERROR_CHARS * 3);
        let out = scrub_error(&long);
        assert!(out.chars().count() <= MAX_ERROR_CHARS + 10, "{}", out.len());
        assert!(out.ends_with("(cut)"));
        let plain = "telegram bot connected; basic auth off; the turn timed out after 30s; see https://example.org/docs#x (user@example.org)";
        assert_eq!(scrub_error(plain), plain);
    }
}
