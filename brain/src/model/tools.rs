//! The calls of the tools offered to the model (their names, descriptions and schemas are
//! `prompt/tools.rs`'s): how a call's arguments become a logged [`ToolCall`] (or an error
//! the model can act on), which calls need a person's approval, and how results are told
//! back (long outputs cut to head and tail).

use serde_json::Value;

use crate::llm::ToolUse;
use crate::model::agent::{AgentSpec, AgentState, Gate, MAX_STANDING, Permission};
use crate::model::event::ToolCall;

/// Default and largest timeout of `run_command`.
const DEFAULT_TIMEOUT_SECS: u64 = 120;
const MAX_TIMEOUT_SECS: u64 = 3600;
pub use super::text::MAX_OBSERVATION;
/// Largest file `write_file` and `edit_file` handle.
pub const MAX_EDIT_BYTES: usize = 1 << 20;

pub use super::prompt::tools::specs;

/// The tool a call's `name` means when it is not a tool's name as written but differs only
/// in case and separators (`SEARCH`, `Read_File`, `readFile`, `run-command`): small models
/// write names so, and each such call would otherwise cost a turn spent on an error.
/// `None`: the name is a tool's own, or no tool's.
pub fn canonical_name(name: &str) -> Option<&'static str> {
    const NAMES: &[&str] = &[
        "read_file",
        "list_files",
        "search",
        "run_command",
        "write_file",
        "edit_file",
        "request_environment",
        "finish",
    ];
    if NAMES.contains(&name) {
        return None;
    }
    let folded = |n: &str| -> String {
        n.chars()
            .filter(|c| !matches!(c, '_' | '-' | ' ' | '.'))
            .flat_map(char::to_lowercase)
            .collect()
    };
    let want = folded(name.trim());
    NAMES.iter().copied().find(|n| folded(n) == want)
}

/// What to do with one of the model's tool calls.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    /// Run it; `mutating` calls may need approval; `what` describes it for people.
    Call {
        call: ToolCall,
        mutating: bool,
        what: String,
    },
    Finish(String),
    /// Not run: the error is the observation.
    Refused(String),
    /// Move to a machine that fits (brain side; no worker call).
    Environment {
        req: EnvRequest,
        what: String,
    },
}

use super::env::EnvRequest;

/// Why a call of the model's is not run, or an edit not made: what the model is told, so it
/// can send the call again as it should be.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool {name:?}; the tools are: {tools}")]
    Unknown { name: String, tools: String },
    /// A tool offered that [`prepare`] does not know how to run (a bug of the brain's).
    #[error("unknown tool {0:?}")]
    Unhandled(String),
    #[error("the arguments of {0} must be a JSON object")]
    NotObject(String),
    #[error("the arguments of {tool} are not valid JSON ({source}); send a JSON object")]
    NotJson {
        tool: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{tool}: missing required argument {key:?}")]
    Missing { tool: String, key: String },
    /// An argument of the wrong type: `want` says which (`a string`, `a non-negative integer`).
    #[error("{tool}: argument {key:?} must be {want}")]
    WrongType {
        tool: String,
        key: String,
        want: &'static str,
    },
    #[error("{tool}: {key} = {value} is not a sensible size")]
    NotSensible {
        tool: String,
        key: String,
        value: u64,
    },
    #[error("{tool}: label {key:?} must be a string")]
    LabelNotString { tool: String, key: String },
    #[error("{0}: labels must be an object of strings")]
    LabelsNotObject(String),
    #[error(transparent)]
    Label(#[from] shared::ParseError),
    /// `search`'s pattern is not a regular expression the worker takes.
    #[error(transparent)]
    Pattern(#[from] shared::workspace::Error),
    #[error("run_command: the command is empty")]
    EmptyCommand,
    #[error("write_file: the content is over {MAX_EDIT_BYTES} bytes; write smaller files")]
    TooLarge,
    #[error("edit_file: old_string is empty; use write_file to create a file")]
    EmptyOld,
    #[error("{0} is not permitted: this task is read-only")]
    ReadOnly(String),
    /// `edit_file`'s old text is not in the file once.
    #[error(transparent)]
    Edit(#[from] EditError),
}

/// A path argument, relative to the workspace. A path under `/workspace/` is taken as the
/// workspace path it is: confined commands see their workspace there, so their output (a
/// traceback, a compiler's message) names its files so, and models copy those paths. What
/// is left is checked as any relative path is, by the worker.
fn path_arg(
    m: &serde_json::Map<String, Value>,
    tool: &str,
    key: &str,
) -> Result<String, ToolError> {
    string(m, tool, key).map(|p| in_workspace(&p))
}

/// `path` with the workspace's place in a confined command's view (`/workspace/`) taken off.
fn in_workspace(path: &str) -> String {
    let root = shared::paths::WORKSPACE_IN_SANDBOX;
    match path.strip_prefix(root) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            match rest.trim_start_matches('/') {
                "" => ".".into(),
                rest => rest.into(),
            }
        }
        _ => path.into(),
    }
}

fn args(u: &ToolUse) -> Result<serde_json::Map<String, Value>, ToolError> {
    let text = u.arguments.trim();
    if text.is_empty() {
        return Ok(Default::default());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ToolError::NotObject(u.name.clone())),
        Err(source) => Err(ToolError::NotJson {
            tool: u.name.clone(),
            source,
        }),
    }
}

