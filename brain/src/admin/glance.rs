//! A task's log as a person reads it at a glance (`brain run`, `brain watch`, `brain task
//! log`): each command once, with its output under it; bookkeeping (status changes the next
//! line makes plain, syncs, a zero exit, the model's request) folded away; workers by name;
//! a call known by the short number of the record that issued it (`#14`), and a long output
//! cut with the command that shows it whole. `--full` shows every record as it is, `--json`
//! the records themselves.

use std::collections::HashMap;

use proto::log::{Event as E, Record, ToolCall};

use super::render::{describe_live, describe_record};

/// Lines of a command's stdout (and of its stderr) shown under it.
const OUTPUT_LINES: usize = 20;
/// Lines of what a file tool gave the model (a file read, a search) shown under it.
const READ_LINES: usize = 3;
/// Lines of a failed call's answer (an error the model is told).
const ERROR_LINES: usize = 12;

/// Folds a task's records into lines for people, record by record.
pub struct Glance {
    task: String,
    /// Worker ids to names.
    names: HashMap<String, String>,
    /// Each call seen issued: its id to the short number people use (the issuing record's
    /// sequence number).
    calls: HashMap<u64, u64>,
    /// The last issued call was a command: its output is shown as it comes, so the model's
    /// copy of it is not shown again.
    last_was_command: bool,
    /// Lines of each call's stdout and stderr shown live, as they came: its output record
    /// then adds only what was not shown.
    streamed: HashMap<u64, [usize; 2]>,
    /// A call is running: files that change now are its doing.
    in_call: bool,
}

impl Glance {
    pub fn new(task: &str, names: HashMap<String, String>) -> Self {
        Self {
            task: task.to_string(),
            names,
            calls: HashMap::new(),
            last_was_command: false,
            streamed: HashMap::new(),
            in_call: false,
        }
    }

    /// A worker this record names that the names known do not hold (one that joined since
    /// they were asked for).
    pub fn names_a_stranger(&self, r: &Record) -> bool {
        let named = match &r.event {
            E::WorkerAssigned { worker } => vec![worker],
            E::MoveStarted { from, to } => vec![from, to],
            E::MoveCompleted { to, .. } => vec![to],
            _ => vec![],
        };
        named
            .into_iter()
            .any(|w| !w.is_empty() && !self.names.contains_key(w))
    }

    pub fn learn_names(&mut self, names: HashMap<String, String>) {
        self.names.extend(names);
    }

    /// A worker by its name when it has one.
    fn name<'a>(&'a self, worker: &'a str) -> &'a str {
        self.names.get(worker).map_or(worker, String::as_str)
    }

    /// `#14`: the record that issued the call; a call issued before what is shown goes by
    /// its whole id.
    fn short(&self, call_id: u64) -> String {
        match self.calls.get(&call_id) {
            Some(seq) => format!("#{seq}"),
            None => format!("#{call_id}"),
        }
    }

