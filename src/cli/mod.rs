//! Command lines: `mercury` (the host) and `mrctl` (the API client).

pub mod mercury;
pub mod mrctl;
pub mod ops;
pub mod review_intake;
