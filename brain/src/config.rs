//! The brain's config file (TOML, `<data>/config.toml` unless `--config` names another):
//! LLM providers, models and prices (`[llm]`), the defaults for agent tasks (`[agent]`),
//! how results are delivered (`[deliver]`), how tasks spread over workers (`[placement]`),
//! machines (`[provision]`) and the web API's limits and trusted proxies (`[web]`).
//! A missing file means every default; a bad one is an error that says where.
//!
//! ```toml
//! [llm]
//! default_model = "anthropic:claude-sonnet-4-5"
//! [llm.providers.openai]
//! base_url = "http://127.0.0.1:8000/v1"   # vLLM, llama.cpp, …
//! [llm.models."ollama:qwen2.5-coder"]
//! tool_mode = "text"
//!
//! [agent]
//! permission = "auto"
//! budget_usd = 2.0
//! max_steps = 100
//! max_wall = "1h"
//! allow_commands = ["cargo test*", "cargo build*", "ls*", "git status"]
//! allow_paths = ["src/**", "tests/**"]
//!
//! [deliver]                      # results of --git tasks as branches and pull requests
//! mode = "branch"                # none (default), branch or pr
//! git_token_env = "GITHUB_TOKEN" # the variable holding the push token (never in this file)
//! hosts = ["github.com", "api.github.com"]  # where the tokens may go (default: github_api's)
//! git_schemes = ["https", "ssh"] # transports --git URLs may use (add "http", "file")
//! git_internal_hosts = false     # allow hosts resolving to loopback/private/link-local
//!
//! [egress]                     # tasks' commands behind the egress proxy (`brain run --secret`)
//! preset = "registries"          # none (default), registries or all
//! allow = ["api.example.com:443 GET,HEAD"]
//!
//! [web]                        # the HTTP API (`brain serve --web-listen`)
//! trusted_proxies = ["127.0.0.1"]   # whose X-Forwarded-Host/-Proto/-For are believed
//! max_streams_per_credential = 8
//!
//! [placement]                  # how tasks spread over the workers
//! max_tasks_per_worker = 8       # a cap on every worker's own (`worker run --max-tasks`)
//! moves_per_worker = 4           # failovers and moves into one worker at once
//! steady_after = "60s"           # a worker that dropped 3 times in 5 min waits this long
//! failover_backoff = "60s"       # a task that failed over waits this long (doubling) to again
//!
//! [provision]
//! brain_url = "https://brain.example:7443"   # what provisioned workers dial
//! join_timeout = "2m"
//! ttl = "12h"
//! idle_timeout = "30m"
//! [provision.providers.ssh]
//! max_machines = 8
//! usd_per_hour = 0.05
//! ```

use crate::model::attempts::AttemptsSpec;
use std::path::Path;

use serde::Deserialize;

use crate::model::agent::{AgentSpec, Budget, Permission};
use crate::model::delivery::Mode;

