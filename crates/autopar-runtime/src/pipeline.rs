//! Pipeline-parallel training: each rank runs its stage's share of every micro-batch in the
//! order its schedule gives ([`autopar_parallel::pipeline::Schedule`]), sending activations to
//! the next piece and gradients to the previous one over the world communicator, keeping the
//! values its backward passes need only while their micro-batch is in flight. Without
//! interleaving a stage is one piece; with it, a stage runs several chunks, and the last
//! stage's chunk `c` sends to the first stage's chunk `c + 1`. After the last micro-batch the
//! accumulated gradients (a parameter used by several chunks summed over them) are
//! synchronised (within the stage along the data axes, and across the stages that hold a copy
//! of a shared parameter) and the optimizer updates the stage's parameters once.
//!
//! Pipeline inference ([`PipelineJob::inference`], [`StageTrainer::predict`]) runs the
//! schedule's forward actions alone; the outputs reach the last stage's ranks, or every rank
//! with `pipeline_result_broadcast`.

use std::collections::BTreeMap;
use std::ops::Range;

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{Graph, NodeId, OpKind};
use autopar_parallel::pipeline::{plan_pipeline, stage_program, Action, ChunkProgram, Pass, PipelinePlan, StageProgram, Work};
use autopar_parallel::{ParallelContext, ParamSlot, PlanRequest, RankBucket};
use autopar_tensor::{DType, ExecCtx, Tensor};

use crate::collective::CommGroups;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::{Executor, MicroBatch, ParamStore};
use crate::optim::Optimizer;
use crate::parallel::{assemble_slices, slice_tensor};
use crate::train::{accumulate_at, finite_loss, sync_bucket, BucketBuffer};

/// A pipeline job: the network (built for one micro-batch), planned into stages.
#[derive(Clone, Debug)]
pub struct PipelineJob {
    plan: PipelinePlan,
}

impl PipelineJob {
    /// Plan `graph` (one micro-batch's network, its ops carrying their stages) for training
    /// `loss` with `micro_batches` micro-batches per step under `ctx` (`pipeline_stages` > 1).
    pub fn new(graph: &Graph, loss: NodeId, ctx: &ParallelContext, micro_batches: usize) -> Result<Self> {
        Self::planned(graph, loss, ctx, micro_batches, None, None)
    }

    /// Like [`PipelineJob::new`], with the operator strategies of a strategy file (applied
    /// inside the stages, as in [`crate::parallel::ParallelJob::planned`]) and auto_parallel's
    /// cost model (inside the stages) under `profile` (None: the built-in one).
    pub fn planned(
        graph: &Graph,
        loss: NodeId,
        ctx: &ParallelContext,
        micro_batches: usize,
        strategy_file: Option<&autopar_parallel::StrategyItems>,
        profile: Option<&autopar_parallel::DeviceProfile>,
    ) -> Result<Self> {
        let req = PlanRequest { graph, loss: Some(loss), context: ctx, strategy_file, profile };
        Ok(Self { plan: plan_pipeline(&req, micro_batches).map_err(|e| RuntimeError::Plan(Box::new(e)))? })
    }

    /// Plan `graph` (one micro-batch's network, without a loss: its outputs are what it
    /// computes) for pipeline inference with `micro_batches` micro-batches per call
    /// ([`StageTrainer::predict`]); `ctx.pipeline_result_broadcast` sends the outputs to every rank.
    pub fn inference(graph: &Graph, ctx: &ParallelContext, micro_batches: usize) -> Result<Self> {
        let req = PlanRequest { graph, loss: None, context: ctx, strategy_file: None, profile: None };
        Ok(Self { plan: plan_pipeline(&req, micro_batches).map_err(|e| RuntimeError::Plan(Box::new(e)))? })
    }

    /// The pipeline plan: stages, micro-batches, each op's stage and the schedule.
    pub fn plan(&self) -> &PipelinePlan {
        &self.plan
    }

    /// Ranks of the job, all stages together.
    pub fn device_num(&self) -> usize {
        self.plan.device_num
    }
}