fn string(m: &serde_json::Map<String, Value>, tool: &str, key: &str) -> Result<String, ToolError> {
    match m.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ToolError::WrongType {
            tool: tool.into(),
            key: key.into(),
            want: "a string",
        }),
        None => Err(ToolError::Missing {
            tool: tool.into(),
            key: key.into(),
        }),
    }
}

fn opt_string(
    m: &serde_json::Map<String, Value>,
    tool: &str,
    key: &str,
) -> Result<String, ToolError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        _ => string(m, tool, key),
    }
}

fn opt_u64(
    m: &serde_json::Map<String, Value>,
    tool: &str,
    key: &str,
) -> Result<Option<u64>, ToolError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .map(Some)
            .ok_or_else(|| ToolError::WrongType {
                tool: tool.into(),
                key: key.into(),
                want: "a non-negative integer",
            }),
    }
}

/// `text` as a JSON string: what a person approves is quoted so that nothing in it (a quote,
/// a newline, a control character) can end the quote or pass for something else.
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// A command as a person approves it: quoted, with where it runs when not at the root.
fn run_what(command: &str, cwd: &str) -> String {
    let mut what = format!("run {}", quoted(command));
    if !cwd.is_empty() {
        what.push_str(&format!(" in {}", quoted(cwd)));
    }
    what
}

/// Turns one of the model's calls into what the agent does with it.
pub fn prepare(u: &ToolUse, spec: &AgentSpec) -> Prepared {
    match prepare_inner(u, spec.permission) {
        Ok(Prepared::Call {
            call: ToolCall::WriteFile { path, .. } | ToolCall::EditFile { path, .. },
            ..
        }) if spec
            .check
            .as_ref()
            .is_some_and(|c| crate::model::agent::is_protected(c, &path)) =>
        {
            Prepared::Refused(format!(
                "error: {path} is protected: the acceptance check relies on it, and it is put back as it was before every run of the check. Change the code, not the check's files."
            ))
        }
        Ok(p) => p,
        Err(e) => Prepared::Refused(format!("error: {e}")),
    }
}

