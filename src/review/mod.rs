//! Conversation review. This milestone holds the identifier redaction and its
//! fail-closed gate; the daily judge, report and digest build on it.

pub mod redact;