/// The groups of global ranks that hold copies of the same shared parameters: for each set of
/// stages sharing one, the ranks at each position of those stages. Every rank derives the same
/// list (a partition per set).
fn shared_partitions(plan: &PipelinePlan) -> Vec<(Vec<usize>, Vec<Vec<usize>>)> {
    let d = plan.stage_devices();
    let mut sets: Vec<Vec<usize>> = plan.param_stages().into_iter().map(|(_, s)| s).filter(|s| s.len() > 1).collect();
    sets.sort();
    sets.dedup();
    sets.into_iter()
        .map(|stages| {
            let mut groups: Vec<Vec<usize>> = (0..d).map(|i| stages.iter().map(|s| s * d + i).collect()).collect();
            for r in 0..plan.device_num {
                if !stages.contains(&(r / d)) {
                    groups.push(vec![r]);
                }
            }
            (stages, groups)
        })
        .collect()
}

/// One chunk of a rank's stage as the trainer runs it.
struct ChunkRun {
    forward: Executor,
    backward: Executor,
    /// Where each of the chunk's parameter gradients accumulates among the stage's (`grads`).
    at: Vec<usize>,
    /// The reduce-scatter buckets of the chunk's gradients (`gradient_accumulation_shard`).
    scatter: Vec<autopar_parallel::RankShardBucket>,
    /// Shapes and dtypes of what the chunk receives, and of the gradients of what it sends
    /// (its float values), in transfer order.
    recv_types: Vec<(Vec<usize>, autopar_graph::DType)>,
    grad_types: Vec<(Vec<usize>, autopar_graph::DType)>,
}

/// One rank of a pipeline job.
pub struct StageTrainer {
    program: StageProgram,
    plan: PipelinePlan,
    chunks: Vec<ChunkRun>,
    /// The stage's trainable parameters, once each, in the order the gradients accumulate.
    grads: Vec<String>,
    params: ParamStore,
    /// The parallel optimizer's all-gathered parameter slices, reused every step.
    gathered: crate::shard::GatherBuffers,
    groups: CommGroups,
    /// The stage's communicator (its groups are split from it).
    _stage_comm: Box<dyn Communicator>,
    /// Shared parameters and the communicator across the stages holding their copies.
    shared: Vec<(Vec<String>, Box<dyn Communicator>)>,
    buckets: Vec<(RankBucket, BucketBuffer)>,
    step: u64,
    /// Clip the gradients to this global norm over every stage (None: no clipping), and the
    /// gradients this rank counts in the norm (decided once, in `set_clip_grad_norm`).
    clip_grad_norm: Option<(f64, Vec<String>)>,
    /// Seconds the last step spent computing (forward and backward passes) and in all.
    busy: f64,
    wall: f64,
}

impl std::fmt::Debug for StageTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageTrainer").field("rank", &self.program.rank).field("stage", &self.program.stage).finish()
    }
}

