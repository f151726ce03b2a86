//! The spend ledger, the spaces' own caps and the once-per-period notices
//! (issue 26; the rules are `crate::spend`'s, this is only their rows).
//!
//! Must never: decide whether a call may be made (that is `crate::spend`), or
//! count a released reservation as spent.

use super::{params, Conn, Query, StoreResult, Tx};

/// A reservation made before a model call. The statements that look for
/// open reservations write it as the literal `state = 0`, the condition of
/// the partial index `spend_ledger_open`: a plan never depends on a bound
/// value (see `storage::cache_plans`), so only a literal lets SQLite use it.
pub const RESERVED: i64 = 0;
const _: () = assert!(RESERVED == 0, "spend_ledger_open indexes state = 0");
/// The call answered: `amount` is its cost.
pub const SETTLED: i64 = 1;
/// The call failed or was never made (or its host crashed): counts for nothing.
pub const RELEASED: i64 = 2;

pub struct NewReservation<'a> {
    pub at: i64,
    pub instance: &'a str,
    pub shadow: bool,
    pub space_id: Option<&'a str>,
    pub purpose: &'a str,
    pub model: &'a str,
    /// Billionths of the currency.
    pub amount: i64,
}

pub fn reserve(tx: &Tx, r: &NewReservation<'_>) -> StoreResult<i64> {
    tx.query_row(
        "INSERT INTO spend_ledger (at, instance, shadow, space_id, purpose, model, state, amount, tokens_in, tokens_out)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, 0) RETURNING id",
        params![r.at, r.instance, i64::from(r.shadow), r.space_id, r.purpose, r.model, RESERVED, r.amount],
        |row| row.get(0),
    )
}

pub fn settle(tx: &Tx, id: i64, amount: i64, tokens_in: u64, tokens_out: u64) -> StoreResult<()> {
    tx.execute(
        "UPDATE spend_ledger SET state = ?2, amount = ?3, tokens_in = ?4, tokens_out = ?5 WHERE id = ?1 AND state = ?6",
        params![id, SETTLED, amount, tokens_in as i64, tokens_out as i64, RESERVED],
    )?;
    Ok(())
}

pub fn release(tx: &Tx, id: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE spend_ledger SET state = ?2, amount = 0 WHERE id = ?1 AND state = ?3",
        params![id, RELEASED, RESERVED],
    )?;
    Ok(())
}

/// The reservations `instance` left open (a crash mid-call): released at its start.
pub fn release_left_by(tx: &Tx, instance: &str) -> StoreResult<usize> {
    tx.execute(
        "UPDATE spend_ledger SET state = ?2, amount = 0 WHERE instance = ?1 AND state = 0",
        params![instance, RELEASED],
    )
}

/// Reservations still open (for tests and `mercury status`).
pub fn open_reservations(conn: &Conn) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM spend_ledger WHERE state = 0",
        params![],
        |r| r.get(0),
    )
}

/// Spent and reserved since `since` (ms), the whole deployment.
pub fn used_since(conn: &Conn, shadow: bool, since: i64) -> StoreResult<i64> {
    conn.query_row(
        "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM spend_ledger WHERE shadow = ?1 AND at >= ?2 AND state <> ?3",
        params![i64::from(shadow), since, RELEASED],
        |r| r.get(0),
    )
}

/// Spent and reserved since `since` by one kind of call.
pub fn used_since_by_purpose(
    conn: &Conn,
    shadow: bool,
    purpose: &str,
    since: i64,
) -> StoreResult<i64> {
    conn.query_row(
        "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM spend_ledger WHERE shadow = ?1 AND at >= ?2 AND state <> ?3 AND purpose = ?4",
        params![i64::from(shadow), since, RELEASED, purpose],
        |r| r.get(0),
    )
}

/// Spent and reserved since `since` charged to one space.
pub fn used_since_by_space(conn: &Conn, shadow: bool, space: &str, since: i64) -> StoreResult<i64> {
    conn.query_row(
        "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) FROM spend_ledger WHERE space_id = ?4 AND shadow = ?1 AND at >= ?2 AND state <> ?3",
        params![i64::from(shadow), since, RELEASED, space],
        |r| r.get(0),
    )
}

