//! The agent's tools: `shell` and `mrctl` become a command in the sandbox;
//! `read_file`, `write_file` and `list_files` run on the host, on the turn's
//! layer, through the safe-path function ([`WorkspaceRoot`]), so they behave
//! the same in every backend: relative paths only, no `..`, no symlink
//! followed, regular files only, writes atomic and inside the quota.
//!
//! Must never: run `shell` or `mrctl` on the host directly, open a file tool's
//! path any other way than through [`WorkspaceRoot`], or give a tool more
//! output than the cap.

use std::time::Duration;

use serde_json::{json, Value};

use std::path::Path;

use crate::model::{ToolCall, ToolSpec};
use crate::sandbox::{ExecOutput, ExecRequest};
use crate::workspace::safe::{EntryKind, SafePathError, WorkspaceRoot};

pub(crate) fn tool_specs() -> Vec<ToolSpec> {
    let obj = |props: Value, required: &[&str]| json!({"type": "object", "properties": props, "required": required});
    vec![
        ToolSpec {
            name: "shell".into(),
            description: "Run a shell command in the space's workspace (the current directory).".into(),
            parameters: obj(json!({"command": {"type": "string"}}), &["command"]),
        },
        ToolSpec {
            name: "read_file".into(),
            description: "Read a file of the workspace.".into(),
            parameters: obj(json!({"path": {"type": "string"}}), &["path"]),
        },
        ToolSpec {
            name: "write_file".into(),
            description: "Write (create or replace) a file of the workspace.".into(),
            parameters: obj(
                json!({"path": {"type": "string"}, "content": {"type": "string"}}),
                &["path", "content"],
            ),
        },
        ToolSpec {
            name: "list_files".into(),
            description: "List files of the workspace (three levels deep).".into(),
            parameters: obj(json!({"path": {"type": "string"}}), &[]),
        },
        ToolSpec {
            name: "mrctl".into(),
            description: "Call the Mercury API for this space as the user who asked (e.g. [\"tasks\",\"list\"]).".into(),
            parameters: obj(json!({"args": {"type": "array", "items": {"type": "string"}}}), &["args"]),
        },
    ]
}

/// A tool call the model made that cannot be run as asked; the model is told
/// why (as the tool's result) rather than the turn failing.
#[derive(Debug)]
pub(crate) struct BadToolCall(pub String);

fn str_arg<'a>(call: &'a ToolCall, key: &str) -> Result<&'a str, BadToolCall> {
    call.arguments
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| {
            BadToolCall(format!(
                "{}: argument '{key}' (a string) is required",
                call.name
            ))
        })
}

/// How a tool call is carried out.
#[derive(Debug)]
pub(crate) enum ToolPlan {
    /// A command in the sandbox.
    Exec(ExecRequest),
    /// A file operation on the host, through the safe-path function.
    File(FileOp),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileOp {
    Read { path: String },
    Write { path: String, content: String },
    List { path: String },
}

impl FileOp {
    /// Whether it changes the workspace.
    pub(crate) fn writes(&self) -> bool {
        matches!(self, FileOp::Write { .. })
    }
}

/// Turns a tool call into what to run.
pub(crate) fn plan(
    call: &ToolCall,
    timeout: Duration,
    cap: usize,
) -> Result<ToolPlan, BadToolCall> {
    let exec = |argv: Vec<String>| {
        Ok(ToolPlan::Exec(ExecRequest {
            argv,
            stdin: None,
            timeout,
            output_cap: cap,
        }))
    };
    match call.name.as_str() {
        "shell" => exec(vec![
            "/bin/sh".into(),
            "-c".into(),
            str_arg(call, "command")?.into(),
        ]),
        "read_file" => Ok(ToolPlan::File(FileOp::Read {
            path: str_arg(call, "path")?.into(),
        })),
        "write_file" => Ok(ToolPlan::File(FileOp::Write {
            path: str_arg(call, "path")?.into(),
            content: str_arg(call, "content")?.into(),
        })),
        "list_files" => Ok(ToolPlan::File(FileOp::List {
            path: call
                .arguments
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or(".")
                .into(),
        })),
        "mrctl" => {
            let args = call
                .arguments
                .get("args")
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    BadToolCall("mrctl: argument 'args' (a list of strings) is required".into())
                })?;
            let mut argv = vec!["mrctl".to_string()];
            for a in args {
                argv.push(
                    a.as_str()
                        .ok_or_else(|| {
                            BadToolCall("mrctl: every item of 'args' must be a string".into())
                        })?
                        .to_owned(),
                );
            }
            exec(argv)
        }
        other => Err(BadToolCall(format!("there is no tool named {other:?}"))),
    }
}

/// How deep `list_files` goes.
const LIST_DEPTH: usize = 3;

/// Runs a file tool on `root` (the turn's layer) and says what happened, as
/// the model reads it. Blocking: call it off the async runtime.
pub(crate) fn run_file_op(root: &Path, op: FileOp, cap: usize) -> String {
    let ws = match WorkspaceRoot::open(root) {
        Ok(ws) => ws,
        Err(e) => return format!("error: the workspace cannot be opened: {e}"),
    };
    let explain = |e: SafePathError| {
        match e {
        SafePathError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
            "error: the workspace quota is used up (sandbox.workspace_mb); nothing more can be written".to_string()
        }
        e => format!("error: {e}"),
    }
    };
    match op {
        FileOp::Read { path } => match ws.read_capped(&path, cap) {
            Ok(Some((bytes, longer))) => {
                let mut s = String::from_utf8_lossy(&bytes).into_owned();
                if longer {
                    s.push_str("\n[output truncated]");
                }
                if s.is_empty() {
                    s.push_str("(empty file)");
                }
                s
            }
            Ok(None) => format!("error: {path:?} does not exist"),
            Err(e) => explain(e),
        },
        FileOp::Write { path, content } => match ws.write_atomic(&path, content.as_bytes()) {
            Ok(()) => format!("wrote {} bytes to {path}", content.len()),
            Err(e) => explain(e),
        },
        FileOp::List { path } => {
            let dir = match ws.open_dir(if path == "." { "" } else { &path }) {
                Ok(d) => d,
                Err(e) => return explain(e),
            };
            let mut lines = Vec::new();
            let mut size = 0;
            let base = if path == "." || path.is_empty() {
                String::new()
            } else {
                format!("{}/", path.trim_end_matches('/'))
            };
            list_into(&dir, &base, 1, &mut lines, &mut size, cap);
            if size > cap {
                lines.push("[output truncated]".into());
            }
            if lines.is_empty() {
                "(empty directory)".into()
            } else {
                lines.join("\n")
            }
        }
    }
}

