//! `mercury bench ui`: the dashboard's pages rendered by the real host over
//! loopback HTTP, signed in, with 10,000 spaces and 1,000,000 messages in
//! the database (seeded in one transaction), as p50/p99 per page (target:
//! p99 ≤ 50 ms, issue 27). Each page's lists are cut in SQL, so the figures
//! should not move with the table sizes.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::percentile;
use crate::host::temp_host::TempHost;

pub(crate) struct UiBenchOptions {
    pub spaces: usize,
    pub messages: usize,
    /// Requests per page (after 10 warm-up requests).
    pub requests: usize,
}

impl Default for UiBenchOptions {
    fn default() -> Self {
        Self {
            spaces: 10_000,
            messages: 1_000_000,
            requests: 200,
        }
    }
}

pub(crate) struct PageFigures {
    pub page: String,
    pub times: Vec<Duration>,
}

pub(crate) async fn run(opts: &UiBenchOptions) -> anyhow::Result<(Duration, Vec<PageFigures>)> {
    let host = TempHost::start(r#"{"rules":[{"reply":"ok"}]}"#, "process").await?;
    let t = Instant::now();
    let (db, spaces, messages) = (host.data.join("state.db"), opts.spaces, opts.messages);
    tokio::task::spawn_blocking(move || {
        crate::storage::seed::spaces_with_messages(&db, spaces, messages, "a message of the bench")
    })
    .await??;
    let seeded = t.elapsed();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let form = format!("token={}", host.owner_token);
    let answer = client
        .post(format!("{}/ui/login", host.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await?;
    let cookie = answer
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .context("the sign-in set no cookie")?
        .to_owned();
    let middle = format!("bench-{:04}", opts.spaces / 2);
    let pages = [
        "/ui/".to_owned(),
        "/ui/spaces".to_owned(),
        format!("/ui/spaces?after={middle}"),
        "/ui/spaces?q=bench-99".to_owned(),
        format!("/ui/spaces/{middle}"),
        format!("/ui/spaces/{middle}/runs"),
    ];
    let mut out = Vec::new();
    for page in pages {
        let url = format!("{}{page}", host.url);
        let mut times = Vec::with_capacity(opts.requests);
        for i in 0..opts.requests + 10 {
            let t = Instant::now();
            let resp = client.get(&url).header("cookie", &cookie).send().await?;
            let status = resp.status();
            let _ = resp.bytes().await?;
            anyhow::ensure!(status.is_success(), "{page} answered {status}");
            if i >= 10 {
                times.push(t.elapsed());
            }
        }
        times.sort();
        out.push(PageFigures { page, times });
    }
    host.stop().await?;
    Ok((seeded, out))
}

pub(crate) fn print(opts: &UiBenchOptions, seeded: Duration, figs: &[PageFigures]) {
    println!(
        "bench ui: dashboard pages over loopback HTTP, {} spaces and {} messages (seeded in {:.1} s), {} requests each",
        opts.spaces,
        opts.messages,
        seeded.as_secs_f64(),
        opts.requests
    );
    for f in figs {
        let p99 = percentile(&f.times, 99.0);
        println!(
            "  {:<34} p50 {:>8.3} ms  p99 {:>8.3} ms  (target p99 <= 50 ms: {})",
            f.page,
            ms(percentile(&f.times, 50.0)),
            ms(p99),
            if p99 <= Duration::from_millis(50) {
                "met"
            } else {
                "MISSED"
            }
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
