//! The act-as allowlist is the union of the resources' `ACT_AS` lists
//! (issue 13, item 5): every entry names a route the real router serves
//! (method and path template), none is listed twice, and the union is the
//! allowlist as it stood before it moved beside the routes.

use std::collections::BTreeSet;

use reqwest::Method;

use crate::common::{HostOptions, TestHost};
use mercury::api::ACT_AS_ROUTES;
use mercury::links::{ActAsRoute, LinkLevel};

/// A concrete path for a template: every `{param}` segment becomes `1`.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|seg| {
            if seg.starts_with('{') && seg.ends_with('}') {
                "1"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn method(m: &str) -> Method {
    Method::from_bytes(m.as_bytes()).unwrap()
}

#[tokio::test]
async fn every_allowlist_entry_names_a_registered_route() {
    let host = TestHost::start(HostOptions::default()).await;
    host.create_space("h").await;

    // The probes tell the three cases apart: an unknown path is 404, a known
    // path with a method it does not serve is 405, a route is 401 without a
    // token (the auth step runs only on a matched route).
    let (st, v) = host
        .send(Method::GET, "/api/no-such-route", None, &[], None)
        .await;
    assert_eq!(st, 404, "{v}");
    let (st, v) = host
        .send(Method::PATCH, "/api/whoami", None, &[], None)
        .await;
    assert_eq!(st, 405, "{v}");
    // And through a link, a registered route off the allowlist is 400 while
    // an allowlisted one is 403 for a target that does not exist (step 2 is
    // passed only when method and matched template are on the list).
    let act_as_unknown = [
        ("x-mercury-space", "h"),
        ("x-mercury-act-as", "nosuchspace"),
    ];
    let owner = host.owner_token.clone();
    let (st, v) = host
        .send(
            Method::GET,
            "/api/spaces",
            Some(&owner),
            &act_as_unknown,
            None,
        )
        .await;
    assert_eq!(st, 400, "{v}");

    let mut wrong = Vec::new();
    for entry in ACT_AS_ROUTES {
        let path = concrete(entry.path);
        let (st, v) = host
            .send(method(entry.method), &path, None, &[], None)
            .await;
        if st != 401 || v["error"]["code"] != "unauthorized" {
            wrong.push(format!("{} {path} without a token: {st} {v}", entry.method));
        }
        let (st, v) = host
            .send(
                method(entry.method),
                &path,
                Some(&owner),
                &act_as_unknown,
                None,
            )
            .await;
        if st != 403 || v["error"]["code"] != "forbidden" {
            wrong.push(format!(
                "{} {path} acting in an unknown space: {st} {v}",
                entry.method
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "allowlist entries that name no route of the router:\n{}",
        wrong.join("\n")
    );
    host.stop().await;
}

#[test]
fn the_allowlist_has_no_duplicate_entry() {
    let mut seen = BTreeSet::new();
    for entry in ACT_AS_ROUTES {
        assert!(
            seen.insert((entry.method, entry.path)),
            "{} {} is listed twice",
            entry.method,
            entry.path
        );
    }
}

/// `links::ACT_AS_ROUTES` as it stood before the lists moved beside their
/// routes (main at e0d7b3d): the union must hold exactly these entries.
const BEFORE_THE_MOVE: &[ActAsRoute] = {
    use LinkLevel::{Admin, Read};
    const fn r(method: &'static str, path: &'static str, level: LinkLevel) -> ActAsRoute {
        ActAsRoute {
            method,
            path,
            level,
            conversation_scoped: false,
            audit_with_write: false,
        }
    }
    const fn scoped(method: &'static str, path: &'static str) -> ActAsRoute {
        ActAsRoute {
            method,
            path,
            level: Read,
            conversation_scoped: true,
            audit_with_write: false,
        }
    }
    &[
        r("GET", "/api/whoami", Read),
        r("GET", "/api/spaces/current", Read),
        scoped("GET", "/api/conversations"),
        scoped("GET", "/api/messages"),
        scoped("GET", "/api/messages/recent"),
        r("GET", "/api/prefs", Read),
        r("GET", "/api/config", Read),
        r("GET", "/api/model", Read),
        r("GET", "/api/mutes", Read),
        r("GET", "/api/roles", Read),
        r("GET", "/api/permissions", Read),
        r("GET", "/api/tasks", Read),
        r("GET", "/api/runs", Read),
        r("PUT", "/api/spaces/current/name", Admin),
        r("PUT", "/api/prefs", Admin),
        r("DELETE", "/api/prefs/{key}", Admin),
        r("PUT", "/api/config", Admin),
        r("PUT", "/api/model", Admin),
        r("POST", "/api/mutes", Admin),
        r("DELETE", "/api/mutes/{caller}", Admin),
        r("POST", "/api/roles", Admin),
        r("DELETE", "/api/roles/{caller}", Admin),
        r("PUT", "/api/permissions", Admin),
        r("POST", "/api/tasks", Admin),
        r("DELETE", "/api/tasks/{id}", Admin),
        r("POST", "/api/tasks/{id}/pause", Admin),
        r("POST", "/api/tasks/{id}/resume", Admin),
        r("POST", "/api/tasks/{id}/run", Admin),
        r("POST", "/api/control/{action}", Admin),
        r("POST", "/api/send", Admin),
        r("POST", "/api/ask", Admin),
    ]
};

/// Entries added since the move, each by its issue: issue 18's workspace
/// files (reads at `read`, writes at `admin`) and one run's trace; issue
/// 29's list of extensions (enabling one is `ext.manage`, never across a link);
/// issue 25's one message by id (conversation-scoped like the other message reads).
const ADDED_SINCE: &[ActAsRoute] = {
    use LinkLevel::{Admin, Read};
    const fn r(method: &'static str, path: &'static str, level: LinkLevel) -> ActAsRoute {
        ActAsRoute {
            method,
            path,
            level,
            conversation_scoped: false,
            audit_with_write: false,
        }
    }
    &[
        r("GET", "/api/files", Read),
        r("GET", "/api/files/{*path}", Read),
        r("PUT", "/api/files/{*path}", Admin),
        r("DELETE", "/api/files/{*path}", Admin),
        r("GET", "/api/runs/{id}", Read),
        r("GET", "/api/extensions", Read),
        ActAsRoute {
            method: "GET",
            path: "/api/messages/{id}",
            level: Read,
            conversation_scoped: true,
            audit_with_write: false,
        },
    ]
};

#[test]
fn the_union_is_the_allowlist_from_before_the_move() {
    let key = |e: &ActAsRoute| (e.method, e.path, e.level, e.conversation_scoped);
    let union: BTreeSet<_> = ACT_AS_ROUTES.iter().map(key).collect();
    let before: BTreeSet<_> = BEFORE_THE_MOVE.iter().chain(ADDED_SINCE).map(key).collect();
    assert_eq!(before.len(), 31 + ADDED_SINCE.len());
    assert_eq!(ACT_AS_ROUTES.len(), before.len());
    let dropped: Vec<_> = before.difference(&union).collect();
    let added: Vec<_> = union.difference(&before).collect();
    assert!(
        dropped.is_empty() && added.is_empty(),
        "dropped in the move: {dropped:?}; added: {added:?}"
    );
}