/// What is wrong with the config file: unreadable, or a setting that does not hold (each
/// message names the setting and says what would do).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Invalid {
        path: String,
        #[source]
        source: Box<Error>,
    },
    /// Not TOML, or a key unknown or of the wrong type.
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    #[error("[llm.models.\"{model}\"] assists: {source}")]
    Assists {
        model: String,
        #[source]
        source: crate::model::assists::UnknownAssist,
    },
    /// `agent.max_wall` or `agent.check_timeout`.
    #[error("{setting}: {source}")]
    Duration {
        setting: &'static str,
        #[source]
        source: shared::ParseError,
    },
    #[error("[placement] {key} {value:?} is not a duration ({source}): write it as \"60s\"")]
    PlacementDuration {
        key: &'static str,
        value: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("[store] lease_ttl {0:?} is out of range: give 1s to 10m")]
    LeaseTtl(String),
    #[error("[placement] moves_per_worker must be at least 1")]
    NoMoves,
    #[error(transparent)]
    Provision(#[from] crate::provision::ConfigError),
    /// `[egress]`'s preset or allow-list, as the file or a task names them.
    #[error(transparent)]
    Preset(crate::model::egress::Error),
    #[error("allow-list entry: {0}")]
    AllowEntry(#[source] crate::model::egress::Error),
    /// An error of `[egress]` (a [`Error::Preset`] or [`Error::AllowEntry`]).
    #[error("egress: {0}")]
    Egress(#[source] Box<Error>),
    #[error(transparent)]
    Transport(#[from] crate::git::remote::Error),
    #[error("deliver.hosts: {0:?} is not a host or host:port (no scheme, path or wildcard)")]
    DeliverHost(String),
    #[error(
        "deliver.github_api's host {0} is not in deliver.hosts: the GitHub token would go to a host it is not for; add it or change github_api"
    )]
    ApiHost(String),
    #[error("deliver.branch_prefix {0:?} cannot start a git branch name")]
    BranchPrefix(String),
    #[error("agent allow-list pattern {pattern:?}: {source}")]
    Pattern {
        pattern: String,
        #[source]
        source: globset::Error,
    },
}

/// Why a request's choices for a new task (its model, its attempts) cannot be taken.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(
        "no model given and no default: pass --model (e.g. openai:gpt-4.1, anthropic:claude-sonnet-4-5, ollama:qwen2.5-coder) or set llm.default_model in the config"
    )]
    NoModel,
    #[error(transparent)]
    Model(#[from] crate::llm::Error),
    #[error("at most {max} attempts per task (asked for {count})", max = crate::model::attempts::MAX_ATTEMPTS)]
    TooManyAttempts { count: u32 },
    #[error("at most {max} --escalate-model", max = crate::model::attempts::MAX_ESCALATIONS)]
    TooManyEscalations,
    #[error("at most {max} --attempt-model", max = crate::model::attempts::MAX_ATTEMPTS)]
    TooManyModels,
    #[error("model {model:?}: {source}")]
    AttemptModel {
        model: String,
        #[source]
        source: crate::llm::Error,
    },
    #[error(transparent)]
    Pick(#[from] crate::model::word::UnknownWord),
    #[error("the attempts' temperature must be from 0 to 2 (got {0})")]
    Temperature(f32),
    #[error(
        "--pick, --attempt-model and --attempt-temperature need --attempts N (N of at least 2)"
    )]
    NeedsAttempts,
    #[error(transparent)]
    Assists(#[from] crate::model::assists::UnknownAssist),
}

impl shared::exit::Classify for Error {
    /// An unreadable or invalid config file: running again will not fix it.
    fn exit_code(&self) -> Option<shared::exit::ExitCode> {
        Some(shared::exit::ExitCode::Config)
    }
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub llm: crate::llm::LlmConfig,
    pub agent: AgentConfig,
    pub deliver: DeliverConfig,
    pub provision: crate::provision::ProvisionConfig,
    pub egress: EgressConfig,
    pub web: WebConfig,
    pub placement: PlacementConfig,
    pub store: StoreConfig,
    /// The file this was read from, when there was one: a local worker's commands may not
    /// read it (it may hold an LLM key).
    #[serde(skip)]
    pub file: Option<std::path::PathBuf>,
}

/// Where the brain keeps its state: sled in the data dir (the default), or a PostgreSQL
/// database shared by several `brain serve` replicas.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (`brain serve --store` wins over it).
    pub url: Option<String>,
    /// The name this replica holds task leases under (`brain serve --replica` wins).
    /// Default: the host's name and the port it listens on.
    pub replica: Option<String>,
    /// How long a task's lease lasts unless renewed (renewed at a third of it): how soon
    /// another replica takes over the tasks of one that died. Default "10s"; 1s to 10m.
    pub lease_ttl: Option<String>,
}

