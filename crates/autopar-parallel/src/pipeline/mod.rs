//! Pipeline parallelism: the stages of a network, the schedules that run their micro-batches,
//! and the pieces each rank runs. The job itself ([`crate::JobPlan`]) is every job's type: a job
//! without stages is a pipeline of one stage.

pub mod chunks;
pub mod schedule;
pub mod stages;

pub use chunks::{boundary, ChunkProgram};
pub use schedule::{build, ideal_bubble, simulate, Action, Pass, PipelineShape, Schedule, ScheduleError, SimCosts, Simulation, Work};
pub use stages::{assign_stages, balance_stages, has_stages, number_chunks, split_before};
