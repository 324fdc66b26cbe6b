//! # autopar-parallel: from a graph and a parallel context to per-rank programs
//!
//! * [`ParallelContext`]: every option of MindSpore's `set_auto_parallel_context`, set by name,
//!   validated for type and range on `set`, for consistency on `validate`, and for what autopar
//!   implements on `check_supported` (an option whose behaviour is missing is an error, never
//!   silently ignored).
//! * [`rules`]: the sharding rule of every op, as logical loop dimensions (MatMul
//!   `[b.., i, k, j]`) that a strategy splits; device matrices and tensor maps follow
//!   MindSpore's (repeat axis on the right, size-1 axes squeezed).
//! * [`planner`]: the pure functions graph + context -> [`ParallelPlan`] (each node's
//!   strategy and layouts) -> [`RankProgram`] (each rank's local forward graph, with the
//!   redistributions of `autopar-layout`'s planner inserted as communication ops). Backward
//!   comes from autodiff of that local graph: the collectives' exact adjoints make it correct.

pub mod context;
pub mod error;
pub mod planner;
pub mod rules;

pub use context::{
    CommFusion, DatasetStrategy, FusionMode, ParallelContext, ParallelMode, ParallelOptimizerConfig, PipelineConfig, PipelineScheduler,
    SearchMode, StrategyCkptConfig, OPTION_NAMES,
};
pub use error::{ParallelError, Result};
pub use planner::{parameter_layout_dict, plan, rank_program, reshape_layout, InputSlot, NodePlan, ParallelPlan, ParamSlot, RankProgram};
pub use rules::{assign_random_strategies, op_rule, Cost, LogicalDim, OpRule, OpSpec, Sharding};
