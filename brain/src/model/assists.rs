//! The assists: each accommodation the agent loop makes for a model that needs it (a small
//! model above all), named, in one registry with why it exists and the figure that
//! justified it, and switchable per model (`[llm.models.NAME] assists`) and per run
//! (`brain run --assists`).
//!
//! An assist changes one of three things: the request the model reads, how its reply is
//! read, or what the loop decides. Everything an assist does is gated on the task's
//! [`Assists`], fixed when the task is created, so a config change never changes a running
//! task's rules and a replayed task decides alike. What is not an assist applies to every
//! model: the verified finish, permissions, budgets, the guard that stops a task as `stuck`,
//! eliding old outputs near the context window.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::llm::{TextAssists, ToolMode};

/// What an assist changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changes {
    /// The request the model reads.
    Request,
    /// How the model's reply is read.
    Reply,
    /// What the loop decides.
    Decision,
}

impl Changes {
    pub fn as_str(self) -> &'static str {
        match self {
            Changes::Request => "request",
            Changes::Reply => "reply",
            Changes::Decision => "decision",
        }
    }
}

/// One accommodation. The order is the registry's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Assist {
    BlockEdits,
    ForgivingEdits,
    CallFormatNudge,
    OneCallPerReply,
    HistoryAsCalls,
    RepeatTemperature,
    CodeInView,
    CheckAfterChanges,
    UndoRegression,
    FinishForModel,
    TalkIsFinish,
    Restart,
    LoopNotes,
    WithdrawRefused,
    FinishAlone,
}

/// An assist's entry in the registry.
#[derive(Debug)]
pub struct Entry {
    pub assist: Assist,
    /// Its name in the config and on the command line.
    pub name: &'static str,
    /// The family it is switched off with in the ablation (`cargo bench --bench agent`).
    pub family: &'static str,
    pub changes: Changes,
    /// On by default in native tool-call mode: it helps any model.
    pub native: bool,
    /// What it does.
    pub what: &'static str,
    /// Why it exists, and the figure that justified it.
    pub why: &'static str,
}