impl StageTrainer {
    /// Rank `world.rank()`'s trainer, its parameters cut from the full values in `full`.
    /// Collective over `world`.
    pub fn new(job: &PipelineJob, world: &dyn Communicator, full: &ParamStore) -> Result<Self> {
        let plan = job.plan.clone();
        if world.size() != plan.device_num {
            return Err(RuntimeError::DeviceCount { job: plan.device_num, ranks: world.size() });
        }
        let mut program = stage_program(&plan, world.rank()).map_err(|e| RuntimeError::Plan(Box::new(e)))?;
        let held = program.held_params();
        // The parallel optimizer's buckets cover the stage's own parameters (every rank of a
        // shard group is in this stage and holds the same ones, so the packing agrees).
        let graded = program.param_names();
        let rp = &mut program.program;
        rp.all_gather.iter_mut().for_each(|b| b.params.retain(|p| held.contains(p)));
        rp.all_gather.retain(|b| !b.params.is_empty());
        rp.reduce_scatter.iter_mut().for_each(|b| b.params.retain(|p| graded.contains(p)));
        rp.reduce_scatter.retain(|b| !b.params.is_empty());
        rp.accumulation_shard &= !rp.reduce_scatter.is_empty();
        let mut params = ParamStore::new();
        for slot in program.program.params.iter().filter(|s| held.contains(&s.name)) {
            params.insert(&slot.name, slice_tensor(full.require(&slot.name)?, &slot.slice)?);
        }
        // The stage's communicator, then its groups (named by positions in the stage).
        let d = plan.stage_devices();
        let stage_groups: Vec<Vec<usize>> = (0..plan.stages).map(|s| (s * d..(s + 1) * d).collect()).collect();
        let stage_comm = world
            .split(&stage_groups)
            .map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: 0 }))?
            .expect("every rank is in a stage");
        let groups = CommGroups::create(stage_comm.as_ref(), &program.program.partitions)?;
        let mut shared = Vec::new();
        let param_stages = plan.param_stages();
        for (k, (stages, partition)) in shared_partitions(&plan).into_iter().enumerate() {
            let sub = world.split(&partition).map_err(RuntimeError::comm(CommPhase::CreateGroups { partition: 1 + k }))?;
            let Some(sub) = sub.filter(|c| c.size() > 1) else { continue };
            let names: Vec<String> =
                param_stages.iter().filter(|(n, s)| *s == stages && held.contains(n)).map(|(n, _)| n.clone()).collect();
            shared.push((names, sub));
        }
        let mut buckets = Vec::new();
        let names: Vec<&str> = graded.iter().map(String::as_str).collect();
        for b in &program.program.buckets {
            let mut b = b.clone();
            b.params.retain(|p| graded.contains(p));
            if b.params.is_empty() {
                continue;
            }
            let buffer = BucketBuffer::over_names(&b, &names)?;
            buckets.push((b, buffer));
        }
        let ctx = if plan.device_num == 1 { ExecCtx::parallel() } else { ExecCtx::serial() };
        let mut chunks = Vec::with_capacity(program.chunks.len());
        for c in &program.chunks {
            let names: Vec<String> = c.param_grads.iter().map(|(n, _)| n.clone()).collect();
            let mut scatter = program.program.reduce_scatter.clone();
            scatter.iter_mut().for_each(|b| b.params.retain(|p| names.contains(p)));
            scatter.retain(|b| !b.params.is_empty());
            chunks.push(ChunkRun {
                forward: Executor::new(c.graph.clone(), &c.forward_fetch())?.with_ctx(ctx),
                backward: Executor::new(c.backward.clone(), &c.backward_fetch())?.with_ctx(ctx),
                at: names.iter().map(|n| graded.iter().position(|g| g == n).expect("a chunk's gradient is the stage's")).collect(),
                scatter,
                recv_types: c.recv.iter().map(|&r| (c.graph.node(r).ty.shape.clone(), c.graph.node(r).ty.dtype)).collect(),
                grad_types: float_sends(c),
            });
        }
        Ok(Self {
            program,
            plan,
            chunks,
            grads: graded,
            params,
            gathered: Default::default(),
            groups,
            _stage_comm: stage_comm,
            shared,
            buckets,
            step: 0,
            clip_grad_norm: None,
            busy: 0.0,
            wall: 0.0,
        })
    }

    /// This rank's program in its stage.
    pub fn program(&self) -> &StageProgram {
        &self.program
    }

    /// The job's pipeline plan.
    pub fn plan(&self) -> &PipelinePlan {
        &self.plan
    }

    /// The stage's parameters as this rank stores them between steps: its slices, or its
    /// optimizer shards of them.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// The stage's parameter slices, for changing them.
    pub fn params_mut(&mut self) -> &mut ParamStore {
        &mut self.params
    }

    /// The slots of the parameters this rank holds (its stage's, shared ones included).
    pub fn param_slots(&self) -> Vec<&ParamSlot> {
        self.program.program.params.iter().filter(|s| self.params.get(&s.name).is_some()).collect()
    }

    /// Clip every step's gradients to global norm `max_norm` over the whole network (None: no
    /// clipping): each distinct piece is counted once, on the first rank of its stage holding
    /// it, and a shared parameter on the first stage using it.
    pub fn set_clip_grad_norm(&mut self, max_norm: Option<f64>) -> Result<()> {
        let Some(m) = max_norm else {
            self.clip_grad_norm = None;
            return Ok(());
        };
        crate::optim::check_max_norm(m)?;
        let stages = self.plan.param_stages();
        let (stage, position) = (self.program.stage, self.program.position);
        let counted = self
            .grads
            .iter()
            .filter(|name| {
                let first_stage = stages.iter().find(|(n, _)| n == *name).is_none_or(|(_, s)| s.first() == Some(&stage));
                let first_holder = self.program.program.param(name).is_none_or(|p| p.mirror.iter().min().is_none_or(|&r| r == position));
                first_stage && first_holder
            })
            .cloned()
            .collect();
        self.clip_grad_norm = Some((m, counted));
        Ok(())
    }

    /// Continue the step counter (the key of the dropout masks) at `step`.
    pub fn set_steps(&mut self, step: u64) {
        self.step = step;
    }

    /// MindSpore's `sync_pipeline_shared_parameters`: every copy of a shared parameter takes
    /// the value of the first stage using it (its owner), e.g. after loading weights that
    /// might differ. Collective over the ranks holding copies (every rank calls it).
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

    /// One training step on the global batch `batch` (by input name; every micro-batch is an
    /// equal part of its rows): every micro-batch through the schedule, gradients synchronised,
    /// one update. Returns the step's loss (the mean of the micro-batches' losses), on every
    /// rank. Collective over `world`.
    pub fn step(&mut self, world: &dyn Communicator, opt: &mut dyn Optimizer, batch: &[(String, Tensor)]) -> Result<f64> {
        let m = self.plan.micro_batches;
        let p = self.plan.stages;
        let stage = self.program.stage;
        if self.plan.plan.loss.is_none() {
            return Err(RuntimeError::Pipeline {
                rank: self.program.rank,
                problem: "the job was planned without a loss (PipelineJob::inference): it predicts, it does not train".into(),
            });
        }
        let mut st = StepState::new(self.chunks.len(), m, self.grads.len());
        self.check_batch(batch)?;
        let actions = self.plan.schedule.stages[stage].clone();
        let start = std::time::Instant::now();
        let run = self.run_actions(world, batch, actions, &mut st);
        self.busy = st.busy;
        run?;
        let (acc, loss_sum) = (st.acc, st.loss_sum);
        let mut grads: Vec<(String, Tensor)> = Vec::with_capacity(acc.len());
        for (name, g) in self.grads.iter().zip(acc) {
            grads.push((name.clone(), g.ok_or_else(|| RuntimeError::MissingGradient { name: name.clone() })?));
        }
        if !self.program.program.accumulation_shard {
            crate::shard::scatter_gradients(&self.program.program, &mut grads, Some(&self.groups))?;
        }
        for (b, buffer) in &mut self.buckets {
            sync_bucket(b, buffer, &mut grads, Some(&self.groups))?;
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
        if let Some((max_norm, counted)) = &self.clip_grad_norm {
            crate::optim::clip_gradients(
                &mut grads,
                *max_norm,
                |name| counted.iter().any(|c| c == name),
                |local| {
                    let mut v = vec![local];
                    world.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(RuntimeError::comm(CommPhase::Run))?;
                    Ok(v[0])
                },
            )?;
        }
        opt.step(&mut self.params, &grads)?;
        self.step += 1;
        self.wall = start.elapsed().as_secs_f64();
        // The loss, from the last stage's first position to every rank.
        let last_stage = stage + 1 == p;
        let mine = if last_stage && self.program.position == 0 { loss_sum / m as f64 } else { 0.0 };
        let mut v = vec![mine];
        world.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(RuntimeError::comm(CommPhase::Run))?;
        finite_loss(v[0], self.step)
    }

    /// Pipeline inference on the global batch `batch` (by input name; every micro-batch an
    /// equal part of its rows) with a job planned without a loss ([`PipelineJob::inference`]):
    /// every micro-batch's forward through the stages, in the order of the schedule's forward
    /// actions. Returns the network's outputs, each the micro-batches' results joined along
    /// dimension 0 (a scalar output: one value per micro-batch), on the last stage's ranks, and
    /// with `pipeline_result_broadcast` on every rank (sent from the last stage's first rank);
    /// None on the other ranks without it. Collective over `world`.
    pub fn predict(&mut self, world: &dyn Communicator, batch: &[(String, Tensor)]) -> Result<Option<Vec<Tensor>>> {
        let m = self.plan.micro_batches;
        let (stage, p, d) = (self.program.stage, self.plan.stages, self.plan.stage_devices());
        if self.plan.plan.loss.is_some() {
            return Err(RuntimeError::Pipeline {
                rank: self.program.rank,
                problem: "predict runs a job planned without a loss (PipelineJob::inference); this one trains".into(),
            });
        }
        self.check_batch(batch)?;
        let mut st = StepState::new(self.chunks.len(), m, 0);
        let actions: Vec<Action> = self.plan.schedule.stages[stage]
            .iter()
            .copied()
            .filter(|a| match a {
                Action::Compute(w) | Action::Send { work: w, .. } | Action::Recv { work: w, .. } => w.pass == Pass::Forward,
            })
            .collect();
        self.run_actions(world, batch, actions, &mut st)?;
        let g = &self.plan.plan.graph;
        let kernel = |name: &str| {
            let name = name.to_string();
            move |e| RuntimeError::Kernel { kind: "Concat", name, source: Box::new(e) }
        };
        let mut joined = Vec::with_capacity(g.outputs.len());
        if stage + 1 == p {
            let mut per_micro: Vec<Vec<Tensor>> = Vec::with_capacity(m);
            for (micro, o) in st.outputs.into_iter().enumerate() {
                per_micro.push(o.ok_or_else(|| RuntimeError::Pipeline {
                    rank: self.program.rank,
                    problem: format!("the outputs of micro-batch {micro} were never computed"),
                })?);
            }
            for (j, &o) in g.outputs.iter().enumerate() {
                let name = &g.node(o).name;
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
        if !self.plan.result_broadcast {
            return Ok((stage + 1 == p).then_some(joined));
        }
        // Every rank learns the shapes from the plan; the last stage's first rank sends.
        let root = (p - 1) * d;
        let mut out = Vec::with_capacity(g.outputs.len());
        for (j, &o) in g.outputs.iter().enumerate() {
            let node = g.node(o);
            let t = match joined.get(j) {
                Some(t) => t.clone(),
                None => {
                    let mut shape = if node.ty.shape.is_empty() { vec![1] } else { node.ty.shape.to_vec() };
                    shape[0] *= m;
                    Tensor::zeros(&shape, crate::executor::tensor_dtype(node.ty.dtype))
                }
            };
            out.push(crate::collective::broadcast_tensor(world, &t, &format!("output {}", node.name), root)?);
        }
        Ok(Some(out))
    }

    /// `actions` in order, with the sharded parameters all-gathered around them.
    fn run_actions(
        &mut self,
        world: &dyn Communicator,
        batch: &[(String, Tensor)],
        actions: Vec<Action>,
        st: &mut StepState,
    ) -> Result<()> {
        let mut params = std::mem::take(&mut self.params);
        let mut gathered = std::mem::take(&mut self.gathered);
        let this = &*self;
        let run =
            crate::shard::with_gathered(&this.program.program, &mut params, Some(&this.groups), &mut gathered, |params| -> Result<()> {
                for action in actions {
                    this.run_action(world, params, batch, action, st)?;
                }
                Ok(())
            });
        self.params = params;
        self.gathered = gathered;
        run
    }

    /// One action of the schedule: a pass of a chunk over a micro-batch, or a transfer.
    fn run_action(
        &self,
        world: &dyn Communicator,
        params: &mut ParamStore,
        batch: &[(String, Tensor)],
        action: Action,
        st: &mut StepState,
    ) -> Result<()> {
        let m = self.plan.micro_batches;
        let (d, p) = (self.plan.stage_devices(), self.plan.stages);
        let (rank, stage) = (self.program.rank, self.program.stage);
        let slot = |v: Option<Vec<Tensor>>, what: &str, w: Work| {
            v.ok_or_else(|| RuntimeError::Pipeline {
                rank,
                problem: format!("{what} of micro-batch {} (chunk {}) is missing when the schedule needs it", w.micro, w.chunk),
            })
        };
        let t0 = std::time::Instant::now();
        match action {
            Action::Compute(w) if w.pass == Pass::Forward => {
                let (cp, run) = (&self.program.chunks[w.chunk], &self.chunks[w.chunk]);
                let micro = MicroBatch { index: w.micro, count: m };
                let mut feeds = self.data_feeds(&cp.graph, batch, w.micro)?;
                if !cp.recv.is_empty() {
                    let recv = slot(st.received[w.chunk][w.micro].take(), "the received activations", w)?;
                    feeds.extend(cp.recv.iter().copied().zip(recv));
                }
                let out = run.forward.run_micro(params, &feeds, self.step, Some(&self.groups), micro)?;
                let mut values = out.values.into_iter();
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
                let (cp, run) = (&self.program.chunks[w.chunk], &self.chunks[w.chunk]);
                let micro = MicroBatch { index: w.micro, count: m };
                let mut feeds = self.data_feeds(&cp.backward, batch, w.micro)?;
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
                let out = run.backward.run_micro(params, &feeds, self.step, Some(&self.groups), micro)?;
                let mut values = out.values.into_iter();
                // One gradient per float value received (autodiff gives zeros where none flows back).
                let n_back = cp.grad_out.iter().flatten().count();
                st.grads_back[w.chunk][w.micro] = Some(values.by_ref().take(n_back).collect());
                // gradient_accumulation_shard: each micro-batch's gradients are reduce-scattered
                // at once, so only the rank's pieces accumulate.
                if self.program.program.accumulation_shard {
                    crate::shard::accumulate_scattered(
                        &run.scatter,
                        cp.param_grads.iter().map(|(n, _)| n),
                        values,
                        &mut st.acc,
                        Some(&run.at),
                        Some(&self.groups),
                    )?;
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
                    send_tensor(world, &t, dest, work.micro, tag)?;
                }
            }
            Action::Recv { work, peer } => {
                let src = peer * d + rank % d;
                let run = &self.chunks[work.chunk];
                let piece = work.chunk * p + stage;
                let (types, tag) = if work.pass == Pass::Forward {
                    (&run.recv_types, transfer_tag(work, piece - 1))
                } else {
                    (&run.grad_types, transfer_tag(work, piece))
                };
                let got: Vec<Tensor> = types.iter().map(|(s, t)| recv_tensor(world, s, *t, src, work.micro, tag)).collect::<Result<_>>()?;
                if work.pass == Pass::Forward {
                    st.received[work.chunk][work.micro] = Some(got);
                } else {
                    st.grads_in[work.chunk][work.micro] = Some(got);
                }
            }
        }
        Ok(())
    }

    /// Every network input of the step's batch holds exactly `micro_batches` micro-batches of
    /// rows (a longer batch would leave rows unread, a shorter one micro-batches empty).
    fn check_batch(&self, batch: &[(String, Tensor)]) -> Result<()> {
        let m = self.plan.micro_batches;
        for slot in &self.program.program.inputs {
            let Some((_, t)) = batch.iter().find(|(n, _)| *n == slot.name) else { continue };
            let mut want = slot.layout.shape().to_vec();
            if let Some(rows) = want.first_mut() {
                *rows *= m;
            }
            if t.shape() != want.as_slice() {
                let dtype = self.program.program.graph.node(slot.local).ty.dtype;
                return Err(RuntimeError::FeedMismatch {
                    name: slot.name.clone(),
                    shape: want,
                    dtype,
                    got: t.shape().to_vec(),
                    got_dtype: crate::executor::graph_dtype(t.dtype()),
                });
            }
        }
        Ok(())
    }

    /// The data inputs of `graph` for micro-batch `micro`: this rank's slice of its rows.
    fn data_feeds(&self, graph: &Graph, batch: &[(String, Tensor)], micro: usize) -> Result<Vec<(NodeId, Tensor)>> {
        let mut feeds = Vec::new();
        for (i, node) in graph.nodes().iter().enumerate() {
            if !matches!(node.op, OpKind::Input(_)) || node.name.starts_with("pipe/") || node.name.starts_with("saved/") {
                continue;
            }
            let Some(slot) = self.program.program.inputs.iter().find(|s| s.name == node.name) else { continue };
            let t = batch.iter().find(|(n, _)| *n == slot.name).map(|(_, t)| t).ok_or_else(|| RuntimeError::MissingFeed {
                name: slot.name.clone(),
                shape: slot.layout.shape().to_vec(),
                dtype: node.ty.dtype,
            })?;
            let rows = slot.layout.shape().first().copied().unwrap_or(1);
            let mut ranges: Vec<Range<usize>> = slot.slice.clone();
            if let Some(r) = ranges.first_mut() {
                *r = r.start + micro * rows..r.end + micro * rows;
            }
            feeds.push((NodeId(i), slice_tensor(t, &ranges)?));
        }
        Ok(feeds)
    }
}

/// What one step (or one inference) holds while its schedule runs: per chunk and micro-batch,
/// what arrived, what is to go and what the backward keeps; the accumulated gradients, the
/// loss, the outputs of each micro-batch (inference), and the seconds spent computing.
struct StepState {
    received: Vec<Vec<Option<Vec<Tensor>>>>,
    to_send: Vec<Vec<Option<Vec<Tensor>>>>,
    saved: Vec<Vec<Option<Vec<Tensor>>>>,
    grads_back: Vec<Vec<Option<Vec<Tensor>>>>,
    grads_in: Vec<Vec<Option<Vec<Tensor>>>>,
    acc: Vec<Option<Tensor>>,
    loss_sum: f64,
    outputs: Vec<Option<Vec<Tensor>>>,
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
            busy: 0.0,
        }
    }
}

