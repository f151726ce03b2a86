//! The storage contract: what every backend must do, asserted on each one
//! (the data dir's SQLite file and a database of the test PostgreSQL
//! cluster), calling storage directly. A backend that passes this serves
//! every feature above it the same way.

use std::collections::BTreeSet;

use mercury::storage::{
    adapters, attachments, conversations, links, messages, outbox, pairings, previews, runs,
    spaces, tasks, tokens, Location, Store, StoreError,
};
use tempfile::TempDir;

use crate::pg::PgDatabase;

/// What keeps a backend's data alive for the test.
enum Keep {
    Sqlite(TempDir),
    Postgres(PgDatabase),
}

impl Keep {
    fn location(&self) -> Location {
        match self {
            Keep::Sqlite(dir) => Location::Sqlite(dir.path().join("state.db")),
            Keep::Postgres(db) => db.location(),
        }
    }
}

fn backends() -> Vec<(&'static str, Keep)> {
    vec![
        ("sqlite", Keep::Sqlite(tempfile::tempdir().unwrap())),
        ("postgres", Keep::Postgres(PgDatabase::create())),
    ]
}

fn open(keep: &Keep) -> Store {
    Store::open_at(&keep.location()).unwrap()
}

fn user_message<'a>(
    space: &'a str,
    conversation: i64,
    pid: &'a str,
    at: i64,
) -> messages::NewMessage<'a> {
    messages::NewMessage {
        space_id: space,
        conversation_id: Some(conversation),
        sender_id: Some("telegram:42"),
        sender_name: Some("Ada"),
        role: "user",
        text: "hello",
        platform_message_id: Some(pid),
        created_at: at,
        status: Some("pending"),
        ..Default::default()
    }
}

