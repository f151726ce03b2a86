//! The OpenAPI contract (issue 17): `GET /api/openapi.json` is served without
//! a token, lists every route of the router (no route is registered around
//! the `routes!` registration that documents it, and every documented
//! operation is served), says what each shares (bearer token, space and
//! act-as headers, error answers), and real answers of a live host validate
//! against the schemas it gives for their status.

use std::collections::BTreeSet;
use std::path::Path;

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{HostOptions, TestHost};
use mercury::api::ACT_AS_ROUTES;

/// A concrete path for a template: every `{param}` segment becomes `1`.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                "1"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch"];

/// Every (METHOD, path template) the document lists.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            if item.get(*m).is_some() {
                out.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// `file:line` of every route registered with axum's own `.route(` (or a
/// nest or fallback service) under `src/api/`: such a route would be served
/// without being in the document. Comments do not count.
fn undocumented_registrations() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let mut found = Vec::new();
    for entry in walkdir::WalkDir::new(&root) {
        let entry = entry.unwrap();
        if entry.path().extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // The one exclusion: the optional `metrics.bind` listener
            // (api/ops.rs `metrics_only`) is its own router on its own
            // port, serving the same `/metrics` the API documents.
            if code.contains("get(open_metrics)") {
                continue;
            }
            for needle in [".route(", ".route_service(", ".nest(", ".nest_service("] {
                if code.contains(needle) {
                    found.push(format!(
                        "{}:{}: {}",
                        entry.path().strip_prefix(&root).unwrap().display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    found
}

#[tokio::test]
async fn openapi_document_lists_every_route_of_the_router() {
    // 1. No route reaches the router except through `routes!(handler)`,
    //    which adds the handler's `#[utoipa::path]` to the document.
    let stray = undocumented_registrations();
    assert!(
        stray.is_empty(),
        "routes registered without their OpenAPI path (use .routes(routes!(handler)) \
         with #[utoipa::path] on the handler):\n{}",
        stray.join("\n")
    );

    let host = TestHost::start(HostOptions::default()).await;
    // 2. Served without a token, as OpenAPI 3.1, and the same document the
    //    router was built with.
    let resp = host
        .http
        .get(format!("{}/api/openapi.json", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let doc: Value = resp.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let built = serde_json::to_value(mercury::api::openapi_document()).unwrap();
    assert_eq!(documented(&doc), documented(&built));

    // 3. Every documented operation is served: without a token an API route
    //    is 401 (an unknown path would be 404 and a method the path does not
    //    serve 405; the auth step runs only on a matched route).
    let ops = documented(&doc);
    assert!(ops.len() >= 50, "only {} operations documented", ops.len());
    let public: BTreeSet<(String, String)> = [
        ("GET".to_string(), "/healthz".to_string()),
        ("GET".to_string(), "/api/openapi.json".to_string()),
    ]
    .into();
    // Called by a chat platform with its own secret, not a bearer token: with
    // no adapter in webhook mode the route answers 404 (documented).
    let platform: BTreeSet<(String, String)> = [
        ("POST", "/api/adapters/telegram/webhook"),
        ("GET", "/api/adapters/whatsapp/webhook"),
        ("POST", "/api/adapters/whatsapp/webhook"),
        ("POST", "/api/adapters/slack/events"),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    for (m, path) in &ops {
        let method = Method::from_bytes(m.as_bytes()).unwrap();
        let (st, v) = host.send(method, &concrete(path), None, &[], None).await;
        if public.contains(&(m.clone(), path.clone())) {
            assert_eq!(st, 200, "{m} {path}: {v}");
        } else if platform.contains(&(m.clone(), path.clone())) {
            assert_eq!(st, 404, "{m} {path}: {v}");
        } else {
            assert_eq!(st, 401, "{m} {path} is documented but not served: {v}");
        }
    }

    // 4. What every API operation shares: the bearer token, the space header,
    //    the act-as header exactly on the allowlisted routes, and error
    //    answers in the one ErrorBody schema (413/415 where a body is taken).
    let allow: BTreeSet<(String, String)> = ACT_AS_ROUTES
        .iter()
        .map(|r| {
            (
                r.method.to_string(),
                mercury::api::openapi::openapi_path(r.path),
            )
        })
        .collect();
    assert!(
        allow.is_subset(&ops),
        "act-as entries without documentation"
    );
    assert!(doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer");
    for (m, path) in &ops {
        let op = &doc["paths"][path][m.to_lowercase()];
        let names: BTreeSet<&str> = op["parameters"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default();
        if public.contains(&(m.clone(), path.clone())) {
            assert!(op.get("security").is_none(), "{m} {path}");
            continue;
        }
        if platform.contains(&(m.clone(), path.clone())) {
            assert!(op.get("security").is_none(), "{m} {path}");
            // Each names the secret it is checked with.
            assert!(
                [
                    "x-telegram-bot-api-secret-token",
                    "x-hub-signature-256",
                    "hub.verify_token",
                    "x-slack-signature"
                ]
                .iter()
                .any(|n| names.contains(n)),
                "{m} {path}"
            );
            continue;
        }
        assert_eq!(op["security"], json!([{"bearer": []}]), "{m} {path}");
        assert!(names.contains("x-mercury-space"), "{m} {path}");
        assert_eq!(
            names.contains("x-mercury-act-as"),
            allow.contains(&(m.clone(), path.clone())),
            "{m} {path}: the act-as header is documented exactly on the allowlist"
        );
        for status in ["400", "401", "403", "404", "500"] {
            assert_eq!(
                op["responses"][status]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{m} {path} {status}"
            );
        }
        if op.get("requestBody").is_some() {
            assert!(op["responses"].get("413").is_some(), "{m} {path}");
            assert!(op["responses"].get("415").is_some(), "{m} {path}");
        }
        let ok = op["responses"]
            .as_object()
            .unwrap()
            .keys()
            .any(|s| s.starts_with('2'));
        assert!(ok, "{m} {path} documents no success answer");
    }
    host.stop().await;
}

/// A small JSON Schema check (the subset utoipa writes: `$ref`, `type`,
/// `properties`, `required`, `additionalProperties`, `items`, `oneOf`,
/// `anyOf`, `allOf`, `enum`, `minimum`); the errors, empty when `v` fits.
fn check(doc: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        let target = &doc["components"]["schemas"][name];
        assert!(!target.is_null(), "dangling $ref {r}");
        return check(doc, target, v, at, errors);
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let fits = types.iter().any(|t| match *t {
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "string" => v.is_string(),
            "array" => v.is_array(),
            "object" => v.is_object(),
            _ => false,
        });
        if !fits {
            errors.push(format!("{at}: {v} is not of type {types:?}"));
            return;
        }
    }
    if let Some(min) = schema["minimum"].as_f64() {
        if v.as_f64().is_some_and(|x| x < min) {
            errors.push(format!("{at}: {v} is below {min}"));
        }
    }
    if let Some(options) = schema["enum"].as_array() {
        if !options.contains(v) {
            errors.push(format!("{at}: {v} is not one of {options:?}"));
        }
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = schema[key].as_array() {
            let fitting = alts
                .iter()
                .filter(|s| {
                    let mut e = Vec::new();
                    check(doc, s, v, at, &mut e);
                    e.is_empty()
                })
                .count();
            if fitting == 0 || (key == "oneOf" && fitting > 1) {
                errors.push(format!("{at}: {fitting} of the {key} alternatives fit {v}"));
            }
        }
    }
    if let Some(all) = schema["allOf"].as_array() {
        for s in all {
            check(doc, s, v, at, errors);
        }
    }
    if let Some(obj) = v.as_object() {
        let props = schema["properties"].as_object();
        for req in schema["required"].as_array().into_iter().flatten() {
            let req = req.as_str().unwrap();
            if !obj.contains_key(req) {
                errors.push(format!("{at}: missing required field {req}"));
            }
        }
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(doc, s, val, &format!("{at}.{k}"), errors),
                None => match &schema["additionalProperties"] {
                    Value::Bool(false) => errors.push(format!("{at}: unexpected field {k}")),
                    s @ Value::Object(_) => check(doc, s, val, &format!("{at}.{k}"), errors),
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            check(doc, items, item, &format!("{at}[{i}]"), errors);
        }
    }
}

/// Checks one real answer against the document: the status is documented
/// for the operation, and the body fits its schema.
fn conforms(doc: &Value, method: &str, template: &str, status: u16, body: &Value) {
    let op = &doc["paths"][template][method.to_lowercase()];
    assert!(op.is_object(), "{method} {template} is not documented");
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {template} answered {status}, which it does not document: {body}"
    );
    let schema = &response["content"]["application/json"]["schema"];
    let mut errors = Vec::new();
    check(doc, schema, body, "$", &mut errors);
    assert!(
        errors.is_empty(),
        "{method} {template} {status} does not fit its schema:\n{}\n{body}",
        errors.join("\n")
    );
}

/// A request: method, concrete path, its template, space, body.
type Call<'a> = (Method, &'a str, &'a str, Option<&'a str>, Option<Value>);

#[tokio::test]
async fn real_answers_validate_against_their_openapi_schemas() {
    let host = TestHost::start(HostOptions::default()).await;
    let (st, doc) = host
        .send(Method::GET, "/api/openapi.json", None, &[], None)
        .await;
    assert_eq!(st, 200);
    // The checker is not vacuous: a wrong body fails it.
    let mut e = Vec::new();
    let space_schema = json!({"$ref": "#/components/schemas/Space"});
    check(&doc, &space_schema, &json!({"id": 1}), "$", &mut e);
    assert!(e.len() >= 2, "{e:?}");

    let s = Some("oa");
    let calls: Vec<Call> = vec![
        (Method::GET, "/healthz", "/healthz", None, None),
        (
            Method::POST,
            "/api/spaces",
            "/api/spaces",
            None,
            Some(json!({"id": "oa", "tags": ["t"]})),
        ),
        (
            Method::POST,
            "/api/spaces",
            "/api/spaces",
            None,
            Some(json!({"id": "oa"})),
        ),
        (Method::GET, "/api/spaces", "/api/spaces", None, None),
        (Method::GET, "/api/whoami", "/api/whoami", s, None),
        (
            Method::GET,
            "/api/spaces/current",
            "/api/spaces/current",
            s,
            None,
        ),
        (
            Method::PUT,
            "/api/spaces/current/name",
            "/api/spaces/current/name",
            s,
            Some(json!({"name": "Open API"})),
        ),
        (
            Method::PUT,
            "/api/prefs",
            "/api/prefs",
            s,
            Some(json!({"key": "tone", "value": "dry"})),
        ),
        (Method::GET, "/api/prefs", "/api/prefs", s, None),
        (
            Method::DELETE,
            "/api/prefs/tone",
            "/api/prefs/{key}",
            s,
            None,
        ),
        (Method::GET, "/api/config", "/api/config", s, None),
        (
            Method::PUT,
            "/api/config",
            "/api/config",
            s,
            Some(json!({"key": "trigger.match", "value": "always"})),
        ),
        (Method::GET, "/api/model", "/api/model", s, None),
        (
            Method::POST,
            "/api/mutes",
            "/api/mutes",
            s,
            Some(json!({"caller_id": "telegram:9", "for": "1h"})),
        ),
        (Method::GET, "/api/mutes", "/api/mutes", s, None),
        (
            Method::DELETE,
            "/api/mutes/telegram:9",
            "/api/mutes/{caller}",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/roles",
            "/api/roles",
            s,
            Some(json!({"caller_id": "alice", "role": "member"})),
        ),
        (Method::GET, "/api/roles", "/api/roles", s, None),
        (Method::GET, "/api/permissions", "/api/permissions", s, None),
        (
            Method::GET,
            "/api/permissions?role=member",
            "/api/permissions",
            s,
            None,
        ),
        (
            Method::DELETE,
            "/api/roles/alice",
            "/api/roles/{caller}",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/tasks",
            "/api/tasks",
            s,
            Some(json!({"cron": "0 9 * * *", "prompt": "hi"})),
        ),
        (Method::GET, "/api/tasks", "/api/tasks", s, None),
        (
            Method::POST,
            "/api/tasks/1/pause",
            "/api/tasks/{id}/pause",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/tasks/1/resume",
            "/api/tasks/{id}/resume",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/tasks/abc/pause",
            "/api/tasks/{id}/pause",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/chat",
            "/api/chat",
            s,
            Some(json!({"text": "hello"})),
        ),
        (
            Method::GET,
            "/api/messages?q=hello",
            "/api/messages",
            s,
            None,
        ),
        (
            Method::GET,
            "/api/messages/recent",
            "/api/messages/recent",
            s,
            None,
        ),
        (
            Method::GET,
            "/api/messages/recent?limit=abc",
            "/api/messages/recent",
            s,
            None,
        ),
        (Method::GET, "/api/runs", "/api/runs", s, None),
        (
            Method::GET,
            "/api/conversations",
            "/api/conversations",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/control/stop",
            "/api/control/{action}",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/control/clear",
            "/api/control/{action}",
            s,
            None,
        ),
        (
            Method::POST,
            "/api/control/compact",
            "/api/control/{action}",
            s,
            None,
        ),
        (Method::GET, "/api/tokens", "/api/tokens", None, None),
        (
            Method::POST,
            "/api/identities",
            "/api/identities",
            None,
            Some(json!({"platform_id": "telegram:5", "caller_id": "bob"})),
        ),
        (
            Method::GET,
            "/api/identities",
            "/api/identities",
            None,
            None,
        ),
        (
            Method::GET,
            "/api/identities/audit",
            "/api/identities/audit",
            None,
            None,
        ),
        (Method::GET, "/api/pairings", "/api/pairings", None, None),
        (
            Method::POST,
            "/api/pairings/K7QM4XPA/approve",
            "/api/pairings/{code}/approve",
            None,
            None,
        ),
        (
            Method::POST,
            "/api/pairings/K7QM4XPA/deny",
            "/api/pairings/{code}/deny",
            None,
            None,
        ),
        (
            Method::POST,
            "/api/senders/allow",
            "/api/senders/allow",
            None,
            Some(json!({"sender": "telegram:42"})),
        ),
        (
            Method::POST,
            "/api/senders/deny",
            "/api/senders/deny",
            None,
            Some(json!({"conversation": "telegram:-1001"})),
        ),
        (Method::GET, "/api/senders", "/api/senders", None, None),
        (Method::GET, "/api/links", "/api/links", s, None),
        (Method::GET, "/api/links/audit", "/api/links/audit", s, None),
        (Method::GET, "/api/links/7", "/api/links/{id}", s, None),
        (Method::GET, "/api/outbox", "/api/outbox", None, None),
        (
            Method::POST,
            "/api/ask",
            "/api/ask",
            s,
            Some(json!({"message": "hi"})),
        ),
        (Method::DELETE, "/api/tasks/1", "/api/tasks/{id}", s, None),
        (
            Method::DELETE,
            "/api/spaces/current",
            "/api/spaces/current",
            s,
            None,
        ),
    ];
    let mut statuses = BTreeSet::new();
    for (method, path, template, space, body) in calls {
        let m = method.as_str().to_owned();
        let (st, v) = host.owner(method, path, space, body).await;
        conforms(&doc, &m, template, st, &v);
        statuses.insert(st);
    }
    // Success, created, accepted and client errors were all among them.
    for st in [200, 201, 400, 404, 409] {
        assert!(statuses.contains(&st), "no {st} among {statuses:?}");
    }

    // Malformed input meets the extractors: a JSON error body, not text.
    let resp = host
        .http
        .post(format!("{}/api/spaces", host.url))
        .bearer_auth(&host.owner_token)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.unwrap();
    conforms(&doc, "POST", "/api/spaces", 400, &v);
    assert_eq!(v["error"]["code"], "bad_request");
    let resp = host
        .http
        .post(format!("{}/api/spaces", host.url))
        .bearer_auth(&host.owner_token)
        .body(r#"{"id":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);
    let v: Value = resp.json().await.unwrap();
    conforms(&doc, "POST", "/api/spaces", 415, &v);
    let (st, v) = host.send(Method::GET, "/api/whoami", None, &[], None).await;
    conforms(&doc, "GET", "/api/whoami", st, &v);
    assert_eq!(st, 401);
    host.stop().await;
}

/// Found by the schemathesis run: `PUT /api/permissions` narrowing the
/// `admin` role took `permissions.set` from every admin of the space, global
/// admins included, and nothing could undo it. The admin role is refused,
/// nothing is written, and the owner still manages the space.
#[tokio::test]
async fn openapi_fuzz_finding_the_admin_role_cannot_be_narrowed() {
    let host = TestHost::start(HostOptions::default()).await;
    host.create_space("lock").await;
    let before = host.all_row_counts();
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("lock"),
            Some(json!({"role": "admin", "permissions": []})),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "bad_request");
    assert_eq!(host.all_row_counts(), before);
    let (st, v) = host
        .owner(
            Method::GET,
            "/api/permissions?role=admin",
            Some("lock"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["permissions"]
        .as_array()
        .unwrap()
        .contains(&json!("permissions.set")));
    // Narrowing another role still works.
    let (st, v) = host
        .owner(
            Method::PUT,
            "/api/permissions",
            Some("lock"),
            Some(json!({"role": "member", "permissions": []})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    host.stop().await;
}

/// Issue 25 item 3: a client generator needs one `operationId` per
/// operation, unique across the document, and a reader needs a summary on
/// each; the served document has both (and `openapi-spec-validator` in CI
/// checks the rest of the 3.1 rules, .ci/schemathesis.sh).
#[tokio::test]
async fn openapi_operations_have_unique_ids_and_summaries() {
    let host = TestHost::start(HostOptions::default()).await;
    let (st, doc) = host
        .send(Method::GET, "/api/openapi.json", None, &[], None)
        .await;
    assert_eq!(st, 200);
    let mut ids: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut unsummarised = Vec::new();
    let mut count = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            let Some(op) = item.get(*m) else { continue };
            count += 1;
            let at = format!("{} {path}", m.to_uppercase());
            match op["operationId"].as_str() {
                Some(id) if !id.trim().is_empty() => {
                    ids.entry(id.to_owned()).or_default().push(at.clone());
                }
                _ => panic!("{at} has no operationId"),
            }
            if op["summary"].as_str().is_none_or(|s| s.trim().is_empty()) {
                unsummarised.push(at);
            }
        }
    }
    let dups: Vec<String> = ids
        .iter()
        .filter(|(_, at)| at.len() > 1)
        .map(|(id, at)| format!("{id}: {}", at.join(", ")))
        .collect();
    assert!(
        dups.is_empty(),
        "duplicate operationIds:\n{}",
        dups.join("\n")
    );
    assert!(
        unsummarised.is_empty(),
        "operations without a summary:\n{}",
        unsummarised.join("\n")
    );
    assert_eq!(ids.len(), count);
    assert!(count >= 50, "only {count} operations");
    host.stop().await;
}
