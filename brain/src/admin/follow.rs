//! Starting a task and following it: `brain run` (an agent task or a plan, followed until it
//! ends), `approve`/`deny`, and the log followers behind `watch` and `task log`.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};

use super::args::RunArgs;
use super::client::{Target, status};
use super::glance::{Glance, OneCall};
use super::render::describe_full;

/// `brain run`: starts an agent task (or a scripted plan) and follows it.
pub async fn run_task(target: &Target, args: RunArgs) -> anyhow::Result<i32> {
    let refused = args.not_for_plans();
    if args.plan.is_some() && !refused.is_empty() {
        // A flag the plan would not honour is refused, never dropped: a plan run with
        // `--check` must not look verified, one with `--git` must not run on an empty
        // workspace unnoticed.
        let mut text = String::from(
            "error: brain run --plan does not take these flags (nothing was started):",
        );
        for (flag, why) in refused {
            text.push_str(&format!("\n  {flag}: {why}"));
        }
        err!("{text}");
        return Ok(shared::exit::ExitCode::Usage.code());
    }
    let goal = args.goal.or(args.goal_flag).unwrap_or_default();
    let mut c = target.connect().await?;
    let task_id = if let Some(plan) = &args.plan {
        let plan_json = std::fs::read_to_string(plan)
            .with_context(|| format!("reading the plan {}", plan.display()))?;
        crate::model::Plan::parse(&plan_json)
            .map_err(|e| anyhow::anyhow!("{}: {e}", plan.display()))?;
        let worker = args.worker.clone().unwrap_or_default();
        let r = c
            .run_plan(proto::RunPlanRequest {
                plan_json,
                worker,
                goal,
                require_labels: args.require_labels.iter().cloned().collect(),
                secrets: args.secrets.clone(),
                allow: args.allow.clone(),
                egress: args.egress.clone().unwrap_or_default(),
            })
            .await
            .map_err(|s| status(s, &target.url))?
            .into_inner();
        out!("{}", r.task_id);
        err!("follow it with: brain watch {}", r.task_id);
        return Ok(0);
    } else {
        if goal.trim().is_empty() {
            bail!("say what the agent should do: brain run \"GOAL\" (see --help)");
        }
        let mut model = args.model.clone().unwrap_or_default();
        let mut transcript = String::new();
        if let Some(file) = model.strip_prefix("replay:") {
            transcript = std::fs::read_to_string(file)
                .with_context(|| format!("reading the transcript {file}"))?;
            crate::llm::Replay::parse(&transcript).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
            let name = Path::new(file)
                .file_name()
                .map_or_else(|| file.to_string(), |n| n.to_string_lossy().into_owned());
            model = format!("replay:{name}");
        }
        let r = c
            .run_agent(proto::RunAgentRequest {
                goal,
                worker: args.worker.clone().unwrap_or_default(),
                model,
                permission: args.permission.clone().unwrap_or_default(),
                budget: Some(args.budget.to_proto()?),
                transcript,
                git_url: args.git.clone().unwrap_or_default(),
                git_ref: args.git_ref.clone().unwrap_or_default(),
                require_labels: args.require_labels.iter().cloned().collect(),
                include_git: args.include_git,
                extra_excludes: args.excludes.clone(),
                no_default_excludes: args.no_default_excludes,
                check: args.check.clone().unwrap_or_default(),
                check_timeout_ms: args.check_timeout.map_or(0, |d| d.as_millis() as u64),
                protect: args.protect.clone(),
                deliver: args.deliver.clone().unwrap_or_default(),
                secrets: args.secrets.clone(),
                allow: args.allow.clone(),
                egress: args.egress.clone().unwrap_or_default(),
                attempts: args.attempts.unwrap_or(0),
                pick: args.pick.clone().unwrap_or_default(),
                attempt_models: args.attempt_models.clone(),
                attempt_temperature: args.attempt_temperature,
                escalate_models: args.escalate_models.clone(),
                no_agents_md: args.no_agents_md,
                assists: args.assists.clone().unwrap_or_default(),
                dir: match &args.dir {
                    Some(d) if d.is_relative() => std::env::current_dir()
                        .context("resolving --dir")?
                        .join(d)
                        .display()
                        .to_string(),
                    Some(d) => d.display().to_string(),
                    None => String::new(),
                },
            })
            .await
            .map_err(|s| status(s, &target.url))?
            .into_inner();
        r.task_id
    };
    out!("{task_id}");
    if let (Some(dir), Some(n)) = (&args.dir, args.attempts.filter(|n| *n > 1)) {
        // Said, not silently done: the attempts cannot spread over machines.
        err!(
            "note: all {n} attempts run on worker {}: the files of --dir {} are on its machine only (a --git task's attempts can spread over workers)",
            args.worker.as_deref().unwrap_or("?"),
            dir.display()
        );
    }
    if args.detach {
        err!("follow it with: brain watch {task_id}");
        return Ok(0);
    }
    err!("following {task_id} (Ctrl-C detaches; the task goes on)");
    let recorder = args.record.as_deref();
    let outcome = follow_agent(target, &task_id, recorder).await?;
    if outcome == "finished"
        && matches!(args.deliver.as_deref(), None | Some("branch" | "pr"))
        && !super::results::wait_delivery(target, &task_id).await?
    {
        // Finished, but the result did not get where it was asked to go.
        return Ok(1);
    }
    Ok(match outcome.as_str() {
        "finished" => 0,
        _ => 1,
    })
}

