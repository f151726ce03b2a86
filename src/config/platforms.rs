//! The chat platforms compiled into this binary, as every layer sees them:
//! a name, the secrets' variables, the platform's own `dm_policy`, its
//! identifier shapes, and (for a platform whose section this file's parent
//! does not type) the defaults and checks of its `adapters.<name>` section.
//!
//! The list is filled from above: each line of the adapters' registry
//! (`src/adapters/registry.rs`) submits its adapter here through
//! `inventory`, so the sender policy, the config checks and the redactor
//! iterate the one registry without importing the layer it lives in.
//!
//! Must never: hold a secret's value (only the variables' names), or decide
//! anything about a platform that its adapter did not say.

use serde_yaml_ng::Value;

use super::{DmPolicy, Settings};

/// What a chat platform tells every layer about itself. Its adapter
/// (`crate::adapters::ChatAdapter`) adds how it runs.
pub trait Platform: Sync + 'static {
    /// The platform's name: its senders' namespace (`telegram:42`), its
    /// outbox items' platform, its board and `adapter_positions` key, its
    /// config section `adapters.<name>`.
    fn name(&self) -> &'static str;
    /// The environment variables its secrets are read from, in a fixed
    /// order; read from the environment only, never the file.
    fn secret_vars(&self) -> &'static [&'static str];
    /// Those of [`Self::secret_vars`] that `settings` need (a platform
    /// with modes needs some in one mode only); the others may be unset.
    fn secrets_needed(&self, _settings: &Settings) -> Vec<&'static str> {
        self.secret_vars().to_vec()
    }
    /// Whether `settings` ask for it.
    fn enabled(&self, settings: &Settings) -> bool;
    /// Its own `adapters.<name>.dm_policy`; `None`: `ingress.dm_policy`.
    fn dm_policy(&self, settings: &Settings) -> Option<DmPolicy>;
    /// Regular expressions (Rust `regex` syntax) of the identifiers its
    /// messages carry (user, chat and channel ids, handles, mentions): the
    /// redactor replaces them and the review gate refuses them. Where a
    /// pattern has a capture group 1, that group is the identifier.
    fn identifier_patterns(&self) -> &'static [&'static str];
    /// The defaults of `adapters.<name>` for a platform whose section is not
    /// a field of [`super::AdaptersConfig`] (`None` for those that are).
    fn section_defaults(&self) -> Option<Value> {
        None
    }
    /// Checks its section of valid-looking `settings`: `Err((key, why))`.
    fn check(&self, _settings: &Settings) -> Result<(), (String, String)> {
        Ok(())
    }
}

/// One registered platform (submitted by the adapters' registry).
pub struct Registered(pub &'static dyn Platform);

inventory::collect!(Registered);

/// Every registered platform, by name.
pub fn all() -> Vec<&'static dyn Platform> {
    let mut out: Vec<&'static dyn Platform> = inventory::iter::<Registered>
        .into_iter()
        .map(|r| r.0)
        .collect();
    out.sort_by_key(|p| p.name());
    out.dedup_by_key(|p| p.name());
    out
}

/// The registered platform named `name`.
pub fn find(name: &str) -> Option<&'static dyn Platform> {
    inventory::iter::<Registered>
        .into_iter()
        .map(|r| r.0)
        .find(|p| p.name() == name)
}
