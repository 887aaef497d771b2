//! The workers as the brain sees them: live sessions and the calls routed over them (`hub`),
//! and where a task may run (`placement`). Knows nothing of tasks, their log or the engine.

pub mod hub;
pub mod placement;
pub mod session;