/// Every assist, in one list. `docs/agent.md` has the ablation table these figures come
/// from; a new assist is a new entry here, gated where it acts, with a test.
pub const REGISTRY: &[Entry] = &[
    Entry {
        assist: Assist::BlockEdits,
        name: "block_edits",
        family: "edits",
        changes: Changes::Reply,
        native: false,
        what: "text mode: SEARCH/REPLACE blocks, fenced blocks naming a file and blocks that \
               begin one definition are taken as edit_file/write_file calls; the tool section \
               shows the SEARCH/REPLACE format",
        why: "small models write fixes as blocks of code, not JSON calls: the agent bench's \
              tether row solved 0 of 12 before it, and 0 of 12 with the edits family off \
              against 5 of 12 with all assists on (Qwen2.5-Coder-1.5B, one attempt)",
    },
    Entry {
        assist: Assist::ForgivingEdits,
        name: "forgiving_edits",
        family: "edits",
        changes: Changes::Reply,
        native: false,
        what: "an edit whose lines match but for indent, trailing spaces or read_file's line \
               numbers applies; one that does not fit is told the file's lines most like it",
        why: "small models copy lines with the wrong indent or with the line numbers they were \
              shown; each failed edit costs a turn of a ten-turn budget",
    },
    Entry {
        assist: Assist::CallFormatNudge,
        name: "call_format_nudge",
        family: "nudges",
        changes: Changes::Request,
        native: false,
        what: "text mode: a reply without a call is answered with the exact call format and an \
               example (running the check, or reading a file)",
        why: "a small model that talks instead of calling talks again when told only to go on; \
              shown the format it calls",
    },
    Entry {
        assist: Assist::OneCallPerReply,
        name: "one_call_per_reply",
        family: "nudges",
        changes: Changes::Reply,
        native: false,
        what: "text mode: only the first call of a reply runs, and the model is told which did \
               not",
        why: "a small model writes a plan of calls blind (an edit, then `finish` before seeing \
              the test fail); one call a reply makes it see each result",
    },
    Entry {
        assist: Assist::HistoryAsCalls,
        name: "history_as_calls",
        family: "history",
        changes: Changes::Request,
        native: false,
        what: "text mode: the model's earlier replies are shown as their calls only, block \
               edits as a line naming the files they changed",
        why: "shown its own words, a small model writes its failed fix again word for word",
    },
    Entry {
        assist: Assist::RepeatTemperature,
        name: "repeat_temperature",
        family: "history",
        changes: Changes::Request,
        native: false,
        what: "text mode: a reply that repeats an earlier one word for word is followed by a \
               request at a higher temperature (1.0, then 0.2 more, at most 1.4)",
        why: "at its usual temperature a small model gives the same wrong answer whatever it \
              is told",
    },
    Entry {
        assist: Assist::CodeInView,
        name: "code_in_view",
        family: "code_in_view",
        changes: Changes::Request,
        native: true,
        what: "the first message, every failing run of the check and every failing command \
               that names a file carry the source around the lines the output names",
        why: "saves the model a read per failure; any model reads the failing line first",
    },
    Entry {
        assist: Assist::CheckAfterChanges,
        name: "check_after_changes",
        family: "check_driven",
        changes: Changes::Decision,
        native: true,
        what: "after every reply that changed the workspace the check runs and the model hears \
               how it went",
        why: "a model cannot tell whether a change helped without running the check; this \
              saves it the call",
    },
    Entry {
        assist: Assist::UndoRegression,
        name: "undo_regression",
        family: "check_driven",
        changes: Changes::Decision,
        native: false,
        what: "changes that make the check fail after it passed are undone back to the version \
               it passed on",
        why: "a small model goes on editing after the check passes and breaks what worked",
    },
    Entry {
        assist: Assist::FinishForModel,
        name: "finish_for_model",
        family: "check_driven",
        changes: Changes::Decision,
        native: false,
        what: "a model that goes round in circles, stops calling tools or runs out of budget on \
               a version the check passed on is finished for: the check runs on it and decides",
        why: "a small model that has fixed the code often never calls finish",
    },
    Entry {
        assist: Assist::TalkIsFinish,
        name: "talk_is_finish",
        family: "check_driven",
        changes: Changes::Reply,
        native: false,
        what: "once the check passes after the model acted, a reply that only talks is taken as \
               its finish",
        why: "a small model says it is done instead of calling finish",
    },
    Entry {
        assist: Assist::Restart,
        name: "restart",
        family: "restart",
        changes: Changes::Decision,
        native: false,
        what: "a model that stops making progress on changes the check never passed on has them \
               undone back to the task's start, once, and begins again",
        why: "a small model anchors on its own failed fix; from the start it tries another",
    },
    Entry {
        assist: Assist::LoopNotes,
        name: "loop_notes",
        family: "loop_notes",
        changes: Changes::Request,
        native: false,
        what: "a failing call repeated, a loop of calls, or a failing command run again on the \
               same files earns the model a note to change its approach",
        why: "small models run the failing tests over and over; the stop as stuck stays \
              either way",
    },
    Entry {
        assist: Assist::WithdrawRefused,
        name: "withdraw_refused",
        family: "loop_notes",
        changes: Changes::Request,
        native: false,
        what: "a request_environment that did not move the task is not offered again",
        why: "small models ask for the same machine over and over",
    },
    Entry {
        assist: Assist::FinishAlone,
        name: "finish_alone",
        family: "finish",
        changes: Changes::Decision,
        native: true,
        what: "a finish written in the same reply as other calls is not taken: they run, and \
               the model is told to finish alone once it has seen their results",
        why: "a finish beside calls whose results it has not seen is a claim it cannot know \
              to be true",
    },
];

impl Assist {
    pub fn entry(self) -> &'static Entry {
        REGISTRY
            .iter()
            .find(|e| e.assist == self)
            .expect("every assist is in the registry")
    }

    pub fn name(self) -> &'static str {
        self.entry().name
    }
}

/// The assists a task runs with. Serialized as their names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assists(BTreeSet<Assist>);

/// How a set of assists is chosen (`small`, `native`, `none`, names and families).
pub use crate::llm::AssistChoice as Choice;

