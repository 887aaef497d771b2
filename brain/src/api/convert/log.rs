//! The log's records as the wire has them ([`proto::log`]): the one place that knows both, so
//! a change to the engine's records is a change here, not to the protocol.

use proto::log as wire;
use serde::Serialize;

use crate::model::agent::{AgentSpec, Budget};
use crate::model::attempt::{AttemptEnd, AttemptOf, AttemptsSpec, Sampling};
use crate::model::check::{Check, CheckRun};
use crate::model::egress::{AllowRule, Binding, EgressSpec};
use crate::model::event::{Plan, Step, SyncRules, WriteStep};
use crate::model::{Event, Record, ToolCall, ToolResult};

/// A record's JSON as the wire has it.
pub fn json(r: &Record) -> String {
    serde_json::to_string(&record(r)).expect("wire records serialise")
}

/// A record as the wire has it.
pub fn record(r: &Record) -> wire::Record {
    wire::Record {
        v: wire::WIRE_VERSION,
        task: r.task.to_string(),
        seq: r.seq,
        at_ms: r.at_ms,
        event: event(&r.event),
    }
}

/// The name a closed set's member is stored under (its serde name).
fn name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

#[expect(
    clippy::too_many_lines,
    reason = "one arm per kind of record, each a field-by-field copy; split, the compiler would no longer check that every kind is converted"
)]
fn event(e: &Event) -> wire::Event {
    use wire::Event as W;
    match e.clone() {
        Event::Created {
            goal,
            workspace,
            plan,
            agent,
            egress,
            attempts,
            attempt_of,
        } => W::Created {
            goal,
            workspace,
            plan: plan.as_ref().map(self::plan),
            agent: agent.map(|a| Box::new(agent_spec(&a))),
            egress: egress.as_ref().map(egress_spec),
            attempts: attempts.as_ref().map(attempts_spec),
            attempt_of: attempt_of.as_ref().map(self::attempt_of),
        },
        Event::StatusChanged { status, reason } => W::StatusChanged {
            status: status.as_str().into(),
            reason,
        },
        Event::LlmRequest {
            model,
            messages,
            rendered,
        } => W::LlmRequest {
            model,
            messages,
            rendered: rendered.map(|r| proto::log::Rendered {
                version: r.version,
                hash: r.hash,
                tools: r.tools.as_str().into(),
                can_move: r.can_move,
            }),
        },
        Event::LlmResponse {
            model,
            prompt_tokens,
            completion_tokens,
            cost_usd,
            response,
        } => W::LlmResponse {
            model,
            prompt_tokens,
            completion_tokens,
            cost_usd,
            response: response.map(|r| Box::new(self::response(&r))),
        },
        Event::Observation {
            tool_use_id,
            text,
            failed,
        } => W::Observation {
            tool_use_id,
            text,
            failed,
        },
        Event::ContextElided { upto, bytes_saved } => W::ContextElided { upto, bytes_saved },
        Event::BudgetRaised { limits } => W::BudgetRaised {
            limits: budget(&limits),
        },
        Event::ToolCallIssued {
            call_id,
            step,
            purpose,
            worker,
            call,
        } => W::ToolCallIssued {
            call_id,
            step,
            purpose: name(&purpose),
            worker,
            call: tool_call(call),
        },
        Event::ToolOutput {
            call_id,
            stdout,
            stderr,
        } => W::ToolOutput {
            call_id,
            stdout,
            stderr,
        },
        Event::ToolCallCompleted { call_id, result } => W::ToolCallCompleted {
            call_id,
            result: tool_result(result),
        },
        Event::ToolCallInterrupted { call_id, reason } => {
            W::ToolCallInterrupted { call_id, reason }
        }
        Event::Barrier {
            version,
            root_hash,
            files,
            bytes,
            wire_bytes,
            tmp_bytes,
            tmp_files,
        } => W::Barrier {
            version,
            root_hash,
            files,
            bytes,
            wire_bytes,
            tmp_bytes,
            tmp_files,
        },
        Event::LeftOut {
            worker,
            entries,
            more,
        } => W::LeftOut {
            worker,
            entries: entries
                .into_iter()
                .map(|e| wire::LeftOut {
                    path: e.path,
                    reason: e.reason,
                })
                .collect(),
            more,
        },
        Event::EgressRefused { host, port, reason } => W::EgressRefused { host, port, reason },
        Event::AttemptStarted {
            index,
            attempt,
            model,
            escalation,
        } => W::AttemptStarted {
            index,
            attempt: attempt.to_string(),
            model,
            escalation,
        },
        Event::AttemptEnded { index, end } => W::AttemptEnded {
            index,
            end: attempt_end(end),
        },
        Event::AttemptPicked {
            index,
            attempt,
            why,
            root_hash,
            check,
        } => W::AttemptPicked {
            index,
            attempt: attempt.to_string(),
            why,
            root_hash,
            check: check_run(check),
        },
        Event::Placement { require_labels } => W::Placement { require_labels },
        Event::WorkspaceRules { rules } => W::WorkspaceRules {
            rules: sync_rules(rules),
        },
        Event::WorkspaceSeeded {
            root_hash,
            source,
            files,
            bytes,
            commit,
            branch,
        } => W::WorkspaceSeeded {
            root_hash,
            source,
            files,
            bytes,
            commit,
            branch,
        },
        Event::DeliveryPlanned { mode } => W::DeliveryPlanned { mode: name(&mode) },
        Event::DeliveryStarted {
            mode,
            wip,
            branch,
            root,
            commit,
            date_s,
        } => W::DeliveryStarted {
            mode: name(&mode),
            wip,
            branch,
            root,
            commit,
            date_s,
        },
        Event::DeliveryPushed { branch, commit } => W::DeliveryPushed { branch, commit },
        Event::PullRequestOpened { url, number } => W::PullRequestOpened { url, number },
        Event::Delivered { branch } => W::Delivered { branch },
        Event::DeliveryFailed { reason } => W::DeliveryFailed { reason },
        Event::MoveAborted { to, reason } => W::MoveAborted { to, reason },
        Event::WorkerAssigned { worker } => W::WorkerAssigned { worker },
        Event::MoveStarted { from, to } => W::MoveStarted { from, to },
        Event::MoveCompleted {
            to,
            files,
            wire_bytes,
        } => W::MoveCompleted {
            to,
            files,
            wire_bytes,
        },
        Event::ApprovalRequested {
            approval_id,
            what,
            tool_use_id,
        } => W::ApprovalRequested {
            approval_id,
            what,
            tool_use_id,
        },
        Event::ApprovalDecided {
            approval_id,
            approved,
            by,
            reason,
            always,
        } => W::ApprovalDecided {
            approval_id,
            approved,
            by,
            reason,
            always,
        },
        Event::BudgetUpdate {
            spent_usd,
            tokens,
            steps,
        } => W::BudgetUpdate {
            spent_usd,
            tokens,
            steps,
        },
        Event::Surveyed {
            files,
            truncated,
            readme_path,
            readme,
            agents_md_path,
            agents_md,
        } => W::Surveyed {
            files,
            truncated,
            readme_path,
            readme,
            agents_md_path,
            agents_md,
        },
        Event::CodeInView { text } => W::CodeInView { text },
        Event::InstructionsInView { path, text } => W::InstructionsInView { path, text },
        Event::CheckAfterChanges { passed, text } => W::CheckAfterChanges { passed, text },
        Event::ChangesUndone {
            root,
            to_start,
            restored,
            left,
            shown,
        } => W::ChangesUndone {
            root,
            to_start,
            restored,
            left,
            shown,
        },
        Event::FinishedForModel { why } => W::FinishedForModel { why },
        Event::ProtectedRestored { tool_use_id, paths } => {
            W::ProtectedRestored { tool_use_id, paths }
        }
        Event::Snapshot { upto } => W::Snapshot { upto },
        Event::Finished {
            outcome,
            reason,
            verified,
        } => W::Finished {
            outcome: name(&outcome),
            reason,
            verified,
        },
    }
}

