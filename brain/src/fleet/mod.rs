//! The workers as the brain sees them: live sessions, calls routed over them, and where a
//! task may run. Knows nothing of tasks, their log or the engine.

pub mod hub;
