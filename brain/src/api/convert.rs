//! Every conversion between wire (proto) and domain types, written once. Conversions from the
//! wire check what they take: a bad value is rejected here, with a message that says what to
//! send instead, and never reaches the engine.

pub mod log;

use std::collections::{BTreeMap, HashMap};

use tonic::Status;

use crate::engine::{Followed, LiveOutput};
use crate::model::agent::Budget;
use crate::model::event::{SyncRules, TaskId, ToolResult};
use crate::model::ops::{
    Command, CommandEnd, FileAnswer, FileOp, FsChange, Limits, OutputChunk, SearchMatch, Stream,
    SyncOp, SyncReport,
};
use crate::model::state::TaskState;
use crate::provision::Machine;
use crate::trust::registry::{Caps, WorkerRecord};

impl From<proto::Limits> for Limits {
    fn from(l: proto::Limits) -> Self {
        Limits {
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpus: if l.cpus.is_finite() {
                l.cpus.max(0.0)
            } else {
                0.0
            },
            file_size_bytes: l.file_size_bytes,
            cpu_seconds: l.cpu_seconds,
            network_off: l.network_off,
        }
    }
}

impl From<Limits> for proto::Limits {
    fn from(l: Limits) -> Self {
        proto::Limits {
            memory_bytes: l.memory_bytes,
            pids: l.pids,
            cpus: l.cpus,
            file_size_bytes: l.file_size_bytes,
            cpu_seconds: l.cpu_seconds,
            network_off: l.network_off,
        }
    }
}

impl TryFrom<proto::Budget> for Budget {
    type Error = Status;
    fn try_from(b: proto::Budget) -> Result<Self, Status> {
        if !(b.usd.is_finite() && b.usd >= 0.0) {
            return Err(Status::invalid_argument(
                "the money budget must be a positive number",
            ));
        }
        Ok(Budget {
            usd: b.usd,
            tokens: b.tokens,
            steps: b.steps,
            wall_ms: b.wall_ms,
        })
    }
}

impl From<Budget> for proto::Budget {
    fn from(b: Budget) -> Self {
        proto::Budget {
            usd: b.usd,
            tokens: b.tokens,
            steps: b.steps,
            wall_ms: b.wall_ms,
        }
    }
}

impl From<Command> for proto::ExecStart {
    fn from(c: Command) -> Self {
        proto::ExecStart {
            call_id: c.call_id,
            workspace: c.workspace,
            argv: c.argv,
            cwd: c.cwd,
            timeout_ms: c.timeout_ms,
            output_cap_bytes: c.output_cap_bytes,
            durable: true,
            limits: Some(c.limits.into()),
            env: c.env.into_iter().collect(),
            egress: c.egress.map(|e| proto::EgressPolicy {
                task: e.task,
                grant: e.grant,
                direct: e
                    .direct
                    .iter()
                    .map(|r| proto::EgressRule {
                        host: r.host.to_string(),
                        ports: r.ports.iter().map(|p| u32::from(*p)).collect(),
                    })
                    .collect(),
                ca_pem: e.ca_pem,
                resolve: e
                    .resolve
                    .into_iter()
                    .map(|(h, ip)| (h, ip.to_string()))
                    .collect(),
            }),
        }
    }
}

impl From<proto::CallResult> for CommandEnd {
    fn from(r: proto::CallResult) -> Self {
        if !r.interrupted.is_empty() {
            return CommandEnd::Interrupted(r.interrupted);
        }
        let x = r.exit.unwrap_or_default();
        CommandEnd::Finished {
            result: ToolResult {
                exit_code: x.code,
                signal: x.signal,
                timed_out: x.timed_out,
                error: x.error,
                limit: x.limit,
            },
            stdout: r.stdout,
            stderr: r.stderr,
        }
    }
}

impl From<proto::ExecOutput> for OutputChunk {
    fn from(o: proto::ExecOutput) -> Self {
        OutputChunk {
            call_id: o.call_id,
            stream: if o.stream == proto::OutputStream::Stderr as i32 {
                Stream::Stderr
            } else {
                Stream::Stdout
            },
            data: o.data,
        }
    }
}