/// A name that is neither an assist, a family nor a preset.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown assist {0:?}: use small, native, none, or names and families from `brain config assists` ({1})"
)]
pub struct UnknownAssist(String, String);

impl Assists {
    /// Every assist (what a task created before assists could be switched ran with).
    pub fn all() -> Self {
        Assists(REGISTRY.iter().map(|e| e.assist).collect())
    }

    pub fn none() -> Self {
        Assists(BTreeSet::new())
    }

    /// What helps any model: the check's result and the code in view, a truthful finish.
    pub fn native() -> Self {
        Assists(
            REGISTRY
                .iter()
                .filter(|e| e.native)
                .map(|e| e.assist)
                .collect(),
        )
    }

    /// The default for a tool mode: all of them in text mode (the mode of models without
    /// native tool calls, small ones), [`Self::native`] in native mode.
    pub fn default_for(mode: ToolMode) -> Self {
        match mode {
            ToolMode::Text => Self::all(),
            ToolMode::Native => Self::native(),
        }
    }

    pub fn on(&self, a: Assist) -> bool {
        self.0.contains(&a)
    }

    pub fn iter(&self) -> impl Iterator<Item = Assist> + '_ {
        self.0.iter().copied()
    }

    pub fn names(&self) -> Vec<String> {
        self.iter().map(|a| a.name().to_string()).collect()
    }

    /// From names (unknown ones are refused: a switch that cannot apply is never dropped).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self, UnknownAssist> {
        let mut set = BTreeSet::new();
        for n in names {
            let n = n.as_ref().trim();
            if n.is_empty() {
                continue;
            }
            let found: Vec<Assist> = match n {
                "small" | "all" => REGISTRY.iter().map(|e| e.assist).collect(),
                "native" => Self::native().iter().collect(),
                "none" => vec![],
                _ => REGISTRY
                    .iter()
                    .filter(|e| e.name == n || e.family == n)
                    .map(|e| e.assist)
                    .collect(),
            };
            if found.is_empty() && n != "none" {
                return Err(UnknownAssist(n.to_string(), known().join(", ")));
            }
            set.extend(found);
        }
        Ok(Assists(set))
    }

    /// From a choice; `-name` in a list takes an assist or family away from what comes
    /// before it (`["small", "-restart"]`).
    pub fn from_choice(c: &Choice) -> Result<Self, UnknownAssist> {
        match c {
            Choice::Preset(p) => Self::from_list(&p.split(',').collect::<Vec<_>>()),
            Choice::List(l) => Self::from_list(l),
        }
    }

    fn from_list<S: AsRef<str>>(items: &[S]) -> Result<Self, UnknownAssist> {
        let mut set = Assists::none();
        for i in items {
            let i = i.as_ref().trim();
            match i.strip_prefix('-') {
                Some(off) => {
                    let off = Self::from_names(&[off])?;
                    set.0.retain(|a| !off.on(*a));
                }
                None => set.0.extend(Self::from_names(&[i])?.0),
            }
        }
        Ok(set)
    }

    /// The assists for `model` when a run names none: the model's `[llm.models.NAME]
    /// assists`, or the default for its tool mode.
    pub fn for_model(
        model: &str,
        llm: &crate::llm::LlmConfig,
        chosen: Option<&Choice>,
    ) -> Result<Self, UnknownAssist> {
        let entry = llm.models.get(model);
        match chosen.or(entry.and_then(|m| m.assists.as_ref())) {
            Some(c) => Self::from_choice(c),
            None => Ok(Self::default_for(
                entry.and_then(|m| m.tool_mode).unwrap_or_default(),
            )),
        }
    }

    /// What the text tool-call wrapper in `llm` is to do.
    pub fn text(&self) -> TextAssists {
        TextAssists {
            edit_blocks: self.on(Assist::BlockEdits),
            one_call: self.on(Assist::OneCallPerReply),
            history_as_calls: self.on(Assist::HistoryAsCalls),
            repeat_temperature: self.on(Assist::RepeatTemperature),
        }
    }
}

