//! Durable tasks: the event log (the truth), the pure state machine rebuilt from it, the task
//! manager that resumes every unfinished task on start, and the scripted-plan runner.

pub mod event;
pub mod log;
pub mod manager;
pub mod runner;
pub mod state;

pub use event::{Event, Outcome, Plan, Record, Step, TaskId, ToolCall, ToolResult};
pub use state::{Status, TaskState, apply};
