//! `mercury review rehearse ROW` (issue 31, item 5): replays a triage row's
//! flagged message on copies of the live bot, three times as it is and
//! three times with the row's drafted change, has the judge say of each
//! answer whether the finding's problem is still there, and attaches the
//! result (answers redacted, verdicts, each replay's side effects, cost)
//! to the row, which approval carries into the ledger.
//!
//! How: one snapshot of the live data dir under the shadow root; then, per
//! replay, a fresh snapshot *of that snapshot* (under
//! `<root>/rehearse-<snapshot>/`), the space's history cut just before the
//! flagged message, the draft applied for the candidate arm, the diff's
//! baseline taken again, a shadow host started on it (`mercury shadow up`'s
//! own guards), the message sent through its console as its owner, the
//! shadow stopped, its diff read, the copy removed.
//!
//! Must never: touch the live data dir or database (it is only read, by
//! the snapshot and for the message), rehearse a finding of another
//! source, spend anything but the shadow's budget, or leave a shadow
//! running.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use crate::client::{self, Connection, Endpoint};
use crate::host::shadow::{down, up, UpOptions};
use crate::redaction::{IdentifierGate, Redactor};
use crate::review::draft::{self, Draft, DraftOutcome};
use crate::review::intake::{self, Called, IntakeFinding, Verifier};
use crate::review::reader::{ExchangeReader, Window};
use crate::review::rehearse::{self, Arm, Rehearsal, RehearsalRun, RUNS_PER_ARM};
use crate::review::{ledger, scan};
use crate::shadow::diff::{self, DiffReport};
use crate::shadow::snapshot::{self, SnapshotOptions};
use crate::storage::{messages, Location, Store};
use crate::workspace::DataPaths;

/// Tokens of one comparison.
const COMPARE_MAX_TOKENS: u32 = 300;
/// Bytes of the file a draft is applied to.
const MAX_FILE: usize = 256 << 10;

/// Why a rehearsal stopped: exit 2 (refused, nothing done) or 1.
enum Stop {
    Refused(String),
    Failed(String),
}

pub async fn rehearse(data_dir: &Path, row: usize, root: Option<&Path>) -> ExitCode {
    match run(data_dir, row, root).await {
        Ok((r, snapshot)) => {
            for (i, run) in r.runs.iter().enumerate() {
                println!(
                    "replay {} ({}): {} [{}]{}",
                    i + 1,
                    run.arm.as_str(),
                    run.answer.replace('\n', " "),
                    match run.still {
                        Some(true) => "still there".to_owned(),
                        Some(false) => "fixed".to_owned(),
                        None => format!("no verdict: {}", run.reason),
                    },
                    if run.side_effects.is_empty() {
                        String::new()
                    } else {
                        format!("; side effects: {}", run.side_effects.join("; "))
                    }
                );
            }
            println!("row {row}: {}", r.verdict);
            println!(
                "cost {} (the shadow's budget); the snapshot {snapshot} stays under the shadow root \
                 (`mercury shadow prune` removes it)",
                crate::spend::format_amount(r.cost, &r.currency),
            );
            ExitCode::SUCCESS
        }
        Err(Stop::Refused(m)) => {
            eprintln!("mercury review rehearse: {m}");
            ExitCode::from(2)
        }
        Err(Stop::Failed(m)) => {
            eprintln!("mercury review rehearse: {m}");
            ExitCode::from(1)
        }
    }
}

/// What one replay needs of the row.
#[derive(Clone)]
struct Replay {
    space: String,
    text: String,
    finding: IntakeFinding,
    draft: Draft,
}