fn list_into(
    dir: &WorkspaceRoot,
    prefix: &str,
    depth: usize,
    out: &mut Vec<String>,
    size: &mut usize,
    cap: usize,
) {
    let Ok(entries) = dir.list("") else { return };
    for e in entries {
        if *size > cap {
            return;
        }
        let name = format!("{prefix}{}", e.name.to_string_lossy());
        let line = match e.kind {
            EntryKind::Dir => format!("{name}/"),
            EntryKind::File => format!("{name} ({} bytes)", e.size),
            EntryKind::Symlink => format!("{name} (symbolic link, not followed)"),
            EntryKind::Other => format!("{name} (not a regular file)"),
        };
        *size += line.len() + 1;
        out.push(line);
        if e.kind == EntryKind::Dir && depth < LIST_DEPTH {
            if let Ok(sub) = dir.open_dir(&e.name.to_string_lossy()) {
                list_into(&sub, &format!("{name}/"), depth + 1, out, size, cap);
            }
        }
    }
}

/// What the model reads back from a tool.
pub(crate) fn render_output(out: &ExecOutput) -> String {
    let mut s = String::new();
    if out.exit_code != 0 {
        s.push_str(&format!("exit code {}\n", out.exit_code));
    }
    s.push_str(&out.stdout);
    if !out.stderr.is_empty() {
        if !s.is_empty() && !s.ends_with('\n') {
            s.push('\n');
        }
        s.push_str("stderr: ");
        s.push_str(&out.stderr);
    }
    if out.truncated {
        s.push_str("\n[output truncated]");
    }
    if s.is_empty() {
        s.push_str("(no output)");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            id: "c1".into(),
            name: name.into(),
            arguments: args,
        }
    }

    #[test]
    fn file_tools_are_host_side_and_shell_goes_to_the_sandbox() {
        let d = Duration::from_secs(1);
        let p = plan(
            &call(
                "write_file",
                json!({"path": "a/b.txt", "content": "x $(rm -rf /)"}),
            ),
            d,
            100,
        )
        .unwrap();
        assert!(
            matches!(p, ToolPlan::File(FileOp::Write { ref path, ref content })
            if path == "a/b.txt" && content == "x $(rm -rf /)")
        );
        assert!(matches!(
            plan(&call("shell", json!({"command": "ls"})), d, 1).unwrap(),
            ToolPlan::Exec(_)
        ));
        assert!(
            matches!(plan(&call("list_files", json!({})), d, 1).unwrap(),
            ToolPlan::File(FileOp::List { ref path }) if path == ".")
        );
    }

    #[test]
    fn bad_calls_are_explained_not_run() {
        let d = Duration::from_secs(1);
        assert!(plan(&call("shell", json!({})), d, 1).is_err());
        assert!(plan(&call("nope", json!({})), d, 1).is_err());
        assert!(plan(&call("mrctl", json!({"args": [1]})), d, 1).is_err());
    }

    #[test]
    fn file_tools_refuse_dotdot_absolute_paths_and_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(t.path().join("secret"), "CANARY").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), ws.join("link")).unwrap();
        std::os::unix::fs::symlink(t.path(), ws.join("dirlink")).unwrap();
        for path in ["../secret", "/etc/passwd", "link", "dirlink/secret"] {
            let out = run_file_op(&ws, FileOp::Read { path: path.into() }, 100);
            assert!(
                out.starts_with("error:") && !out.contains("CANARY"),
                "{path}: {out}"
            );
            let out = run_file_op(
                &ws,
                FileOp::Write {
                    path: format!("{path}/x"),
                    content: "y".into(),
                },
                100,
            );
            assert!(out.starts_with("error:"), "{path}: {out}");
        }
        for path in ["..", "/", "dirlink", "-exec"] {
            let out = run_file_op(&ws, FileOp::List { path: path.into() }, 1000);
            assert!(
                out.starts_with("error:") && !out.contains("secret"),
                "{path}: {out}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(t.path().join("secret")).unwrap(),
            "CANARY"
        );
        let out = run_file_op(
            &ws,
            FileOp::Write {
                path: "n/m.txt".into(),
                content: "hi".into(),
            },
            100,
        );
        assert_eq!(out, "wrote 2 bytes to n/m.txt");
        let out = run_file_op(&ws, FileOp::List { path: ".".into() }, 1000);
        assert_eq!(out, "dirlink (symbolic link, not followed)\nlink (symbolic link, not followed)\nn/\nn/m.txt (2 bytes)");
    }

    #[test]
    fn output_rendering_shows_failures_and_truncation() {
        let out = ExecOutput {
            exit_code: 2,
            stdout: "x".into(),
            stderr: "bad".into(),
            truncated: true,
        };
        assert_eq!(
            render_output(&out),
            "exit code 2\nx\nstderr: bad\n[output truncated]"
        );
    }
}
