//! The shadow's own model credential (M1.3c): `MERCURY_SHADOW_<P>_API_KEY`
//! or a key file under the shadow root (`<root>/auth/<provider>.key`, 0600,
//! written by `mercury shadow auth set-key`). A shadow answers to no live
//! credential, so neither dies when the other rotates.
//!
//! Must never: read `MERCURY_OPENAI_API_KEY` / `MERCURY_ANTHROPIC_API_KEY`
//! (the live keys), print a key, or follow a symlink to a key file.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{io_err, ShadowError, ShadowResult};
use crate::workspace::data_dir::{private_dir, FILE_MODE};

/// The providers that take a key.
pub const PROVIDERS: &[&str] = &["openai", "anthropic"];

pub fn env_name(provider: &str) -> String {
    format!("MERCURY_SHADOW_{}_API_KEY", provider.to_uppercase())
}

pub fn key_file(root: &Path, provider: &str) -> PathBuf {
    root.join("auth").join(format!("{provider}.key"))
}

fn check_provider(provider: &str) -> ShadowResult<()> {
    if PROVIDERS.contains(&provider) {
        Ok(())
    } else {
        Err(ShadowError::Refused(format!(
            "{provider:?} is not a provider with a key (use openai or anthropic)"
        )))
    }
}

/// The shadow's key for `provider`: its env variable, else its key file.
pub fn shadow_key(
    root: Option<&Path>,
    provider: &str,
    env: &BTreeMap<String, String>,
) -> Option<String> {
    if let Some(k) = env
        .get(&env_name(provider))
        .filter(|k| !k.trim().is_empty())
    {
        return Some(k.trim().to_owned());
    }
    let root = root?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(key_file(root, provider))
        .ok()?;
    let mut s = String::new();
    f.read_to_string(&mut s).ok()?;
    Some(s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// Writes `<root>/auth/<provider>.key` (0600, temp + rename).
pub fn set_key(root: &Path, provider: &str, secret: &str) -> ShadowResult<PathBuf> {
    check_provider(provider)?;
    let secret = secret.trim();
    if secret.is_empty() || secret.contains(char::is_whitespace) {
        return Err(ShadowError::Refused(
            "the key on stdin is empty or holds whitespace".into(),
        ));
    }
    let dir = root.join("auth");
    private_dir(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    let path = key_file(root, provider);
    let tmp = dir.join(format!(".{provider}.key.tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err(format!("writing {}", tmp.display())))?;
    f.write_all(secret.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io_err(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(io_err(format!("writing {}", path.display())))?;
    Ok(path)
}

/// The providers of `chain` (specs) that need a key and have no shadow key.
pub fn providers_without_key(
    chain: &[String],
    root: Option<&Path>,
    env: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (p, _) in chain
        .iter()
        .filter_map(|spec| crate::config::key_var_of(spec))
    {
        if !out.iter().any(|o| o == p) && shadow_key(root, p, env).is_none() {
            out.push(p.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_then_file_never_the_live_key() {
        let t = tempfile::tempdir().unwrap();
        let mut env = BTreeMap::new();
        env.insert("MERCURY_OPENAI_API_KEY".to_string(), "live-key".to_string());
        assert_eq!(shadow_key(Some(t.path()), "openai", &env), None);
        let chain = vec!["openai:gpt".to_string(), "scripted:/x".to_string()];
        assert_eq!(
            providers_without_key(&chain, Some(t.path()), &env),
            vec!["openai"]
        );
        set_key(t.path(), "openai", "file-key\n").unwrap();
        assert_eq!(
            shadow_key(Some(t.path()), "openai", &env).as_deref(),
            Some("file-key")
        );
        env.insert(env_name("openai"), "env-key".into());
        assert_eq!(
            shadow_key(Some(t.path()), "openai", &env).as_deref(),
            Some("env-key")
        );
        assert!(providers_without_key(&chain, Some(t.path()), &env).is_empty());
        assert!(set_key(t.path(), "gemini", "k").is_err());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(key_file(t.path(), "openai"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
