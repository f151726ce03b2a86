//! Per-space settings: preferences (free key/value the agent reads), config
//! (the keys the host interprets), the model chain and mutes.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::Json;
use axum::routing::{delete, get};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{audited, body, path_arg, text_field, Body, PathArg};
use crate::perms::Permission;
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::app::App;
use crate::clock::{now_ms, parse_duration_ms};
use crate::config::{check_model_spec, split_chain};
use crate::links::ActAsRoute;
use crate::links::LinkLevel::{Admin, Read};
use crate::storage::spaces::{self, KvTable};

/// Preferences, config, the model chain and mutes.
pub fn router() -> Router<Arc<App>> {
    Router::new()
        .route("/api/prefs", get(prefs_list).put(prefs_set))
        .route("/api/prefs/{key}", delete(prefs_delete))
        .route("/api/config", get(config_get).put(config_set))
        .route("/api/model", get(model_get).put(model_set))
        .route("/api/mutes", get(mutes_list).post(mutes_set))
        .route("/api/mutes/{caller}", delete(mutes_delete))
}

/// Across a link: every settings route, reads at `read`, writes at `admin`.
pub const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/prefs", Read),
    ActAsRoute::new("GET", "/api/config", Read),
    ActAsRoute::new("GET", "/api/model", Read),
    ActAsRoute::new("GET", "/api/mutes", Read),
    ActAsRoute::new("PUT", "/api/prefs", Admin),
    ActAsRoute::new("DELETE", "/api/prefs/{key}", Admin),
    ActAsRoute::new("PUT", "/api/config", Admin),
    ActAsRoute::new("PUT", "/api/model", Admin),
    ActAsRoute::new("POST", "/api/mutes", Admin),
    ActAsRoute::new("DELETE", "/api/mutes/{caller}", Admin),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyValue {
    key: String,
    value: String,
}

fn pref_key(raw: &str) -> ApiResult<String> {
    let k = raw.trim();
    let ok = !k.is_empty()
        && k.len() <= 64
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(k.to_owned())
    } else {
        Err(ApiError::bad_request(format!(
            "preference key {raw:?} must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )))
    }
}

pub async fn prefs_list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let space = auth.require(Permission::PrefsGet)?.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| spaces::kv_list(c, KvTable::Preferences, &space))
        .await?;
    Ok(Json(json!({ "preferences": list })))
}

pub async fn prefs_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<KeyValue>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<Value>)> {
    let sid = auth.require(Permission::PrefsSet)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    let key = pref_key(&b.key)?;
    if b.value.chars().count() > 4000 {
        return Err(ApiError::bad_request(
            "value is longer than 4000 characters",
        ));
    }
    let by = auth.caller.caller_id.clone();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let before = spaces::kv_get(tx, KvTable::Preferences, &space, &key)?;
            spaces::kv_set(tx, KvTable::Preferences, &space, &key, &b.value, &by)?;
            Ok(json!({"key": key, "value": b.value, "before": {"value": before}}))
        })
        .await?;
    Ok(audited(out))
}

pub async fn prefs_delete(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    key: PathArg<String>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<Value>)> {
    let key = path_arg(key)?;
    let sid = auth.require(Permission::PrefsSet)?.space.clone();
    let space = sid.to_string();
    let key = pref_key(&key)?;
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let before = spaces::kv_get(tx, KvTable::Preferences, &space, &key)?;
            let deleted = spaces::kv_delete(tx, KvTable::Preferences, &space, &key)?;
            Ok(json!({"key": key, "deleted": deleted, "before": {"value": before}}))
        })
        .await?;
    Ok(audited(out))
}

/// Config keys the host interprets, with their validation.
pub const CONFIG_KEYS: &[(&str, &str)] = &[
    ("trigger.match", "group trigger: mention, prefix or always"),
    (
        "trigger.patterns",
        "comma-separated trigger words (blank: the host default)",
    ),
    ("trigger.case_sensitive", "true or false"),
    (
        "rate_limit.per_minute",
        "turns one caller may start per minute (1-1000)",
    ),
];

