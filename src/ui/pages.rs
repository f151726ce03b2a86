//! The dashboard's pages: each handler reads what its page shows (one SQL
//! page of any list), checks access through `session`, and renders one
//! template. Forms post back here and answer with a redirect (303), so
//! every action works without the script.
//!
//! Must never: write outside the path the API would take for the same
//! action (files through the space's actor, console messages through
//! ingress), or act on a form whose CSRF token is not the sign-in's.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use futures_util::Stream;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::Deserialize;

use super::error::{blocking, UiError, UiResult};
use super::session::{self, space_access, Viewer};
use crate::app::App;
use crate::clock::now_ms;
use crate::perms::Permission;
use crate::storage::signins::{self, NewSignin};
use crate::storage::spaces::{self, KvTable};
use crate::storage::tokens::{self, TokenKind};
use crate::storage::ui_lists::{self, RunFilter};
use crate::storage::{links, messages, runs, spend, tasks};
use crate::workspace::files::{self, FilesError};
use crate::workspace::safe::SafePathError;

/// What the layout shows: who is signed in, and the form token its sign-out
/// form carries.
#[derive(Debug, Default, Clone)]
pub(super) struct Chrome {
    pub(super) caller: Option<String>,
    pub(super) csrf: String,
    /// A global admin: the instance-wide pages are in the menu.
    pub(super) admin: bool,
}

impl Chrome {
    pub(super) fn of(viewer: &Viewer) -> Self {
        Self {
            caller: Some(viewer.caller().to_owned()),
            csrf: viewer.signin.csrf.clone(),
            admin: viewer.global_admin,
        }
    }
}

/// The files a space page views and edits.
const EDITABLE: &[&str] = &["AGENTS.md", "MEMORY.md"];
/// Rows of a page of spaces or runs, and recent messages on a space page.
pub(super) const PAGE_ROWS: u32 = 50;
/// How long a file save waits behind a turn of the space (as the files API).
const WRITE_WAIT: Duration = Duration::from_secs(60);

pub(super) fn page(t: &impl Template) -> UiResult<Response> {
    Ok(Html(t.render()?).into_response())
}

pub(super) fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

pub(super) fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

// ---- sign-in ----

#[derive(Template)]
#[template(path = "ui/login.html")]
struct LoginPage {
    chrome: Chrome,
    error: String,
}

pub(super) async fn login_form() -> UiResult<Response> {
    page(&LoginPage {
        chrome: Chrome::default(),
        error: String::new(),
    })
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    token: String,
}

fn agent_of(headers: &HeaderMap) -> String {
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Makes a sign-in for `caller` and answers with its cookie.
async fn sign_in(
    app: &App,
    headers: &HeaderMap,
    caller: String,
    token_id: String,
) -> UiResult<Response> {
    let agent = agent_of(headers);
    let now = now_ms();
    let (_, secret) = app
        .rt
        .store
        .write(move |tx| {
            signins::create(
                tx,
                &NewSignin {
                    caller_id: &caller,
                    token_id: &token_id,
                    now,
                    expires_at: now + session::SIGNIN_TTL_MS,
                    agent: &agent,
                },
            )
        })
        .await?;
    let cookie = session::set_cookie(&secret, session::behind_tls(headers));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui/")).into_response())
}

pub(super) async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> UiResult<Response> {
    let token = form.token.trim().to_owned();
    let now = now_ms();
    let grant = app
        .rt
        .store
        .read(move |c| tokens::resolve(c, &token, now))
        .await?;
    // Only a plain user token signs in: a run, adapter or scoped token is
    // not a person at a browser.
    match grant.filter(|g| g.kind == TokenKind::User && g.scope.is_none()) {
        Some(g) => sign_in(&app, &headers, g.caller_id, g.id).await,
        None => {
            let mut answer = page(&LoginPage {
                chrome: Chrome::default(),
                error: "That token is unknown, revoked, expired or not a user token.".into(),
            })?;
            *answer.status_mut() = axum::http::StatusCode::UNAUTHORIZED;
            Ok(answer)
        }
    }
}

pub(super) async fn login_link(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(secret): Path<String>,
) -> UiResult<Response> {
    let now = now_ms();
    let redeemed = app
        .rt
        .store
        .write(move |tx| signins::redeem_link(tx, &secret, now))
        .await?;
    match redeemed {
        Some((caller, token_id)) => sign_in(&app, &headers, caller, token_id).await,
        None => Err(UiError::Forbidden(
            "this sign-in link was used already, has expired or was never made".into(),
        )),
    }
}

#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub(super) async fn logout(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    let (caller, id, now) = (
        viewer.caller().to_owned(),
        viewer.signin.id.clone(),
        now_ms(),
    );
    app.rt
        .store
        .write(move |tx| signins::revoke(tx, &caller, &id, now))
        .await?;
    let cookie = session::clear_cookie(session::behind_tls(&headers));
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response())
}

