//! A pipeline job planned as data ([`PipelinePlan`]) and one rank's share of it
//! ([`StageProgram`]).
//!
//! Every stage has the same number of devices, so the network is planned once on one stage's
//! devices: each op gets its strategy there, and a value crossing from one stage to a later one
//! has the same layout on both, so the rank at position `i` of a stage sends its slice to the
//! rank at position `i` of the next (`rank + N/P`, as MindSpore pairs them). The local program of
//! position `i` is then cut by stage. A value produced on stage `a` and used up to stage `b`
//! travels through every stage between (relayed, so each transfer goes to the next stage only);
//! its gradient travels back the same way, each stage adding what it contributed.
//!
//! With `pipeline_interleave` the network is cut into `chunks * stages` pieces whose stages
//! repeat (piece `k` runs on stage `k % stages` as its chunk `k / stages`), and everything
//! above holds piece by piece: a rank runs one program per chunk, and piece `k` sends to piece
//! `k + 1`, the last stage's chunk `c` to the first stage's chunk `c + 1`.
//!
//! A piece's graph: its ops, the values received from the previous piece as inputs, the values
//! for the next piece, and for the backward pass the surrogate loss
//! `sum(v * dv)` over the values it sends (`dv`, their gradients, received back) plus, on the
//! last stage, the job's loss seeded with `1/micro_batches`. Differentiating it gives the
//! stage's parameter gradients and the gradients of what it received. The graph is then cut in
//! two: the forward pass (run when the schedule says, keeping the values the backward needs)
//! and the backward pass (fed with them).

use std::collections::BTreeSet;

use autopar_graph::ops::{Add, Fill, Input, Mul, ReduceSum, Scale};
use autopar_graph::{differentiate, Graph, NodeId, OpKind};

use crate::context::ParallelContext;
use crate::error::{ParallelError, PipelineProblem, Result};
use crate::pipeline::schedule::{build, PipelineShape, Schedule};
use crate::pipeline::stages::{assign_stages, balance_stages, has_stages, number_chunks};
use crate::plan::ParallelPlan;
use crate::planner::{plan_job, PlanRequest};
use crate::program::{rank_program, RankProgram};

/// Chunks per stage of an interleaved pipeline whose ops autopar places itself (the model
/// placed none and no `--pipeline-split` was given).
pub const DEFAULT_CHUNKS: usize = 2;

/// A pipeline job: the network planned on one stage's devices, each op's stage, the schedule.
#[derive(Clone, Debug)]
pub struct PipelinePlan {
    /// The number of pipeline stages (`pipeline_stages`).
    pub stages: usize,
    /// Chunks (virtual stages) per stage: 1, or more with `pipeline_interleave`.
    pub chunks: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Devices of the whole job, every stage's together.
    pub device_num: usize,
    /// The network (built for one micro-batch) planned on `device_num / stages` devices; each
    /// node's `pipeline_stage` is its piece: chunk `c` of stage `s` is piece `c * stages + s`,
    /// and the pieces run in order (the stage itself without interleaving).
    pub plan: ParallelPlan,
    /// Every node's stage in `plan.graph` (None: parameters, inputs and constants, which every
    /// stage using them holds).
    pub stage_of: Vec<Option<usize>>,
    /// Each stage's actions of one step, in order.
    pub schedule: Schedule,
    /// `pipeline_result_broadcast`: inference outputs reach every rank, not only the last stage's.
    pub result_broadcast: bool,
}

impl PipelinePlan {
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
}

