//! Installed extensions, their enablement per space and their key/value
//! store (issue 29; the rules are `crate::extensions`', this is only rows).
//!
//! Must never: check a manifest (that is `crate::extensions::manifest`), or
//! enable an extension that is not installed.

use super::{params, Conn, Query, StoreResult, Tx};

/// One installed extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub name: String,
    /// The manifest's TOML text, as `mercury ext add` checked it.
    pub manifest: String,
    pub installed_at: i64,
    /// The tools its servers answered (JSON), until the next install.
    pub catalog: Option<String>,
}

fn installed_row(r: &super::Row<'_>) -> StoreResult<Installed> {
    Ok(Installed {
        name: r.get(0)?,
        manifest: r.get(1)?,
        installed_at: r.get(2)?,
        catalog: r.get(3)?,
    })
}

/// Installs `name` (or replaces its manifest); the cached catalog is dropped.
pub fn install(tx: &Tx, name: &str, manifest: &str, at: i64) -> StoreResult<()> {
    tx.execute(
        "INSERT INTO extensions (name, manifest, installed_at, catalog) VALUES (?1, ?2, ?3, NULL)
         ON CONFLICT (name) DO UPDATE SET manifest = ?2, installed_at = ?3, catalog = NULL",
        params![name, manifest, at],
    )?;
    Ok(())
}

/// Removes `name`, every space's enablement of it and its state; whether it
/// was installed.
pub fn remove(tx: &Tx, name: &str) -> StoreResult<bool> {
    tx.execute(
        "DELETE FROM space_extensions WHERE name = ?1",
        params![name],
    )?;
    tx.execute(
        "DELETE FROM extension_state WHERE extension = ?1",
        params![name],
    )?;
    Ok(tx.execute("DELETE FROM extensions WHERE name = ?1", params![name])? > 0)
}

pub fn list(conn: &Conn) -> StoreResult<Vec<Installed>> {
    conn.query_all(
        "SELECT name, manifest, installed_at, catalog FROM extensions ORDER BY name",
        params![],
        installed_row,
    )
}

pub fn get(conn: &Conn, name: &str) -> StoreResult<Option<Installed>> {
    conn.query_opt(
        "SELECT name, manifest, installed_at, catalog FROM extensions WHERE name = ?1",
        params![name],
        installed_row,
    )
}

/// Keeps the tools `name`'s servers answered, unless it was reinstalled
/// since `installed_at` (then the new manifest's servers are asked again).
pub fn set_catalog(tx: &Tx, name: &str, installed_at: i64, catalog: &str) -> StoreResult<()> {
    tx.execute(
        "UPDATE extensions SET catalog = ?3 WHERE name = ?1 AND installed_at = ?2",
        params![name, installed_at, catalog],
    )?;
    Ok(())
}

/// Enables installed `name` in `space`; false when it is not installed.
pub fn enable(tx: &Tx, space: &str, name: &str, by: &str, at: i64) -> StoreResult<bool> {
    if get(tx, name)?.is_none() {
        return Ok(false);
    }
    tx.execute(
        "INSERT INTO space_extensions (space_id, name, enabled_by, enabled_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (space_id, name) DO NOTHING",
        params![space, name, by, at],
    )?;
    Ok(true)
}

/// Whether `name` was enabled in `space`.
pub fn disable(tx: &Tx, space: &str, name: &str) -> StoreResult<bool> {
    Ok(tx.execute(
        "DELETE FROM space_extensions WHERE space_id = ?1 AND name = ?2",
        params![space, name],
    )? > 0)
}

/// The extensions enabled in `space`, by name.
pub fn enabled_in(conn: &Conn, space: &str) -> StoreResult<Vec<Installed>> {
    conn.query_all(
        "SELECT e.name, e.manifest, e.installed_at, e.catalog FROM extensions e
         JOIN space_extensions s ON s.name = e.name WHERE s.space_id = ?1 ORDER BY e.name",
        params![space],
        installed_row,
    )
}

/// Every space's enabled extensions, by space then name (the job loop).
pub fn enabled_everywhere(conn: &Conn) -> StoreResult<Vec<(String, Installed)>> {
    conn.query_all(
        "SELECT s.space_id, e.name, e.manifest, e.installed_at, e.catalog FROM extensions e
         JOIN space_extensions s ON s.name = e.name ORDER BY s.space_id, e.name",
        params![],
        |r| {
            Ok((
                r.get(0)?,
                Installed {
                    name: r.get(1)?,
                    manifest: r.get(2)?,
                    installed_at: r.get(3)?,
                    catalog: r.get(4)?,
                },
            ))
        },
    )
}

/// One key of an extension's store in a space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub extension: String,
    pub space_id: String,
    pub key: String,
    pub value: String,
    pub updated_at: i64,
}

pub fn state_set(
    tx: &Tx,
    extension: &str,
    space: &str,
    key: &str,
    value: &str,
    at: i64,
) -> StoreResult<()> {
    tx.execute(
        "INSERT INTO extension_state (extension, space_id, key, value, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (extension, space_id, key) DO UPDATE SET value = ?4, updated_at = ?5",
        params![extension, space, key, value, at],
    )?;
    Ok(())
}

pub fn state_get(
    conn: &Conn,
    extension: &str,
    space: &str,
    key: &str,
) -> StoreResult<Option<String>> {
    conn.query_opt(
        "SELECT value FROM extension_state WHERE extension = ?1 AND space_id = ?2 AND key = ?3",
        params![extension, space, key],
        |r| r.get(0),
    )
}

/// Every key of every extension in `space`, by extension then key.
pub fn state_list(conn: &Conn, space: &str) -> StoreResult<Vec<StateEntry>> {
    conn.query_all(
        "SELECT extension, space_id, key, value, updated_at FROM extension_state
         WHERE space_id = ?1 ORDER BY extension, key",
        params![space],
        |r| {
            Ok(StateEntry {
                extension: r.get(0)?,
                space_id: r.get(1)?,
                key: r.get(2)?,
                value: r.get(3)?,
                updated_at: r.get(4)?,
            })
        },
    )
}
