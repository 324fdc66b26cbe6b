//! Parallel jobs. A [`ParallelJob`] is a plan of `autopar-parallel` (every mode: stand_alone,
//! data_parallel, semi_auto_parallel, hybrid_parallel); a [`RankTrainer`] is one rank of it:
//! its [`TrainStep`] (the one train-step implementation), its parameter slices and its
//! communicators. [`run_local`] runs every rank as a thread over [`LocalComm`]. Nothing here
//! decides how anything is split: the plan says, the runtime executes.

use std::collections::BTreeSet;
use std::ops::Range;

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{Graph, NodeId};
use autopar_layout::Block;
use autopar_parallel::{plan_hybrid, plan_job, ParallelContext, ParallelMode, ParallelPlan, PlanRequest, RankProgram, StrategyItems};
use autopar_tensor::kernels::shape as sh;
use autopar_tensor::{ExecCtx, Tensor};

use crate::collective::CommGroups;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::ParamStore;
use crate::optim::Optimizer;
use crate::train::TrainStep;

/// A planned job: its [`ParallelPlan`] and the rank programs made from it.
#[derive(Clone, Debug)]
pub struct ParallelJob {
    plan: ParallelPlan,
}

impl ParallelJob {
    /// A job for `graph` (forward only; `loss` its loss, summed if it has several elements)
    /// under `ctx` (any mode but hybrid_parallel; see [`ParallelJob::hybrid`]). Planned here: an
    /// invalid strategy or an indivisible batch is an error now.
    pub fn new(graph: Graph, loss: NodeId, ctx: ParallelContext) -> Result<Self> {
        Self::with_strategies(graph, loss, ctx, None)
    }

    /// Like [`ParallelJob::new`], with the operator strategies of a strategy file applied
    /// (semi_auto_parallel).
    pub fn with_strategies(graph: Graph, loss: NodeId, ctx: ParallelContext, file: Option<&StrategyItems>) -> Result<Self> {
        Self::planned(graph, loss, ctx, file, None)
    }

    /// Like [`ParallelJob::with_strategies`], with auto_parallel's cost model under `profile`
    /// (None: the built-in one).
    pub fn planned(
        graph: Graph,
        loss: NodeId,
        ctx: ParallelContext,
        file: Option<&StrategyItems>,
        profile: Option<&autopar_parallel::DeviceProfile>,
    ) -> Result<Self> {
        let plan = plan_job(&PlanRequest { graph: &graph, loss: Some(loss), context: &ctx, strategy_file: file, profile })?;
        Ok(Self { plan })
    }

    /// A hybrid_parallel job: rank `r` runs `graphs[r]` (its local shapes and the collectives
    /// the user placed, with world-rank groups). Parameters named in `layerwise` are the rank's
    /// own (MindSpore's `layerwise_parallel`); every other parameter is replicated and its
    /// gradient all-reduced over all ranks. With `gradients_mean` the job's loss is the mean
    /// of the ranks' losses (each backward starts from 1/N), without it their sum.
    pub fn hybrid(graphs: Vec<Graph>, loss_name: &str, ctx: ParallelContext, layerwise: BTreeSet<String>) -> Result<Self> {
        Ok(Self { plan: plan_hybrid(graphs, loss_name, &ctx, &layerwise)? })
    }

    /// A job from a plan made elsewhere (it must have a loss).
    pub fn from_plan(plan: ParallelPlan) -> Self {
        Self { plan }
    }

    /// Every parallel decision of the job.
    pub fn plan(&self) -> &ParallelPlan {
        &self.plan
    }

    /// The parallel mode (MindSpore's `parallel_mode`).
    pub fn mode(&self) -> ParallelMode {
        self.plan.mode
    }

    /// Ranks of the job (1 for stand_alone).
    pub fn device_num(&self) -> usize {
        self.plan.device_num
    }

    /// The global graph (hybrid_parallel: rank 0's graph), with the loss as its first output.
    pub fn graph(&self) -> &Graph {
        &self.plan.graph
    }

