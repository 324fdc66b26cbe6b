//! The one entry point that assembles a job ([`assemble_job`]) from a network, a parallel
//! context, micro-batches, a pipeline split and a device profile: the context's defaults, its
//! strategy files read, what autopar does not run refused up front, then the network planned in
//! its stages. The trainer, `autopar plan` and the Python package all call it, so they plan
//! alike.

use autopar_graph::precision::{self, Precision};
use autopar_graph::{Graph, NodeId, RecomputeChoice};

use crate::context::{OptimizerLevel, ParallelContext, ParallelMode, OPTIMIZER_LEVEL};
use crate::error::{ParallelError, Result};
use crate::job::{plan_stages, JobPlan};
use crate::pipeline::stages::{balance_stages, has_stages, split_before};
use crate::planner::PlanRequest;
use crate::search::{DeviceProfile, LeverTry, LeversChosen};
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
    /// The device profile of auto_parallel's cost model (None: the built-in one, and
    /// dynamic_programming optimises MindSpore's own cost model instead of seconds).
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
        Err(without) if may_use_levers(req, &ctx, &without) => {
            let recompute = *req.recompute == RecomputeChoice::AsBuilt && may_recompute(&graph);
            fit_with_levers(&network, micro_batches, recompute, without)
        }
        planned => planned,
    }
}

/// auto_parallel under a memory limit no plan fits: the memory levers the job left to autopar,
/// as costed options. For each parallel-optimizer level it may take ([`lever_levels`], from
/// the job's own up), the fewest of the network's blocks recomputed (the first ones: a
/// recomputed block keeps only its inputs and outputs for the backward pass, at the cost of its
/// forward pass run again) that fit, found by bisection; the search prices both the memory and
/// the time (a level3 weight's second all-gather, a recomputed op's forward). The fitting plan
/// of least objective wins (the fewer levers on a tie); the ladder stops at the first level that
/// fits without recomputation, as a higher level only costs more. Without any, the first error.
fn fit_with_levers(network: &PlanRequest<'_>, micro_batches: usize, recompute: bool, without: ParallelError) -> Result<JobPlan> {
    let (graph, ctx) = (network.graph, network.context);
    let blocks = if recompute { graph.blocks.len() } else { 0 };
    let own = ctx.enable_parallel_optimizer.then_some(ctx.parallel_optimizer_config.optimizer_level);
    let mut tried: Vec<LeverTry> = Vec::new();
    let mut best: Option<(JobPlan, usize, Option<OptimizerLevel>)> = None;
    for level in lever_levels(ctx) {
        let mut lctx = ctx.clone();
        lctx.enable_parallel_optimizer = level.is_some();
        if let Some(l) = level {
            lctx.parallel_optimizer_config.optimizer_level = l;
        }
        let mut attempt = |k: usize| -> Option<JobPlan> {
            let mut g = graph.clone();
            if k > 0 && g.apply_recompute(&RecomputeChoice::Named(graph.blocks[..k].to_vec())).is_err() {
                return None;
            }
            let job = plan_stages(&PlanRequest { graph: &g, context: &lctx, ..*network }, micro_batches).ok();
            let fitted = job.as_ref().and_then(|j| j.plan.search.as_ref()).map(|r| (r.total().memory, r.objective));
            tried.push(LeverTry { blocks: k, optimizer_level: level, fitted });
            job
        };
        // The job's own level without recomputation is what failed.
        let plain = if level == own { None } else { attempt(0) };
        let fit = match plain {
            Some(job) => Some((job, 0)),
            None if blocks == 0 => None,
            None => match attempt(blocks) {
                None => None,
                Some(all) => {
                    let (mut lo, mut hi, mut fit) = (1, blocks, all);
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        match attempt(mid) {
                            Some(job) => (hi, fit) = (mid, job),
                            None => lo = mid + 1,
                        }
                    }
                    Some((fit, hi))
                }
            },
        };
        let Some((job, k)) = fit else { continue };
        let objective = |j: &JobPlan| j.plan.search.as_ref().map_or(f64::INFINITY, |r| r.objective);
        if best.as_ref().is_none_or(|(b, _, _)| objective(&job) < objective(b)) {
            best = Some((job, k, level));
        }
        if k == 0 {
            break;
        }
    }
    let Some((mut job, k, level)) = best else { return Err(without) };
    if let Some(search) = job.plan.search.as_mut() {
        search.levers = Some(LeversChosen {
            blocks: graph.blocks[..k].to_vec(),
            of_blocks: graph.blocks.len(),
            optimizer_level: (level != own).then_some(level).flatten(),
            without: without.to_string(),
            tried,
        });
    }
    Ok(job)
}