fn prepare_inner(u: &ToolUse, permission: Permission) -> Result<Prepared, ToolError> {
    let known = specs(Permission::Full, true);
    if !known.iter().any(|s| s.name == u.name) {
        let names: Vec<String> = specs(permission, false)
            .into_iter()
            .map(|s| s.name)
            .collect();
        return Err(ToolError::Unknown {
            name: u.name.clone(),
            tools: names.join(", "),
        });
    }
    let m = args(u)?;
    let t = u.name.as_str();
    let (call, mutating, what) = match t {
        "finish" => return Ok(Prepared::Finish(opt_string(&m, t, "summary")?)),
        "request_environment" => {
            if permission == Permission::ReadOnly {
                return Err(ToolError::ReadOnly(t.into()));
            }
            let n = |key: &str| -> Result<u32, ToolError> {
                let v = opt_u64(&m, t, key)?.unwrap_or(0);
                u32::try_from(v)
                    .ok()
                    .filter(|v| *v <= 100_000)
                    .ok_or_else(|| ToolError::NotSensible {
                        tool: t.into(),
                        key: key.into(),
                        value: v,
                    })
            };
            let mut labels = std::collections::BTreeMap::new();
            match m.get("labels") {
                None | Some(Value::Null) => {}
                Some(Value::Object(o)) => {
                    for (k, v) in o {
                        let v = v.as_str().ok_or_else(|| ToolError::LabelNotString {
                            tool: t.into(),
                            key: k.clone(),
                        })?;
                        let (k, v) = shared::parse_label(&format!("{k}={v}"))?;
                        labels.insert(k, v);
                    }
                }
                Some(_) => return Err(ToolError::LabelsNotObject(t.into())),
            }
            let req = EnvRequest {
                cpu: n("cpu")?,
                memory_gb: n("memory_gb")?,
                disk_gb: n("disk_gb")?,
                gpu: n("gpu")?,
                labels,
                reason: string(&m, t, "reason")?,
            };
            let mut what = format!(
                "move to a machine with {} cpu, {} GB memory, {} GB disk",
                req.cpu, req.memory_gb, req.disk_gb
            );
            if req.gpu > 0 {
                what.push_str(&format!(", {} gpu", req.gpu));
            }
            for (k, v) in &req.labels {
                what.push_str(&format!(", {k}={v}"));
            }
            what.push_str(&format!(" ({})", tools_reason(&req.reason)));
            return Ok(Prepared::Environment { req, what });
        }
        "read_file" => {
            let path = path_arg(&m, t, "path")?;
            let start = opt_u64(&m, t, "start_line")?.unwrap_or(0) as u32;
            let end = opt_u64(&m, t, "end_line")?.unwrap_or(0) as u32;
            let what = format!("read {}", quoted(&path));
            (
                ToolCall::ReadFile {
                    path,
                    start_line: start,
                    end_line: end,
                },
                false,
                what,
            )
        }
        "list_files" => {
            let glob = in_workspace(&opt_string(&m, t, "glob")?);
            let what = format!("list files {}", quoted(&glob));
            (ToolCall::ListFiles { glob }, false, what)
        }
        "search" => {
            let pattern = string(&m, t, "pattern")?;
            shared::workspace::pattern(&pattern)?;
            let glob = in_workspace(&opt_string(&m, t, "glob")?);
            let what = format!("search {}", quoted(&pattern));
            (ToolCall::Search { pattern, glob }, false, what)
        }
        "run_command" => {
            let command = string(&m, t, "command")?;
            if command.trim().is_empty() {
                return Err(ToolError::EmptyCommand);
            }
            let cwd = opt_string(&m, t, "cwd").map(|c| in_workspace(&c))?;
            let secs = opt_u64(&m, t, "timeout_secs")?
                .unwrap_or(DEFAULT_TIMEOUT_SECS)
                .clamp(1, MAX_TIMEOUT_SECS);
            let what = run_what(&command, &cwd);
            (
                ToolCall::RunCommand {
                    argv: vec!["sh".into(), "-c".into(), command],
                    timeout_ms: secs * 1000,
                    cwd,
                },
                true,
                what,
            )
        }
        "write_file" => {
            let path = path_arg(&m, t, "path")?;
            let content = string(&m, t, "content")?;
            if content.len() > MAX_EDIT_BYTES {
                return Err(ToolError::TooLarge);
            }
            let what = format!("write {} ({} bytes)", quoted(&path), content.len());
            (
                ToolCall::WriteFile {
                    path,
                    content,
                    mode: 0o644,
                },
                true,
                what,
            )
        }
        "edit_file" => {
            let path = path_arg(&m, t, "path")?;
            let old = string(&m, t, "old_string")?;
            let new = string(&m, t, "new_string")?;
            if old.is_empty() {
                return Err(ToolError::EmptyOld);
            }
            let what = format!("edit {}", quoted(&path));
            (ToolCall::EditFile { path, old, new }, true, what)
        }
        _ => return Err(ToolError::Unhandled(u.name.clone())),
    };
    if mutating && permission == Permission::ReadOnly {
        return Err(ToolError::ReadOnly(t.into()));
    }
    Ok(Prepared::Call {
        call,
        mutating,
        what,
    })
}

