//! The intake (M2.1): bring the daily reports of any number of Mercury hosts
//! into the operator's review directory and triage each finding before any
//! of it becomes work.
//!
//! Steps, per run of `mercury review intake`:
//! 1. **pull**: each source's daily reports not yet taken in (a data dir is
//!    read through [`catalog`]; a URL through `GET /api/review/reports`
//!    with a `review.read` token), from `--since` on;
//! 2. **re-gate**: every report goes through the identifier gate again
//!    (fail closed: one that fails is not taken in, and the outcome names
//!    the bot, the date and the kinds found); the rest are stored under
//!    `<intake_dir>/reports/<bot>/<date>/report.json`;
//! 3. per finding: **duplicate** when its fingerprint is the same finding as
//!    an earlier one (an approved ledger row, or earlier in this triage: it
//!    follows that decision); else **verify** (the finding re-judged, model
//!    purpose `intake`, with the redacted exchange when the source is a data dir;
//!    "fine" proposes `reject`); else **relate** ([`relate`]) and
//!    **decide**: a landed item not deployed → `fixed-not-deployed`, a
//!    deployed one → `revisit`, an open idea or bug → `attach`, else `new`.
//! 4. the triage table, `triage.md` and `triage.json`, gated and written
//!    atomically. Nothing is applied here: see [`ledger`](super::ledger).
//!
//! Must never: store or write anything the gate has not passed, build a
//! path from a bot name or date it has not validated, or apply a decision.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::client::{self, Connection};
use crate::model::gate::ModelGate;
use crate::model::{ChatMessage, ModelRequest, Purpose, Role};
use crate::redaction::{kind_list, IdentifierGate, Redactor};
use crate::review::catalog::{self, ReportKind, ReportName};
use crate::review::draft::{self, Draft};
use crate::review::fingerprint::Fingerprint;
use crate::review::judge::{FindingKind, Scope, TargetLayer};
use crate::review::reader::{ExchangeReader, Window};
use crate::review::relate::{ItemKind, Match, Ranker};
use crate::review::report;

/// Tokens of a verify answer.
const VERIFY_MAX_TOKENS: u32 = 400;
/// Characters kept of a verify reason.
const REASON_CAP: usize = 300;

#[derive(Debug, thiserror::Error)]
pub(crate) enum IntakeError {
    #[error("{0}")]
    Usage(String),
    #[error("reading the reports of {bot}: {detail}")]
    Source { bot: String, detail: String },
    #[error("{what} in {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON of the intake ({reason})")]
    Invalid { path: String, reason: String },
    #[error("the {what} would hold an identifier ({kinds}); nothing was written")]
    Gated { what: &'static str, kinds: String },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> IntakeError + 'a {
    move |source| IntakeError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// Where a bot's reports come from.
#[derive(Debug, Clone)]
pub(crate) enum SourceKind {
    DataDir(PathBuf),
    Url(Connection),
}

#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// A validated bot name ([`validate_bot`]).
    pub bot: String,
    pub kind: SourceKind,
}

/// A bot name is a path segment under `reports/`: 1–40 of `a-z 0-9 - _ .`,
/// not starting with a dot.
pub(crate) fn validate_bot(raw: &str) -> Result<String, IntakeError> {
    let ok = !raw.is_empty()
        && raw.len() <= 40
        && !raw.starts_with('.')
        && raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(raw.to_owned())
    } else {
        Err(IntakeError::Usage(format!(
            "bot name {:?} must be 1 to 40 of a-z, 0-9, '-', '_', '.' (not starting with '.')",
            raw.chars().take(40).collect::<String>()
        )))
    }
}

/// `--from [NAME=]DATA_DIR|URL`: a URL starts with `http://`; the name
/// defaults to the data dir's last component or the URL's `host-port`.
pub(crate) fn parse_source(raw: &str, token: Option<&str>) -> Result<Source, IntakeError> {
    let (name, target) = match raw.split_once('=') {
        Some((n, t)) if !n.contains('/') && !n.contains(':') => (Some(n), t),
        _ => (None, raw),
    };
    if target.to_ascii_lowercase().starts_with("http://") {
        let endpoint =
            client::Endpoint::parse_url(target).map_err(|e| IntakeError::Usage(e.to_string()))?;
        let default_name = match &endpoint {
            client::Endpoint::Http { host, port, .. } => format!("{host}-{port}"),
            client::Endpoint::Unix(_) => "socket".to_owned(),
        };
        let token = token.ok_or_else(|| {
            IntakeError::Usage(format!(
                "{target} needs a review.read token: give --token-file (or MERCURY_INTAKE_TOKEN)"
            ))
        })?;
        let bot = validate_bot(&name.map_or(default_name.replace(':', "-"), str::to_owned))?;
        return Ok(Source {
            bot,
            kind: SourceKind::Url(Connection::new(endpoint).with_token(token)),
        });
    }
    let dir = PathBuf::from(target);
    let default_name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("local")
        .to_ascii_lowercase();
    let bot = validate_bot(name.unwrap_or(&default_name))?;
    Ok(Source {
        bot,
        kind: SourceKind::DataDir(dir),
    })
}

/// One finding as the intake reads it from a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct IntakeFinding {
    pub bot: String,
    pub date: String,
    pub space: String,
    pub message_id: i64,
    pub kind: FindingKind,
    pub scope: Scope,
    pub target_layer: TargetLayer,
    pub severity: u8,
    pub summary: String,
    pub evidence: String,
    pub suggestion: String,
}

impl IntakeFinding {
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        Fingerprint::new(
            &self.space,
            self.kind.as_str(),
            self.target_layer.as_str(),
            &self.summary,
        )
    }

    /// What the ranker is asked with.
    pub(crate) fn query(&self) -> String {
        format!(
            "{} {} {} {}",
            self.kind.as_str().replace('_', " "),
            self.target_layer.as_str().replace('_', " "),
            self.summary,
            self.suggestion
        )
    }
}

