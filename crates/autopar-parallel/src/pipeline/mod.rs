//! Pipeline parallelism: the stages of a network and the schedules that run their
//! micro-batches.

pub mod schedule;

pub use schedule::{build, ideal_bubble, simulate, Action, Pass, PipelineShape, Schedule, ScheduleError, SimCosts, Simulation, Work};