/// A space with one conversation; its id.
async fn seed(store: &Store, space: &'static str) -> i64 {
    store
        .write(move |tx| {
            spaces::create_space(tx, space, space, &[])?;
            let c = conversations::upsert(tx, "telegram", &format!("chat-{space}"), "dm", None)?;
            conversations::set_space(tx, c.id, Some(space))?;
            Ok(c.id)
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_and_the_position_it_moves_commit_or_roll_back_together() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        store
            .write(move |tx| {
                messages::insert(tx, &user_message("s1", conv, "100", 1))?;
                adapters::advance_offset(tx, "telegram", 101)
            })
            .await
            .unwrap();
        let failed = store
            .write(move |tx| {
                messages::insert(tx, &user_message("s1", conv, "101", 2))?;
                adapters::advance_offset(tx, "telegram", 102)?;
                Err::<(), _>(StoreError::Invalid("the turn refused".into()))
            })
            .await;
        assert!(matches!(failed, Err(StoreError::Invalid(_))), "{name}");
        let (pending, position) = store
            .read(|c| {
                Ok((
                    messages::pending(c, "s1")?,
                    adapters::position(c, "telegram")?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(pending.len(), 1, "{name}: only the committed message");
        assert_eq!(
            pending[0].platform_message_id.as_deref(),
            Some("100"),
            "{name}"
        );
        assert_eq!(
            position.as_deref(),
            Some("101"),
            "{name}: the position did not move"
        );
        // The same platform message twice is stored once.
        let again = store
            .write(move |tx| messages::insert(tx, &user_message("s1", conv, "100", 3)))
            .await
            .unwrap();
        assert_eq!(again, None, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_answered_exactly_once_under_concurrent_turns() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        let id = store
            .write(move |tx| messages::insert(tx, &user_message("s1", conv, "7", 1)))
            .await
            .unwrap()
            .unwrap();
        let tries = (0..12).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(move |tx| messages::settle(tx, id, "done", &format!("run-{i}")))
                    .await
                    .unwrap()
            })
        });
        let won = futures_util::future::join_all(tries)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        assert_eq!(won, 1, "{name}: exactly one turn settles the message");
        let m = store
            .read(move |c| messages::get(c, id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.status.as_deref(), Some("done"), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_in_a_batch_rolls_back_only_its_own_part() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let writes = (0..120).map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(move |tx| {
                        spaces::create_space(tx, &format!("s{i}"), "x", &[])?;
                        if i % 7 == 0 {
                            return Err(StoreError::Invalid(format!("no {i}")));
                        }
                        Ok(i)
                    })
                    .await
            })
        });
        for (i, r) in futures_util::future::join_all(writes)
            .await
            .into_iter()
            .enumerate()
        {
            match r.unwrap() {
                Ok(v) => assert_eq!(v, i, "{name}"),
                Err(StoreError::Invalid(m)) => assert_eq!((i % 7, m), (0, format!("no {i}"))),
                Err(e) => panic!("{name}: write {i}: {e}"),
            }
        }
        let n = store.read(spaces::list_spaces).await.unwrap().len();
        assert_eq!(n, 120 - 18, "{name}: every write but the 18 failing ones");
        // A constraint the database enforces fails that write alone too.
        let dup = store
            .write(|tx| spaces::create_space(tx, "s1", "again", &[]))
            .await;
        assert!(dup.is_err(), "{name}: a second space with one id");
        assert!(store
            .write(|tx| spaces::create_space(tx, "fresh", "x", &[]))
            .await
            .is_ok());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_seen_in_the_order_they_were_queued() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        // A detached write is seen by every write queued after it (and so
        // by a read after that write returns).
        store
            .write_detached("contract", |tx| {
                spaces::create_space(tx, "detached", "d", &[]).map(|_| ())
            })
            .await;
        let after = store
            .write(|tx| spaces::space_exists(tx, "detached"))
            .await
            .unwrap();
        assert!(after, "{name}: the next write sees it");
        let seen = store
            .read(|c| spaces::space_exists(c, "detached"))
            .await
            .unwrap();
        assert!(seen, "{name}");
        let mut ids = Vec::new();
        for i in 0..20 {
            let pid = format!("p{i}");
            ids.push(
                store
                    .write(move |tx| messages::insert(tx, &user_message("s1", conv, &pid, i)))
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{name}: {ids:?}");
        let pending: Vec<i64> = store
            .read(|c| messages::pending(c, "s1"))
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(pending, ids, "{name}: the queue is in arrival order");
        // The actor takes the oldest pending message, in the write that
        // opens its run; once it settles, the next one.
        let first = ids[0];
        let (next, after_settle, elsewhere) = store
            .write(move |tx| {
                let next = messages::next_pending(tx, "s1")?.map(|m| m.id);
                messages::settle(tx, first, "done", "run-1")?;
                let after = messages::next_pending(tx, "s1")?.map(|m| m.id);
                let elsewhere = messages::next_pending(tx, "detached")?;
                Ok((next, after, elsewhere.is_none()))
            })
            .await
            .unwrap();
        assert_eq!(next, Some(ids[0]), "{name}");
        assert_eq!(after_settle, Some(ids[1]), "{name}");
        assert!(elsewhere, "{name}: another space has nothing pending");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_twice_applies_the_migrations_once_and_keeps_the_data() {
    for (name, keep) in backends() {
        {
            let store = open(&keep);
            seed(&store, "kept").await;
        }
        let store = open(&keep);
        let again = open(&keep);
        let spaces = again.read(spaces::list_spaces).await.unwrap();
        assert_eq!(spaces.len(), 1, "{name}");
        let (a, b) = (store.status().await.unwrap(), again.status().await.unwrap());
        assert_eq!(a.schema_version, b.schema_version, "{name}");
        assert_eq!(a.schema_version, a.latest_version, "{name}");
        assert_eq!(a.backend, name);
        let spaces_table = a.tables.iter().find(|t| t.name == "spaces").unwrap();
        assert_eq!(spaces_table.rows, 1, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queries_the_api_serves_keep_their_order_and_limits() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        let other = seed(&store, "s2").await;
        store
            .write(move |tx| {
                for i in 0..5 {
                    let id = messages::insert(
                        tx,
                        &user_message("s1", conv, &format!("m{i}"), 1000 + i),
                    )?
                    .unwrap();
                    messages::insert(
                        tx,
                        &messages::NewMessage {
                            space_id: "s1",
                            conversation_id: Some(conv),
                            role: "assistant",
                            text: "reply",
                            created_at: 1000 + i,
                            reply_to: Some(id),
                            ..Default::default()
                        },
                    )?;
                }
                messages::insert(tx, &user_message("s2", other, "x", 1000))?;
                Ok(())
            })
            .await
            .unwrap();
        // Paged history: oldest first, `limit` a page, the cursor continues.
        let (page, next) = store
            .read(move |c| messages::recent(c, "s1", None, 0, i64::MAX, 4, None))
            .await
            .unwrap();
        assert_eq!(page.len(), 4, "{name}");
        assert!(page
            .windows(2)
            .all(|w| (w[0].created_at, w[0].id) < (w[1].created_at, w[1].id)));
        let (rest, end) = store
            .read(move |c| messages::recent(c, "s1", Some(conv), 0, i64::MAX, 4, next))
            .await
            .unwrap();
        assert_eq!(rest.len(), 4, "{name}");
        assert!(end.is_some(), "{name}: two more follow");
        let (last, none) = store
            .read(move |c| {
                let (p, n) = messages::recent(c, "s1", None, 0, i64::MAX, 4, next)?;
                let (p2, n2) = messages::recent(c, "s1", None, 0, i64::MAX, 4, n)?;
                Ok(([p, p2].concat(), n2))
            })
            .await
            .unwrap();
        assert_eq!(
            (last.len(), none),
            (6, None),
            "{name}: 10 messages in pages of 4"
        );
        // The prompt's history: the newest `limit`, returned oldest first.
        let hist = store
            .read(|c| messages::history(c, "s1", 0, i64::MAX, 3))
            .await
            .unwrap();
        assert_eq!(hist.len(), 3, "{name}");
        assert!(hist.windows(2).all(|w| w[0].id < w[1].id), "{name}");
        let reply = store
            .read(move |c| {
                let first = messages::pending(c, "s1")?[0].id;
                messages::reply_for(c, first)
            })
            .await
            .unwrap();
        assert_eq!(reply.map(|r| r.role), Some("assistant".into()), "{name}");
        // Search matches text, case as SQLite's LIKE does for ASCII.
        let found = store
            .read(|c| messages::search(c, "s1", None, "HELLO", 2))
            .await
            .unwrap();
        assert_eq!(
            found.len(),
            2,
            "{name}: search is limited and case-insensitive"
        );

        // Runs: newest first, limited.
        store
            .write(|tx| {
                for i in 0..4 {
                    runs::start(tx, &format!("run-{i}"), "s1", "turn", Some("owner"), None)?;
                }
                runs::finish(tx, "run-3", "done", None)
            })
            .await
            .unwrap();
        let listed = store.read(|c| runs::list(c, "s1", 3)).await.unwrap();
        assert_eq!(listed.len(), 3, "{name}");
        assert_eq!(
            store
                .read(|c| runs::get(c, "run-3"))
                .await
                .unwrap()
                .map(|r| r.status),
            Some("done".into())
        );
        // The run a message started, the latest of its attempts.
        let trigger = found[0].id;
        store
            .write(move |tx| {
                runs::start(tx, "run-a", "s1", "turn", Some("owner"), Some(trigger))?;
                runs::start(tx, "run-b", "s1", "turn", Some("owner"), Some(trigger))
            })
            .await
            .unwrap();
        let latest = store
            .read(move |c| runs::latest_for_message(c, "s1", trigger))
            .await
            .unwrap()
            .map(|r| r.id);
        assert!(
            matches!(latest.as_deref(), Some("run-a" | "run-b")),
            "{name}: {latest:?}"
        );
        assert!(store
            .read(move |c| runs::latest_for_message(c, "s2", trigger))
            .await
            .unwrap()
            .is_none());

        // Outbox: in id order after a mark, per platform.
        store
            .write(|tx| {
                for i in 0..3 {
                    outbox::enqueue(
                        tx,
                        "s1",
                        None,
                        if i == 1 { "discord" } else { "telegram" },
                        "chat",
                        None,
                        "hi",
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let tg = store
            .read(|c| outbox::after(c, 0, 10, Some("telegram")))
            .await
            .unwrap();
        assert_eq!(tg.len(), 2, "{name}");
        assert!(tg[0].id < tg[1].id);
        let one = store.read(|c| outbox::after(c, 0, 1, None)).await.unwrap();
        assert_eq!(one.len(), 1, "{name}");
        // Acknowledged items are not pulled again; only delivered ones are pruned.
        let first_tg = tg[0].id;
        let acked = store
            .write(move |tx| outbox::ack(tx, first_tg, Some("telegram"), 1_000))
            .await
            .unwrap();
        assert_eq!(acked, 1, "{name}");
        let tg = store
            .read(|c| outbox::after(c, 0, 10, Some("telegram")))
            .await
            .unwrap();
        assert_eq!(tg.len(), 1, "{name}: an acknowledged item came back");
        let pruned = store
            .write(|tx| outbox::prune_delivered(tx, 2_000))
            .await
            .unwrap();
        assert_eq!(pruned, 1, "{name}");
        let all = store.read(|c| outbox::after(c, 0, 10, None)).await.unwrap();
        assert_eq!(all.len(), 2, "{name}: an undelivered item was pruned");

        // Links and their audit trail, newest first, limited.
        let link = store
            .write(|tx| {
                links::insert(
                    tx,
                    &links::NewLink {
                        holder: "s2",
                        target: "s1",
                        level: "read",
                        conversation: None,
                        disclosure: None,
                        by: "owner",
                    },
                )
            })
            .await
            .unwrap();
        let edges = store
            .read(|c| links::active_edges(c, "s2", "s1"))
            .await
            .unwrap();
        assert_eq!(
            edges.iter().map(|l| l.id).collect::<Vec<_>>(),
            [link.id],
            "{name}"
        );
        store
            .write(move |tx| {
                for i in 0..3 {
                    links::audit(
                        tx,
                        &links::AuditRow {
                            id: 0,
                            at: 10 + i,
                            caller_id: "owner".into(),
                            action: format!("read-{i}"),
                            holder_space_id: Some("s2".into()),
                            target_space_id: Some("s1".into()),
                            link_id: Some(link.id),
                            level: Some("read".into()),
                            method: None,
                            route: None,
                            body_summary: None,
                            status: Some(200),
                            detail: None,
                            path: None,
                            run_id: None,
                            before_value: None,
                            after_value: None,
                        },
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let audit = store.read(|c| links::audit_for(c, "s1", 2)).await.unwrap();
        assert_eq!(audit.len(), 2, "{name}");
        assert!(audit[0].id > audit[1].id, "{name}: newest first");
        // The instance-wide trail (global admins) takes only a limit.
        let all = store.read(|c| links::audit_all(c, 2)).await.unwrap();
        assert_eq!(
            all.iter().map(|a| a.id).collect::<Vec<_>>(),
            audit.iter().map(|a| a.id).collect::<Vec<_>>(),
            "{name}"
        );
        // Retention: rows written before a time go (`at` is the write's time).
        let none_yet = store.write(|tx| links::prune_audit(tx, 0)).await.unwrap();
        assert_eq!(none_yet, 0, "{name}");
        let pruned = store
            .write(|tx| links::prune_audit(tx, i64::MAX))
            .await
            .unwrap();
        assert!(pruned >= 3, "{name}: {pruned}");
        assert!(store
            .read(|c| links::audit_for(c, "s1", 10))
            .await
            .unwrap()
            .is_empty());
        store
            .write(move |tx| links::revoke(tx, link.id, "owner"))
            .await
            .unwrap();
        assert!(store
            .read(|c| links::active_edges(c, "s2", "s1"))
            .await
            .unwrap()
            .is_empty());

        // Tokens: a minted secret resolves, a revoked one does not.
        let (id, secret) = store
            .write(|tx| {
                tokens::mint(
                    tx,
                    &tokens::NewToken {
                        caller_id: "owner",
                        kind: tokens::TokenKind::User,
                        space_id: None,
                        run_id: None,
                        label: Some("contract"),
                        created_by: None,
                        expires_at: None,
                        role: None,
                        read_only: false,
                    },
                )
            })
            .await
            .unwrap();
        let s2 = secret.clone();
        let grant = store
            .read(move |c| tokens::resolve(c, &s2, 0))
            .await
            .unwrap();
        assert_eq!(grant.map(|g| g.caller_id), Some("owner".into()), "{name}");
        store
            .write(move |tx| tokens::revoke(tx, &id))
            .await
            .unwrap();
        assert!(store
            .read(move |c| tokens::resolve(c, &secret, 0))
            .await
            .unwrap()
            .is_none());

        // Tasks: due in time order, the earliest next.
        store
            .write(|tx| {
                for (i, at) in [300, 100, 200].into_iter().enumerate() {
                    tasks::create(
                        tx,
                        &tasks::NewTask {
                            space_id: "s1",
                            cron: None,
                            at: Some(at),
                            prompt: &format!("task {i}"),
                            silent: false,
                            next_run_at: at,
                            created_by: "owner",
                        },
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let due = store.read(|c| tasks::due(c, 250)).await.unwrap();
        assert_eq!(
            due.iter().map(|t| t.next_run_at).collect::<Vec<_>>(),
            [Some(100), Some(200)],
            "{name}"
        );
        assert_eq!(store.read(tasks::next_due_at).await.unwrap(), Some(100));
        // A firing: the one-shot task advanced to done and its run and
        // message queued, in one write (what the scheduler's tick does).
        let first = due[0].clone();
        let message = store
            .write(move |tx| {
                tasks::advance(tx, first.id, None)?;
                tasks::queue_firing(tx, &first)
            })
            .await
            .unwrap_or_else(|e| panic!("{name}: a task firing: {e}"));
        assert!(message > 0, "{name}");
        let after = store.read(|c| tasks::due(c, 250)).await.unwrap();
        assert_eq!(after.len(), 1, "{name}: the fired one-shot task is done");

        // Pairings: capped, expiring, taken once.
        let p = |code: &str, sender: &str| pairings::Pairing {
            code: code.into(),
            platform: "telegram".into(),
            sender: sender.into(),
            name: None,
            conversation: "c".into(),
            created_at: 0,
            expires_at: 1000,
        };
        let (a, b) = (p("AAAABBBB", "telegram:1"), p("CCCCDDDD", "telegram:2"));
        let opened = store
            .write(move |tx| Ok((pairings::open(tx, &a, 1)?, pairings::open(tx, &b, 1)?)))
            .await
            .unwrap();
        assert!(
            opened.0.is_some() && opened.1.is_none(),
            "{name}: the cap holds"
        );
        let listed = store.read(|c| pairings::list(c, 10)).await.unwrap();
        assert_eq!(listed.len(), 1, "{name}");
        let taken = store
            .write(|tx| {
                Ok((
                    pairings::take(tx, "AAAABBBB", 10)?,
                    pairings::take(tx, "AAAABBBB", 10)?,
                ))
            })
            .await
            .unwrap();
        assert!(taken.0.is_some() && taken.1.is_none(), "{name}: taken once");

        // Conversations: the most recently seen first.
        let convs = store.read(|c| conversations::list(c, None)).await.unwrap();
        assert_eq!(convs.len(), 2, "{name}");
        assert!(convs[0].last_seen_at >= convs[1].last_seen_at);
        let dm = store.read(|c| conversations::dm_of(c, "42")).await.unwrap();
        assert!(
            dm.is_some(),
            "{name}: a platform sender's DM by its bare id"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_all_land_once() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        let writers = (0..8).map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..25 {
                    let pid = format!("w{w}-{i}");
                    ids.push(
                        store
                            .write(move |tx| {
                                messages::insert(tx, &user_message("s1", conv, &pid, i))
                            })
                            .await
                            .unwrap()
                            .unwrap(),
                    );
                }
                ids
            })
        });
        let ids: BTreeSet<i64> = futures_util::future::join_all(writers)
            .await
            .into_iter()
            .flat_map(|r| r.unwrap())
            .collect();
        assert_eq!(ids.len(), 200, "{name}: every write has its own id");
        let pending = store.read(|c| messages::pending(c, "s1")).await.unwrap();
        assert_eq!(pending.len(), 200, "{name}");
    }
}

/// The dashboard's sign-ins and one-time links (issue 27): a sign-in lives
/// while its token does and until revoked; a link signs in once, in time;
/// the spaces page is cut in SQL, filtered by membership and search.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_signins_links_and_pages_hold_on_every_backend() {
    use mercury::storage::{signins, ui_lists};
    for (name, keep) in backends() {
        let store = open(&keep);
        let (token_id, _) = store
            .write(|tx| {
                tokens::mint(
                    tx,
                    &tokens::NewToken {
                        caller_id: "api:ada",
                        kind: tokens::TokenKind::User,
                        space_id: None,
                        run_id: None,
                        label: None,
                        created_by: None,
                        expires_at: None,
                        role: None,
                        read_only: false,
                    },
                )
            })
            .await
            .unwrap();
        let tid = token_id.clone();
        let (id, secret) = store
            .write(move |tx| {
                signins::create(
                    tx,
                    &signins::NewSignin {
                        caller_id: "api:ada",
                        token_id: &tid,
                        now: 1_000,
                        expires_at: 10_000,
                        agent: "test",
                    },
                )
            })
            .await
            .unwrap();
        let s = secret.clone();
        let live = store
            .read(move |c| signins::resolve(c, &s, 2_000))
            .await
            .unwrap();
        assert_eq!(
            live.as_ref().map(|s| s.caller_id.as_str()),
            Some("api:ada"),
            "{name}"
        );
        assert_eq!(live.unwrap().csrf.len(), 32, "{name}");
        let s = secret.clone();
        let late = store
            .read(move |c| signins::resolve(c, &s, 10_000))
            .await
            .unwrap();
        assert!(late.is_none(), "{name}: an expired sign-in resolved");
        let listed = store
            .read(|c| signins::list_for(c, "api:ada", 10))
            .await
            .unwrap();
        assert_eq!(listed.len(), 1, "{name}");
        let other = store
            .read(|c| signins::list_for(c, "api:bob", 10))
            .await
            .unwrap();
        assert!(other.is_empty(), "{name}");
        let i = id.clone();
        let by_other = store
            .write(move |tx| signins::revoke(tx, "api:bob", &i, 3_000))
            .await
            .unwrap();
        assert!(!by_other, "{name}: another caller revoked a sign-in");
        let i = id.clone();
        assert!(store
            .write(move |tx| signins::revoke(tx, "api:ada", &i, 3_000))
            .await
            .unwrap());
        let s = secret.clone();
        let gone = store
            .read(move |c| signins::resolve(c, &s, 3_500))
            .await
            .unwrap();
        assert!(gone.is_none(), "{name}: a revoked sign-in resolved");

        let tid = token_id.clone();
        let link = store
            .write(move |tx| signins::create_link(tx, "api:ada", &tid, 1_000, 301_000))
            .await
            .unwrap();
        let l = link.clone();
        let first = store
            .write(move |tx| signins::redeem_link(tx, &l, 2_000))
            .await
            .unwrap();
        assert_eq!(
            first,
            Some(("api:ada".to_owned(), token_id.clone())),
            "{name}"
        );
        let l = link.clone();
        let second = store
            .write(move |tx| signins::redeem_link(tx, &l, 2_001))
            .await
            .unwrap();
        assert!(second.is_none(), "{name}: a link signed in twice");
        let tid = token_id.clone();
        let stale = store
            .write(move |tx| {
                let l = signins::create_link(tx, "api:ada", &tid, 1_000, 301_000)?;
                signins::redeem_link(tx, &l, 301_000)
            })
            .await
            .unwrap();
        assert!(stale.is_none(), "{name}: an expired link signed in");

        store
            .write(|tx| {
                for i in 0..5 {
                    spaces::create_space(tx, &format!("s{i}"), &format!("Team {i}%"), &[])?;
                }
                spaces::touch_member(tx, "s3", "api:ada", Some("Ada"))?;
                Ok(())
            })
            .await
            .unwrap();
        let (first, more) = store
            .read(|c| ui_lists::spaces_page(c, None, "", "", 2))
            .await
            .unwrap();
        assert_eq!(
            first.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s0", "s1"],
            "{name}"
        );
        assert!(more, "{name}");
        let (rest, more) = store
            .read(|c| ui_lists::spaces_page(c, None, "", "s3", 2))
            .await
            .unwrap();
        assert_eq!(
            rest.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s4"],
            "{name}"
        );
        assert!(!more, "{name}");
        let (found, _) = store
            .read(|c| ui_lists::spaces_page(c, None, "TEAM 2", "", 10))
            .await
            .unwrap();
        assert_eq!(
            found.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s2"],
            "{name}"
        );
        let (literal, _) = store
            .read(|c| ui_lists::spaces_page(c, None, "_", "", 10))
            .await
            .unwrap();
        assert!(literal.is_empty(), "{name}: '_' matched as a wildcard");
        let (mine, _) = store
            .read(|c| ui_lists::spaces_page(c, Some("api:ada"), "", "", 10))
            .await
            .unwrap();
        assert_eq!(
            mine.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["s3"],
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_installs_enablement_and_state_behave_alike() {
    use mercury::storage::extensions as ext;
    for (name, keep) in backends() {
        let store = open(&keep);
        seed(&store, "s1").await;
        let enabled_missing = store
            .write(|tx| ext::enable(tx, "s1", "time", "owner", 1))
            .await
            .unwrap();
        assert!(!enabled_missing, "{name}: only an installed one is enabled");
        store
            .write(|tx| {
                ext::install(tx, "time", "name = \"time\"", 10)?;
                ext::install(tx, "web", "name = \"web\"", 10)?;
                ext::set_catalog(tx, "time", 10, "[]")?;
                // A catalog for an older install is not kept.
                ext::set_catalog(tx, "web", 9, "[]")?;
                assert!(ext::enable(tx, "s1", "time", "owner", 11)?);
                assert!(ext::enable(tx, "s1", "time", "owner", 12)?);
                ext::state_set(tx, "time", "s1", "k", "v1", 13)?;
                ext::state_set(tx, "time", "s1", "k", "v2", 14)
            })
            .await
            .unwrap();
        let (all, on, state, got) = store
            .read(|c| {
                Ok((
                    ext::list(c)?,
                    ext::enabled_in(c, "s1")?,
                    ext::state_list(c, "s1")?,
                    ext::state_get(c, "time", "s1", "k")?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 2, "{name}");
        assert_eq!(all[0].catalog.as_deref(), Some("[]"), "{name}");
        assert_eq!(all[1].catalog, None, "{name}");
        assert_eq!(
            on.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            ["time"],
            "{name}"
        );
        assert_eq!(state.len(), 1, "{name}");
        assert_eq!(got.as_deref(), Some("v2"), "{name}");
        // Reinstalling drops the catalog; removing drops enablement and state.
        let removed = store
            .write(|tx| {
                ext::install(tx, "time", "name = \"time\"", 20)?;
                ext::remove(tx, "time")
            })
            .await
            .unwrap();
        assert!(removed, "{name}");
        let (on, state) = store
            .read(|c| Ok((ext::enabled_in(c, "s1")?, ext::state_list(c, "s1")?)))
            .await
            .unwrap();
        assert!(on.is_empty() && state.is_empty(), "{name}");
        assert!(
            !store
                .write(|tx| ext::disable(tx, "s1", "time"))
                .await
                .unwrap(),
            "{name}"
        );
    }
}

/// The spend ledger (issue 26) on every backend: what is reserved counts
/// until it is released, settling replaces the worst case with the cost,
/// a crashed host's reservations are released by instance, a space's caps
/// round-trip whole, a notice goes out once per period, and the quarter-hour
/// buckets hold settled calls only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spend_ledger_reserves_settles_releases_and_buckets_alike() {
    use mercury::storage::spend::{self as ledger, NewReservation, SpaceBudget};
    const T0: i64 = 1_800_000_000_000;
    for (name, keep) in backends() {
        let store = open(&keep);
        let reservation = |instance: &'static str,
                           space: Option<&'static str>,
                           purpose: &'static str,
                           amount: i64,
                           at: i64| {
            move |tx: &mercury::storage::Tx<'_>| {
                ledger::reserve(
                    tx,
                    &NewReservation {
                        at,
                        instance,
                        shadow: false,
                        space_id: space,
                        purpose,
                        model: "openai:gpt-x",
                        amount,
                    },
                )
            }
        };
        let a = store
            .write(reservation("h1", Some("s1"), "turn", 500, T0))
            .await
            .unwrap();
        let b = store
            .write(reservation("h1", Some("s2"), "judge", 300, T0 + 10))
            .await
            .unwrap();
        let c = store
            .write(reservation("h2", Some("s1"), "turn", 700, T0 + 20))
            .await
            .unwrap();
        assert!(a < b && b < c, "{name}: ids increase");
        // A shadow's rows never count against the live deployment.
        let shadow = store
            .write(|tx| {
                ledger::reserve(
                    tx,
                    &NewReservation {
                        at: T0,
                        instance: "shadow",
                        shadow: true,
                        space_id: Some("s1"),
                        purpose: "turn",
                        model: "openai:gpt-x",
                        amount: 9_000,
                    },
                )
            })
            .await
            .unwrap();
        let used = |since: i64| {
            store.read(move |conn| {
                Ok((
                    ledger::used_since(conn, false, since)?,
                    ledger::used_since_by_purpose(conn, false, "turn", since)?,
                    ledger::used_since_by_space(conn, false, "s1", since)?,
                    ledger::open_reservations(conn)?,
                ))
            })
        };
        assert_eq!(used(T0).await.unwrap(), (1_500, 1_200, 1_200, 4), "{name}");
        assert_eq!(used(T0 + 15).await.unwrap(), (700, 700, 700, 4), "{name}");
        // Settled at its cost; released for nothing; settling twice is a no-op.
        store
            .write(move |tx| {
                ledger::settle(tx, a, 120, 1_000, 20)?;
                ledger::release(tx, b)?;
                ledger::settle(tx, a, 999_999, 0, 0)?;
                ledger::settle(tx, b, 999_999, 0, 0)
            })
            .await
            .unwrap();
        assert_eq!(used(T0).await.unwrap(), (820, 820, 820, 2), "{name}");
        // Host h2 crashed with `c` open: released at its start, h1's kept.
        let released = store
            .write(|tx| ledger::release_left_by(tx, "h2"))
            .await
            .unwrap();
        assert_eq!(released, 1, "{name}");
        assert_eq!(used(T0).await.unwrap(), (120, 120, 120, 1), "{name}");
        store
            .write(move |tx| ledger::release(tx, shadow))
            .await
            .unwrap();

        let buckets = store
            .read(|conn| ledger::cost_buckets(conn, false, T0 - 1))
            .await
            .unwrap();
        assert_eq!(buckets.len(), 1, "{name}: settled calls only: {buckets:?}");
        let bucket = &buckets[0];
        assert_eq!(
            (
                bucket.space_id.as_deref(),
                bucket.purpose.as_str(),
                bucket.amount,
                bucket.calls
            ),
            (Some("s1"), "turn", 120, 1),
            "{name}"
        );
        assert_eq!((bucket.tokens_in, bucket.tokens_out), (1_000, 20), "{name}");
        assert_eq!(
            bucket.at,
            T0 / ledger::BUCKET_MS * ledger::BUCKET_MS,
            "{name}"
        );

        // A space's caps round-trip whole, and a second write replaces them.
        let budget = SpaceBudget {
            space_id: "s1".into(),
            daily: Some(2.0),
            monthly: None,
            timezone: Some("Europe/Amsterdam".into()),
            updated_at: T0,
        };
        let (b1, b2) = (
            budget.clone(),
            SpaceBudget {
                monthly: Some(20.0),
                updated_at: T0 + 1,
                ..budget.clone()
            },
        );
        store
            .write(move |tx| ledger::set_space_budget(tx, &b1))
            .await
            .unwrap();
        store
            .write(move |tx| ledger::set_space_budget(tx, &b2))
            .await
            .unwrap();
        let (one, all, none) = store
            .read(|conn| {
                Ok((
                    ledger::space_budget(conn, "s1")?,
                    ledger::space_budgets(conn)?,
                    ledger::space_budget(conn, "s9")?,
                ))
            })
            .await
            .unwrap();
        let want = SpaceBudget {
            monthly: Some(20.0),
            updated_at: T0 + 1,
            ..budget
        };
        assert_eq!(one.as_ref(), Some(&want), "{name}");
        assert_eq!(all, vec![want], "{name}");
        assert_eq!(none, None, "{name}");

        // A notice once per key and period.
        let notes = store
            .write(|tx| {
                Ok((
                    ledger::note_once(tx, "cap:global", T0, T0 + 5)?,
                    ledger::note_once(tx, "cap:global", T0, T0 + 6)?,
                    ledger::note_once(tx, "cap:global", T0 + 86_400_000, T0 + 86_400_001)?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(notes, (true, false, true), "{name}");

        // An owner's notice keeps its text, owed by its instance, until handled.
        let firsts = store
            .write(|tx| {
                Ok((
                    ledger::note_notice_once(tx, "cap:space:s1:daily", T0, T0 + 7, "h1", "one")?,
                    ledger::note_notice_once(tx, "cap:space:s1:daily", T0, T0 + 8, "h1", "two")?,
                    ledger::note_notice_once(tx, "cap:global:monthly", T0, T0 + 9, "h2", "three")?,
                ))
            })
            .await
            .unwrap();
        assert_eq!(firsts, (true, false, true), "{name}");
        let pending = |instance: &'static str| {
            store.read(move |conn| ledger::pending_notices(conn, instance))
        };
        let h1 = pending("h1").await.unwrap();
        assert_eq!(
            h1,
            vec![ledger::PendingNotice {
                key: "cap:space:s1:daily".into(),
                period_start: T0,
                text: "one".into(),
            }],
            "{name}: the first text, the plain note_once rows never"
        );
        store
            .write(|tx| ledger::notice_handled(tx, "cap:space:s1:daily", T0, T0 + 10))
            .await
            .unwrap();
        assert!(pending("h1").await.unwrap().is_empty(), "{name}");
        assert_eq!(pending("h2").await.unwrap().len(), 1, "{name}");
    }
}

/// `(seq, kind, exit code, error, output)` of a step read back.
type StepRow<'a> = (u32, &'a str, Option<i64>, Option<&'a str>, Option<&'a str>);

/// A run's trace as the review reads it (issue 31): the steps a turn
/// recorded come back in step order with their exit codes, errors and
/// output, and the run a message started is found by the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_trace_reads_back_in_step_order_for_the_review() {
    for (name, keep) in backends() {
        let store = open(&keep);
        seed(&store, "s1").await;
        let run = "019af3b21234567890abcdef12345678";
        store
            .write(move |tx| {
                runs::start(tx, run, "s1", "turn", None, Some(41))?;
                let step =
                    |seq: u32, kind: &str, exit: Option<i64>, error: Option<&str>| runs::RunStep {
                        seq,
                        kind: kind.into(),
                        name: format!("{kind}-{seq}"),
                        exit_code: exit,
                        error: error.map(str::to_owned),
                        output: Some(format!("out {seq}")),
                        started_at: 1_000 + i64::from(seq),
                        ..Default::default()
                    };
                // Recorded out of order: read back by step number.
                runs::record_steps(
                    tx,
                    run,
                    &[
                        step(3, "tool", None, Some("bad tool call")),
                        step(1, "model", None, None),
                        step(2, "tool", Some(3), None),
                    ],
                )
            })
            .await
            .unwrap();
        let (steps, started) = store
            .read(move |c| {
                Ok((
                    runs::steps_for(c, run)?,
                    runs::latest_for_message(c, "s1", 41)?,
                ))
            })
            .await
            .unwrap();
        let got: Vec<StepRow<'_>> = steps
            .iter()
            .map(|s| {
                (
                    s.seq,
                    s.kind.as_str(),
                    s.exit_code,
                    s.error.as_deref(),
                    s.output.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (1, "model", None, None, Some("out 1")),
                (2, "tool", Some(3), None, Some("out 2")),
                (3, "tool", None, Some("bad tool call"), Some("out 3")),
            ],
            "{name}"
        );
        assert_eq!(started.map(|r| r.id).as_deref(), Some(run), "{name}");

        // The reader's one read per space: the tool steps of every run a
        // user message of the window started, the output of failed ones only.
        let passing = "019af3b2ffffffffffffffffffffffff";
        store
            .write(move |tx| {
                runs::start(tx, passing, "s1", "turn", None, None)?;
                runs::record_steps(
                    tx,
                    passing,
                    &[runs::RunStep {
                        seq: 1,
                        kind: "tool".into(),
                        name: "read_file".into(),
                        exit_code: Some(0),
                        output: Some("fine".into()),
                        started_at: 2_000,
                        ..Default::default()
                    }],
                )?;
                for (r, at) in [(run, 5_000), (passing, 6_000), ("outside", 9_000)] {
                    messages::insert(
                        tx,
                        &messages::NewMessage {
                            space_id: "s1",
                            role: "user",
                            text: "hi",
                            created_at: at,
                            run_id: Some(r),
                            ..Default::default()
                        },
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
        let window = store
            .read(|c| runs::tool_steps_in_window(c, "s1", 5_000, 9_000))
            .await
            .unwrap();
        let got: Vec<(&str, u32, Option<&str>)> = window
            .iter()
            .map(|s| (s.run_id.as_str(), s.seq, s.failed_output.as_deref()))
            .collect();
        let mut want = vec![
            (run, 2, Some("out 2")),
            (run, 3, Some("out 3")),
            (passing, 1, None),
        ];
        want.sort();
        assert_eq!(got, want, "{name}");
    }
}

/// A direct write marks each open link change on its key superseded once:
/// a second direct write finds none left to mark (it used to rewrite every
/// one of them again, so each direct write of a key a link keeps writing
/// was slower than the last), and a later link change is marked by the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_write_supersedes_each_link_change_on_its_key_once() {
    use links::{ChangeKind, NewChange};
    for (name, keep) in backends() {
        let store = open(&keep);
        let marked = store
            .write(|tx| {
                let change = |after| NewChange {
                    link: 1,
                    space: "alpha",
                    kind: ChangeKind::Preference,
                    key: "tone",
                    before: None,
                    before_by: None,
                    before_link: None,
                    after: Some(after),
                };
                let direct =
                    |key| links::supersede_changes(tx, "alpha", ChangeKind::Preference, key);
                links::record_change(tx, &change("warm"))?;
                links::record_change(tx, &change("cold"))?;
                let first = direct("tone")?;
                let again = direct("tone")?;
                links::record_change(tx, &change("mild"))?;
                let later = direct("tone")?;
                let other_key = direct("style")?;
                Ok((first, again, later, other_key))
            })
            .await
            .unwrap();
        assert_eq!(marked, (2, 0, 1, 0), "{name}");
        let open = store.read(|c| links::open_changes(c, 1)).await.unwrap();
        assert_eq!(open.len(), 3, "{name}");
        assert!(open.iter().all(|c| c.superseded), "{name}: {open:?}");
    }
}

/// The act-as step's one read (issue 32 item 4): the holder context, the
/// target and the active edges in one statement, alike on every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_act_as_view_reads_roles_overrides_and_edges_in_one_statement() {
    use links::{ActAsView, EdgeRow, RoleNames};
    for (name, keep) in backends() {
        let store = open(&keep);
        let ids = store
            .write(|tx| {
                for s in ["h", "t", "u"] {
                    spaces::create_space(tx, s, s, &[])?;
                }
                spaces::set_role(tx, "h", "alice", "admin", "owner", None)?;
                spaces::touch_member(tx, "h", "bob", None)?;
                spaces::kv_set(
                    tx,
                    spaces::KvTable::Config,
                    "h",
                    "role.member.permissions",
                    "prompt,links.act",
                    "owner",
                )?;
                spaces::kv_set(
                    tx,
                    spaces::KvTable::Config,
                    "t",
                    "role.admin.permissions",
                    "prefs.get",
                    "owner",
                )?;
                let new = |target, level, conversation| links::NewLink {
                    holder: "h",
                    target,
                    level,
                    conversation,
                    disclosure: None,
                    by: "owner",
                };
                let direct = links::insert(tx, &new("t", "admin", None))?.id;
                let star = links::insert(tx, &new("*", "read", None))?.id;
                let filtered = links::insert(tx, &new("t", "read", Some(7)))?.id;
                let gone = links::insert(tx, &new("t", "admin", None))?.id;
                links::revoke(tx, gone, "owner")?;
                links::insert(tx, &new("u", "admin", None))?;
                Ok((direct, star, filtered))
            })
            .await
            .unwrap();
        let (direct, star, filtered) = ids;
        let view = |caller: &'static str, target: &'static str, forced: Option<&'static str>| {
            store.read(move |c| {
                links::act_as_view(
                    c,
                    "h",
                    caller,
                    target,
                    &RoleNames {
                        forced,
                        member: "member",
                        none: "none",
                        target_key: "role.admin.permissions",
                    },
                )
            })
        };
        let edge = |id, level: &str, conversation| EdgeRow {
            id,
            level: level.to_owned(),
            conversation,
        };
        assert_eq!(
            view("alice", "t", None).await.unwrap(),
            ActAsView {
                holder_exists: true,
                holder_role: "admin".into(),
                holder_override: None,
                target_exists: true,
                target_override: Some("prefs.get".into()),
                edges: vec![
                    edge(direct, "admin", None),
                    edge(star, "read", None),
                    edge(filtered, "read", Some(7)),
                ],
            },
            "{name}: a stored role, the target's override, active edges only, oldest first"
        );
        let bob = view("bob", "t", None).await.unwrap();
        assert_eq!(
            (bob.holder_role.as_str(), bob.holder_override.as_deref()),
            ("member", Some("prompt,links.act")),
            "{name}: a member with no stored role, and that role's override"
        );
        let carol = view("carol", "t", None).await.unwrap();
        assert_eq!(
            (carol.holder_role.as_str(), carol.holder_override),
            ("none", None),
            "{name}: a stranger"
        );
        let forced = view("carol", "t", Some("admin")).await.unwrap();
        assert_eq!(forced.holder_role, "admin", "{name}: a forced role wins");
        let missing = view("alice", "nope", None).await.unwrap();
        assert!(
            missing.holder_exists && !missing.target_exists && missing.edges.is_empty(),
            "{name}: an unknown target has no edge, the wildcard's included: {missing:?}"
        );
        let own = view("alice", "h", None).await.unwrap();
        assert!(own.edges.is_empty(), "{name}: never the holder itself");
        let gone = store
            .read(|c| {
                links::act_as_view(
                    c,
                    "nowhere",
                    "alice",
                    "t",
                    &RoleNames {
                        forced: None,
                        member: "member",
                        none: "none",
                        target_key: "role.admin.permissions",
                    },
                )
            })
            .await
            .unwrap();
        assert!(
            !gone.holder_exists && gone.target_exists,
            "{name}: {gone:?}"
        );
        // Nothing is kept: the revoke is seen by the next read.
        store
            .write(move |tx| links::revoke(tx, direct, "owner").map(|_| ()))
            .await
            .unwrap();
        let after = view("alice", "t", None).await.unwrap();
        assert_eq!(
            after.edges.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![star, filtered],
            "{name}"
        );
    }
}

/// A rehearsal copy's history is cut before the replayed message: that
/// space's messages from it on are gone, earlier ones and other spaces'
/// stay, and a new message still gets a higher id than any before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spaces_history_is_cut_from_a_message_on_and_ids_keep_rising() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let c1 = seed(&store, "s1").await;
        let c2 = seed(&store, "s2").await;
        let ids: Vec<i64> = store
            .write(move |tx| {
                let mut ids = Vec::new();
                for (i, (space, conv)) in [("s1", c1), ("s2", c2), ("s1", c1), ("s1", c1)]
                    .into_iter()
                    .enumerate()
                {
                    let pid = format!("p{i}");
                    let id = messages::insert(tx, &user_message(space, conv, &pid, i as i64))?;
                    ids.push(id.ok_or(StoreError::Invalid("not stored".into()))?);
                }
                Ok(ids)
            })
            .await
            .unwrap();
        let from = ids[2];
        let cut = store
            .write(move |tx| messages::cut_history(tx, "s1", from))
            .await
            .unwrap();
        assert_eq!(cut, 2, "{name}");
        let (s1, s2) = store
            .read(|c| Ok((messages::max_id(c, "s1")?, messages::max_id(c, "s2")?)))
            .await
            .unwrap();
        assert_eq!((s1, s2), (ids[0], ids[1]), "{name}");
        let next = store
            .write(move |tx| messages::insert(tx, &user_message("s1", c1, "again", 9)))
            .await
            .unwrap()
            .unwrap();
        assert!(next > ids[3], "{name}: ids are never reused");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_replys_preview_is_what_its_outbox_item_edits() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        let (asked, item, plain) = store
            .write(move |tx| {
                let asked = messages::insert(tx, &user_message("s1", conv, "p1", 1))?
                    .ok_or(StoreError::Invalid("not stored".into()))?;
                let reply = messages::insert(
                    tx,
                    &messages::NewMessage {
                        space_id: "s1",
                        conversation_id: Some(conv),
                        role: "assistant",
                        text: "the answer",
                        reply_to: Some(asked),
                        created_at: 2,
                        ..Default::default()
                    },
                )?;
                let item = outbox::enqueue(
                    tx,
                    "s1",
                    Some(conv),
                    "telegram",
                    "chat-s1",
                    reply,
                    "the answer",
                )?;
                let plain =
                    outbox::enqueue(tx, "s1", Some(conv), "telegram", "chat-s1", None, "a send")?;
                Ok((asked, item, plain))
            })
            .await
            .unwrap();
        let refs = |id: i64| {
            let store = store.clone();
            async move {
                store
                    .read(move |c| {
                        let item = outbox::after(c, id - 1, 1, None)?
                            .pop()
                            .ok_or(StoreError::Invalid("no item".into()))?;
                        outbox::delivery_refs(c, &item)
                    })
                    .await
                    .unwrap()
            }
        };
        // Before a preview: threaded under the message, nothing to edit.
        let before = refs(item).await;
        assert_eq!(before.answered.as_deref(), Some("p1"), "{name}");
        assert_eq!(before.edit_of, None, "{name}");
        let preview = |id: &str, chat: &str| previews::Preview {
            platform: "telegram".into(),
            external_id: chat.into(),
            platform_message_id: id.into(),
        };
        let (first, second, elsewhere) = (
            preview("5001", "chat-s1"),
            preview("5002", "chat-s1"),
            preview("7001", "another-chat"),
        );
        store
            .write(move |tx| {
                previews::record(tx, asked, &first, 10)?;
                // A retried turn keeps the first attempt's message.
                previews::record(tx, asked, &second, 20)
            })
            .await
            .unwrap();
        assert_eq!(refs(item).await.edit_of.as_deref(), Some("5001"), "{name}");
        assert_eq!(refs(plain).await, outbox::DeliveryRefs::default(), "{name}");
        let got = store
            .read(move |c| previews::of_message(c, asked))
            .await
            .unwrap();
        assert_eq!(
            got.map(|p| p.platform_message_id).as_deref(),
            Some("5001"),
            "{name}"
        );
        // A preview of another chat is never edited by this item.
        let pruned = store
            .write(move |tx| {
                let n = previews::prune(tx, 11)?;
                previews::record(tx, asked, &elsewhere, 30)?;
                Ok(n)
            })
            .await
            .unwrap();
        assert_eq!(pruned, 1, "{name}");
        assert_eq!(refs(item).await.edit_of, None, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_attachments_are_stored_with_it_once_and_settle() {
    for (name, keep) in backends() {
        let store = open(&keep);
        let conv = seed(&store, "s1").await;
        let list = vec![
            attachments::NewAttachment {
                kind: "image".into(),
                reference: "file-a".into(),
                name: None,
                mime: Some("image/jpeg".into()),
                size: Some(1234),
            },
            attachments::NewAttachment {
                kind: "file".into(),
                reference: "file-b".into(),
                name: Some("notes.txt".into()),
                mime: None,
                size: None,
            },
        ];
        let again = list.clone();
        let (id, stored, twice, stranger) = store
            .write(move |tx| {
                let id = messages::insert(tx, &user_message("s1", conv, "p1", 1))?
                    .ok_or(StoreError::Invalid("not stored".into()))?;
                // In the message's own transaction, as an adapter stores them.
                let stored = attachments::attach(tx, "telegram", "chat-s1", "p1", &list)?;
                let twice = attachments::attach(tx, "telegram", "chat-s1", "p1", &again)?;
                let stranger = attachments::attach(tx, "telegram", "chat-s1", "p-none", &again)?;
                Ok((id, stored, twice, stranger))
            })
            .await
            .unwrap();
        assert_eq!((stored, twice, stranger), (2, 0, 0), "{name}");
        let got = store
            .read(move |c| attachments::of_message(c, id))
            .await
            .unwrap();
        let kinds: Vec<(&str, &str, Option<i64>)> = got
            .iter()
            .map(|a| (a.kind.as_str(), a.status.as_str(), a.size))
            .collect();
        assert_eq!(
            kinds,
            vec![("image", "pending", Some(1234)), ("file", "pending", None)],
            "{name}"
        );
        let (a, b) = (got[0].id, got[1].id);
        store
            .write(move |tx| {
                attachments::settle(tx, a, Some("inbox/1-1.jpg"), None)?;
                attachments::settle(tx, b, None, Some("too large"))
            })
            .await
            .unwrap();
        let got = store
            .read(move |c| attachments::of_message(c, id))
            .await
            .unwrap();
        assert_eq!(
            (got[0].status.as_str(), got[0].path.as_deref()),
            ("kept", Some("inbox/1-1.jpg")),
            "{name}"
        );
        assert_eq!(
            (got[1].status.as_str(), got[1].error.as_deref()),
            ("refused", Some("too large")),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_window_counts_to_its_quota_rolls_back_with_its_write_and_restarts_each_minute() {
    use mercury::storage::caller_windows;
    for (name, keep) in backends() {
        let store = open(&keep);
        let minute = 1_700_000_040_000i64;
        let take = |at: i64| {
            let store = store.clone();
            async move {
                store
                    .write(move |tx| caller_windows::take(tx, "s1", "test:sam", 2, at))
                    .await
                    .unwrap()
            }
        };
        assert!(take(minute).await, "{name}");
        assert!(take(minute + 1_000).await, "{name}");
        assert!(
            !take(minute + 2_000).await,
            "{name}: the third in a minute of 2"
        );
        // A write that fails after taking takes nothing.
        let failed = store
            .write(move |tx| {
                caller_windows::take(tx, "s2", "test:sam", 1, minute)?;
                Err::<(), _>(StoreError::Invalid("the message was refused".into()))
            })
            .await;
        assert!(failed.is_err());
        assert!(
            take_in(&store, "s2", minute).await,
            "{name}: the rolled-back one left nothing"
        );
        // The next minute starts again; the sweep deletes windows that ended.
        let next =
            minute - minute.rem_euclid(caller_windows::WINDOW_MS) + caller_windows::WINDOW_MS;
        assert!(take(next).await, "{name}");
        let pruned = store
            .write(move |tx| caller_windows::prune(tx, next + 2 * caller_windows::WINDOW_MS))
            .await
            .unwrap();
        assert_eq!(pruned, 2, "{name}");
    }
}

async fn take_in(store: &Store, space: &'static str, at: i64) -> bool {
    store
        .write(move |tx| mercury::storage::caller_windows::take(tx, space, "test:sam", 1, at))
        .await
        .unwrap()
}
