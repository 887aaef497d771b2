//! How the admin CLI (and the demo) shows things to people: tables of workers and machines
//! (or `--json` for programs), and a task's records and live output in words.

use std::time::Duration;

/// `brain machines`: a table, or JSON.
pub fn print_machines(machines: &[proto::MachineInfo], json: bool) {
    let now = shared::now_unix_ms();
    if json {
        let items: Vec<serde_json::Value> = machines
            .iter()
            .map(|m| {
                let s = m.spec.unwrap_or_default();
                serde_json::json!({
                    "id": m.id, "provider": m.provider, "state": m.state,
                    "handle": m.handle, "address": m.address,
                    "spec": {"cpu": s.cpu, "memory_gb": s.memory_gb, "disk_gb": s.disk_gb, "gpu": s.gpu},
                    "worker_id": m.worker_id, "connected": m.connected, "task_id": m.task_id,
                    "created_unix_ms": m.created_unix_ms, "ended_unix_ms": m.ended_unix_ms,
                    "age_seconds": (now - m.created_unix_ms).max(0) / 1000,
                    "usd_per_hour": m.usd_per_hour, "cost_usd": m.cost_usd,
                    "note": m.note, "labels": m.labels,
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(items));
        return;
    }
    if machines.is_empty() {
        out!("no machines (`brain provision local|ssh …` creates one; --all shows released ones)");
        return;
    }
    out!(
        "{:<16} {:<8} {:<10} {:<16} {:<14} {:<10} {:>10} {:>9}  ADDRESS / NOTE",
        "ID",
        "PROVIDER",
        "STATE",
        "WORKER",
        "SPEC",
        "TASK",
        "AGE",
        "COST"
    );
    for m in machines {
        let s = m.spec.unwrap_or_default();
        let spec = if s == proto::MachineSpec::default() {
            "-".to_string()
        } else {
            format!("{}c/{}G/{}G", s.cpu, s.memory_gb, s.disk_gb)
        };
        let end = if m.ended_unix_ms > 0 {
            m.ended_unix_ms
        } else {
            now
        };
        let age = humantime::format_duration(Duration::from_secs(
            ((end - m.created_unix_ms).max(0) / 1000) as u64,
        ))
        .to_string();
        let state = if m.state == "ready" && !m.connected {
            "ready/lost".to_string()
        } else {
            m.state.clone()
        };
        let mut tail = m.address.clone();
        if !m.note.is_empty() {
            tail = format!("{tail} — {}", m.note);
        }
        out!(
            "{:<16} {:<8} {:<10} {:<16} {:<14} {:<10} {:>10} {:>8.4}$  {}",
            m.id,
            m.provider,
            state,
            if m.worker_id.is_empty() {
                "-"
            } else {
                &m.worker_id
            },
            spec,
            if m.task_id.is_empty() {
                "-"
            } else {
                &m.task_id
            },
            age,
            m.cost_usd,
            tail
        );
    }
}

pub fn print_workers(workers: &[proto::WorkerInfo], json: bool) {
    let state_name = |s: i32| match proto::WorkerState::try_from(s) {
        Ok(proto::WorkerState::Connected) => "connected",
        Ok(proto::WorkerState::Lost) => "lost",
        Ok(proto::WorkerState::Revoked) => "revoked",
        Ok(proto::WorkerState::Enrolled) => "enrolled",
        _ => "unknown",
    };
    let now = shared::now_unix_ms();
    let ago = |ms: i64| {
        if ms <= 0 {
            "never".to_string()
        } else {
            let secs = ((now - ms).max(0) / 1000) as u64;
            format!(
                "{} ago",
                humantime::format_duration(Duration::from_secs(secs))
            )
        }
    };
    if json {
        let items: Vec<serde_json::Value> = workers
            .iter()
            .map(|w| {
                let c = w.capabilities.clone().unwrap_or_default();
                serde_json::json!({
                    "id": w.id, "name": w.name, "labels": w.labels,
                    "state": state_name(w.state),
                    "os": c.os, "arch": c.arch, "cpus": c.cpus,
                    "memory_bytes": c.memory_bytes, "disk_free_bytes": c.disk_free_bytes,
                    "version": c.version, "hostname": c.hostname,
                    "last_seen_unix_ms": w.last_seen_unix_ms,
                    "enrolled_unix_ms": w.enrolled_unix_ms,
                    "running_tasks": w.running_tasks,
                    "peak_tasks": w.peak_tasks,
                    "max_tasks": w.max_tasks,
                    "link": w.link,
                    "replica": (!w.replica.is_empty()).then_some(&w.replica),
                    "memory_free_bytes": w.load.map(|l| l.memory_free_bytes),
                    "cpu_busy_permille": w.load.map(|l| l.cpu_busy_permille),
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(items));
        return;
    }
    out!(
        "{:<16} {:<20} {:<10} {:>7} {:<14} {:>4} {:>8}  {:<16} LABELS",
        "ID",
        "NAME",
        "STATE",
        "TASKS",
        "OS/ARCH",
        "CPUS",
        "MEMORY",
        "LAST SEEN"
    );
    for w in workers {
        let c = w.capabilities.clone().unwrap_or_default();
        let mut labels: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        // Running/capacity; `full` when it has no room, the link when it is not steady.
        let tasks = if w.max_tasks == 0 {
            format!("{}", w.running_tasks)
        } else {
            format!("{}/{}", w.running_tasks, w.max_tasks)
        };
        let state = match w.link.as_str() {
            "slow" | "held" => w.link.clone(),
            _ if w.max_tasks > 0 && w.running_tasks >= w.max_tasks => "full".into(),
            _ => state_name(w.state).to_string(),
        };
        out!(
            "{:<16} {:<20} {:<10} {:>7} {:<14} {:>4} {:>7.1}G  {:<16} {}",
            w.id,
            w.name,
            state,
            tasks,
            if c.os.is_empty() {
                "-".to_string()
            } else {
                format!("{}/{}", c.os, c.arch)
            },
            c.cpus,
            c.memory_bytes as f64 / (1u64 << 30) as f64,
            // Connected to another replica sharing the store: which.
            if w.replica.is_empty() {
                ago(w.last_seen_unix_ms)
            } else {
                format!("via {}", w.replica)
            },
            labels.join(",")
        );
    }
}

/// Output of a running call or files that changed (not in the log), for people.
pub fn describe_live(o: &proto::LiveOutput) -> String {
    let mark = match (o.kind.as_str(), o.stream.as_str()) {
        ("fs_change", "removed") => '-',
        ("fs_change", "more") => '…',
        ("fs_change", _) => '~',
        ("live_output", "stderr") => '!',
        _ => '|',
    };
    o.text
        .lines()
        .map(|l| format!("    {mark} {l}\n"))
        .collect()
}

/// One log record in words, for people, a long output cut.
pub fn describe_record(r: &proto::log::Record) -> String {
    describe_cut(r, OUTPUT_LINES, OBSERVED_LINES)
}

/// One log record in words, nothing cut (`brain task log --full`).
pub fn describe_full(r: &proto::log::Record) -> String {
    describe_cut(r, usize::MAX, usize::MAX)
}

/// Lines of what the model was told of a call shown under it.
const OBSERVED_LINES: usize = 12;

fn describe_cut(r: &proto::log::Record, output: usize, observed: usize) -> String {
    let what = describe_lifecycle(&r.event)
        .or_else(|| describe_call(&r.task, &r.event, output))
        .or_else(|| describe_model(r, observed))
        .or_else(|| describe_code(&r.event))
        .or_else(|| describe_workspace(&r.event))
        .or_else(|| describe_delivery(&r.event))
        .or_else(|| describe_attempt(&r.event))
        .unwrap_or_else(|| serde_json::to_string(&r.event).unwrap_or_default());
    format!("{:>5}  {what}", r.seq)
}

/// A task's life: created, its status, its end, its worker, its budget.
fn describe_lifecycle(event: &proto::log::Event) -> Option<String> {
    use proto::log::Event as E;
    Some(match event {
        E::Created { goal, .. } => format!("created: {goal}"),
        E::StatusChanged { status, reason } => format!("{status} {reason}"),
        E::Finished {
            outcome,
            reason,
            verified,
        } => {
            let name = outcome;
            match verified {
                Some(true) => format!("{name} (verified: the acceptance check passed): {reason}"),
                Some(false) => format!("{name} (unverified: no acceptance check): {reason}"),
                None => format!("{name}: {reason}"),
            }
        }
        E::WorkerAssigned { worker } => format!("assigned to worker {worker}"),
        E::Snapshot { upto } => format!("snapshot of the state up to {upto}"),
        E::EgressRefused { host, port, reason } => {
            format!("egress refused: {host}:{port}: {reason}")
        }
        E::BudgetRaised { limits } => format!(
            "budget raised to ${:.4}, {} tokens, {} steps, {} ms wall (0 = no limit)",
            limits.usd, limits.tokens, limits.steps, limits.wall_ms
        ),
        _ => return None,
    })
}

/// Lines of a command's stdout (and of its stderr) shown under it.
const OUTPUT_LINES: usize = 20;

/// A tool call: issued, its output, its end.
fn describe_call(task: &str, event: &proto::log::Event, shown: usize) -> Option<String> {
    use proto::log::Event as E;
    Some(match event {
        E::ToolCallIssued {
            call_id,
            step,
            purpose,
            worker,
            call,
        } => {
            let c = match call {
                proto::log::ToolCall::RunCommand { argv, .. } => match argv.as_slice() {
                    [sh, c, cmd] if sh == "sh" && c == "-c" => cmd.clone(),
                    _ => argv.join(" "),
                },
                proto::log::ToolCall::WriteFile { path, .. } => format!("write {path}"),
                proto::log::ToolCall::ReadFile { path, .. } => format!("read {path}"),
                proto::log::ToolCall::EditFile { path, .. } => format!("edit {path}"),
                proto::log::ToolCall::ListFiles { glob } => format!("list files {glob}"),
                proto::log::ToolCall::Search { pattern, .. } => format!("search {pattern:?}"),
            };
            format!("issued   #{call_id} step {step} ({purpose}) on {worker}: {c}")
        }
        E::ToolOutput {
            call_id,
            stdout,
            stderr,
        } => {
            let mut s = format!("output   #{call_id}");
            for (text, mark, what) in [(stdout, '|', "stdout"), (stderr, '!', "stderr")] {
                let lines: Vec<&str> = text.lines().collect();
                for l in lines.iter().take(shown) {
                    s.push_str(&format!("\n    {mark} {l}"));
                }
                // A cut says so, and where the rest is.
                if lines.len() > shown {
                    s.push_str(&format!(
                        "\n    {mark} … {} more lines of {what} (all of it: brain task log --full {task})",
                        lines.len() - shown
                    ));
                }
            }
            s
        }
        E::ToolCallCompleted { call_id, result } => {
            let result = crate::model::ToolResult {
                exit_code: result.exit_code,
                signal: result.signal,
                timed_out: result.timed_out,
                error: result.error.clone(),
                limit: result.limit.clone(),
            };
            format!(
                "done     #{call_id}: {}",
                crate::model::state::describe(&result)
            )
        }
        E::ToolCallInterrupted { call_id, reason } => format!("interrupted #{call_id}: {reason}"),
        _ => return None,
    })
}

/// The model's turns and what a person decides for it.
fn describe_model(r: &proto::log::Record, shown: usize) -> Option<String> {
    use proto::log::Event as E;
    Some(match &r.event {
        E::LlmRequest {
            model, messages, ..
        } => format!("thinking ({model}, {messages} messages)"),
        E::LlmResponse {
            prompt_tokens,
            completion_tokens,
            cost_usd,
            response,
            ..
        } => {
            let mut s =
                format!("model    {prompt_tokens}+{completion_tokens} tokens, ${cost_usd:.4}");
            if let Some(r) = response {
                for l in r
                    .message
                    .content
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .take(10)
                {
                    s.push_str(&format!("\n    > {l}"));
                }
                for c in &r.message.tool_calls {
                    let args: String = c.arguments.chars().take(200).collect();
                    s.push_str(&format!("\n    → {} {args}", c.name));
                }
            }
            s
        }
        E::Observation { text, failed, .. } => {
            let mut s = format!("observed{}", if *failed { " (failed)" } else { "" });
            // The brain's notes (the repeat guard's, the loop detector's) end the text: they
            // are shown whole where the output before them is cut.
            let (output, notes) = match text.split_once(crate::model::stuck::NOTE_MARK) {
                Some((output, notes)) => (output, Some(notes)),
                None => (text.as_str(), None),
            };
            let lines: Vec<&str> = output.lines().collect();
            for l in lines.iter().take(shown) {
                s.push_str(&format!("\n    < {l}"));
            }
            if lines.len() > shown {
                s.push_str(&format!("\n    < … {} more lines", lines.len() - shown));
            }
            if let Some(notes) = notes {
                let notes = format!("Note: {notes}");
                for l in notes.lines().filter(|l| !l.trim().is_empty()) {
                    s.push_str(&format!("\n    < {l}"));
                }
            }
            s
        }
        E::ApprovalRequested {
            approval_id, what, ..
        } => {
            format!(
                "APPROVAL #{approval_id} needed: {what}\n    → brain approve {t}   or   brain deny {t} --reason TEXT",
                t = r.task
            )
        }
        E::ApprovalDecided {
            approval_id,
            approved,
            by,
            reason,
            always,
        } => format!(
            "approval #{approval_id} {} by {by}{}{}",
            if *approved { "granted" } else { "denied" },
            if *always {
                " (and from now on in this task)"
            } else {
                ""
            },
            if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            }
        ),
        E::ContextElided { upto, bytes_saved } => {
            format!(
                "elided old tool outputs in the first {upto} messages ({bytes_saved} bytes) to fit the context window"
            )
        }
        _ => return None,
    })
}

/// What the brain shows the model of the code, and what it undoes or restores.
fn describe_code(event: &proto::log::Event) -> Option<String> {
    use proto::log::Event as E;
    Some(match event {
        E::Surveyed {
            files,
            truncated,
            readme_path,
            agents_md_path,
            ..
        } => {
            const SHOWN: usize = 8;
            if files.is_empty() {
                return Some("surveyed the workspace: it is empty".into());
            }
            let mut s = format!(
                "surveyed {}{} file(s): {}",
                files.len(),
                if *truncated { "+" } else { "" },
                files
                    .iter()
                    .take(SHOWN)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if files.len() > SHOWN {
                s.push_str(", …");
            }
            if !readme_path.is_empty() {
                s.push_str(&format!("; read {readme_path}"));
            }
            if !agents_md_path.is_empty() {
                s.push_str(&format!(
                    "; the repository's instructions for agents: {agents_md_path}"
                ));
            }
            s
        }
        E::InstructionsInView { path, .. } => {
            format!("the repository's instructions for agents shown to the model: {path}")
        }
        E::CodeInView { text } => format!(
            "code in view for the model: {}",
            crate::model::prompt::code_view::headers(text).join(", ")
        ),
        E::CheckAfterChanges { passed, text } => format!(
            "check after the model's changes: {}{}",
            if *passed { "passes" } else { "fails" },
            match crate::model::prompt::code_view::headers(text) {
                h if h.is_empty() => String::new(),
                h => format!("; code in view: {}", h.join(", ")),
            }
        ),
        E::ChangesUndone {
            restored,
            left,
            to_start,
            ..
        } => format!(
            "changes undone ({}): {}{}",
            if *to_start {
                "the model made no progress on them: back to the start"
            } else {
                "the check failed on them after it had passed"
            },
            if restored.is_empty() {
                "no file needed putting back".to_string()
            } else {
                format!("{} back as they were", restored.join(", "))
            },
            if left.is_empty() {
                String::new()
            } else {
                format!("; made since, still there: {}", left.join(", "))
            }
        ),
        E::FinishedForModel { why } => {
            format!("the brain calls finish for the model, which {why}, on the version that passed")
        }
        E::ProtectedRestored { paths, .. } => format!(
            "restored the check's files before the check: {}",
            paths.join(", ")
        ),
        _ => return None,
    })
}

/// The workspace: seeded, synced at a barrier, moved, its rules.
fn describe_workspace(event: &proto::log::Event) -> Option<String> {
    use proto::log::Event as E;
    Some(match event {
        E::Barrier {
            version,
            root_hash,
            files,
            bytes,
            wire_bytes,
            tmp_bytes,
            tmp_files,
        } => format!(
            "barrier  v{version}: {files} files, {bytes} bytes, root {}…; {wire_bytes} bytes sent{}",
            &root_hash[..root_hash.len().min(12)],
            if tmp_files > &0 {
                format!("; temp dir {tmp_files} entries, {tmp_bytes} bytes")
            } else {
                String::new()
            }
        ),
        E::MoveStarted { from, to } => format!("MOVE     from {from} to {to}"),
        E::WorkspaceSeeded {
            source,
            files,
            bytes,
            commit,
            ..
        } if !commit.is_empty() => format!(
            "workspace from {source} at {}: {files} files, {bytes} bytes",
            &commit[..commit.len().min(12)]
        ),
        E::WorkspaceSeeded {
            source,
            files,
            bytes,
            ..
        } => format!("workspace from {source}: {files} files, {bytes} bytes"),
        E::MoveCompleted {
            to,
            files,
            wire_bytes,
        } => format!("moved    now on {to} ({files} files written there, {wire_bytes} bytes sent)"),
        E::MoveAborted { to, reason } => format!("move to {to} aborted: {reason}"),
        E::LeftOut {
            worker,
            entries,
            more,
        } => {
            let mut s = format!("left out of the mirror on {worker} (not synced, not moved):");
            for e in entries {
                s.push_str(&format!("\n    ! {}: {}", e.path, e.reason));
            }
            if *more > 0 {
                s.push_str(&format!("\n    ! … and {more} more"));
            }
            s
        }
        E::WorkspaceRules { rules } => {
            let mut parts = vec![if rules.include_git {
                ".git/ included".to_string()
            } else {
                ".git/ left out".to_string()
            }];
            if rules.no_default_excludes {
                parts.push("default excludes off".into());
            }
            if !rules.extra_excludes.is_empty() {
                parts.push(format!(
                    "also left out: {}",
                    rules.extra_excludes.join(", ")
                ));
            }
            format!("workspace rules: {}", parts.join("; "))
        }
        _ => return None,
    })
}

/// A delivery as git commits: planned, pushed, opened as a pull request, done.
fn describe_delivery(event: &proto::log::Event) -> Option<String> {
    use proto::log::Event as E;
    Some(match event {
        E::DeliveryPlanned { mode } => format!("to be delivered as a {mode} when it finishes"),
        E::DeliveryStarted {
            branch,
            commit,
            wip,
            ..
        } => format!(
            "delivering {} as {branch}{}",
            &commit[..commit.len().min(12)],
            if *wip { " (work in progress)" } else { "" }
        ),
        E::DeliveryPushed { branch, commit } => {
            format!("pushed   {branch} at {}", &commit[..commit.len().min(12)])
        }
        E::PullRequestOpened { url, number } => format!("pull request #{number}: {url}"),
        E::Delivered { branch } => format!("delivered as {branch}"),
        E::DeliveryFailed { reason } => format!("delivery failed: {reason}"),
        _ => return None,
    })
}

/// A task run as attempts: each started and ended, the winner picked.
fn describe_attempt(event: &proto::log::Event) -> Option<String> {
    use proto::log::Event as E;
    Some(match event {
        E::AttemptStarted {
            index,
            attempt,
            model,
            escalation,
        } => format!(
            "attempt {} started: {attempt} on {model}{}",
            index + 1,
            if *escalation {
                " (the attempts before it all failed)"
            } else {
                ""
            }
        ),
        E::AttemptEnded { index, end } => format!(
            "attempt {} ended {}{}: {} files, {} lines changed, {} steps, {} tokens{}",
            index + 1,
            end.status,
            if end.verified { ", verified" } else { "" },
            end.files_changed,
            end.lines_changed,
            end.steps,
            end.tokens,
            if end.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", end.reason)
            }
        ),
        E::AttemptPicked {
            index,
            attempt,
            why,
            ..
        } => format!("attempt {} ({attempt}) won: {why}", index + 1),
        _ => return None,
    })
}

/// The logged record an item of a followed log carries, if it carries one this program
/// can read.
pub fn logged(r: &proto::TaskRecord) -> Option<proto::log::Record> {
    match &r.item {
        Some(proto::task_record::Item::Record(json)) => serde_json::from_str(json).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_output_is_cut_saying_how_much_is_left_and_where() {
        let out: Vec<String> = (1..=25).map(|i| format!("out {i}")).collect();
        let r = proto::log::Record {
            v: 1,
            task: "t-3".into(),
            seq: 9,
            at_ms: 0,
            event: proto::log::Event::ToolOutput {
                call_id: 14,
                stdout: out.join("\n"),
                stderr: "one error".into(),
            },
        };
        let shown = describe_record(&r);
        assert!(
            shown.contains("| out 20\n") && !shown.contains("out 21"),
            "{shown}"
        );
        assert!(
            shown.contains("… 5 more lines of stdout (all of it: brain task log --full t-3)"),
            "{shown}"
        );
        assert!(shown.ends_with("! one error"), "{shown}");
    }

    #[test]
    fn a_long_observation_is_cut_but_its_notes_are_shown_whole() {
        let output: Vec<String> = (1..=30).map(|i| format!("line {i}")).collect();
        let text = format!(
            "{}{}you ran this failing command on unchanged files.",
            output.join("\n"),
            crate::model::stuck::NOTE_MARK
        );
        let r = proto::log::Record {
            v: 1,
            task: "t-1".into(),
            seq: 7,
            at_ms: 0,
            event: proto::log::Event::Observation {
                tool_use_id: "u1".into(),
                text,
                failed: true,
            },
        };
        let shown = describe_record(&r);
        assert!(
            shown.contains("< line 12\n") && !shown.contains("line 13"),
            "{shown}"
        );
        assert!(shown.contains("… 18 more lines"), "{shown}");
        assert!(
            shown.ends_with("< Note: you ran this failing command on unchanged files."),
            "{shown}"
        );
    }
}