    /// The loss node of [`ParallelJob::graph`].
    pub fn loss(&self) -> NodeId {
        self.plan.loss.unwrap_or(self.plan.graph.outputs[0])
    }

    /// The parallel context the job was planned under.
    pub fn context(&self) -> &ParallelContext {
        &self.plan.context
    }

    /// hybrid_parallel: the graph of every rank (empty in the other modes).
    pub fn rank_graphs(&self) -> &[Graph] {
        &self.plan.rank_graphs
    }

    /// The program of `rank`: its whole training step.
    pub fn program(&self, rank: usize) -> Result<RankProgram> {
        Ok(autopar_parallel::rank_program(&self.plan, rank)?)
    }
}

/// Split global batches (by input name) along dimension 0 into `n` equal parts, part `r` of
/// batch `s` at `s * n + r`: the per-rank batches of hand-split (hybrid_parallel) graphs. An
/// input whose first dimension `n` does not divide is an error naming it.
pub fn rank_batches(batches: &[Vec<(String, Tensor)>], n: usize) -> Result<Vec<Vec<(String, Tensor)>>> {
    let mut out = Vec::with_capacity(batches.len() * n);
    for batch in batches {
        for (name, t) in batch {
            let rows = t.shape().first().copied().unwrap_or(0);
            if n == 0 || t.shape().is_empty() || !rows.is_multiple_of(n) {
                return Err(RuntimeError::BatchSplit { name: name.clone(), shape: t.shape().to_vec(), parts: n });
            }
        }
        for r in 0..n {
            let part = batch
                .iter()
                .map(|(name, t)| {
                    let per = t.shape()[0] / n;
                    let mut ranges: Vec<Range<usize>> = t.shape().iter().map(|&d| 0..d).collect();
                    ranges[0] = r * per..(r + 1) * per;
                    Ok((name.clone(), slice_tensor(t, &ranges)?))
                })
                .collect::<Result<Vec<_>>>()?;
            out.push(part);
        }
    }
    Ok(out)
}

/// The piece `ranges` of `t`.
pub fn slice_tensor(t: &Tensor, ranges: &[Range<usize>]) -> Result<Tensor> {
    if ranges.iter().zip(t.shape()).all(|(r, &d)| r.start == 0 && r.end == d) {
        return Ok(t.clone());
    }
    let begin: Vec<usize> = ranges.iter().map(|r| r.start).collect();
    let size: Vec<isize> = ranges.iter().map(|r| (r.end - r.start) as isize).collect();
    sh::slice(t, &begin, &size).map(|s| s.contiguous()).map_err(|e| RuntimeError::Kernel {
        kind: "Slice",
        name: "parameter slice".into(),
        source: Box::new(e),
    })
}

/// One rank of a parallel job: its training step, its parameter slices, its communicators.
pub struct RankTrainer {
    step: TrainStep,
    params: ParamStore,
    groups: CommGroups,
}

impl std::fmt::Debug for RankTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankTrainer").field("rank", &self.step.program().rank).field("buckets", &self.step.program().buckets).finish()
    }
}

impl RankTrainer {
    /// Build rank `comm.rank()`'s trainer: its program, its parameter slices (cut from the full
    /// initial values in `full`), its sub-communicators (collective: every rank calls this).
    pub fn new(job: &ParallelJob, comm: &dyn Communicator, full: &ParamStore) -> Result<Self> {
        let program = job.program(comm.rank())?;
        let mut params = ParamStore::new();
        for p in &program.params {
            let t = full.require(&p.name)?;
            params.insert(&p.name, slice_tensor(t, &p.slice)?);
        }
        Self::from_program(job, program, comm, params)
    }

    /// Like [`RankTrainer::new`], with this rank's slices given (for example from
    /// [`crate::distributed::load_distributed_checkpoint`]); every parameter must be present with
    /// its local shape.
    pub fn with_local_params(job: &ParallelJob, comm: &dyn Communicator, params: ParamStore) -> Result<Self> {
        let program = job.program(comm.rank())?;
        Self::from_program(job, program, comm, params)
    }

