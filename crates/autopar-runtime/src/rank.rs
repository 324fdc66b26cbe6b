//! One rank of a job, every mode and shape: [`RankTrainer`], with the one train step.
//!
//! A step runs the step's micro-batches, then synchronises and applies their gradients:
//! 1. **Micro-batches.** Without pipeline stages each micro-batch runs forward and backward as
//!    one graph, its gradients accumulated (and averaged over the micro-batches). In a pipeline
//!    the rank runs its stage's pieces of every micro-batch in the order its schedule gives
//!    ([`autopar_parallel::pipeline::Schedule`]), sending activations to the next piece and
//!    gradients to the previous one, keeping the values its backward passes need only while
//!    their micro-batch is in flight; the loss is seeded with `1/micro-batches`. Sharded
//!    parameters (the parallel optimizer) are all-gathered around the passes; with
//!    `gradient_accumulation_shard` each micro-batch's gradients are reduce-scattered at once.
//! 2. **Gradients**, the same for every job: reduce-scattered (the parallel optimizer), the
//!    gradient buckets all-reduced over their groups, a pipeline's shared parameters summed
//!    across the stages holding copies, then clipped by their global norm over the whole job.
//! 3. **Update**: the optimizer updates the rank's stored pieces.
//!
//! Pipeline inference ([`RankTrainer::predict`]) runs the forward passes alone; the outputs
//! reach the last stage's ranks, or every rank with `pipeline_result_broadcast` (every rank of a
//! job without stages computes them whole).

use std::ops::Range;
use std::time::Instant;

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{Graph, NodeId, OpKind, TensorType};
use autopar_parallel::pipeline::{Action, ChunkProgram, Pass, Work};
use autopar_parallel::{InputSlot, JobProgram, ParamSlot, Passes, RankBucket, RankShardBucket};
use autopar_tensor::{ExecCtx, Tensor};

use crate::collective::CommGroups;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::{graph_dtype, Collectives, Executor, MicroBatch, ParamStore, RunOutput};
use crate::gradient_sync::{accumulate_at, finite_loss, mean_of_micro_batches, sync_bucket, BucketBuffer};
use crate::job::{slice_tensor, Job};
use crate::optim::Optimizer;
use crate::parallel_optimizer::{accumulate_scattered, scatter_gradients, with_gathered, GatherBuffers};
use crate::transfer::{all_reduce_tensor, recv_tensor, send_tensor, transfer_tag};

/// Where a rank's parameters come from.
#[derive(Debug)]
pub enum ParamSource<'a> {
    /// Cut from the full initial values of every parameter.
    Full(&'a ParamStore),
    /// The rank's stored pieces, given (for example by
    /// [`crate::checkpoint_io::load_distributed_checkpoint`]): every parameter the rank holds,
    /// with its stored shape.
    Local(ParamStore),
}

/// What [`RankTrainer::gradients`] returns.
#[derive(Clone, Debug)]
pub struct StepOutput {
    /// The job's loss (the mean of the micro-batches' losses, as every rank of a pipeline sees
    /// it; each rank's own under hybrid_parallel).
    pub loss: f64,
    /// The rank's synchronised (and clipped) gradients by parameter name.
    pub grads: Vec<(String, Tensor)>,
    /// The passes' statistics: op timings when profiling, the peak live memory of a pass.
    pub run: RunOutput,
}

/// One chunk of a pipeline stage as the rank runs it.
struct ChunkRun {
    forward: Executor,
    backward: Executor,
    /// Where each of the chunk's parameter gradients accumulates among the stage's.
    at: Vec<usize>,
    /// The reduce-scatter buckets of the chunk's gradients (`gradient_accumulation_shard`).
    scatter: Vec<RankShardBucket>,
    /// Shapes and dtypes of what the chunk receives, and of the gradients of what it sends
    /// (its float values), in transfer order.
    recv_types: Vec<(Vec<usize>, autopar_graph::DType)>,
    grad_types: Vec<(Vec<usize>, autopar_graph::DType)>,
}

/// How the rank runs each micro-batch.
enum Run {
    /// Forward and backward as one graph.
    Whole(Box<Executor>),
    /// The stage's pipeline pieces.
    Chunks(Vec<ChunkRun>),
}

