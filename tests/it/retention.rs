//! Bounded growth (issue 32, item 7): the pull outbox's acknowledgement
//! (`POST /api/outbox/ack`) and the host's retention sweep (link audit rows
//! after `links.audit_keep_days`, delivered outbox items after
//! `outbox.keep_days`; an undelivered item is never deleted).

use mercury::storage::links::{self, AuditRow};
use mercury::storage::outbox;
use reqwest::Method;
use serde_json::json;

use crate::common::{HostOptions, TestHost};

async fn pull(host: &TestHost, token: &str, after: i64) -> Vec<i64> {
    let (st, v) = host
        .call(
            Method::GET,
            &format!("/api/outbox?after={after}"),
            Some(token),
            None,
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_i64().unwrap())
        .collect()
}

async fn ack(host: &TestHost, token: &str, up_to: i64) -> (u16, serde_json::Value) {
    host.call(
        Method::POST,
        "/api/outbox/ack",
        Some(token),
        None,
        Some(json!({ "up_to": up_to })),
    )
    .await
}

#[tokio::test]
async fn outbox_an_adapter_restarting_after_an_ack_gets_only_newer_items() {
    let host = TestHost::start(HostOptions::default()).await;
    host.create_space("s").await;
    let ids: Vec<i64> = host.write(|tx| {
        (0..3)
            .map(|i| outbox::enqueue(tx, "s", None, "test", "conv", None, &format!("reply {i}")))
            .collect()
    });
    let other_id =
        host.write(|tx| outbox::enqueue(tx, "s", None, "other", "conv", None, "elsewhere"));
    let adapter = host.adapter_token("bridge", "test").await;
    let other = host.adapter_token("bridge-2", "other").await;
    assert_eq!(pull(&host, &adapter, 0).await, ids);

    // Acknowledged up to the second: a restart from 0 gets the third only.
    let (st, v) = ack(&host, &adapter, ids[1]).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["acknowledged"], 2, "{v}");
    assert_eq!(pull(&host, &adapter, 0).await, vec![ids[2]]);
    // Again: nothing new to mark.
    let (_, v) = ack(&host, &adapter, ids[1]).await;
    assert_eq!(v["acknowledged"], 0, "{v}");
    // Another platform's adapter acknowledges only its own.
    let (_, v) = ack(&host, &other, i64::MAX).await;
    assert_eq!(v["acknowledged"], 1, "{v}");
    assert_eq!(pull(&host, &adapter, 0).await, vec![ids[2]]);
    assert!(pull(&host, &other, 0).await.is_empty(), "{other_id}");

    // A user token, a body that is not one, are refused; nothing changes.
    let user = host.token("api:carol", "user").await;
    let (st, _) = ack(&host, &user, i64::MAX).await;
    assert_eq!(st, 403);
    let (st, _) = host
        .call(
            Method::POST,
            "/api/outbox/ack",
            Some(&adapter),
            None,
            Some(json!({"up_to": "all"})),
        )
        .await;
    assert_eq!(st, 400);
    assert_eq!(pull(&host, &adapter, 0).await, vec![ids[2]]);
    host.stop().await;
}

#[tokio::test]
async fn retention_sweep_deletes_old_audit_rows_and_delivered_items_but_never_an_undelivered_one() {
    let host = TestHost::start(HostOptions {
        config: vec![
            ("links.audit_keep_days", serde_yaml_ng::Value::from(30)),
            ("outbox.keep_days", serde_yaml_ng::Value::from(7)),
        ],
        ..Default::default()
    })
    .await;
    host.create_space("s").await;
    let day = 86_400_000_i64;
    let now = mercury::clock::now_ms();
    let row = |detail: &str| AuditRow {
        caller_id: "owner".into(),
        action: "act".into(),
        detail: Some(detail.into()),
        ..Default::default()
    };
    let (old_audit, new_audit, old_sent, new_sent, old_waiting) = host.write(move |tx| {
        let old_audit = links::audit(tx, &row("old"))?;
        tx.execute(
            "UPDATE space_link_audit SET at = ?2 WHERE id = ?1",
            &[&old_audit, &(now - 31 * day)],
        )?;
        let new_audit = links::audit(tx, &row("new"))?;
        let old_sent = outbox::enqueue(tx, "s", None, "test", "c", None, "old, delivered")?;
        outbox::mark_delivered(tx, old_sent)?;
        tx.execute(
            "UPDATE outbox SET delivered_at = ?2, created_at = ?2 WHERE id = ?1",
            &[&old_sent, &(now - 8 * day)],
        )?;
        let new_sent = outbox::enqueue(tx, "s", None, "test", "c", None, "new, delivered")?;
        outbox::mark_delivered(tx, new_sent)?;
        let old_waiting =
            outbox::enqueue(tx, "s", None, "test", "c", None, "old, never delivered")?;
        tx.execute(
            "UPDATE outbox SET created_at = ?2 WHERE id = ?1",
            &[&old_waiting, &(now - 60 * day)],
        )?;
        Ok((old_audit, new_audit, old_sent, new_sent, old_waiting))
    });
    // The sweep runs at start-up: restart the host on the same data.
    let (dir, data) = host.stop_keeping().await;
    let host = TestHost::start_on(dir, data).await;
    let gone = format!("SELECT COUNT(*) FROM space_link_audit WHERE id = {old_audit}");
    assert_eq!(
        host.wait_count(&gone, 0, 30).await,
        0,
        "the old audit row stayed"
    );
    let count = |sql: String| host.count(&sql);
    assert_eq!(
        count(format!(
            "SELECT COUNT(*) FROM space_link_audit WHERE id = {new_audit}"
        )),
        1
    );
    assert_eq!(
        host.wait_count(
            &format!("SELECT COUNT(*) FROM outbox WHERE id = {old_sent}"),
            0,
            30
        )
        .await,
        0
    );
    assert_eq!(
        count(format!("SELECT COUNT(*) FROM outbox WHERE id = {new_sent}")),
        1
    );
    assert_eq!(
        count(format!(
            "SELECT COUNT(*) FROM outbox WHERE id = {old_waiting}"
        )),
        1,
        "an undelivered item is never deleted"
    );
    host.stop().await;
}
