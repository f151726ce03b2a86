//! The exchange reader (M1.1): a window of exchanges per space, read
//! through storage: the host's own store's read connections, or for another
//! data dir's database (an intake source, a bench's), the read-only
//! connection storage opens on that file.
//!
//! An exchange is a user message, the bot's reply to it (`reply_to`), the few
//! messages just before it (ambient lines, earlier turns) as context, and
//! their message ids. Messages are read in pages in `(created_at, id)` order,
//! one short statement per page, so no read transaction stays open across the
//! scan and the host's writer never waits on the review. One exchange can
//! also be read by its user message's id (the intake's verify step).
//!
//! Each exchange also carries the trace summary of the run its user message
//! started (the tool steps, with exit codes and a failed step's error; raw,
//! redacted by the caller like the text) and its friction signals
//! ([`friction`](super::friction)), computed over every user message of the
//! window, answered or not.
//!
//! Must never: write (it only reads, over read-only connections), hold a statement
//! or transaction across pages, or return a user message as an exchange
//! without the reply that answered it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::Path;

use crate::review::friction::{self, Signals, UserTurn};
use crate::storage::messages::{self, Cursor, Message};
use crate::storage::spaces::{self, Space};
use crate::storage::{exchanges, open_read_only_conn, runs, Conn, Store, StoreResult};

/// Rows per page.
pub(crate) const PAGE_SIZE: u32 = 500;
/// Messages before a user message given to the judge as its context.
pub(crate) const CONTEXT_MESSAGES: usize = 4;
/// Characters kept of a user message or a reply.
pub(crate) const TEXT_CAP: usize = 4000;
/// Characters kept of one context line.
pub(crate) const CONTEXT_CAP: usize = 300;
/// Tool steps of a run kept in its trace summary (the failed ones first
/// kept, then the rest in order).
pub(crate) const TRACE_STEPS: usize = 12;
/// Characters kept of a failed step's error.
pub(crate) const STEP_ERROR_CAP: usize = 300;
/// The sender id and name the host writes on the bot's own replies
/// (`actors::space::commit`): the bot is not a person to redact.
pub(crate) const BOT_SENDER_ID: &str = "mercury";
pub(crate) const BOT_SENDER_NAME: &str = "Mercury";

/// `since <= created_at < until`, epoch milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub since_ms: i64,
    pub until_ms: i64,
}

impl Window {
    /// The `hours` before `until_ms`.
    pub(crate) fn hours_before(until_ms: i64, hours: u32) -> Self {
        Self {
            since_ms: until_ms - i64::from(hours) * 3_600_000,
            until_ms,
        }
    }
}

/// One message before an exchange, as context.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ContextLine {
    pub message_id: i64,
    /// `user`, `assistant` or `ambient`.
    pub role: String,
    /// The sender's display name, else the sender id (raw: redact before use).
    pub speaker: Option<String>,
    pub text: String,
}

/// One tool call of a run, as its trace summary keeps it (raw: redact the
/// tool name and the error before use).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceStep {
    /// The step's number in the run (`run_steps.seq`, as `runs show` prints it).
    pub seq: u32,
    pub tool: String,
    pub exit_code: Option<i64>,
    /// Why it failed, for a failed step only: its error, else the start of
    /// its output (a command's exit code and stderr), one line.
    pub error: Option<String>,
}

/// The run a user message started, summarised for the judge.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Trace {
    pub run_id: String,
    /// The turn's status (`done`, `failed`, …).
    pub status: String,
    /// In step order; at most [`TRACE_STEPS`].
    pub steps: Vec<TraceStep>,
    /// Tool steps left out past [`TRACE_STEPS`].
    pub more: u32,
}

/// A user message and the reply that answered it (raw: redact before use).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exchange {
    pub space_id: String,
    pub message_id: i64,
    pub reply_id: i64,
    pub speaker: Option<String>,
    pub text: String,
    pub reply: String,
    pub created_at: i64,
    /// Oldest first, at most [`CONTEXT_MESSAGES`].
    pub context: Vec<ContextLine>,
    /// The run the user message started, when it has one.
    pub trace: Option<Trace>,
    /// Its friction signals.
    pub friction: Signals,
}

/// The exchanges of one space in the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SpaceWindow {
    pub space_id: String,
    pub exchanges: Vec<Exchange>,
    /// User messages in the window with no reply (muted, dropped, still
    /// pending, or answered after the window closed).
    pub unanswered: u32,
    /// Every user message of the window with a friction signal, answered or
    /// not, in order: `(message id, signals)`.
    pub friction: Vec<(i64, Signals)>,
}