/// One rank of a [`Job`]: its program, its parameter pieces, its communicators, and the one
/// train step of every job.
pub struct RankTrainer {
    program: JobProgram,
    stages: usize,
    stage_devices: usize,
    micro_batches: usize,
    result_broadcast: bool,
    /// The stage's actions of one step (a pipeline's).
    actions: Vec<Action>,
    /// The network's outputs (an inference job's), by name and type.
    outputs: Vec<(String, TensorType)>,
    training: bool,
    run: Run,
    params: ParamStore,
    /// The parallel optimizer's all-gathered parameter slices, reused every step.
    gathered: GatherBuffers,
    /// The rank's own handle on every rank of the job (transfers, the loss, the global norm).
    world: Box<dyn Communicator>,
    /// A pipeline stage's communicator (its groups are split from it).
    _stage_comm: Option<Box<dyn Communicator>>,
    groups: CommGroups,
    /// Shared parameters and the communicator across the stages holding their copies.
    shared: Vec<(Vec<String>, Box<dyn Communicator>)>,
    buckets: Vec<(RankBucket, BucketBuffer)>,
    step: u64,
    /// Clip the gradients to this global norm over the whole job (None: no clipping).
    clip_grad_norm: Option<f64>,
    /// When the step began, seconds of its passes, and its wall time.
    started: Instant,
    busy: f64,
    wall: f64,
}

impl std::fmt::Debug for RankTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankTrainer")
            .field("rank", &self.program.rank)
            .field("stage", &self.program.stage)
            .field("buckets", &self.program.program.buckets)
            .finish()
    }
}