/// `brain approve` / `brain deny`.
pub async fn decide(
    target: &Target,
    task: &str,
    approve: bool,
    reason: String,
    always: bool,
) -> anyhow::Result<i32> {
    let r = target
        .rpc(async |mut c| {
            c.decide(proto::DecideRequest {
                task_id: task.to_string(),
                approve,
                reason: reason.clone(),
                always,
            })
            .await
        })
        .await?;
    out!(
        "{} {task}: {}{}",
        if approve { "approved" } else { "denied" },
        r.what,
        if always {
            " (and from now on in this task)"
        } else {
            ""
        }
    );
    Ok(0)
}

/// A task's log records as a stream; with `live`, it stays open until the task ends.
async fn task_log(
    target: &Target,
    task: &str,
    live: bool,
    since: u64,
) -> anyhow::Result<tonic::Streaming<proto::TaskRecord>> {
    let mut c = target.connect().await?;
    Ok(c.task_log(proto::TaskLogRequest {
        task_id: task.to_string(),
        follow: live,
        after_seq: since,
    })
    .await
    .map_err(|s| status(s, &target.url))?
    .into_inner())
}

/// One item of a followed log.
enum Item {
    Record(Box<proto::log::Record>),
    Live(proto::LiveOutput),
    /// A record the brain could not decode, or this CLI cannot (a newer brain).
    Broken(String),
}

fn item(r: proto::TaskRecord) -> Item {
    use proto::task_record::Item as I;
    match r.item {
        Some(I::Record(json)) => match serde_json::from_str::<proto::log::Record>(&json) {
            Ok(rec) => Item::Record(Box::new(rec)),
            Err(e) => Item::Broken(format!("a record this program cannot read ({e}): {json}")),
        },
        Some(I::Live(o)) => Item::Live(o),
        Some(I::Error(e)) => Item::Broken(e),
        None => Item::Broken("an empty record".into()),
    }
}

