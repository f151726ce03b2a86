//! The leases of many hosts (issue 28) on a real PostgreSQL server, two
//! stores on one database standing for two hosts: a space is held by one
//! host until its lease expires, a takeover raises the epoch and closes the
//! previous holder's runs, the old epoch's fence refuses its commits, a
//! claim waits for a commit that checked the fence, and a due task is
//! seen by one host's scheduler while another's transaction holds it.

use std::sync::mpsc;
use std::time::Duration;

use mercury::clock::now_ms;
use mercury::storage::leases::{self, Claim, Fence};
use mercury::storage::{runs, spaces, tasks, Store, StoreError};

use crate::pg::PgDatabase;

fn two_hosts() -> (PgDatabase, Store, Store) {
    let db = PgDatabase::create();
    let a = Store::open_at(&db.location()).expect("host a's store");
    let b = Store::open_at(&db.location()).expect("host b's store");
    (db, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_space_lease_moves_only_when_expired_and_fences_its_old_holder() {
    let (_db, a, b) = two_hosts();
    let now = now_ms();
    a.write(|tx| spaces::create_space(tx, "s1", "s1", &[]))
        .await
        .unwrap();
    let claim = |store: &Store, host: &'static str, at: i64| {
        let store = store.clone();
        async move {
            store
                .write(move |tx| leases::claim_space(tx, "s1", host, at, 3_000))
                .await
                .unwrap()
        }
    };
    assert_eq!(claim(&a, "a", now).await, Claim::Held(1));
    assert_eq!(
        claim(&b, "b", now + 1_000).await,
        Claim::Elsewhere {
            host: "a".into(),
            expires_at: now + 3_000
        },
        "held and unexpired: not taken"
    );
    // a starts a run and dies; after the lease b takes the space.
    a.write(|tx| runs::start(tx, "run-a", "s1", "live", Some("x"), None))
        .await
        .unwrap();
    assert_eq!(claim(&b, "b", now + 3_001).await, Claim::Held(2));
    let status = b
        .read(|c| Ok(runs::get(c, "run-a")?.map(|r| (r.status, r.error))))
        .await
        .unwrap();
    assert_eq!(
        status,
        Some(("interrupted".into(), Some(runs::CRASHED.into()))),
        "the dead holder's run is closed as a crash's"
    );
    // a's fence no longer holds; b's does.
    let old = Fence {
        space: "s1".into(),
        host: "a".into(),
        epoch: 1,
    };
    let err = a.write(move |tx| leases::hold(tx, &old)).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced(_)), "{err}");
    let new = Fence {
        space: "s1".into(),
        host: "b".into(),
        epoch: 2,
    };
    let held = new.clone();
    b.write(move |tx| leases::hold(tx, &held)).await.unwrap();
    // Released, the row stays and the next claim's epoch is higher still.
    b.write(move |tx| leases::release_space(tx, &new))
        .await
        .unwrap();
    assert_eq!(claim(&a, "a", now + 3_002).await, Claim::Held(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_waits_for_a_commit_that_checked_the_fence() {
    let (_db, a, b) = two_hosts();
    let now = now_ms();
    a.write(move |tx| leases::claim_space(tx, "s1", "a", now, 1_000))
        .await
        .unwrap();
    let fence = Fence {
        space: "s1".into(),
        host: "a".into(),
        epoch: 1,
    };
    // a's commit checks its fence and is still open...
    let (checked_tx, checked) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let commit = tokio::spawn({
        let a = a.clone();
        async move {
            a.write(move |tx| {
                leases::hold(tx, &fence)?;
                let _ = checked_tx.send(());
                let _ = go.recv_timeout(Duration::from_secs(10));
                Ok(())
            })
            .await
        }
    });
    tokio::task::spawn_blocking(move || checked.recv().unwrap())
        .await
        .unwrap();
    // ...so b's claim of the expired lease waits for it.
    let claim = tokio::spawn({
        let b = b.clone();
        async move {
            b.write(move |tx| leases::claim_space(tx, "s1", "b", now + 5_000, 1_000))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!claim.is_finished(), "the claim waited for the open commit");
    go_tx.send(()).unwrap();
    commit.await.unwrap().unwrap();
    assert_eq!(claim.await.unwrap().unwrap(), Claim::Held(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_due_task_is_seen_by_one_host_at_a_time() {
    let (_db, a, b) = two_hosts();
    a.write(|tx| {
        spaces::create_space(tx, "s1", "s1", &[])?;
        tasks::create(
            tx,
            &tasks::NewTask {
                space_id: "s1",
                cron: None,
                at: Some(1),
                prompt: "tick",
                silent: true,
                next_run_at: 1,
                created_by: "owner",
            },
        )
    })
    .await
    .unwrap();
    let (seen_tx, seen) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let first = tokio::spawn({
        let a = a.clone();
        async move {
            a.write(move |tx| {
                let due = tasks::due(tx, now_ms())?.len();
                let _ = seen_tx.send(due);
                let _ = go.recv_timeout(Duration::from_secs(10));
                Ok(())
            })
            .await
        }
    });
    let seen_by_a = tokio::task::spawn_blocking(move || seen.recv().unwrap())
        .await
        .unwrap();
    assert_eq!(seen_by_a, 1);
    let seen_by_b = b
        .write(|tx| Ok(tasks::due(tx, now_ms())?.len()))
        .await
        .unwrap();
    assert_eq!(seen_by_b, 0, "the task another host is firing is skipped");
    go_tx.send(()).unwrap();
    first.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deployment_lease_has_one_holder_until_it_stops_renewing() {
    let (_db, a, b) = two_hosts();
    let now = now_ms();
    let hold = |store: &Store, host: &'static str, at: i64| {
        let store = store.clone();
        async move {
            store
                .write(move |tx| leases::hold_named(tx, "review", host, at, 3_000))
                .await
                .unwrap()
        }
    };
    assert!(hold(&a, "a", now).await, "the first host takes it");
    assert!(!hold(&b, "b", now + 1_000).await, "held: the other waits");
    assert!(hold(&a, "a", now + 2_000).await, "its holder keeps it");
    assert!(
        !hold(&b, "b", now + 4_000).await,
        "renewed at +2 s: still held at +4 s"
    );
    assert!(hold(&b, "b", now + 5_001).await, "not renewed: it moves");
    assert!(!hold(&a, "a", now + 5_002).await, "and stays moved");
    let named = b.read(leases::named_leases).await.unwrap();
    assert_eq!(named.len(), 1);
    assert_eq!((named[0].host_id.as_str(), named[0].epoch), ("b", 2));
}