fn validate_config(key: &str, value: &str) -> ApiResult<()> {
    let bad = |m: &str| Err(ApiError::bad_request(format!("{key}: {m}")));
    match key {
        "trigger.match" if !matches!(value, "mention" | "prefix" | "always") => {
            bad("must be mention, prefix or always")
        }
        "trigger.case_sensitive" if !matches!(value, "true" | "false") => {
            bad("must be true or false")
        }
        "trigger.patterns" if value.len() > 500 => bad("is longer than 500 characters"),
        "rate_limit.per_minute" => match value.parse::<u32>() {
            Ok(1..=1000) => Ok(()),
            _ => bad("must be a whole number from 1 to 1000"),
        },
        k if CONFIG_KEYS.iter().any(|(name, _)| *name == k) => Ok(()),
        _ => Err(ApiError::bad_request(format!(
            "unknown config key {key:?}; valid keys: {}",
            CONFIG_KEYS
                .iter()
                .map(|(k, _)| *k)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

pub async fn config_get(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let space = auth.require(Permission::ConfigGet)?.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| spaces::kv_list(c, KvTable::Config, &space))
        .await?;
    let available: Vec<Value> = CONFIG_KEYS
        .iter()
        .map(|(k, d)| json!({"key": k, "description": d}))
        .collect();
    Ok(Json(json!({ "config": list, "available": available })))
}

pub async fn config_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<KeyValue>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<Value>)> {
    let sid = auth.require(Permission::ConfigSet)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    validate_config(&b.key, &b.value)?;
    let by = auth.caller.caller_id.clone();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let before = spaces::kv_get(tx, KvTable::Config, &space, &b.key)?;
            spaces::kv_set(tx, KvTable::Config, &space, &b.key, &b.value, &by)?;
            Ok(json!({"key": b.key, "value": b.value, "before": {"value": before}}))
        })
        .await?;
    Ok(audited(out))
}

pub async fn model_get(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let space = auth.require(Permission::ModelGet)?.space.to_string();
    let stored = app
        .rt
        .store
        .read(move |c| spaces::kv_get(c, KvTable::Config, &space, "model"))
        .await?;
    Ok(Json(
        match stored.map(|s| split_chain(&s)).filter(|c| !c.is_empty()) {
            Some(chain) => json!({"chain": chain, "source": "space"}),
            None => json!({"chain": app.rt.settings.model_chain(), "source": "default"}),
        },
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelBody {
    chain: Vec<String>,
}

pub async fn model_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<ModelBody>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<Value>)> {
    let sid = auth.require(Permission::ModelSet)?.space.clone();
    let space = sid.to_string();
    let chain: Vec<String> = body(b)?
        .chain
        .into_iter()
        .map(|s| s.trim().to_owned())
        .collect();
    if chain.len() > 8 {
        return Err(ApiError::bad_request("a model chain has at most 8 entries"));
    }
    for spec in &chain {
        check_model_spec(spec).map_err(ApiError::bad_request)?;
        if spec.contains(',') {
            return Err(ApiError::bad_request(format!(
                "{spec:?}: a model spec cannot contain a comma"
            )));
        }
        // A scripted spec makes the host read a file: only a global admin
        // may choose one, and only beneath the scripted roots.
        if let Some(path) = spec.strip_prefix("scripted:") {
            if !auth.caller.global_admin {
                return Err(ApiError::forbidden(format!(
                    "{spec:?}: only a global admin may put a scripted: model in a space's chain, \
                     and only for a file under <data dir>/models/"
                )));
            }
            app.rt
                .models
                .scripted_policy()
                .check(path)
                .map_err(ApiError::forbidden)?;
        }
    }
    let by = auth.caller.caller_id.clone();
    let default = app.rt.settings.model_chain();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let before = spaces::kv_get(tx, KvTable::Config, &space, "model")?;
            let before = json!({"chain": before.map(|c| split_chain(&c))});
            if chain.is_empty() {
                spaces::kv_delete(tx, KvTable::Config, &space, "model")?;
                Ok(json!({"chain": default, "source": "default", "before": before}))
            } else {
                spaces::kv_set(tx, KvTable::Config, &space, "model", &chain.join(","), &by)?;
                Ok(json!({"chain": chain, "source": "space", "before": before}))
            }
        })
        .await?;
    Ok(audited(out))
}

pub async fn mutes_list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<Value>> {
    let space = auth.require(Permission::MutesList)?.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| spaces::list_mutes(c, &space))
        .await?;
    Ok(Json(json!({ "mutes": list })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuteBody {
    caller_id: String,
    #[serde(rename = "for")]
    duration: Option<String>,
    until: Option<String>,
    reason: Option<String>,
}

pub async fn mutes_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<MuteBody>,
) -> ApiResult<Json<Value>> {
    let sid = auth.require(Permission::MutesSet)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    crate::ids::validate_caller_id(&b.caller_id).map_err(ApiError::bad_request)?;
    let now = now_ms();
    let until = match (&b.duration, &b.until) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("give either for or until, not both"))
        }
        (Some(d), None) => Some(
            now + parse_duration_ms(d).map_err(|m| ApiError::bad_request(format!("for: {m}")))?,
        ),
        (None, Some(u)) => {
            let t = chrono::DateTime::parse_from_rfc3339(u)
                .map_err(|_| ApiError::bad_request(format!("until {u:?} is not an RFC 3339 time")))?
                .timestamp_millis();
            if t <= now {
                return Err(ApiError::bad_request("until is in the past"));
            }
            Some(t)
        }
        (None, None) => None,
    };
    let reason = b
        .reason
        .as_deref()
        .map(|r| text_field("reason", r, 500))
        .transpose()?;
    let by = auth.caller.caller_id.clone();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            spaces::set_mute(tx, &space, &b.caller_id, until, reason.as_deref(), &by)?;
            Ok(json!({"mute": {"caller_id": b.caller_id, "until": until, "reason": reason}}))
        })
        .await?;
    Ok(Json(out))
}

pub async fn mutes_delete(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    caller: PathArg<String>,
) -> ApiResult<Json<Value>> {
    let caller = path_arg(caller)?;
    let sid = auth.require(Permission::MutesSet)?.space.clone();
    let space = sid.to_string();
    let out = app
        .spaces
        .apply(&sid, move |tx| {
            let deleted = spaces::delete_mute(tx, &space, &caller)?;
            Ok(json!({"caller_id": caller, "deleted": deleted}))
        })
        .await?;
    Ok(Json(out))
}
