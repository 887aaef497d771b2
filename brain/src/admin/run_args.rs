//! `brain run`'s flags and the budget flags it shares with `brain task resume`: what an
//! agent task (or a scripted plan) is started with, and which of them a plan refuses.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;

/// Budgets of an agent task (unset: the config file's defaults).
#[derive(Args, Clone, Default)]
pub struct BudgetArgs {
    /// Money budget in USD
    #[arg(long)]
    pub budget_usd: Option<f64>,
    /// Token budget (prompt + completion)
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Most LLM calls
    #[arg(long)]
    pub max_steps: Option<u32>,
    /// Wall time, e.g. 30m
    #[arg(long, value_parser = shared::parse_duration)]
    pub max_wall: Option<Duration>,
}

impl BudgetArgs {
    pub fn to_proto(&self) -> anyhow::Result<proto::Budget> {
        if let Some(u) = self.budget_usd
            && !(u.is_finite() && u > 0.0)
        {
            bail!("--budget-usd must be a positive number of dollars, not {u}");
        }
        Ok(proto::Budget {
            usd: self.budget_usd.unwrap_or(0.0),
            tokens: self.max_tokens.unwrap_or(0),
            steps: self.max_steps.unwrap_or(0),
            wall_ms: self.max_wall.map_or(0, |d| d.as_millis() as u64),
        })
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// What the agent should achieve
    pub goal: Option<String>,
    /// Worker id or unique name (default: any connected worker)
    #[arg(long)]
    pub worker: Option<String>,
    /// The model: openai:gpt-4.1, anthropic:claude-sonnet-4-5, ollama:qwen2.5-coder, or
    /// replay:FILE to replay a recorded transcript without an API key (default: the config's)
    #[arg(long)]
    pub model: Option<String>,
    /// read-only, ask (every change waits for `brain approve`), auto (the config's
    /// allow-lists run, the rest asks) or full (default: the config's)
    #[arg(long)]
    pub permission: Option<String>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Write the model's answers to FILE as a transcript that `--model replay:FILE` replays
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Print the task id and return instead of following the task
    #[arg(long)]
    pub detach: bool,
    /// The acceptance check: a shell command run in the workspace when the model calls
    /// `finish` (exit 0: done, the task ends verified; otherwise the model sees why and goes
    /// on). Default: the repository's `.tether/check`, else `[agent] check` in the config
    #[arg(long)]
    pub check: Option<String>,
    /// How long one run of the check may take
    #[arg(long, value_parser = shared::parse_duration)]
    pub check_timeout: Option<std::time::Duration>,
    /// Files the check relies on (a glob, repeatable, e.g. `test_*.py`): the model may not
    /// change them with its file tools, and they are put back as the task started before
    /// every run of the check
    #[arg(long = "protect")]
    pub protect: Vec<String>,
    /// A secret (by name, see `brain secret list`) the task's commands may use: they get
    /// its placeholder in its environment variable, and requests to the hosts it is bound
    /// to get the value put in by the brain on the way out (repeatable). Puts the commands
    /// behind the egress proxy
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Let the task's commands reach this host besides its secrets' hosts (repeatable):
    /// `HOST[:PORT[,PORT]]` directly, `HOST[:PORTS] GET,HEAD` with only those methods (seen
    /// through the brain), `pass:HOST` never intercepted (pinned certificates). `*.suffix`
    /// matches names under it. Puts the commands behind the egress proxy
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// The allow-list preset: `none`, `registries` (the common package registries) or
    /// `all` (any host, still through the proxy). Default: `[egress] preset` in the config
    /// (none). Puts the commands behind the egress proxy
    #[arg(long, value_parser = ["none", "registries", "all"])]
    pub egress: Option<String>,
    /// Start from this git repository: the brain clones it (shallow) with its own
    /// credentials and the worker gets the files, never the credentials
    #[arg(long)]
    pub git: Option<String>,
    /// Branch or tag of --git
    #[arg(long, requires = "git")]
    pub git_ref: Option<String>,
    /// How a --git task's result is delivered when it finishes: `branch` pushes a commit
    /// as branch tether/<task> to the repository, `pr` opens a pull request for it too, `none`
    /// leaves it to `brain task diff|patch|export|deliver`. Default: [deliver] mode in the
    /// config (none). Followed, `brain run` waits for the delivery and exits 1 if it failed
    #[arg(long, requires = "git", value_parser = ["branch", "pr", "none"])]
    pub deliver: Option<String>,
    /// Start from a copy of this directory on the task's worker, named with --worker (the
    /// laptop case; a relative path is taken from here, for a worker on this machine). Only
    /// what the brain lacks is sent; the agent works on the copy
    #[arg(long, conflicts_with = "git")]
    pub dir: Option<PathBuf>,
    /// Sync the workspace's .git/ too (left out by default)
    #[arg(long)]
    pub include_git: bool,
    /// Also leave this file or directory name out of the workspace's sync, wherever it is
    /// (besides .gitignore and the defaults target, node_modules, .venv, __pycache__)
    #[arg(long = "exclude", value_name = "NAME")]
    pub excludes: Vec<String>,
    /// Do not leave out the default build outputs (target, node_modules, .venv, __pycache__)
    #[arg(long)]
    pub no_default_excludes: bool,
    /// A label (k=v) the task's worker must have, now and when the task moves or fails over;
    /// repeatable
    #[arg(long = "require-label", value_name = "K=V", value_parser = shared::parse_label)]
    pub require_labels: Vec<(String, String)>,
    /// Run a scripted plan from this JSON file instead of the agent. Its commands run under
    /// --secret, --allow and --egress as an agent's do; the agent's own flags (--model,
    /// budgets, --check, --git, --dir, --deliver, ...) are refused with it
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// The goal (same as GOAL; for scripted plans, shown in `brain tasks`)
    #[arg(long = "goal", hide = true)]
    pub goal_flag: Option<String>,
    /// Run N attempts from the same base, each a task of its own on a worker of its own
    /// where there are enough, and let the check pick the winner; the task's result is the
    /// winner's. Default: [agent] attempts in the config (1)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16))]
    pub attempts: Option<u32>,
    /// Which verified attempt wins: `first` (the others are stopped) or `smallest` (all run
    /// to their end; the fewest changed lines wins)
    #[arg(long, value_parser = ["first", "smallest"])]
    pub pick: Option<String>,
    /// A model for the attempts after the first, in turn with --model; repeatable
    #[arg(long = "attempt-model", value_name = "MODEL")]
    pub attempt_models: Vec<String>,
    /// The sampling temperature of the attempts after the first. Default: [agent]
    /// attempt_temperature in the config (0.9)
    #[arg(long, value_name = "T")]
    pub attempt_temperature: Option<f32>,
    /// When no attempt passes the check, one more attempt on this model, told how the check
    /// ended on the others; repeatable, tried in order (cheap local models first)
    #[arg(long = "escalate-model", value_name = "MODEL")]
    pub escalate_models: Vec<String>,
    /// Do not show the model the repository's AGENTS.md (or CLAUDE.md where there is none),
    /// which it otherwise reads with the goal as the repository's instructions
    #[arg(long)]
    pub no_agents_md: bool,
    /// Which of the loop's assists (accommodations for small models) the model gets:
    /// `small` (all), `native` (what helps any model: the check's result and the code in
    /// view, a truthful finish), `none`, or names and families, e.g. `small,-restart`.
    /// Default: the model's `[llm.models.NAME] assists`, else by its tool mode (text:
    /// small, native: native). `brain config assists` lists them
    #[arg(long, value_name = "LIST")]
    pub assists: Option<String>,
}

/// Why the agent's flags do not apply to a scripted plan, and what to do instead.
const NO_MODEL: &str = "a plan runs no model; drop it (the plan's steps are the whole task)";
const NO_BUDGET: &str = "a plan spends no tokens or model steps; drop it and bound each step with its \"timeout\" in the plan (default 10m)";
const NO_CHECK: &str = "a plan has no acceptance check; make the check the plan's last step (a \"run\" step that fails fails the task), or give a step its own \"check\"";
const NO_SOURCE: &str = "a plan starts from an empty workspace; drop it and write the files the plan needs with \"write\" steps, or run an agent task with it";
const NO_ATTEMPTS: &str =
    "a plan runs its steps once, the same each time; attempts are for the agent (drop it)";
const NO_DELIVERY: &str = "a plan is not delivered (it takes no --git); drop it and get the result with `brain task patch` or `brain task export`";

impl RunArgs {
    /// The flags given that a scripted plan (`--plan`) cannot honour, each with why and
    /// what to do instead. The egress flags (`--secret`, `--allow`, `--egress`), `--worker`,
    /// `--require-label`, `--goal` and `--detach` apply to plans too.
    pub fn not_for_plans(&self) -> Vec<(&'static str, &'static str)> {
        let b = &self.budget;
        [
            ("--model", self.model.is_some(), NO_MODEL),
            ("--permission", self.permission.is_some(), NO_MODEL),
            ("--record", self.record.is_some(), NO_MODEL),
            ("--assists", self.assists.is_some(), NO_MODEL),
            ("--budget-usd", b.budget_usd.is_some(), NO_BUDGET),
            ("--max-tokens", b.max_tokens.is_some(), NO_BUDGET),
            ("--max-steps", b.max_steps.is_some(), NO_BUDGET),
            ("--max-wall", b.max_wall.is_some(), NO_BUDGET),
            ("--check", self.check.is_some(), NO_CHECK),
            ("--check-timeout", self.check_timeout.is_some(), NO_CHECK),
            ("--protect", !self.protect.is_empty(), NO_CHECK),
            ("--git", self.git.is_some(), NO_SOURCE),
            ("--git-ref", self.git_ref.is_some(), NO_SOURCE),
            ("--dir", self.dir.is_some(), NO_SOURCE),
            ("--include-git", self.include_git, NO_SOURCE),
            ("--exclude", !self.excludes.is_empty(), NO_SOURCE),
            ("--no-default-excludes", self.no_default_excludes, NO_SOURCE),
            ("--deliver", self.deliver.is_some(), NO_DELIVERY),
            ("--attempts", self.attempts.is_some(), NO_ATTEMPTS),
            ("--pick", self.pick.is_some(), NO_ATTEMPTS),
            (
                "--attempt-model",
                !self.attempt_models.is_empty(),
                NO_ATTEMPTS,
            ),
            (
                "--attempt-temperature",
                self.attempt_temperature.is_some(),
                NO_ATTEMPTS,
            ),
            (
                "--escalate-model",
                !self.escalate_models.is_empty(),
                NO_ATTEMPTS,
            ),
        ]
        .into_iter()
        .filter(|(_, given, _)| *given)
        .map(|(flag, _, why)| (flag, why))
        .collect()
    }
}
