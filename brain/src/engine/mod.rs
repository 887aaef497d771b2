//! The task engine: the durable log, the store that appends and applies, the supervisor that
//! runs one driver per task, and the drivers (scripted plans, the agent). Acts on workers and
//! machines only through its ports; never sees wire types.

pub mod agent;
pub mod log;
pub mod manager;
pub mod runner;