impl RankTrainer {
    /// Rank `world.rank()` of `job`: its program, its parameter pieces from `params`, its
    /// sub-communicators, and with `parameter_broadcast` its replicas made equal. Collective
    /// over `world`: every rank calls it.
    pub fn new(job: &Job, world: &dyn Communicator, params: ParamSource<'_>) -> Result<Self> {
        let plan = job.plan();
        let n = plan.device_num;
        if world.size() != n {
            return Err(RuntimeError::DeviceCount { job: n, ranks: world.size() });
        }
        let program = plan.program(world.rank())?;
        let held = program.held_params();
        let params = match params {
            ParamSource::Full(full) => {
                let mut store = ParamStore::new();
                for slot in program.program.params.iter().filter(|s| held.contains(&s.name)) {
                    store.insert(&slot.name, slice_tensor(full.require(&slot.name)?, &slot.slice)?);
                }
                store
            }
            ParamSource::Local(store) => store,
        };
        for slot in program.program.params.iter().filter(|s| held.contains(&s.name)) {
            let t = params.require(&slot.name)?;
            let want = slot.stored_shape();
            if t.shape() != want.as_slice() {
                return Err(RuntimeError::SliceMismatch {
                    name: slot.name.clone(),
                    rank: program.rank,
                    shape: want,
                    got: t.shape().to_vec(),
                });
            }
        }
        // The rank's communicators, created in the same order on every rank.
        let all: Vec<usize> = (0..n).collect();
        let world_own = world
            .split(std::slice::from_ref(&all))
            .map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: 0 }))?
            .expect("every rank is in the group of every rank");
        let d = plan.stage_devices();
        let stage_comm = if plan.stages > 1 {
            let stage_groups: Vec<Vec<usize>> = (0..plan.stages).map(|s| (s * d..(s + 1) * d).collect()).collect();
            let comm = world
                .split(&stage_groups)
                .map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: 0 }))?
                .expect("every rank is in a stage");
            Some(comm)
        } else {
            None
        };
        let groups = CommGroups::create(stage_comm.as_deref().unwrap_or(world), &program.program.partitions)?;
        let mut shared = Vec::new();
        for (k, group) in program.shared.iter().enumerate() {
            let sub = world.split(&group.partition).map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: 1 + k }))?;
            if let Some(sub) = sub.filter(|c| c.size() > 1 && !group.params.is_empty()) {
                shared.push((group.params.clone(), sub));
            }
        }
        let names: Vec<&str> = program.grads.iter().map(String::as_str).collect();
        let buckets =
            program.program.buckets.iter().map(|b| Ok((b.clone(), BucketBuffer::over_names(b, &names)?))).collect::<Result<Vec<_>>>()?;
        // One rank alone uses the kernels' thread pool; simulated ranks share the cores.
        let ctx = if n == 1 { ExecCtx::parallel() } else { ExecCtx::serial() };
        let run = match &program.passes {
            Passes::Whole => Run::Whole(Box::new(Executor::new(program.program.graph.clone(), &program.program.fetch())?.with_ctx(ctx))),
            Passes::Chunks(chunks) => Run::Chunks(chunks.iter().map(|c| chunk_run(c, &program, ctx)).collect::<Result<_>>()?),
        };
        let g = &plan.plan.graph;
        let mut trainer = Self {
            stages: plan.stages,
            stage_devices: d,
            micro_batches: plan.micro_batches,
            result_broadcast: plan.result_broadcast,
            actions: plan.schedule.stages[program.stage].clone(),
            outputs: g.outputs.iter().map(|&o| (g.node(o).name.clone(), g.node(o).ty.clone())).collect(),
            training: plan.plan.loss.is_some(),
            run,
            params,
            gathered: Default::default(),
            world: world_own,
            _stage_comm: stage_comm,
            groups,
            shared,
            buckets,
            step: 0,
            clip_grad_norm: None,
            started: Instant::now(),
            busy: 0.0,
            wall: 0.0,
            program,
        };
        if job.context().parameter_broadcast() {
            trainer.broadcast_parameters()?;
        }
        Ok(trainer)
    }

    /// The one rank of a one-device job (stand_alone): no communicator to give.
    pub fn alone(job: &Job, params: ParamSource<'_>) -> Result<Self> {
        if job.device_num() != 1 {
            return Err(RuntimeError::DeviceCount { job: job.device_num(), ranks: 1 });
        }
        let world = LocalComm::group(1).map_err(RuntimeError::comm(CommPhase::Run))?.pop().expect("a group of one rank");
        Self::new(job, &world, params)
    }

    /// Sets the kernels' execution context (the default: [`ExecCtx::parallel`] for a job of one
    /// device, [`ExecCtx::serial`] for simulated ranks, which share the cores).
    pub fn with_exec_ctx(mut self, ctx: ExecCtx) -> Self {
        self.run = match self.run {
            Run::Whole(e) => Run::Whole(Box::new(e.with_ctx(ctx))),
            Run::Chunks(chunks) => Run::Chunks(
                chunks
                    .into_iter()
                    .map(|c| ChunkRun { forward: c.forward.with_ctx(ctx), backward: c.backward.with_ctx(ctx), ..c })
                    .collect(),
            ),
        };
        self
    }

    /// Records each op's wall time in [`StepOutput::run`] (see [`Executor::with_profiling`]).
    pub fn with_profiling(mut self, on: bool) -> Self {
        self.run = match self.run {
            Run::Whole(e) => Run::Whole(Box::new(e.with_profiling(on))),
            Run::Chunks(chunks) => Run::Chunks(
                chunks
                    .into_iter()
                    .map(|c| ChunkRun { forward: c.forward.with_profiling(on), backward: c.backward.with_profiling(on), ..c })
                    .collect(),
            ),
        };
        self
    }

    /// This trainer's rank, global.
    pub fn rank(&self) -> usize {
        self.program.rank
    }

    /// What the rank runs.
    pub fn program(&self) -> &JobProgram {
        &self.program
    }

    /// The rank's parameters as it stores them between steps: its slices, or its optimizer
    /// shards of them.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The rank's stored parameters, for changing them.
    pub fn params_mut(&mut self) -> &mut ParamStore {
        &mut self.params
    }

    /// The slots of the parameters this rank holds (a pipeline rank: its stage's, shared ones
    /// included).
    pub fn param_slots(&self) -> Vec<&ParamSlot> {
        self.program.program.params.iter().filter(|s| self.params.get(&s.name).is_some()).collect()
    }

    /// Pipeline stages of the job (1 without a pipeline) and the devices of each.
    pub fn pipeline_shape(&self) -> (usize, usize) {
        (self.stages, self.stage_devices)
    }

    /// The rank's communicators (a pipeline rank's: its stage's, by position in the stage).
    pub fn groups(&self) -> &CommGroups {
        &self.groups
    }

    /// Steps run so far (the key of the dropout masks).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Continue the step counter (the key of the dropout masks) at `step`.
    pub fn set_steps(&mut self, step: u64) {
        self.step = step;
    }

    /// Clip every step's gradients to global norm `max_norm` over the whole job (None: no
    /// clipping), MindSpore's `ClipByGlobalNorm`: each distinct piece is counted once (on the
    /// first rank holding it, a shared parameter on the first stage using it) and the sum is
    /// all-reduced, so sharded, replicated and pipelined runs clip as one device does.
    pub fn set_clip_grad_norm(&mut self, max_norm: Option<f64>) -> Result<()> {
        if let Some(m) = max_norm {
            crate::optim::check_max_norm(m)?;
        }
        self.clip_grad_norm = max_norm;
        Ok(())
    }

    /// The rows of each global batch this rank reads: the union of its inputs' slices of every
    /// micro-batch (dimension 0). Under the dataset strategy `data_parallel` a rank of a job
    /// without micro-batches reads only its part.
    pub fn rows(&self) -> Range<usize> {
        let m = self.micro_batches;
        let spans: Vec<(usize, usize)> = self
            .program
            .program
            .inputs
            .iter()
            .filter_map(|s| {
                let r = s.slice.first()?;
                let per = s.layout.shape().first().copied().unwrap_or(0);
                Some((r.start, (m - 1) * per + r.end))
            })
            .collect();
        let start = spans.iter().map(|s| s.0).min().unwrap_or(0);
        let end = spans.iter().map(|s| s.1).max().unwrap_or(0);
        start..end
    }

    /// MindSpore's `sync_pipeline_shared_parameters`: every copy of a shared parameter takes
    /// the value of the first stage using it (its owner), e.g. after loading weights that
    /// might differ. Collective over the ranks holding copies (every rank calls it); nothing
    /// to do without a pipeline.
    pub fn sync_shared_parameters(&mut self) -> Result<()> {
        for (names, comm) in &self.shared {
            for name in names {
                let out = crate::collective::broadcast_tensor(comm.as_ref(), self.params.require(name)?, name, 0)?;
                self.params.insert(name, out);
            }
        }
        Ok(())
    }

    /// The last step's idle share on this rank: 1 - (time in forward and backward passes) /
    /// (the step's wall time, gradient sync and update included).
    pub fn last_bubble(&self) -> f64 {
        if self.wall > 0.0 {
            1.0 - self.busy / self.wall
        } else {
            0.0
        }
    }

    /// One training step on the global batch `batch` (by input name; every micro-batch an
    /// equal part of its rows): returns the job's loss. Collective.
    pub fn step(&mut self, opt: &mut dyn Optimizer, batch: &[(String, Tensor)]) -> Result<f64> {
        self.step_rows(opt, batch, 0)
    }

    /// One training step on rows `first_row..` of the global batch (a rank that read only the
    /// rows it needs: [`RankTrainer::rows`]); returns the job's loss. Collective.
    pub fn step_rows(&mut self, opt: &mut dyn Optimizer, rows: &[(String, Tensor)], first_row: usize) -> Result<f64> {
        let StepOutput { loss, grads, .. } = self.gradients_rows(rows, first_row)?;
        opt.step(&mut self.params, &grads)?;
        self.wall = self.started.elapsed().as_secs_f64();
        finite_loss(loss, self.step)
    }

    /// The step without its update: every micro-batch's forward and backward, then the
    /// gradients synchronised and clipped. Returns the job's loss and this rank's gradients of
    /// its stored pieces. Collective.
    pub fn gradients(&mut self, batch: &[(String, Tensor)]) -> Result<StepOutput> {
        self.gradients_rows(batch, 0)
    }

    fn gradients_rows(&mut self, rows: &[(String, Tensor)], first_row: usize) -> Result<StepOutput> {
        if !self.training {
            return Err(RuntimeError::JobKind { inference: true });
        }
        self.check_batch(rows, first_row)?;
        self.started = Instant::now();
        let m = self.micro_batches;
        let mut st = StepState::new(self.program.chunks().len().max(1), m, self.program.grads.len());
        let actions = self.actions.clone();
        let passes = self.run_micro_batches(rows, first_row, actions, &mut st);
        self.busy = st.busy;
        passes?;
        self.step += 1;
        let mut grads: Vec<(String, Tensor)> = Vec::with_capacity(st.acc.len());
        for (name, g) in self.program.grads.iter().zip(st.acc) {
            grads.push((name.clone(), g.ok_or_else(|| RuntimeError::MissingGradient { name: name.clone() })?));
        }
        if matches!(self.run, Run::Whole(_)) {
            // A pipeline seeds its loss with 1/micro-batches; accumulation averages here.
            mean_of_micro_batches(&mut grads, m)?;
        }
        self.synchronise(&mut grads)?;
        let loss = self.job_loss(st.loss_sum / m as f64)?;
        Ok(StepOutput { loss, grads, run: st.run })
    }

    /// What follows the micro-batches in every job: the parallel optimizer's reduce-scatter
    /// (unless each micro-batch's gradients were), the gradient buckets, the sum over a
    /// pipeline's copies of shared parameters, and clipping by the global norm. Collective.
    fn synchronise(&mut self, grads: &mut [(String, Tensor)]) -> Result<()> {
        let groups = Some(&self.groups);
        if !self.program.program.accumulation_shard {
            scatter_gradients(&self.program.program, grads, groups)?;
        }
        for (b, buffer) in &mut self.buckets {
            sync_bucket(b, buffer, grads, groups)?;
        }
        // In the shared parameters' graph order, which every rank holding them agrees on (the
        // gradients' own order follows each stage's first use).
        for (names, comm) in &self.shared {
            for name in names {
                if let Some((n, g)) = grads.iter_mut().find(|(n, _)| n == name) {
                    *g = all_reduce_tensor(comm.as_ref(), g, n)?;
                }
            }
        }
        let Some(max_norm) = self.clip_grad_norm else { return Ok(()) };
        let counted = &self.program.norm_counted;
        let world = self.world.as_ref();
        crate::optim::clip_gradients(
            grads,
            max_norm,
            |name| counted.iter().any(|c| c == name),
            |local| {
                if world.size() == 1 {
                    return Ok(local);
                }
                let mut v = vec![local];
                world
                    .all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum)
                    .map_err(RuntimeError::comm(CommPhase::GradientSync { group: (0..world.size()).collect() }))?;
                Ok(v[0])
            },
        )?;
        Ok(())
    }

    /// The job's loss from this rank's `own` (the mean of its micro-batches' losses): its own
    /// without stages; in a pipeline the last stage's, from its first position to every rank.
    fn job_loss(&self, own: f64) -> Result<f64> {
        if self.stages == 1 {
            return Ok(own);
        }
        let last = self.program.stage + 1 == self.stages && self.program.position == 0;
        let mut v = vec![if last { own } else { 0.0 }];
        self.world.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(RuntimeError::comm(CommPhase::Run))?;
        Ok(v[0])
    }

    /// Inference on the global batch `batch` (by input name; every micro-batch an equal part of
    /// its rows) with a job planned without a loss ([`Job::inference`]): every micro-batch's
    /// forward. Returns the network's outputs, each the micro-batches' results joined along
    /// dimension 0 (a scalar output: one value per micro-batch): on every rank of a job without
    /// stages; in a pipeline on the last stage's ranks, and with `pipeline_result_broadcast` on
    /// every rank (sent from the last stage's first rank); None on the other ranks without it.
    /// Collective.
    pub fn predict(&mut self, batch: &[(String, Tensor)]) -> Result<Option<Vec<Tensor>>> {
        if self.training {
            return Err(RuntimeError::JobKind { inference: false });
        }
        self.check_batch(batch, 0)?;
        let m = self.micro_batches;
        let (stage, p, d) = (self.program.stage, self.stages, self.stage_devices);
        let mut st = StepState::new(self.program.chunks().len().max(1), m, 0);
        let actions: Vec<Action> = self
            .actions
            .iter()
            .copied()
            .filter(|a| match a {
                Action::Compute(w) | Action::Send { work: w, .. } | Action::Recv { work: w, .. } => w.pass == Pass::Forward,
            })
            .collect();
        self.run_micro_batches(batch, 0, actions, &mut st)?;
        let kernel = |name: &str| {
            let name = name.to_string();
            move |e| RuntimeError::Kernel { kind: "Concat", name, source: Box::new(e) }
        };
        let mut joined = Vec::with_capacity(self.outputs.len());
        if stage + 1 == p {
            let mut per_micro: Vec<Vec<Tensor>> = Vec::with_capacity(m);
            for (micro, o) in st.outputs.into_iter().enumerate() {
                per_micro.push(o.ok_or_else(|| RuntimeError::Pipeline {
                    rank: self.program.rank,
                    problem: format!("the outputs of micro-batch {micro} were never computed"),
                })?);
            }
            for (j, (name, _)) in self.outputs.iter().enumerate() {
                let parts: Vec<Tensor> = per_micro
                    .iter()
                    .map(|outs| {
                        if outs[j].shape().is_empty() {
                            autopar_tensor::kernels::shape::reshape_to(&outs[j], &[1])
                        } else {
                            Ok(outs[j].clone())
                        }
                    })
                    .collect::<std::result::Result<_, _>>()
                    .map_err(kernel(name))?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                joined.push(autopar_tensor::kernels::shape::concat(&refs, 0).map_err(kernel(name))?);
            }
        }
        if p == 1 || !self.result_broadcast {
            return Ok((stage + 1 == p).then_some(joined));
        }
        // Every rank learns the shapes from the plan; the last stage's first rank sends.
        let root = (p - 1) * d;
        let mut out = Vec::with_capacity(self.outputs.len());
        for (j, (name, ty)) in self.outputs.iter().enumerate() {
            let t = match joined.get(j) {
                Some(t) => t.clone(),
                None => {
                    let mut shape = if ty.shape.is_empty() { vec![1] } else { ty.shape.to_vec() };
                    shape[0] *= m;
                    Tensor::zeros(&shape, crate::executor::tensor_dtype(ty.dtype))
                }
            };
            out.push(crate::collective::broadcast_tensor(self.world.as_ref(), &t, &format!("output {name}"), root)?);
        }
        Ok(Some(out))
    }

    /// The executor's collectives: none on one device, where every group has one rank and the
    /// executor runs communication as identities (and may run the graph on a pool thread).
    fn collectives(&self) -> Option<&dyn Collectives> {
        (self.world.size() > 1).then_some(&self.groups as &dyn Collectives)
    }

    /// Every micro-batch: whole passes in order, or the stage's `actions`, with the sharded
    /// parameters all-gathered around them.
    fn run_micro_batches(&mut self, rows: &[(String, Tensor)], first_row: usize, actions: Vec<Action>, st: &mut StepState) -> Result<()> {
        let mut params = std::mem::take(&mut self.params);
        let mut gathered = std::mem::take(&mut self.gathered);
        let this = &*self;
        let run = with_gathered(&this.program.program, &mut params, Some(&this.groups), &mut gathered, |params| -> Result<()> {
            match &this.run {
                Run::Whole(exec) => (0..this.micro_batches).try_for_each(|k| this.whole_pass(exec, params, rows, first_row, k, st)),
                Run::Chunks(_) => actions.into_iter().try_for_each(|a| this.run_action(params, rows, first_row, a, st)),
            }
        });
        self.params = params;
        self.gathered = gathered;
        run
    }

    /// Micro-batch `micro` forward and backward as one graph (its outputs, for inference).
    fn whole_pass(
        &self,
        exec: &Executor,
        params: &mut ParamStore,
        rows: &[(String, Tensor)],
        first_row: usize,
        micro: usize,
        st: &mut StepState,
    ) -> Result<()> {
        let t0 = Instant::now();
        let program = &self.program.program;
        let feeds = program.inputs.iter().map(|slot| self.feed(slot, slot.local, rows, first_row, micro)).collect::<Result<Vec<_>>>()?;
        let micro_batch = MicroBatch { index: micro, count: self.micro_batches };
        let mut out = exec.run_micro(params, &feeds, self.step, self.collectives(), micro_batch)?;
        let mut values = std::mem::take(&mut out.values).into_iter();
        st.note(out);
        if !self.training {
            st.outputs[micro] = Some(values.collect());
        } else {
            st.loss_sum += values.next().expect("the loss is fetched first").to_f64_vec().iter().sum::<f64>();
            if program.accumulation_shard {
                accumulate_scattered(&program.reduce_scatter, &self.program.grads, values, &mut st.acc, None, Some(&self.groups))?;
            } else {
                accumulate_at(&mut st.acc, None, values)?;
            }
        }
        st.busy += t0.elapsed().as_secs_f64();
        Ok(())
    }

    /// One action of a pipeline's schedule: a pass of a chunk over a micro-batch, or a transfer.
    fn run_action(
        &self,
        params: &mut ParamStore,
        rows: &[(String, Tensor)],
        first_row: usize,
        action: Action,
        st: &mut StepState,
    ) -> Result<()> {
        let Run::Chunks(runs) = &self.run else { unreachable!("actions run a pipeline's chunks") };
        let chunks = self.program.chunks();
        let m = self.micro_batches;
        let (d, p) = (self.stage_devices, self.stages);
        let (rank, stage) = (self.program.rank, self.program.stage);
        let groups = Some(&self.groups);
        let slot = |v: Option<Vec<Tensor>>, what: &str, w: Work| {
            v.ok_or_else(|| RuntimeError::Pipeline {
                rank,
                problem: format!("{what} of micro-batch {} (chunk {}) is missing when the schedule needs it", w.micro, w.chunk),
            })
        };
        let t0 = Instant::now();
        match action {
            Action::Compute(w) if w.pass == Pass::Forward => {
                let (cp, run) = (&chunks[w.chunk], &runs[w.chunk]);
                let micro = MicroBatch { index: w.micro, count: m };
                let mut feeds = self.data_feeds(&cp.graph, rows, first_row, w.micro)?;
                if !cp.recv.is_empty() {
                    let recv = slot(st.received[w.chunk][w.micro].take(), "the received activations", w)?;
                    feeds.extend(cp.recv.iter().copied().zip(recv));
                }
                let mut out = run.forward.run_micro(params, &feeds, self.step, groups.map(|g| g as &dyn Collectives), micro)?;
                let mut values = std::mem::take(&mut out.values).into_iter();
                st.note(out);
                st.to_send[w.chunk][w.micro] = Some(values.by_ref().take(cp.send.len()).collect());
                if cp.loss.is_some() {
                    st.loss_sum += values.next().expect("the loss is fetched").to_f64_vec().iter().sum::<f64>();
                }
                if !cp.outputs.is_empty() {
                    st.outputs[w.micro] = Some(values.by_ref().take(cp.outputs.len()).collect());
                }
                st.saved[w.chunk][w.micro] = Some(values.collect());
                st.busy += t0.elapsed().as_secs_f64();
            }
            Action::Compute(w) => {
                let (cp, run) = (&chunks[w.chunk], &runs[w.chunk]);
                let micro = MicroBatch { index: w.micro, count: m };
                let mut feeds = self.data_feeds(&cp.backward, rows, first_row, w.micro)?;
                feeds.extend(cp.saved_in.iter().copied().zip(slot(st.saved[w.chunk][w.micro].take(), "the saved activations", w)?));
                // The gradients of the float values this chunk sent, in order.
                let mut dv = if run.grad_types.is_empty() {
                    Vec::new().into_iter()
                } else {
                    slot(st.grads_in[w.chunk][w.micro].take(), "the received gradients", w)?.into_iter()
                };
                for (k, &v) in cp.send.iter().enumerate() {
                    if cp.graph.node(v).ty.dtype.is_float() {
                        let t = dv.next().expect("one gradient per float value sent");
                        if let Some(id) = cp.grad_in[k] {
                            feeds.push((id, t));
                        }
                    }
                }
                let mut out = run.backward.run_micro(params, &feeds, self.step, groups.map(|g| g as &dyn Collectives), micro)?;
                let mut values = std::mem::take(&mut out.values).into_iter();
                st.note(out);
                // One gradient per float value received (autodiff gives zeros where none flows back).
                let n_back = cp.grad_out.iter().flatten().count();
                st.grads_back[w.chunk][w.micro] = Some(values.by_ref().take(n_back).collect());
                // gradient_accumulation_shard: each micro-batch's gradients are reduce-scattered
                // at once, so only the rank's pieces accumulate.
                if self.program.program.accumulation_shard {
                    let names: Vec<String> = cp.param_grads.iter().map(|(n, _)| n.clone()).collect();
                    accumulate_scattered(&run.scatter, &names, values, &mut st.acc, Some(&run.at), groups)?;
                } else {
                    accumulate_at(&mut st.acc, Some(&run.at), values)?;
                }
                st.busy += t0.elapsed().as_secs_f64();
            }
            Action::Send { work, peer } => {
                let dest = peer * d + rank % d;
                let piece = work.chunk * p + stage;
                let (values, tag) = if work.pass == Pass::Forward {
                    (st.to_send[work.chunk][work.micro].take(), transfer_tag(work, piece))
                } else {
                    (st.grads_back[work.chunk][work.micro].take(), transfer_tag(work, piece - 1))
                };
                for t in slot(values, "a value to send", work)? {
                    send_tensor(self.world.as_ref(), &t, dest, work.micro, tag)?;
                }
            }
            Action::Recv { work, peer } => {
                let src = peer * d + rank % d;
                let run = &runs[work.chunk];
                let piece = work.chunk * p + stage;
                let (types, tag) = if work.pass == Pass::Forward {
                    (&run.recv_types, transfer_tag(work, piece - 1))
                } else {
                    (&run.grad_types, transfer_tag(work, piece))
                };
                let got: Vec<Tensor> =
                    types.iter().map(|(s, t)| recv_tensor(self.world.as_ref(), s, *t, src, work.micro, tag)).collect::<Result<_>>()?;
                if work.pass == Pass::Forward {
                    st.received[work.chunk][work.micro] = Some(got);
                } else {
                    st.grads_in[work.chunk][work.micro] = Some(got);
                }
            }
        }
        Ok(())
    }

    /// Every network input the batch gives holds the rows `first_row..` of a global batch of
    /// `micro_batches` micro-batches, at least those this rank reads, and the input's other
    /// dimensions.
    fn check_batch(&self, rows: &[(String, Tensor)], first_row: usize) -> Result<()> {
        let m = self.micro_batches;
        for slot in &self.program.program.inputs {
            let Some((_, t)) = rows.iter().find(|(n, _)| *n == slot.name) else { continue };
            let mut want = slot.layout.shape().to_vec();
            let fits = match (want.first_mut(), slot.slice.first()) {
                (Some(per), Some(r)) => {
                    let micro_rows = *per;
                    *per *= m;
                    let got = t.shape().first().copied().unwrap_or(0);
                    let (need_start, need_end) = (r.start, (m - 1) * micro_rows + r.end);
                    first_row <= need_start && first_row + got >= need_end && first_row + got <= *per && t.shape()[1..] == want[1..]
                }
                _ => t.shape() == want.as_slice(),
            };
            if !fits {
                let dtype = self.program.program.graph.node(slot.local).ty.dtype;
                return Err(RuntimeError::FeedMismatch {
                    name: slot.name.clone(),
                    shape: want,
                    dtype,
                    got: t.shape().to_vec(),
                    got_dtype: graph_dtype(t.dtype()),
                });
            }
        }
        Ok(())
    }

    /// Input `slot`'s feed (for node `node`) of micro-batch `micro`: this rank's slice of its
    /// rows, from `rows`, which hold the global batch's rows `first_row..`.
    fn feed(&self, slot: &InputSlot, node: NodeId, rows: &[(String, Tensor)], first_row: usize, micro: usize) -> Result<(NodeId, Tensor)> {
        let program = &self.program.program;
        let dtype = program.graph.node(slot.local).ty.dtype;
        let t = rows.iter().find(|(n, _)| *n == slot.name).map(|(_, t)| t).ok_or_else(|| RuntimeError::MissingFeed {
            name: slot.name.clone(),
            shape: slot.layout.shape().to_vec(),
            dtype,
        })?;
        let per = slot.layout.shape().first().copied().unwrap_or(1);
        let mut ranges: Vec<Range<usize>> = slot.slice.clone();
        if let Some(r) = ranges.first_mut() {
            let (start, end) = (r.start + micro * per, r.end + micro * per);
            match (start.checked_sub(first_row), end.checked_sub(first_row)) {
                (Some(s), Some(e)) if e <= t.shape().first().copied().unwrap_or(0) => *r = s..e,
                _ => {
                    return Err(RuntimeError::FeedMismatch {
                        name: slot.name.clone(),
                        shape: slot.layout.shape().to_vec(),
                        dtype,
                        got: t.shape().to_vec(),
                        got_dtype: graph_dtype(t.dtype()),
                    })
                }
            }
        }
        Ok((node, slice_tensor(t, &ranges)?))
    }

    /// The data inputs of a pipeline piece's `graph` for micro-batch `micro`.
    fn data_feeds(&self, graph: &Graph, rows: &[(String, Tensor)], first_row: usize, micro: usize) -> Result<Vec<(NodeId, Tensor)>> {
        let mut feeds = Vec::new();
        for (i, node) in graph.nodes().iter().enumerate() {
            if !matches!(node.op, OpKind::Input(_)) || node.name.starts_with("pipe/") || node.name.starts_with("saved/") {
                continue;
            }
            let Some(slot) = self.program.program.inputs.iter().find(|s| s.name == node.name) else { continue };
            feeds.push(self.feed(slot, NodeId(i), rows, first_row, micro)?);
        }
        Ok(feeds)
    }

    /// `parameter_broadcast`: every parameter piece the rank holds is copied from the first
    /// rank of its mirror group (the ranks holding the same piece, along the data-parallel
    /// axes) to the others, so replicas start equal whatever each rank initialised.
    fn broadcast_parameters(&mut self) -> Result<()> {
        let program = &self.program.program;
        for p in program.params.iter().filter(|p| p.mirror.len() > 1) {
            let Some(t) = self.params.get(&p.name) else { continue };
            let out = crate::collective::broadcast_tensor(self.groups.get(&p.mirror)?, t, &p.name, 0)?;
            self.params.insert(&p.name, out);
        }
        Ok(())
    }
}