/// The rehearsal attached to the row, and the snapshot's id.
async fn run(
    data_dir: &Path,
    row: usize,
    root: Option<&Path>,
) -> Result<(Rehearsal, String), Stop> {
    let paths = DataPaths::new(data_dir);
    let s = crate::host::load_settings(&paths).map_err(|e| Stop::Refused(format!("{e:#}")))?;
    let dir = crate::cli::review_intake::intake_dir(&paths, &s);
    let gate = ledger::intake_gate(&s.review).map_err(Stop::Failed)?;
    // The triage row is rewritten at the end: no intake or approval between.
    let _lock = crate::workspace::data_dir::lock_intake(&paths)
        .map_err(|e| Stop::Refused(e.to_string()))?;
    let mut triage = ledger::pending(&dir)
        .map_err(|e| Stop::Failed(e.to_string()))?
        .ok_or_else(|| {
            Stop::Refused("no triage is waiting: run `mercury review intake` first".into())
        })?;
    let r = triage.rows.iter().find(|r| r.row == row).ok_or_else(|| {
        Stop::Refused(format!(
            "row {row} is not in the triage (it has {} rows)",
            triage.rows.len()
        ))
    })?;
    if triage.own_bot.as_deref() != Some(r.finding.bot.as_str()) {
        return Err(Stop::Refused(format!(
            "row {row} is a finding of {}, taken in from another source: only this host's own \
             findings are rehearsed (its workspace is not this host's)",
            r.finding.bot
        )));
    }
    let Some(draft) = r.draft.clone() else {
        return Err(Stop::Refused(format!(
            "row {row} has no drafted change to rehearse{}",
            r.draft_note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        )));
    };
    let finding = r.finding.clone();

    // The flagged message, read from the live store (never written).
    let live =
        crate::host::store_location(&s, &paths).map_err(|e| Stop::Failed(format!("{e:#}")))?;
    let store = Store::open_unmigrated(&live)
        .map_err(|e| Stop::Failed(format!("opening the live store: {e}")))?;
    let id = finding.message_id;
    let message = store
        .read(move |c| messages::get(c, id))
        .await
        .map_err(|e| Stop::Failed(format!("reading the flagged message: {e}")))?
        .filter(|m| m.role == "user")
        .ok_or_else(|| {
            Stop::Refused(format!(
                "row {row}'s message is not a user message of this host"
            ))
        })?;
    let replay = Replay {
        space: message.space_id.clone(),
        text: message.text.clone(),
        finding,
        draft,
    };
    let (redactor, space_gate) = space_redactor(&store, &s.review, &replay.space)?;
    drop(store);

    let root = crate::shadow::root_from(root, std::env::var("HOME").ok().as_deref())
        .map_err(|e| Stop::Refused(e.to_string()))?;
    let running = crate::shadow::manifest::running(&root)
        .map_err(|e| Stop::Failed(format!("the shadow root: {e}")))?;
    if let Some(r) = running {
        return Err(Stop::Refused(format!(
            "a shadow of snapshot {} runs under {}: stop it (`mercury shadow down`) first",
            r.snapshot,
            root.display()
        )));
    }
    let live_store = match live {
        at @ Location::Postgres { .. } => Some(at),
        Location::Sqlite(_) => None,
    };
    let base = take(
        SnapshotOptions {
            live_data_dir: data_dir.to_owned(),
            root: root.clone(),
            admins: Vec::new(),
            label: Some(format!("review rehearse row {row}")),
            port: None,
            progress: false,
            live_store,
        },
        false,
    )
    .await?;
    let snapshot_id = base.manifest.id.clone();
    // The draft must still fit the live file, as the snapshot saw it.
    apply_draft(&base.dir, &replay, &s, true)?;
    let runs_root = root.join(format!("rehearse-{}", base.manifest.id));
    crate::workspace::data_dir::private_dir(&runs_root)
        .map_err(|e| Stop::Failed(format!("creating {}: {e}", runs_root.display())))?;
    let result = replays(
        &s,
        &base.dir,
        &runs_root,
        &replay,
        (&redactor, &space_gate, &gate),
    )
    .await;
    // Every copy goes, whatever happened (but one whose shadow would not
    // stop, which the message names); the snapshot stays for `shadow diff`.
    let still_running =
        matches!(&result, Err(Stop::Failed(m)) if m.starts_with("stopping the shadow"));
    if !still_running {
        let _ = std::fs::remove_dir_all(&runs_root);
    }
    let (runs, replay_cost) = result?;

    // The judge compares on the snapshot's own ledger: the shadow's budget.
    let verifier = shadow_verifier(&s, &base.dir, &base.manifest.id).await?;
    let mut judged = Vec::with_capacity(runs.len());
    let mut judge_cost = 0.0;
    for (mut run, user) in runs {
        if run.still.is_none() && !run.answer.is_empty() {
            let prompt = rehearse::compare_prompt(&replay.finding, &user, &run.answer);
            if space_gate.check(&prompt).is_ok() && gate.check(&prompt).is_ok() {
                match intake::call(
                    &verifier,
                    crate::model::Purpose::Judge,
                    rehearse::compare_instructions(),
                    prompt,
                    COMPARE_MAX_TOKENS,
                )
                .await
                {
                    Called::Answer(a, cost) => {
                        judge_cost += cost;
                        match rehearse::parse_compare(&a).filter(|_| gate.check(&a).is_ok()) {
                            Some((still, reason)) => {
                                run.still = Some(still);
                                run.reason = reason;
                            }
                            None => {
                                run.reason =
                                    "the judge's answer was no verdict, or held an identifier"
                                        .into();
                            }
                        }
                    }
                    Called::Capped(cap) => run.reason = format!("a spend cap was reached ({cap})"),
                    Called::Failed => run.reason = "the judge call failed".into(),
                }
            } else {
                run.reason = "the replay could not be redacted for the judge".into();
            }
        }
        judged.push(run);
    }
    let (current_failed, candidate_passed, verdict) = rehearse::verdict(&judged);
    let rehearsal = Rehearsal {
        snapshot_at: base.manifest.created_at.clone(),
        at: crate::clock::ms_to_rfc3339(crate::clock::now_ms()),
        runs: judged,
        current_failed,
        candidate_passed,
        verdict,
        cost: replay_cost + judge_cost,
        currency: s.currency.clone(),
    };
    if let Some(r) = triage.rows.iter_mut().find(|r| r.row == row) {
        r.rehearsal = Some(rehearsal.clone());
    }
    intake::write_triage(&dir, &triage, &gate).map_err(|e| Stop::Failed(e.to_string()))?;
    Ok((rehearsal, snapshot_id))
}