    fn from_program(job: &ParallelJob, program: RankProgram, comm: &dyn Communicator, mut params: ParamStore) -> Result<Self> {
        if comm.size() != job.device_num() {
            return Err(RuntimeError::DeviceCount { job: job.device_num(), ranks: comm.size() });
        }
        for p in &program.params {
            let t = params.require(&p.name)?;
            let want = p.stored_shape();
            if t.shape() != want.as_slice() {
                return Err(RuntimeError::SliceMismatch { name: p.name.clone(), rank: program.rank, shape: want, got: t.shape().to_vec() });
            }
        }
        let groups = CommGroups::create(comm, &program.partitions)?;
        if job.context().parameter_broadcast {
            broadcast_parameters(&program, &groups, &mut params)?;
        }
        // One rank alone uses the kernels' thread pool; simulated ranks share the cores.
        let ctx = if job.device_num() == 1 { ExecCtx::parallel() } else { ExecCtx::serial() };
        let step = TrainStep::from_program(program)?.with_ctx(ctx);
        Ok(Self { step, params, groups })
    }

    /// This trainer's rank, global.
    pub fn rank(&self) -> usize {
        self.step.program().rank
    }

    /// The rank's program.
    pub fn program(&self) -> &RankProgram {
        self.step.program()
    }

    /// The rank's parameter slices.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The rank's parameter slices, for changing them.
    pub fn params_mut(&mut self) -> &mut ParamStore {
        &mut self.params
    }

    /// The rank's communicators.
    pub fn groups(&self) -> &CommGroups {
        &self.groups
    }

    /// The rank's training step (its step counter keys the dropout masks).
    pub fn train_step(&mut self) -> &mut TrainStep {
        &mut self.step
    }

    /// This rank's inputs cut from the global batch (`(input name, tensor)`).
    pub fn local_feeds(&self, global: &[(String, Tensor)]) -> Result<Vec<(NodeId, Tensor)>> {
        self.local_feeds_from(global, 0)
    }

    /// This rank's inputs cut from rows `first_row..` of the global batch (a rank that read
    /// only the rows it needs: [`RankTrainer::rows`]).
    pub fn local_feeds_from(&self, rows: &[(String, Tensor)], first_row: usize) -> Result<Vec<(NodeId, Tensor)>> {
        let program = self.step.program();
        program
            .inputs
            .iter()
            .map(|slot| {
                let t = rows.iter().find(|(n, _)| *n == slot.name).map(|(_, t)| t).ok_or_else(|| RuntimeError::MissingFeed {
                    name: slot.name.clone(),
                    shape: slot.layout.shape().to_vec(),
                    dtype: program.graph.node(slot.local).ty.dtype,
                })?;
                let mut slice = slot.slice.clone();
                if let Some(first) = slice.first_mut() {
                    let shifted = first.start.checked_sub(first_row).zip(first.end.checked_sub(first_row));
                    match shifted {
                        Some((s, e)) if e <= t.shape().first().copied().unwrap_or(0) => *first = s..e,
                        _ => {
                            return Err(RuntimeError::FeedMismatch {
                                name: slot.name.clone(),
                                shape: slot.layout.shape().to_vec(),
                                dtype: program.graph.node(slot.local).ty.dtype,
                                got: t.shape().to_vec(),
                                got_dtype: crate::executor::graph_dtype(t.dtype()),
                            })
                        }
                    }
                }
                Ok((slot.local, slice_tensor(t, &slice)?))
            })
            .collect()
    }

    /// The rows of the global batch this rank reads: the union of its inputs' batch slices
    /// (dimension 0). Under the dataset strategy `data_parallel` a rank reads only its part.
    pub fn rows(&self) -> Range<usize> {
        let ranges: Vec<&Range<usize>> = self.step.program().inputs.iter().filter_map(|s| s.slice.first()).collect();
        let start = ranges.iter().map(|r| r.start).min().unwrap_or(0);
        let end = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        start..end
    }