/// The findings of a report's JSON; items that do not hold are counted.
pub(crate) fn findings_of(bot: &str, date: &str, json: &Value) -> (Vec<IntakeFinding>, u32) {
    let mut out = Vec::new();
    let mut bad = 0;
    for f in json["findings"].as_array().into_iter().flatten() {
        let s = |k: &str| f[k].as_str().map(str::to_owned);
        let parsed = (|| {
            Some(IntakeFinding {
                bot: bot.to_owned(),
                date: date.to_owned(),
                space: s("space")?,
                message_id: f["message_id"].as_i64()?,
                kind: FindingKind::parse(f["kind"].as_str()?)?,
                scope: Scope::parse(f["scope"].as_str()?)?,
                target_layer: TargetLayer::parse(f["target_layer"].as_str()?)?,
                severity: u8::try_from(f["severity"].as_u64()?).ok()?,
                summary: s("summary")?,
                evidence: s("evidence").unwrap_or_default(),
                suggestion: s("suggestion").unwrap_or_default(),
            })
        })();
        match parsed {
            Some(p) => out.push(p),
            None => bad += 1,
        }
    }
    (out, bad)
}

/// The decisions a triage row can propose or an owner approve.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Decision {
    Reject,
    Attach,
    FixedNotDeployed,
    Revisit,
    Duplicate,
    New,
}

impl Decision {
    pub(crate) const ALL: [Decision; 6] = [
        Decision::Reject,
        Decision::Attach,
        Decision::FixedNotDeployed,
        Decision::Revisit,
        Decision::Duplicate,
        Decision::New,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Decision::Reject => "reject",
            Decision::Attach => "attach",
            Decision::FixedNotDeployed => "fixed-not-deployed",
            Decision::Revisit => "revisit",
            Decision::Duplicate => "duplicate",
            Decision::New => "new",
        }
    }

    pub(crate) fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == raw.trim())
    }
}

/// What a duplicate follows: an earlier ledger row or an earlier row of
/// this triage, and that row's decision and paths as known now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Follows {
    /// The earlier row's ledger id, when it is in the ledger.
    pub ledger_id: Option<String>,
    /// The earlier row's number in this triage, when it is here.
    pub row: Option<usize>,
    pub decision: Option<Decision>,
    pub paths: Vec<String>,
}

/// One row of the triage table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TriageRow {
    /// 1-based, as `approve --rows` names it.
    pub row: usize,
    pub finding: IntakeFinding,
    pub fingerprint: Fingerprint,
    pub proposed: Decision,
    pub reason: String,
    /// Known items matched, best first (relative to the intake dir).
    pub paths: Vec<String>,
    pub follows: Option<Follows>,
    /// A drafted change of the space's `AGENTS.md` or `MEMORY.md`, for a
    /// finding of this host's own bot on that layer ([`draft`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<Draft>,
    /// Why a finding that could have had a draft has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_note: Option<String>,
    /// What `mercury review rehearse` found replaying the finding with and
    /// without the draft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rehearsal: Option<crate::review::rehearse::Rehearsal>,
}

/// A report that was not taken in, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Refused {
    pub bot: String,
    pub date: String,
    pub reason: String,
}

/// `triage.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Triage {
    /// RFC 3339, UTC.
    pub made_at: String,
    /// Reports taken in by this intake, as `<bot>/<date>`.
    pub taken_in: Vec<String>,
    pub refused: Vec<Refused>,
    /// Findings of taken-in reports that did not validate.
    pub invalid_findings: u32,
    pub rows: Vec<TriageRow>,
    /// Set by `approve` once the rows are in the ledger.
    pub approved_at: Option<String>,
    /// Why the intake stopped before every finding was triaged (the verify
    /// call budget); the reports left are taken in by the next intake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// The bot name of this host's own source, whose findings are drafted
    /// and may be rehearsed; `None` when the intake read no such source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_bot: Option<String>,
}

/// The verify step's model (the CLI resolves it from the config).
#[derive(Clone)]
pub(crate) struct Verifier {
    /// The verify model (its spec prices the call).
    pub model: Arc<crate::model::ResolvedModel>,
    /// Every verify call is reserved and settled through the spend seam.
    pub spend: Arc<crate::spend::Spend>,
    /// Every verify call waits for a background permit (a slot and
    /// `review.calls_per_minute`), as the judge's calls do.
    pub gate: Arc<ModelGate>,
}

/// The intake's whole context.
pub(crate) struct IntakeRun<'a> {
    pub intake_dir: &'a Path,
    pub sources: &'a [Source],
    pub since: Option<chrono::NaiveDate>,
    pub gate: &'a IdentifierGate,
    pub verifier: &'a Verifier,
    /// This host's review config: the redaction of a data dir source's
    /// exchanges for the verify step.
    pub review: &'a crate::config::ReviewConfig,
    /// This host's data dir: a source reading it is this host's own bot,
    /// whose findings get drafted fixes. `None`: nothing is drafted.
    pub own_data_dir: Option<&'a Path>,
}

/// The instructions of a verify call.
pub(crate) fn verify_instructions() -> &'static str {
    "You double-check a finding another reviewer raised about a chat assistant's reply. \
You get the finding's kind, its summary, the quoted evidence from the exchange and the \
suggested fix. Decide whether the assistant's reply was really wrong. Answer with JSON only: \
{\"real\": true|false, \"reason\": \"one sentence\"}. Personal identifiers were replaced by \
placeholders such as [PERSON_1]; keep them as they are and never write a real name or number."
}