/// `POST /ui/login-links` with a user token as bearer (what `mrctl ui
/// login` calls): a one-time sign-in link for the token's caller.
pub(super) async fn mint_link(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned())
        .unwrap_or_default();
    let now = now_ms();
    let made = app
        .rt
        .store
        .write(move |tx| {
            let Some(g) = tokens::resolve(tx, &bearer, now)?
                .filter(|g| g.kind == TokenKind::User && g.scope.is_none())
            else {
                return Ok(None);
            };
            let expires = now + session::LINK_TTL_MS;
            let secret = signins::create_link(tx, &g.caller_id, &g.id, now, expires)?;
            Ok(Some((secret, expires)))
        })
        .await;
    let status = axum::http::StatusCode::UNAUTHORIZED;
    match made {
        Ok(Some((secret, expires_at))) => axum::Json(serde_json::json!({
            "path": format!("/ui/link/{secret}"),
            "expires_at": expires_at,
        }))
        .into_response(),
        Ok(None) => (
            status,
            axum::Json(serde_json::json!({"error": {"code": "unauthorized",
                "message": "a user token (Authorization: Bearer) makes a sign-in link"}})),
        )
            .into_response(),
        Err(e) => UiError::from(e).into_response(),
    }
}

// ---- sign-ins ----

struct SigninRow {
    id: String,
    created: String,
    seen: String,
    expires: String,
    agent: String,
    current: bool,
    revoked: bool,
}

#[derive(Template)]
#[template(path = "ui/signins.html")]
struct SigninsPage {
    chrome: Chrome,
    signins: Vec<SigninRow>,
}

pub(super) async fn signins(State(app): State<Arc<App>>, viewer: Viewer) -> UiResult<Response> {
    let caller = viewer.caller().to_owned();
    let list = app
        .rt
        .store
        .read(move |c| signins::list_for(c, &caller, PAGE_ROWS))
        .await?;
    let now = now_ms();
    let rows = list
        .into_iter()
        .map(|s| SigninRow {
            current: s.id == viewer.signin.id,
            revoked: s.revoked_at.is_some() || s.expires_at <= now,
            created: when(s.created_at),
            seen: when(s.last_seen_at),
            expires: when(s.expires_at),
            agent: s.agent,
            id: s.id,
        })
        .collect();
    page(&SigninsPage {
        chrome: Chrome::of(&viewer),
        signins: rows,
    })
}

pub(super) async fn revoke_signin(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    let (caller, now) = (viewer.caller().to_owned(), now_ms());
    app.rt
        .store
        .write(move |tx| signins::revoke(tx, &caller, &id, now))
        .await?;
    Ok(see_other("/ui/signins"))
}

// ---- overview ----

struct AdapterRow {
    name: String,
    state: String,
    error: String,
}

#[derive(Template)]
#[template(path = "ui/overview.html")]
struct OverviewPage {
    chrome: Chrome,
    version: &'static str,
    mode: &'static str,
    sandbox: String,
    active: u64,
    adapters: Vec<AdapterRow>,
    spaces: i64,
    queue: i64,
    turns_minute: i64,
    failed_hour: i64,
    cost_today: String,
    /// The deployment's daily cap (`budgets.global.daily`), or empty when none.
    budget_today: String,
    /// When the daily review scan fires next, or why it does not.
    next_review: String,
    /// The shadow that runs (global admins), or empty.
    shadow: String,
}

/// The overview's numbers, as the page and its live updates show them.
#[derive(serde::Serialize)]
struct Counts {
    active: u64,
    spaces: i64,
    queue: i64,
    turns_minute: i64,
    failed_hour: i64,
    cost_today: String,
}