    /// Forward, backward and gradient sync on this rank's local feeds, without an update: the
    /// job's loss and this rank's synchronised gradient slices.
    pub fn gradients(&mut self, feeds: &[(NodeId, Tensor)]) -> Result<crate::train::StepOutput> {
        self.step.gradients(&mut self.params, feeds, Some(&self.groups))
    }

    /// One training step on this rank's local feeds; returns the job's loss.
    pub fn step(&mut self, opt: &mut dyn Optimizer, feeds: &[(NodeId, Tensor)]) -> Result<f64> {
        self.step.run_with(&mut self.params, opt, feeds, Some(&self.groups))
    }

    /// One training step accumulating the gradients of micro-batches (each one's local feeds,
    /// in order) before one update ([`TrainStep::accumulate`]); returns the mean of their losses.
    pub fn step_accumulated(&mut self, opt: &mut dyn Optimizer, micro_feeds: &[Vec<(NodeId, Tensor)>]) -> Result<f64> {
        let (loss, grads) = self.step.accumulate(&mut self.params, micro_feeds, Some(&self.groups))?;
        opt.step(&mut self.params, &grads)?;
        crate::train::finite_loss(loss, self.step.steps())
    }
}

/// `parameter_broadcast`: every parameter slice is copied from the first rank of its mirror
/// group (the ranks holding the same slice, along the data-parallel axes) to the others, so
/// replicas start equal whatever each rank initialised.
fn broadcast_parameters(program: &RankProgram, groups: &CommGroups, params: &mut ParamStore) -> Result<()> {
    for p in program.params.iter().filter(|p| p.mirror.len() > 1) {
        let out = crate::collective::broadcast_tensor(groups.get(&p.mirror)?, params.require(&p.name)?, &p.name, 0)?;
        params.insert(&p.name, out);
    }
    Ok(())
}

/// Put every rank's slices back together into full tensors (one owner per distinct slice;
/// hybrid_parallel: rank 0's parameters).
pub fn assemble_params(job: &ParallelJob, per_rank: &[ParamStore]) -> Result<ParamStore> {
    if job.mode() == ParallelMode::HybridParallel {
        return Ok(per_rank[0].clone());
    }
    let mut full = ParamStore::new();
    for slot in &job.plan().params {
        full.insert(&slot.name, assemble_slices(slot, per_rank)?);
    }
    Ok(full)
}

/// Parameter `p` whole, written from the pieces each of `per_rank`'s ranks stores (its
/// model-parallel slice, or its optimizer shard of it; one owner per distinct piece), in the
/// dtype of the first owner's piece.
pub(crate) fn assemble_slices(p: &autopar_parallel::ParamPlan, per_rank: &[ParamStore]) -> Result<Tensor> {
    let name = p.name.as_str();
    let owners = p.stored_owners();
    let shape = p.layout.shape().to_vec();
    let first = per_rank[owners[0]].require(name)?;
    let lay = |e: autopar_layout::LayoutError| {
        RuntimeError::Plan(Box::new(autopar_parallel::ParallelError::Layout { node: name.to_string(), source: e }))
    };
    let mut values = Block::<f64>::zeros(shape.clone());
    for &o in &owners {
        let piece = per_rank[o].require(name)?;
        let piece = Block::new(piece.shape().to_vec(), piece.to_f64_vec()).map_err(lay)?;
        values.write(&p.stored_slice(o).map_err(lay)?, &piece).map_err(lay)?;
    }
    let t = Tensor::from_vec(&shape, values.into_data()).map_err(|e| RuntimeError::Kernel {
        kind: "assemble",
        name: name.to_string(),
        source: Box::new(e),
    })?;
    Ok(t.cast(first.dtype()))
}

