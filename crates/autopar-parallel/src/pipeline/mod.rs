//! Pipeline parallelism: the stages of a network and the schedules that run their
//! micro-batches.

pub mod program;
pub mod report;
pub mod schedule;
pub mod stages;

pub use program::{boundary, plan_pipeline, stage_program, ChunkProgram, PipelinePlan, StageProgram, DEFAULT_CHUNKS};
pub use report::{pipeline_layout_dict, pipeline_report, PipelineReport, StageReport};
pub use schedule::{build, ideal_bubble, simulate, Action, Pass, PipelineShape, Schedule, ScheduleError, SimCosts, Simulation, Work};
pub use stages::{assign_stages, balance_stages, has_stages, is_stageless, number_chunks, split_before};