/// Follows an agent task until it ends or stops for budget, printing its events, with a
/// running total of tokens and cost; on a terminal, asks for each approval inline; with
/// `record`, writes the model's answers as a transcript. Returns the final status.
async fn follow_agent(
    target: &Target,
    task: &str,
    record: Option<&Path>,
) -> anyhow::Result<String> {
    use super::prompt::{Answer, Asker, SETTLE};
    let mut stream = task_log(target, task, true, 0).await?;
    let mut answers = Vec::new();
    let (mut tokens, mut usd) = (0u64, 0f64);
    let mut out = std::io::stdout();
    let mut end = String::from("detached");
    let mut asker = Asker::on_a_terminal();
    let mut glance = Glance::new(task, worker_names(target).await);
    let mut thinking: Option<super::progress::Progress> = None;
    let mut ask_at = tokio::time::Instant::now();
    loop {
        let unasked = asker.as_ref().is_some_and(Asker::unasked);
        let asking = asker.as_ref().is_some_and(Asker::asking);
        let r = tokio::select! {
            r = stream.message() => r.map_err(|s| status(s, &target.url))?,
            () = tokio::time::sleep_until(ask_at), if unasked => {
                if let Some(a) = asker.as_mut() {
                    a.ask();
                }
                continue;
            }
            line = async { asker.as_mut().expect("asking").line().await }, if asking => {
                let Some(a) = asker.as_mut() else { continue };
                let Some(line) = line else {
                    // stdin closed: no more answers from here.
                    asker = None;
                    continue;
                };
                match a.answer(&line) {
                    Answer::Wait => {}
                    Answer::Decide { approve, always, reason } => {
                        super::prompt::decide(target, task, approve, always, reason).await;
                    }
                    Answer::Diff => {
                        match a.change() {
                            Some(d) => err!("{d}"),
                            None => super::prompt::task_changes(target, task).await,
                        }
                        a.ask_again();
                    }
                }
                continue;
            }
        };
        let Some(r) = r else { break };
        let text = match item(r) {
            Item::Record(rec) => {
                if let Some(a) = asker.as_mut() {
                    a.see(&rec.event);
                    ask_at = tokio::time::Instant::now() + SETTLE;
                }
                if let Some(p) = thinking.take() {
                    p.done().await;
                }
                if glance.names_a_stranger(&rec) {
                    glance.learn_names(worker_names(target).await);
                }
                let text = glance.record(&rec);
                match &rec.event {
                    proto::log::Event::LlmRequest { model, .. } => {
                        thinking = Some(super::progress::Progress::start(
                            format!("thinking ({model}; {tokens} tokens, ${usd:.4} so far)"),
                            false,
                        ));
                    }
                    proto::log::Event::LlmResponse {
                        prompt_tokens,
                        completion_tokens,
                        cost_usd,
                        response,
                        ..
                    } => {
                        tokens += prompt_tokens + completion_tokens;
                        usd += cost_usd;
                        if let Some(r) = response {
                            answers.push(crate::api::convert::log::response_from_wire(r));
                        }
                    }
                    proto::log::Event::Finished { outcome, .. } => end = outcome.clone(),
                    proto::log::Event::StatusChanged { status, .. }
                        if status == crate::model::Status::BudgetExhausted.as_str() =>
                    {
                        end = status.clone();
                    }
                    _ => {}
                }
                match text {
                    Some(t) => format!("{t}\n"),
                    None => continue,
                }
            }
            Item::Live(o) => glance.live(&o),
            Item::Broken(e) => format!("  (unreadable record: {e})\n"),
        };
        if out
            .write_all(shared::visible::visible(&text).as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            break;
        }
        if end == "budget_exhausted" {
            break;
        }
    }
    if let Some(file) = record {
        std::fs::write(file, crate::llm::to_transcript(&answers))
            .with_context(|| format!("writing the transcript {}", file.display()))?;
        err!(
            "recorded {} model answers to {} (replay with --model replay:{})",
            answers.len(),
            file.display(),
            file.display()
        );
    }
    if let Some(p) = thinking.take() {
        p.done().await;
    }
    err!("{task}: {end} ({tokens} tokens, ${usd:.4})");
    if end == crate::model::Status::BudgetExhausted.as_str() {
        err!(
            "continue with `brain task resume {task} --budget-usd X` (or --max-steps, --max-tokens, --max-wall)"
        );
    }
    Ok(end)
}

/// How a followed log is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// For a person at a glance ([`Glance`]).
    Glance,
    /// Every record in words, nothing cut.
    Full,
    /// The records themselves, one JSON object per line.
    Json,
}

impl View {
    pub fn pick(json: bool, full: bool) -> Self {
        match (json, full) {
            (true, _) => View::Json,
            (false, true) => View::Full,
            (false, false) => View::Glance,
        }
    }
}

/// Worker ids to names, for people (empty if the brain cannot say).
pub async fn worker_names(target: &Target) -> HashMap<String, String> {
    let Ok(mut c) = target.connect().await else {
        return HashMap::new();
    };
    match c.list_workers(proto::ListWorkersRequest {}).await {
        Ok(r) => r
            .into_inner()
            .workers
            .into_iter()
            .filter(|w| !w.name.is_empty())
            .map(|w| (w.id, w.name))
            .collect(),
        Err(_) => HashMap::new(),
    }
}