impl From<FileOp> for proto::file_call::Op {
    fn from(op: FileOp) -> Self {
        use proto::file_call::Op;
        match op {
            FileOp::Read {
                path,
                offset,
                length,
            } => Op::Read(proto::ReadFile {
                path,
                offset,
                length,
            }),
            FileOp::Write {
                path,
                data,
                mode,
                create_dirs,
            } => Op::Write(proto::WriteFile {
                path,
                data,
                mode,
                create_dirs,
            }),
            FileOp::Find { glob, max_results } => Op::Find(proto::FindFiles { glob, max_results }),
            FileOp::Search {
                pattern,
                glob,
                max_matches,
            } => Op::Search(proto::SearchFiles {
                pattern,
                glob,
                max_matches,
            }),
        }
    }
}

impl From<proto::FileResponse> for FileAnswer {
    fn from(r: proto::FileResponse) -> Self {
        use proto::file_response::Result as R;
        match r.result {
            Some(R::Data(d)) => FileAnswer::Data {
                data: d.data,
                file_size: d.file_size,
            },
            Some(R::Done(_)) => FileAnswer::Done,
            Some(R::Paths(p)) => FileAnswer::Paths {
                paths: p.paths,
                truncated: p.truncated,
            },
            Some(R::Matches(m)) => FileAnswer::Matches {
                matches: m
                    .matches
                    .into_iter()
                    .map(|h| SearchMatch {
                        path: h.path,
                        line: h.line,
                        text: h.text,
                    })
                    .collect(),
                truncated: m.truncated,
                files_searched: m.files_searched,
            },
            Some(R::Error(e)) => FileAnswer::Error(e.message),
            Some(R::Stat(_)) => FileAnswer::Unexpected("a file's status"),
            Some(R::Listing(_)) => FileAnswer::Unexpected("a directory listing"),
            None => FileAnswer::Unexpected("an empty answer"),
        }
    }
}

impl From<SyncOp> for proto::sync_request::Op {
    fn from(op: SyncOp) -> Self {
        use proto::sync_request::Op;
        match op {
            SyncOp::Barrier { base } => Op::BarrierBase(base),
            SyncOp::Materialise { root } => Op::MaterialiseRoot(root),
            SyncOp::ImportDir { dir } => Op::ImportDir(dir),
        }
    }
}

impl From<proto::SyncReport> for SyncReport {
    fn from(r: proto::SyncReport) -> Self {
        // From a worker: bounded and escaped before anything keeps it.
        let left_out = shared::manifest::LeftOut::from_wire(&r.left_out, r.left_out_more);
        SyncReport {
            error: r.error,
            root_hash: r.root_hash,
            files: r.files,
            bytes: r.bytes,
            blobs_sent: r.blobs_sent,
            wire_bytes: r.wire_bytes,
            hashed: r.hashed,
            left_out: left_out.0,
            left_out_more: left_out.1,
            tmp_bytes: r.tmp_bytes,
            tmp_files: r.tmp_files,
        }
    }
}

impl From<proto::FsChanged> for FsChange {
    fn from(f: proto::FsChanged) -> Self {
        FsChange {
            workspace: f.workspace,
            changed: f.changed,
            removed: f.removed,
            incomplete: f.truncated || f.rescan,
        }
    }
}

/// A task sync's rules as a request carries them.
pub fn sync_rules(
    include_git: bool,
    excludes: &[String],
    no_defaults: bool,
) -> Result<SyncRules, Status> {
    let rules = SyncRules {
        include_git,
        extra_excludes: excludes.to_vec(),
        no_default_excludes: no_defaults,
    };
    rules
        .check()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(rules)
}

