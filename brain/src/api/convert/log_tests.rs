//! The wire's records against the log's: every kind, every field, ids to the digit.

use super::{json, record};
use crate::model::event::{Event, RECORD_VERSION, Record, TaskId, ToolCall};
use crate::model::state::Status;

fn rec(seq: u64, event: Event) -> Record {
    Record {
        v: RECORD_VERSION,
        task: TaskId(7),
        seq,
        at_ms: 1_000,
        event,
    }
}

#[test]
fn wide_ids_are_strings_and_the_names_are_the_logs() {
    let id = 117_722_876_144_320_515;
    let issued = rec(
        3,
        Event::ToolCallIssued {
            call_id: id,
            step: 1,
            purpose: crate::model::event::Purpose::Acceptance,
            worker: "w-1".into(),
            call: ToolCall::RunCommand {
                argv: vec!["make".into()],
                timeout_ms: 600_000,
                cwd: String::new(),
            },
        },
    );
    let j: serde_json::Value = serde_json::from_str(&json(&issued)).unwrap();
    assert_eq!(j["call_id"], "117722876144320515");
    assert_eq!(j["seq"], "3");
    assert_eq!(j["at_ms"], "1000");
    assert_eq!(j["task"], "t-7");
    assert_eq!(j["kind"], "tool_call_issued");
    assert_eq!(j["purpose"], "acceptance");
    assert_eq!(j["call"]["tool"], "run_command");
    assert_eq!(j["call"]["timeout_ms"], "600000");
    // What a client reads back is what was sent, to the last digit.
    let back: proto::log::Record = serde_json::from_value(j).unwrap();
    assert_eq!(back, record(&issued));

    let status = rec(
        4,
        Event::StatusChanged {
            status: Status::BudgetExhausted,
            reason: "r".into(),
        },
    );
    let j: serde_json::Value = serde_json::from_str(&json(&status)).unwrap();
    assert_eq!(j["status"], "budget_exhausted");
}