/// A space's own caps (`None`: the config's `budgets.space`; 0: no cap).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct SpaceBudget {
    pub space_id: String,
    pub daily: Option<f64>,
    pub monthly: Option<f64>,
    /// The space's own time zone for its periods; `None`: the deployment's.
    pub timezone: Option<String>,
    pub updated_at: i64,
}

pub fn space_budget(conn: &Conn, space: &str) -> StoreResult<Option<SpaceBudget>> {
    conn.query_opt(
        "SELECT space_id, daily, monthly, timezone, updated_at FROM space_budgets WHERE space_id = ?1",
        params![space],
        |r| {
            Ok(SpaceBudget {
                space_id: r.get(0)?,
                daily: r.get(1)?,
                monthly: r.get(2)?,
                timezone: r.get(3)?,
                updated_at: r.get(4)?,
            })
        },
    )
}

/// The caps a space's calls are checked under: its own row, its periods
/// in the budget's own time zone, else the space's `timezone` config key
/// (its clock for tasks too); `None` when it has neither.
pub fn space_caps(conn: &Conn, space: &str) -> StoreResult<Option<SpaceBudget>> {
    // One statement: it runs in every turn's opening write.
    let (own, budget) = conn.query_row(
        "SELECT b.space_id, b.daily, b.monthly, b.timezone, b.updated_at, c.value
         FROM (SELECT CAST(?1 AS TEXT) AS id) s
         LEFT JOIN space_budgets b ON b.space_id = s.id
         LEFT JOIN space_config c ON c.space_id = s.id AND c.key = 'timezone'",
        params![space],
        |r| {
            let own: Option<String> = r.get(0)?;
            let own_zone: Option<String> = r.get(3)?;
            let config_zone: Option<String> = r.get(5)?;
            let budget = SpaceBudget {
                space_id: space.to_owned(),
                daily: r.get(1)?,
                monthly: r.get(2)?,
                timezone: own_zone.or(config_zone.filter(|z| !z.trim().is_empty())),
                updated_at: r.get::<_, Option<i64>>(4)?.unwrap_or(0),
            };
            Ok((own.is_some(), budget))
        },
    )?;
    Ok((own || budget.timezone.is_some()).then_some(budget))
}

pub fn space_budgets(conn: &Conn) -> StoreResult<Vec<SpaceBudget>> {
    conn.query_all(
        "SELECT space_id, daily, monthly, timezone, updated_at FROM space_budgets ORDER BY space_id",
        params![],
        |r| {
            Ok(SpaceBudget {
                space_id: r.get(0)?,
                daily: r.get(1)?,
                monthly: r.get(2)?,
                timezone: r.get(3)?,
                updated_at: r.get(4)?,
            })
        },
    )
}

/// Writes a space's caps whole (what the caller did not give stays as it was:
/// the caller reads the row first and passes it back).
pub fn set_space_budget(tx: &Tx, b: &SpaceBudget) -> StoreResult<()> {
    tx.execute(
        "INSERT INTO space_budgets (space_id, daily, monthly, timezone, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (space_id) DO UPDATE SET daily = ?2, monthly = ?3, timezone = ?4, updated_at = ?5",
        params![b.space_id, b.daily, b.monthly, b.timezone, b.updated_at],
    )?;
    Ok(())
}

/// Records that notice `key` went out for the period starting at
/// `period_start`; false when it already had.
pub fn note_once(tx: &Tx, key: &str, period_start: i64, at: i64) -> StoreResult<bool> {
    let inserted: Option<i64> = tx.query_opt(
        "INSERT INTO spend_notices (key, period_start, at) VALUES (?1, ?2, ?3)
         ON CONFLICT (key, period_start) DO NOTHING RETURNING 1",
        params![key, period_start, at],
        |r| r.get(0),
    )?;
    Ok(inserted.is_some())
}

/// An owner's notice written but not yet handed to its channel.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingNotice {
    pub key: String,
    pub period_start: i64,
    pub text: String,
}

/// [`note_once`] for a notice that must reach the owner: its `text` is kept,
/// owed by `instance`, until [`notice_handled`] marks it.
pub fn note_notice_once(
    tx: &Tx,
    key: &str,
    period_start: i64,
    at: i64,
    instance: &str,
    text: &str,
) -> StoreResult<bool> {
    let inserted: Option<i64> = tx.query_opt(
        "INSERT INTO spend_notices (key, period_start, at, text, instance) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (key, period_start) DO NOTHING RETURNING 1",
        params![key, period_start, at, text, instance],
        |r| r.get(0),
    )?;
    Ok(inserted.is_some())
}