/// What the redaction list of a scan is built from.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WindowIdentifiers {
    /// Every sender id seen in the window, in any space, except the bot's.
    pub sender_ids: BTreeSet<String>,
    /// Sender names seen in the window and the members' display names of the
    /// spaces asked for, except the bot's.
    pub names: BTreeSet<String>,
}

/// Where the reader's reads go.
enum Source {
    /// The host's own database: each read borrows one of the store's read
    /// connections.
    Store(Store),
    /// Another data dir's database file, opened read-only by storage.
    File(Box<Conn>),
}

pub(crate) struct ExchangeReader {
    source: Source,
    window: Window,
    page_size: u32,
}

impl ExchangeReader {
    /// Reads the host's own database through `store`.
    pub(crate) fn new(store: &Store, window: Window) -> Self {
        Self {
            source: Source::Store(store.clone()),
            window,
            page_size: PAGE_SIZE,
        }
    }

    /// Reads the database file of another data dir at `db` (an intake
    /// source, a bench's), read-only.
    pub(crate) fn open(db: &Path, window: Window) -> StoreResult<Self> {
        Ok(Self {
            source: Source::File(Box::new(open_read_only_conn(db)?)),
            window,
            page_size: PAGE_SIZE,
        })
    }

    /// Small pages, so a test crosses page boundaries.
    #[cfg(test)]
    pub(crate) fn with_page_size(mut self, rows: u32) -> Self {
        self.page_size = rows.max(1);
        self
    }

    /// Runs one read on a connection of the source. Blocking: the reader
    /// runs on the scan's own thread or a blocking task.
    fn read<T>(&self, f: impl FnOnce(&Conn) -> StoreResult<T>) -> StoreResult<T> {
        match &self.source {
            Source::Store(store) => store.read_blocking(f),
            Source::File(conn) => f(conn),
        }
    }

    pub(crate) fn spaces(&self) -> StoreResult<Vec<Space>> {
        self.read(spaces::list_spaces)
    }

    /// Spaces with at least one message in the window.
    pub(crate) fn active_spaces(&self) -> StoreResult<BTreeSet<String>> {
        let w = self.window;
        let spaces = self.read(|c| exchanges::active_spaces(c, w.since_ms, w.until_ms))?;
        Ok(spaces.into_iter().collect())
    }

    /// Sender ids and names of the window, plus the display names of the
    /// members of `member_spaces`.
    pub(crate) fn identifiers(&self, member_spaces: &[String]) -> StoreResult<WindowIdentifiers> {
        let mut out = WindowIdentifiers::default();
        let w = self.window;
        for (id, name) in self.read(|c| exchanges::senders(c, w.since_ms, w.until_ms))? {
            if let Some(id) = id.filter(|i| i != BOT_SENDER_ID && !i.trim().is_empty()) {
                out.sender_ids.insert(id);
            }
            if let Some(name) = name.filter(|n| n != BOT_SENDER_NAME && !n.trim().is_empty()) {
                out.names.insert(name);
            }
        }
        for space in member_spaces {
            for m in self.read(|c| spaces::list_members(c, space))? {
                if let Some(name) = m.display_name.filter(|n| !n.trim().is_empty()) {
                    out.names.insert(name);
                }
            }
        }
        Ok(out)
    }

    /// One exchange by its user message's id, whenever it was (the window
    /// does not apply): `(space, text, reply)` with the first reply to it,
    /// both capped as in [`read_space`](Self::read_space). `None` when there
    /// is no such user message or no reply to it.
    pub(crate) fn exchange(
        &self,
        message_id: i64,
    ) -> StoreResult<Option<(String, String, String)>> {
        let Some((space, text)) = self.read(|c| exchanges::user_message(c, message_id))? else {
            return Ok(None);
        };
        let reply = self.read(|c| exchanges::first_reply(c, message_id))?;
        Ok(reply.map(|reply| (space, cap(&text, TEXT_CAP), cap(&reply, TEXT_CAP))))
    }