/// One of every kind of record, with every optional part filled in.
#[expect(
    clippy::too_many_lines,
    reason = "one of every kind of record: its length is the kinds'"
)]
fn one_of_each() -> Vec<Event> {
    use crate::llm::{CodeBlock, Message, Response, Role, ToolUse, Usage};
    use crate::model::Outcome;
    use crate::model::agent::{AgentSpec, Budget, Permission};
    use crate::model::attempt::{AttemptEnd, AttemptOf, AttemptsSpec, Pick, Sampling};
    use crate::model::check::{Check, CheckRun, CheckSource};
    use crate::model::delivery::Mode;
    use crate::model::egress::{AllowRule, Binding, EgressSpec, HostPattern};
    use crate::model::event::{Plan, Purpose, Step, SyncRules, ToolResult, WriteStep};
    let big = 117_722_876_144_320_515u64;
    let budget = Budget {
        usd: 1.5,
        tokens: big,
        steps: 30,
        wall_ms: 600_000,
    };
    let egress = EgressSpec {
        secrets: vec![Binding {
            name: "GH".into(),
            env: "GH_TOKEN".into(),
            hosts: vec![HostPattern::parse_with("api.github.com", false).unwrap()],
            port: 443,
        }],
        allow: vec![AllowRule {
            host: HostPattern::parse_with("*.pypi.org", true).unwrap(),
            ports: vec![443],
            methods: vec!["GET".into()],
            pass_through: true,
        }],
    };
    let agent = AgentSpec {
        model: "openai:m".into(),
        permission: Permission::Auto,
        budget,
        allow_commands: vec!["cargo *".into()],
        allow_paths: vec!["src/**".into()],
        repeat_limit: 3,
        transcript: "{}".into(),
        check: Some(Check {
            command: "make test".into(),
            timeout_ms: 60_000,
            source: CheckSource::Request,
            protect: vec!["tests/*".into()],
        }),
        egress: Some(egress.clone()),
        sampling: Some(Sampling {
            seed: 42,
            temperature: Some(0.5),
            together: 3,
        }),
        no_agents_md: true,
        assists: Some(crate::model::assists::Assists::native()),
    };
    let response = Response {
        message: Message {
            role: Role::Assistant,
            content: "on it".into(),
            tool_calls: vec![ToolUse {
                id: "c1".into(),
                name: "run_command".into(),
                arguments: "{}".into(),
            }],
            tool_call_id: String::new(),
        },
        usage: Usage {
            prompt_tokens: 10,
            completion_tokens: 2,
        },
        malformed_calls: vec!["bad".into()],
        skipped_calls: vec!["later".into()],
        nudge: "call a tool".into(),
        code_blocks: vec![CodeBlock {
            path: Some("a.py".into()),
            lang: "python".into(),
            body: "x = 1".into(),
        }],
        no_call: false,
        calls_not_run: None,
        unreadable: vec![],
    };
    let s = String::from;
    vec![
        Event::Created {
            goal: s("fix it"),
            workspace: s("task-7"),
            plan: Some(Plan {
                steps: vec![
                    Step {
                        run: Some(vec![s("true")]),
                        write: None,
                        check: Some(vec![s("test"), s("-e"), s("x")]),
                        timeout: Some(s("30s")),
                    },
                    Step {
                        run: None,
                        write: Some(WriteStep {
                            path: s("a"),
                            content: s("b"),
                            mode: Some(0o755),
                        }),
                        check: None,
                        timeout: None,
                    },
                ],
            }),
            agent: Some(Box::new(agent)),
            egress: Some(egress),
            attempts: Some(AttemptsSpec {
                count: 4,
                pick: Pick::Smallest,
                temperature: Some(0.75),
                models: vec![s("openai:other")],
                escalate: vec![s("anthropic:big")],
                worker: s("w-1"),
            }),
            attempt_of: Some(AttemptOf {
                parent: TaskId(3),
                index: 2,
            }),
        },
        Event::StatusChanged {
            status: Status::Waiting,
            reason: s("for approval"),
        },
        Event::LlmRequest {
            model: s("m"),
            messages: 3,
            rendered: None,
        },
        Event::LlmRequest {
            model: s("m"),
            messages: 4,
            rendered: Some(crate::model::event::Rendered {
                version: 1,
                hash: s("ab12"),
                tools: crate::llm::ToolsSent::Text,
                can_move: true,
            }),
        },
        Event::LlmResponse {
            model: s("m"),
            prompt_tokens: big,
            completion_tokens: 5,
            cost_usd: 0.25,
            response: Some(Box::new(response)),
        },
        Event::Observation {
            tool_use_id: s("c1"),
            text: s("ok"),
            failed: true,
        },
        Event::ContextElided {
            upto: 4,
            bytes_saved: 9_000,
        },
        Event::BudgetRaised { limits: budget },
        Event::ToolCallIssued {
            call_id: big,
            step: 2,
            purpose: Purpose::Check,
            worker: s("w-1"),
            call: ToolCall::RunCommand {
                argv: vec![s("ls")],
                timeout_ms: 5,
                cwd: s("src"),
            },
        },
        Event::ToolCallIssued {
            call_id: big + 1,
            step: 3,
            purpose: Purpose::Step,
            worker: s("w-1"),
            call: ToolCall::WriteFile {
                path: s("a"),
                content: s("b"),
                mode: 0o644,
            },
        },
        Event::ToolCallIssued {
            call_id: big + 2,
            step: 4,
            purpose: Purpose::Step,
            worker: s("w-1"),
            call: ToolCall::ReadFile {
                path: s("a"),
                start_line: 1,
                end_line: 9,
            },
        },
        Event::ToolCallIssued {
            call_id: big + 3,
            step: 5,
            purpose: Purpose::Step,
            worker: s("w-1"),
            call: ToolCall::EditFile {
                path: s("a"),
                old: s("x"),
                new: s("y"),
            },
        },
        Event::ToolCallIssued {
            call_id: big + 4,
            step: 6,
            purpose: Purpose::Step,
            worker: s("w-1"),
            call: ToolCall::ListFiles { glob: s("**/*.rs") },
        },
        Event::ToolCallIssued {
            call_id: big + 5,
            step: 7,
            purpose: Purpose::Step,
            worker: s("w-1"),
            call: ToolCall::Search {
                pattern: s("fn main"),
                glob: s("*.rs"),
            },
        },
        Event::ToolOutput {
            call_id: big,
            stdout: s("out"),
            stderr: s("err"),
        },
        Event::ToolCallCompleted {
            call_id: big,
            result: ToolResult {
                exit_code: Some(1),
                signal: Some(9),
                timed_out: true,
                error: s("e"),
                limit: s("memory"),
            },
        },
        Event::ToolCallInterrupted {
            call_id: big,
            reason: s("lost"),
        },
        Event::Barrier {
            version: 3,
            root_hash: s("abc"),
            files: 1,
            bytes: 2,
            wire_bytes: 3,
            tmp_bytes: 4,
            tmp_files: 5,
        },
        Event::LeftOut {
            worker: s("w-1"),
            entries: vec![shared::manifest::LeftOut {
                path: s("fifo"),
                reason: s("a FIFO"),
            }],
            more: 2,
        },
        Event::EgressRefused {
            host: s("evil.example"),
            port: 443,
            reason: s("off the list"),
        },
        Event::AttemptStarted {
            index: 1,
            attempt: TaskId(9),
            model: s("m"),
            escalation: true,
        },
        Event::AttemptEnded {
            index: 1,
            end: AttemptEnd {
                status: Status::Finished,
                verified: true,
                reason: s("done"),
                root: s("r"),
                check: s("exit code 0"),
                check_output: s("ok"),
                files_changed: 1,
                lines_changed: 2,
                steps: 3,
                tokens: big,
                usd: 0.5,
            },
        },
        Event::AttemptPicked {
            index: 1,
            attempt: TaskId(9),
            why: s("first"),
            root_hash: s("r"),
            check: CheckRun {
                call_id: big,
                passed: true,
                result: s("exit code 0"),
                output: s("ok"),
                exit_code: Some(0),
            },
        },
        Event::Placement {
            require_labels: [(s("gpu"), s("yes"))].into_iter().collect(),
        },
        Event::WorkspaceRules {
            rules: SyncRules {
                include_git: true,
                extra_excludes: vec![s("target")],
                no_default_excludes: true,
            },
        },
        Event::WorkspaceSeeded {
            root_hash: s("r"),
            source: s("https://example.com/r.git"),
            files: 10,
            bytes: 20,
            commit: s("c0ffee"),
            branch: s("main"),
        },
        Event::DeliveryPlanned { mode: Mode::Pr },
        Event::DeliveryStarted {
            mode: Mode::Branch,
            wip: true,
            branch: s("tether/t-7"),
            root: s("r"),
            commit: s("c"),
            date_s: 1_700_000_000,
        },
        Event::DeliveryPushed {
            branch: s("b"),
            commit: s("c"),
        },
        Event::PullRequestOpened {
            url: s("https://example.com/pr/1"),
            number: 1,
        },
        Event::Delivered { branch: s("b") },
        Event::DeliveryFailed { reason: s("r") },
        Event::MoveAborted {
            to: s("w-2"),
            reason: s("r"),
        },
        Event::WorkerAssigned { worker: s("w-1") },
        Event::MoveStarted {
            from: s("w-1"),
            to: s("w-2"),
        },
        Event::MoveCompleted {
            to: s("w-2"),
            files: 2,
            wire_bytes: 3,
        },
        Event::ApprovalRequested {
            approval_id: big,
            what: s("rm -rf"),
            tool_use_id: s("c1"),
        },
        Event::ApprovalDecided {
            approval_id: big,
            approved: false,
            by: s("ann"),
            reason: s("no"),
            always: false,
        },
        Event::BudgetUpdate {
            spent_usd: 0.1,
            tokens: big,
            steps: 4,
        },
        Event::Surveyed {
            files: vec![s("a"), s("b")],
            truncated: true,
            readme_path: s("README.md"),
            readme: s("# hi"),
            agents_md_path: s("AGENTS.md"),
            agents_md: s("run make test"),
        },
        Event::CodeInView { text: s("code") },
        Event::InstructionsInView {
            path: s("crates/x/AGENTS.md"),
            text: s("use the crate's own test runner"),
        },
        Event::CheckAfterChanges {
            passed: false,
            text: s("fails"),
        },
        Event::ChangesUndone {
            root: s("r"),
            to_start: true,
            restored: vec![s("a")],
            left: vec![s("b")],
            shown: s("text"),
        },
        Event::FinishedForModel { why: s("stalled") },
        Event::ProtectedRestored {
            tool_use_id: s("c1"),
            paths: vec![s("tests/t.py")],
        },
        Event::Snapshot { upto: 9 },
        Event::Finished {
            outcome: Outcome::Stalled,
            reason: s("r"),
            verified: Some(false),
        },
    ]
}

