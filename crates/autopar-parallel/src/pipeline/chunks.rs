//! A pipeline's pieces as one rank runs them ([`ChunkProgram`]).
//!
//! With `pipeline_interleave` the network is cut into `chunks * stages` pieces whose stages
//! repeat (piece `k` runs on stage `k % stages` as its chunk `k / stages`): a rank runs one
//! program per chunk, and piece `k` sends to piece `k + 1`, the last stage's chunk `c` to the
//! first stage's chunk `c + 1`. A value produced on stage `a` and used up to stage `b` travels
//! through every stage between (relayed, so each transfer goes to the next stage only); its
//! gradient travels back the same way, each stage adding what it contributed.
//!
//! A piece's graph: its ops, the values received from the previous piece as inputs, the values
//! for the next piece, and for the backward pass the surrogate loss
//! `sum(v * dv)` over the values it sends (`dv`, their gradients, received back) plus, on the
//! last stage, the job's loss seeded with `1/micro_batches`. Differentiating it gives the
//! stage's parameter gradients and the gradients of what it received. The graph is then cut in
//! two: the forward pass (run when the schedule says, keeping the values the backward needs)
//! and the backward pass (fed with them).

use autopar_graph::ops::{Add, Fill, Input, LossScale, Mul, ReduceSum};
use autopar_graph::{differentiate_with, Graph, NodeId, OpKind};

use crate::error::{ParallelError, PipelineProblem, Result};
use crate::program::{shard_gradient, RankProgram, RankShardBucket};

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

    /// The inputs of `backward` fed from elsewhere than the batch: the saved values and the
    /// gradients of what the forward pass sent.
    pub fn backward_received(&self) -> Vec<NodeId> {
        self.saved_in.iter().chain(self.grad_in.iter().flatten()).copied().collect()
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

/// Piece `piece` of `pieces` (of a pipeline of `stages` stages) cut from `fwd` (a position's
/// forward program, its nodes carrying their pieces); `loss_seed` is the loss's gradient per
/// micro-batch (None: no training); the gradients of `scatter_in_pass`'s parameters are
/// reduce-scattered in the backward pass ([`crate::program::shard_gradient`]).
pub(crate) fn chunk_program(
    fwd: &RankProgram,
    piece: usize,
    pieces: usize,
    stages: usize,
    loss_seed: Option<f64>,
    scatter_in_pass: &[RankShardBucket],
) -> Result<ChunkProgram> {
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
        sg.node_mut(id).recompute = node.recompute;
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
        let seeded = sg.add("pipe/loss_seed", LossScale { factor: seed }, &[l])?;
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
        // A level3 parameter's gradient is its gathered slice's ([`crate::ParamSlot::gathered`]).
        let gathered: std::collections::HashMap<&str, NodeId> =
            fwd.params.iter().filter_map(|p| Some((p.name.as_str(), map[p.gathered?.0]?))).collect();
        let params: Vec<(String, NodeId)> = (0..sg.len())
            .filter_map(|i| match &sg.nodes()[i].op {
                OpKind::Parameter(p) if p.trainable => {
                    let name = &sg.nodes()[i].name;
                    Some((name.clone(), gathered.get(name.as_str()).copied().unwrap_or(NodeId(i))))
                }
                _ => None,
            })
            .collect();
        let float_recv: Vec<NodeId> = recv.iter().copied().filter(|&r| sg.node(r).ty.dtype.is_float()).collect();
        let wrt: Vec<NodeId> = float_recv.iter().copied().chain(params.iter().map(|(_, p)| *p)).collect();
        // Level2 and level3: each parameter's gradient reduce-scattered as soon as it is whole.
        let first_param = float_recv.len();
        let d = differentiate_with(&mut sg, total, &wrt, &mut |g, k, grad| match k.checked_sub(first_param) {
            Some(p) => shard_gradient(g, &params[p].0, grad, scatter_in_pass),
            None => Ok(grad),
        })?;
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
            let copy = backward.node_mut(id);
            copy.pipeline_stage = node.pipeline_stage;
            copy.recompute = node.recompute;
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
