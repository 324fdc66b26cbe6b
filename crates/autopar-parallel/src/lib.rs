//! # autopar-parallel: from a graph and a parallel context to per-rank programs
//!
//! * [`ParallelContext`]: every option of MindSpore's `set_auto_parallel_context`, set by name,
//!   validated for type and range on `set`, for consistency on `validate`, and for what autopar
//!   implements on `check_supported` (an option whose behaviour is missing is an error, never
//!   silently ignored).

pub mod context;
pub mod error;

pub use context::{
    CommFusion, DatasetStrategy, FusionMode, ParallelContext, ParallelMode, ParallelOptimizerConfig, PipelineConfig, PipelineScheduler,
    SearchMode, StrategyCkptConfig, OPTION_NAMES,
};
pub use error::{ParallelError, Result};
