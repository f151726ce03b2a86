//! An extension's per-space config keys: `[config.<key>]` tables of its
//! manifest, each a schema in a small JSON-schema subset, checked at
//! `mercury ext add`; a value set with `mrctl config set <ext>.<key> VALUE`
//! is checked against it before it is stored.
//!
//! The subset: `type` (`string`, `integer`, `number`, `boolean`; required),
//! `enum`, `minimum` / `maximum` (numbers), `minLength` / `maxLength`
//! (strings, in characters), `pattern` (strings; a regular expression of the
//! `regex` crate, searched anywhere in the value as JSON schema does; anchor
//! it with `^…$`), and `description`.
//!
//! Must never: accept a schema keyword outside the subset (a manifest that
//! relies on `format` or `oneOf` would believe a value was checked), or
//! store a value its schema refuses.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::storage::extensions as rows;
use crate::storage::spaces::{self, KvTable};
use crate::storage::{Conn, StoreResult};

const KEYWORDS: &[&str] = &[
    "type",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "description",
];

/// Checks one `[config.<key>]` schema; `Err((".field", why))`.
pub fn check_schema(key: &str, schema: &toml::Table) -> Result<(), (String, String)> {
    let bad = |f: &str, why: &str| Err((f.to_owned(), why.to_owned()));
    let key_ok = !key.is_empty()
        && key.len() <= 32
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
    if !key_ok {
        return bad(
            "",
            "a config key is 1-32 of a-z, 0-9, '_', '.', starting with a letter",
        );
    }
    for k in schema.keys() {
        if !KEYWORDS.contains(&k.as_str()) {
            return Err((
                format!(".{k}"),
                format!(
                    "not in the supported JSON-schema subset ({})",
                    KEYWORDS.join(", ")
                ),
            ));
        }
    }
    let ty = match schema.get("type").and_then(toml::Value::as_str) {
        Some(t @ ("string" | "integer" | "number" | "boolean")) => t,
        _ => return bad(".type", "one of string, integer, number, boolean"),
    };
    let numeric = matches!(ty, "integer" | "number");
    for k in ["minimum", "maximum"] {
        if let Some(v) = schema.get(k) {
            if !numeric || !(v.is_integer() || v.is_float()) {
                return bad(&format!(".{k}"), "a number, for an integer or number key");
            }
        }
    }
    for k in ["minLength", "maxLength"] {
        if let Some(v) = schema.get(k) {
            if ty != "string" || v.as_integer().is_none_or(|n| n < 0) {
                return bad(&format!(".{k}"), "a whole number ≥ 0, for a string key");
            }
        }
    }
    if let Some(p) = schema.get("pattern") {
        match p.as_str() {
            Some(p) if ty == "string" => {
                regex::Regex::new(p).map_err(|e| (".pattern".to_owned(), e.to_string()))?;
            }
            _ => return bad(".pattern", "a regular expression, for a string key"),
        }
    }
    if let Some(e) = schema.get("enum") {
        let Some(items) = e.as_array().filter(|a| !a.is_empty()) else {
            return bad(".enum", "a non-empty list of allowed values");
        };
        for item in items {
            let fits = match ty {
                "string" => item.is_str(),
                "integer" => item.is_integer(),
                "number" => item.is_integer() || item.is_float(),
                _ => item.is_bool(),
            };
            if !fits {
                return bad(".enum", &format!("every value must be of type {ty}"));
            }
        }
    }
    if schema.get("description").is_some_and(|d| !d.is_str()) {
        return bad(".description", "a string");
    }
    Ok(())
}

/// `value` (as given on the command line) checked against `schema`: the
/// typed JSON value, or why it is refused.
pub fn check_value(schema: &toml::Table, value: &str) -> Result<Value, String> {
    let ty = schema
        .get("type")
        .and_then(toml::Value::as_str)
        .unwrap_or("string");
    let typed = match ty {
        "integer" => value
            .trim()
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("must be a whole number, not {value:?}"))?,
        "number" => value
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Value::from)
            .ok_or_else(|| format!("must be a number, not {value:?}"))?,
        "boolean" => match value.trim() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(format!("must be true or false, not {value:?}")),
        },
        _ => Value::String(value.to_owned()),
    };
    let num = |k: &str| {
        schema
            .get(k)
            .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
    };
    if let Some(n) = typed.as_f64() {
        if let Some(min) = num("minimum") {
            if n < min {
                return Err(format!("must be at least {min}"));
            }
        }
        if let Some(max) = num("maximum") {
            if n > max {
                return Err(format!("must be at most {max}"));
            }
        }
    }
    if let Value::String(s) = &typed {
        let len = s.chars().count() as i64;
        if let Some(min) = schema.get("minLength").and_then(toml::Value::as_integer) {
            if len < min {
                return Err(format!("must be at least {min} characters"));
            }
        }
        if let Some(max) = schema.get("maxLength").and_then(toml::Value::as_integer) {
            if len > max {
                return Err(format!("must be at most {max} characters"));
            }
        }
        if let Some(p) = schema.get("pattern").and_then(toml::Value::as_str) {
            let re = regex::Regex::new(p).map_err(|e| format!("the schema's pattern: {e}"))?;
            if !re.is_match(s) {
                return Err(format!("must match the pattern {p}"));
            }
        }
    }
    if let Some(items) = schema.get("enum").and_then(toml::Value::as_array) {
        let allowed: Vec<Value> = items
            .iter()
            .filter_map(|i| serde_json::to_value(i).ok())
            .collect();
        let hit = allowed.iter().any(|a| match (a.as_f64(), typed.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => *a == typed,
        });
        if !hit {
            let shown: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return Err(format!("must be one of {}", shown.join(", ")));
        }
    }
    Ok(typed)
}