fn plan(p: &Plan) -> wire::Plan {
    wire::Plan {
        steps: p.steps.iter().map(step).collect(),
    }
}

fn step(s: &Step) -> wire::Step {
    wire::Step {
        run: s.run.clone(),
        write: s.write.as_ref().map(|w: &WriteStep| wire::WriteStep {
            path: w.path.clone(),
            content: w.content.clone(),
            mode: w.mode,
        }),
        check: s.check.clone(),
        timeout: s.timeout.clone(),
    }
}

fn sync_rules(r: SyncRules) -> wire::SyncRules {
    wire::SyncRules {
        include_git: r.include_git,
        extra_excludes: r.extra_excludes,
        no_default_excludes: r.no_default_excludes,
    }
}

fn tool_call(c: ToolCall) -> wire::ToolCall {
    use wire::ToolCall as W;
    match c {
        ToolCall::RunCommand {
            argv,
            timeout_ms,
            cwd,
        } => W::RunCommand {
            argv,
            timeout_ms,
            cwd,
        },
        ToolCall::WriteFile {
            path,
            content,
            mode,
        } => W::WriteFile {
            path,
            content,
            mode,
        },
        ToolCall::ReadFile {
            path,
            start_line,
            end_line,
        } => W::ReadFile {
            path,
            start_line,
            end_line,
        },
        ToolCall::EditFile { path, old, new } => W::EditFile { path, old, new },
        ToolCall::ListFiles { glob } => W::ListFiles { glob },
        ToolCall::Search { pattern, glob } => W::Search { pattern, glob },
    }
}

fn tool_result(r: ToolResult) -> wire::ToolResult {
    wire::ToolResult {
        exit_code: r.exit_code,
        signal: r.signal,
        timed_out: r.timed_out,
        error: r.error,
        limit: r.limit,
    }
}

fn budget(b: &Budget) -> wire::Budget {
    wire::Budget {
        usd: b.usd,
        tokens: b.tokens,
        steps: b.steps,
        wall_ms: b.wall_ms,
    }
}