/// Labels from a request: checked, in order.
pub fn labels(labels: &HashMap<String, String>) -> Result<BTreeMap<String, String>, Status> {
    if labels.len() > 64 {
        return Err(Status::invalid_argument("at most 64 labels"));
    }
    for (k, v) in labels {
        shared::parse_label(&format!("{k}={v}"))
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    Ok(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// What a worker's hello says about it, each string bounded.
impl From<proto::Capabilities> for Caps {
    fn from(caps: proto::Capabilities) -> Self {
        Caps {
            cpus: caps.cpus,
            memory_bytes: caps.memory_bytes,
            disk_free_bytes: caps.disk_free_bytes,
            os: caps.os.chars().take(64).collect(),
            arch: caps.arch.chars().take(64).collect(),
            version: caps.version.chars().take(64).collect(),
            hostname: caps.hostname.chars().take(255).collect(),
            sandbox: caps
                .sandbox
                .iter()
                .take(16)
                .map(|m| m.chars().take(32).collect())
                .collect(),
            max_tasks: caps.max_tasks,
        }
    }
}

impl From<Caps> for proto::Capabilities {
    fn from(caps: Caps) -> Self {
        proto::Capabilities {
            cpus: caps.cpus,
            memory_bytes: caps.memory_bytes,
            disk_free_bytes: caps.disk_free_bytes,
            os: caps.os,
            arch: caps.arch,
            version: caps.version,
            hostname: caps.hostname,
            sandbox: caps.sandbox,
            max_tasks: caps.max_tasks,
        }
    }
}

/// Where a worker's session is, as the brain answering knows it.
pub enum Session {
    /// Connected here, last seen at this time (ms since the epoch).
    Here(i64),
    /// Connected to this other live replica sharing the store.
    Elsewhere(String),
    /// Not connected: the registry's last sighting.
    None,
}

/// A worker as the admin API shows it: its record, its session, the tasks placed on it, and
/// (connected) placement's view of it.
pub fn worker_info(
    w: WorkerRecord,
    session: Session,
    (running_tasks, peak_tasks): (u32, u32),
    view: Option<crate::fleet::board::MemberView>,
) -> proto::WorkerInfo {
    use proto::WorkerState;
    let (connected, last_seen_ms, replica) = match session {
        Session::Here(ms) => (true, ms, String::new()),
        // Its replica wrote that it holds the session within the last seconds.
        Session::Elsewhere(r) => (true, shared::now_unix_ms(), r),
        Session::None => (false, w.last_seen_ms, String::new()),
    };
    let state = if w.revoked {
        WorkerState::Revoked
    } else if connected {
        WorkerState::Connected
    } else if w.last_seen_ms > 0 {
        WorkerState::Lost
    } else {
        WorkerState::Enrolled
    };
    proto::WorkerInfo {
        id: w.id,
        name: w.name,
        labels: w.labels.into_iter().collect(),
        capabilities: Some(w.caps.unwrap_or_default().into()),
        state: state as i32,
        last_seen_unix_ms: last_seen_ms,
        enrolled_unix_ms: w.enrolled_ms,
        running_tasks,
        peak_tasks,
        max_tasks: view.as_ref().map_or(0, |v| v.capacity),
        link: view.as_ref().map_or("", |v| v.link).to_string(),
        load: view.and_then(|v| v.load),
        replica,
    }
}

/// A machine record as the admin API shows it.
pub fn machine_info(m: &Machine, connected: bool) -> proto::MachineInfo {
    proto::MachineInfo {
        id: m.id.clone(),
        provider: m.provider.clone(),
        state: m.state.name().into(),
        handle: m.handle.clone(),
        address: m.address.clone(),
        spec: Some(proto::MachineSpec {
            cpu: m.spec.cpu,
            memory_gb: m.spec.memory_gb,
            disk_gb: m.spec.disk_gb,
            gpu: m.spec.gpu,
        }),
        worker_id: m.worker.clone().unwrap_or_default(),
        task_id: m.task.clone().unwrap_or_default(),
        created_unix_ms: m.created_ms,
        ended_unix_ms: m.ended_ms,
        usd_per_hour: m.usd_per_hour,
        cost_usd: m.cost_usd(shared::now_unix_ms()),
        note: m.note.clone(),
        labels: m.labels.clone().into_iter().collect(),
        connected,
    }
}

/// Whether the task's last check ran on an earlier version of its workspace: a call changed
/// the workspace after it (an attempt stopped because another won, before its check ran
/// again), so its verdict is not the workspace's.
pub fn check_is_stale(t: &TaskState) -> bool {
    t.last_check.is_some()
        && t.agent.as_deref().is_some_and(|a| {
            !a.checked_root.is_empty() && !a.root.is_empty() && a.root != a.checked_root
        })
}

/// What a verdict on an earlier version of the workspace is followed by.
const STALE: &str = "on an earlier version (the workspace changed after it)";

/// The last check in words, with its staleness said.
fn check_in_words(t: &TaskState, c: &crate::model::check::CheckRun) -> String {
    let verdict = if c.passed {
        "passes".to_string()
    } else if c.result.is_empty() {
        // Its output came, its end did not.
        return if t.status.is_terminal() {
            "stopped while it ran".into()
        } else {
            "running".into()
        };
    } else {
        format!("fails ({})", c.result)
    };
    if check_is_stale(t) {
        format!("{verdict} {STALE}")
    } else {
        verdict
    }
}

/// Where a task's result stands: see `TaskSummary.verification`.
pub fn verification(t: &TaskState) -> &'static str {
    use crate::model::state::Status;
    if t.agent.is_none() && t.attempts.is_none() {
        return "";
    }
    match (t.status, t.check().is_some(), t.last_check.as_ref()) {
        (Status::Finished, _, _) if t.verified() => "verified",
        (Status::Finished, _, _) => "unverified",
        (_, false, _) => "",
        // A verdict on an earlier version says nothing of this one.
        (s, true, Some(_)) if check_is_stale(t) && s.is_terminal() => "unverified",
        (_, true, Some(_)) if check_is_stale(t) => "pending",
        (_, true, Some(c)) if !c.passed => "failing",
        // Ended before any check of its own (a parent whose attempts all lost, a task that
        // failed before the check ran): nothing verified it, and nothing will.
        (s, true, None) if s.is_terminal() => "unverified",
        (_, true, _) => "pending",
    }
}

impl From<TaskState> for proto::TaskSummary {
    fn from(t: TaskState) -> Self {
        let verification = verification(&t).to_string();
        let check = t.check().map(|c| c.command.clone()).unwrap_or_default();
        let (check_result, check_output) = t
            .last_check
            .as_ref()
            .map(|c| {
                let result = if check_is_stale(&t) {
                    format!("{} {STALE}", c.result)
                } else {
                    c.result.clone()
                };
                (result, c.output.clone())
            })
            .unwrap_or_default();
        let a = t.agent.as_deref();
        proto::TaskSummary {
            id: t.id.to_string(),
            status: t.status.as_str().into(),
            steps_done: a.map_or(t.next_step, |a| a.spent.steps),
            steps_total: a.map_or(t.steps_total(), |a| a.limits.steps),
            worker: t.worker.clone().unwrap_or_default(),
            created_unix_ms: t.created_ms,
            updated_unix_ms: t.updated_ms,
            model: a.map(|a| a.spec.model.clone()).unwrap_or_default(),
            tokens: a.map_or(0, |a| a.spent.tokens),
            spent_usd: a.map_or(0.0, |a| a.spent.usd),
            limits: a.map(|a| a.limits.into()),
            permission: a.map(|a| a.spec.permission.to_string()).unwrap_or_default(),
            assists: a
                .map(|a| match &a.spec.assists {
                    Some(x) => x.names().join(","),
                    None => "all".into(),
                })
                .unwrap_or_default(),
            reason: t.reason,
            goal: t.goal,
            verification,
            check,
            check_result,
            check_output,
            origin: t
                .origin
                .as_ref()
                .map(|o| format!("{} at {}", o.url, &o.commit[..o.commit.len().min(12)]))
                .unwrap_or_default(),
            deliver: if t.origin.is_some() {
                t.deliver.to_string()
            } else {
                String::new()
            },
            delivery: t
                .delivery
                .as_ref()
                .map(|d| d.describe())
                .unwrap_or_default(),
            delivery_url: t
                .delivery
                .as_ref()
                .map(|d| d.pr_url.clone())
                .unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// A request's `--check` and `--protect` on `spec` (a request's check wins over the
/// config's; protected globs alone wait for the repository's `.tether/check` to name one).
pub fn request_check(
    spec: &mut crate::model::agent::AgentSpec,
    check: &str,
    timeout_ms: u64,
    protect: &[String],
) -> Result<(), Status> {
    use crate::model::agent::Check;
    if !check.trim().is_empty() {
        let command = check.trim();
        if command.len() > 4096 || command.contains('\0') {
            return Err(Status::invalid_argument(
                "the check must be one shell command of at most 4096 bytes",
            ));
        }
        spec.check = Some(Check {
            command: command.to_string(),
            timeout_ms,
            source: crate::model::check::CheckSource::Request,
            protect: vec![],
        });
    }
    if protect.len() > 64 {
        return Err(Status::invalid_argument("at most 64 --protect globs"));
    }
    for g in protect {
        globset::Glob::new(g)
            .map_err(|e| Status::invalid_argument(format!("invalid --protect glob {g:?}: {e}")))?;
    }
    if !protect.is_empty() {
        match &mut spec.check {
            Some(c) => c.protect.extend(protect.iter().cloned()),
            // The repository's .tether/check may still name the command.
            None => {
                spec.check = Some(Check {
                    command: String::new(),
                    timeout_ms,
                    source: Default::default(),
                    protect: protect.to_vec(),
                })
            }
        }
    }
    Ok(())
}

/// A task's summary as [`summary`] makes it, its attempts looked up in `engine`.
pub fn summary_in(engine: &crate::engine::Engine, t: TaskState) -> proto::TaskSummary {
    summary(t, |id| engine.store().task(id).map(|c| c.state()))
}

/// A task's summary; a task run as attempts gets each attempt as it stands now (`find`
/// gives an attempt's state), and its spending over all of them.
pub fn summary(t: TaskState, find: impl Fn(TaskId) -> Option<TaskState>) -> proto::TaskSummary {
    let attempts = t.attempts.clone();
    let attempt_of = t.attempt_of;
    let mut s = proto::TaskSummary::from(t);
    if let Some(of) = attempt_of {
        s.attempt_of = of.parent.to_string();
        s.attempt_number = of.index + 1;
    }
    let Some(a) = attempts else {
        return s;
    };
    s.model = a.template.model.clone();
    s.permission = a.template.permission.to_string();
    s.limits = Some(a.template.budget.into());
    s.picked = a
        .picked
        .as_ref()
        .map(|p| p.task.to_string())
        .unwrap_or_default();
    s.pick = a.spec.pick.to_string();
    for x in &a.list {
        let live = find(x.task);
        let g = live.as_ref().and_then(|c| c.agent.as_deref());
        let check = live
            .as_ref()
            .and_then(|c| c.last_check.as_ref().map(|k| check_in_words(c, k)))
            .unwrap_or_default();
        let e = x.end.as_ref();
        let item = proto::AttemptSummary {
            number: x.index + 1,
            task_id: x.task.to_string(),
            model: x.model.clone(),
            escalation: x.escalation,
            status: live
                .as_ref()
                .map(|c| c.status.as_str().to_string())
                .or_else(|| e.map(|e| e.status.as_str().to_string()))
                .unwrap_or_default(),
            worker: live
                .as_ref()
                .and_then(|c| c.worker.clone())
                .unwrap_or_default(),
            check,
            verified: e.is_some_and(|e| e.verified),
            steps: g.map_or(e.map_or(0, |e| e.steps), |g| g.spent.steps),
            tokens: g.map_or(e.map_or(0, |e| e.tokens), |g| g.spent.tokens),
            spent_usd: g.map_or(e.map_or(0.0, |e| e.usd), |g| g.spent.usd),
            files_changed: e.map_or(0, |e| e.files_changed),
            lines_changed: e.map_or(0, |e| e.lines_changed),
            reason: live.as_ref().map(|c| c.reason.clone()).unwrap_or_default(),
        };
        s.tokens += item.tokens;
        s.spent_usd += item.spent_usd;
        s.steps_done += item.steps;
        // Out of the steps all of them may take (each attempt's own limit).
        s.steps_total += g.map_or(a.template.budget.steps, |g| g.limits.steps);
        s.attempts.push(item);
    }
    s
}

impl From<LiveOutput> for proto::LiveOutput {
    fn from(o: LiveOutput) -> Self {
        proto::LiveOutput {
            kind: o.kind.into(),
            call_id: o.call_id,
            stream: o.stream.into(),
            text: o.text,
        }
    }
}

/// A followed item on the wire; the end of the stream itself says the task is over, so
/// [`Followed::End`] has no message.
pub fn task_record(f: Followed) -> Option<proto::TaskRecord> {
    use proto::task_record::Item;
    let item = match f {
        Followed::Record(r) => Item::Record(r.json_with(log::json).to_string()),
        Followed::Live(o) => Item::Live(o.into()),
        Followed::Broken(e) => Item::Error(e),
        Followed::End => return None,
    };
    Some(proto::TaskRecord { item: Some(item) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_budgets_round_trip_and_bad_budgets_are_refused() {
        let l = Limits {
            memory_bytes: 1 << 30,
            pids: 64,
            cpus: 1.5,
            file_size_bytes: 1 << 20,
            cpu_seconds: 60,
            network_off: true,
        };
        assert_eq!(Limits::from(proto::Limits::from(l)), l);
        let nan = proto::Limits {
            cpus: f64::NAN,
            ..Default::default()
        };
        assert_eq!(Limits::from(nan).cpus, 0.0);
        let b = Budget {
            usd: 1.0,
            tokens: 2,
            steps: 3,
            wall_ms: 4,
        };
        assert_eq!(Budget::try_from(proto::Budget::from(b)).unwrap(), b);
        for usd in [-1.0, f64::NAN, f64::INFINITY] {
            let bad = proto::Budget {
                usd,
                ..Default::default()
            };
            assert!(Budget::try_from(bad).is_err(), "{usd}");
        }
    }

    #[test]
    fn a_worker_result_becomes_an_outcome() {
        let r = proto::CallResult {
            call_id: 1,
            exit: Some(proto::ExecExit {
                code: Some(3),
                ..Default::default()
            }),
            stdout: b"out".to_vec(),
            ..Default::default()
        };
        match CommandEnd::from(r) {
            CommandEnd::Finished { result, stdout, .. } => {
                assert_eq!(
                    (result.exit_code, stdout.as_slice()),
                    (Some(3), &b"out"[..])
                );
            }
            other => panic!("{other:?}"),
        }
        let r = proto::CallResult {
            interrupted: "the worker restarted".into(),
            ..Default::default()
        };
        assert_eq!(
            CommandEnd::from(r),
            CommandEnd::Interrupted("the worker restarted".into())
        );
    }

    #[test]
    fn bad_labels_and_rules_are_refused_with_what_to_send() {
        let mut l = HashMap::new();
        l.insert("gpu".to_string(), "yes".to_string());
        assert_eq!(
            labels(&l).unwrap().get("gpu").map(String::as_str),
            Some("yes")
        );
        l.insert("bad key".into(), "x".into());
        let e = labels(&l).unwrap_err();
        assert!(e.message().contains("bad key"), "{}", e.message());
        let e = sync_rules(false, &["a/b".into()], false).unwrap_err();
        assert!(e.message().contains("directory name"), "{}", e.message());
    }
}
