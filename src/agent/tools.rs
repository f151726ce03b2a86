//! The agent's tools and how each becomes a command in the sandbox.
//!
//! Every tool runs through [`SandboxSession::exec`], so a docker session keeps
//! file access inside the container (a symlink planted by `shell` cannot make
//! the host read outside the workspace). Must never: run a tool on the host
//! directly, or give a tool more output than the cap.

use std::time::Duration;

use serde_json::{json, Value};

use crate::model::{ToolCall, ToolSpec};
use crate::sandbox::{ExecOutput, ExecRequest, SandboxError, SandboxSession};

pub fn tool_specs() -> Vec<ToolSpec> {
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
pub struct BadToolCall(pub String);

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

/// Turns a tool call into the command to execute.
pub fn plan_exec(
    call: &ToolCall,
    timeout: Duration,
    cap: usize,
) -> Result<ExecRequest, BadToolCall> {
    let (argv, stdin): (Vec<String>, Option<Vec<u8>>) = match call.name.as_str() {
        "shell" => (
            vec![
                "/bin/sh".into(),
                "-c".into(),
                str_arg(call, "command")?.into(),
            ],
            None,
        ),
        "read_file" => (
            vec!["cat".into(), "--".into(), str_arg(call, "path")?.into()],
            None,
        ),
        "write_file" => (
            vec![
                "/bin/sh".into(),
                "-c".into(),
                // mkdir the parent so `notes/today.md` works on a fresh workspace.
                r#"mkdir -p -- "$(dirname -- "$1")" && cat > "$1""#.into(),
                "write_file".into(),
                str_arg(call, "path")?.into(),
            ],
            Some(str_arg(call, "content")?.as_bytes().to_vec()),
        ),
        "list_files" => {
            let path = call
                .arguments
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or(".");
            (
                vec!["find".into(), path.into(), "-maxdepth".into(), "3".into()],
                None,
            )
        }
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
            (argv, None)
        }
        other => return Err(BadToolCall(format!("there is no tool named {other:?}"))),
    };
    Ok(ExecRequest {
        argv,
        stdin,
        timeout,
        output_cap: cap,
    })
}

/// What the model reads back from a tool.
pub fn render_output(out: &ExecOutput) -> String {
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

pub async fn run_tool(
    session: &dyn SandboxSession,
    call: &ToolCall,
    timeout: Duration,
    cap: usize,
) -> Result<String, SandboxError> {
    match plan_exec(call, timeout, cap) {
        Ok(req) => session.exec(req).await.map(|o| render_output(&o)),
        Err(BadToolCall(m)) => Ok(format!("error: {m}")),
    }
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
    fn write_file_passes_content_on_stdin_not_argv() {
        let req = plan_exec(
            &call(
                "write_file",
                json!({"path": "a/b.txt", "content": "secret $(rm -rf /)"}),
            ),
            Duration::from_secs(1),
            100,
        )
        .unwrap();
        assert_eq!(req.stdin.as_deref(), Some("secret $(rm -rf /)".as_bytes()));
        assert!(req.argv.iter().all(|a| !a.contains("rm -rf")));
        assert_eq!(req.argv.last().map(String::as_str), Some("a/b.txt"));
    }

    #[test]
    fn bad_calls_are_explained_not_run() {
        assert!(plan_exec(&call("shell", json!({})), Duration::from_secs(1), 1).is_err());
        assert!(plan_exec(&call("nope", json!({})), Duration::from_secs(1), 1).is_err());
        assert!(plan_exec(
            &call("mrctl", json!({"args": [1]})),
            Duration::from_secs(1),
            1
        )
        .is_err());
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