impl StoreConfig {
    /// The lease's time to live.
    pub fn lease_ttl(&self) -> Result<std::time::Duration, Error> {
        let Some(v) = &self.lease_ttl else {
            return Ok(std::time::Duration::from_secs(10));
        };
        let d = shared::parse_duration(v).map_err(|source| Error::Duration {
            setting: "store.lease_ttl",
            source,
        })?;
        if !(std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(600)).contains(&d) {
            return Err(Error::LeaseTtl(v.clone()));
        }
        Ok(d)
    }
}

/// How tasks spread over the workers.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlacementConfig {
    /// A cap on every worker's capacity (0: each worker's own, `worker run --max-tasks`).
    pub max_tasks_per_worker: u32,
    /// Moves into one worker under way at once (failovers, moves without a target).
    pub moves_per_worker: u32,
    /// A worker whose session ended 3 times within 5 minutes gets no new tasks until it has
    /// been connected this long.
    pub steady_after: String,
    /// A task that failed over waits at least this long before failing over again
    /// (doubling each time, to 10 minutes).
    pub failover_backoff: String,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            max_tasks_per_worker: 0,
            moves_per_worker: 4,
            steady_after: "60s".into(),
            failover_backoff: "60s".into(),
        }
    }
}

impl PlacementConfig {
    /// Checks the section; returns (steady_after, failover_backoff).
    pub fn durations(&self) -> Result<(std::time::Duration, std::time::Duration), Error> {
        let duration = |key: &'static str, v: &str| {
            humantime::parse_duration(v).map_err(|source| Error::PlacementDuration {
                key,
                value: v.to_string(),
                source,
            })
        };
        if self.moves_per_worker == 0 {
            return Err(Error::NoMoves);
        }
        Ok((
            duration("steady_after", &self.steady_after)?,
            duration("failover_backoff", &self.failover_backoff)?,
        ))
    }
}

/// The web API's limits and the reverse proxies it believes.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Addresses (`IP` or `IP/PREFIX`) of reverse proxies whose `X-Forwarded-Host`,
    /// `X-Forwarded-Proto` and `X-Forwarded-For` are believed; from any other peer those
    /// headers are ignored. None by default.
    pub trusted_proxies: Vec<String>,
    /// Event streams one credential may hold open at once; one more is answered 429.
    pub max_streams_per_credential: usize,
    /// Connections the web listener serves at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (from when it opens, or
    /// from the end of its previous answer) before it is closed.
    pub header_read_timeout: String,
    /// The most bytes of a diff the API answers; a longer one is cut, with a last line that
    /// says so.
    pub max_diff_bytes: u64,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            trusted_proxies: vec![],
            max_streams_per_credential: 8,
            max_connections: 256,
            header_read_timeout: "5s".into(),
            max_diff_bytes: 8 * 1024 * 1024,
        }
    }
}

/// The egress proxy's defaults: what a task behind it may reach besides its secrets' hosts,
/// and how the brain connects upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// The allow-list preset of tasks that do not name one: none, registries or all.
    pub preset: String,
    /// Entries every task behind the proxy gets (`HOST[:PORTS] [METHODS]`, `pass:HOST`).
    pub allow: Vec<String>,
    /// PEM files of CAs the brain trusts upstream besides the public roots (a private
    /// registry's, or a test's).
    pub upstream_ca: Vec<std::path::PathBuf>,
    /// Host names the brain resolves to these addresses instead of asking DNS (as curl's
    /// `--resolve`), for split-horizon names and tests.
    pub resolve: std::collections::BTreeMap<String, std::net::IpAddr>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            preset: "none".into(),
            allow: vec![],
            upstream_ca: vec![],
            resolve: Default::default(),
        }
    }
}

