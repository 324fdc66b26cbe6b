//! A training or inference job as data, every mode and shape alike: [`JobPlan`] (the network
//! planned on one stage's devices, its stages, micro-batches and schedule) and one rank's share
//! of it ([`JobProgram`]). [`crate::assemble_job`] makes one from a network and a parallel
//! context.
//!
//! A job without pipeline stages is a pipeline of one stage: its plan has `stages == 1` and one
//! chunk, and each of its micro-batches runs forward and backward as one graph
//! ([`Passes::Whole`]). A pipeline's ranks run their stage's pieces ([`Passes::Chunks`]) in the
//! order of its schedule. Everything after the micro-batches (gradient buckets, shared
//! parameters, clipping, the update) is the same for both, and so is every option.
//!
//! Every stage has the same number of devices, so the network is planned once on one stage's
//! devices: each op gets its strategy there, and a value crossing from one stage to a later one
//! has the same layout on both, so the rank at position `i` of a stage sends its slice to the
//! rank at position `i` of the next (`rank + N/P`, as MindSpore pairs them).

use std::collections::BTreeSet;

use autopar_graph::NodeId;

use crate::context::{ParallelContext, ParallelMode};
use crate::cost::{Memory, RankCost};
use crate::error::{ParallelError, PipelineProblem, Result};
use crate::pipeline::chunks::{chunk_program, ChunkProgram};
use crate::pipeline::schedule::{build, simulate, PipelineShape, Schedule, SimCosts};
use crate::pipeline::stages::{assign_stages, balance_stages, casts_with_their_readers, has_stages, number_chunks};
use crate::plan::ParallelPlan;
use crate::planner::{plan_network, PlanRequest};
use crate::program::{rank_program, RankProgram};

/// Chunks per stage of an interleaved pipeline whose ops autopar places itself (the model
/// placed none and no pipeline split was given).
pub const DEFAULT_CHUNKS: usize = 2;

/// A job: the network planned on one stage's devices, each op's stage, the micro-batches and
/// the schedule that runs them. A job without stages has one stage and one chunk.
#[derive(Clone, Debug)]
pub struct JobPlan {
    /// The number of pipeline stages (`pipeline_stages`; 1 without a pipeline).
    pub stages: usize,
    /// Chunks (virtual stages) per stage: 1, or more with `pipeline_interleave`.
    pub chunks: usize,
    /// Micro-batches per step (gradient accumulation without a pipeline).
    pub micro_batches: usize,
    /// Devices of the whole job, every stage's together.
    pub device_num: usize,
    /// The network (built for one micro-batch) planned on `device_num / stages` devices; in a
    /// pipeline each node's `pipeline_stage` is its piece: chunk `c` of stage `s` is piece
    /// `c * stages + s`, and the pieces run in order (the stage itself without interleaving).
    pub plan: ParallelPlan,
    /// Every node's stage in `plan.graph` (None: parameters, inputs and constants, which every
    /// stage using them holds).
    pub stage_of: Vec<Option<usize>>,
    /// Each stage's actions of one step, in order.
    pub schedule: Schedule,
    /// `pipeline_result_broadcast`: inference outputs reach every rank, not only the last stage's.
    pub result_broadcast: bool,
}

impl JobPlan {
    /// A job of one stage (no pipeline) from the plan of its network, running `micro_batches`
    /// micro-batches per step (gradient accumulation).
    pub fn single(plan: ParallelPlan, micro_batches: usize) -> Result<Self> {
        if micro_batches == 0 {
            return Err(ParallelError::MicroBatches { given: 0, batch: 0 });
        }
        let stage_of = plan.graph.nodes().iter().map(|n| (!n.is_stageless()).then_some(0)).collect();
        let schedule = build(PipelineShape::new(1, micro_batches, 1), plan.context.pipeline_config.pipeline_scheduler)?;
        Ok(Self { stages: 1, chunks: 1, micro_batches, device_num: plan.device_num, plan, stage_of, schedule, result_broadcast: false })
    }

    /// Whether the job runs in pieces (pipeline stages, or interleaved chunks).
    pub fn is_pipeline(&self) -> bool {
        self.pieces() > 1
    }

