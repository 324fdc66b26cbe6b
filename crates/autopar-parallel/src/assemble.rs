//! The one entry point that assembles a job ([`assemble_job`]) from a network, a parallel
//! context, micro-batches, a pipeline split and a device profile: the context's defaults, its
//! strategy files read, what autopar does not run refused up front, then the network planned in
//! its stages. The trainer, `autopar plan` and the Python package all call it, so they plan
//! alike.

use autopar_graph::precision::{self, Precision};
use autopar_graph::{Graph, NodeId, RecomputeChoice};

use crate::context::{ParallelContext, ParallelMode};
use crate::error::{ParallelError, Result};
use crate::job::{plan_stages, JobPlan};
use crate::pipeline::stages::{balance_stages, has_stages, split_before};
use crate::planner::PlanRequest;
use crate::search::{DeviceProfile, RecomputeChosen};
use crate::strategy_files::load_plan_strategies;

/// What to assemble into a job.
#[derive(Clone, Copy, Debug)]
pub struct JobRequest<'a> {
    /// The network, built for one micro-batch (the global batch divided by `micro_batches`).
    pub graph: &'a Graph,
    /// The loss of a training job (None: inference, whose outputs are what the graph computes).
    pub loss: Option<NodeId>,
    /// The parallel options. Its strategy files (`strategy_ckpt_config.load_file`,
    /// `op_strategy_config` LOAD) are read here.
    pub context: &'a ParallelContext,
    /// Micro-batches per step (None: the default, [`default_micro_batches`]).
    pub micro_batches: Option<usize>,
    /// Where pipeline stages begin: the first op of each stage after the first, in network order
    /// (empty: the model's own stages, else stages of about equal FLOPs).
    pub pipeline_split: &'a [String],
    /// The device profile of auto_parallel's cost model (None: the built-in one).
    pub profile: Option<&'a DeviceProfile>,
    /// What the backward pass recomputes (a training job's; inference has no backward pass).
    pub recompute: &'a RecomputeChoice,
    /// Which ops compute in half precision ([`autopar_graph::precision`]; O0: none).
    pub precision: Precision,
}

impl<'a> JobRequest<'a> {
    /// A request for `graph` under `context`, every other field at its default.
    pub fn new(graph: &'a Graph, loss: Option<NodeId>, context: &'a ParallelContext) -> Self {
        Self {
            graph,
            loss,
            context,
            micro_batches: None,
            pipeline_split: &[],
            profile: None,
            recompute: &RecomputeChoice::AsBuilt,
            precision: Precision::default(),
        }
    }
}

/// Micro-batches per step when none are given: one per stage of a pipeline (so that every stage
/// has work), one without.
pub fn default_micro_batches(ctx: &ParallelContext) -> usize {
    ctx.pipeline_stages.max(1)
}

/// The size of one micro-batch of a global batch of `batch_size` rows cut into `micro_batches`
/// (which must divide it).
pub fn micro_batch_size(batch_size: usize, micro_batches: usize) -> Result<usize> {
    if micro_batches == 0 || batch_size == 0 || !batch_size.is_multiple_of(micro_batches) {
        return Err(ParallelError::MicroBatches { given: micro_batches, batch: batch_size });
    }
    Ok(batch_size / micro_batches)
}

/// The one entry point that assembles a job: the context's defaults applied
/// ([`ParallelContext::resolved`]), its strategy files read, what autopar does not run refused,
/// the pipeline split applied, then the network planned in its stages (one stage without a
/// pipeline).
pub fn assemble_job(req: &JobRequest<'_>) -> Result<JobPlan> {
    let ctx = req.context.resolved()?;
    let micro_batches = req.micro_batches.unwrap_or_else(|| default_micro_batches(&ctx));
    if micro_batches == 0 {
        return Err(ParallelError::MicroBatches { given: 0, batch: 0 });
    }
    if ctx.pipeline_result_broadcast && req.loss.is_some() {
        return Err(ParallelError::ResultBroadcastInTraining);
    }
    if ctx.parallel_mode == ParallelMode::HybridParallel {
        return Err(ParallelError::Hybrid { problem: crate::error::HybridProblem::NeedsRankGraphs });
    }
    let items = load_plan_strategies(&ctx)?;
    let mut graph = req.graph.clone();
    graph.apply_recompute(req.recompute)?;
    if !req.pipeline_split.is_empty() {
        split_before(&mut graph, ctx.pipeline_stages, req.pipeline_split, req.loss, ctx.pipeline_config.pipeline_interleave)?;
    }
    // The precision policy's casts, once the network's ops have their stages and marks: each
    // cast takes its reader's (one cast per stage reading a value). A pipeline the model did
    // not place is balanced first, so that the casts do not count in its cuts.
    let p = ctx.pipeline_stages.max(1);
    if req.precision.is_mixed() && p > 1 && !has_stages(&graph) && !ctx.pipeline_config.pipeline_interleave {
        balance_stages(&mut graph, p);
    }
    let (graph, loss) = if req.precision.is_mixed() {
        let applied = precision::apply(&graph, &req.precision, req.loss)?;
        tracing::debug!(casts = applied.casts, policy = %req.precision, "precision policy applied");
        (applied.graph, applied.loss)
    } else {
        (graph, req.loss)
    };
    let resolved = JobRequest { loss, ..*req };
    let req = &resolved;
    let network = PlanRequest { graph: &graph, loss: req.loss, context: &ctx, strategy_file: items.as_ref(), profile: req.profile };
    match plan_stages(&network, micro_batches) {
        Err(without) if may_recompute(req, &ctx, &graph, &without) => {
            // auto_parallel under a memory limit no plan fits: recomputing every block keeps
            // only the blocks' inputs and outputs for the backward pass, at the cost of their
            // forward passes run again; the search prices both.
            let mut recomputed = graph.clone();
            if recomputed.apply_recompute(&RecomputeChoice::Blocks).is_err() {
                return Err(without);
            }
            let network = PlanRequest { graph: &recomputed, ..network };
            let Ok(mut job) = plan_stages(&network, micro_batches) else { return Err(without) };
            if let Some(search) = job.plan.search.as_mut() {
                search.recompute = Some(RecomputeChosen { blocks: recomputed.blocks.clone(), without: without.to_string() });
            }
            Ok(job)
        }
        planned => planned,
    }
}

/// Whether auto_parallel may try recomputation after `error`: the search found no plan within
/// `device_memory_capacity`, the network names blocks, and the request left recomputation to
/// autopar (no choice given, no op of the network marked).
fn may_recompute(req: &JobRequest<'_>, ctx: &ParallelContext, graph: &Graph, error: &ParallelError) -> bool {
    req.loss.is_some()
        && ctx.parallel_mode == ParallelMode::AutoParallel
        && *req.recompute == RecomputeChoice::AsBuilt
        && !graph.blocks.is_empty()
        && graph.nodes().iter().all(|n| n.recompute == autopar_graph::Recompute::Keep)
        && matches!(error, ParallelError::OutOfMemory { .. } | ParallelError::PlanOverMemory { .. })
}