impl EgressConfig {
    /// A task's allow-list: its preset (or this file's) and this file's entries, then the
    /// task's own.
    pub fn allow_list(
        &self,
        preset: &str,
        extra: &[String],
    ) -> Result<Vec<crate::model::egress::AllowRule>, Error> {
        use crate::model::egress::{AllowRule, preset as rules_of};
        let mut rules = rules_of(if preset.is_empty() {
            &self.preset
        } else {
            preset
        })
        .map_err(Error::Preset)?;
        for a in self.allow.iter().chain(extra) {
            rules.push(AllowRule::parse(a).map_err(Error::AllowEntry)?);
        }
        Ok(rules)
    }
}

/// How `--git` tasks' results are delivered. Tokens are read from the environment variables
/// named here, by the brain only: never written to a file, a log or a worker.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverConfig {
    /// Unless `brain run --deliver` says: `none`, `branch` or `pr`.
    pub mode: Mode,
    /// Delivered branches are `<prefix><task-id>` (and `-wip` for unfinished tasks).
    pub branch_prefix: String,
    /// The author and committer of delivered commits.
    pub author_name: String,
    pub author_email: String,
    /// The user name sent with the push token over HTTPS (GitHub: `x-access-token`).
    pub git_username: String,
    /// The variable holding the token for the brain's HTTPS clones and pushes. Unset or empty:
    /// the brain user's own git credentials (its credential helpers, its ssh keys).
    pub git_token_env: String,
    /// GitHub's REST API (GitHub Enterprise: `https://HOST/api/v3`).
    pub github_api: String,
    /// The variable holding the token for pull requests.
    pub github_token_env: String,
    /// Pull requests are opened as drafts.
    pub draft: bool,
    /// The hosts the tokens are for (`host`, or `host:port` off 443). The git token is
    /// given only to an `https` remote on one of them, and `github_api` must be one.
    /// Empty: `github_api`'s host and, for `api.HOST`, `HOST`.
    pub hosts: Vec<String>,
    /// The transports `--git` URLs may use: `https` and `ssh` unless this names others
    /// (`http`, `git`, `file` for local paths).
    pub git_schemes: Vec<String>,
    /// Whether `--git` hosts may resolve to internal addresses (loopback, private,
    /// link-local: the brain's own host and network).
    pub git_internal_hosts: bool,
}

impl Default for DeliverConfig {
    fn default() -> Self {
        Self {
            mode: Mode::None,
            branch_prefix: "tether/".into(),
            author_name: "Tether".into(),
            author_email: "tether@localhost".into(),
            git_username: "x-access-token".into(),
            git_token_env: "TETHER_GIT_TOKEN".into(),
            github_api: "https://api.github.com".into(),
            github_token_env: "GITHUB_TOKEN".into(),
            draft: true,
            hosts: Vec::new(),
            git_schemes: vec!["https".into(), "ssh".into()],
            git_internal_hosts: false,
        }
    }
}

impl DeliverConfig {
    /// The settings git works with, tokens read from the environment now.
    pub fn settings(&self) -> crate::git::Settings {
        let env = |v: &str| match v {
            "" => String::new(),
            v => std::env::var(v).unwrap_or_default(),
        };
        crate::git::Settings {
            mode: self.mode,
            branch_prefix: self.branch_prefix.clone(),
            author: crate::git::commit::Author {
                name: self.author_name.clone(),
                email: self.author_email.clone(),
            },
            creds: crate::git::Credentials {
                username: self.git_username.clone(),
                password: env(&self.git_token_env),
                hosts: self.token_hosts(),
            },
            github_api: self.github_api.clone(),
            github_token: env(&self.github_token_env),
            draft: self.draft,
            remotes: crate::git::remote::Policy {
                transports: self.git_schemes.clone(),
                internal_hosts: self.git_internal_hosts,
                resolve: Default::default(),
            },
        }
    }