fn verify_prompt(f: &IntakeFinding, exchange: Option<&str>) -> String {
    format!(
        "kind: {}\nscope: {}\ntarget layer: {}\nseverity: {}\nsummary: {}\nevidence: {}\nsuggestion: {}\nexchange:\n{}\n",
        f.kind.as_str(),
        f.scope.as_str(),
        f.target_layer.as_str(),
        f.severity,
        f.summary,
        f.evidence,
        f.suggestion,
        exchange.unwrap_or("(not available: the report was pulled over HTTP)")
    )
}

/// The exchanges of the data dir sources for the verify step: each source's
/// database is opened once per run, and each space's redactor and gate are
/// built once, when a finding of that space first needs them.
struct Exchanges<'a> {
    sources: &'a [Source],
    review: &'a crate::config::ReviewConfig,
    /// Per bot; `None` when it is no data dir source, has no database, or
    /// the database does not open.
    bots: HashMap<String, Option<SourceExchanges>>,
}

struct SourceExchanges {
    reader: ExchangeReader,
    /// Per space: the redactor of its identifiers, never used itself (each
    /// exchange gets a [`Redactor::fresh`] one, so its placeholders are
    /// numbered from 1), and that redactor's gate. `None` when the
    /// identifiers cannot be read or their list does not compile.
    spaces: HashMap<String, Option<(Redactor, IdentifierGate)>>,
}

impl<'a> Exchanges<'a> {
    fn new(sources: &'a [Source], review: &'a crate::config::ReviewConfig) -> Self {
        Self {
            sources,
            review,
            bots: HashMap::new(),
        }
    }

    /// The exchange of a finding from a data dir source (its user message
    /// and the bot's reply), redacted with that space's identifiers and
    /// gated by both gates: what the verify step re-judges. `None` when it
    /// cannot be read or would not pass (the verify then works from the
    /// finding alone).
    fn redacted(&mut self, bot: &str, message_id: i64, gate: &IdentifierGate) -> Option<String> {
        let (_, text, reply, mut redactor, theirs) = self.exchange(bot, message_id)?;
        let out = format!(
            "user: {}\nassistant: {}",
            redactor.redact_identifiers(&text),
            redactor.redact_identifiers(&reply)
        );
        (theirs.check(&out).is_ok() && gate.check(&out).is_ok()).then_some(out)
    }

    /// A data dir source's exchange (space, user text, reply) with a fresh
    /// redactor of that space's identifiers and its gate.
    fn exchange(
        &mut self,
        bot: &str,
        message_id: i64,
    ) -> Option<(String, String, String, Redactor, &IdentifierGate)> {
        let (sources, review) = (self.sources, self.review);
        let src = self
            .bots
            .entry(bot.to_owned())
            .or_insert_with(|| open_source(sources, bot))
            .as_mut()?;
        let (space, text, reply) = src.reader.exchange(message_id).ok().flatten()?;
        let reader = &src.reader;
        let (redactor, theirs) = src
            .spaces
            .entry(space.clone())
            .or_insert_with(|| {
                let list = super::scan::redaction_list(
                    review,
                    reader.identifiers(std::slice::from_ref(&space)).ok()?,
                );
                let redactor = Redactor::new(list).ok()?;
                let gate = redactor.identifier_gate();
                Some((redactor, gate))
            })
            .as_ref()?;
        Some((space, text, reply, redactor.fresh(), theirs))
    }
}

/// The reader of a data dir source's database, over every identifier the
/// source ever saw (not only today's).
fn open_source(sources: &[Source], bot: &str) -> Option<SourceExchanges> {
    let paths = sources
        .iter()
        .find(|s| s.bot == bot)
        .and_then(|s| match &s.kind {
            SourceKind::DataDir(dir) => Some(crate::workspace::DataPaths::new(dir)),
            SourceKind::Url(_) => None,
        })?;
    // Where that deployment keeps its rows, as its own host would find them.
    let settings = crate::config::load(&paths.config, &crate::config::process_env()).ok()?;
    let window = Window::hours_before(crate::clock::now_ms(), 24 * 3650);
    let reader = match crate::storage::Location::of(&settings.storage, &paths.db).ok()? {
        crate::storage::Location::Sqlite(db) if db.is_file() => {
            ExchangeReader::open(&db, window).ok()?
        }
        crate::storage::Location::Sqlite(_) => return None,
        // Read only: the source is not migrated by an intake.
        at @ crate::storage::Location::Postgres { .. } => {
            ExchangeReader::new(&crate::storage::Store::open_unmigrated(&at).ok()?, window)
        }
    };
    Some(SourceExchanges {
        reader,
        spaces: HashMap::new(),
    })
}

/// The verdict of a verify call: `Some(false)` is "re-judged fine".
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verified {
    pub real: Option<bool>,
    pub reason: String,
    /// A spend cap stopped the call: the cap, in words.
    pub capped: Option<String>,
}

/// What one call of the intake's model came to.
pub(crate) enum Called {
    /// The answer's text and what it cost.
    Answer(String, f64),
    /// A spend cap stopped it: the cap, in words.
    Capped(String),
    Failed,
}

/// One call of the intake's model (verify, draft, or a rehearsal's
/// comparison as `Purpose::Judge`): a background permit, reserved and
/// settled through the spend seam under the same purpose.
pub(crate) async fn call(
    v: &Verifier,
    purpose: Purpose,
    system: &str,
    user: String,
    max_tokens: u32,
) -> Called {
    let what = purpose.as_str();
    let req = ModelRequest {
        model: v.model.model.clone(),
        purpose,
        messages: vec![
            ChatMessage::text(Role::System, system),
            ChatMessage::text(Role::User, user),
        ],
        tools: Vec::new(),
        max_tokens,
    };
    let charge = crate::spend::Charge {
        space: None,
        purpose: match purpose {
            Purpose::Judge => crate::spend::SpendPurpose::Judge,
            _ => crate::spend::SpendPurpose::Intake,
        },
    };
    let called = {
        let _permit = v.gate.background().await;
        v.spend.call(&charge, &v.model.spec, &v.model, &req).await
    };
    match called {
        Ok(a) => Called::Answer(a.response.text, a.cost),
        Err(crate::spend::SpendError::Capped(hit)) => Called::Capped(hit.to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "intake {what} call failed");
            Called::Failed
        }
    }
}