async fn counts(app: &App) -> UiResult<Counts> {
    let now = now_ms();
    let shadow = app.rt.outbound.is_shadow();
    let day_start = now - now.rem_euclid(24 * 3600 * 1000);
    let currency = app.rt.settings.currency.clone();
    let (spaces, queue, turns_minute, failed_hour, spent) = app
        .rt
        .store
        .read(move |c| {
            let (spaces, queue, _, failed_hour) = ui_lists::overview_counts(c, now - 3_600_000)?;
            let (_, _, turns_minute, _) = ui_lists::overview_counts(c, now - 60_000)?;
            let spent = spend::used_since(c, shadow, day_start)?;
            Ok((spaces, queue, turns_minute, failed_hour, spent))
        })
        .await?;
    Ok(Counts {
        active: app.spaces.active_count() as u64,
        spaces,
        queue,
        turns_minute,
        failed_hour,
        cost_today: format!("{:.4} {currency}", spent as f64 / 1e9),
    })
}

pub(super) async fn overview(State(app): State<Arc<App>>, viewer: Viewer) -> UiResult<Response> {
    let c = counts(&app).await?;
    let adapters = app
        .adapters
        .statuses()
        .into_iter()
        .map(|(name, s)| AdapterRow {
            name,
            state: format!(
                "{} ({})",
                if s.connected {
                    "connected"
                } else {
                    "not connected"
                },
                s.mode
            ),
            error: s.last_error.unwrap_or_default(),
        })
        .collect();
    page(&OverviewPage {
        chrome: Chrome::of(&viewer),
        version: env!("CARGO_PKG_VERSION"),
        mode: if app.rt.outbound.is_shadow() {
            "shadow"
        } else {
            "live"
        },
        sandbox: app.rt.sandbox.name().to_owned(),
        active: c.active,
        adapters,
        spaces: c.spaces,
        queue: c.queue,
        turns_minute: c.turns_minute,
        failed_hour: c.failed_hour,
        cost_today: c.cost_today,
        budget_today: {
            let cap = app.rt.settings.budgets.global.daily;
            if cap > 0.0 {
                format!("{cap:.2} {}", app.rt.settings.currency)
            } else {
                String::new()
            }
        },
        next_review: match crate::actors::review_scheduler::next_fire(
            &app.rt.settings.review,
            chrono::Utc::now(),
        ) {
            Some(t) => format!("{} UTC", t.format("%Y-%m-%d %H:%M")),
            None => "off (review.enabled is false)".into(),
        },
        shadow: if viewer.global_admin {
            running_shadow(&app).await
        } else {
            String::new()
        },
    })
}

/// "snapshot X at URL" for the shadow that runs, "none", or why it is unknown.
async fn running_shadow(app: &App) -> String {
    let Ok(root) = super::rehearsal::root(app) else {
        return "unknown (no shadow root)".into();
    };
    match tokio::task::spawn_blocking(move || crate::shadow::manifest::running(&root)).await {
        Ok(Ok(Some(r))) => format!("snapshot {} at {}", r.snapshot, r.url),
        Ok(Ok(None)) => "none".into(),
        _ => "unknown".into(),
    }
}