fn tools_reason(r: &str) -> String {
    head_tail(r.trim(), 200)
}

/// What a person's "always" approves: the same command in the same directory, or any change to
/// the same file. Other calls (a new machine) are asked for each time.
pub fn standing(call: &ToolCall) -> Option<String> {
    match call {
        ToolCall::RunCommand { argv, cwd, .. } => {
            Some(run_what(argv.last().map_or("", |s| s.as_str()), cwd))
        }
        ToolCall::WriteFile { path, .. } | ToolCall::EditFile { path, .. } => {
            Some(format!("change {}", quoted(path)))
        }
        _ => None,
    }
}

/// A person approved the pending call for good: the same call is not asked again.
pub fn approve_always(a: &mut AgentState, approval_id: u64) {
    let Some(ap) = a.approval.as_ref().filter(|p| p.id == approval_id) else {
        return;
    };
    let Some(u) = a.queue.iter().find(|u| u.id == ap.tool_use_id) else {
        return;
    };
    let Prepared::Call { call, .. } = prepare(u, &a.spec) else {
        return;
    };
    let Some(key) = standing(&call) else {
        return;
    };
    if !a.approved_always.contains(&key) {
        a.approved_always.push(key);
        if a.approved_always.len() > MAX_STANDING {
            a.approved_always.remove(0);
        }
    }
}

/// Where the approval of call `u` (`call`, as prepared) stands: a mutating call the
/// permission does not allow, and no person approved for good, is asked.
pub fn gate(a: &AgentState, u: &ToolUse, call: &ToolCall, mutating: bool) -> Gate {
    let for_good = || standing(call).is_some_and(|k| a.approved_always.contains(&k));
    if mutating && needs_approval(call, &a.spec) && !for_good() {
        a.gate(u)
    } else {
        Gate::Go
    }
}

/// Whether a mutating call needs a person's approval under the task's permission.
pub fn needs_approval(call: &ToolCall, spec: &AgentSpec) -> bool {
    match spec.permission {
        Permission::Full => false,
        Permission::ReadOnly | Permission::Ask => true,
        Permission::Auto => !allowed(call, spec),
    }
}

fn any_match(patterns: &[String], text: &str, literal_separator: bool) -> bool {
    patterns.iter().any(|p| {
        globset::GlobBuilder::new(p)
            .literal_separator(literal_separator)
            .build()
            .is_ok_and(|g| g.compile_matcher().is_match(text))
    })
}

/// `auto`: whether a call is on the configured allow-lists.
fn allowed(call: &ToolCall, spec: &AgentSpec) -> bool {
    match call {
        ToolCall::RunCommand { argv, .. } => {
            let cmd = argv.last().map(|s| s.trim()).unwrap_or_default();
            // One simple command only: chains and substitutions could hide anything.
            let plain = !cmd.contains([';', '&', '|', '`', '$', '>', '<', '\n']);
            plain && any_match(&spec.allow_commands, cmd, false)
        }
        ToolCall::WriteFile { path, .. } | ToolCall::EditFile { path, .. } => {
            any_match(&spec.allow_paths, path.trim_start_matches("./"), true)
        }
        ToolCall::ReadFile { .. } | ToolCall::ListFiles { .. } | ToolCall::Search { .. } => true,
    }
}