    /// `github_api`'s authority: `host`, or `host:port` off its scheme's default port.
    fn api_authority(&self) -> Option<String> {
        let (scheme, rest) = self.github_api.split_once("://")?;
        let authority = rest.split('/').next()?.to_ascii_lowercase();
        let default = if scheme.eq_ignore_ascii_case("http") {
            ":80"
        } else {
            ":443"
        };
        Some(
            authority
                .strip_suffix(default)
                .unwrap_or(&authority)
                .to_string(),
        )
    }

    /// The hosts the tokens are for (see [`DeliverConfig::hosts`]).
    pub fn token_hosts(&self) -> Vec<String> {
        if !self.hosts.is_empty() {
            return self
                .hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect();
        }
        let Some(api) = self.api_authority() else {
            return Vec::new();
        };
        let mut out = vec![api.clone()];
        if let Some(git) = api.strip_prefix("api.") {
            out.push(git.to_string());
        }
        out
    }

    /// Checks the hosts and transports.
    fn validate(&self) -> Result<(), Error> {
        self.settings().remotes.validate()?;
        for h in &self.hosts {
            let host = h.trim();
            let ok = !host.is_empty()
                && !host.contains("://")
                && !host.contains('/')
                && !host.contains('*');
            if !ok {
                return Err(Error::DeliverHost(h.clone()));
            }
        }
        if !self.hosts.is_empty()
            && let Some(api) = self.api_authority()
            && !self.token_hosts().contains(&api)
        {
            return Err(Error::ApiHost(api));
        }
        Ok(())
    }
}

/// Defaults for agent tasks; `brain run` flags override them per task.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    pub permission: Permission,
    /// Money budget per task in USD (0: none).
    pub budget_usd: f64,
    /// Token budget per task (0: none).
    pub max_tokens: u64,
    /// LLM calls per task (0: none).
    pub max_steps: u32,
    /// Wall time per task, e.g. "30m" ("0s": none).
    pub max_wall: String,
    /// `auto` permission: command lines (globs) that run without asking.
    pub allow_commands: Vec<String>,
    /// `auto` permission: paths (globs) that may be written without asking.
    pub allow_paths: Vec<String>,
    /// The same failing call this many times in a row earns a note; two more stop the task.
    pub repeat_limit: u32,
    /// The acceptance check for tasks that name none and whose repository has no
    /// `.tether/check` (a shell command; exit 0: done). Empty: none.
    pub check: String,
    /// How long one run of the check may take, e.g. "10m".
    pub check_timeout: String,
    /// Files the check relies on (globs, e.g. `tests/**`): the model's file tools may not
    /// change them, and they are put back before every run of the check.
    pub protect: Vec<String>,
    /// Attempts per task (`brain run --attempts`): 1 runs the task once.
    pub attempts: u32,
    /// The sampling temperature of every attempt after the first (the first samples at the
    /// model server's own).
    pub attempt_temperature: f32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            permission: Permission::Ask,
            budget_usd: 2.0,
            max_tokens: 0,
            max_steps: 50,
            max_wall: "30m".into(),
            allow_commands: vec![],
            allow_paths: vec![],
            repeat_limit: 3,
            check: String::new(),
            check_timeout: "10m".into(),
            protect: vec![],
            attempts: 1,
            attempt_temperature: 0.9,
        }
    }
}