/// What `PUT /api/config` does with `key` when its first part names an
/// installed extension: `None` when it does not (a host key); otherwise
/// `Ok(())` when the extension is enabled in `space`, declares the key and
/// its schema takes `value`, or the sentence refusing it.
pub fn check_set(
    c: &Conn,
    space: &str,
    key: &str,
    value: &str,
) -> StoreResult<Option<Result<(), String>>> {
    let Some((ext, rest)) = key.split_once('.') else {
        return Ok(None);
    };
    let Some(row) = rows::get(c, ext)? else {
        return Ok(None);
    };
    let Ok(m) = super::manifest::parse(&row.name, &row.manifest) else {
        return Ok(Some(Err(format!(
            "{key}: the extension {ext}'s manifest no longer parses"
        ))));
    };
    if !rows::enabled_in(c, space)?.iter().any(|r| r.name == ext) {
        return Ok(Some(Err(format!(
            "{key}: the extension {ext} is not enabled in this space (mrctl ext enable {ext})"
        ))));
    }
    let Some(schema) = m.config.get(rest) else {
        let known: Vec<String> = m.config.keys().map(|k| format!("{ext}.{k}")).collect();
        return Ok(Some(Err(format!(
            "{key}: the extension {ext} declares no such key; its keys: {}",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))));
    };
    Ok(Some(
        check_value(schema, value)
            .map(|_| ())
            .map_err(|why| format!("{key}: {why}")),
    ))
}

/// The space's values of `m`'s keys, typed by their schemas (a stored
/// value its schema no longer takes is left out): what hooks and jobs get
/// as `config`.
pub fn values(c: &Conn, space: &str, m: &super::Manifest) -> StoreResult<Value> {
    let mut out = serde_json::Map::new();
    if m.config.is_empty() {
        return Ok(Value::Object(out));
    }
    let stored: BTreeMap<String, String> = spaces::kv_list(c, KvTable::Config, space)?
        .into_iter()
        .map(|e| (e.key, e.value))
        .collect();
    for (k, schema) in &m.config {
        if let Some(v) = stored.get(&format!("{}.{k}", m.name)) {
            if let Ok(typed) = check_value(schema, v) {
                out.insert(k.clone(), typed);
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn space_config_schemas_take_only_the_documented_subset() {
        assert!(check_schema(
            "lang",
            &schema("type = \"string\"\nenum = [\"en\", \"fr\"]")
        )
        .is_ok());
        let (f, why) =
            check_schema("lang", &schema("type = \"string\"\nformat = \"email\"")).unwrap_err();
        assert_eq!(f, ".format");
        assert!(why.contains("subset"), "{why}");
        assert_eq!(
            check_schema("n", &schema("type = \"object\""))
                .unwrap_err()
                .0,
            ".type"
        );
        assert_eq!(
            check_schema("n", &schema("type = \"string\"\nminimum = 1"))
                .unwrap_err()
                .0,
            ".minimum"
        );
        assert_eq!(
            check_schema("n", &schema("type = \"string\"\npattern = \"(\""))
                .unwrap_err()
                .0,
            ".pattern"
        );
        assert_eq!(
            check_schema("n", &schema("type = \"integer\"\nenum = [\"a\"]"))
                .unwrap_err()
                .0,
            ".enum"
        );
        assert_eq!(
            check_schema("Bad", &schema("type = \"string\""))
                .unwrap_err()
                .0,
            ""
        );
    }

    #[test]
    fn space_config_values_are_typed_and_bounded() {
        let n = schema("type = \"integer\"\nminimum = 1\nmaximum = 10");
        assert_eq!(check_value(&n, "3").unwrap(), Value::from(3));
        assert!(check_value(&n, "0").unwrap_err().contains("at least 1"));
        assert!(check_value(&n, "11").unwrap_err().contains("at most 10"));
        assert!(check_value(&n, "2.5").unwrap_err().contains("whole number"));
        let s = schema("type = \"string\"\nminLength = 2\nmaxLength = 4\npattern = \"^[a-z]+$\"");
        assert!(check_value(&s, "abc").is_ok());
        assert!(check_value(&s, "a").unwrap_err().contains("at least 2"));
        assert!(check_value(&s, "abcde").unwrap_err().contains("at most 4"));
        assert!(check_value(&s, "AB").unwrap_err().contains("pattern"));
        let e = schema("type = \"string\"\nenum = [\"en\", \"fr\"]");
        assert!(check_value(&e, "de")
            .unwrap_err()
            .contains("one of \"en\", \"fr\""));
        let b = schema("type = \"boolean\"");
        assert_eq!(check_value(&b, "true").unwrap(), Value::Bool(true));
        assert!(check_value(&b, "yes").is_err());
        let f = schema("type = \"number\"\nenum = [1, 2.5]");
        assert!(check_value(&f, "2.5").is_ok() && check_value(&f, "1").is_ok());
        assert!(check_value(&f, "NaN").is_err());
    }
}
