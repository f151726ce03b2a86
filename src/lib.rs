//! Mercury: a self-hosted chat-bot agent orchestrator.
//!
//! # Layout
//! - [`config`]: `mercury.yaml` + `MERCURY_*` environment → validated [`config::Settings`].
//! - [`ids`], [`clock`]: identifier newtypes and time parsing.
//! - [`storage`]: SQLite (WAL) behind one writer thread; migrations; one module per table group.
//! - [`perms`]: permission names, role defaults and per-space overrides.
//! - [`api`]: the axum router, the auth step and one error type; `routes/` per resource.
//! - [`actors`]: ractor actors: root supervisor, `SpaceActor` per space, task scheduler,
//!   review scheduler, judge pool.
//! - [`agent`]: one agent turn on the host: prompt, model/tool loop, usage.
//! - [`model`]: model providers (OpenAI-compatible, Anthropic, scripted) and the model gate
//!   (live turns before review work).
//! - [`sandbox`]: where tools run: docker (bollard) or a plain process.
//! - [`containers`]: host-side wiring of the docker backend: image, sweep.
//! - [`ingress`]: inbound messages (durable first), triggers, rate limits, webhook adapter.
//! - [`links`]: space links: the act-as allowlist, the grant resolver, invisible-text stripping.
//! - [`review`]: conversation review: window reader, redaction and its fail-closed gate,
//!   judge, report, owner digest, and `mercury bench review`.
//! - [`host`]: `mercury init` and `mercury serve`.
//! - [`demo`]: `mercury demo`, a scripted conversation against a real host.
//! - [`temp_host`]: a throwaway host on a temp data dir (demo, benches).
//! - [`bench`]: `mercury bench …` (turns, sandbox, links, ask, review): product paths timed beside a baseline.
//! - [`cli`]: the `mercury` and `mrctl` command lines (the binaries are thin).

pub mod actors;
pub mod agent;
pub mod api;
pub mod app;
pub mod bench;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod host;
pub mod ids;
pub mod ingress;
pub mod links;
pub mod model;
pub mod perms;
pub mod redaction;
pub mod review;
pub mod runtime;
pub mod sandbox;
pub mod schedule;
pub mod storage;
pub mod workspace;