pub(crate) async fn verify(
    v: &Verifier,
    gate: &IdentifierGate,
    f: &IntakeFinding,
    exchange: Option<&str>,
) -> Verified {
    let unverified = |why: &str| Verified {
        real: None,
        reason: format!("not verified ({why}); kept as real"),
        capped: None,
    };
    let prompt = verify_prompt(f, exchange);
    let answer = match call(
        v,
        Purpose::Intake,
        verify_instructions(),
        prompt,
        VERIFY_MAX_TOKENS,
    )
    .await
    {
        Called::Answer(a, _) => a,
        Called::Capped(hit) => {
            return Verified {
                capped: Some(hit),
                ..unverified("a spend cap was reached")
            }
        }
        Called::Failed => return unverified("the model call failed"),
    };
    // Fail closed: an answer with an identifier is not used at all.
    if gate.check(&answer).is_err() {
        return unverified("the answer held an identifier");
    }
    let Some(start) = answer.find('{') else {
        return unverified("the answer was not JSON");
    };
    let mut values = serde_json::Deserializer::from_str(&answer[start..]).into_iter::<Value>();
    let Some(Ok(v)) = values.next() else {
        return unverified("the answer was not JSON");
    };
    let Some(real) = v["real"].as_bool() else {
        return unverified("the answer had no `real`");
    };
    let reason: String = v["reason"]
        .as_str()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(REASON_CAP)
        .collect();
    Verified {
        real: Some(real),
        reason,
        capped: None,
    }
}

/// Tokens of a draft answer.
const DRAFT_MAX_TOKENS: u32 = 1200;
/// Bytes of a file the drafter reads.
const DRAFT_MAX_BYTES: usize = 64 << 10;

/// What drafting a row came to.
enum Drafted {
    Made(Draft),
    /// No draft, and why (a sentence for the triage).
    NotMade(String),
    /// A spend cap stopped the call.
    Capped(String),
}

/// The bot name of the source that reads `own` (this host's data dir).
fn own_bot(sources: &[Source], own: &Path) -> Option<String> {
    let own = std::fs::canonicalize(own).ok()?;
    sources.iter().find_map(|s| match &s.kind {
        SourceKind::DataDir(d) if std::fs::canonicalize(d).ok()? == own => Some(s.bot.clone()),
        _ => None,
    })
}

/// Whether a row gets a draft: this host's bot, a layer with a file, and
/// a decision that leads to work (not rejected, not a duplicate, not
/// already fixed).
fn wants_draft(row: &TriageRow, own: Option<&str>) -> bool {
    own == Some(row.finding.bot.as_str())
        && draft::file_of(row.finding.target_layer).is_some()
        && matches!(
            row.proposed,
            Decision::New | Decision::Attach | Decision::Revisit
        )
}