/// A snapshot of the live data dir (or, `copy`, a replay's copy of that
/// snapshot), off the async runtime.
async fn take(opts: SnapshotOptions, copy: bool) -> Result<snapshot::SnapshotOutcome, Stop> {
    tokio::task::spawn_blocking(move || match copy {
        false => snapshot::take(&opts),
        true => snapshot::replay_copy(&opts),
    })
    .await
    .map_err(|e| Stop::Failed(format!("the snapshot: {e}")))?
    .map_err(|e| match e {
        crate::shadow::ShadowError::Refused(m) => Stop::Refused(m),
        e => Stop::Failed(format!("the snapshot: {e}")),
    })
}

/// The space's redactor (every identifier it ever saw) and its gate.
fn space_redactor(
    store: &Store,
    review: &crate::config::ReviewConfig,
    space: &str,
) -> Result<(Redactor, IdentifierGate), Stop> {
    let window = Window::hours_before(crate::clock::now_ms(), 24 * 3650);
    let reader = ExchangeReader::new(store, window);
    let ids = reader
        .identifiers(&[space.to_owned()])
        .map_err(|e| Stop::Failed(format!("reading the space's identifiers: {e}")))?;
    let redactor = Redactor::new(scan::redaction_list(review, ids))
        .map_err(|e| Stop::Failed(format!("the space's redaction list: {e}")))?;
    let gate = redactor.identifier_gate();
    Ok((redactor, gate))
}

/// Applies the row's draft to the space's file in the data dir `at` (a
/// copy); with `check_only`, only says whether it still fits.
fn apply_draft(
    at: &Path,
    r: &Replay,
    s: &crate::config::Settings,
    check_only: bool,
) -> Result<(), Stop> {
    let ws = DataPaths::new(at).spaces.join(&r.space);
    let outcome = match check_only {
        true => draft::text_in(&ws, &r.draft, MAX_FILE).err(),
        false => Some(draft::apply_in(
            &ws,
            &r.draft,
            MAX_FILE,
            s.sandbox.workspace_mb,
            (&s.workspace).into(),
        ))
        .filter(|o| *o != DraftOutcome::Applied),
    };
    match outcome {
        None => Ok(()),
        Some(DraftOutcome::Stale) => Err(Stop::Refused(format!(
            "the space's {} changed since the draft was made from it: run the intake again \
             for a fresh draft",
            r.draft.file
        ))),
        Some(o) => Err(Stop::Failed(format!(
            "applying the draft to the copy: {}",
            o.outcome(&r.draft.file)
        ))),
    }
}

