//! Spend (issue 26): what was spent (`GET /api/cost`), the caps and where
//! they stand (`GET /api/budget`), and a space's own caps (`PUT /api/budget`).
//!
//! Must never: let anyone but a global admin read or change a budget (a
//! space admin raising its own cap would defeat it), or be reached across a
//! space link (no `ACT_AS` entry).

use std::sync::Arc;

use axum::extract::{Extension, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{apply, body, params, Body, Json, Params};
use crate::api::{ApiError, ApiResult, Auth};
use crate::app::App;
use crate::ids::SpaceId;
use crate::links::ActAsRoute;
use crate::spend::{CapStanding, CostReport};
use crate::storage::spend::{self as ledger, SpaceBudget};

pub(crate) fn router() -> OpenApiRouter<Arc<App>> {
    let router = OpenApiRouter::new()
        .routes(routes!(cost))
        .routes(routes!(show, set));
    #[cfg(feature = "test-hooks")]
    let router = router.routes(routes!(advance_clock));
    router
}

/// Budgets are the owner's: nothing here is reachable across a link.
pub(crate) const ACT_AS: &[ActAsRoute] = &[];

/// The largest cap or amount accepted (the config's bound too).
const MAX_AMOUNT: f64 = 1e9;

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct CostQuery {
    /// From when: an RFC 3339 time or a duration before now (`7d`); default
    /// the start of the current month in the deployment's time zone.
    #[param(max_length = 64)]
    since: Option<String>,
    /// Only this space's calls.
    #[param(pattern = r"^[a-z0-9][a-z0-9-]{0,62}$")]
    space: Option<String>,
}

#[utoipa::path(get, path = "/api/cost", operation_id = "getCost", summary = "Settled model cost by space, day, purpose and model", tag = "spend", params(CostQuery),
    responses((status = 200, description = "Settled cost by space, local day, purpose and model", body = CostReport)))]
pub(crate) async fn cost(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    q: Params<CostQuery>,
) -> ApiResult<Json<CostReport>> {
    auth.require_global_admin()?;
    let q = params(q)?;
    let spend = &app.rt.spend;
    let now = spend.now_ms();
    let since = match q.since.as_deref() {
        Some(raw) => crate::clock::parse_time_arg(raw, now).map_err(ApiError::bad_request)?,
        None => crate::spend::month_start(now, app.rt.settings.tz()),
    };
    let space = match q.space.as_deref() {
        Some(raw) => Some(
            SpaceId::parse(raw)
                .map_err(|e| ApiError::bad_request(e.to_string()))?
                .to_string(),
        ),
        None => None,
    };
    Ok(Json(spend.report(since, space).await?))
}

/// `GET /api/budget`: every cap in force and what it has used this period.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BudgetView {
    pub currency: String,
    /// The deployment's time zone (a space may have its own, below).
    pub timezone: String,
    pub allow_unpriced: bool,
    pub caps: Vec<CapStanding>,
    /// The space's own caps (`x-mercury-space`), when it has any.
    pub space: Option<SpaceBudget>,
}

#[utoipa::path(get, path = "/api/budget", operation_id = "getBudget", summary = "The spend caps in force and what each used", tag = "spend",
    responses((status = 200, description = "The caps in force (the space's too, with x-mercury-space) and what each used this period", body = BudgetView)))]
pub(crate) async fn show(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
) -> ApiResult<Json<BudgetView>> {
    auth.require_global_admin()?;
    let space = auth.space.as_ref().map(|s| s.space.to_string());
    let caps = app.rt.spend.standing(space.clone()).await?;
    let own = match space {
        Some(s) => app.rt.store.read(move |c| ledger::space_budget(c, &s)).await?,
        None => None,
    };
    let s = &app.rt.settings;
    Ok(Json(BudgetView {
        currency: s.currency.clone(),
        timezone: s.timezone.clone(),
        allow_unpriced: s.budgets.allow_unpriced,
        caps,
        space: own,
    }))
}

