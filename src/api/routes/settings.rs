//! Per-space settings: preferences (free key/value the agent reads), config
//! (the keys the host interprets), the model chain and mutes.

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, audited, body, path_arg, text_field, Body, Json, PathArg};
use crate::perms::Permission;
use crate::schedule::zone;
use crate::api::{ApiError, ApiResult, AuditChange, Auth};
use crate::app::App;
use crate::clock::{now_ms, parse_duration_ms};
use crate::config::{check_model_spec, split_chain};
use crate::links::restore;
use crate::links::ActAsRoute;
use crate::links::LinkLevel::Read;
use crate::storage::links::ChangeKind;
use crate::storage::spaces::{self, KvEntry, KvTable, Mute};

/// Preferences, config, the model chain and mutes.
pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(prefs_list, prefs_set))
        .routes(routes!(prefs_delete))
        .routes(routes!(config_get, config_set))
        .routes(routes!(model_get, model_set))
        .routes(routes!(mutes_list, mutes_set))
        .routes(routes!(mutes_delete))
}

/// Across a link: every settings route, reads at `read`, writes at `admin`.
pub(crate) const ACT_AS: &[ActAsRoute] = &[
    ActAsRoute::new("GET", "/api/prefs", Read),
    ActAsRoute::new("GET", "/api/config", Read),
    ActAsRoute::new("GET", "/api/model", Read),
    ActAsRoute::new("GET", "/api/mutes", Read),
    ActAsRoute::admin_write("PUT", "/api/prefs"),
    ActAsRoute::admin_write("DELETE", "/api/prefs/{key}"),
    ActAsRoute::admin_write("PUT", "/api/config"),
    ActAsRoute::admin_write("PUT", "/api/model"),
    ActAsRoute::admin_write("POST", "/api/mutes"),
    ActAsRoute::admin_write("DELETE", "/api/mutes/{caller}"),
];

/// A preference (key: 1-64 letters, digits, `.`, `_`, `-`; value at most
/// 4000 characters) or a config key of `available`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyValue {
    #[schema(min_length = 1, max_length = 64)]
    key: String,
    #[schema(max_length = 4000)]
    value: String,
}

/// A key as set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeySet {
    pub key: String,
    pub value: String,
}

/// A key as deleted (`deleted`: it existed).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeyDeleted {
    pub key: String,
    pub deleted: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PreferenceList {
    pub preferences: Vec<KvEntry>,
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

#[utoipa::path(get, path = "/api/prefs", operation_id = "listPrefs", summary = "List the space's preferences", tag = "settings",
    responses((status = 200, description = "The space's preferences", body = PreferenceList)))]
pub(crate) async fn prefs_list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<PreferenceList>> {
    let space = auth.require(Permission::PrefsGet)?.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| spaces::kv_list(c, KvTable::Preferences, &space))
        .await?;
    Ok(Json(PreferenceList { preferences: list }))
}

#[utoipa::path(put, path = "/api/prefs", operation_id = "setPref", summary = "Set a preference of the space", tag = "settings", request_body = KeyValue,
    responses((status = 200, description = "Set", body = KeySet)))]
pub(crate) async fn prefs_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<KeyValue>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<KeySet>)> {
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
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let (before, out) = apply(&app, &sid, move |tx| {
        let before = spaces::kv_get(tx, KvTable::Preferences, &space, &key)?;
        restore::note_kv_write(tx, link, &space, ChangeKind::Preference, &key, Some(&b.value))?;
        spaces::kv_set(tx, KvTable::Preferences, &space, &key, &b.value, &by)?;
        Ok((before, KeySet { key, value: b.value }))
    })
    .await?;
    Ok(audited(json!({ "value": before }), out))
}

#[utoipa::path(delete, path = "/api/prefs/{key}", operation_id = "deletePref", summary = "Delete a preference of the space", tag = "settings",
    params(("key" = String, Path, description = "The preference key")),
    responses((status = 200, description = "Deleted (or was absent)", body = KeyDeleted)))]
pub(crate) async fn prefs_delete(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    key: PathArg<String>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<KeyDeleted>)> {
    let key = path_arg(key)?;
    let sid = auth.require(Permission::PrefsSet)?.space.clone();
    let space = sid.to_string();
    let key = pref_key(&key)?;
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let (before, out) = apply(&app, &sid, move |tx| {
        let before = spaces::kv_get(tx, KvTable::Preferences, &space, &key)?;
        if before.is_some() {
            restore::note_kv_write(tx, link, &space, ChangeKind::Preference, &key, None)?;
        }
        let deleted = spaces::kv_delete(tx, KvTable::Preferences, &space, &key)?;
        Ok((before, KeyDeleted { key, deleted }))
    })
    .await?;
    Ok(audited(json!({ "value": before }), out))
}

