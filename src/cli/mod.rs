//! Command lines: `mercury` (the host) and `mrctl` (the API client).

// The command lines' output is what they are for.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod cluster;
pub mod ext;
pub mod mercury;
pub mod mrctl;
pub mod onboard;
pub mod ops;
pub mod review_intake;
pub mod review_rehearse;
pub mod shadow;
pub mod storage;