fn check(c: &Check) -> wire::Check {
    wire::Check {
        command: c.command.clone(),
        timeout_ms: c.timeout_ms,
        source: name(&c.source),
        protect: c.protect.clone(),
    }
}

fn check_run(c: CheckRun) -> wire::CheckRun {
    wire::CheckRun {
        call_id: c.call_id,
        passed: c.passed,
        result: c.result,
        output: c.output,
        exit_code: c.exit_code,
    }
}

fn binding(b: &Binding) -> wire::Binding {
    wire::Binding {
        name: b.name.clone(),
        env: b.env.clone(),
        hosts: b.hosts.iter().map(name).collect(),
        port: b.port,
    }
}

fn allow_rule(a: &AllowRule) -> wire::AllowRule {
    wire::AllowRule {
        host: name(&a.host),
        ports: a.ports.clone(),
        methods: a.methods.clone(),
        pass_through: a.pass_through,
    }
}

fn egress_spec(e: &EgressSpec) -> wire::EgressSpec {
    wire::EgressSpec {
        secrets: e.secrets.iter().map(binding).collect(),
        allow: e.allow.iter().map(allow_rule).collect(),
    }
}

fn sampling(s: &Sampling) -> wire::Sampling {
    wire::Sampling {
        seed: s.seed,
        temperature: s.temperature,
        together: s.together,
    }
}

fn agent_spec(a: &AgentSpec) -> wire::AgentSpec {
    wire::AgentSpec {
        model: a.model.clone(),
        permission: name(&a.permission),
        budget: budget(&a.budget),
        allow_commands: a.allow_commands.clone(),
        allow_paths: a.allow_paths.clone(),
        repeat_limit: a.repeat_limit,
        transcript: a.transcript.clone(),
        check: a.check.as_ref().map(check),
        egress: a.egress.as_ref().map(egress_spec),
        sampling: a.sampling.as_ref().map(sampling),
        no_agents_md: a.no_agents_md,
        assists: a.assists.as_ref().map(|x| x.names()),
    }
}

fn attempts_spec(a: &AttemptsSpec) -> wire::AttemptsSpec {
    wire::AttemptsSpec {
        count: a.count,
        pick: name(&a.pick),
        temperature: a.temperature,
        models: a.models.clone(),
        escalate: a.escalate.clone(),
        worker: a.worker.clone(),
    }
}

fn attempt_of(a: &AttemptOf) -> wire::AttemptOf {
    wire::AttemptOf {
        parent: a.parent.to_string(),
        index: a.index,
    }
}

fn attempt_end(e: AttemptEnd) -> wire::AttemptEnd {
    wire::AttemptEnd {
        status: e.status.as_str().into(),
        verified: e.verified,
        reason: e.reason,
        root: e.root,
        check: e.check,
        check_output: e.check_output,
        files_changed: e.files_changed,
        lines_changed: e.lines_changed,
        steps: e.steps,
        tokens: e.tokens,
        usd: e.usd,
    }
}

/// The model's answer, as the wire has it.
pub fn response(r: &crate::llm::Response) -> wire::Response {
    let m = &r.message;
    wire::Response {
        message: wire::Message {
            role: name(&m.role),
            content: m.content.clone(),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| wire::ToolUse {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
            tool_call_id: m.tool_call_id.clone(),
        },
        usage: wire::Usage {
            prompt_tokens: r.usage.prompt_tokens,
            completion_tokens: r.usage.completion_tokens,
        },
        malformed_calls: r.malformed_calls.clone(),
        skipped_calls: r.skipped_calls.clone(),
        nudge: r.nudge.clone(),
        code_blocks: r
            .code_blocks
            .iter()
            .map(|b| wire::CodeBlock {
                path: b.path.clone(),
                lang: b.lang.clone(),
                body: b.body.clone(),
            })
            .collect(),
    }
}

/// A wire answer back into the model's (what `brain run --record` writes as a transcript).
pub fn response_from_wire(r: &wire::Response) -> crate::llm::Response {
    use crate::llm::{CodeBlock, Message, Response, Role, ToolUse, Usage};
    let m = &r.message;
    Response {
        message: Message {
            role: match m.role.as_str() {
                "user" => Role::User,
                "tool" => Role::Tool,
                _ => Role::Assistant,
            },
            content: m.content.clone(),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| ToolUse {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
            tool_call_id: m.tool_call_id.clone(),
        },
        usage: Usage {
            prompt_tokens: r.usage.prompt_tokens,
            completion_tokens: r.usage.completion_tokens,
        },
        malformed_calls: r.malformed_calls.clone(),
        skipped_calls: r.skipped_calls.clone(),
        nudge: r.nudge.clone(),
        code_blocks: r
            .code_blocks
            .iter()
            .map(|b| CodeBlock {
                path: b.path.clone(),
                lang: b.lang.clone(),
                body: b.body.clone(),
            })
            .collect(),
        no_call: false,
        calls_not_run: None,
        unreadable: vec![],
    }
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