/// The notices `instance` wrote and never handed on (it stopped first),
/// oldest first.
pub fn pending_notices(conn: &Conn, instance: &str) -> StoreResult<Vec<PendingNotice>> {
    conn.query_all(
        "SELECT key, period_start, text FROM spend_notices
         WHERE instance = ?1 AND handled_at IS NULL AND text IS NOT NULL
         ORDER BY at, key",
        params![instance],
        |r| {
            Ok(PendingNotice {
                key: r.get(0)?,
                period_start: r.get(1)?,
                text: r.get(2)?,
            })
        },
    )
}

/// The notice was handed to its channel (sent, or refused with a reason
/// that was logged): never pending again.
pub fn notice_handled(tx: &Tx, key: &str, period_start: i64, at: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE spend_notices SET handled_at = ?3 WHERE key = ?1 AND period_start = ?2 AND handled_at IS NULL",
        params![key, period_start, at],
    )?;
    Ok(())
}

/// Settled cost in one quarter hour (local days are made of these, in any
/// time zone) for one space, kind of call and model.
#[derive(Debug, Clone, PartialEq)]
pub struct CostBucket {
    pub space_id: Option<String>,
    pub purpose: String,
    pub model: String,
    /// Start of the quarter hour, ms.
    pub at: i64,
    pub amount: i64,
    pub calls: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

/// A quarter hour in ms.
pub const BUCKET_MS: i64 = 900_000;

/// Settled calls since `since`, in quarter hours.
pub fn cost_buckets(conn: &Conn, shadow: bool, since: i64) -> StoreResult<Vec<CostBucket>> {
    conn.query_all(
        "SELECT space_id, purpose, model, at / 900000, CAST(SUM(amount) AS BIGINT), COUNT(*),
                CAST(SUM(tokens_in) AS BIGINT), CAST(SUM(tokens_out) AS BIGINT)
         FROM spend_ledger WHERE shadow = ?1 AND at >= ?2 AND state = ?3
         GROUP BY space_id, purpose, model, at / 900000",
        params![i64::from(shadow), since, SETTLED],
        |r| {
            Ok(CostBucket {
                space_id: r.get(0)?,
                purpose: r.get(1)?,
                model: r.get(2)?,
                at: r.get::<_, i64>(3)? * BUCKET_MS,
                amount: r.get(4)?,
                calls: r.get(5)?,
                tokens_in: r.get(6)?,
                tokens_out: r.get(7)?,
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::spaces::{self, KvTable};

    #[test]
    fn a_spaces_caps_take_its_config_zone_unless_the_budget_names_one() {
        let db = crate::storage::test_conn();
        let conn = Tx::new(&db);
        spaces::create_space(&conn, "s1", "S1", &[]).unwrap();
        assert_eq!(space_caps(&conn, "s1").unwrap(), None);
        spaces::kv_set(
            &conn,
            KvTable::Config,
            "s1",
            "timezone",
            "Asia/Tokyo",
            "owner",
        )
        .unwrap();
        let caps = space_caps(&conn, "s1").unwrap().unwrap();
        assert_eq!(
            (caps.daily, caps.timezone.as_deref()),
            (None, Some("Asia/Tokyo"))
        );
        let own = SpaceBudget {
            space_id: "s1".into(),
            daily: Some(2.0),
            monthly: None,
            timezone: None,
            updated_at: 1,
        };
        set_space_budget(&conn, &own).unwrap();
        let caps = space_caps(&conn, "s1").unwrap().unwrap();
        assert_eq!(
            (caps.daily, caps.timezone.as_deref()),
            (Some(2.0), Some("Asia/Tokyo"))
        );
        set_space_budget(
            &conn,
            &SpaceBudget {
                timezone: Some("Europe/Amsterdam".into()),
                ..own
            },
        )
        .unwrap();
        let caps = space_caps(&conn, "s1").unwrap().unwrap();
        assert_eq!(caps.timezone.as_deref(), Some("Europe/Amsterdam"));
    }
}
