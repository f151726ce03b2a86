//! One integration-test binary: each module drives a real host (real SQLite
//! file, real HTTP server on a loopback port, real Docker engine where the
//! module says so) through its public interfaces.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod act_as_routes;
mod api;
mod ask;
mod attachments;
mod bench_sandbox;
#[cfg(feature = "test-hooks")]
mod chat_seam;
mod cluster;
mod common;
mod discord;
mod docker_turns;
mod extensions;
mod files;
mod layers;
mod leases_pg;
mod link_reach;
mod links;
mod litellm;
mod live;
mod openapi;
mod ops;
mod pairing;
mod pg;
mod redaction;
mod remote_engine;
mod retention;
mod review;
mod review_drafts;
mod review_intake;
mod sandbox_contract;
mod security_host;
mod security_http;
mod security_links;
mod security_paths;
mod security_sandbox;
mod security_workspace;
mod service;
mod shadow;
mod shadow_diff;
mod slack;
mod smoke;
mod snapshots;
mod spend;
mod storage_contract;
mod storage_pg;
mod streaming;
mod telegram;
mod telegram_callers;
mod ui;
mod ui_browser;
mod ui_ops;
mod web_fetch;
mod whatsapp;