/// Every rank's local slices, gathered so that each rank holds the full parameters (for runs
/// with one rank per process, where no rank sees the others' stores). Collective.
pub fn gather_full_params(job: &ParallelJob, comm: &dyn Communicator, local: &ParamStore) -> Result<ParamStore> {
    let n = comm.size();
    if n == 1 {
        return Ok(local.clone());
    }
    let mut stores = vec![ParamStore::new(); n];
    for (name, t) in local.iter() {
        let mine = t.to_f64_vec();
        let mut all = vec![0.0f64; mine.len() * n];
        comm.all_gather((&mine).into(), (&mut all).into()).map_err(RuntimeError::comm(CommPhase::GatherParameters))?;
        for (r, store) in stores.iter_mut().enumerate() {
            let piece = Tensor::from_vec(t.shape(), all[r * mine.len()..(r + 1) * mine.len()].to_vec())
                .map_err(|e| RuntimeError::Kernel { kind: "AllGather", name: name.clone(), source: Box::new(e) })?;
            store.insert(name, piece.cast(t.dtype()));
        }
    }
    assemble_params(job, &stores)
}

/// The result of an in-process parallel run.
#[derive(Debug)]
pub struct LocalRun {
    /// The job's loss at every step (rank 0's; every rank sees the same in every mode but
    /// hybrid_parallel, where it is rank 0's own loss).
    pub losses: Vec<f64>,
    /// Every rank's losses.
    pub rank_losses: Vec<Vec<f64>>,
    /// Final parameters, assembled from the ranks' slices (hybrid_parallel: rank 0's).
    pub params: ParamStore,
    /// Every rank's final local parameters.
    pub rank_params: Vec<ParamStore>,
}

/// Run `job` on `device_num` threads with [`LocalComm`]: every step feeds each rank its part of
/// `batches[step]` (global batches by input name; under hybrid_parallel, where each rank has
/// its own graph and data, `batches[step * n + rank]`), with an optimizer from `make_opt` per
/// rank.
pub fn run_local<F>(job: &ParallelJob, batches: &[Vec<(String, Tensor)>], make_opt: F) -> Result<LocalRun>
where
    F: Fn() -> Result<Box<dyn Optimizer>> + Sync,
{
    let n = job.device_num();
    let hybrid = job.mode() == ParallelMode::HybridParallel;
    let full: Vec<ParamStore> =
        if hybrid { job.rank_graphs().iter().map(ParamStore::init).collect::<Result<_>>()? } else { vec![ParamStore::init(job.graph())?] };
    let steps = if hybrid { batches.len() / n } else { batches.len() };
    let results = LocalComm::run(n, |comm| -> Result<(Vec<f64>, ParamStore)> {
        let r = comm.rank();
        let mut t = RankTrainer::new(job, &comm, &full[r.min(full.len() - 1)])?;
        let mut opt = make_opt()?;
        let mut losses = Vec::with_capacity(steps);
        for s in 0..steps {
            let batch = if hybrid { &batches[s * n + r] } else { &batches[s] };
            let feeds = t.local_feeds(batch)?;
            losses.push(t.step(opt.as_mut(), &feeds)?);
        }
        Ok((losses, t.params().clone()))
    })
    .map_err(RuntimeError::comm(CommPhase::Run))?;
    let (rank_losses, stores): (Vec<Vec<f64>>, Vec<ParamStore>) = results.into_iter().unzip();
    let params = assemble_params(job, &stores)?;
    Ok(LocalRun { losses: rank_losses[0].clone(), rank_losses, params, rank_params: stores })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_batches_splits_dimension_0_in_run_local_order_and_names_what_cannot_split() {
        let x = Tensor::from_vec(&[4, 2], (0..8).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        let parts = rank_batches(&[vec![("x".to_string(), x.clone())]], 2).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1][0].1.to_f64_vec(), vec![4.0, 5.0, 6.0, 7.0]);
        let e = rank_batches(&[vec![("x".to_string(), x.clone())]], 3).unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.contains("3 equal parts"), "{e}");
        let scalar = Tensor::from_vec(&[], vec![1.0f32]).unwrap();
        let e = rank_batches(&[vec![("s".to_string(), scalar)]], 2).unwrap_err().to_string();
        assert!(e.contains("\"s\""), "{e}");
        assert!(rank_batches(&[vec![("x".to_string(), x)]], 0).unwrap_err().to_string().contains("0 equal parts"));
    }
}
