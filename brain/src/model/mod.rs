//! The pure model of a task: its log records, the state `apply` rebuilds from them, the agent's
//! state and the tools offered to the model. No I/O, no clock, no wire types.

pub mod agent;
pub mod event;
pub mod state;
pub mod tools;

pub use event::{Event, Outcome, Plan, Record, Step, TaskId, ToolCall, ToolResult};
pub use state::{Status, TaskState, apply};