/// Shapes and dtypes of the float values chunk `cp` sends (their gradients come back).
fn float_sends(cp: &ChunkProgram) -> Vec<(Vec<usize>, autopar_graph::DType)> {
    let g = &cp.graph;
    cp.send.iter().map(|&v| g.node(v).ty.clone()).filter(|ty| ty.dtype.is_float()).map(|ty| (ty.shape, ty.dtype)).collect()
}

/// The message tag of the transfer across piece boundary `boundary` (piece `boundary` to
/// `boundary + 1` forward, back for the gradients) of `work`'s micro-batch: sender and
/// receiver derive the same one. It tells micro-batches, boundaries and passes apart up to
/// 128 micro-batches and 64 boundaries (below MPI's least tag bound, 32767); past that tags
/// repeat, which is safe because both sides take the transfers between a pair of ranks in the
/// same order and messages of one tag arrive in order.
fn transfer_tag(work: Work, boundary: usize) -> u32 {
    let pass = u32::from(work.pass == Pass::Backward);
    ((work.micro as u32).wrapping_mul(64).wrapping_add(boundary as u32 % 64).wrapping_mul(2).wrapping_add(pass)) % 16384
}

fn transfer_err(what: String) -> impl FnOnce(autopar_comm::CommError) -> RuntimeError {
    RuntimeError::comm(CommPhase::PipelineTransfer { what })
}