    /// Every exchange of `space` in the window, in message order.
    pub(crate) fn read_space(&self, space: &str) -> StoreResult<SpaceWindow> {
        let mut recent: VecDeque<ContextLine> = VecDeque::with_capacity(CONTEXT_MESSAGES + 1);
        // User messages waiting for their reply, in order; index by id.
        let mut open: Vec<(Message, Vec<ContextLine>, Option<Message>)> = Vec::new();
        let mut by_id: HashMap<i64, usize> = HashMap::new();
        let mut cursor: Option<Cursor> = None;
        loop {
            let (w, rows) = (self.window, self.page_size);
            let (page, next) = self
                .read(|c| messages::recent(c, space, None, w.since_ms, w.until_ms, rows, cursor))?;
            for m in page {
                match m.role.as_str() {
                    "user" => {
                        by_id.insert(m.id, open.len());
                        let context = recent.iter().cloned().collect();
                        push_context(&mut recent, &m);
                        open.push((m, context, None));
                    }
                    "assistant" => {
                        let slot = m.reply_to.and_then(|id| by_id.get(&id).copied());
                        push_context(&mut recent, &m);
                        if let Some(i) = slot {
                            let entry = &mut open[i];
                            if entry.2.is_none() {
                                entry.2 = Some(m);
                            }
                        }
                    }
                    "ambient" => push_context(&mut recent, &m),
                    _ => {}
                }
            }
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        let mut out = SpaceWindow {
            space_id: space.to_owned(),
            ..Default::default()
        };
        let turns: Vec<UserTurn<'_>> = open
            .iter()
            .map(|(m, _, reply)| UserTurn {
                sender: m
                    .sender_id
                    .as_deref()
                    .or(m.sender_name.as_deref())
                    .filter(|s| !s.trim().is_empty()),
                text: &m.text,
                at_ms: m.created_at,
                failed: m.status.as_deref() == Some("failed"),
                answered: reply.is_some(),
                pending: m.status.as_deref() == Some("pending"),
            })
            .collect();
        let signals = friction::signals(&turns);
        // Every trace of the window in one read, not one per exchange.
        let w = self.window;
        let mut by_run: HashMap<String, Vec<runs::WindowToolStep>> = HashMap::new();
        for s in self.read(|c| runs::tool_steps_in_window(c, space, w.since_ms, w.until_ms))? {
            by_run.entry(s.run_id.clone()).or_default().push(s);
        }
        drop(turns);
        for ((user, context, reply), friction) in open.into_iter().zip(signals) {
            if !friction.is_empty() {
                out.friction.push((user.id, friction.clone()));
            }
            match reply {
                Some(reply) => {
                    let trace = user
                        .run_id
                        .as_deref()
                        .map(|run| trace_of(run, &user, by_run.remove(run).unwrap_or_default()));
                    out.exchanges.push(Exchange {
                        space_id: space.to_owned(),
                        message_id: user.id,
                        reply_id: reply.id,
                        speaker: speaker_of(&user),
                        text: cap(&user.text, TEXT_CAP),
                        reply: cap(&reply.text, TEXT_CAP),
                        created_at: user.created_at,
                        context,
                        trace,
                        friction,
                    });
                }
                None => out.unanswered += 1,
            }
        }
        Ok(out)
    }
}

/// The trace summary of run `run_id`, which `user` started, from its tool
/// steps in step order.
fn trace_of(run_id: &str, user: &Message, steps: Vec<runs::WindowToolStep>) -> Trace {
    let tools: Vec<TraceStep> = steps
        .into_iter()
        .map(|s| {
            let failed = s.error.is_some() || s.exit_code.is_some_and(|c| c != 0);
            let error = failed.then(|| {
                let why = s.error.or(s.failed_output).unwrap_or_default();
                cap(
                    &why.split_whitespace().collect::<Vec<_>>().join(" "),
                    STEP_ERROR_CAP,
                )
            });
            TraceStep {
                seq: s.seq,
                tool: s.name,
                exit_code: s.exit_code,
                error,
            }
        })
        .collect();
    // The failed steps are the evidence: kept first when a long run is cut.
    let total = tools.len();
    let mut keep: BTreeSet<u32> = tools
        .iter()
        .filter(|s| s.error.is_some())
        .map(|s| s.seq)
        .take(TRACE_STEPS)
        .collect();
    for s in &tools {
        if keep.len() >= TRACE_STEPS {
            break;
        }
        keep.insert(s.seq);
    }
    let steps: Vec<TraceStep> = tools
        .into_iter()
        .filter(|s| keep.contains(&s.seq))
        .collect();
    Trace {
        run_id: run_id.to_owned(),
        status: user.status.clone().unwrap_or_default(),
        more: (total - steps.len()) as u32,
        steps,
    }
}

fn speaker_of(m: &Message) -> Option<String> {
    m.sender_name
        .clone()
        .filter(|n| !n.trim().is_empty())
        .or_else(|| m.sender_id.clone())
}

fn push_context(recent: &mut VecDeque<ContextLine>, m: &Message) {
    recent.push_back(ContextLine {
        message_id: m.id,
        role: m.role.clone(),
        speaker: if m.role == "assistant" {
            None
        } else {
            speaker_of(m)
        },
        text: cap(
            &m.text.split_whitespace().collect::<Vec<_>>().join(" "),
            CONTEXT_CAP,
        ),
    });
    while recent.len() > CONTEXT_MESSAGES {
        recent.pop_front();
    }
}

/// The first `max` characters, with an ellipsis when something was cut.
pub(crate) fn cap(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::messages::NewMessage;
    use crate::storage::Store;

    async fn insert(
        store: &Store,
        space: &str,
        role: &'static str,
        sender: Option<(&'static str, &'static str)>,
        text: &str,
        at: i64,
        reply_to: Option<i64>,
    ) -> i64 {
        let (space, text) = (space.to_owned(), text.to_owned());
        store
            .write(move |tx| {
                Ok(messages::insert(
                    tx,
                    &NewMessage {
                        space_id: &space,
                        sender_id: sender.map(|s| s.0),
                        sender_name: sender.map(|s| s.1),
                        role,
                        text: &text,
                        created_at: at,
                        reply_to,
                        status: (role == "user").then_some("done"),
                        ..Default::default()
                    },
                )?
                .unwrap_or_default())
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn review_reader_pairs_replies_with_context_across_pages() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let store = Store::open(&db).unwrap();
        store
            .write(|tx| {
                spaces::create_space(tx, "s1", "one", &[])?;
                spaces::create_space(tx, "s2", "two", &[])?;
                spaces::touch_member(tx, "s1", "wa:1", Some("Anna de Vries"))
            })
            .await
            .unwrap();
        let anna = Some(("wa:1", "Anna de Vries"));
        let old = insert(&store, "s1", "user", anna, "before the window", 500, None).await;
        insert(&store, "s1", "assistant", None, "old reply", 600, Some(old)).await;
        let a1 = insert(
            &store,
            "s1",
            "ambient",
            Some(("wa:2", "Bram")),
            "line\nbreak",
            1_000,
            None,
        )
        .await;
        let u1 = insert(&store, "s1", "user", anna, "question one", 1_100, None).await;
        let r1 = insert(
            &store,
            "s1",
            "assistant",
            Some(("mercury", "Mercury")),
            "answer one",
            1_200,
            Some(u1),
        )
        .await;
        let u2 = insert(&store, "s1", "user", anna, "unanswered", 1_300, None).await;
        let u3 = insert(&store, "s1", "user", anna, "question three", 1_400, None).await;
        let r3 = insert(
            &store,
            "s1",
            "assistant",
            None,
            "answer three",
            1_500,
            Some(u3),
        )
        .await;
        insert(
            &store,
            "s2",
            "user",
            Some(("wa:9", "Other")),
            "elsewhere",
            1_100,
            None,
        )
        .await;
        insert(&store, "s1", "user", anna, "after the window", 9_000, None).await;

        let reader = ExchangeReader::new(
            &store,
            Window {
                since_ms: 1_000,
                until_ms: 5_000,
            },
        )
        .with_page_size(2);
        let w = reader.read_space("s1").unwrap();
        assert_eq!(w.unanswered, 1);
        assert_eq!(w.exchanges.len(), 2);
        let e1 = &w.exchanges[0];
        assert_eq!((e1.message_id, e1.reply_id), (u1, r1));
        assert_eq!(e1.text, "question one");
        assert_eq!(e1.reply, "answer one");
        assert_eq!(e1.speaker.as_deref(), Some("Anna de Vries"));
        assert_eq!(e1.context.len(), 1);
        assert_eq!(e1.context[0].message_id, a1);
        assert_eq!(e1.context[0].text, "line break");
        let e3 = &w.exchanges[1];
        assert_eq!((e3.message_id, e3.reply_id), (u3, r3));
        let ids: Vec<i64> = e3.context.iter().map(|c| c.message_id).collect();
        assert_eq!(ids, vec![a1, u1, r1, u2]);
        assert_eq!(e3.context[2].speaker, None, "the bot is not a speaker");

        let ids = reader.identifiers(&["s1".to_owned()]).unwrap();
        assert_eq!(
            ids.sender_ids.into_iter().collect::<Vec<_>>(),
            vec!["wa:1", "wa:2", "wa:9"]
        );
        assert!(ids.names.contains("Anna de Vries") && ids.names.contains("Bram"));
        assert!(!ids.names.contains("Mercury"));
    }

    #[tokio::test]
    async fn review_reader_carries_the_trace_and_friction_of_each_exchange() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).unwrap();
        let (space, run) = ("s1", "019af3b21234567890abcdef12345678");
        let ids = store
            .write(move |tx| {
                spaces::create_space(tx, space, "one", &[])?;
                runs::start(tx, run, space, "turn", None, None)?;
                let step =
                    |seq: u32, name: &str, exit: Option<i64>, error: Option<&str>| runs::RunStep {
                        seq,
                        kind: if name == "model" { "model" } else { "tool" }.into(),
                        name: name.into(),
                        exit_code: exit,
                        error: error.map(str::to_owned),
                        output: Some("exit code 3\nstderr: cannot reach the host\n".into()),
                        ..Default::default()
                    };
                runs::record_steps(
                    tx,
                    run,
                    &[
                        step(1, "model", None, None),
                        step(2, "shell", Some(3), None),
                        step(3, "read_file", Some(0), None),
                        step(4, "mrctl", None, Some("bad tool call")),
                    ],
                )?;
                let msg =
                    |text: &'static str, at: i64, role: &'static str, reply_to, run_id, status| {
                        messages::insert(
                            tx,
                            &NewMessage {
                                space_id: space,
                                sender_id: (role == "user").then_some("wa:1"),
                                role,
                                text,
                                created_at: at,
                                reply_to,
                                run_id,
                                status,
                                ..Default::default()
                            },
                        )
                        .map(Option::unwrap_or_default)
                    };
                let u1 = msg(
                    "book the dentist for friday",
                    1_000,
                    "user",
                    None,
                    Some(run),
                    Some("failed"),
                )?;
                let r1 = msg(
                    "Sorry, that failed.",
                    1_100,
                    "assistant",
                    Some(u1),
                    Some(run),
                    Some("failed"),
                )?;
                let u2 = msg("no, that's wrong", 2_000, "user", None, None, Some("done"))?;
                msg("ok", 2_100, "assistant", Some(u2), None, None)?;
                let u3 = msg("hello?", 3_000, "user", None, None, Some("done"))?;
                Ok((u1, r1, u2, u3))
            })
            .await
            .unwrap();
        let (u1, r1, u2, u3) = ids;
        let reader = ExchangeReader::new(
            &store,
            Window {
                since_ms: 0,
                until_ms: 10_000,
            },
        );
        let w = reader.read_space(space).unwrap();
        assert_eq!(w.exchanges.len(), 2);
        let e1 = &w.exchanges[0];
        assert_eq!((e1.message_id, e1.reply_id), (u1, r1));
        let t = e1.trace.as_ref().expect("the run's trace");
        assert_eq!(
            (t.run_id.as_str(), t.status.as_str(), t.more),
            (run, "failed", 0)
        );
        let steps: Vec<(u32, &str, Option<i64>, Option<&str>)> = t
            .steps
            .iter()
            .map(|s| (s.seq, s.tool.as_str(), s.exit_code, s.error.as_deref()))
            .collect();
        assert_eq!(
            steps,
            [
                (
                    2,
                    "shell",
                    Some(3),
                    Some("exit code 3 stderr: cannot reach the host")
                ),
                (3, "read_file", Some(0), None),
                (4, "mrctl", None, Some("bad tool call")),
            ],
            "tool steps only, a failed one with its error"
        );
        let names = |s: &Signals| s.iter().map(|x| x.as_str()).collect::<Vec<_>>();
        assert_eq!(names(&e1.friction), ["correction", "failed_turn"]);
        assert!(w.exchanges[1].trace.is_none());
        // The unanswered last message is abandoned: in the window's list, not an exchange.
        assert_eq!(w.unanswered, 1);
        let listed: Vec<(i64, Vec<&str>)> =
            w.friction.iter().map(|(id, s)| (*id, names(s))).collect();
        assert_eq!(
            listed,
            [
                (u1, vec!["correction", "failed_turn"]),
                (u3, vec!["abandoned"])
            ]
        );
        assert!(!listed.iter().any(|(id, _)| *id == u2));
    }

    #[tokio::test]
    async fn review_reader_connections_are_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let store = Store::open(&db).unwrap();
        let window = Window::hours_before(10, 24);
        let readers = [
            ExchangeReader::new(&store, window),
            ExchangeReader::open(&db, window).unwrap(),
        ];
        for reader in readers {
            let err = tokio::task::spawn_blocking(move || {
                reader.read(|c| spaces::create_space(c, "x", "x", &[]))
            })
            .await
            .unwrap()
            .unwrap_err();
            assert!(err.to_string().contains("readonly"), "{err}");
        }
    }

    #[test]
    fn review_cap_cuts_on_characters() {
        assert_eq!(cap("héllo", 2), "hé…");
        assert_eq!(cap("hé", 2), "hé");
    }
}