    /// Devices of one stage.
    pub fn stage_devices(&self) -> usize {
        self.device_num / self.stages
    }

    /// The stage of global rank `rank` and its position in the stage.
    pub fn place(&self, rank: usize) -> (usize, usize) {
        (rank / self.stage_devices(), rank % self.stage_devices())
    }

    /// Pieces of the network: `stages * chunks`.
    pub fn pieces(&self) -> usize {
        self.stages * self.chunks
    }

    /// The parallel mode of the job.
    pub fn mode(&self) -> ParallelMode {
        self.plan.mode
    }

    /// The stages that use each parameter, by name, in graph order.
    pub fn param_stages(&self) -> Vec<(String, Vec<usize>)> {
        let g = &self.plan.graph;
        let users = g.users();
        g.parameters()
            .into_iter()
            .map(|p| {
                let stages: BTreeSet<usize> = users[p.0].iter().filter_map(|u| self.stage_of[u.0]).collect();
                (g.node(p).name.clone(), stages.into_iter().collect())
            })
            .collect()
    }

    /// The program of global rank `rank`: what it runs every step.
    pub fn program(&self, rank: usize) -> Result<JobProgram> {
        if rank >= self.device_num {
            return Err(ParallelError::RankOutOfRange { rank, devices: self.device_num });
        }
        let (stage, position) = self.place(rank);
        if !self.is_pipeline() {
            let program = rank_program(&self.plan, rank)?;
            let grads: Vec<String> = program.grads.iter().map(|(n, _)| n.clone()).collect();
            let norm_counted = grads.iter().filter(|n| first_holder(&program, n, position)).cloned().collect();
            return Ok(JobProgram { rank, stage, position, program, passes: Passes::Whole, grads, shared: Vec::new(), norm_counted });
        }
        // The forward program of the position: the loss gathered, nothing differentiated yet.
        let mut forward_plan = self.plan.clone();
        let loss_seed = forward_plan.gradients.loss_seed / self.micro_batches as f64;
        let training = forward_plan.loss.take().is_some();
        let fwd = rank_program(&forward_plan, position)?;
        let mut program = rank_program(&self.plan, position)?;
        let chunks: Vec<ChunkProgram> = (0..self.chunks)
            .map(|c| {
                let piece = c * self.stages + stage;
                chunk_program(&fwd, piece, self.pieces(), self.stages, training.then_some(loss_seed), &program.scatter_in_pass)
            })
            .collect::<Result<_>>()?;
        let held = held_params(&chunks);
        let grads = param_names(&chunks);
        // The stage syncs and shards its own parameters (every rank of a group is in this
        // stage and holds the same ones, so the packing agrees).
        program.all_gather.iter_mut().for_each(|b| b.params.retain(|p| held.contains(p)));
        program.all_gather.retain(|b| !b.params.is_empty());
        program.reduce_scatter.iter_mut().for_each(|b| b.params.retain(|p| grads.contains(p)));
        program.reduce_scatter.retain(|b| !b.params.is_empty());
        program.scatter_in_pass.iter_mut().for_each(|b| b.params.retain(|p| grads.contains(p)));
        program.scatter_in_pass.retain(|b| !b.params.is_empty());
        program.accumulation_shard &= !program.reduce_scatter.is_empty();
        program.buckets.iter_mut().for_each(|b| b.params.retain(|p| grads.contains(p)));
        program.buckets.retain(|b| !b.params.is_empty());
        let param_stages = self.param_stages();
        let shared = self
            .shared_partitions()
            .into_iter()
            .map(|(stages, partition)| {
                let params = param_stages.iter().filter(|(n, s)| *s == stages && held.contains(n)).map(|(n, _)| n.clone()).collect();
                SharedGroup { partition, params }
            })
            .collect();
        // A gradient counts towards a global norm once: on the first stage using the parameter,
        // on the first rank of the stage holding its piece.
        let norm_counted = grads
            .iter()
            .filter(|name| {
                let first_stage = param_stages.iter().find(|(n, _)| n == *name).is_none_or(|(_, s)| s.first() == Some(&stage));
                first_stage && first_holder(&program, name, position)
            })
            .cloned()
            .collect();
        Ok(JobProgram { rank, stage, position, program, passes: Passes::Chunks(chunks), grads, shared, norm_counted })
    }