fn send_tensor(world: &dyn Communicator, t: &Tensor, dest: usize, micro: usize, tag: u32) -> Result<()> {
    let err = || transfer_err(format!("send of micro-batch {micro} to rank {dest}"));
    match t.dtype() {
        DType::F32 => world.send((&t.to_vec::<f32>().expect("f32")).into(), dest, tag).map_err(err()),
        _ => world.send((&t.to_f64_vec()).into(), dest, tag).map_err(err()),
    }
}

fn recv_tensor(
    world: &dyn Communicator,
    shape: &[usize],
    dtype: autopar_graph::DType,
    src: usize,
    micro: usize,
    tag: u32,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let err = || transfer_err(format!("receive of micro-batch {micro} from rank {src}"));
    let k = |e| RuntimeError::Kernel { kind: "Recv", name: format!("micro-batch {micro} from rank {src}"), source: Box::new(e) };
    let dt = crate::executor::tensor_dtype(dtype);
    if dt == DType::F32 {
        let mut v = vec![0f32; n];
        world.recv((&mut v).into(), src, tag).map_err(err())?;
        Tensor::from_vec(shape, v).map_err(k)
    } else {
        let mut v = vec![0f64; n];
        world.recv((&mut v).into(), src, tag).map_err(err())?;
        Ok(Tensor::from_vec(shape, v).map_err(k)?.cast(dt))
    }
}

