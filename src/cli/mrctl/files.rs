//! `mrctl files put` and `files edit`: the two commands that touch local
//! files. `put --from FILE|-` (or `--text`) reads the content before the request is
//! planned (so `plan` stays pure); `edit` fetches the file, opens a private
//! temporary copy in `$EDITOR`, and writes it back with `If-Match: <hash>`
//! so a change made meanwhile is refused (412), not overwritten.
//!
//! Must never: write the file back when the editor failed or changed
//! nothing, or leave the temporary copy behind.

use std::io::Read;

use serde_json::{json, Value};

use super::*;

/// Fills `files put`'s content from `--from FILE` or stdin (`-`).
pub(super) fn read_put_content(cli: &mut Cli, stdin: &mut dyn Read) -> Result<(), Failure> {
    let Command::Files(FilesCmd::Put {
        from,
        text,
        content,
        ..
    }) = &mut cli.command
    else {
        return Ok(());
    };
    let from = match (from.as_deref(), text.take()) {
        (_, Some(t)) => {
            *content = Some(t);
            return Ok(());
        }
        (Some(f), None) => f.to_owned(),
        (None, None) => return Ok(()),
    };
    let bytes = if from == "-" {
        let mut buf = Vec::new();
        stdin.read_to_end(&mut buf).map_err(Failure::Stdin)?;
        buf
    } else {
        std::fs::read(&from).map_err(|e| Failure::Local(format!("cannot read {from}: {e}")))?
    };
    let text = String::from_utf8(bytes).map_err(|_| {
        Failure::Local(format!(
            "{from} is not UTF-8 text; the files API carries text files only"
        ))
    })?;
    *content = Some(text);
    Ok(())
}

/// `files edit PATH`: GET, `$EDITOR` on a copy, PUT with `If-Match`.
pub(super) async fn edit(
    conn: &Connection,
    get: &RequestPlan,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, Failure> {
    let current = call(conn, get).await?;
    let (Some(content), Some(hash)) = (
        field(&current, "content").as_str(),
        field(&current, "hash").as_str(),
    ) else {
        return Err(Failure::Missing(format!(
            "the server's answer for {path} has no content and hash"
        )));
    };
    let editor = env("VISUAL")
        .or_else(|| env("EDITOR"))
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| "vi".to_owned());
    let local = |what: &str, e: &dyn std::fmt::Display| Failure::Local(format!("{what}: {e}"));
    let name = path.rsplit('/').next().unwrap_or("file");
    let copy = tempfile::Builder::new()
        .prefix("mrctl-edit-")
        .suffix(&format!("-{name}"))
        .tempfile()
        .map_err(|e| local("cannot make a temporary copy", &e))?;
    std::fs::write(copy.path(), content).map_err(|e| local("cannot write the copy", &e))?;
    // `$EDITOR` may carry flags ("code --wait"): the shell splits it; the
    // copy's path goes in as "$1", never through the shell's parsing.
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("mrctl-edit")
        .arg(copy.path())
        .status()
        .map_err(|e| local(&format!("cannot start the editor {editor:?}"), &e))?;
    if !status.success() {
        return Err(Failure::Local(format!(
            "the editor {editor:?} exited with {status}; nothing was written"
        )));
    }
    let edited =
        std::fs::read(copy.path()).map_err(|e| local("cannot read the edited copy", &e))?;
    let edited = String::from_utf8(edited).map_err(|_| {
        Failure::Local("the edited copy is not UTF-8 text; nothing was written".into())
    })?;
    if edited == content {
        return Ok(format!("{path}: no change; nothing was written\n"));
    }
    let put = RequestPlan::put(get.path.clone())
        .body(json!({ "content": edited }))
        .if_match(Some(hash))?;
    let written: Value = call(conn, &put).await?;
    Ok(format!(
        "wrote {path} ({} bytes, hash {})\n",
        cell(field(&written, "size")),
        short_hash(field(&written, "hash"))
    ))
}

/// The first 12 hex digits of a hash (enough to tell files apart by eye).
pub(super) fn short_hash(v: &Value) -> String {
    match v.as_str() {
        Some(h) => h.chars().take(12).collect(),
        None => "-".to_owned(),
    }
}