/// Chunk `c` of `program`'s stage made executable.
fn chunk_run(c: &ChunkProgram, program: &JobProgram, ctx: ExecCtx) -> Result<ChunkRun> {
    let names: Vec<String> = c.param_grads.iter().map(|(n, _)| n.clone()).collect();
    let mut scatter = program.program.reduce_scatter.clone();
    scatter.iter_mut().for_each(|b| b.params.retain(|p| names.contains(p)));
    scatter.retain(|b| !b.params.is_empty());
    Ok(ChunkRun {
        forward: Executor::new(c.graph.clone(), &c.forward_fetch())?.with_ctx(ctx),
        backward: Executor::new(c.backward.clone(), &c.backward_fetch())?.with_ctx(ctx),
        at: names.iter().map(|n| program.grads.iter().position(|g| g == n).expect("a chunk's gradient is the stage's")).collect(),
        scatter,
        recv_types: c.recv.iter().map(|&r| (c.graph.node(r).ty.shape.clone(), c.graph.node(r).ty.dtype)).collect(),
        grad_types: float_sends(c),
    })
}

/// Shapes and dtypes of the float values chunk `cp` sends (their gradients come back).
fn float_sends(cp: &ChunkProgram) -> Vec<(Vec<usize>, autopar_graph::DType)> {
    let g = &cp.graph;
    cp.send.iter().map(|&v| g.node(v).ty.clone()).filter(|ty| ty.dtype.is_float()).map(|ty| (ty.shape, ty.dtype)).collect()
}

