//! The request a task's model received at one of its turns (`brain task prompt`): the task's
//! state rebuilt from its log up to that turn's record, rendered again, and checked against
//! the version and hash logged when it was sent, so what is shown is known to be the request
//! and not today's words for it.

use serde::Serialize;

use super::{Engine, Error};
use crate::llm;
use crate::model::event::{Event, Record};
use crate::model::prompt;
use crate::model::state::{TaskState, apply};

/// Which of a task's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The last one.
    Last,
    /// The one the model answered with the call of this step (as `task log` numbers them).
    Step(u32),
    /// The one logged at this record, or the last before it.
    Seq(u64),
}

/// A request as the model received it, with what is known of how exactly.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    pub task: String,
    /// The record that logged the request.
    pub seq: u64,
    /// 1 for the task's first request.
    pub turn: u32,
    pub model: String,
    pub tools: llm::ToolsSent,
    /// The version of the words it was sent with (`None`: logged before versions were).
    pub sent_version: Option<u32>,
    /// The version of the words it is shown with.
    pub version: u32,
    pub sent_hash: Option<String>,
    pub hash: String,
    /// Shown exactly as sent: this rendering's hash is the one logged.
    pub exact: bool,
    /// The request, as the provider passed it to the model's API.
    pub request: llm::Request,
}

impl Engine {
    /// The request of `turn` of the task `text`.
    pub async fn sent_request(&self, text: &str, turn: Turn) -> Result<Sent, Error> {
        let id = self.find(text)?.id;
        let mut records = Vec::new();
        for r in self.store().log().read(id, 0).await? {
            match r {
                Ok(r) => records.push(r),
                // The requests after a record this build cannot read are not shown.
                Err(_) => break,
            }
        }
        let (at, n) = pick(&records, turn).ok_or_else(|| match turn {
            Turn::Last | Turn::Seq(_) => Error::Invalid(format!(
                "task {id} has asked no model {}: it is not an agent task, or has not started",
                if matches!(turn, Turn::Seq(_)) {
                    "by that record"
                } else {
                    "yet"
                }
            )),
            Turn::Step(s) => Error::Invalid(format!(
                "task {id} has no step {s} that a model's answer started: see `brain task log {id}`"
            )),
        })?;
        let mut st = TaskState::new(id);
        for r in &records[..at] {
            apply(&mut st, r);
        }
        let Event::LlmRequest {
            model, rendered, ..
        } = &records[at].event
        else {
            unreachable!("pick returns a request's record");
        };
        let a = st.agent.as_deref().ok_or_else(|| {
            Error::Invalid(format!(
                "task {id} has no agent state before record {}",
                records[at].seq
            ))
        })?;
        let can_move = rendered.as_ref().is_some_and(|r| r.can_move);
        let tools = rendered
            .as_ref()
            .map_or_else(llm::ToolsSent::default, |r| r.tools);
        let request = prompt::as_sent(
            &prompt::request(a, can_move, super::agent::share(&st, a)),
            tools,
        );
        let hash = prompt::hash(&request);
        Ok(Sent {
            task: id.to_string(),
            seq: records[at].seq,
            turn: n,
            model: model.clone(),
            tools,
            sent_version: rendered.as_ref().map(|r| r.version),
            version: prompt::VERSION,
            exact: rendered.as_ref().is_some_and(|r| r.hash == hash),
            sent_hash: rendered.as_ref().map(|r| r.hash.clone()),
            hash,
            request,
        })
    }
}

/// The index in `records` of the request `turn` names, and its number among the requests.
fn pick(records: &[Record], turn: Turn) -> Option<(usize, u32)> {
    let mut last = None;
    let mut n = 0;
    for (i, r) in records.iter().enumerate() {
        match (&r.event, turn) {
            (Event::LlmRequest { .. }, Turn::Seq(s)) if r.seq > s => break,
            (Event::LlmRequest { .. }, _) => {
                n += 1;
                last = Some((i, n));
            }
            (Event::ToolCallIssued { step, .. }, Turn::Step(s)) if *step == s => return last,
            _ => {}
        }
    }
    match turn {
        Turn::Step(_) => None,
        Turn::Last | Turn::Seq(_) => last,
    }
}