fn all_reduce_tensor(comm: &dyn Communicator, t: &Tensor, name: &str) -> Result<Tensor> {
    let err = RuntimeError::comm(CommPhase::GradientSync { group: comm.world_ranks().to_vec() });
    let k = |e| RuntimeError::Kernel { kind: "AllReduce", name: name.to_string(), source: Box::new(e) };
    if t.dtype() == DType::F32 {
        let mut v = t.to_vec::<f32>().map_err(k)?;
        comm.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(err)?;
        Tensor::from_vec(t.shape(), v).map_err(k)
    } else {
        let mut v = t.to_f64_vec();
        comm.all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum).map_err(err)?;
        Ok(Tensor::from_vec(t.shape(), v).map_err(k)?.cast(t.dtype()))
    }
}

/// The result of an in-process pipeline run.
#[derive(Debug)]
pub struct PipelineRun {
    /// The loss at every step.
    pub losses: Vec<f64>,
    /// Every rank's idle share of each step ([`StageTrainer::last_bubble`]).
    pub bubbles: Vec<Vec<f64>>,
    /// Final parameters, assembled from the stages' slices (a shared parameter from its first
    /// stage).
    pub params: ParamStore,
    /// Each rank's final parameters.
    pub rank_params: Vec<ParamStore>,
}

