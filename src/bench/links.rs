//! `mercury bench links`: the same routes served directly in a space and
//! through a space link (the act-as step: grant resolution, audit row, text
//! stripping), side by side, as a ratio (target ≤ 1.1×, issue 32). Two
//! reads, and one write whose audit row is committed before the handler runs
//! (issue 11). Each path is measured in its own sequential blocks (direct,
//! act-as, act-as, direct: ABBA), never alternating request by request, so
//! an act-as read's audit write behind it is charged to the act-as block and
//! not absorbed by the direct request that follows it.

use std::fmt;
use std::time::Duration;

use anyhow::Context;
use hyper::Method;
use serde_json::json;

use super::{percentile, timed};
use crate::host::temp_host::TempHost;
use crate::storage::tally::{self, Tallied};

/// Requests per path before any is measured.
const WARM: usize = 20;
/// The measured blocks in order (`true`: through the link): ABBA, so a
/// drift of the machine over the run weighs on both sides alike.
const BLOCKS: [bool; 4] = [false, true, true, false];

pub(crate) struct LinksOptions {
    /// Requests per route and per side.
    pub requests: usize,
    /// Messages seeded in the target (the `messages recent` page size is 50).
    pub messages: usize,
    /// Tally each side's statements and hand-offs (`storage::tally`).
    pub statements: bool,
}

impl Default for LinksOptions {
    fn default() -> Self {
        Self {
            requests: 400,
            messages: 200,
            statements: false,
        }
    }
}

pub(crate) struct RouteFigures {
    pub route: &'static str,
    pub direct: Vec<Duration>,
    pub act_as: Vec<Duration>,
    /// With `--statements`: each side's statements over its measured blocks.
    pub direct_statements: Vec<Tallied>,
    pub act_as_statements: Vec<Tallied>,
}

impl RouteFigures {
    pub(crate) fn ratio_p50(&self) -> f64 {
        let d = percentile(&self.direct, 50.0).as_secs_f64();
        let a = percentile(&self.act_as, 50.0).as_secs_f64();
        if d > 0.0 {
            a / d
        } else {
            f64::NAN
        }
    }
}

pub(crate) async fn run(opts: &LinksOptions) -> anyhow::Result<Vec<RouteFigures>> {
    if opts.requests == 0 {
        anyhow::bail!("--requests must be at least 1");
    }
    let host = TempHost::start(r#"{"rules":[{"reply":"ok"}]}"#, "process").await?;
    host.ok(
        &host.connection(None),
        Method::POST,
        "/api/spaces",
        Some(json!({"id": "client"})),
    )
    .await?;
    let alice = reader_through_link(&host, "client", "admin").await?;
    seed(&host, opts.messages)?;
    let client = reqwest::Client::builder().build()?;
    let mut out = Vec::new();
    let routes = [
        ("GET /api/prefs", Method::GET, "/api/prefs", None),
        (
            "GET /api/messages/recent?limit=50",
            Method::GET,
            "/api/messages/recent?since=1h&limit=50",
            None,
        ),
        (
            "PUT /api/prefs",
            Method::PUT,
            "/api/prefs",
            Some(json!({"key": "tone", "value": "warm"})),
        ),
    ];
    for (route, method, path, body) in routes {
        let mut fig = RouteFigures {
            route,
            direct: Vec::with_capacity(opts.requests),
            act_as: Vec::with_capacity(opts.requests),
            direct_statements: Vec::new(),
            act_as_statements: Vec::new(),
        };
        let url = format!("{}{path}", host.url);
        let method = reqwest::Method::from_bytes(method.as_str().as_bytes())?;
        let with_body = |r: reqwest::RequestBuilder| match &body {
            Some(b) => r.json(b),
            None => r,
        };
        let direct = || {
            with_body(client.request(method.clone(), &url))
                .bearer_auth(&host.owner_token)
                .header("x-mercury-space", "client")
        };
        let linked = || {
            with_body(client.request(method.clone(), &url))
                .bearer_auth(&alice)
                .header("x-mercury-space", "mgmt")
                .header("x-mercury-act-as", "client")
        };
        for _ in 0..WARM {
            timed(direct()).await?;
            timed(linked()).await?;
        }
        let block = opts.requests.div_ceil(BLOCKS.len());
        for act_as in BLOCKS {
            if opts.statements {
                tally::start();
            }
            for _ in 0..block {
                if act_as {
                    fig.act_as.push(timed(linked()).await?);
                } else {
                    fig.direct.push(timed(direct()).await?);
                }
            }
            if opts.statements {
                // An act-as request's lingering audit row is counted in its
                // own block, not in the next one: its timer hands it over
                // within `LINGER`.
                tokio::time::sleep(crate::storage::LINGER * 2).await;
                let side = if act_as {
                    &mut fig.act_as_statements
                } else {
                    &mut fig.direct_statements
                };
                tally::add(side, tally::stop());
            }
        }
        fig.direct.sort();
        fig.act_as.sort();
        out.push(fig);
    }
    host.stop().await?;
    Ok(out)
}

/// The space `mgmt`, its admin `alice`, and a link of `level` from it to
/// `target`: alice's token, which reaches `target` only through the link.
pub(super) async fn reader_through_link(
    host: &TempHost,
    target: &str,
    level: &str,
) -> anyhow::Result<String> {
    let owner = host.connection(None);
    host.ok(
        &owner,
        Method::POST,
        "/api/spaces",
        Some(json!({"id": "mgmt"})),
    )
    .await?;
    host.ok(
        &host.connection(Some("mgmt")),
        Method::POST,
        "/api/roles",
        Some(json!({"caller_id": "alice", "role": "admin"})),
    )
    .await?;
    let alice = host
        .ok(
            &owner,
            Method::POST,
            "/api/tokens",
            Some(json!({"caller_id": "alice"})),
        )
        .await?["token"]
        .as_str()
        .context("token")?
        .to_owned();
    host.ok(
        &owner,
        Method::POST,
        "/api/links",
        Some(json!({"holder": "mgmt", "target": target, "level": level})),
    )
    .await?;
    Ok(alice)
}

fn seed(host: &TempHost, n: usize) -> anyhow::Result<()> {
    crate::storage::seed::client_messages(&host.data.join("state.db"), n, crate::clock::now_ms())?;
    Ok(())
}

pub(crate) fn print(figs: &[RouteFigures]) {
    println!("bench links: the same route, direct vs through a space link (act-as); each path in its own sequential blocks (direct, act-as, act-as, direct)");
    for f in figs {
        println!(
            "  {:<42} direct p50 {:>8.3} ms p99 {:>8.3} ms | act-as p50 {:>8.3} ms p99 {:>8.3} ms | ratio p50 {:.2}x (target <= 1.10x)",
            f.route,
            ms(percentile(&f.direct, 50.0)),
            ms(percentile(&f.direct, 99.0)),
            ms(percentile(&f.act_as, 50.0)),
            ms(percentile(&f.act_as, 99.0)),
            f.ratio_p50()
        );
    }
    for f in figs {
        for (side, requests, statements) in [
            ("direct", f.direct.len(), &f.direct_statements),
            ("act-as", f.act_as.len(), &f.act_as_statements),
        ] {
            print!(
                "{}",
                SideStatements {
                    name: format!("{} {side}", f.route),
                    requests,
                    statements,
                }
            );
        }
    }
}

/// One side's statements per request, as `bench turns --statements` prints
/// a phase's.
struct SideStatements<'a> {
    name: String,
    requests: usize,
    statements: &'a [Tallied],
}

impl fmt::Display for SideStatements<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        super::turns::write_statements(f, &self.name, "request", self.requests, self.statements)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