/// Config keys the host interprets, with their validation.
pub(crate) const CONFIG_KEYS: &[(&str, &str)] = &[
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
    (
        "web.fetch",
        "on or off: the agent's web_fetch tool (the host fetches; off by default)",
    ),
    (
        "timezone",
        "IANA time zone (Europe/Amsterdam) the space's task cron times are read in; blank: the deployment's timezone",
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
        "web.fetch" if !matches!(value, "on" | "off") => bad("must be on or off"),
        "timezone"
            if !value.trim().is_empty() && value.trim().parse::<chrono_tz::Tz>().is_err() =>
        {
            bad("is not an IANA time zone name (e.g. Europe/Amsterdam, America/New_York, UTC)")
        }
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

/// A config key the host interprets.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConfigKey {
    pub key: String,
    pub description: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConfigList {
    /// The keys set in this space.
    pub config: Vec<KvEntry>,
    /// Every key `PUT /api/config` takes.
    pub available: Vec<ConfigKey>,
}

#[utoipa::path(get, path = "/api/config", operation_id = "getConfig", summary = "Show the space's settings and every key", tag = "settings",
    responses((status = 200, description = "The space's config", body = ConfigList)))]
pub(crate) async fn config_get(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<ConfigList>> {
    let space = auth.require(Permission::ConfigGet)?.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| spaces::kv_list(c, KvTable::Config, &space))
        .await?;
    let available = CONFIG_KEYS
        .iter()
        .map(|(k, d)| ConfigKey {
            key: (*k).to_owned(),
            description: (*d).to_owned(),
        })
        .collect();
    Ok(Json(ConfigList {
        config: list,
        available,
    }))
}

#[utoipa::path(put, path = "/api/config", operation_id = "setConfig", summary = "Set a key of the space's settings", tag = "settings", request_body = KeyValue,
    responses((status = 200, description = "Set", body = KeySet)))]
pub(crate) async fn config_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<KeyValue>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<KeySet>)> {
    let sid = auth.require(Permission::ConfigSet)?.space.clone();
    let space = sid.to_string();
    let b = body(b)?;
    // `<extension>.<key>`: the installed extension's schema decides.
    let (k, v, sp) = (b.key.clone(), b.value.clone(), space.clone());
    let ext = app
        .rt
        .store
        .read(move |c| crate::extensions::space_config::check_set(c, &sp, &k, &v))
        .await?;
    match ext {
        Some(checked) => checked.map_err(ApiError::bad_request)?,
        None => validate_config(&b.key, &b.value)?,
    }
    let by = auth.caller.caller_id.clone();
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let deployment = app.rt.settings.timezone.clone();
    let (before, out) = apply(&app, &sid, move |tx| {
        let before = spaces::kv_get(tx, KvTable::Config, &space, &b.key)?;
        restore::note_kv_write(tx, link, &space, ChangeKind::Config, &b.key, Some(&b.value))?;
        spaces::kv_set(tx, KvTable::Config, &space, &b.key, &b.value, &by)?;
        if b.key == "timezone" {
            // The space's cron tasks now run on its new clock.
            super::tasks::reschedule(tx, &space, zone(Some(&b.value), &deployment))?;
        }
        Ok((
            before,
            KeySet {
                key: b.key,
                value: b.value,
            },
        ))
    })
    .await?;
    Ok(audited(json!({ "value": before }), out))
}

/// The model chain a turn of this space uses.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ModelChain {
    /// `provider:model` specs, tried in order.
    pub chain: Vec<String>,
    /// `space` (set here) or `default` (the host's chain).
    pub source: String,
    /// Set by `PUT /api/model` when a spec of the chain names a provider
    /// this host has no API key for: stored anyway, but its turns will fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl ModelChain {
    fn of(chain: Vec<String>, source: &str) -> Self {
        Self {
            chain,
            source: source.to_owned(),
            warning: None,
        }
    }
}

/// The warning of a chain whose specs name providers this host has no key
/// for (`openai:gpt-4o` without `MERCURY_OPENAI_API_KEY`).
fn keyless_warning(app: &App, chain: &[String]) -> Option<String> {
    let keyless: Vec<&str> = chain
        .iter()
        .filter(|s| {
            s.split_once(':')
                .is_some_and(|(p, _)| !app.rt.models.has_key_for(p))
        })
        .map(String::as_str)
        .collect();
    (!keyless.is_empty()).then(|| {
        format!(
            "this host has no API key for {}: its turns will fail until the key is set \
             (MERCURY_OPENAI_API_KEY / MERCURY_ANTHROPIC_API_KEY, then restart)",
            keyless.join(", ")
        )
    })
}

#[utoipa::path(get, path = "/api/model", operation_id = "getModel", summary = "Show the space's model chain", tag = "settings",
    responses((status = 200, description = "The space's model chain", body = ModelChain)))]