    /// The groups of global ranks that hold copies of the same shared parameters: for each set
    /// of stages sharing one, the ranks at each position of those stages. Every rank derives
    /// the same list (a partition per set).
    fn shared_partitions(&self) -> Vec<(Vec<usize>, Vec<Vec<usize>>)> {
        let d = self.stage_devices();
        let mut sets: Vec<Vec<usize>> = self.param_stages().into_iter().map(|(_, s)| s).filter(|s| s.len() > 1).collect();
        sets.sort();
        sets.dedup();
        sets.into_iter()
            .map(|stages| {
                let mut groups: Vec<Vec<usize>> = (0..d).map(|i| stages.iter().map(|s| s * d + i).collect()).collect();
                for r in 0..self.device_num {
                    if !stages.contains(&(r / d)) {
                        groups.push(vec![r]);
                    }
                }
                (stages, groups)
            })
            .collect()
    }
}

/// Whether the rank at `position` is the first of the ranks storing the same piece of parameter
/// `name` (a name the program lacks counts as first).
fn first_holder(program: &RankProgram, name: &str, position: usize) -> bool {
    program.param(name).is_none_or(|p| p.mirror.iter().min().is_none_or(|&r| r == position))
}

/// Each trainable parameter of `chunks`, by name, once (a parameter several chunks use has its
/// gradients summed over them), in chunk order.
fn param_names(chunks: &[ChunkProgram]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (n, _) in chunks.iter().flat_map(|c| &c.param_grads) {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names
}

/// Every parameter `chunks` read, by name, once.
fn held_params(chunks: &[ChunkProgram]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for n in chunks.iter().flat_map(|c| c.graph.nodes()) {
        if matches!(n.op, autopar_graph::OpKind::Parameter(_)) && !names.contains(&n.name) {
            names.push(n.name.clone());
        }
    }
    names
}

/// How a rank runs each micro-batch.
#[derive(Clone, Debug)]
pub enum Passes {
    /// One piece: forward and backward of a micro-batch run as one graph, the program's.
    Whole,
    /// The stage's pieces of a pipeline, in chunk order: each a forward and a backward pass run
    /// when the schedule says.
    Chunks(Vec<ChunkProgram>),
}

/// Parameters of which several stages hold copies, and the partition of the world's ranks
/// whose groups hold the same copies (every rank splits the world by it, in the same order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedGroup {
    /// The partition: for each position of the sharing stages, their ranks; every other rank alone.
    pub partition: Vec<Vec<usize>>,
    /// The shared parameters this rank holds, in graph order (empty on the other stages).
    pub params: Vec<String>,
}

/// One rank's share of a job: its stage and position, the network's program at its position,
/// and how it runs each micro-batch.
#[derive(Clone, Debug)]
pub struct JobProgram {
    /// The rank, counted in the world.
    pub rank: usize,
    /// The rank's stage, counted from 0 (0 without a pipeline).
    pub stage: usize,
    /// Position in the stage (the rank of the stage's communicator; the rank without a pipeline).
    pub position: usize,
    /// The whole network's program at this position (parameter and input slots, communicator
    /// partitions, in the stage's ranks), its gradient buckets and the parallel optimizer's
    /// shards restricted to the stage's own parameters.
    pub program: RankProgram,
    /// How each micro-batch runs.
    pub passes: Passes,
    /// The stage's trainable parameters, once each, in the order their gradients accumulate.
    pub grads: Vec<String>,
    /// Parameters shared with other stages (a pipeline's), by partition.
    pub shared: Vec<SharedGroup>,
    /// The gradients this rank counts in a norm over the whole job (each distinct piece once).
    pub norm_counted: Vec<String>,
}

impl JobProgram {
    /// The stage's chunks (empty for a job without pieces).
    pub fn chunks(&self) -> &[ChunkProgram] {
        match &self.passes {
            Passes::Whole => &[],
            Passes::Chunks(c) => c,
        }
    }