#[test]
fn every_kind_of_record_keeps_its_fields_on_the_wire_and_reads_back() {
    // The wire's types are the protocol's own, but a client reads the same field names
    // as the log has always had: only 64-bit integers differ (strings on the wire).
    for e in one_of_each() {
        let r = rec(1, e);
        let mut model: serde_json::Value = serde_json::to_value(&r).unwrap();
        let text = json(&r);
        let wire: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut flat = wire.clone();
        stringify_numbers(&mut model);
        stringify_numbers(&mut flat);
        assert_eq!(model, flat, "{text}");
        // Every integer above 2^53 is a string on the wire.
        assert!(!has_wide_number(&wire), "{text}");
        let back: proto::log::Record = serde_json::from_str(&text).unwrap();
        assert_eq!(back, record(&r), "{text}");
    }
}

fn has_wide_number(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Number(n) => n.as_u64().is_some_and(|n| n > 1 << 53),
        serde_json::Value::Array(a) => a.iter().any(has_wide_number),
        serde_json::Value::Object(o) => o.values().any(has_wide_number),
        _ => false,
    }
}

/// Integers as strings, so the two forms compare field by field.
fn stringify_numbers(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) if n.is_u64() || n.is_i64() => {
            *v = serde_json::Value::String(n.to_string());
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(stringify_numbers),
        serde_json::Value::Object(o) => o.values_mut().for_each(stringify_numbers),
        _ => {}
    }
}
