//! `mercury review intake` and `mercury review approve`: the operator's side
//! of the review intake (M2.1), run against this host's data dir (its
//! config names the intake dir, the redaction names and the model).
//!
//! Exit codes: 0 done, 1 failure while running, 2 usage (a bad argument,
//! a pending triage, nothing to approve).
//!
//! Must never: print a token, or apply a row the owner did not approve.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config::Settings;
use crate::redaction::IdentifierGate;
use crate::review::draft::DraftOutcome;
use crate::review::intake::{self, IntakeError, IntakeRun, Source, Verifier};
use crate::review::ledger::{self, Approval};
use crate::review::scan;
use crate::workspace::DataPaths;

/// The token `--from URL` sources pull with, when no --token-file is given.
pub const TOKEN_ENV: &str = "MERCURY_INTAKE_TOKEN";

/// The running host's judge model (`GET /api/status`, over its socket
/// with the owner token); `None` when no host answers or it names none.
async fn host_judge(paths: &DataPaths) -> Option<String> {
    let conn = crate::cli::ops::owner_connection(paths).ok()?;
    match crate::client::request(&conn, reqwest::Method::GET, "/api/status", None).await {
        Ok((200, v)) => v["review"]["judge_chain"][0]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        _ => None,
    }
}

/// `review.intake_dir`, or `<data_dir>/reviews/intake`.
pub fn intake_dir(paths: &DataPaths, s: &Settings) -> PathBuf {
    ledger::intake_dir(&paths.reviews, &s.review)
}

/// The gate of everything the intake writes: the identifier patterns and
/// this host's `review.owner_names`.
pub fn intake_gate(s: &Settings) -> Result<IdentifierGate, String> {
    ledger::intake_gate(&s.review)
}

fn settings(data_dir: &Path) -> Result<(DataPaths, Settings), String> {
    let paths = DataPaths::new(data_dir);
    let s = crate::host::load_settings(&paths).map_err(|e| format!("{e:#}"))?;
    Ok((paths, s))
}