/// Drafts the change a row's finding asks for in its space's file.
async fn draft_row(
    ctx: &IntakeRun<'_>,
    exchanges: &mut Exchanges<'_>,
    own: &Path,
    f: &IntakeFinding,
) -> Drafted {
    let no = |why: &str| Drafted::NotMade(why.to_owned());
    let Some(file) = draft::file_of(f.target_layer) else {
        return no("its layer has no file to draft");
    };
    let Some((space, _, _, mut redactor, theirs)) = exchanges.exchange(&f.bot, f.message_id) else {
        return no("its exchange could not be read");
    };
    let Ok(space) = crate::ids::SpaceId::parse(&space) else {
        return no("its space id is not one this host makes");
    };
    let workspace = crate::workspace::DataPaths::new(own).workspace(&space);
    let (base, base_hash) = match crate::workspace::files::read(&workspace, file, DRAFT_MAX_BYTES) {
        Ok(c) => (c.content, draft::hash_letters(&c.hash)),
        Err(crate::workspace::files::FilesError::Path(
            crate::workspace::safe::SafePathError::NotFound(_),
        )) => (String::new(), String::new()),
        Err(_) => return no("the file could not be read (not text, or too large)"),
    };
    let lines: Vec<&str> = base.lines().collect();
    if lines.len() > draft::MAX_LINES {
        return no("the file is longer than the drafter reads");
    }
    let redacted: Vec<String> = lines
        .iter()
        .map(|l| redactor.redact_identifiers(l))
        .collect();
    let finding = format!(
        "kind: {}\nsummary: {}\nevidence: {}\nsuggestion: {}",
        f.kind.as_str(),
        one_line(&f.summary),
        one_line(&f.evidence),
        one_line(&f.suggestion)
    );
    let prompt = draft::prompt(file, &redacted, &finding);
    if theirs.check(&prompt).is_err() || ctx.gate.check(&prompt).is_err() {
        return no("the file could not be redacted for the model");
    }
    let answer = match call(
        ctx.verifier,
        Purpose::Intake,
        draft::instructions(),
        prompt,
        DRAFT_MAX_TOKENS,
    )
    .await
    {
        Called::Answer(a, _) => a,
        Called::Capped(hit) => return Drafted::Capped(hit),
        Called::Failed => return no("the draft call failed"),
    };
    let (edit, reason) = match draft::parse_answer(&answer, lines.len()) {
        Ok(x) => x,
        Err(e) => return Drafted::NotMade(format!("the draft was refused: {e}")),
    };
    let diff = draft::unified_diff(file, &base, &edit);
    // Fail closed: the diff shows the file's own lines, and the added ones
    // are the model's.
    let text = format!("{diff}\n{reason}\n{}", edit.add.join("\n"));
    if theirs.check(&text).is_err() || ctx.gate.check(&text).is_err() {
        return no("the draft would hold an identifier");
    }
    Drafted::Made(Draft {
        file: file.to_owned(),
        base_hash,
        edit,
        diff,
        reason,
        outcome: None,
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Lists a source's daily reports from `since` on.
async fn list_source(src: &Source) -> Result<Vec<ReportName>, IntakeError> {
    let err = |detail: String| IntakeError::Source {
        bot: src.bot.clone(),
        detail,
    };
    let entries: Vec<(String, String)> = match &src.kind {
        SourceKind::DataDir(dir) => {
            let reviews = crate::workspace::DataPaths::new(dir).reviews;
            catalog::list(&reviews)
                .map_err(|e| err(e.to_string()))?
                .into_iter()
                .filter(|e| e.kind == ReportKind::Daily)
                .map(|e| (e.name, e.date))
                .collect()
        }
        SourceKind::Url(conn) => {
            let (st, v) = client::request(conn, hyper::Method::GET, "/api/review/reports", None)
                .await
                .map_err(|e| err(e.to_string()))?;
            if st != 200 {
                return Err(err(format!(
                    "GET /api/review/reports answered {st}: {}",
                    v["error"]["message"]
                        .as_str()
                        .or(v["message"].as_str())
                        .unwrap_or("")
                )));
            }
            v["reports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["kind"] == "daily")
                .filter_map(|e| {
                    Some((
                        e["name"].as_str()?.to_owned(),
                        e["date"].as_str()?.to_owned(),
                    ))
                })
                .collect()
        }
    };
    let mut out = Vec::new();
    for (name, _) in entries {
        // Names from a remote host are parsed like any client input.
        let Ok(n) = ReportName::parse(&name) else {
            continue;
        };
        out.push(n);
    }
    Ok(out)
}

async fn fetch_report(src: &Source, name: &ReportName) -> Result<Value, String> {
    match &src.kind {
        SourceKind::DataDir(dir) => {
            let reviews = crate::workspace::DataPaths::new(dir).reviews;
            catalog::read(&reviews, name).map_err(|e| e.to_string())
        }
        SourceKind::Url(conn) => {
            let path = format!("/api/review/reports/{}", name.date);
            let (st, v) = client::request(conn, hyper::Method::GET, &path, None)
                .await
                .map_err(|e| e.to_string())?;
            if st != 200 {
                return Err(format!("GET {path} answered {st}"));
            }
            Ok(v["report"].clone())
        }
    }
}

/// Where a taken-in report is stored.
pub(crate) fn stored_dir(intake_dir: &Path, bot: &str, date: &str) -> PathBuf {
    intake_dir.join("reports").join(bot).join(date)
}

/// The stored findings of the days in `dates`, oldest first (the weekly's
/// window: only those days' reports are read).
pub(crate) fn stored_findings(
    intake_dir: &Path,
    dates: &BTreeSet<String>,
) -> Result<Vec<IntakeFinding>, IntakeError> {
    let root = intake_dir.join("reports");
    let mut out = Vec::new();
    let Ok(bots) = std::fs::read_dir(&root) else {
        return Ok(out);
    };
    let mut bots: Vec<String> = bots
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|b| validate_bot(b).is_ok())
        .collect();
    bots.sort();
    for bot in bots {
        let Ok(days) = std::fs::read_dir(root.join(&bot)) else {
            continue;
        };
        let mut days: Vec<String> = days
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|d| dates.contains(d) && catalog::parse_date(d).is_some())
            .collect();
        days.sort();
        for day in days {
            let p = stored_dir(intake_dir, &bot, &day).join("report.json");
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            let json: Value = serde_json::from_str(&text).map_err(|e| IntakeError::Invalid {
                path: p.display().to_string(),
                reason: e.to_string(),
            })?;
            out.extend(findings_of(&bot, &day, &json).0);
        }
    }
    Ok(out)
}

/// An earlier decision a duplicate can follow.
#[derive(Debug, Clone)]
pub(crate) struct Earlier {
    pub fingerprint: Fingerprint,
    pub ledger_id: Option<String>,
    pub row: Option<usize>,
    pub decision: Option<Decision>,
    pub paths: Vec<String>,
    pub what: String,
}

/// Runs pull, re-gate, store, verify, relate and decide; writes the triage.
pub(crate) async fn run(ctx: &IntakeRun<'_>) -> Result<Triage, IntakeError> {
    let pending = ctx.intake_dir.join("triage.json");
    if let Some(t) = super::ledger::pending(ctx.intake_dir)?.filter(|t| !t.rows.is_empty()) {
        return Err(IntakeError::Usage(format!(
            "{} still has {} rows waiting for approval: run `mercury review approve` first",
            pending.display(),
            t.rows.len()
        )));
    }
    let mut taken_in = Vec::new();
    let mut refused = Vec::new();
    let mut findings = Vec::new();
    let mut invalid = 0;
    // Stored only once the triage is written: a report stored but never
    // triaged would be skipped by the next intake and its findings lost.
    let mut to_store: Vec<((String, String), PathBuf, String)> = Vec::new();
    let max_findings = ctx.review.intake_max_findings as usize;
    for src in ctx.sources {
        // Findings this source has had taken in by this intake.
        let mut from_source = 0usize;
        for name in list_source(src).await? {
            let date = name.date.clone();
            if ctx
                .since
                .is_some_and(|s| catalog::parse_date(&date).is_some_and(|d| d < s))
            {
                continue;
            }
            let dir = stored_dir(ctx.intake_dir, &src.bot, &date);
            if dir.join("report.json").exists() {
                continue;
            }
            let json = match fetch_report(src, &name).await {
                Ok(j) => j,
                Err(e) => {
                    refused.push(Refused {
                        bot: src.bot.clone(),
                        date,
                        reason: format!("could not be read: {e}"),
                    });
                    continue;
                }
            };
            // Re-gate: the report was gated where it was written, but that
            // host's list is not ours, and the file crossed a boundary. Its
            // trace citations go first: the gate would mask their run ids.
            let json = report::without_traces(json);
            if let Err(g) = report::gate("", &json, ctx.gate) {
                refused.push(Refused {
                    bot: src.bot.clone(),
                    date,
                    reason: format!(
                        "blocked by the identifier gate ({} found); not taken in",
                        kind_list(&g.kinds)
                    ),
                });
                continue;
            }
            // A source pays for none of its findings' verify calls: a report
            // with thousands of them is refused by name, the rest go on.
            let count = json["findings"].as_array().map_or(0, Vec::len);
            if count > max_findings {
                refused.push(Refused {
                    bot: src.bot.clone(),
                    date,
                    reason: format!(
                        "has {count} findings, more than review.intake_max_findings = \
                         {max_findings} in one report; not taken in"
                    ),
                });
                continue;
            }
            if from_source + count > max_findings {
                refused.push(Refused {
                    bot: src.bot.clone(),
                    date,
                    reason: format!(
                        "would take source {} past review.intake_max_findings = {max_findings} \
                         findings in one intake; left for the next intake",
                        src.bot
                    ),
                });
                continue;
            }
            from_source += count;
            let text = serde_json::to_string_pretty(&json).map_err(|e| IntakeError::Invalid {
                path: dir.display().to_string(),
                reason: e.to_string(),
            })?;
            to_store.push(((src.bot.clone(), date.clone()), dir, text));
            let (f, bad) = findings_of(&src.bot, &date, &json);
            invalid += bad;
            findings.extend(f);
            taken_in.push(format!("{}/{date}", src.bot));
        }
    }
    findings.sort_by(|a, b| {
        (a.date.as_str(), a.bot.as_str(), a.message_id).cmp(&(
            b.date.as_str(),
            b.bot.as_str(),
            b.message_id,
        ))
    });
    // Only what the owner approved was done, so only that can be followed:
    // a row left unapproved wrote nothing, and its finding is triaged afresh.
    let mut earlier: Vec<Earlier> = super::ledger::read(ctx.intake_dir)?
        .rows
        .into_iter()
        .filter(|r| r.approved.is_some())
        .map(|r| Earlier {
            what: format!("{} {} [msg {}]", r.bot, r.date, r.message_id),
            fingerprint: r.fingerprint,
            ledger_id: Some(r.id),
            row: None,
            decision: r.approved,
            paths: r.paths,
        })
        .collect();
    let items = super::relate::load_items(ctx.intake_dir)
        .map_err(io("reading the known items", ctx.intake_dir))?;
    let ranker = Ranker::new(items);
    let mut exchanges = Exchanges::new(ctx.sources, ctx.review);
    let mut rows = Vec::new();
    let max_calls = ctx.review.intake_max_calls as usize;
    let mut calls = 0usize;
    let mut stopped = None;
    // Where the current report's rows begin: a report is triaged whole or
    // left whole for the next intake, never cut in two.
    let mut report: Option<(String, String)> = None;
    let (mut report_rows, mut report_earlier) = (0, earlier.len());
    let mut left: BTreeSet<(String, String)> = BTreeSet::new();
    for f in findings {
        let key = (f.bot.clone(), f.date.clone());
        if stopped.is_some() {
            left.insert(key);
            continue;
        }
        if report.as_ref() != Some(&key) {
            report = Some(key.clone());
            (report_rows, report_earlier) = (rows.len(), earlier.len());
        }
        let row = rows.len() + 1;
        let fp = f.fingerprint();
        let dup = earlier
            .iter()
            .find(|e| e.fingerprint.same_finding(&fp))
            .cloned();
        let (proposed, reason, paths, follows) = match dup {
            Some(e) => (
                Decision::Duplicate,
                format!(
                    "same finding as {} (decided {}); follows that decision",
                    e.what,
                    e.decision.map_or("nothing yet", Decision::as_str)
                ),
                e.paths.clone(),
                Some(Follows {
                    ledger_id: e.ledger_id.clone(),
                    row: e.row,
                    decision: e.decision,
                    paths: e.paths.clone(),
                }),
            ),
            None if calls >= max_calls => {
                stopped = Some(format!(
                    "stopped after review.intake_max_calls = {max_calls} verify calls; the \
                     reports from {}/{} on are left for the next intake",
                    key.0, key.1
                ));
                rows.truncate(report_rows);
                earlier.truncate(report_earlier);
                left.insert(key);
                continue;
            }
            None => {
                calls += 1;
                let exchange = exchanges.redacted(&f.bot, f.message_id, ctx.gate);
                let v = verify(ctx.verifier, ctx.gate, &f, exchange.as_deref()).await;
                if let Some(cap) = &v.capped {
                    stopped = Some(format!(
                        "stopped at a spend cap ({cap}); the reports from {}/{} on are left \
                         for the next intake",
                        key.0, key.1
                    ));
                    rows.truncate(report_rows);
                    earlier.truncate(report_earlier);
                    left.insert(key);
                    continue;
                }
                if v.real == Some(false) {
                    (
                        Decision::Reject,
                        format!("re-judged fine: {}", v.reason),
                        Vec::new(),
                        None,
                    )
                } else {
                    let matches = ranker.relate(&fp, &f.query());
                    let (d, why) = decide(&ranker, &matches);
                    let note = if v.real.is_none() {
                        format!("; {}", v.reason)
                    } else {
                        String::new()
                    };
                    (
                        d,
                        format!("{why}{note}"),
                        matches.iter().map(|m| m.path.clone()).collect(),
                        None,
                    )
                }
            }
        };
        if proposed != Decision::Duplicate {
            earlier.push(Earlier {
                what: format!("row {row}"),
                fingerprint: fp.clone(),
                ledger_id: None,
                row: Some(row),
                decision: Some(proposed),
                paths: paths.clone(),
            });
        }
        rows.push(TriageRow {
            row,
            finding: f,
            fingerprint: fp,
            proposed,
            reason,
            paths,
            follows,
            draft: None,
            draft_note: None,
            rehearsal: None,
        });
    }
    // Drafted fixes, for this host's own bot only: its workspace is the one
    // this intake can read, and the one approval can write.
    let own = ctx
        .own_data_dir
        .and_then(|own| own_bot(ctx.sources, own).map(|bot| (own, bot)));
    if let Some((own, bot)) = &own {
        let bot = Some(bot.clone());
        let mut capped: Option<String> = None;
        for row in rows.iter_mut().filter(|r| wants_draft(r, bot.as_deref())) {
            if let Some(cap) = &capped {
                row.draft_note = Some(format!("not drafted: a spend cap was reached ({cap})"));
                continue;
            }
            if calls >= max_calls {
                row.draft_note = Some(format!(
                    "not drafted: review.intake_max_calls = {max_calls} calls were made"
                ));
                continue;
            }
            calls += 1;
            match draft_row(ctx, &mut exchanges, own, &row.finding).await {
                Drafted::Made(d) => row.draft = Some(d),
                Drafted::NotMade(why) => row.draft_note = Some(format!("not drafted: {why}")),
                Drafted::Capped(cap) => {
                    row.draft_note = Some(format!("not drafted: a spend cap was reached ({cap})"));
                    capped = Some(cap);
                }
            }
        }
    }
    // A report left for the next intake is neither stored nor counted as
    // taken in, so the next intake pulls it again.
    to_store.retain(|(key, _, _)| !left.contains(key));
    let taken_in = taken_in
        .into_iter()
        .filter(|t| !left.iter().any(|(bot, date)| *t == format!("{bot}/{date}")))
        .collect();
    let triage = Triage {
        made_at: crate::clock::ms_to_rfc3339(crate::clock::now_ms()),
        taken_in,
        refused,
        invalid_findings: invalid,
        rows,
        approved_at: None,
        stopped,
        own_bot: own.map(|(_, bot)| bot),
    };
    write_triage(ctx.intake_dir, &triage, ctx.gate)?;
    for (_, dir, text) in to_store {
        persist(&dir, "report.json", text.as_bytes())?;
    }
    Ok(triage)
}

/// The decision the best related item implies.
fn decide(ranker: &Ranker, matches: &[Match]) -> (Decision, String) {
    let Some(best) = matches.first() else {
        return (Decision::New, "no known item matches".into());
    };
    let Some(item) = ranker.items().get(best.item) else {
        return (Decision::New, "no known item matches".into());
    };
    let by = match best.by {
        super::relate::MatchedBy::Fingerprint => "its fingerprint",
        super::relate::MatchedBy::Bm25 => "its text",
    };
    match (item.kind, item.deployed) {
        (ItemKind::Landed, Some(true)) => (
            Decision::Revisit,
            format!(
                "matches landed item {} by {by}, deployed and still recurring",
                item.path
            ),
        ),
        (ItemKind::Landed, _) => (
            Decision::FixedNotDeployed,
            format!(
                "matches landed item {} by {by}, not deployed yet",
                item.path
            ),
        ),
        _ => (
            Decision::Attach,
            format!("matches open item {} by {by}", item.path),
        ),
    }
}

pub(crate) fn read_triage(intake_dir: &Path) -> Result<Option<Triage>, IntakeError> {
    let p = intake_dir.join("triage.json");
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("reading the triage", &p)(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| IntakeError::Invalid {
            path: p.display().to_string(),
            reason: e.to_string(),
        })
}

/// The message ids a triage may name (the gate lets exactly these through).
fn triage_ids(t: &Triage) -> BTreeSet<i64> {
    t.rows.iter().map(|r| r.finding.message_id).collect()
}

pub(crate) fn triage_markdown(t: &Triage) -> String {
    let mut md = format!("# Review intake triage ({})\n\n", t.made_at);
    md.push_str(&format!(
        "Reports taken in: {}.\n\n",
        if t.taken_in.is_empty() {
            "none".to_owned()
        } else {
            t.taken_in.join(", ")
        }
    ));
    if !t.refused.is_empty() {
        md.push_str("Reports not taken in:\n\n");
        for r in &t.refused {
            md.push_str(&format!("- {} {}: {}\n", r.bot, r.date, r.reason));
        }
        md.push('\n');
    }
    if t.invalid_findings > 0 {
        md.push_str(&format!(
            "Findings that did not validate: {}.\n\n",
            t.invalid_findings
        ));
    }
    if let Some(why) = &t.stopped {
        md.push_str(&format!("The intake {why}.\n\n"));
    }
    md.push_str("| row | bot | date | message | space | kind | proposed | reason | paths |\n");
    md.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in &t.rows {
        md.push_str(&format!(
            "| {} | {} | {} | [msg {}] | {} | {} | {} | {} | {} |\n",
            r.row,
            r.finding.bot,
            r.finding.date,
            r.finding.message_id,
            cell(&r.finding.space),
            r.finding.kind.as_str(),
            r.proposed.as_str(),
            cell(&r.reason),
            if r.paths.is_empty() {
                "-".to_owned()
            } else {
                r.paths.join(", ")
            }
        ));
    }
    md.push_str("\nSummaries:\n\n");
    for r in &t.rows {
        md.push_str(&format!("{}. {}\n", r.row, cell(&r.finding.summary)));
    }
    let drafted: Vec<&TriageRow> = t
        .rows
        .iter()
        .filter(|r| r.draft.is_some() || r.draft_note.is_some())
        .collect();
    if !drafted.is_empty() {
        md.push_str(
            "\n## Drafted fixes\n\nApproving a row applies its draft to the space's file \
             through the running host's files API, only if the file is still as it was drafted \
             from; rejecting it, or leaving it out, writes nothing.\n",
        );
        for r in drafted {
            match (&r.draft, &r.draft_note) {
                (Some(d), _) => md.push_str(&format!(
                    "\n### Row {}: {}\n\n{}\n\n```diff\n{}```\n",
                    r.row,
                    d.file,
                    cell(&d.reason),
                    d.diff
                )),
                (None, Some(note)) => {
                    md.push_str(&format!("\n### Row {}\n\n{}\n", r.row, cell(note)));
                }
                (None, None) => {}
            }
        }
    }
    md.push_str(
        "\nApprove with `mercury review approve --all`, `--rows 1,3` or `--set 2=new`; \
         nothing is applied before.\n",
    );
    md
}

fn cell(s: &str) -> String {
    s.replace('|', "/").replace(['\n', '\r'], " ")
}

/// Gates and writes `triage.json` and `triage.md`.
pub(crate) fn write_triage(
    intake_dir: &Path,
    t: &Triage,
    gate: &IdentifierGate,
) -> Result<(), IntakeError> {
    let md = triage_markdown(t);
    let json = serde_json::to_value(t).map_err(|e| IntakeError::Invalid {
        path: "triage".into(),
        reason: e.to_string(),
    })?;
    gate_text("triage", &md, &json, &triage_ids(t), gate)?;
    let text = serde_json::to_string_pretty(&json).map_err(|e| IntakeError::Invalid {
        path: "triage".into(),
        reason: e.to_string(),
    })?;
    persist(intake_dir, "triage.json", text.as_bytes())?;
    persist(intake_dir, "triage.md", md.as_bytes())
}

/// The gate over a file the intake writes: the whole text (markdown) and
/// every string of the JSON.
pub(crate) fn gate_text(
    what: &'static str,
    text: &str,
    json: &Value,
    ids: &BTreeSet<i64>,
    gate: &IdentifierGate,
) -> Result<(), IntakeError> {
    super::report::gate_with_ids(text, json, ids, gate).map_err(|g| IntakeError::Gated {
        what,
        kinds: kind_list(&g.kinds),
    })
}

/// Writes `dir/name` atomically (a temp file in `dir`, then a rename).
pub(crate) fn persist(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), IntakeError> {
    std::fs::create_dir_all(dir).map_err(io("creating the directory", dir))?;
    let target = dir.join(name);
    super::report::persist(dir, &target, bytes).map_err(io("writing", &target))
}

/// Counts of a triage by proposed decision (for the CLI's summary line).
pub(crate) fn counts(t: &Triage) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for r in &t.rows {
        *m.entry(r.proposed.as_str()).or_default() += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_intake_drafts_only_for_this_hosts_bot_and_a_layer_with_a_file() {
        let own = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let sources = vec![
            parse_source(&format!("beta={}", other.path().display()), None).unwrap(),
            // The same dir spelled another way is still this host.
            parse_source(&format!("local={}/.", own.path().display()), None).unwrap(),
            parse_source("gamma=https://gamma.example", None).unwrap(),
        ];
        assert_eq!(own_bot(&sources, own.path()).as_deref(), Some("local"));
        assert_eq!(own_bot(&sources[..1], own.path()), None);
        let row = |bot: &str, layer: TargetLayer, proposed: Decision| {
            let finding = IntakeFinding {
                bot: bot.into(),
                date: "2026-12-05".into(),
                space: "family".into(),
                message_id: 1,
                kind: FindingKind::WrongAnswer,
                scope: Scope::Space,
                target_layer: layer,
                severity: 2,
                summary: "s".into(),
                evidence: String::new(),
                suggestion: String::new(),
            };
            TriageRow {
                row: 1,
                fingerprint: finding.fingerprint(),
                finding,
                proposed,
                reason: String::new(),
                paths: Vec::new(),
                follows: None,
                draft: None,
                draft_note: None,
                rehearsal: None,
            }
        };
        let mine = Some("local");
        assert!(wants_draft(
            &row("local", TargetLayer::AgentsMd, Decision::New),
            mine
        ));
        assert!(wants_draft(
            &row("local", TargetLayer::Memory, Decision::Revisit),
            mine
        ));
        // Another source's finding, even with this host's wording.
        assert!(!wants_draft(
            &row("beta", TargetLayer::AgentsMd, Decision::New),
            mine
        ));
        assert!(!wants_draft(
            &row("local", TargetLayer::AgentsMd, Decision::New),
            None
        ));
        assert!(!wants_draft(
            &row("local", TargetLayer::Model, Decision::New),
            mine
        ));
        for d in [
            Decision::Reject,
            Decision::Duplicate,
            Decision::FixedNotDeployed,
        ] {
            assert!(
                !wants_draft(&row("local", TargetLayer::AgentsMd, d), mine),
                "{d:?}"
            );
        }
    }

    #[test]
    fn review_intake_sources_and_bot_names_are_validated() {
        let s = parse_source("/srv/bots/tagula", None).unwrap();
        assert_eq!(s.bot, "tagula");
        let s = parse_source("second=/srv/x", None).unwrap();
        assert_eq!(s.bot, "second");
        assert!(
            parse_source("http://127.0.0.1:9", None).is_err(),
            "a URL needs a token"
        );
        let s = parse_source("http://127.0.0.1:9", Some("t")).unwrap();
        assert_eq!(s.bot, "127.0.0.1-9");
        for bad in ["Bad Name=/srv", "Upper=/srv", ".hidden=/srv"] {
            assert!(parse_source(bad, None).is_err(), "{bad}");
        }
        assert_eq!(
            Decision::parse("fixed-not-deployed"),
            Some(Decision::FixedNotDeployed)
        );
        assert_eq!(Decision::parse("maybe"), None);
    }
}