pub(crate) async fn model_get(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<ModelChain>> {
    let space = auth.require(Permission::ModelGet)?.space.to_string();
    let stored = app
        .rt
        .store
        .read(move |c| spaces::kv_get(c, KvTable::Config, &space, "model"))
        .await?;
    Ok(Json(
        match stored.map(|s| split_chain(&s)).filter(|c| !c.is_empty()) {
            Some(chain) => ModelChain::of(chain, "space"),
            None => ModelChain::of(app.rt.settings.model_chain(), "default"),
        },
    ))
}

/// At most 8 `provider:model` specs; empty: back to the host's chain.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelBody {
    chain: Vec<String>,
}

#[utoipa::path(put, path = "/api/model", operation_id = "setModel", summary = "Set the space's model chain", tag = "settings", request_body = ModelBody,
    responses((status = 200, description = "The chain now in force", body = ModelChain)))]
pub(crate) async fn model_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<ModelBody>,
) -> ApiResult<(axum::Extension<AuditChange>, Json<ModelChain>)> {
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
    let warning = keyless_warning(&app, &chain);
    let link = auth.via.as_ref().map(|v| v.edge_id);
    let (before, out) = apply(&app, &sid, move |tx| {
        let stored = spaces::kv_get(tx, KvTable::Config, &space, "model")?;
        let joined = chain.join(",");
        let after = (!chain.is_empty()).then_some(joined.as_str());
        if stored.is_some() || after.is_some() {
            restore::note_kv_write(tx, link, &space, ChangeKind::Config, "model", after)?;
        }
        let before = json!({"chain": stored.map(|c| split_chain(&c))});
        if chain.is_empty() {
            spaces::kv_delete(tx, KvTable::Config, &space, "model")?;
            Ok((before, ModelChain::of(default, "default")))
        } else {
            spaces::kv_set(tx, KvTable::Config, &space, "model", &joined, &by)?;
            Ok((before, ModelChain::of(chain, "space")))
        }
    })
    .await?;
    let out = ModelChain { warning, ..out };
    Ok(audited(before, out))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MuteList {
    pub mutes: Vec<Mute>,
}

#[utoipa::path(get, path = "/api/mutes", operation_id = "listMutes", summary = "List the space's muted callers", tag = "settings",
    responses((status = 200, description = "The space's mutes", body = MuteList)))]
pub(crate) async fn mutes_list(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<MuteList>> {
    let space = auth.require(Permission::MutesList)?.space.to_string();
    let list = app
        .rt
        .store
        .read(move |c| spaces::list_mutes(c, &space))
        .await?;
    Ok(Json(MuteList { mutes: list }))
}

/// Mutes a caller: for a duration (`for`, e.g. `2h`), until an RFC 3339
/// time, or (neither) until unmuted.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MuteBody {
    #[schema(min_length = 1, max_length = 200)]
    caller_id: String,
    #[serde(rename = "for")]
    duration: Option<String>,
    until: Option<String>,
    /// At most 500 characters.
    #[schema(max_length = 500)]
    reason: Option<String>,
}

/// A mute as set.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MuteSet {
    pub caller_id: String,
    /// Unix ms; `null`: until unmuted.
    pub until: Option<i64>,
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MuteReply {
    pub mute: MuteSet,
}

/// A mute as removed (`deleted`: there was one).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MuteDeleted {
    pub caller_id: String,
    pub deleted: bool,
}

#[utoipa::path(post, path = "/api/mutes", operation_id = "muteCaller", summary = "Mute a caller in the space", tag = "settings", request_body = MuteBody,
    responses((status = 200, description = "Muted", body = MuteReply)))]
pub(crate) async fn mutes_set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<MuteBody>,
) -> ApiResult<Json<MuteReply>> {
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
    let out = apply(&app, &sid, move |tx| {
        spaces::set_mute(tx, &space, &b.caller_id, until, reason.as_deref(), &by)?;
        Ok(MuteReply {
            mute: MuteSet {
                caller_id: b.caller_id,
                until,
                reason,
            },
        })
    })
    .await?;
    Ok(Json(out))
}

#[utoipa::path(delete, path = "/api/mutes/{caller}", operation_id = "unmuteCaller", summary = "Unmute a caller in the space", tag = "settings",
    params(("caller" = String, Path, description = "The muted caller")),
    responses((status = 200, description = "Unmuted (or was not muted)", body = MuteDeleted)))]
pub(crate) async fn mutes_delete(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    caller: PathArg<String>,
) -> ApiResult<Json<MuteDeleted>> {
    let caller = path_arg(caller)?;
    let sid = auth.require(Permission::MutesSet)?.space.clone();
    let space = sid.to_string();
    let out = apply(&app, &sid, move |tx| {
        let deleted = spaces::delete_mute(tx, &space, &caller)?;
        Ok(MuteDeleted {
            caller_id: caller,
            deleted,
        })
    })
    .await?;
    Ok(Json(out))
}