/// Every name `--assists` takes: presets, families, assists.
pub fn known() -> Vec<String> {
    let mut names: Vec<String> = ["small", "native", "none"].map(String::from).to_vec();
    for e in REGISTRY {
        if !names.iter().any(|n| n == e.family) {
            names.push(e.family.to_string());
        }
    }
    names.extend(REGISTRY.iter().map(|e| e.name.to_string()));
    names
}

impl Serialize for Assists {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Assists {
    /// Names this build does not know (a newer brain's) are dropped: an assist only ever
    /// helps, and the log must stay readable.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        Ok(Assists(
            names
                .iter()
                .filter_map(|n| REGISTRY.iter().find(|e| e.name == n).map(|e| e.assist))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_assist_is_registered_once_with_a_name_family_and_reason() {
        let mut names = BTreeSet::new();
        for e in REGISTRY {
            assert!(names.insert(e.name), "{} twice", e.name);
            assert!(!e.why.is_empty() && !e.what.is_empty(), "{}", e.name);
            assert_eq!(e.assist.name(), e.name);
        }
        let families: BTreeSet<_> = REGISTRY.iter().map(|e| e.family).collect();
        assert!(families.len() <= 8, "{families:?}");
        for f in &families {
            assert!(!names.contains(f) || REGISTRY.iter().all(|e| e.name != *f || e.family == *f));
        }
    }

    #[test]
    fn presets_families_and_subtraction() {
        let p = |s: &str| Assists::from_choice(&Choice::Preset(s.into())).unwrap();
        assert_eq!(p("small"), Assists::all());
        assert_eq!(p("none"), Assists::none());
        assert_eq!(p("native"), Assists::native());
        assert!(Assists::native().on(Assist::CodeInView));
        assert!(Assists::native().on(Assist::CheckAfterChanges));
        assert!(Assists::native().on(Assist::FinishAlone));
        assert!(!Assists::native().on(Assist::TalkIsFinish));
        let nudges = p("nudges");
        assert_eq!(
            nudges.iter().collect::<Vec<_>>(),
            vec![Assist::CallFormatNudge, Assist::OneCallPerReply]
        );
        let l = Assists::from_choice(&Choice::List(vec!["small".into(), "-edits".into()])).unwrap();
        assert!(!l.on(Assist::BlockEdits) && !l.on(Assist::ForgivingEdits));
        assert!(l.on(Assist::Restart));
        assert_eq!(p("small,-restart").0.len(), REGISTRY.len() - 1);
        let e = Assists::from_choice(&Choice::Preset("bogus".into())).unwrap_err();
        assert!(e.to_string().contains("\"bogus\""), "{e}");
        assert!(e.to_string().contains("block_edits"), "{e}");
    }

    #[test]
    fn defaults_by_tool_mode_and_per_model_config() {
        let mut llm = crate::llm::LlmConfig::default();
        assert_eq!(
            Assists::for_model("openai:x", &llm, None).unwrap(),
            Assists::native()
        );
        let text: crate::llm::ModelConfig = toml::from_str("tool_mode = \"text\"").expect("config");
        llm.models.insert("openai:x".into(), text);
        assert_eq!(
            Assists::for_model("openai:x", &llm, None).unwrap(),
            Assists::all()
        );
        let none = Choice::Preset("none".into());
        assert_eq!(
            Assists::for_model("openai:x", &llm, Some(&none)).unwrap(),
            Assists::none()
        );
        let chosen: crate::llm::ModelConfig =
            toml::from_str("tool_mode = \"text\"\nassists = [\"code_in_view\"]").expect("config");
        llm.models.insert("openai:x".into(), chosen);
        let got = Assists::for_model("openai:x", &llm, None).unwrap();
        assert_eq!(got.names(), vec!["code_in_view"]);
    }

    #[test]
    fn the_log_form_is_the_names_and_drops_unknown_ones() {
        let a = Assists::native();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(
            json,
            r#"["code_in_view","check_after_changes","finish_alone"]"#
        );
        let back: Assists =
            serde_json::from_str(r#"["code_in_view","from_a_newer_brain"]"#).unwrap();
        assert_eq!(back.names(), vec!["code_in_view"]);
    }
}
