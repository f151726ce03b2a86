//! Mercury: a self-hosted chat-bot agent orchestrator.
//!
//! # Layout
//!
//! Imports run one way, top to bottom (`tests/it/layers.rs` holds it):
//! bins → [`cli`] → [`bench`] → [`host`] → [`api`] → [`adapters`] → [`ingress`] → [`app`] →
//! [`actors`] → [`agent`], [`review`], [`shadow`] → [`links`], [`perms`], [`redaction`],
//! [`runtime`] → [`spend`], [`cluster`] → [`model`], [`sandbox`], [`storage`], [`client`], [`workspace`]
//! → [`config`] → [`ids`], [`clock`], [`schedule`], [`telemetry`].
//!
//! - [`cli`]: the `mercury` and `mrctl` command lines (the binaries are thin).
//! - [`bench`]: `mercury bench …`: product paths timed beside a baseline.
//! - [`host`]: the composition root: `init`, `serve`, the demo, the temp host, container wiring.
//! - [`api`]: the axum router, the auth and act-as steps, one error type; `routes/` per resource.
//! - [`adapters`]: in-process chat adapters (Telegram), each an actor under the root supervisor.
//! - [`ingress`]: inbound messages (durable first), triggers, rate limits, webhook adapter.
//! - [`app`]: `App`, the state request handlers and ingress reach.
//! - [`actors`]: the root supervisor, `SpaceActor`, task and review schedulers, judge pool, asks.
//! - [`agent`]: one agent turn on the host: prompt, model/tool loop, layer, sandbox, usage.
//! - [`review`]: conversation review: reader, judge, report, digest, scan.
//! - [`shadow`]: the rehearsal bench: data-dir guard, snapshot, `up` refusals, diff, own key.
//! - [`links`], [`perms`]: space links (allowlist, grant resolver, stripping); permissions and roles.
//! - [`redaction`]: identifier redaction and its fail-closed gate.
//! - [`runtime`]: the shared services (store, models, sandbox, settings, paths).
//! - [`spend`]: prices, caps, and the reservation every model call passes through.
//! - [`cluster`]: this host's seat among many on one database: its leases and their fences.
//! - [`model`]: providers (OpenAI-compatible, Anthropic, scripted) and the model gate.
//! - [`sandbox`]: where `shell` and `mrctl` run: docker (bollard) or bubblewrap.
//! - [`storage`]: SQLite (WAL) behind one writer thread; migrations; one module per table group.
//! - [`client`]: the typed HTTP client of the API (mrctl, temp host, tests).
//! - [`workspace`]: data-dir paths, modes and lock; the safe-path function; the turn layer.
//! - [`config`]: `mercury.yaml` + `MERCURY_*` environment → validated [`config::Settings`].
//! - [`ids`], [`clock`], [`schedule`]: identifier newtypes, time, cron.
//! - [`telemetry`]: the Prometheus metrics of a host (bounded labels).

pub mod actors;
pub(crate) mod adapters;
pub(crate) mod agent;
pub mod api;
pub(crate) mod app;
pub(crate) mod bench;
pub mod cli;
pub(crate) mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod extensions;
pub mod host;
pub(crate) mod ids;
pub mod ingress;
pub mod links;
pub mod model;
pub(crate) mod perms;
pub mod redaction;
pub(crate) mod review;
pub mod runtime;
pub mod sandbox;
pub(crate) mod schedule;
pub mod shadow;
pub mod spend;
pub mod storage;
pub(crate) mod telemetry;
pub mod ui;
pub mod workspace;