/// Prints a task's records after sequence number `since` (0: all), and with `live` what
/// follows until it ends; with `call`, only the call issued at that record. A closed stdout
/// (`brain watch ID | head`) ends it quietly (141).
pub async fn follow(
    target: &Target,
    task: &str,
    live: bool,
    view: View,
    since: u64,
    call: Option<u64>,
) -> anyhow::Result<()> {
    let mut glance = Glance::new(task, worker_names(target).await);
    let mut one = call.map(OneCall::new);
    let mut stream = task_log(target, task, live, since).await?;
    while let Some(r) = stream.message().await.map_err(|s| status(s, &target.url))? {
        let r = item(r);
        if let Item::Record(rec) = &r
            && view == View::Glance
            && glance.names_a_stranger(rec)
        {
            glance.learn_names(worker_names(target).await);
        }
        let text = match (r, view) {
            (Item::Record(rec), _) if one.as_mut().is_some_and(|o| !o.wants(&rec)) => continue,
            (Item::Live(_), _) if one.is_some() => continue,
            (Item::Record(rec), View::Json) => format!("{}\n", serde_json::to_string(&rec)?),
            (Item::Record(rec), View::Full) => format!("{}\n", describe_full(&rec)),
            (Item::Record(rec), View::Glance) => match glance.record(&rec) {
                Some(t) => format!("{t}\n"),
                None => continue,
            },
            // As the API writes it: the call id a string, like the records'.
            (Item::Live(o), View::Json) => format!("{}\n", serde_json::to_string(&o)?),
            // Live output of the running call and file changes, as they come.
            (Item::Live(o), View::Full) => super::render::describe_live(&o),
            (Item::Live(o), _) => glance.live(&o),
            (Item::Broken(e), View::Json) => format!("{}\n", serde_json::json!({ "error": e })),
            (Item::Broken(e), _) => format!("  (unreadable record: {e})\n"),
        };
        // A closed output pipe (`| head`) ends the command quietly. JSON escapes its own
        // control characters; words for people have theirs written out.
        let text = if view == View::Json {
            text.into()
        } else {
            shared::visible::visible(&text)
        };
        shared::stdout::write_or_exit(text.as_bytes());
    }
    Ok(())
}