/// A space's own caps. A field left out keeps its value; `null` puts it
/// back to the config's (`budgets.space`, the deployment's time zone); 0 is
/// no cap.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetBody {
    #[serde(default, deserialize_with = "some_or_null")]
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 1_000_000_000)]
    daily: Option<Option<f64>>,
    #[serde(default, deserialize_with = "some_or_null")]
    #[schema(value_type = Option<f64>, minimum = 0, maximum = 1_000_000_000)]
    monthly: Option<Option<f64>>,
    /// An IANA time zone name.
    #[serde(default, deserialize_with = "some_or_null")]
    #[schema(value_type = Option<String>, max_length = 64)]
    timezone: Option<Option<String>>,
}

/// Tells a field given as `null` from one left out.
fn some_or_null<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

fn amount(name: &str, v: Option<Option<f64>>) -> ApiResult<Option<Option<f64>>> {
    match v {
        Some(Some(x)) if !(x.is_finite() && (0.0..=MAX_AMOUNT).contains(&x)) => Err(
            ApiError::bad_request(format!("{name} must be an amount between 0 (no cap) and 1000000000")),
        ),
        other => Ok(other),
    }
}

#[utoipa::path(put, path = "/api/budget", operation_id = "setBudget", summary = "Set the space's own spend caps", tag = "spend", request_body = BudgetBody,
    responses((status = 200, description = "The space's caps as they stand now", body = SpaceBudget)))]
pub(crate) async fn set(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<BudgetBody>,
) -> ApiResult<Json<SpaceBudget>> {
    auth.require_global_admin()?;
    let space = auth.space()?.space.clone();
    let b = body(b)?;
    let daily = amount("daily", b.daily)?;
    let monthly = amount("monthly", b.monthly)?;
    let timezone = match b.timezone {
        Some(Some(tz)) => {
            let tz = tz.trim().to_owned();
            if tz.len() > 64 || tz.parse::<chrono_tz::Tz>().is_err() {
                return Err(ApiError::bad_request(
                    "timezone must be an IANA time zone name such as Europe/Paris",
                ));
            }
            Some(Some(tz))
        }
        other => other,
    };
    if daily.is_none() && monthly.is_none() && timezone.is_none() {
        return Err(ApiError::bad_request(
            "give at least one of daily, monthly or timezone",
        ));
    }
    let now = crate::clock::now_ms();
    let id = space.to_string();
    let saved = apply(&app, &space, move |tx| {
        let mut row = ledger::space_budget(tx, &id)?.unwrap_or(SpaceBudget {
            space_id: id.clone(),
            ..Default::default()
        });
        if let Some(d) = daily {
            row.daily = d;
        }
        if let Some(m) = monthly {
            row.monthly = m;
        }
        if let Some(t) = timezone {
            row.timezone = t;
        }
        row.updated_at = now;
        ledger::set_space_budget(tx, &row)?;
        Ok(row)
    })
    .await?;
    Ok(Json(saved))
}

#[cfg(feature = "test-hooks")]
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdvanceBody {
    /// Milliseconds to move the spend clock forward, at most a year.
    #[schema(minimum = 0, maximum = 31_622_400_000_i64)]
    advance_ms: i64,
}

#[cfg(feature = "test-hooks")]
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClockNow {
    /// The spend clock now (ms).
    pub now_ms: i64,
}

/// Test hook: moves the spend clock (compiled only with `test-hooks`).
#[cfg(feature = "test-hooks")]
#[utoipa::path(post, path = "/api/test/spend-clock", operation_id = "testAdvanceSpendClock", summary = "Move the spend clock (test builds only)", tag = "test-hooks", request_body = AdvanceBody,
    responses((status = 200, description = "The spend clock moved", body = ClockNow)))]
pub(crate) async fn advance_clock(
    State(app): State<Arc<App>>,
    Extension(auth): Extension<Auth>,
    b: Body<AdvanceBody>,
) -> ApiResult<Json<ClockNow>> {
    auth.require_global_admin()?;
    let b = body(b)?;
    if !(0..=31_622_400_000).contains(&b.advance_ms) {
        return Err(ApiError::bad_request("advance_ms must be between 0 and a year"));
    }
    app.rt.spend.advance_clock(b.advance_ms);
    Ok(Json(ClockNow {
        now_ms: app.rt.spend.now_ms(),
    }))
}