/// The overview's numbers every few seconds, as `counts` events.
pub(super) async fn events(
    State(app): State<Arc<App>>,
    _viewer: Viewer,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures_util::stream::unfold(app, |app| async move {
        tokio::select! {
            _ = app.shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
        let event = match counts(&app).await {
            Ok(c) => Event::default()
                .event("counts")
                .json_data(&c)
                .unwrap_or_else(|_| Event::default().comment("unreadable counts")),
            Err(_) => Event::default().comment("counts unavailable"),
        };
        Some((Ok(event), app))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

// ---- spaces ----

#[derive(Deserialize)]
pub(super) struct SpacesQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    after: String,
}

#[derive(Template)]
#[template(path = "ui/spaces.html")]
struct SpacesPage {
    chrome: Chrome,
    q: String,
    q_url: String,
    spaces: Vec<crate::storage::spaces::Space>,
    next: Option<String>,
}

pub(super) async fn spaces(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Query(query): Query<SpacesQuery>,
) -> UiResult<Response> {
    if query.q.len() > 200 || query.after.len() > 64 {
        return Err(UiError::BadRequest("the search is too long".into()));
    }
    let member_of = (!viewer.global_admin).then(|| viewer.caller().to_owned());
    let (q, after) = (query.q.clone(), query.after.clone());
    let (list, more) = app
        .rt
        .store
        .read(move |c| ui_lists::spaces_page(c, member_of.as_deref(), &q, &after, PAGE_ROWS))
        .await?;
    let next = if more {
        list.last().map(|s| s.id.clone())
    } else {
        None
    };
    page(&SpacesPage {
        chrome: Chrome::of(&viewer),
        q_url: utf8_percent_encode(&query.q, NON_ALPHANUMERIC).to_string(),
        q: query.q,
        spaces: list,
        next,
    })
}

struct PairRow {
    key: String,
    value: String,
}

struct MessageRow {
    id: i64,
    sender: String,
    role: String,
    text: String,
}

struct TaskRow {
    id: i64,
    schedule: String,
    prompt: String,
    /// `active`, `paused` or `done` (a fired one-shot task), as `tasks list`.
    state: &'static str,
}

struct MuteRow {
    caller_id: String,
    until: String,
    reason: String,
}

#[derive(Deserialize)]
pub(super) struct SpaceQuery {
    /// What an action just did (a fixed word; see `actions::notice_of`).
    #[serde(default)]
    did: String,
    /// The space whose link the viewer reaches this one through.
    #[serde(default)]
    via: String,
}

/// A link from the page's space to another.
struct LinkOut {
    id: i64,
    target: String,
    level: String,
    /// The one conversation a filtered edge reaches, or empty.
    conversation: String,
}

#[derive(Template)]
#[template(path = "ui/space.html")]
struct SpacePage {
    chrome: Chrome,
    space: crate::storage::spaces::Space,
    role: String,
    can_prompt: bool,
    can_pause: bool,
    can_resume: bool,
    can_mute: bool,
    can_stop: bool,
    notice: &'static str,
    /// Set when the page is reached through a link: (holder, edge, level).
    reach: Option<(String, i64, &'static str)>,
    links_out: Vec<LinkOut>,
    /// The viewer may open a linked space through this one (`links.act`).
    can_act: bool,
    members: Vec<PairRow>,
    prefs: Vec<PairRow>,
    tasks: Vec<TaskRow>,
    mutes: Vec<MuteRow>,
    messages: Vec<MessageRow>,
}

pub(super) async fn space(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(query): Query<SpaceQuery>,
) -> UiResult<Response> {
    let access =
        super::session::space_access_via(&app, &viewer, &raw, &query.via, "/ui/spaces/{space}")
            .await?;
    let id = access.space.to_string();
    let show_links = access.via.is_none() && access.has(Permission::LinksList);
    let (show_prefs, show_tasks, show_mutes) = (
        access.has(Permission::PrefsGet),
        access.has(Permission::TasksList),
        access.has(Permission::MutesList),
    );
    let (space, members, prefs, tasks, mutes, recent, links_out) = app
        .rt
        .store
        .read(move |c| {
            let space = spaces::get_space(c, &id)?
                .ok_or_else(|| crate::storage::StoreError::NotFound(format!("space {id}")))?;
            let roles = spaces::list_roles(c, &id)?;
            let mut members: Vec<PairRow> = roles
                .iter()
                .map(|r| PairRow {
                    key: r.caller_id.clone(),
                    value: r.role.clone(),
                })
                .collect();
            for m in spaces::list_members(c, &id)? {
                if !roles.iter().any(|r| r.caller_id == m.caller_id) {
                    members.push(PairRow {
                        key: match m.display_name {
                            Some(n) => format!("{} ({n})", m.caller_id),
                            None => m.caller_id,
                        },
                        value: "member".into(),
                    });
                }
            }
            let prefs = if show_prefs {
                spaces::kv_list(c, KvTable::Preferences, &id)?
            } else {
                Vec::new()
            };
            let tasks = if show_tasks {
                tasks::list(c, &id)?
            } else {
                Vec::new()
            };
            let mutes = if show_mutes {
                spaces::list_mutes(c, &id)?
            } else {
                Vec::new()
            };
            let recent = messages::history(c, &id, 0, i64::MAX, PAGE_ROWS)?;
            let links_out: Vec<LinkOut> = if show_links {
                links::touching(c, &id)?
                    .into_iter()
                    .filter(|l| l.holder_space_id == id && l.revoked_at.is_none())
                    .map(|l| LinkOut {
                        id: l.id,
                        target: l.target_space_id,
                        level: l.level,
                        conversation: l
                            .target_conversation_id
                            .map(|c| c.to_string())
                            .unwrap_or_default(),
                    })
                    .collect()
            } else {
                Vec::new()
            };
            Ok((space, members, prefs, tasks, mutes, recent, links_out))
        })
        .await?;
    page(&SpacePage {
        chrome: Chrome::of(&viewer),
        space,
        can_prompt: access.has(Permission::Prompt),
        can_pause: access.has(Permission::TasksPause),
        can_resume: access.has(Permission::TasksResume),
        can_mute: access.has(Permission::MutesSet),
        can_stop: access.has(Permission::Stop),
        notice: super::actions::notice_of(&query.did),
        can_act: access.via.is_none() && access.has(Permission::LinksAct),
        links_out,
        reach: access
            .via
            .as_ref()
            .map(|r| (r.holder.clone(), r.edge_id, r.level)),
        role: access.role.clone(),
        members,
        prefs: prefs
            .into_iter()
            .map(|e| PairRow {
                key: e.key,
                value: e.value,
            })
            .collect(),
        tasks: tasks
            .into_iter()
            .map(|t| TaskRow {
                id: t.id,
                state: t.state,
                schedule: t.cron.unwrap_or_else(|| t.at.map(when).unwrap_or_default()),
                prompt: t.prompt,
            })
            .collect(),
        mutes: mutes
            .into_iter()
            .map(|m| MuteRow {
                caller_id: m.caller_id,
                until: m.until.map(when).unwrap_or_else(|| "until unmuted".into()),
                reason: m.reason.unwrap_or_default(),
            })
            .collect(),
        messages: recent
            .into_iter()
            .rev()
            .map(|m| {
                // D-014: another space's text, read across a link, loses the
                // characters that render as nothing or reorder it.
                let tidy = |t: String| {
                    if access.via.is_some() {
                        crate::links::strip_invisible(&t)
                    } else {
                        t
                    }
                };
                MessageRow {
                    id: m.id,
                    sender: tidy(m.sender_name.or(m.sender_id).unwrap_or_default()),
                    role: m.role,
                    text: tidy(m.text),
                }
            })
            .collect(),
    })
}

#[derive(Deserialize)]
pub(super) struct ChatForm {
    #[serde(default)]
    csrf: String,
    text: String,
}

/// The console: the message goes in as `POST /api/chat` puts it, and the
/// answer waits for the turn (the space page then shows its reply).
pub(super) async fn chat(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<ChatForm>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    let access = space_access(&app, &viewer, &raw).await?;
    access.require(Permission::Prompt)?;
    let text = form.text.trim().to_owned();
    if text.is_empty() || text.chars().count() > 32_000 {
        return Err(UiError::BadRequest(
            "a message is 1 to 32,000 characters".into(),
        ));
    }
    let space = access.space.to_string();
    let caller = viewer.caller().to_owned();
    let (sp, limits) = (space.clone(), app.limits.clone());
    let stored = app
        .rt
        .store
        .write(move |tx| crate::ingress::chat_tx(tx, &limits, &sp, &caller, &caller, &text))
        .await?;
    let Some(message_id) = stored else {
        return Err(UiError::Unavailable(crate::ingress::SLOW_DOWN_REPLY.into()));
    };
    let done = app.rt.waiters.register(message_id);
    app.spaces
        .wake(&access.space)
        .await
        .map_err(|e| UiError::Internal(format!("waking space {space}: {e}")))?;
    let wait = Duration::from_secs(app.rt.settings.turn.timeout_secs + 30);
    let _ = tokio::time::timeout(wait, done).await;
    Ok(see_other(&format!("/ui/spaces/{space}#messages")))
}

// ---- files ----

#[derive(Template)]
#[template(path = "ui/file.html")]
struct FilePage {
    chrome: Chrome,
    space_id: String,
    name: String,
    content: String,
    hash: String,
    can_write: bool,
    notice: String,
}

fn editable(name: &str) -> UiResult<&'static str> {
    EDITABLE
        .iter()
        .copied()
        .find(|n| *n == name)
        .ok_or_else(|| UiError::NotFound("the dashboard shows AGENTS.md and MEMORY.md".into()))
}

impl From<FilesError> for UiError {
    fn from(e: FilesError) -> Self {
        match e {
            FilesError::Path(SafePathError::NotFound(p)) => UiError::NotFound(p),
            FilesError::Path(SafePathError::Escapes(p)) => UiError::Forbidden(p),
            FilesError::Path(p @ SafePathError::Io { .. }) => UiError::Internal(p.to_string()),
            FilesError::Path(p) => UiError::BadRequest(p.to_string()),
            e @ (FilesError::Stale { .. }
            | FilesError::StaleMissing(_)
            | FilesError::Exists { .. }) => {
                UiError::Stale(format!("{e}; reload the page to edit what is there now"))
            }
            e @ (FilesError::TooLarge { .. } | FilesError::OverQuota { .. }) => {
                UiError::TooLarge(e.to_string())
            }
            e => UiError::BadRequest(e.to_string()),
        }
    }
}

pub(super) async fn file(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path((raw, name)): Path<(String, String)>,
) -> UiResult<Response> {
    let name = editable(&name)?;
    let access = space_access(&app, &viewer, &raw).await?;
    access.require(Permission::FilesRead)?;
    let ws = app.rt.paths.workspace(&access.space);
    let max = app.rt.settings.files.max_bytes;
    let (content, hash) = match blocking(move || files::read(&ws, name, max)).await {
        Ok(f) => (f.content, f.hash),
        Err(UiError::NotFound(_)) => (String::new(), String::new()),
        Err(e) => return Err(e),
    };
    page(&FilePage {
        chrome: Chrome::of(&viewer),
        space_id: access.space.to_string(),
        name: name.to_owned(),
        content,
        hash,
        can_write: access.has(Permission::FilesWrite),
        notice: String::new(),
    })
}

#[derive(Deserialize)]
pub(super) struct FileForm {
    #[serde(default)]
    csrf: String,
    /// The hash the page was loaded with; empty: the file did not exist.
    #[serde(default)]
    if_match: String,
    content: String,
}

/// Saves with the files API's rule: only if the file still has the hash
/// the editing page showed (412 otherwise, nothing written).
pub(super) async fn save_file(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path((raw, name)): Path<(String, String)>,
    Form(form): Form<FileForm>,
) -> UiResult<Response> {
    viewer.check_csrf(&form.csrf)?;
    let name = editable(&name)?;
    let access = space_access(&app, &viewer, &raw).await?;
    access.require(Permission::FilesWrite)?;
    let expect = form.if_match.trim().to_ascii_lowercase();
    if expect.len() > 128 || !expect.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(UiError::BadRequest(
            "the form's file hash is not one this host gave".into(),
        ));
    }
    // Browsers send a textarea's line breaks as CRLF.
    let content = form.content.replace("\r\n", "\n");
    let max = app.rt.settings.files.max_bytes;
    if content.len() > max {
        return Err(UiError::TooLarge(format!(
            "{name} may be at most {max} bytes"
        )));
    }
    let quota = app.rt.settings.sandbox.workspace_mb;
    let limits = (&app.rt.settings.workspace).into();
    let ws = app.rt.paths.workspace(&access.space);
    let existed_as = expect.clone();
    if existed_as.is_empty() {
        // The page showed no file: refuse if one was made since.
        let exists = blocking(move || match files::read(&ws, name, max) {
            Ok(_) => Ok(true),
            Err(FilesError::Path(SafePathError::NotFound(_))) => Ok(false),
            Err(e) => Err(e),
        })
        .await?;
        if exists {
            return Err(UiError::Stale(format!(
                "{name} was created since this page was loaded; reload the page to edit it"
            )));
        }
    }
    app.spaces
        .workspace_write(&access.space, WRITE_WAIT, move |live| {
            files::write(
                live,
                name,
                content.as_bytes(),
                (!expect.is_empty()).then_some(expect.as_str()),
                quota,
                limits,
            )
        })
        .await
        .map_err(|e| UiError::Unavailable(format!("the space is busy: {e}")))??;
    Ok(see_other(&format!(
        "/ui/spaces/{}/files/{name}",
        access.space
    )))
}

// ---- runs ----

#[derive(Deserialize)]
pub(super) struct RunsQuery {
    #[serde(default)]
    status: String,
    #[serde(default)]
    kind: String,
    before: Option<i64>,
}

struct RunRow {
    id: String,
    kind: String,
    status: String,
    caller: String,
    started: String,
    error: String,
}

#[derive(Template)]
#[template(path = "ui/runs.html")]
struct RunsPage {
    chrome: Chrome,
    space_id: String,
    status: String,
    kind: String,
    runs: Vec<RunRow>,
    next: Option<i64>,
}

fn filter_word(raw: &str) -> UiResult<String> {
    let w = raw.trim();
    if w.len() > 32
        || !w
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(UiError::BadRequest(
            "a status or kind filter is a short word".into(),
        ));
    }
    Ok(w.to_owned())
}

pub(super) async fn runs(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(query): Query<RunsQuery>,
) -> UiResult<Response> {
    let access = space_access(&app, &viewer, &raw).await?;
    let (status, kind) = (filter_word(&query.status)?, filter_word(&query.kind)?);
    let space = access.space.to_string();
    let before = query.before.unwrap_or(i64::MAX);
    let (s, k, sp) = (status.clone(), kind.clone(), space.clone());
    let (list, more) = app
        .rt
        .store
        .read(move |c| {
            ui_lists::runs_page(
                c,
                &RunFilter {
                    space: &sp,
                    status: &s,
                    kind: &k,
                    before,
                },
                PAGE_ROWS,
            )
        })
        .await?;
    let next = if more {
        list.last().map(|r| r.started_at)
    } else {
        None
    };
    page(&RunsPage {
        chrome: Chrome::of(&viewer),
        space_id: space,
        status,
        kind,
        runs: list
            .into_iter()
            .map(|r| RunRow {
                started: when(r.started_at),
                id: r.id,
                kind: r.kind,
                status: r.status,
                caller: r.caller_id.unwrap_or_default(),
                error: r.error.unwrap_or_default(),
            })
            .collect(),
        next,
    })
}

struct StepRow {
    seq: u32,
    kind: String,
    name: String,
    arguments: String,
    exit: String,
    duration_ms: u64,
    tokens: String,
    output: String,
    error: String,
    source: String,
}

#[derive(Template)]
#[template(path = "ui/run.html")]
struct RunPage {
    chrome: Chrome,
    run: runs::Run,
    error: String,
    tokens_in: u64,
    tokens_out: u64,
    steps: Vec<StepRow>,
}

pub(super) async fn run(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Path(id): Path<String>,
) -> UiResult<Response> {
    if id.len() > 64 {
        return Err(UiError::NotFound("no such run".into()));
    }
    let rid = id.clone();
    let found = app.rt.store.read(move |c| runs::get(c, &rid)).await?;
    // A run of a space the viewer cannot read is "no access", like a space.
    let Some(run) = found else {
        return Err(UiError::NotFound("no such run".into()));
    };
    space_access(&app, &viewer, &run.space_id).await?;
    let rid = run.id.clone();
    let (usage, steps) = app
        .rt
        .store
        .read(move |c| Ok((runs::usage_for_run(c, &rid)?, runs::steps_for(c, &rid)?)))
        .await?;
    let own = run.space_id.clone();
    page(&RunPage {
        chrome: Chrome::of(&viewer),
        error: run.error.clone().unwrap_or_default(),
        tokens_in: usage.tokens_in,
        tokens_out: usage.tokens_out,
        steps: steps
            .into_iter()
            .map(|s| StepRow {
                seq: s.seq,
                tokens: if s.kind == "model" {
                    format!("{} in, {} out", s.tokens_in, s.tokens_out)
                } else {
                    String::new()
                },
                kind: s.kind,
                name: s.name,
                arguments: s.arguments.unwrap_or_default(),
                exit: s.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                duration_ms: s.duration_ms,
                output: s.output.unwrap_or_default(),
                error: s.error.unwrap_or_default(),
                source: if s.source_spaces.is_empty() {
                    own.clone()
                } else {
                    s.source_spaces.join(", ")
                },
            })
            .collect(),
        run,
    })
}

// ---- links ----

struct LinkRow {
    id: i64,
    holder: String,
    target: String,
    level: String,
    by: String,
    since: String,
}

struct NodeAt {
    id: String,
    x: i64,
    y: i64,
    tx: i64,
    ty: i64,
}

struct EdgeAt {
    level: String,
    x1: i64,
    y1: i64,
    x2: i64,
    y2: i64,
    lx: i64,
    ly: i64,
}

struct AuditLine {
    at: String,
    caller: String,
    action: String,
    spaces: String,
    level: String,
    request: String,
    status: String,
}

#[derive(Template)]
#[template(path = "ui/links.html")]
struct LinksPage {
    chrome: Chrome,
    size: i64,
    nodes: Vec<NodeAt>,
    edges: Vec<EdgeAt>,
    links: Vec<LinkRow>,
    space: String,
    audit: Vec<AuditLine>,
}

#[derive(Deserialize)]
pub(super) struct LinksQuery {
    #[serde(default)]
    space: String,
}

/// Where each space sits on the graph: on a circle, in id order, so the
/// same links always draw the same picture.
fn layout(ids: &[String], size: i64) -> Vec<(i64, i64)> {
    let (c, r) = (size as f64 / 2.0, size as f64 / 2.0 - 70.0);
    let n = ids.len().max(1) as f64;
    (0..ids.len())
        .map(|i| {
            let a = std::f64::consts::TAU * i as f64 / n - std::f64::consts::FRAC_PI_2;
            (
                (c + r * a.cos()).round() as i64,
                (c + r * a.sin()).round() as i64,
            )
        })
        .collect()
}

/// The links graph (holder → target, drawn here as SVG) and the link audit
/// log, filtered by space: instance-wide, for global admins, as the API's
/// `links list --all` and `links audit`.
pub(super) async fn links_page(
    State(app): State<Arc<App>>,
    viewer: Viewer,
    Query(query): Query<LinksQuery>,
) -> UiResult<Response> {
    viewer.require_admin("the links of the whole instance")?;
    let space = query.space.trim().to_owned();
    if !space.is_empty() {
        crate::ids::SpaceId::parse(&space).map_err(|e| UiError::BadRequest(e.to_string()))?;
    }
    let filter = space.clone();
    let (all, audit) = app
        .rt
        .store
        .read(move |c| {
            let audit = if filter.is_empty() {
                links::audit_all(c, PAGE_ROWS)?
            } else {
                links::audit_for(c, &filter, PAGE_ROWS)?
            };
            Ok((links::all(c)?, audit))
        })
        .await?;
    let live: Vec<_> = all.into_iter().filter(|l| l.revoked_at.is_none()).collect();
    let mut ids: Vec<String> = live
        .iter()
        .flat_map(|l| [l.holder_space_id.clone(), l.target_space_id.clone()])
        .collect();
    ids.sort();
    ids.dedup();
    let size = 520;
    let at = layout(&ids, size);
    let pos = |id: &str| ids.iter().position(|i| i == id).map_or((0, 0), |i| at[i]);
    let nodes = ids
        .iter()
        .zip(&at)
        .map(|(id, &(x, y))| NodeAt {
            id: id.clone(),
            x,
            y,
            tx: x + if x >= size / 2 {
                10
            } else {
                -10 - 7 * id.len() as i64
            },
            ty: y + 4,
        })
        .collect();
    let edges = live
        .iter()
        .map(|l| {
            let ((x1, y1), (x2, y2)) = (pos(&l.holder_space_id), pos(&l.target_space_id));
            // Stop short of the target's dot so the arrow head shows.
            let (dx, dy) = ((x2 - x1) as f64, (y2 - y1) as f64);
            let len = (dx * dx + dy * dy).sqrt().max(1.0);
            EdgeAt {
                level: l.level.clone(),
                x1,
                y1,
                x2: x2 - (dx / len * 9.0).round() as i64,
                y2: y2 - (dy / len * 9.0).round() as i64,
                lx: (x1 + x2) / 2 + 4,
                ly: (y1 + y2) / 2 - 4,
            }
        })
        .collect();
    page(&LinksPage {
        chrome: Chrome::of(&viewer),
        size,
        nodes,
        edges,
        links: live
            .into_iter()
            .map(|l| LinkRow {
                id: l.id,
                holder: l.holder_space_id,
                target: l.target_space_id,
                level: l.level,
                by: l.created_by,
                since: when(l.created_at),
            })
            .collect(),
        space,
        audit: audit
            .into_iter()
            .map(|a| AuditLine {
                at: when(a.at),
                caller: a.caller_id,
                action: a.action,
                spaces: format!(
                    "{} → {}",
                    a.holder_space_id.unwrap_or_default(),
                    a.target_space_id.unwrap_or_default()
                ),
                level: a.level.unwrap_or_default(),
                request: format!(
                    "{} {}",
                    a.method.unwrap_or_default(),
                    a.path.or(a.route).unwrap_or_default()
                ),
                status: a.status.map(|s| s.to_string()).unwrap_or_default(),
            })
            .collect(),
    })
}