    /// Every parameter the rank holds, by name.
    pub fn held_params(&self) -> Vec<String> {
        match &self.passes {
            Passes::Whole => self.program.params.iter().map(|p| p.name.clone()).collect(),
            Passes::Chunks(chunks) => held_params(chunks),
        }
    }

    /// What this rank is predicted to hold for a step of `job`: its parameters (a pipeline
    /// rank: its stage's), their gradients and `optimizer_slots` optimizer state tensors each,
    /// and the activations. Without pieces those are the step's peak
    /// ([`RankCost::of`](crate::RankCost::of)); a pipeline rank keeps the values its chunks save
    /// for the backward pass of every micro-batch its schedule has in flight at once, plus the
    /// largest single pass's own peak.
    /// The communication buffers are those of a communicator that packs a fused collective's
    /// parts (MPI's): [`JobProgram::memory_on`] tells.
    pub fn memory(&self, job: &JobPlan, optimizer_slots: usize) -> Result<Memory> {
        self.memory_on(job, optimizer_slots, true)
    }

    /// [`JobProgram::memory`] on a communicator that packs a fused collective's parts into one
    /// buffer (`packs`: MPI's) or works where they lie (the in-process one).
    pub fn memory_on(&self, job: &JobPlan, optimizer_slots: usize, packs: bool) -> Result<Memory> {
        let chunks = match &self.passes {
            Passes::Whole => {
                let memory = RankCost::of(&self.program, optimizer_slots)?.memory;
                let gathered = Memory::gathered_slices(&self.program, |_| true);
                if job.micro_batches < 2 {
                    return Ok(memory.with_comm_buffers(&self.program, |_| true, gathered, packs));
                }
                // Gradient accumulation: each micro-batch forms its gradients beside the running
                // sums of the earlier ones.
                let sums = memory.gradients - Memory::bucket_buffers(&self.program, |_| true);
                let memory = Memory { peak_activations: memory.peak_activations + sums, ..memory };
                return Ok(memory.with_comm_buffers(&self.program, |_| true, gathered, packs));
            }
            Passes::Chunks(c) => c,
        };
        let held: BTreeSet<String> = held_params(chunks).into_iter().collect();
        let mut memory = Memory::of_params(&self.program, optimizer_slots, |n| held.contains(n));
        let bytes = |g: &autopar_graph::Graph, v: &NodeId| g.node(*v).ty.numel() * g.node(*v).ty.dtype.size();
        let simulation = simulate(&job.schedule, SimCosts::unit(job.schedule.shape)).map_err(ParallelError::Schedule)?;
        let in_flight = simulation.peak_in_flight.get(self.stage).copied().unwrap_or(0);
        let (mut saved, mut pass_peak, mut pass_activations) = (0usize, 0usize, 0usize);
        for c in chunks {
            saved = saved.max(c.saved.iter().map(|v| bytes(&c.graph, v)).sum());
            let forward = c.graph.schedule(&c.forward_fetch())?.peak_bytes(&c.graph);
            let backward = c.backward.schedule(&c.backward_fetch())?;
            let grads: BTreeSet<usize> = c.param_grads.iter().map(|(_, g)| g.0).collect();
            pass_peak = pass_peak.max(forward).max(backward.peak_bytes(&c.backward));
            pass_activations = pass_activations.max(forward).max(backward.peak_bytes_where(&c.backward, |i| !grads.contains(&i)));
        }
        let gathered = Memory::gathered_slices(&self.program, |n| held.contains(n));
        memory.peak_activations = saved.saturating_mul(in_flight).saturating_add(pass_peak) + gathered;
        memory.activations = saved.saturating_mul(in_flight).saturating_add(pass_activations) + gathered;
        Ok(memory.with_comm_buffers(&self.program, |n| held.contains(n), gathered, packs))
    }
}

