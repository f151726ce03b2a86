//! Benchmarks run as `mercury bench <name>`: each measures one product path
//! beside a baseline on the same machine and prints medians and their ratio.
//! They assert nothing; the figures and their last values live in `docs/`.

pub mod sandbox;
