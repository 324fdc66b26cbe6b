//! # autopar-parallel: every parallel decision, planned as data
//!
//! * [`ParallelContext`]: every option of MindSpore's `set_auto_parallel_context`, set by name,
//!   validated for type and range on `set`, for consistency on `validate`, and for what autopar
//!   implements on `check_supported` (an option whose behaviour is missing is an error, never
//!   silently ignored).
//! * [`assemble_job`]: the one entry point that assembles a job ([`JobPlan`]) from a network, a
//!   [`ParallelContext`] (its defaults applied: [`ParallelContext::resolved`]), the strategy
//!   files it names (read here: [`strategy_files`]), micro-batches and a device profile. A job
//!   without pipeline stages is a pipeline of one stage; [`JobPlan::program`] is what one rank
//!   runs ([`JobProgram`]). The trainer, `autopar plan` and the Python package all call it.
//! * [`plan_network`] / [`plan_hybrid`]: the planner of one network on one stage's devices. A graph (with its loss) and a context become a
//!   [`ParallelPlan`] holding each op's strategy and where it came from, the layout of every
//!   value, every redistribution (forward; its backward is the adjoint), the ops tied to the
//!   whole tensor (synchronised statistics, dropout blocks, table rows), each parameter's mirror
//!   group, the gradient buckets and loss seeding, and the dataset strategy. Every mode is
//!   planned here: stand_alone, data_parallel (all-batch strategies), semi_auto_parallel and
//!   hybrid_parallel (the user's rank graphs, checked). The sharding rules themselves live with
//!   each op in `autopar-graph`.
//! * [`rank_program`]: plan -> one rank's whole training step ([`RankProgram`]): local forward
//!   graph with the communication inserted, backward by autodiff (the collectives' exact
//!   adjoints), gradient buckets, the parameters the optimizer updates.
//! * [`pipeline`]: pipeline stages (from the model or cut by FLOPs), the schedules (GPipe,
//!   1F1B, interleaved) as data with a simulator that checks them under blocking sends, and
//!   the pieces ([`pipeline::ChunkProgram`]) a rank of a pipeline runs.
//! * [`strategy_files`]: strategy checkpoint files, operator strategy files and group-info
//!   files of a job, read and written (MindSpore's formats).
//! * [`optimizer_shard`]: the parallel optimizer: which parameters are sharded over which
//!   ranks (and why the others are not; the rule itself in [`shard_rule`], which the searches'
//!   memory model applies too), and their fused all-gathers and reduce-scatters.
//! * [`RankCost`]: what a rank's step is predicted to cost: FLOPs, bytes per collective kind
//!   and group, memory.
//!
//! ```
//! use autopar_graph::{DType, GraphBuilder, Initializer};
//! use autopar_parallel::{plan_network, ParallelContext, PlanRequest};
//! use serde_json::json;
//!
//! let mut b = GraphBuilder::new(0);
//! let x = b.input("x", &[32, 16], DType::F32)?;
//! let y = b.input("y", &[32], DType::I32)?;
//! let w = b.parameter("fc.weight", &[8, 16], Initializer::HeUniform)?;
//! let logits = b.matmul_t("fc", x, w, false, true)?;
//! b.shard(logits, "((2, 2), (1, 2))".parse()?)?; // rows over 2, the contracted dimension over 2
//! let loss = b.softmax_cross_entropy("loss", logits, y)?;
//! let graph = b.finish();
//!
//! let mut ctx = ParallelContext::new();
//! ctx.set("parallel_mode", &json!("semi_auto_parallel"))?;
//! ctx.set("device_num", &json!(4))?;
//! let plan = plan_network(&PlanRequest { graph: &graph, loss: Some(loss), context: &ctx, strategy_file: None, profile: None })?;
//! // fc.weight is split by columns over 2 devices and mirrored over the other 2: its gradient is
//! // all-reduced over the ranks holding the same slice.
//! let fc = plan.param("fc.weight").expect("planned");
//! assert_eq!(fc.layout.slice_shape(), vec![8, 8]);
//! assert_eq!(fc.mirror_group(0).len(), 2);
//! println!("{}", plan.describe()); // every decision, as `autopar plan` prints it
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod analysis;
pub mod assemble;
pub mod context;
pub mod cost;
pub mod error;
pub mod job;
pub mod optimizer_shard;
pub mod pipeline;
pub mod plan;
pub mod planner;
pub mod program;
pub mod report;
pub mod search;
pub mod shard_rule;
pub mod strategy_files;
pub mod testing;

pub use analysis::reshape_layout;
pub use assemble::{assemble_job, default_micro_batches, micro_batch_size, JobRequest};
pub use context::{
    CommFusion, DatasetStrategy, FusionMode, OpStrategyConfig, OpStrategyMode, OptimizerLevel, ParallelContext, ParallelMode,
    ParallelOptimizerConfig, PipelineConfig, PipelineScheduler, SearchMode, SearchOptions, StrategyCkptConfig, OPTION_NAMES,
    SEARCH_OPTION_NAMES,
};
pub use cost::{CommVolume, Memory, RankCost, Recomputed};
pub use error::{Conflict, DatasetProblem, HybridProblem, ParallelError, PipelineProblem, Result, TransferProblem};
pub use job::{plan_stages, JobPlan, JobProgram, Passes, SharedGroup, DEFAULT_CHUNKS};
pub use optimizer_shard::{group_name, OptDecision, OptShard, ShardBucketPlan};
pub use plan::{AdjointStep, BucketPlan, GradientPlan, InOpSync, NodePlan, ParallelPlan, ParamPlan, Redistribution, Site, StrategySource};
pub use planner::{
    compare_searches, fusion_buckets, plan, plan_hybrid, plan_network, strategy_item_names, PlanRequest, StrategyItems,
    DEFAULT_FUSION_BYTES,
};
pub use program::{rank_program, InputSlot, ParamSlot, RankBucket, RankProgram, RankShardBucket, SlotShard};
pub use report::parameter_layout_dict;
pub use search::{DeviceProfile, LeverTry, LeversChosen, OpChoice, Search, SearchReport};
pub use testing::{assign_random_layouts, assign_random_strategies};
