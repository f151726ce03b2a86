//! One integration-test binary: each module drives a real host (real SQLite
//! file, real HTTP server on a loopback port, real Docker engine where the
//! module says so) through its public interfaces.

mod api;
mod common;
mod live;
mod smoke;