impl Config {
    /// Reads `path`; a missing file gives the defaults.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let shown = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(Error::Read {
                    path: shown,
                    source,
                });
            }
        };
        let mut c = Self::parse(&text).map_err(|e| Error::Invalid {
            path: shown,
            source: Box::new(e),
        })?;
        c.file = Some(std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()));
        Ok(c)
    }

    pub fn parse(text: &str) -> Result<Self, Error> {
        let c: Config = toml::from_str(text)?;
        let duration = |setting: &'static str, v: &str| {
            shared::parse_duration(v).map_err(|source| Error::Duration { setting, source })
        };
        duration("agent.max_wall", &c.agent.max_wall)?;
        duration("agent.check_timeout", &c.agent.check_timeout)?;
        c.provision.policy()?;
        c.placement.durations()?;
        c.store.lease_ttl()?;
        c.egress
            .allow_list("", &[])
            .map_err(|e| Error::Egress(Box::new(e)))?;
        c.deliver.validate()?;
        for (model, m) in &c.llm.models {
            if let Some(choice) = &m.assists {
                crate::model::assists::Assists::from_choice(choice).map_err(|source| {
                    Error::Assists {
                        model: model.clone(),
                        source,
                    }
                })?;
            }
        }
        let prefix = &c.deliver.branch_prefix;
        if prefix.starts_with('-')
            || prefix.contains("..")
            || prefix
                .chars()
                .any(|ch| ch.is_control() || " ~^:?*[\\".contains(ch))
        {
            return Err(Error::BranchPrefix(prefix.clone()));
        }
        for p in c
            .agent
            .allow_commands
            .iter()
            .chain(&c.agent.allow_paths)
            .chain(&c.agent.protect)
        {
            globset::Glob::new(p).map_err(|source| Error::Pattern {
                pattern: p.clone(),
                source,
            })?;
        }
        Ok(c)
    }

    /// The spec of a new agent task: the request's choices over this file's defaults.
    pub fn agent_spec(
        &self,
        model: &str,
        permission: Option<Permission>,
        budget: Budget,
    ) -> Result<AgentSpec, RequestError> {
        let a = &self.agent;
        let model = if !model.is_empty() {
            model.to_string()
        } else {
            self.llm
                .default_model
                .clone()
                .ok_or(RequestError::NoModel)?
        };
        model.parse::<crate::llm::ModelSpec>()?;
        let assists = crate::model::assists::Assists::for_model(&model, &self.llm, None)?;
        let wall = shared::parse_duration(&a.max_wall).unwrap_or_default();
        let pick = |x: f64, d: f64| if x > 0.0 { x } else { d };
        Ok(AgentSpec {
            model,
            permission: permission.unwrap_or(a.permission),
            budget: Budget {
                usd: pick(budget.usd, a.budget_usd),
                tokens: if budget.tokens > 0 {
                    budget.tokens
                } else {
                    a.max_tokens
                },
                steps: if budget.steps > 0 {
                    budget.steps
                } else {
                    a.max_steps
                },
                wall_ms: if budget.wall_ms > 0 {
                    budget.wall_ms
                } else {
                    wall.as_millis() as u64
                },
            },
            allow_commands: a.allow_commands.clone(),
            allow_paths: a.allow_paths.clone(),
            repeat_limit: a.repeat_limit.max(1),
            transcript: String::new(),
            // The request's, or the repository's, is chosen at creation; this is the default.
            check: (!a.check.trim().is_empty()).then(|| crate::model::agent::Check {
                command: a.check.trim().to_string(),
                timeout_ms: shared::parse_duration(&a.check_timeout)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0),
                source: crate::model::check::CheckSource::Config,
                protect: a.protect.clone(),
            }),
            egress: None,
            sampling: None,
            no_agents_md: false,
            assists: Some(assists),
        })
    }

    /// How a task runs as attempts, from a request's `--attempts` (0: the config's),
    /// `--pick`, `--attempt-model`, `--attempt-temperature` and `--escalate-model`; `None`:
    /// it runs once. Every model named must be one the brain can use.
    pub fn attempts_spec(
        &self,
        req: AttemptsRequest<'_>,
    ) -> Result<Option<AttemptsSpec>, RequestError> {
        use crate::model::attempts::{MAX_ATTEMPTS, MAX_ESCALATIONS};
        let count = if req.count > 0 {
            req.count
        } else {
            self.agent.attempts.max(1)
        };
        if count > MAX_ATTEMPTS {
            return Err(RequestError::TooManyAttempts { count });
        }
        if req.escalate.len() > MAX_ESCALATIONS as usize {
            return Err(RequestError::TooManyEscalations);
        }
        if req.models.len() > MAX_ATTEMPTS as usize {
            return Err(RequestError::TooManyModels);
        }
        for m in req.models.iter().chain(req.escalate) {
            m.parse::<crate::llm::ModelSpec>()
                .map_err(|source| RequestError::AttemptModel {
                    model: m.clone(),
                    source,
                })?;
        }
        let pick = match req.pick {
            "" => Default::default(),
            p => p.parse()?,
        };
        let temperature = req.temperature.unwrap_or(self.agent.attempt_temperature);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(RequestError::Temperature(temperature));
        }
        if count == 1 {
            // Flags that only mean something with several attempts are refused, not dropped.
            if !req.models.is_empty() || !req.pick.is_empty() || req.temperature.is_some() {
                return Err(RequestError::NeedsAttempts);
            }
            if req.escalate.is_empty() {
                return Ok(None);
            }
        }
        Ok(Some(AttemptsSpec {
            count,
            pick,
            temperature: Some(temperature),
            models: req.models.to_vec(),
            escalate: req.escalate.to_vec(),
            worker: String::new(),
        }))
    }
}

