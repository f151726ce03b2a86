//! The write guard of `ask` turns (D-016): a read-only run token may read, but
//! every write it attempts is refused with 403 and recorded as "would have …"
//! for the holder to see. Nothing reaches a handler, so nothing is written.

use axum::body::to_bytes;
use axum::extract::{MatchedPath, Request};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::auth::Auth;
use super::error::ApiError;
use crate::app::App;
use crate::runtime::AskRefusal;

pub(super) async fn refuse(app: &App, auth: &Auth, req: Request) -> Response {
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let concrete = req.uri().path().to_owned();
    let bytes = to_bytes(req.into_body(), app.rt.settings.http.body_limit_bytes)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let summary = match (method.as_str(), concrete.strip_prefix("/api/files/")) {
        // The file's name is in the path, not the body.
        ("PUT", Some(file)) | ("DELETE", Some(file)) => would_have_file(&method, file, &body),
        _ => would_have(&method, &route, &body),
    };
    if let Some(run) = &auth.caller.run_id {
        app.rt.record_refusal(
            run,
            AskRefusal {
                method: method.clone(),
                route: route.clone(),
                summary: summary.clone(),
            },
        );
    }
    ApiError::forbidden(format!(
        "refused: this turn is an ask on a throwaway copy and may not change anything; recorded: {summary}"
    ))
    .into_response()
}

/// "would have written knowledge/a.md (12 bytes)" / "would have deleted …".
fn would_have_file(method: &str, encoded: &str, body: &Value) -> String {
    let path = percent_encoding::percent_decode_str(encoded).decode_utf8_lossy();
    if method == "DELETE" {
        format!("would have deleted the file {path}")
    } else {
        let size = body
            .get("content")
            .and_then(Value::as_str)
            .map_or(0, str::len);
        format!("would have written the file {path} ({size} bytes)")
    }
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("?")
}

/// A sentence a person reads: what the write would have done.
pub(super) fn would_have(method: &str, route: &str, body: &Value) -> String {
    match (method, route) {
        ("POST", "/api/send") => format!("would have sent \"{}\"", s(body, "text")),
        ("PUT", "/api/prefs") => format!(
            "would have set preference {} to \"{}\"",
            s(body, "key"),
            s(body, "value")
        ),
        ("PUT", "/api/config") => format!(
            "would have set config {} to \"{}\"",
            s(body, "key"),
            s(body, "value")
        ),
        ("POST", "/api/tasks") => {
            let when = body
                .get("cron")
                .and_then(Value::as_str)
                .map(|c| format!("cron {c}"))
                .or_else(|| {
                    body.get("at")
                        .and_then(Value::as_str)
                        .map(|a| format!("at {a}"))
                })
                .unwrap_or_else(|| "?".into());
            format!(
                "would have created a task ({when}): \"{}\"",
                s(body, "prompt")
            )
        }
        ("POST", "/api/chat") => format!("would have started a turn with \"{}\"", s(body, "text")),
        ("POST", "/api/roles") => format!(
            "would have granted {} the role {}",
            s(body, "caller_id"),
            s(body, "role")
        ),
        ("PUT", "/api/model") => format!(
            "would have set the model chain to {}",
            body.get("chain").cloned().unwrap_or_default()
        ),
        ("POST", "/api/mutes") => format!("would have muted {}", s(body, "caller_id")),
        ("POST", r) if r.starts_with("/api/control/") => format!(
            "would have run control {}",
            r.trim_start_matches("/api/control/")
        ),
        _ => format!("would have called {method} {route}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refusals_read_as_sentences() {
        assert_eq!(
            would_have("POST", "/api/send", &json!({"text": "hi"})),
            "would have sent \"hi\""
        );
        assert_eq!(
            would_have(
                "PUT",
                "/api/prefs",
                &json!({"key": "tone", "value": "warm"})
            ),
            "would have set preference tone to \"warm\""
        );
        assert_eq!(
            would_have(
                "POST",
                "/api/tasks",
                &json!({"cron": "0 9 * * *", "prompt": "p"})
            ),
            "would have created a task (cron 0 9 * * *): \"p\""
        );
        assert_eq!(
            would_have("DELETE", "/api/tasks/{id}", &Value::Null),
            "would have called DELETE /api/tasks/{id}"
        );
    }
}
