//! The workers as the brain sees them: live sessions and the calls routed over them (`hub`),
//! what each connected worker has and runs, in memory (`board`), the pure choice of one
//! (`choice`), and where a task may run (`placement`). Knows tasks only by number; nothing of their log or the engine.

pub mod board;
pub mod choice;
pub mod hub;
pub mod placement;
pub mod session;