/// `brain task move ID --to W --wait D`: asks for the move, then follows the task's log from
/// where it stood until the move completes (0), is aborted (1), the task ends first (1), or
/// `wait` passes (124, the move goes on). Progress on a terminal; the outcome on stdout.
pub async fn move_and_wait(
    target: &Target,
    task: &str,
    to: &str,
    wait: std::time::Duration,
) -> anyhow::Result<i32> {
    use proto::log::Event;
    // Where the log stands before the move is asked for, so an earlier move is not taken
    // for this one.
    let mut history = task_log(target, task, false, 0).await?;
    let mut last = 0;
    while let Some(r) = history
        .message()
        .await
        .map_err(|s| status(s, &target.url))?
    {
        if let Item::Record(rec) = item(r) {
            last = last.max(rec.seq);
        }
    }
    let mut c = target.connect().await?;
    let to = c
        .move_task(proto::MoveTaskRequest {
            task_id: task.into(),
            to: to.into(),
        })
        .await
        .map_err(|s| status(s, &target.url))?
        .into_inner()
        .to;
    let progress = super::progress::Progress::start(
        format!("{task}: waiting for its next tool-call boundary to move to {to}"),
        false,
    );
    let mut stream = task_log(target, task, true, last).await?;
    let outcome = tokio::time::timeout(wait, async {
        while let Some(r) = stream.message().await.map_err(|s| status(s, &target.url))? {
            let Item::Record(rec) = item(r) else { continue };
            match rec.event {
                Event::MoveStarted { to: t, .. } if t == to => {
                    progress.set(format!("{task}: moving to {to} (syncing its workspace)"));
                }
                Event::MoveCompleted {
                    to: t,
                    files,
                    wire_bytes,
                } if t == to => {
                    return Ok((
                        0,
                        format!(
                            "{task} moved to {to} ({files} files written, {wire_bytes} bytes sent)"
                        ),
                    ));
                }
                Event::MoveAborted { to: t, reason } if t == to => {
                    return Ok((
                        1,
                        format!("the move of {task} to {to} was aborted: {reason}"),
                    ));
                }
                _ => {}
            }
        }
        anyhow::Ok((1, format!("{task} ended before it moved to {to}")))
    })
    .await;
    progress.done().await;
    match outcome {
        Ok(Ok((0, said))) => {
            out!("{said}");
            Ok(0)
        }
        Ok(Ok((code, said))) => {
            err!("error: {said}");
            Ok(code)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => {
            err!(
                "{task} has not moved to {to} within {}; the move goes on (brain watch {task} shows it)",
                humantime::format_duration(wait)
            );
            Ok(shared::exit::ExitCode::TimedOut.code())
        }
    }
}

/// `brain task wait`: folds the task's log into its state as it comes (history, then what
/// is appended) until its status is one of `until` (empty: it ended or stopped for its
/// budget). The state changes only when a record is appended, so nothing is missed and
/// nothing is polled. 0: reached; 1: ended in another status; 124: `timeout` passed.
pub async fn wait(
    target: &Target,
    task: &str,
    until: &[crate::model::Status],
    timeout: Option<std::time::Duration>,
    json: bool,
) -> anyhow::Result<i32> {
    use crate::model::Status;
    let reached = |s: Status| {
        if until.is_empty() {
            !s.goes_on()
        } else {
            until.contains(&s)
        }
    };
    let fold = async {
        let mut st: Option<Seen> = None;
        let mut after = 0;
        let done = |st: &Option<Seen>| {
            st.as_ref()
                .filter(|s| reached(s.status) || s.status.is_terminal())
                .cloned()
        };
        // The history first, so a status the task passed through long ago is not taken
        // for the one it has now; then each record as it is appended.
        let mut live = false;
        loop {
            // A follow ends when the task ends; one stopped for its budget may be resumed.
            let mut stream = task_log(target, task, live, after).await?;
            while let Some(r) = stream.message().await.map_err(|s| status(s, &target.url))? {
                let Item::Record(rec) = item(r) else { continue };
                after = after.max(rec.seq);
                st.get_or_insert_with(|| Seen::new(&rec.task))
                    .see(&rec.event);
                if live && let Some(s) = done(&st) {
                    return anyhow::Ok(s);
                }
            }
            if let Some(s) = done(&st) {
                return Ok(s);
            }
            live = true;
        }
    };
    let st = match timeout {
        Some(t) => match tokio::time::timeout(t, fold).await {
            Ok(st) => st?,
            Err(_) => {
                err!(
                    "error: {task} did not reach {} within {}",
                    wanted(until),
                    humantime::format_duration(t)
                );
                return Ok(shared::exit::ExitCode::TimedOut.code());
            }
        },
        None => fold.await?,
    };
    let ok = reached(st.status);
    if json {
        out!(
            "{}",
            serde_json::json!({"id": st.id.to_string(), "status": st.status.as_str(), "reason": st.reason, "reached": ok})
        );
    } else {
        out!("{}", st.status.as_str());
    }
    if !ok {
        err!(
            "error: {} ended {} ({}), not {}",
            st.id,
            st.status.as_str(),
            st.reason,
            wanted(until)
        );
        return Ok(1);
    }
    Ok(0)
}

/// A task's status as its log tells it, record by record.
#[derive(Clone)]
struct Seen {
    id: String,
    status: crate::model::Status,
    reason: String,
}

impl Seen {
    fn new(id: &str) -> Self {
        Self {
            id: id.to_string(),
            status: crate::model::Status::Created,
            reason: String::new(),
        }
    }

    /// A status change, or the end (whose outcome is the status it ends in). A status this
    /// program does not know (a newer brain's) leaves the last one it knew.
    fn see(&mut self, e: &proto::log::Event) {
        use proto::log::Event as E;
        let (E::StatusChanged { status, reason }
        | E::Finished {
            outcome: status,
            reason,
            ..
        }) = e
        else {
            return;
        };
        if let Ok(s) = super::args::parse_status(status) {
            self.status = s;
            self.reason = reason.clone();
        }
    }
}

/// What `brain task wait` waits for, in words.
fn wanted(until: &[crate::model::Status]) -> String {
    if until.is_empty() {
        return "an end (or a stop for its budget)".into();
    }
    let names: Vec<&str> = until.iter().map(|s| s.as_str()).collect();
    names.join(" or ")
}