/// Plan a pipeline job: `req.graph` is the network for one micro-batch; its ops carry their
/// stages (see [`assign_stages`]), or, when the model placed none, are cut into stages of
/// about equal FLOPs ([`balance_stages`]); `req.context.pipeline_stages` > 1. With
/// `pipeline_config.pipeline_interleave` every stage runs several chunks: the model's stages
/// repeat in execution order ([`number_chunks`]), or autopar cuts [`DEFAULT_CHUNKS`] per stage.
pub fn plan_pipeline(req: &PlanRequest<'_>, micro_batches: usize) -> Result<PipelinePlan> {
    let ctx = req.context;
    ctx.validate()?;
    let p = ctx.pipeline_stages.max(1);
    let mut graph = req.graph.clone();
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
    let plan = plan_job(&PlanRequest {
        graph: &graph,
        loss: req.loss,
        context: &stage_ctx,
        strategy_file: req.strategy_file,
        profile: req.profile,
    })?;
    let stage_of = plan.graph.nodes().iter().map(|n| n.pipeline_stage.map(|k| k % p)).collect();
    let schedule = build(PipelineShape::new(p, micro_batches, chunks), ctx.pipeline_config.pipeline_scheduler)?;
    Ok(PipelinePlan {
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

/// One rank's share of a pipeline job: the program of its position, cut into its chunks.
#[derive(Clone, Debug)]
pub struct StageProgram {
    /// The rank, counted in the world.
    pub rank: usize,
    /// The rank's stage, counted from 0.
    pub stage: usize,
    /// Position in the stage (the rank of the stage's communicator).
    pub position: usize,
    /// The whole network's program at this position (parameter and input slots, gradient
    /// buckets and communicator partitions, in the stage's ranks).
    pub program: RankProgram,
    /// The stage's chunks, in order (one without interleaving).
    pub chunks: Vec<ChunkProgram>,
}

impl StageProgram {
    /// Each trainable parameter of the stage, by name, once (a parameter several chunks use
    /// has its gradients summed over them), in chunk order.
    pub fn param_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for (n, _) in self.chunks.iter().flat_map(|c| &c.param_grads) {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
    }

    /// Every parameter the stage's chunks read, by name, once.
    pub fn held_params(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for n in self.chunks.iter().flat_map(|c| c.graph.nodes()) {
            if matches!(n.op, OpKind::Parameter(_)) && !names.contains(&n.name) {
                names.push(n.name.clone());
            }
        }
        names
    }
}

/// One piece of the network as one rank runs it: its forward, and its backward cut from the
/// surrogate loss.
#[derive(Clone, Debug)]
pub struct ChunkProgram {
    /// The piece: chunk `c` of stage `s` is piece `c * stages + s`.
    pub piece: usize,
    /// The piece's forward, surrogate loss and backward graph.
    pub graph: Graph,
    /// Inputs of `graph` for the values received from the previous piece, in transfer order.
    pub recv: Vec<NodeId>,
    /// Nodes of `graph` whose values go to the next piece, in transfer order.
    pub send: Vec<NodeId>,
    /// The job's loss on the last piece.
    pub loss: Option<NodeId>,
    /// The network's outputs, whole, on the last piece of a job without a loss (inference).
    pub outputs: Vec<NodeId>,
    /// Nodes of the forward pass that the backward pass reads.
    pub saved: Vec<NodeId>,
    /// The backward pass: its inputs for `saved` (same order), for the gradients of `send`
    /// (None: not differentiable), the data inputs it reads by name.
    pub backward: Graph,
    /// Inputs of `backward` for the values of `saved`, in the same order.
    pub saved_in: Vec<NodeId>,
    /// Inputs of `backward` for the gradients of `send`, in transfer order (None: not differentiable).
    pub grad_in: Vec<Option<NodeId>>,
    /// Gradients of `recv` (None: not differentiable), and of this stage's trainable parameters.
    pub grad_out: Vec<Option<NodeId>>,
    /// Each trainable parameter of the piece, by name, with the node of `backward` that is its gradient.
    pub param_grads: Vec<(String, NodeId)>,
}

impl ChunkProgram {
    /// The forward pass's fetches: what it sends, the loss, the outputs, what it saves.
    pub fn forward_fetch(&self) -> Vec<NodeId> {
        self.send.iter().chain(&self.loss).chain(&self.outputs).chain(&self.saved).copied().collect()
    }

    /// The backward pass's fetches: the received values' gradients, then the parameters'.
    pub fn backward_fetch(&self) -> Vec<NodeId> {
        self.grad_out.iter().flatten().chain(self.param_grads.iter().map(|(_, g)| g)).copied().collect()
    }
}

/// The values that cross from piece `k` to `k + 1` in the local graph `g` (whose nodes'
/// `pipeline_stage` are their pieces): produced on a piece up to `k`, used on a later one.
/// Ascending node order (both sides derive the same list).
pub fn boundary(g: &Graph, k: usize) -> Vec<NodeId> {
    let users = g.users();
    (0..g.len())
        .filter(|&i| {
            let Some(s) = g.nodes()[i].pipeline_stage else { return false };
            s <= k && users[i].iter().any(|u| g.node(*u).pipeline_stage.is_some_and(|t| t > k))
        })
        .map(NodeId)
        .collect()
}

/// The program of global rank `rank`.
pub fn stage_program(pp: &PipelinePlan, rank: usize) -> Result<StageProgram> {
    if rank >= pp.device_num {
        return Err(ParallelError::RankOutOfRange { rank, devices: pp.device_num });
    }
    let (stage, position) = pp.place(rank);
    // The forward program of the position: the loss gathered, nothing differentiated yet.
    let mut forward_plan = pp.plan.clone();
    let loss_seed = forward_plan.gradients.loss_seed / pp.micro_batches as f64;
    let training = forward_plan.loss.take().is_some();
    let fwd = rank_program(&forward_plan, position)?;
    let program = rank_program(&pp.plan, position)?;
    let chunks = (0..pp.chunks)
        .map(|c| chunk_program(&fwd, c * pp.stages + stage, pp.pieces(), pp.stages, training.then_some(loss_seed)))
        .collect::<Result<_>>()?;
    Ok(StageProgram { rank, stage, position, program, chunks })
}

/// Piece `piece` of `pieces` (of a pipeline of `stages` stages) cut from `fwd` (a position's
/// forward program, its nodes carrying their pieces); `loss_seed` is the loss's gradient per
/// micro-batch (None: no training).
fn chunk_program(fwd: &RankProgram, piece: usize, pieces: usize, stages: usize, loss_seed: Option<f64>) -> Result<ChunkProgram> {
    let g = &fwd.graph;
    let training = loss_seed.is_some();
    let last = piece + 1 == pieces;
    let mut sg = Graph::new();
    let mut map: Vec<Option<NodeId>> = vec![None; g.len()];
    let mut recv = Vec::new();
    if piece > 0 {
        for v in boundary(g, piece - 1) {
            let node = g.node(v);
            let id = sg.add(&format!("pipe/{}", node.name), Input { shape: node.ty.shape.clone(), dtype: node.ty.dtype }, &[])?;
            map[v.0] = Some(id);
            recv.push(id);
        }
    }
    // Stage-less nodes (parameters, inputs, constants) are copied where used.
    fn copy(g: &Graph, sg: &mut Graph, map: &mut [Option<NodeId>], v: NodeId) -> Result<NodeId> {
        if let Some(id) = map[v.0] {
            return Ok(id);
        }
        let node = g.node(v);
        let inputs = node.inputs.iter().map(|x| copy(g, sg, map, *x)).collect::<Result<Vec<_>>>()?;
        let id = sg.add(&node.name, node.op.clone(), &inputs)?;
        map[v.0] = Some(id);
        Ok(id)
    }
    for (i, node) in g.nodes().iter().enumerate() {
        if node.pipeline_stage == Some(piece) && map[i].is_none() {
            copy(g, &mut sg, &mut map, NodeId(i))?;
        }
    }
    let send: Vec<NodeId> =
        if last { Vec::new() } else { boundary(g, piece).iter().map(|v| map[v.0].expect("sent values are on the piece")).collect() };
    let loss = if last && training { Some(map[fwd.outputs[0].0].expect("the loss is on the last piece")) } else { None };
    let mut outputs = Vec::new();
    if last && !training {
        for &o in &fwd.outputs {
            let name = &g.node(o).name;
            outputs.push(map[o.0].ok_or_else(|| ParallelError::Pipeline {
                problem: PipelineProblem::OutputNotOnLastStage {
                    name: name.clone(),
                    stage: g.node(o).pipeline_stage.unwrap_or(0) % stages,
                },
            })?);
        }
    }
    // The surrogate loss.
    let mut terms = Vec::new();
    let mut grad_inputs = Vec::new();
    for &v in &send {
        let ty = sg.node(v).ty.clone();
        if !training || !ty.dtype.is_float() {
            grad_inputs.push(None);
            continue;
        }
        let name = sg.node(v).name.trim_start_matches("pipe/").to_string();
        let dv = sg.add(&format!("pipe/grad/{name}"), Input { shape: ty.shape.clone(), dtype: ty.dtype }, &[])?;
        grad_inputs.push(Some(dv));
        let prod = sg.add(&sg.unique_name(&format!("pipe/dot/{name}")), Mul, &[v, dv])?;
        let axes = (0..ty.shape.len() as i64).collect();
        terms.push(sg.add(&sg.unique_name(&format!("pipe/dot_sum/{name}")), ReduceSum { axes, keep_dims: false }, &[prod])?);
    }
    if let (Some(l), Some(seed)) = (loss, loss_seed) {
        let ty = sg.node(l).ty.clone();
        let seeded = sg.add("pipe/loss_seed", Scale { factor: seed }, &[l])?;
        let axes = (0..ty.shape.len() as i64).collect();
        terms.push(sg.add("pipe/loss_sum", ReduceSum { axes, keep_dims: false }, &[seeded])?);
    }
    let mut grad_out = vec![None; recv.len()];
    let mut param_grads = Vec::new();
    if training {
        let mut total = match terms.first() {
            Some(&t) => t,
            None => sg.add("pipe/no_loss", Fill { shape: Vec::new(), dtype: autopar_graph::DType::F32, value: 0.0 }, &[])?,
        };
        for &t in terms.iter().skip(1) {
            total = sg.add(&sg.unique_name("pipe/surrogate"), Add, &[total, t])?;
        }
        let params: Vec<(String, NodeId)> = (0..sg.len())
            .filter_map(|i| match &sg.nodes()[i].op {
                OpKind::Parameter(p) if p.trainable => Some((sg.nodes()[i].name.clone(), NodeId(i))),
                _ => None,
            })
            .collect();
        let float_recv: Vec<NodeId> = recv.iter().copied().filter(|&r| sg.node(r).ty.dtype.is_float()).collect();
        let wrt: Vec<NodeId> = float_recv.iter().copied().chain(params.iter().map(|(_, p)| *p)).collect();
        let d = differentiate(&mut sg, total, &wrt)?;
        for (k, r) in recv.iter().enumerate() {
            grad_out[k] = d.of(*r);
        }
        param_grads = params.iter().map(|(n, p)| (n.clone(), d.of(*p).expect("requested"))).collect();
    }
    // Cut: the forward pass computes what it sends and the loss; the backward pass the rest.
    let fwd_roots: Vec<NodeId> = send.iter().chain(&loss).copied().collect();
    let in_fwd = ancestors(&sg, &fwd_roots);
    let bwd_roots: Vec<NodeId> = grad_out.iter().flatten().chain(param_grads.iter().map(|(_, g)| g)).copied().collect();
    let in_bwd = ancestors(&sg, &bwd_roots);
    let mut backward = Graph::new();
    let mut bmap: Vec<Option<NodeId>> = vec![None; sg.len()];
    let mut saved = Vec::new();
    let mut saved_in = Vec::new();
    for i in 0..sg.len() {
        if !in_bwd[i] {
            continue;
        }
        let node = sg.nodes()[i].clone();
        let fwd_value = in_fwd[i] && !matches!(node.op, OpKind::Parameter(_));
        let id = if fwd_value {
            let id = backward.add(&format!("saved/{}", node.name), Input { shape: node.ty.shape.clone(), dtype: node.ty.dtype }, &[])?;
            saved.push(NodeId(i));
            saved_in.push(id);
            id
        } else {
            let inputs: Vec<NodeId> = node.inputs.iter().map(|x| bmap[x.0].expect("inputs precede users")).collect();
            let id = backward.add(&node.name, node.op.clone(), &inputs)?;
            backward.node_mut(id).pipeline_stage = node.pipeline_stage;
            id
        };
        bmap[i] = Some(id);
    }
    let remap = |x: NodeId| bmap[x.0].expect("backward fetches are in the backward pass");
    let grad_in = grad_inputs.iter().map(|g| g.and_then(|g| bmap[g.0])).collect();
    let grad_out = grad_out.iter().map(|g| g.map(remap)).collect();
    let param_grads = param_grads.into_iter().map(|(n, g)| (n, remap(g))).collect();
    Ok(ChunkProgram { piece, graph: sg, recv, send, loss, outputs, saved, backward, saved_in, grad_in, grad_out, param_grads })
}

/// Which nodes of `g` the `roots` depend on (the roots included).
fn ancestors(g: &Graph, roots: &[NodeId]) -> Vec<bool> {
    let mut keep = vec![false; g.len()];
    for r in roots {
        keep[r.0] = true;
    }
    for i in (0..g.len()).rev() {
        if keep[i] {
            for x in &g.nodes()[i].inputs {
                keep[x.0] = true;
            }
        }
    }
    keep
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