/// Plan a job in its stages: `req.graph` is the network for one micro-batch; with
/// `pipeline_stages` > 1 its ops carry their stages (see [`assign_stages`]), or, when the model
/// placed none, are cut into stages of about equal FLOPs ([`balance_stages`]). With
/// `pipeline_config.pipeline_interleave` every stage runs several chunks: the model's stages
/// repeat in execution order ([`number_chunks`]), or autopar cuts [`DEFAULT_CHUNKS`] per stage.
/// The strategy file, if any, is `req`'s (read by the caller).
pub fn plan_stages(req: &PlanRequest<'_>, micro_batches: usize) -> Result<JobPlan> {
    let ctx = req.context;
    ctx.validate()?;
    let p = ctx.pipeline_stages.max(1);
    if p == 1 {
        return JobPlan::single(plan_network(req)?, micro_batches);
    }
    let mut graph = req.graph.clone();
    casts_with_their_readers(&mut graph);
    let chunks = match (has_stages(&graph), ctx.pipeline_config.pipeline_interleave) {
        (true, true) => number_chunks(&mut graph, p)?,
        (true, false) => 1,
        (false, interleave) => {
            let chunks = if interleave { DEFAULT_CHUNKS } else { 1 };
            balance_stages(&mut graph, p * chunks);
            chunks
        }
    };
    let piece_of = assign_stages(&graph, p * chunks, req.loss).map_err(|e| in_stages(e, p, chunks))?;
    for (i, s) in piece_of.iter().enumerate() {
        graph.node_mut(NodeId(i)).pipeline_stage = *s;
    }
    let mut stage_ctx: ParallelContext = ctx.clone();
    stage_ctx.device_num = ctx.stage_device_num();
    stage_ctx.pipeline_stages = 1;
    stage_ctx.search.pipelined = p > 1;
    stage_ctx.pipeline_result_broadcast = false;
    stage_ctx.pipeline_config.pipeline_interleave = false;
    let plan = plan_network(&PlanRequest {
        graph: &graph,
        loss: req.loss,
        context: &stage_ctx,
        strategy_file: req.strategy_file,
        profile: req.profile,
    })?;
    let stage_of = plan.graph.nodes().iter().map(|n| n.pipeline_stage.map(|k| k % p)).collect();
    let schedule = build(PipelineShape::new(p, micro_batches, chunks), ctx.pipeline_config.pipeline_scheduler)?;
    Ok(JobPlan {
        stages: p,
        chunks,
        micro_batches,
        device_num: ctx.device_num,
        plan,
        stage_of,
        schedule,
        result_broadcast: ctx.pipeline_result_broadcast,
    })
}

/// A problem [`assign_stages`] found among the pieces of an interleaved pipeline, told in
/// stages and chunks (the pieces are the stages without interleaving).
fn in_stages(e: ParallelError, stages: usize, chunks: usize) -> ParallelError {
    if chunks == 1 {
        return e;
    }
    match e {
        ParallelError::Pipeline { problem: PipelineProblem::EmptyStage { stage: piece, .. } } => {
            ParallelError::Pipeline { problem: PipelineProblem::EmptyChunk { stage: piece % stages, chunk: piece / stages, chunks } }
        }
        ParallelError::Pipeline { problem: PipelineProblem::LossNotOnLastStage { name, stage: piece, .. } } => ParallelError::Pipeline {
            problem: PipelineProblem::LossNotOnLastChunk { name, stage: piece % stages, chunk: piece / stages, stages, chunks },
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_among_the_pieces_of_an_interleaved_pipeline_are_told_in_stages_and_chunks() {
        let empty = || ParallelError::Pipeline { problem: PipelineProblem::EmptyStage { stage: 3, stages: 4 } };
        let e = in_stages(empty(), 2, 2).to_string();
        assert!(e.contains("chunk 1 (virtual stage) of stage 1 has no operator"), "{e}");
        assert_eq!(in_stages(empty(), 4, 1).to_string(), empty().to_string(), "without interleaving pieces are stages");
        let loss = ParallelError::Pipeline { problem: PipelineProblem::LossNotOnLastStage { name: "loss".into(), stage: 2, stages: 4 } };
        let e = in_stages(loss, 2, 2).to_string();
        assert!(e.contains("chunk 1 of stage 0") && e.contains("last chunk (1) of the last stage (1)"), "{e}");
    }
}