fn fail(cmd: &str, e: &IntakeError) -> ExitCode {
    eprintln!("mercury review {cmd}: {e}");
    match e {
        IntakeError::Usage(_) => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

pub async fn intake(
    data_dir: &Path,
    from: &[String],
    since: Option<&str>,
    token_file: Option<&Path>,
) -> ExitCode {
    let (paths, s) = match settings(data_dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("mercury review intake: {e}");
            return ExitCode::from(2);
        }
    };
    let since = match since.map(|d| crate::review::catalog::parse_date(d).ok_or(d)) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(raw)) => {
            eprintln!("mercury review intake: --since {raw:?} is not a date YYYY-MM-DD");
            return ExitCode::from(2);
        }
    };
    let token = match token_file {
        Some(f) => match std::fs::read_to_string(f) {
            Ok(t) => Some(t.trim().to_owned()),
            Err(e) => {
                eprintln!("mercury review intake: cannot read {}: {e}", f.display());
                return ExitCode::from(2);
            }
        },
        None => std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty()),
    };
    let sources: Result<Vec<Source>, IntakeError> = if from.is_empty() {
        intake::parse_source(&format!("local={}", data_dir.display()), None).map(|s| vec![s])
    } else {
        from.iter()
            .map(|f| intake::parse_source(f, token.as_deref()))
            .collect()
    };
    let sources = match sources {
        Ok(s) => s,
        Err(e) => return fail("intake", &e),
    };
    let mut seen = std::collections::BTreeSet::new();
    for src in &sources {
        if !seen.insert(src.bot.clone()) {
            eprintln!(
                "mercury review intake: two sources are both named {:?}; name them with NAME=DATA_DIR|URL",
                src.bot
            );
            return ExitCode::from(2);
        }
    }
    let gate = match intake_gate(&s) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("mercury review intake: {e}");
            return ExitCode::from(1);
        }
    };
    let local = scan::judge_chain(&s).into_iter().next().unwrap_or_default();
    // The service's environment may name another judge than this shell's:
    // a running host's own answer wins.
    let spec = match host_judge(&paths).await {
        Some(hosted) if hosted != local => {
            eprintln!(
                "mercury review intake: verifying with the running host's judge model {hosted} (this shell's config says {local:?})"
            );
            hosted
        }
        _ => local,
    };
    let env = crate::config::process_env();
    let providers = crate::host::provider_settings(&s, &env);
    let resolved = match crate::model::resolve_model(&spec, &providers) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mercury review intake: the verify model: {e}");
            return ExitCode::from(2);
        }
    };
    // The verify calls are reserved in the data dir's own ledger, under the
    // same caps as the host's (its state.db, shared through WAL, or its server).
    let store = match crate::host::store_location(&s, &paths)
        .map_err(|e| format!("{e:#}"))
        .and_then(|at| crate::storage::Store::open_at(&at).map_err(|e| e.to_string()))
    {
        Ok(store) => store,
        Err(e) => {
            eprintln!("mercury review intake: the spend ledger: {e}");
            return ExitCode::from(1);
        }
    };
    // One intake per data dir, under one instance name: whatever that name
    // left reserved is a crashed run's, released before this run calls.
    let _lock = match crate::workspace::data_dir::lock_intake(&paths) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mercury review intake: {e}");
            return ExitCode::from(2);
        }
    };
    let instance = match crate::sandbox::instance_id_for(&paths.root) {
        Ok(id) => format!("intake:{id}"),
        Err(e) => {
            eprintln!("mercury review intake: the instance id: {e}");
            return ExitCode::from(1);
        }
    };
    let settings = std::sync::Arc::new(s.clone());
    let spend = std::sync::Arc::new(crate::spend::Spend::new(
        settings,
        store,
        instance,
        std::sync::Arc::default(),
    ));
    match spend.release_left_behind().await {
        Ok(0) => {}
        Ok(n) => eprintln!(
            "mercury review intake: released {n} reservation(s) a crashed intake left open"
        ),
        Err(e) => {
            eprintln!("mercury review intake: the spend ledger: {e}");
            return ExitCode::from(1);
        }
    }
    let verifier = Verifier {
        model: std::sync::Arc::new(resolved),
        spend,
        gate: std::sync::Arc::new(
            crate::model::gate::ModelGate::new(s.review.max_concurrency, s.review.calls_per_minute)
                .with_ceiling(s.review.calls_per_minute_max)
                .with_throttles(providers.throttles.clone()),
        ),
    };
    let dir = intake_dir(&paths, &s);
    let run = IntakeRun {
        intake_dir: &dir,
        sources: &sources,
        since,
        gate: &gate,
        verifier: &verifier,
        review: &s.review,
        own_data_dir: Some(data_dir),
    };
    match intake::run(&run).await {
        Ok(t) => {
            for r in &t.refused {
                eprintln!("not taken in: {} {}: {}", r.bot, r.date, r.reason);
            }
            if let Some(why) = &t.stopped {
                eprintln!("mercury review intake: {why}");
            }
            let counts: Vec<String> = intake::counts(&t)
                .into_iter()
                .map(|(d, n)| format!("{d} {n}"))
                .collect();
            println!(
                "took in {} report(s), refused {}; {} finding(s) to triage{}",
                t.taken_in.len(),
                t.refused.len(),
                t.rows.len(),
                if counts.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", counts.join(", "))
                }
            );
            println!("triage: {}", dir.join("triage.md").display());
            ExitCode::SUCCESS
        }
        Err(e) => fail("intake", &e),
    }
}

pub async fn approve(
    data_dir: &Path,
    all: bool,
    rows: Option<&str>,
    sets: &[String],
    by: &str,
) -> ExitCode {
    let (paths, s) = match settings(data_dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("mercury review approve: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = intake_dir(&paths, &s);
    let gate = match intake_gate(&s) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("mercury review approve: {e}");
            return ExitCode::from(1);
        }
    };
    let approval = match ledger::parse_approval(all, rows, sets) {
        Ok(Some(a)) => a,
        Ok(None) if std::io::stdin().is_terminal() => match ask(&dir) {
            Ok(a) => a,
            Err(e) => return fail("approve", &e),
        },
        Ok(None) => {
            eprintln!("mercury review approve: give --all, --rows 1,3 or --set 2=new (or run it on a terminal to be asked)");
            return ExitCode::from(2);
        }
        Err(e) => return fail("approve", &e),
    };
    // The intake, this and the dashboard's approval each rewrite the triage
    // and the ledger: one at a time, so no ledger row is lost.
    let _lock = match crate::workspace::data_dir::lock_intake(&paths) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mercury review approve: {e}");
            return ExitCode::from(2);
        }
    };
    // A drafted change is applied through the running host (its space's
    // one writer): without one, nothing is approved.
    let owner = owner_connection_if_drafts(&paths, &dir, &approval).await;
    let owner = match owner {
        Ok(c) => c,
        Err(e) => return fail("approve", &e),
    };
    let a = match ledger::approve(&dir, &approval, by, &gate) {
        Ok(a) => a,
        Err(e) => return fail("approve", &e),
    };
    println!(
        "{} of {} row(s) approved and applied; every row is in {}",
        a.applied,
        a.rows,
        dir.join("ledger.json").display()
    );
    for w in &a.written {
        println!("wrote {w}");
    }
    let mut code = ExitCode::SUCCESS;
    if let Some(conn) = owner {
        let store = crate::host::store_location(&s, &paths)
            .ok()
            .and_then(|at| crate::storage::Store::open_unmigrated(&at).ok());
        for d in &a.drafts {
            let applied = apply_draft(&conn, store.as_ref(), d).await;
            let outcome = applied.outcome(&d.draft.file);
            println!("row {}: draft of {}: {outcome}", d.row, d.draft.file);
            if applied != DraftOutcome::Applied {
                code = ExitCode::from(1);
            }
            if let Err(e) = ledger::record_draft_outcome(&dir, &d.ledger_id, &outcome, &gate) {
                return fail("approve", &e);
            }
        }
    }
    code
}