    /// Lines for one record, or `None` when it is bookkeeping folded into its neighbours.
    pub fn record(&mut self, r: &Record) -> Option<String> {
        match &r.event {
            E::ToolCallIssued { .. } => self.in_call = true,
            E::ToolCallCompleted { .. } | E::ToolCallInterrupted { .. } => self.in_call = false,
            _ => {}
        }
        let line = |what: String| Some(format!("{:>5}  {what}", r.seq));
        match &r.event {
            E::StatusChanged { status, .. }
                if matches!(
                    status.as_str(),
                    "created" | "queued" | "running" | "waiting"
                ) =>
            {
                None
            }
            E::LlmRequest { .. } | E::Barrier { .. } | E::Snapshot { .. } => None,
            E::WorkerAssigned { worker } => line(format!("on {}", self.name(worker))),
            E::MoveStarted { from, to } => line(format!(
                "MOVE     from {} to {}",
                self.name(from),
                self.name(to)
            )),
            E::MoveCompleted { to, files, .. } => line(format!(
                "moved    now on {} ({files} files written there)",
                self.name(to)
            )),
            E::LlmResponse {
                response,
                prompt_tokens,
                completion_tokens,
                ..
            } => {
                let text = response.as_ref().map_or("", |r| r.message.content.as_str());
                let said: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
                // `finish` runs nothing on a worker: its line is here, or a check that runs
                // next would seem to come from nowhere.
                let finish = response
                    .as_ref()
                    .and_then(|r| r.message.tool_calls.iter().find(|c| c.name == "finish"));
                if said.is_empty() && finish.is_none() {
                    return None;
                }
                let mut s = format!(
                    "model    ({} tokens)",
                    prompt_tokens.saturating_add(*completion_tokens)
                );
                for l in said.iter().take(10) {
                    s.push_str(&format!("\n    > {l}"));
                }
                if said.len() > 10 {
                    s.push_str(&format!("\n    > … {} more lines", said.len() - 10));
                }
                if let Some(f) = finish {
                    let summary = serde_json::from_str::<serde_json::Value>(&f.arguments)
                        .ok()
                        .and_then(|v| v["summary"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    let summary = one_line(&summary, 160);
                    s.push_str(&format!("\n    finish: {summary}"));
                }
                line(s)
            }
            E::ToolCallIssued {
                call_id,
                purpose,
                call,
                ..
            } => {
                self.calls.insert(*call_id, r.seq);
                self.last_was_command = matches!(call, ToolCall::RunCommand { .. });
                let what = match call {
                    ToolCall::RunCommand { argv, .. } => match argv.as_slice() {
                        [sh, c, cmd] if sh == "sh" && c == "-c" => format!("$ {cmd}"),
                        _ => format!("$ {}", argv.join(" ")),
                    },
                    ToolCall::WriteFile { path, content, .. } => {
                        format!("write {path} ({} bytes)", content.len())
                    }
                    ToolCall::ReadFile { path, .. } => format!("read {path}"),
                    ToolCall::EditFile { path, .. } => format!("edit {path}"),
                    ToolCall::ListFiles { glob } => format!("list files {glob}"),
                    ToolCall::Search { pattern, .. } => format!("search {pattern:?}"),
                };
                let by = match purpose.as_str() {
                    "step" => String::new(),
                    "acceptance" => "check ".into(),
                    other => format!("{other} "),
                };
                line(format!("{by}{what}"))
            }
            E::ToolOutput {
                call_id,
                stdout,
                stderr,
            } => self.output(*call_id, stdout, stderr),
            E::ToolCallCompleted { call_id, result } => {
                let result = crate::model::ToolResult {
                    exit_code: result.exit_code,
                    signal: result.signal,
                    timed_out: result.timed_out,
                    error: result.error.clone(),
                    limit: result.limit.clone(),
                };
                // A file tool's failure is what the model is told, shown next.
                if result.ok() || !self.last_was_command {
                    return None;
                }
                Some(format!(
                    "    → {} ({})",
                    crate::model::state::describe(&result),
                    self.short(*call_id)
                ))
            }
            E::Observation { text, failed, .. } => {
                let (output, notes) = match text.split_once(crate::model::stuck::NOTE_MARK) {
                    Some((output, notes)) => (output, Some(notes)),
                    None => (text.as_str(), None),
                };
                let mut s = String::new();
                // A command's output and its end are on the screen already; a file tool's
                // answer and an error (a refused or denied call) are not.
                let shown = match (self.last_was_command, *failed) {
                    (true, _) => 0,
                    (false, true) => ERROR_LINES,
                    (false, false) => READ_LINES,
                };
                let lines: Vec<&str> = output.lines().collect();
                for l in lines.iter().take(shown) {
                    s.push_str(&format!("    < {l}\n"));
                }
                if shown > 0 && lines.len() > shown {
                    s.push_str(&format!(
                        "    < … {} more lines\n",
                        group(lines.len() - shown)
                    ));
                }
                if let Some(notes) = notes {
                    for l in format!("Note: {notes}")
                        .lines()
                        .filter(|l| !l.trim().is_empty())
                    {
                        s.push_str(&format!("    < {l}\n"));
                    }
                }
                self.last_was_command = false;
                (!s.is_empty()).then(|| s.trim_end_matches('\n').to_string())
            }
            _ => Some(describe_record(r)),
        }
    }

    /// A call's output record: what was not shown live, cut with the command that shows
    /// it whole.
    fn output(&mut self, call_id: u64, stdout: &str, stderr: &str) -> Option<String> {
        let mut s = String::new();
        let live = self.streamed.remove(&call_id);
        for (i, (text, mark)) in [(stdout, '|'), (stderr, '!')].into_iter().enumerate() {
            let lines: Vec<&str> = text.lines().collect();
            // What was shown live is not shown again.
            let shown = match live {
                Some(counts) => counts[i],
                None => {
                    for l in lines.iter().take(OUTPUT_LINES) {
                        s.push_str(&format!("    {mark} {l}\n"));
                    }
                    OUTPUT_LINES
                }
            };
            if lines.len() > shown {
                s.push_str(&format!(
                    "    {mark} … {} more lines (brain task log --full {} {})\n",
                    group(lines.len() - shown),
                    self.task,
                    self.short(call_id)
                ));
            }
        }
        (!s.is_empty()).then(|| s.trim_end_matches('\n').to_string())
    }

    /// Live output of the running call (its first lines) and file changes, as they come.
    pub fn live(&mut self, o: &proto::LiveOutput) -> String {
        // Files that change while a call runs are its doing, shown as they change; outside
        // one (a workspace being written, a sync) they are noise at a glance (`--full`
        // shows every hint, `task diff` what changed).
        if o.kind == "fs_change" && !self.in_call {
            return String::new();
        }
        if o.kind != "live_output" {
            return describe_live(o);
        }
        let i = usize::from(o.stream == "stderr");
        let counts = self.streamed.entry(o.call_id).or_default();
        let room = OUTPUT_LINES.saturating_sub(counts[i]);
        let mark = if i == 1 { '!' } else { '|' };
        let mut s = String::new();
        for l in o.text.lines().take(room) {
            s.push_str(&format!("    {mark} {l}\n"));
            counts[i] += 1;
        }
        s
    }
}

/// The first line of `text`, cut at `max` characters with an ellipsis.
pub fn one_line(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or_default().trim_end();
    let cut: String = first.chars().take(max).collect();
    if cut.len() < first.len() || text.trim_end().lines().nth(1).is_some() {
        format!("{cut} …")
    } else {
        cut
    }
}

/// `2980` as `2,980`.
pub fn group(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Which records `brain task log --full ID #N` shows: the call issued at record `N`, its
/// output and its end, and what the model was told of it.
pub struct OneCall {
    seq: u64,
    call_id: Option<u64>,
    told: bool,
}

impl OneCall {
    pub fn new(seq: u64) -> Self {
        Self {
            seq,
            call_id: None,
            told: false,
        }
    }

    pub fn wants(&mut self, r: &Record) -> bool {
        match &r.event {
            E::ToolCallIssued { call_id, .. } if r.seq == self.seq => {
                self.call_id = Some(*call_id);
                true
            }
            E::ToolOutput { call_id, .. }
            | E::ToolCallCompleted { call_id, .. }
            | E::ToolCallInterrupted { call_id, .. } => self.call_id == Some(*call_id),
            E::Observation { .. } if self.call_id.is_some() && !self.told => {
                self.told = true;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, event: E) -> Record {
        Record {
            v: 1,
            task: "t-3".into(),
            seq,
            at_ms: 0,
            event,
        }
    }

    fn command(seq: u64, call_id: u64, cmd: &str) -> Record {
        rec(
            seq,
            E::ToolCallIssued {
                call_id,
                step: 1,
                purpose: "step".into(),
                worker: "w-0123456789ab".into(),
                call: ToolCall::RunCommand {
                    argv: vec!["sh".into(), "-c".into(), cmd.into()],
                    timeout_ms: 1000,
                    cwd: String::new(),
                },
            },
        )
    }

    fn shown(g: &mut Glance, records: &[Record]) -> String {
        records
            .iter()
            .filter_map(|r| g.record(r))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_command_is_shown_once_with_its_output_and_bookkeeping_is_folded() {
        let names = HashMap::from([("w-0123456789ab".to_string(), "laptop".to_string())]);
        let mut g = Glance::new("t-3", names);
        let big: Vec<String> = (1..=3000).map(|i| format!("line {i}")).collect();
        let records = vec![
            rec(
                2,
                E::WorkerAssigned {
                    worker: "w-0123456789ab".into(),
                },
            ),
            rec(
                3,
                E::StatusChanged {
                    status: "running".into(),
                    reason: String::new(),
                },
            ),
            command(14, 117743616073728001, "make test"),
            rec(
                15,
                E::ToolOutput {
                    call_id: 117743616073728001,
                    stdout: big.join("\n"),
                    stderr: String::new(),
                },
            ),
            rec(
                16,
                E::ToolCallCompleted {
                    call_id: 117743616073728001,
                    result: proto::log::ToolResult {
                        exit_code: Some(0),
                        ..Default::default()
                    },
                },
            ),
            rec(
                17,
                E::Observation {
                    tool_use_id: "u1".into(),
                    text: format!("exit code 0\n{}", big.join("\n")),
                    failed: false,
                },
            ),
        ];
        let s = shown(&mut g, &records);
        assert!(s.contains("on laptop"), "{s}");
        assert!(!s.contains("w-0123456789ab"), "{s}");
        assert!(!s.contains("running"), "{s}");
        assert!(s.contains("   14  $ make test"), "{s}");
        assert!(!s.contains("117743616073728001"), "{s}");
        assert_eq!(s.matches("line 1\n").count(), 1, "output shown twice:\n{s}");
        assert!(
            s.contains("… 2,980 more lines (brain task log --full t-3 #14)"),
            "{s}"
        );
        assert!(!s.contains("exit code 0"), "{s}");
    }

    #[test]
    fn a_failed_command_says_how_and_a_read_shows_a_few_lines() {
        let mut g = Glance::new("t-3", HashMap::new());
        let records = vec![
            command(4, 9, "false"),
            rec(
                5,
                E::ToolCallCompleted {
                    call_id: 9,
                    result: proto::log::ToolResult {
                        exit_code: Some(1),
                        ..Default::default()
                    },
                },
            ),
            rec(
                6,
                E::Observation {
                    tool_use_id: "u1".into(),
                    text: "exit code 1".into(),
                    failed: true,
                },
            ),
            rec(
                7,
                E::ToolCallIssued {
                    call_id: 10,
                    step: 2,
                    purpose: "step".into(),
                    worker: "w".into(),
                    call: ToolCall::ReadFile {
                        path: "a.py".into(),
                        start_line: 0,
                        end_line: 0,
                    },
                },
            ),
            rec(
                8,
                E::Observation {
                    tool_use_id: "u2".into(),
                    text: "1 import os\n2 x = 1\n3 y = 2\n4 z = 3\n5 w = 4".into(),
                    failed: false,
                },
            ),
        ];
        let s = shown(&mut g, &records);
        assert!(s.contains("→ exit code 1 (#4)"), "{s}");
        assert!(s.contains("read a.py"), "{s}");
        assert!(s.contains("< 3 y = 2") && !s.contains("4 z = 3"), "{s}");
        assert!(s.contains("… 2 more lines"), "{s}");
    }

    #[test]
    fn output_shown_live_is_not_shown_again_and_a_long_one_is_cut() {
        let mut g = Glance::new("t-1", HashMap::new());
        let issued = g.record(&command(5, 77, "make")).unwrap();
        assert!(issued.contains("$ make"), "{issued}");
        let mut live = String::new();
        for i in 1..=30 {
            live.push_str(&g.live(&proto::LiveOutput {
                kind: "live_output".into(),
                call_id: 77,
                stream: "stderr".into(),
                text: format!("warning {i}\n"),
            }));
        }
        assert!(
            live.contains("! warning 20\n") && !live.contains("warning 21"),
            "{live}"
        );
        let all: Vec<String> = (1..=30).map(|i| format!("warning {i}")).collect();
        let rest = g
            .record(&rec(
                6,
                E::ToolOutput {
                    call_id: 77,
                    stdout: String::new(),
                    stderr: all.join("\n"),
                },
            ))
            .unwrap();
        assert!(!rest.contains("warning 1\n"), "shown twice: {rest}");
        assert!(
            rest.contains("… 10 more lines (brain task log --full t-1 #5)"),
            "{rest}"
        );
    }

    #[test]
    fn files_that_change_are_shown_while_a_call_runs_only() {
        let mut g = Glance::new("t-1", HashMap::new());
        let change = |path: &str| proto::LiveOutput {
            kind: "fs_change".into(),
            call_id: 0,
            stream: "changed".into(),
            text: format!("{path}\n"),
        };
        // The workspace being written before any call: an echo of every file.
        assert_eq!(g.live(&change("README.md")), "");
        g.record(&command(4, 9, "make"));
        assert_eq!(g.live(&change("out.txt")), "    ~ out.txt\n");
        g.record(&rec(
            5,
            E::ToolCallCompleted {
                call_id: 9,
                result: Default::default(),
            },
        ));
        assert_eq!(g.live(&change("late.txt")), "");
    }

    #[test]
    fn a_finish_is_shown_with_its_summary() {
        let mut g = Glance::new("t-1", HashMap::new());
        let r: Record = serde_json::from_value(serde_json::json!({
            "v": 1, "task": "t-1", "seq": 12, "at_ms": 0, "kind": "llm_response",
            "model": "openai:m", "prompt_tokens": "100", "completion_tokens": "20", "cost_usd": 0.0,
            "response": {
                "message": {"role": "assistant", "tool_calls": [
                    {"id": "c1", "name": "finish", "arguments": "{\"summary\": \"fixed add\\nand more\"}"}
                ]},
                "usage": {"prompt_tokens": 100, "completion_tokens": 20}
            }
        }))
        .unwrap();
        let s = g.record(&r).unwrap();
        assert!(s.ends_with("\n    finish: fixed add …"), "{s}");
    }

    #[test]
    fn one_line_says_when_it_cut() {
        assert_eq!(one_line("short", 10), "short");
        assert_eq!(one_line("a long line of words", 6), "a long …");
        assert_eq!(one_line("first\nsecond", 60), "first …");
        assert_eq!(one_line("ends with a newline\n", 60), "ends with a newline");
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(group(7), "7");
        assert_eq!(group(2980), "2,980");
        assert_eq!(group(1234567), "1,234,567");
    }
}
