//! The pure model of a task: its log records, the state `apply` rebuilds from them, the agent's
//! state, the tools offered to the model and the prompt around them, and what is asked of a
//! worker. No I/O, no clock, no wire types.

pub mod agent;
pub mod assists;
pub mod attempt;
pub mod attempts;
pub mod check;
pub mod delivery;
pub mod edits;
pub mod egress;
pub mod env;
pub mod event;
pub mod ids;
mod keep;
pub mod ops;
pub mod prompt;
pub mod replace;
pub mod state;
pub mod stuck;
pub mod task;
pub mod text;
pub mod tools;
pub mod word;

pub use event::{Event, Outcome, Plan, Record, Step, TaskId, ToolCall, ToolResult};
pub use state::{Status, TaskState, apply};