/// The six replays, each in its own copy of `base`: the runs (judged
/// later) with their redacted user text, and the shadows' cost.
async fn replays(
    s: &crate::config::Settings,
    base: &Path,
    runs_root: &Path,
    r: &Replay,
    (redactor, space_gate, gate): (&Redactor, &IdentifierGate, &IdentifierGate),
) -> Result<(Vec<(RehearsalRun, String)>, f64), Stop> {
    let mut out = Vec::new();
    let mut cost = 0.0;
    let arms = [Arm::Current; RUNS_PER_ARM]
        .into_iter()
        .chain([Arm::Candidate; RUNS_PER_ARM]);
    for (i, arm) in arms.enumerate() {
        let copy = take(
            SnapshotOptions {
                live_data_dir: base.to_owned(),
                root: runs_root.to_owned(),
                admins: Vec::new(),
                label: Some(format!("replay {} ({})", i + 1, arm.as_str())),
                port: Some(free_port()?),
                progress: false,
                live_store: None,
            },
            true,
        )
        .await?;
        let (dir, r2, s2) = (copy.dir.clone(), r.clone(), s.clone());
        tokio::task::spawn_blocking(move || prepare(&dir, &r2, &s2, arm))
            .await
            .map_err(|e| Stop::Failed(format!("preparing replay {}: {e}", i + 1)))??;
        let started = up(&UpOptions {
            root: runs_root.to_owned(),
            snapshot: copy.manifest.id.clone(),
            max_age_ms: 24 * 3_600_000,
            min_free_mem: 512 << 20,
            min_free_disk: 1 << 30,
            window_ms: 30 * 60_000,
            port: None,
        })
        .await
        .map_err(|e| match e {
            crate::shadow::ShadowError::Refused(m) => Stop::Refused(m),
            e => Stop::Failed(format!("starting the shadow of replay {}: {e}", i + 1)),
        })?;
        let answer = ask(&started.running.url, &copy.dir, &r.space, &r.text).await;
        // A shadow that would not stop ends the rehearsal: none is left behind unsaid.
        let stopped = down(runs_root).await.map_err(|e| {
            Stop::Failed(format!(
                "stopping the shadow of replay {}: {e}; stop it with `mercury shadow down --root {}`",
                i + 1,
                runs_root.display()
            ))
        })?;
        let (answer, reason) = match answer {
            Ok(a) => (a, String::new()),
            Err(why) => (String::new(), why),
        };
        cost += stopped.cost;
        let side_effects = match diff::diff_redacted(&copy.dir, Some(&r.space), None) {
            Ok(d) => side_effects(&d, &answer),
            Err(e) => vec![format!("the diff could not be read: {e}")],
        };
        let mut fresh = redactor.fresh();
        let (user, answer) = (
            fresh.redact_identifiers(&r.text),
            fresh.redact_identifiers(&answer),
        );
        let answer = if space_gate.check(&answer).is_ok() && gate.check(&answer).is_ok() {
            rehearse::capped(&answer)
        } else {
            "[withheld by the identifier gate]".into()
        };
        out.push((
            RehearsalRun {
                arm,
                answer,
                still: None,
                reason,
                side_effects,
                cost: stopped.cost,
            },
            user,
        ));
        let _ = std::fs::remove_dir_all(&copy.dir);
    }
    Ok((out, cost))
}

