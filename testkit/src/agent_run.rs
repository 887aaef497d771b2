//! Starting an agent task the way tests do: a brain whose model providers are the fake
//! ([`BrainOptions::with_llm`]), and `brain run --detach` built a flag at a time
//! ([`Cluster::agent`]), with the task's id back, or followed to its end.

use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::fake_llm::FakeLlm;
use crate::{BrainOptions, Cluster, replay_turn, stdout, text};

impl BrainOptions {
    /// A brain whose `openai` and `anthropic` providers are `llm` (the fake), with `key` as
    /// their API key (tests that look for a key leaking choose their own), and `extra` config
    /// after them (TOML that starts with a table of its own: `[deliver]`, `[agent]`, ...).
    pub fn with_llm(llm: &FakeLlm, key: &str, extra: &str) -> Self {
        Self {
            config: Some(format!(
                "[llm.providers.openai]\nbase_url = \"{}\"\napi_key = \"{key}\"\n\
                 [llm.providers.anthropic]\nbase_url = \"{}\"\napi_key = \"{key}\"\n{extra}",
                llm.url(),
                llm.base()
            )),
            ..Self::default()
        }
    }
}

impl Cluster {
    /// An agent task to start with `brain run --detach`: the model `openai:gpt-4.1` with
    /// full permission unless the builder says otherwise.
    pub fn agent(&self) -> AgentRun<'_> {
        AgentRun {
            cluster: self,
            model: "openai:gpt-4.1".into(),
            permission: "full".into(),
            args: vec![],
        }
    }
}

/// `brain run --detach` of an agent task, a flag at a time ([`Cluster::agent`]).
pub struct AgentRun<'a> {
    cluster: &'a Cluster,
    model: String,
    permission: String,
    args: Vec<String>,
}

impl AgentRun<'_> {
    pub fn model(mut self, model: &str) -> Self {
        self.model = model.into();
        self
    }

    /// The model `replay:FILE`, FILE a transcript (in the cluster's directory) of one answer
    /// per `(tool, arguments)` of `turns`, each calling that tool ([`replay_turn`]).
    pub fn replay(self, turns: &[(&str, serde_json::Value)]) -> Self {
        static FILES: AtomicUsize = AtomicUsize::new(0);
        let n = FILES.fetch_add(1, Ordering::Relaxed);
        let file = self.cluster.dir.join(format!("replay-{n}.jsonl"));
        let lines: Vec<String> = turns
            .iter()
            .enumerate()
            .map(|(i, (tool, args))| replay_turn(i + 1, tool, args.clone()))
            .collect();
        std::fs::write(&file, lines.join("\n")).expect("write the transcript");
        self.model(&format!("replay:{}", file.display()))
    }

    /// `--permission`; empty: none given, the brain's configured default.
    pub fn permission(mut self, permission: &str) -> Self {
        self.permission = permission.into();
        self
    }

    pub fn worker(self, worker: &str) -> Self {
        self.args(&["--worker", worker])
    }

    pub fn check(self, check: &str) -> Self {
        self.args(&["--check", check])
    }

    /// More flags, as `brain run` takes them.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Runs `brain run --detach ... GOAL` and gives its output, whatever it is.
    pub fn try_start(self, goal: &str) -> Output {
        self.run(true, goal)
    }

    /// Runs `brain run ... GOAL` followed to its end, as a person would, and gives its
    /// output, whatever it is.
    pub fn follow(self, goal: &str) -> Output {
        self.run(false, goal)
    }

    fn run(self, detach: bool, goal: &str) -> Output {
        let mut all = vec!["run"];
        if detach {
            all.push("--detach");
        }
        all.extend(["--model", &self.model]);
        if !self.permission.is_empty() {
            all.extend(["--permission", &self.permission]);
        }
        all.extend(self.args.iter().map(String::as_str));
        all.push(goal);
        self.cluster.brain_cli(&all)
    }

    /// Starts the task and gives its id; panics with the CLI's words if it was refused.
    pub fn start(self, goal: &str) -> String {
        let out = self.try_start(goal);
        assert!(out.status.success(), "brain run: {}", text(&out));
        stdout(&out).trim().to_string()
    }
}