/// Run `job` on its devices as threads over [`LocalComm`], one step per global batch.
pub fn run_local_pipeline<F>(job: &PipelineJob, batches: &[Vec<(String, Tensor)>], make_opt: F) -> Result<PipelineRun>
where
    F: Fn() -> Result<Box<dyn Optimizer>> + Sync,
{
    let full = ParamStore::init(&job.plan.plan.graph)?;
    let results = LocalComm::run(job.device_num(), |comm| -> Result<(Vec<f64>, Vec<f64>, ParamStore)> {
        let mut t = StageTrainer::new(job, &comm, &full)?;
        let mut opt = make_opt()?;
        let (mut losses, mut bubbles) = (Vec::with_capacity(batches.len()), Vec::with_capacity(batches.len()));
        for b in batches {
            losses.push(t.step(&comm, opt.as_mut(), b)?);
            bubbles.push(t.last_bubble());
        }
        Ok((losses, bubbles, t.params().clone()))
    })
    .map_err(RuntimeError::comm(CommPhase::Run))?;
    let mut losses = Vec::new();
    let mut bubbles = Vec::new();
    let mut stores = Vec::new();
    for (l, b, p) in results {
        losses.push(l);
        bubbles.push(b);
        stores.push(p);
    }
    let params = assemble_pipeline_params(job, &stores)?;
    Ok(PipelineRun { losses: losses.swap_remove(0), bubbles, params, rank_params: stores })
}