/// What a request asks of attempts (see [`Config::attempts_spec`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptsRequest<'a> {
    pub count: u32,
    pub pick: &'a str,
    pub models: &'a [String],
    pub temperature: Option<f32>,
    pub escalate: &'a [String],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placement_section_is_checked() {
        let c = Config::parse(
            "[placement]\nmax_tasks_per_worker = 3\nsteady_after = \"2m\"\nfailover_backoff = \"5s\"",
        )
        .unwrap();
        assert_eq!(c.placement.max_tasks_per_worker, 3);
        let (steady, backoff) = c.placement.durations().unwrap();
        assert_eq!(
            (steady, backoff),
            (
                std::time::Duration::from_secs(120),
                std::time::Duration::from_secs(5)
            )
        );
        let err = Config::parse("[placement]\nsteady_after = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("steady_after") && err.contains("soon"),
            "{err}"
        );
        let err = Config::parse("[placement]\nmoves_per_worker = 0")
            .unwrap_err()
            .to_string();
        assert!(err.contains("moves_per_worker must be at least 1"), "{err}");
        assert!(
            Config::parse("[placement]\nmax_tasks = 3").is_err(),
            "unknown key"
        );
    }

    #[test]
    fn a_file_sets_defaults_and_requests_override_them() {
        let c = Config::parse(
            r#"
[llm]
default_model = "openai:gpt-4.1-mini"
[agent]
permission = "auto"
budget_usd = 0.5
allow_commands = ["cargo test*"]
"#,
        )
        .unwrap();
        let s = c.agent_spec("", None, Budget::default()).unwrap();
        assert_eq!(s.model, "openai:gpt-4.1-mini");
        assert_eq!(s.permission, Permission::Auto);
        assert_eq!(
            (s.budget.usd, s.budget.steps, s.budget.wall_ms),
            (0.5, 50, 1_800_000)
        );
        let s = c
            .agent_spec(
                "anthropic:claude-sonnet-4-5",
                Some(Permission::Full),
                Budget {
                    usd: 3.0,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            (s.model.as_str(), s.permission, s.budget.usd),
            ("anthropic:claude-sonnet-4-5", Permission::Full, 3.0)
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(
            Config::parse("[agent]\npermision = \"ask\"")
                .unwrap_err()
                .to_string()
                .contains("permision")
        );
        assert!(
            Config::parse("[agent]\nmax_wall = \"soon\"")
                .unwrap_err()
                .to_string()
                .contains("max_wall")
        );
        assert!(Config::parse("[agent]\npermission = \"yolo\"").is_err());
        assert!(
            Config::default()
                .agent_spec("", None, Budget::default())
                .unwrap_err()
                .to_string()
                .contains("--model")
        );
    }
}