pub use super::replace::{EditError, apply_edit, apply_exact};

pub use super::prompt::words::{describe_interrupted, no_files_match};
pub use super::text::{head_tail, numbered};

#[cfg(test)]
mod tests {
    use super::*;

    fn u(name: &str, args: &str) -> ToolUse {
        ToolUse {
            id: "c".into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    fn spec(p: Permission) -> AgentSpec {
        AgentSpec {
            model: "m".into(),
            permission: p,
            budget: Default::default(),
            allow_commands: vec!["cargo test*".into(), "ls*".into()],
            allow_paths: vec!["src/**".into()],
            repeat_limit: 3,
            transcript: String::new(),
            check: None,
            egress: None,
            sampling: None,
            no_agents_md: false,
            assists: None,
        }
    }

    #[test]
    fn a_name_written_in_another_case_or_with_other_separators_means_that_tool() {
        for (written, meant) in [
            ("SEARCH", Some("search")),
            ("Read_File", Some("read_file")),
            ("readFile", Some("read_file")),
            ("run-command", Some("run_command")),
            (" Finish ", Some("finish")),
            ("read_file", None),
            ("rm_rf", None),
            ("read", None),
            ("", None),
        ] {
            assert_eq!(canonical_name(written), meant, "{written:?}");
        }
        // Every tool offered is in the table.
        for s in specs(Permission::Full, true) {
            let upper = s.name.to_uppercase();
            assert_eq!(canonical_name(&upper), Some(s.name.as_str()), "{upper}");
        }
    }

    #[test]
    fn a_path_as_confined_commands_see_it_is_the_workspace_path() {
        let s = spec(Permission::Full);
        let path_of = |name: &str, args: &str| match prepare(&u(name, args), &s) {
            Prepared::Call {
                call: ToolCall::ReadFile { path, .. } | ToolCall::EditFile { path, .. },
                ..
            } => path,
            Prepared::Call {
                call: ToolCall::RunCommand { cwd, .. },
                ..
            } => cwd,
            Prepared::Call {
                call: ToolCall::ListFiles { glob } | ToolCall::Search { glob, .. },
                ..
            } => glob,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            path_of("read_file", r#"{"path":"/workspace/cart.py"}"#),
            "cart.py"
        );
        assert_eq!(
            path_of("read_file", r#"{"path":"/workspace//a/b.py"}"#),
            "a/b.py"
        );
        assert_eq!(path_of("read_file", r#"{"path":"/workspace"}"#), ".");
        assert_eq!(
            path_of(
                "edit_file",
                r#"{"path":"/workspace/x","old_string":"a","new_string":"b"}"#
            ),
            "x"
        );
        assert_eq!(
            path_of("run_command", r#"{"command":"ls","cwd":"/workspace/src"}"#),
            "src"
        );
        // Globs too.
        assert_eq!(path_of("list_files", r#"{"glob":"/workspace"}"#), ".");
        assert_eq!(
            path_of("search", r#"{"pattern":"x","glob":"/workspace/src/*.py"}"#),
            "src/*.py"
        );
        assert_eq!(path_of("list_files", r#"{"glob":"*.py"}"#), "*.py");
        assert_eq!(path_of("list_files", "{}"), "");
        // Anything else is passed on as written, for the worker to judge (and refuse).
        assert_eq!(path_of("run_command", r#"{"command":"ls"}"#), "");
        assert_eq!(
            path_of("read_file", r#"{"path":"/workspaces/x"}"#),
            "/workspaces/x"
        );
        assert_eq!(
            path_of("read_file", r#"{"path":"/etc/passwd"}"#),
            "/etc/passwd"
        );
        assert_eq!(
            path_of("read_file", r#"{"path":"/workspace/../etc/passwd"}"#),
            "../etc/passwd"
        );
        // The check's own files are protected under either name.
        let mut checked = spec(Permission::Full);
        checked.check = Some(crate::model::check::Check {
            command: "python3 test_cart.py".into(),
            timeout_ms: 0,
            source: crate::model::check::CheckSource::Request,
            protect: vec!["test_cart.py".into()],
        });
        let write = u(
            "write_file",
            r#"{"path":"/workspace/test_cart.py","content":"x"}"#,
        );
        assert!(
            matches!(prepare(&write, &checked), Prepared::Refused(e) if e.contains("protected"))
        );
    }

    #[test]
    fn bad_calls_become_errors_the_model_can_act_on() {
        let s = spec(Permission::Full);
        let refused = |p: Prepared| match p {
            Prepared::Refused(e) => e,
            other => panic!("not refused: {other:?}"),
        };
        assert!(refused(prepare(&u("rm_rf", "{}"), &s)).contains("unknown tool \"rm_rf\""));
        assert!(refused(prepare(&u("read_file", "{path:"), &s)).contains("not valid JSON"));
        assert!(
            refused(prepare(&u("read_file", "{}"), &s))
                .contains("missing required argument \"path\"")
        );
        assert!(
            refused(prepare(&u("search", r#"{"pattern":"("}"#), &s))
                .contains("invalid regular expression")
        );
        let ro = spec(Permission::ReadOnly);
        assert!(
            refused(prepare(&u("run_command", r#"{"command":"ls"}"#), &ro)).contains("read-only")
        );
        assert!(
            matches!(prepare(&u("finish", r#"{"summary":"done"}"#), &s), Prepared::Finish(x) if x == "done")
        );
    }

    #[test]
    fn auto_allows_listed_commands_and_paths_and_asks_for_the_rest() {
        let s = spec(Permission::Auto);
        let call = |name: &str, args: &str| match prepare(&u(name, args), &s) {
            Prepared::Call { call, .. } => call,
            other => panic!("{other:?}"),
        };
        assert!(!needs_approval(
            &call("run_command", r#"{"command":"cargo test -q"}"#),
            &s
        ));
        assert!(needs_approval(
            &call("run_command", r#"{"command":"cargo test; rm -rf /"}"#),
            &s
        ));
        assert!(needs_approval(
            &call("run_command", r#"{"command":"curl x"}"#),
            &s
        ));
        assert!(!needs_approval(
            &call("write_file", r#"{"path":"src/a/b.rs","content":""}"#),
            &s
        ));
        assert!(needs_approval(
            &call("write_file", r#"{"path":"Cargo.toml","content":""}"#),
            &s
        ));
        assert!(needs_approval(
            &call(
                "edit_file",
                r#"{"path":"Cargo.toml","old_string":"a","new_string":"b"}"#
            ),
            &spec(Permission::Ask)
        ));
        assert!(!needs_approval(
            &call(
                "edit_file",
                r#"{"path":"x","old_string":"a","new_string":"b"}"#
            ),
            &spec(Permission::Full)
        ));
    }

    #[test]
    fn long_text_keeps_head_and_tail_and_lines_are_numbered() {
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        let cut = head_tail(&text, 200);
        assert!(cut.starts_with("line 0\n") && cut.ends_with("line 999\n"));
        assert!(cut.contains("characters") && cut.contains("lines) cut"));
        assert_eq!(numbered("a\nb\nc\n", 2, 3), "     2\tb\n     3\tc\n");
        assert!(no_files_match("").contains("empty"));
        assert_eq!(
            no_files_match("*.pyy"),
            "(no files match \"*.pyy\"; list_files without a glob lists every file)"
        );
    }
}