/// Every rank's parameter slices gathered so that each rank holds the full parameters (for
/// runs across processes). Collective over `world`.
pub fn gather_pipeline_params(job: &PipelineJob, world: &dyn Communicator, local: &ParamStore) -> Result<ParamStore> {
    let plan = &job.plan;
    let param_stages = plan.param_stages();
    // What each stage's ranks hold, in plan order: every rank computes the same.
    let by_stage: Vec<Vec<&autopar_parallel::ParamPlan>> = (0..plan.stages)
        .map(|stage| plan.plan.params.iter().filter(|p| param_stages.iter().any(|(n, s)| *n == p.name && s.contains(&stage))).collect())
        .collect();
    let held = |r: usize| &by_stage[plan.place(r).0];
    // What a rank stores of each parameter: its slice, or its optimizer shard of it.
    let len = |held: &Vec<&autopar_parallel::ParamPlan>| -> usize { held.iter().map(|p| p.stored_shape().iter().product::<usize>()).sum() };
    let n = world.size();
    let width = by_stage.iter().map(len).max().unwrap_or(0);
    let mut mine = Vec::with_capacity(width);
    for p in held(world.rank()).iter() {
        mine.extend(local.require(&p.name)?.to_f64_vec());
    }
    mine.resize(width, 0.0);
    let mut all = vec![0.0f64; width * n];
    world.all_gather((&mine).into(), (&mut all).into()).map_err(RuntimeError::comm(CommPhase::GatherParameters))?;
    let mut stores = vec![ParamStore::new(); n];
    for (r, store) in stores.iter_mut().enumerate() {
        let mut at = r * width;
        for p in held(r).iter() {
            let shape = p.stored_shape();
            let count: usize = shape.iter().product();
            let t = Tensor::from_vec(&shape, all[at..at + count].to_vec()).map_err(|e| RuntimeError::Kernel {
                kind: "AllGather",
                name: p.name.clone(),
                source: Box::new(e),
            })?;
            store.insert(&p.name, t.cast(crate::executor::tensor_dtype(p.dtype)));
            at += count;
        }
    }
    assemble_pipeline_params(job, &stores)
}

/// Full parameters from every rank's slices: each parameter from the first stage holding it.
pub fn assemble_pipeline_params(job: &PipelineJob, per_rank: &[ParamStore]) -> Result<ParamStore> {
    let plan = &job.plan;
    let d = plan.stage_devices();
    let mut full = ParamStore::new();
    let first_stage: BTreeMap<String, usize> = plan.param_stages().into_iter().filter_map(|(n, s)| s.first().map(|&f| (n, f))).collect();
    for p in &plan.plan.params {
        let Some(&stage) = first_stage.get(&p.name) else { continue };
        full.insert(&p.name, assemble_slices(p, &per_rank[stage * d..(stage + 1) * d])?);
    }
    Ok(full)
}
