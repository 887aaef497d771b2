//! The tools offered to the model, as it reads them: their names, what each does and the
//! schema of its arguments. (How a call's arguments become a logged call is
//! `model/tools.rs`'s.)

use serde_json::{Value, json};

use crate::llm::ToolSpec;
use crate::model::agent::Permission;

fn spec(name: &str, description: &str, parameters: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        parameters,
    }
}

/// The tools a task with `permission` is offered.
/// `request_environment` is offered only when `can_move` (the brain has somewhere else to
/// run the task).
pub fn specs(permission: Permission, can_move: bool) -> Vec<ToolSpec> {
    let mut v = vec![
        spec(
            "read_file",
            "Read a text file of the workspace, with numbered lines. Optionally a line range.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace root"},
                "start_line": {"type": "integer", "description": "First line (1-based)"},
                "end_line": {"type": "integer", "description": "Last line (inclusive)"}
            }, "required": ["path"]}),
        ),
        spec(
            "list_files",
            "List the workspace's files (honouring .gitignore), optionally only those matching a glob (`*` within a name, `**` across directories).",
            json!({"type": "object", "properties": {
                "glob": {"type": "string"}
            }}),
        ),
        spec(
            "search",
            "Search the workspace's files (honouring .gitignore) for a regular expression; answers path:line: text.",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string", "description": "Regular expression"},
                "glob": {"type": "string", "description": "Only files matching this glob"}
            }, "required": ["pattern"]}),
        ),
    ];
    if permission != Permission::ReadOnly {
        v.extend([
            spec(
                "run_command",
                "Run a shell command (sh -c) in the workspace; answers its exit code, stdout and stderr.",
                json!({"type": "object", "properties": {
                    "command": {"type": "string"},
                    "cwd": {"type": "string", "description": "Directory relative to the workspace root"},
                    "timeout_secs": {"type": "integer", "description": "Default 120, at most 3600"}
                }, "required": ["command"]}),
            ),
            spec(
                "write_file",
                "Create or replace a file of the workspace with the given content.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                }, "required": ["path", "content"]}),
            ),
            spec(
                "edit_file",
                "Replace exactly one occurrence of old_string with new_string in a file. old_string must match the file exactly (whitespace included) and occur once.",
                json!({"type": "object", "properties": {
                    "path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"}
                }, "required": ["path", "old_string", "new_string"]}),
            ),
        ]);
    }
    if permission != Permission::ReadOnly && can_move {
        v.push(spec(
                "request_environment",
                "Move this task to a machine with at least the given resources and labels, e.g. when the build needs more cores or memory, or a GPU. An idle matching worker is reused, or one is provisioned within the brain's quotas and this task's budget (it may need a person's approval). The workspace moves along; processes started on the current machine are gone afterwards. The answer says what you got, or why not.",
                json!({"type": "object", "properties": {
                    "cpu": {"type": "integer", "description": "CPU cores"},
                    "memory_gb": {"type": "integer"},
                    "disk_gb": {"type": "integer"},
                    "gpu": {"type": "integer", "description": "GPUs (0: none)"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Labels the machine must carry, e.g. {\"arch\": \"aarch64\"}"},
                    "reason": {"type": "string", "description": "Why, for the people watching"}
                }, "required": ["reason"]}),
            ));
    }
    v.push(spec(
        "finish",
        "End the task when the goal is met (or cannot be), with a short summary of what was done.",
        json!({"type": "object", "properties": {
            "summary": {"type": "string"}
        }, "required": ["summary"]}),
    ));
    v
}