/// The owner's connection to the running host when the approval carries a
/// draft; `Usage` (nothing written) when no host answers then.
async fn owner_connection_if_drafts(
    paths: &DataPaths,
    dir: &Path,
    approval: &Approval,
) -> Result<Option<crate::client::Connection>, IntakeError> {
    let Some(triage) = ledger::pending(dir)? else {
        return Ok(None);
    };
    let rows = ledger::carries_drafts(&triage, approval);
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let refused = || {
        IntakeError::Usage(format!(
            "row {first} carries a drafted change, which is applied through the running host's \
             files API, and no host answers on {}: start it (`mercury run`), or leave the row \
             out; nothing was approved",
            paths.socket.display()
        ))
    };
    let conn = crate::cli::ops::owner_connection(paths).map_err(|_| refused())?;
    match crate::client::request(&conn, reqwest::Method::GET, "/api/status", None).await {
        Ok((200, _)) => Ok(Some(conn)),
        _ => Err(refused()),
    }
}

/// Applies one approved draft: its space from its message, the file read
/// and checked against the draft's base, then written under `If-Match`.
async fn apply_draft(
    conn: &crate::client::Connection,
    store: Option<&crate::storage::Store>,
    d: &ledger::ApprovedDraft,
) -> DraftOutcome {
    let Some(store) = store else {
        return DraftOutcome::Refused("this host's store could not be opened");
    };
    let id = d.message_id;
    let space = match store
        .read(move |c| crate::storage::messages::get(c, id))
        .await
    {
        Ok(Some(m)) => m.space_id,
        _ => return DraftOutcome::Refused("its message is not in this host's store"),
    };
    let conn = conn.clone().with_space(space);
    let path = format!("/api/files/{}", d.draft.file);
    let now = match crate::client::request(&conn, reqwest::Method::GET, &path, None).await {
        Ok((200, v)) => match (v["content"].as_str(), v["hash"].as_str()) {
            (Some(text), Some(hash)) => Some((text.to_owned(), hash.to_owned())),
            _ => return DraftOutcome::Refused("the host's answer had no content"),
        },
        Ok((404, _)) => None,
        _ => return DraftOutcome::Refused("the file could not be read through the host"),
    };
    let text = match d
        .draft
        .new_text(now.as_ref().map(|(t, h)| (t.as_str(), h.as_str())))
    {
        Ok(t) => t,
        Err(a) => return a,
    };
    let header = if now.is_some() {
        "if-match"
    } else {
        "if-none-match"
    };
    let body = serde_json::json!({ "content": text });
    match crate::client::request_with_headers(
        &conn,
        reqwest::Method::PUT,
        &path,
        Some(body),
        &[(header, d.draft.expect())],
    )
    .await
    {
        Ok((200, _)) => DraftOutcome::Applied,
        Ok((412, _)) => DraftOutcome::Stale,
        Ok(_) => DraftOutcome::Refused("the host refused the write"),
        Err(_) => DraftOutcome::Refused("no host answered the write"),
    }
}

/// On a terminal: each row, then `y` (as proposed), `n`, or a decision.
fn ask(dir: &Path) -> Result<Approval, IntakeError> {
    let t = ledger::pending(dir)?.ok_or_else(|| {
        IntakeError::Usage("no triage is waiting: run `mercury review intake` first".into())
    })?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut chosen = Vec::new();
    for r in &t.rows {
        println!("{}", ledger::describe_row(r));
        loop {
            print!("approve? [y]es as proposed / [n]o / a decision: ");
            let _ = std::io::stdout().flush();
            let Some(Ok(line)) = lines.next() else {
                return Ok(Approval::Rows(chosen));
            };
            match line.trim() {
                "y" | "yes" | "" => {
                    chosen.push((r.row, None));
                    break;
                }
                "n" | "no" => break,
                other => match intake::Decision::parse(other) {
                    Some(d) => {
                        chosen.push((r.row, Some(d)));
                        break;
                    }
                    None => println!("not a decision: {other}"),
                },
            }
        }
    }
    Ok(Approval::Rows(chosen))
}