/// The parallel optimizer's levels auto_parallel may plan with, from the job's own up (None:
/// not sharding): every level when the job set neither `enable_parallel_optimizer` nor
/// `optimizer_level`, the levels above its own when it enabled the optimizer without a level,
/// its own alone otherwise; none above level1 under `gradient_accumulation_shard` false.
fn lever_levels(ctx: &ParallelContext) -> Vec<Option<OptimizerLevel>> {
    let own = ctx.enable_parallel_optimizer.then_some(ctx.parallel_optimizer_config.optimizer_level);
    let chosen = ctx.is_set(OPTIMIZER_LEVEL) || (ctx.is_set("enable_parallel_optimizer") && !ctx.enable_parallel_optimizer);
    if chosen {
        return vec![own];
    }
    // Level2 and level3 keep no whole accumulated gradients, which gradient_accumulation_shard
    // false asks for.
    let top = if ctx.parallel_optimizer_config.gradient_accumulation_shard { OptimizerLevel::Level3 } else { OptimizerLevel::Level1 };
    std::iter::once(own)
        .chain(
            [OptimizerLevel::Level1, OptimizerLevel::Level2, OptimizerLevel::Level3]
                .into_iter()
                .filter(|l| *l <= top)
                .map(Some)
                .filter(|l| *l > own),
        )
        .collect()
}

/// Whether auto_parallel may use memory levers after `error`: a training job whose search
/// found no plan within `device_memory_capacity`.
fn may_use_levers(req: &JobRequest<'_>, ctx: &ParallelContext, error: &ParallelError) -> bool {
    req.loss.is_some()
        && ctx.parallel_mode == ParallelMode::AutoParallel
        && matches!(error, ParallelError::OutOfMemory { .. } | ParallelError::PlanOverMemory { .. })
}

/// Whether auto_parallel may recompute blocks of `graph` (a request that left recomputation to
/// autopar): the network names blocks and marked none of its ops.
fn may_recompute(graph: &Graph) -> bool {
    !graph.blocks.is_empty() && graph.nodes().iter().all(|n| n.recompute == autopar_graph::Recompute::Keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_levels_auto_parallel_may_take_start_at_the_jobs_own_and_respect_its_choices() {
        use OptimizerLevel::*;
        let mut ctx = ParallelContext::default();
        assert_eq!(lever_levels(&ctx), vec![None, Some(Level1), Some(Level2), Some(Level3)]);
        ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
        assert_eq!(lever_levels(&ctx), vec![Some(Level1), Some(Level2), Some(Level3)]);
        ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0})).unwrap();
        assert_eq!(lever_levels(&ctx), vec![Some(Level1), Some(Level2), Some(Level3)], "a config without a level");
        ctx.set("parallel_optimizer_config", &json!({"optimizer_level": "level2"})).unwrap();
        assert_eq!(lever_levels(&ctx), vec![Some(Level2)], "the job's own level");
        let mut whole = ParallelContext::default();
        whole.set("parallel_optimizer_config", &json!({"gradient_accumulation_shard": false})).unwrap();
        assert_eq!(lever_levels(&whole), vec![None, Some(Level1)], "gradient_accumulation_shard false: no level above level1");
        let mut off = ParallelContext::default();
        off.set("enable_parallel_optimizer", &json!(false)).unwrap();
        assert_eq!(lever_levels(&off), vec![None], "switched off by the job");
    }
}