/// The copy's history cut before the flagged message, the draft applied
/// for the candidate, and the diff's baseline taken again, so the diff
/// shows only what the replay did.
fn prepare(dir: &Path, r: &Replay, s: &crate::config::Settings, arm: Arm) -> Result<(), Stop> {
    crate::storage::snapshot::cut_history(&DataPaths::new(dir).db, &r.space, r.finding.message_id)
        .map_err(|e| Stop::Failed(format!("cutting the copy's history: {e}")))?;
    if arm == Arm::Candidate {
        apply_draft(dir, r, s, false)?;
    }
    diff::rebase(dir)
        .map(|_| ())
        .map_err(|e| Stop::Failed(format!("the copy's baseline: {e}")))
}

/// The flagged message sent through the shadow's console as its owner;
/// the reply's text, or why there is none.
async fn ask(url: &str, dir: &Path, space: &str, text: &str) -> Result<String, String> {
    let token = std::fs::read_to_string(DataPaths::new(dir).owner_token())
        .map_err(|e| format!("the shadow's owner token: {e}"))?;
    let endpoint = Endpoint::parse_url(url).map_err(|e| e.to_string())?;
    let mut conn = Connection::new(endpoint)
        .with_token(token.trim())
        .with_space(space);
    conn.timeout = std::time::Duration::from_secs(300);
    match client::request(
        &conn,
        reqwest::Method::POST,
        "/api/chat",
        Some(serde_json::json!({ "text": text })),
    )
    .await
    {
        Ok((200, v)) => Ok(v["reply"].as_str().unwrap_or_default().to_owned()),
        Ok((st, _)) => Err(format!("the shadow answered {st}")),
        Err(e) => Err(format!("the shadow did not answer: {e}")),
    }
}

/// What a replay changed besides its own exchange: rows, files, held sends
/// other than its reply, refusals (every line as the diff redacted it).
fn side_effects(d: &DiffReport, answer: &str) -> Vec<String> {
    let value =
        |v: &Option<diff::RowValue>| v.as_ref().map_or("(none)".to_owned(), |v| v.value.clone());
    let mut out: Vec<String> = d
        .rows
        .iter()
        .map(|c| {
            format!(
                "row {} {}/{}: {} -> {}",
                c.table,
                c.space,
                c.key,
                value(&c.before),
                value(&c.after)
            )
        })
        .collect();
    out.extend(
        d.files
            .iter()
            .map(|f| format!("file {}/{}: {:?}", f.space, f.path, f.change).to_lowercase()),
    );
    out.extend(
        d.sends
            .iter()
            .filter(|e| !(e.source == "reply" && e.text.trim() == answer.trim()))
            .map(|e| format!("held send ({}): {}", e.source, first_line(&e.text))),
    );
    out.extend(
        d.refusals
            .iter()
            .map(|e| format!("refused ({}): {}", e.source, first_line(&e.text))),
    );
    out
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(120).collect()
}

fn free_port() -> Result<u16, Stop> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Stop::Failed(format!("finding a free port: {e}")))
}

/// The judge model on the snapshot's own spend ledger (the shadow's
/// budget), under the review's gate of background calls.
async fn shadow_verifier(
    s: &crate::config::Settings,
    base: &Path,
    id: &str,
) -> Result<Verifier, Stop> {
    let spec = scan::judge_chain(s).into_iter().next().unwrap_or_default();
    let env = crate::config::process_env();
    let providers = crate::host::provider_settings(s, &env);
    let model = crate::model::resolve_model(&spec, &providers)
        .map_err(|e| Stop::Refused(format!("the judge model: {e}")))?;
    let store = Store::open_at(&Location::Sqlite(DataPaths::new(base).db))
        .map_err(|e| Stop::Failed(format!("the snapshot's spend ledger: {e}")))?;
    let shadow_settings = crate::host::load_settings(&DataPaths::new(base))
        .map_err(|e| Stop::Failed(format!("the snapshot's settings: {e:#}")))?;
    let spend = Arc::new(crate::spend::Spend::new(
        Arc::new(shadow_settings),
        store,
        format!("rehearse:{id}"),
        Arc::default(),
    ));
    Ok(Verifier {
        model: Arc::new(model),
        spend,
        gate: Arc::new(
            crate::model::gate::ModelGate::new(s.review.max_concurrency, s.review.calls_per_minute)
                .with_ceiling(s.review.calls_per_minute_max)
                .with_throttles(providers.throttles.clone()),
        ),
    })
}