/// What one step (or one inference) holds while its micro-batches run: per chunk and
/// micro-batch, what arrived, what is to go and what the backward keeps (a pipeline's); the
/// accumulated gradients, the loss, the outputs of each micro-batch (inference), the passes'
/// statistics and the seconds spent computing.
struct StepState {
    received: Vec<Vec<Option<Vec<Tensor>>>>,
    to_send: Vec<Vec<Option<Vec<Tensor>>>>,
    saved: Vec<Vec<Option<Vec<Tensor>>>>,
    grads_back: Vec<Vec<Option<Vec<Tensor>>>>,
    grads_in: Vec<Vec<Option<Vec<Tensor>>>>,
    acc: Vec<Option<Tensor>>,
    loss_sum: f64,
    outputs: Vec<Option<Vec<Tensor>>>,
    run: RunOutput,
    busy: f64,
}

impl StepState {
    fn new(chunks: usize, micro_batches: usize, grads: usize) -> Self {
        let cells = || vec![vec![None; micro_batches]; chunks];
        Self {
            received: cells(),
            to_send: cells(),
            saved: cells(),
            grads_back: cells(),
            grads_in: cells(),
            acc: vec![None; grads],
            loss_sum: 0.0,
            outputs: vec![None; micro_batches],
            run: RunOutput::default(),
            busy: 0.0,
        }
    }

    /// A pass's statistics added to the step's (timings appended, peaks the largest).
    fn note(&mut self, out: RunOutput) {
        self.run.timings.extend(out.timings);
        self.run.peak_live = self.run.peak_live.max(out.peak_live);
        self.run.peak_live_bytes = self.run.peak_live_bytes.max(out.peak_live_bytes);
    }
}
