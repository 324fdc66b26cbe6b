//! From a [`ParallelPlan`] to one rank's whole training step, [`RankProgram`]: the local
//! forward graph (local ops, the plan's redistributions as communication ops), its backward
//! pass by autodiff (the collectives' adjoints included), the gradient buckets to all-reduce and
//! the parameters the optimizer updates. A pure function of the plan and the rank.

use std::ops::Range;

use autopar_graph::ops::{
    AllGather, AllReduce, AllToAll, Cast, DropoutBlock, LossScale, Pad, ReduceScatter, Reshape, Scale, Slice, TableShard, Transpose,
};
use autopar_graph::{differentiate_with, DType, Graph, LocalCx, Node, NodeId, OpKind, Recompute, ReduceOp};
use autopar_layout::{group_of, DeviceAxis, Step, TensorLayout};

use crate::context::ParallelMode;
use crate::error::{ParallelError, Result};
use crate::plan::{sorted_group, InOpSync, OptShard, ParallelPlan, Redistribution, Site};

/// A parameter of a rank's program.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSlot {
    /// The parameter's name.
    pub name: String,
    /// The parameter's node in the plan's graph and in the local program.
    pub global: NodeId,
    /// The parameter's node in the local program.
    pub local: NodeId,
    /// The model-parallel layout (the forward pass uses the rank's slice of it).
    pub layout: TensorLayout,
    /// The piece of the full parameter this rank stores between steps: its model-parallel
    /// slice, or the rank's part of it when the optimizer shards the parameter.
    pub slice: Vec<Range<usize>>,
    /// Ranks storing the same piece (the mirror group of an unsharded parameter, whose
    /// gradient is all-reduced over it).
    pub mirror: Vec<usize>,
    /// Whether the optimizer updates it.
    pub trainable: bool,
    /// The parallel optimizer's shard: the value is all-gathered over `group` before use.
    pub shard: Option<SlotShard>,
    /// Under `optimizer_level` level3, the program's all-gather of the stored piece (a node
    /// recomputed for the backward pass) whose value, the model-parallel slice, the ops read:
    /// the local parameter node then holds the piece, and the gradient is the slice's. None:
    /// the runtime all-gathers sharded parameters before the forward pass (level1).
    pub gathered: Option<NodeId>,
}

impl ParamSlot {
    /// The node whose value the ops read and whose gradient the backward pass forms: the
    /// level3 all-gather ([`ParamSlot::gathered`]), else the parameter node.
    pub fn value(&self) -> NodeId {
        self.gathered.unwrap_or(self.local)
    }

    /// The shape of what the rank stores ([`ParamSlot::slice`]).
    pub fn stored_shape(&self) -> Vec<usize> {
        self.slice.iter().map(|r| r.len()).collect()
    }
}

/// A rank's place in a parameter's optimizer shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotShard {
    /// The shard group (world ranks, ascending).
    pub group: Vec<usize>,
    /// This rank's position in it: its dimension-0 piece of the model-parallel slice.
    pub index: usize,
}

/// Sharded parameters whose values are all-gathered (over their shard group) or gradients
/// reduce-scattered (over their whole replica group, then all-gathered over `rest`, see
/// [`crate::ShardBucketPlan`]) together: the group, this rank's position in it, the
/// dtype, the parameters in packing order, and the factor applied after a reduce-scatter's sum
/// (the mirror mean, or 1).
#[derive(Clone, Debug, PartialEq)]
pub struct RankShardBucket {
    /// The collective's group (world ranks, ascending): the shard group for an all-gather, the whole replica group for a reduce-scatter.
    pub group: Vec<usize>,
    /// This rank's position in `group`.
    pub index: usize,
    /// Reduce-scatter buckets: the ranks holding the same shard (ascending; this rank alone
    /// when the shard group is the whole replica group).
    pub rest: Vec<usize>,
    /// Ranks in the shard group.
    pub shard_size: usize,
    /// The dtype communicated.
    pub dtype: DType,
    /// The names of the bucket's parameters, in packing order.
    pub params: Vec<String>,
    /// The factor applied after a reduce-scatter's sum: 1/group size under the mirror mean, else 1.
    pub scale: f64,
}

/// A network input of a rank's program.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSlot {
    /// The input's name.
    pub name: String,
    /// The input's node in the plan's graph.
    pub global: NodeId,
    /// The input's node in the local program.
    pub local: NodeId,
    /// The input's layout (the dataset strategy's split of it).
    pub layout: TensorLayout,
    /// This rank's slice of the global input.
    pub slice: Vec<Range<usize>>,
}

/// Gradients all-reduced together: their group (world ranks, ascending), the dtype the buffer
/// is reduced in, and the factor applied after the sum (the mirror mean, or 1).
#[derive(Clone, Debug, PartialEq)]
pub struct RankBucket {
    /// The group the buffer is all-reduced over (world ranks, ascending).
    pub group: Vec<usize>,
    /// The dtype the buffer is reduced in.
    pub dtype: DType,
    /// The names of the bucket's parameters, in order in the buffer.
    pub params: Vec<String>,
    /// The factor applied after the sum: 1/group size under the mirror mean, else 1.
    pub scale: f64,
}

/// What one rank runs every step.
#[derive(Clone, Debug)]
pub struct RankProgram {
    /// The rank, counted in the world.
    pub rank: usize,
    /// The number of devices of the job.
    pub device_num: usize,
    /// The parallel mode of the plan.
    pub mode: ParallelMode,
    /// Local forward (and, for a training job, backward) graph.
    pub graph: Graph,
    /// Local nodes of the plan graph's outputs: whole values, except that a training job
    /// gathers only its loss (first) and leaves the other outputs as the rank's local values
    /// (slices, or partial sums where the producer's layout is partial).
    pub outputs: Vec<NodeId>,
    /// The loss as every rank sees it (the job's loss), for a training job.
    pub loss: Option<NodeId>,
    /// The gradient node of every trainable parameter, by name, in parameter order.
    pub grads: Vec<(String, NodeId)>,
    /// Every parameter of the program, in parameter order.
    pub params: Vec<ParamSlot>,
    /// Every network input of the program.
    pub inputs: Vec<InputSlot>,
    /// Parallel optimizer: sharded values gathered before the forward pass.
    pub all_gather: Vec<RankShardBucket>,
    /// Parallel optimizer: gradients of sharded parameters reduce-scattered after the backward
    /// pass (before `buckets`).
    pub reduce_scatter: Vec<RankShardBucket>,
    /// Parallel optimizer at `optimizer_level` level2 and level3: the buckets whose gradients
    /// the backward pass itself reduce-scatters, each by ops of `graph` placed right after it
    /// is formed, so that `grads` are already the rank's shards (and `reduce_scatter` is
    /// empty).
    pub scatter_in_pass: Vec<RankShardBucket>,
    /// Gradient accumulation reduce-scatters each micro-batch's gradients of sharded
    /// parameters (`gradient_accumulation_shard`), not their sum.
    pub accumulation_shard: bool,
    /// Gradient synchronisation after the backward pass, in order.
    pub buckets: Vec<RankBucket>,
    /// Every group partition the program's collectives use, in first-use order. Every rank
    /// creates the same sub-communicators in this order.
    pub partitions: Vec<Vec<Vec<usize>>>,
}

impl RankProgram {
    /// The parameter named `name`, if the program has one.
    pub fn param(&self, name: &str) -> Option<&ParamSlot> {
        self.params.iter().find(|p| p.name == name)
    }

    /// The communication groups of this rank as MindSpore lists them in its group-info file
    /// (`group_ckpt_save_file`): the groups of the program's collectives in graph order, then
    /// per trainable parameter its optimizer-shard group and the ranks holding the same shard,
    /// or its mirror group; each once, without single ranks and the group of every rank.
    pub fn communication_groups(&self) -> Vec<Vec<usize>> {
        let mut out: Vec<Vec<usize>> = Vec::new();
        let n = self.device_num;
        let mut push = |g: &[usize]| {
            let mut g = g.to_vec();
            g.sort_unstable();
            if g.len() > 1 && g.len() < n && !out.contains(&g) {
                out.push(g);
            }
        };
        for node in self.graph.nodes() {
            if let Some(group) = node.op.collective().and_then(|c| c.group()) {
                push(group);
            }
        }
        for p in self.params.iter().filter(|p| p.trainable) {
            if let Some(s) = &p.shard {
                push(&s.group);
            }
            push(&p.mirror);
        }
        out
    }

    /// The values a training step computes: the loss and every gradient (the forward outputs
    /// for a forward-only program).
    pub fn fetch(&self) -> Vec<NodeId> {
        match self.loss {
            Some(loss) => std::iter::once(loss).chain(self.grads.iter().map(|(_, g)| *g)).collect(),
            None => self.outputs.clone(),
        }
    }
}

/// Every group of the partition of `n` ranks along `axes`, each ascending.
fn partition(axes: &[DeviceAxis], n: usize) -> Vec<Vec<usize>> {
    let mut seen = vec![false; n];
    let mut groups = Vec::new();
    for r in 0..n {
        if !seen[r] {
            let mut g = group_of(r, axes);
            g.sort_unstable();
            for &m in &g {
                seen[m] = true;
            }
            groups.push(g);
        }
    }
    groups
}

/// The group partitions a rank's program communicates over, in first-use order (every rank
/// notes the same ones in the same order).
struct Partitions {
    rank: usize,
    n: usize,
    list: Vec<Vec<Vec<usize>>>,
}

impl Partitions {
    /// Records the partition along `axes` (once) and returns this rank's group in it.
    fn note(&mut self, axes: &[DeviceAxis]) -> Vec<usize> {
        let mine = sorted_group(self.rank, axes);
        if mine.len() > 1 && !self.list.iter().any(|p| p.contains(&mine)) {
            self.list.push(partition(axes, self.n));
        }
        mine
    }
}

struct Emitter {
    graph: Graph,
    rank: usize,
    partitions: Partitions,
}

impl Emitter {
    /// Puts the nodes emitted since `first` on pipeline stage `stage`.
    fn set_stage(&mut self, first: usize, stage: Option<usize>) {
        for j in first..self.graph.len() {
            self.graph.node_mut(NodeId(j)).pipeline_stage = stage;
        }
    }

    fn set_recompute(&mut self, first: usize, recompute: Recompute) {
        for j in first..self.graph.len() {
            self.graph.node_mut(NodeId(j)).recompute = recompute;
        }
    }

    fn note_partition(&mut self, axes: &[DeviceAxis]) -> Vec<usize> {
        self.partitions.note(axes)
    }

    fn add(&mut self, name: &str, op: impl Into<OpKind>, inputs: &[NodeId]) -> Result<NodeId> {
        let name = self.graph.unique_name(name);
        Ok(self.graph.add(&name, op, inputs)?)
    }

    /// Emit the steps of `r` on `x`.
    fn redistribute(&mut self, base: &str, x: NodeId, r: &Redistribution) -> Result<NodeId> {
        let mut cur = x;
        if r.in_f32 {
            cur = self.add(&format!("{base}.to_f32"), Cast::to(DType::F32), &[cur])?;
        }
        for (k, ps) in r.plan.steps.iter().enumerate() {
            let name = format!("{base}.redist{k}");
            let rank = self.rank;
            cur = match &ps.step {
                Step::Slice { dim, axis } => {
                    let shape = self.graph.node(cur).ty.shape.clone();
                    let size = shape[*dim] / axis.size;
                    let mut begin = vec![0; shape.len()];
                    begin[*dim] = axis.coord(rank) * size;
                    let mut sizes = shape.clone();
                    sizes[*dim] = size;
                    self.add(&name, Slice { begin, size: sizes }, &[cur])?
                }
                Step::AllGather { dim, axis } => {
                    let group = self.note_partition(&[*axis]);
                    self.add(&name, AllGather { dim: *dim, group }, &[cur])?
                }
                Step::AllToAll { split_dim, concat_dim, axis } => {
                    let group = self.note_partition(&[*axis]);
                    self.add(&name, AllToAll { split_dim: *split_dim, concat_dim: *concat_dim, group }, &[cur])?
                }
                Step::AllReduce { axes } => {
                    let group = self.note_partition(axes);
                    self.add(&name, AllReduce { op: ReduceOp::Sum, group }, &[cur])?
                }
                Step::ReduceScatter { dim, axis } => {
                    let group = self.note_partition(&[*axis]);
                    self.add(&name, ReduceScatter { op: ReduceOp::Sum, dim: *dim, group }, &[cur])?
                }
                Step::MakePartial { axis } => {
                    let factor = if axis.coord(rank) == 0 { 1.0 } else { 0.0 };
                    self.add(&name, Scale { factor }, &[cur])?
                }
                Step::Permute { .. } => return Err(ParallelError::PermutationInGraph { node: base.to_string() }),
            };
        }
        if r.in_f32 {
            cur = self.add(&format!("{base}.from_f32"), Cast::to(r.dtype), &[cur])?;
        }
        Ok(cur)
    }
}

/// A parameter's local nodes, `(local, gathered)` of its [`ParamSlot`]: the parameter node of
/// `shape` (its slice, or its stored piece), and under `optimizer_level` level3 for a parameter
/// the optimizer shards (`shard`) the all-gather of the piece into the slice over the shard
/// group, marked for recomputation so that the backward pass gathers it again rather than keep
/// it.
fn emit_parameter(em: &mut Emitter, node: &Node, shape: &[usize], shard: Option<&OptShard>) -> Result<(NodeId, Option<NodeId>)> {
    let local = em.add(&node.name, node.op.def().local(&LocalCx { output: shape, group: &[], block: None, rows: None }), &[])?;
    let Some(shard) = shard else { return Ok((local, None)) };
    let group = em.note_partition(&shard.axes);
    let gather = em.add(&format!("{}.gather", node.name), AllGather { dim: 0, group }, &[local])?;
    em.graph.node_mut(gather).recompute = Recompute::Marked;
    Ok((local, Some(gather)))
}

/// The program of `rank`.
pub fn rank_program(plan: &ParallelPlan, rank: usize) -> Result<RankProgram> {
    let n = plan.device_num;
    if rank >= n {
        return Err(ParallelError::RankOutOfRange { rank, devices: n });
    }
    if plan.mode == ParallelMode::HybridParallel {
        return hybrid_program(plan, rank);
    }
    let graph = &plan.graph;
    let mut em = Emitter { graph: Graph::new(), rank, partitions: Partitions { rank, n, list: Vec::new() } };
    let mut local: Vec<Option<NodeId>> = vec![None; graph.len()];
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    let layout_err = |name: &str| {
        let name = name.to_string();
        move |e| ParallelError::Layout { node: name, source: e }
    };
    for (i, node) in graph.nodes().iter().enumerate() {
        let np = &plan.nodes[i];
        let first = em.graph.len();
        let slice_shape = np.output.slice_shape();
        let id = if node.op.is_leaf() {
            let slice = np.output.slice_of(rank).map_err(layout_err(&node.name))?;
            if let OpKind::Parameter(p) = &node.op {
                let opt = plan.param(&node.name).and_then(|pp| pp.opt.shard());
                let (slice, mirror, shard) = match opt {
                    Some(s) => (s.piece(&slice, rank), s.rest_group(rank), Some(SlotShard { group: s.group(rank), index: s.index(rank) })),
                    None => (slice, np.output.replica_group(rank).map_err(layout_err(&node.name))?, None),
                };
                // Level3 keeps the stored piece in the program and gathers it per use.
                let level3 = opt.filter(|_| plan.context.parallel_optimizer_config.optimizer_level.gathers_per_use());
                let stored: Vec<usize> = slice.iter().map(|r| r.len()).collect();
                let (local, gathered) = emit_parameter(&mut em, node, if level3.is_some() { &stored } else { &slice_shape }, level3)?;
                let slot = ParamSlot {
                    name: node.name.clone(),
                    global: NodeId(i),
                    local,
                    layout: np.output.clone(),
                    slice,
                    mirror,
                    trainable: p.trainable,
                    shard,
                    gathered,
                };
                let value = slot.value();
                params.push(slot);
                value
            } else {
                let op = node.op.def().local(&LocalCx { output: &slice_shape, group: &[], block: None, rows: None });
                let id = em.add(&node.name, op, &[])?;
                inputs.push(InputSlot { name: node.name.clone(), global: NodeId(i), local: id, layout: np.output.clone(), slice });
                id
            }
        } else {
            let mut args = Vec::with_capacity(node.inputs.len());
            for (slot, x) in node.inputs.iter().enumerate() {
                let xid = local[x.0].expect("inputs precede users");
                let start = em.graph.len();
                args.push(match plan.redistribution(Site::Input { consumer: NodeId(i), slot }) {
                    Some(r) => em.redistribute(&format!("{}.in{slot}", node.name), xid, r)?,
                    None => xid,
                });
                // A recomputed value's redistribution is recomputed with it, whoever reads it
                // (the local value: a level3 weight's all-gather is marked, its parameter not).
                if em.graph.node(xid).recompute == Recompute::Marked {
                    em.set_recompute(start, Recompute::Marked);
                }
            }
            let group = match &np.sync {
                InOpSync::Stats(axes) => em.note_partition(axes),
                InOpSync::None | InOpSync::Block | InOpSync::Rows { .. } => Vec::new(),
            };
            let block = match &np.sync {
                InOpSync::Block => {
                    let x = &np.inputs[0];
                    let slice = x.slice_of(rank).map_err(layout_err(&node.name))?;
                    Some(DropoutBlock { global_shape: x.shape().to_vec(), begin: slice.iter().map(|r| r.start).collect() })
                }
                _ => None,
            };
            let rows = match &np.sync {
                InOpSync::Rows { input, dim } => {
                    let table = &np.inputs[*input];
                    let start = table.slice_of(rank).map_err(layout_err(&node.name))?[*dim].start;
                    Some(TableShard { start, total: table.shape()[*dim] })
                }
                _ => None,
            };
            let op = node.op.def().local(&LocalCx { output: &slice_shape, group: &group, block, rows });
            let mut id = em.add(&node.name, op, &args)?;
            if let Some(f) = np.output_scale {
                id = em.add(&format!("{}.share", node.name), Scale { factor: f }, &[id])?;
            }
            id
        };
        let got = &em.graph.node(id).ty.shape;
        if got != &slice_shape {
            return Err(ParallelError::LocalShape {
                rank,
                kind: node.op.kind(),
                name: node.name.clone(),
                got: got.clone(),
                want: slice_shape,
            });
        }
        local[i] = Some(id);
        // The local nodes of a global op (its input redistributions included) run on its
        // pipeline stage; stage-less nodes stay unassigned.
        let stage = if node.is_stageless() { None } else { node.pipeline_stage };
        em.set_stage(first, stage);
        // A recomputed op's local nodes (its input redistributions' collectives included, as
        // MindSpore recomputes a cell's communication) are recomputed with it.
        if node.recompute == Recompute::Marked {
            em.set_recompute(first, Recompute::Marked);
        }
    }
    let mut outputs = Vec::new();
    for (slot, &o) in graph.outputs.iter().enumerate() {
        let id = local[o.0].expect("outputs are nodes");
        let first = em.graph.len();
        outputs.push(match plan.redistribution(Site::Output { slot }) {
            Some(r) => em.redistribute(&format!("{}.out", graph.node(o).name), id, r)?,
            None => id,
        });
        em.set_stage(first, graph.node(o).pipeline_stage);
    }
    let Emitter { graph: mut g, partitions, .. } = em;
    g.outputs = outputs;
    g.blocks = graph.blocks.clone();
    finish_program(plan, g, params, inputs, partitions)
}

/// A rank's program from its forward graph (outputs set), parameters, inputs and the
/// partitions its forward collectives use: the backward pass, the gradient synchronisation
/// and the groups everything communicates over.
fn finish_program(
    plan: &ParallelPlan,
    mut g: Graph,
    params: Vec<ParamSlot>,
    inputs: Vec<InputSlot>,
    mut partitions: Partitions,
) -> Result<RankProgram> {
    let outputs = g.outputs.clone();
    let (all_gather, reduce_scatter) = shard_buckets(plan, &mut partitions);
    // Level2 and level3: the backward pass reduce-scatters each sharded weight's gradient.
    let (reduce_scatter, scatter_in_pass) = match plan.context.parallel_optimizer_config.optimizer_level.shards_gradients() {
        true => (Vec::new(), reduce_scatter),
        false => (reduce_scatter, Vec::new()),
    };
    let (loss, grads) = backward_pass(&mut g, plan, &outputs, &params, &scatter_in_pass)?;
    let buckets = rank_buckets(plan, &mut partitions);
    note_broadcast_groups(plan, &mut partitions);
    Ok(RankProgram {
        rank: partitions.rank,
        device_num: plan.device_num,
        mode: plan.mode,
        graph: g,
        outputs,
        loss,
        grads,
        params,
        inputs,
        accumulation_shard: !reduce_scatter.is_empty() && plan.context.parallel_optimizer_config.gradient_accumulation_shard,
        all_gather,
        reduce_scatter,
        scatter_in_pass,
        buckets,
        partitions: partitions.list,
    })
}

/// The plan's all-gather and reduce-scatter buckets resolved for the rank (their groups
/// noted as partitions). A reduce-scatter sums over the whole replica group and applies its
/// mirror mean.
fn shard_buckets(plan: &ParallelPlan, partitions: &mut Partitions) -> (Vec<RankShardBucket>, Vec<RankShardBucket>) {
    if plan.loss.is_none() {
        return (Vec::new(), Vec::new());
    }
    let rank = partitions.rank;
    let mut resolve = |b: &crate::optimizer_shard::ShardBucketPlan, mean: bool| {
        let group = partitions.note(&b.axes);
        let rest = partitions.note(&b.rest);
        let index = group.iter().position(|&r| r == rank).expect("a rank is in its own group");
        let scale = if mean { 1.0 / group.len() as f64 } else { 1.0 };
        RankShardBucket { group, index, rest, shard_size: b.shard_size, dtype: b.dtype, params: b.params.clone(), scale }
    };
    // Level3 gathers in the program itself, per use ([`ParamSlot::gathered`]).
    let gather = match plan.context.parallel_optimizer_config.optimizer_level.gathers_per_use() {
        false => plan.gradients.all_gather.iter().map(|b| resolve(b, false)).collect(),
        true => Vec::new(),
    };
    let scatter = plan.gradients.reduce_scatter.iter().map(|b| resolve(b, plan.gradients.mirror_mean)).collect();
    (gather, scatter)
}

/// The loss node of a training program and the gradient node of every trainable parameter.
type Backward = (Option<NodeId>, Vec<(String, NodeId)>);

/// For a training plan: the seeded loss differentiated with respect to every trainable
/// parameter of the local graph. Returns the loss node and the gradients by parameter name.
fn backward_pass(
    g: &mut Graph,
    plan: &ParallelPlan,
    outputs: &[NodeId],
    params: &[ParamSlot],
    scatter_in_pass: &[RankShardBucket],
) -> Result<Backward> {
    if plan.loss.is_none() {
        return Ok((None, Vec::new()));
    }
    let loss = outputs[0];
    let seed = plan.gradients.loss_seed;
    // The runtime's loss scale multiplies the seed at run time (1 without loss scaling).
    let name = g.unique_name("loss.seed");
    let seeded = g.add(&name, LossScale { factor: seed }, &[loss])?;
    let trainable: Vec<&ParamSlot> = params.iter().filter(|p| p.trainable).collect();
    // A level3 parameter's gradient is its gathered slice's, reduce-scattered in the pass
    // (level2 and level3) or after it (level1).
    let wrt: Vec<NodeId> = trainable.iter().map(|p| p.value()).collect();
    // Level2 and level3: each gradient reduce-scattered as soon as it is whole.
    let d = differentiate_with(g, seeded, &wrt, &mut |g, k, grad| shard_gradient(g, &trainable[k].name, grad, scatter_in_pass))?;
    let grads = trainable.iter().zip(&d.grads).map(|(p, (_, gid))| (p.name.clone(), *gid)).collect();
    Ok((Some(loss), grads))
}

/// Level2 and level3 of the parallel optimizer: the gradient `grad` (the model-parallel slice's)
/// of parameter `name` reduce-scattered inside the backward pass when one of `buckets` holds
/// it, so that only the rank's shard lives on; otherwise `grad` itself. The ops give what the
/// runtime's reduce-scatter of the bucket gives, element for element (the same sum over the
/// whole replica group in one collective): the gradient in the bucket's dtype; with `r` ranks
/// holding each shard, the shard's `r` parts (the last padded with zeros) arranged in the
/// replica group's order, reduce-scattered over it, then all-gathered over the `r` ranks;
/// scaled by the bucket's factor in f32 (f64 for f64), and cast back to the gradient's dtype.
pub(crate) fn shard_gradient(g: &mut Graph, name: &str, grad: NodeId, buckets: &[RankShardBucket]) -> autopar_graph::Result<NodeId> {
    let Some(b) = buckets.iter().find(|b| b.params.iter().any(|p| p == name)) else { return Ok(grad) };
    let ty = g.node(grad).ty.clone();
    let (group, k) = (b.group.len(), b.shard_size);
    let r = group / k;
    let mut add = |what: &str, op: OpKind, x: NodeId| -> autopar_graph::Result<NodeId> {
        let id = g.unique_name(&format!("{name}.grad_shard/{what}"));
        g.add(&id, op, &[x])
    };
    let mut x = grad;
    if ty.dtype != b.dtype {
        x = add("cast", Cast::to(b.dtype).into(), x)?;
    }
    let mut shape = ty.shape.clone();
    if let Some(d0) = shape.first_mut() {
        *d0 /= k;
    }
    if r == 1 {
        x = add("reduce_scatter", ReduceScatter { op: ReduceOp::Sum, dim: 0, group: b.group.clone() }.into(), x)?;
    } else {
        let shard = ty.numel() / k;
        let len = shard.div_ceil(r);
        x = add("flat", Reshape { shape: vec![k as i64, shard as i64] }.into(), x)?;
        if len * r > shard {
            x = add("pad", Pad { before: vec![0, 0], after: vec![0, len * r - shard] }.into(), x)?;
        }
        x = add("parts", Reshape { shape: vec![k as i64, r as i64, len as i64] }.into(), x)?;
        x = add("arrange", Transpose { perm: vec![1, 0, 2] }.into(), x)?;
        x = add("send", Reshape { shape: vec![(r * k * len) as i64] }.into(), x)?;
        x = add("reduce_scatter", ReduceScatter { op: ReduceOp::Sum, dim: 0, group: b.group.clone() }.into(), x)?;
        x = add("all_gather", AllGather { dim: 0, group: b.rest.clone() }.into(), x)?;
        if len * r > shard {
            x = add("unpad", Slice { begin: vec![0], size: vec![shard] }.into(), x)?;
        }
        x = add("shard", Reshape { shape: shape.iter().map(|&d| d as i64).collect() }.into(), x)?;
    }
    if b.scale != 1.0 {
        let wide = if b.dtype == DType::F64 { DType::F64 } else { DType::F32 };
        if b.dtype != wide {
            x = add("widen", Cast::to(wide).into(), x)?;
        }
        x = add("mean", Scale { factor: b.scale }.into(), x)?;
    }
    let wide = b.scale != 1.0 && b.dtype != DType::F64;
    if (if wide { DType::F32 } else { b.dtype }) != ty.dtype {
        x = add("cast_back", Cast::to(ty.dtype).into(), x)?;
    }
    Ok(x)
}

/// The plan's buckets resolved for the rank (their groups noted as partitions).
fn rank_buckets(plan: &ParallelPlan, partitions: &mut Partitions) -> Vec<RankBucket> {
    if plan.loss.is_none() {
        return Vec::new();
    }
    plan.gradients
        .buckets
        .iter()
        .map(|b| {
            let group = partitions.note(&b.mirror);
            let scale = if plan.gradients.mirror_mean { 1.0 / group.len() as f64 } else { 1.0 };
            RankBucket { group, dtype: b.dtype, params: b.params.clone(), scale }
        })
        .collect()
}

/// `parameter_broadcast`: the mirror group of every parameter (frozen ones too, which no bucket
/// syncs) is a group the rank's values are broadcast over.
fn note_broadcast_groups(plan: &ParallelPlan, partitions: &mut Partitions) {
    if plan.context.parameter_broadcast {
        for p in &plan.params {
            partitions.note(p.opt.shard().map_or(&p.mirror, |s| &s.rest));
        }
    }
}

/// hybrid_parallel: the rank's own graph as written, its parameters (layerwise ones its own,
/// the others replicated), the backward pass, and the groups of every rank's collectives
/// packed into partitions of disjoint groups (every rank derives the same list).
fn hybrid_program(plan: &ParallelPlan, rank: usize) -> Result<RankProgram> {
    let n = plan.device_num;
    let g = if plan.context.force_fp32_communication {
        widen_half_collectives(&plan.rank_graphs[rank])?
    } else {
        plan.rank_graphs[rank].clone()
    };
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    let flat = autopar_layout::DeviceMatrix::flat(n).map_err(|e| ParallelError::Layout { node: "device matrix".into(), source: e })?;
    for id in (0..g.len()).map(NodeId) {
        let node = g.node(id);
        let layout = TensorLayout::replicated(flat.clone(), node.ty.shape.clone());
        let slice: Vec<Range<usize>> = node.ty.shape.iter().map(|&d| 0..d).collect();
        if let OpKind::Parameter(p) = &node.op {
            let shared = plan.param(&node.name).is_some_and(|pp| !pp.mirror.is_empty());
            params.push(ParamSlot {
                name: node.name.clone(),
                global: id,
                local: id,
                layout,
                slice,
                mirror: if shared { (0..n).collect() } else { vec![rank] },
                trainable: p.trainable,
                shard: None,
                gathered: None,
            });
        } else if let OpKind::Input(_) = &node.op {
            inputs.push(InputSlot { name: node.name.clone(), global: id, local: id, layout, slice });
        }
    }
    let mut partitions = Partitions { rank, n, list: Vec::new() };
    for grp in plan.collective_groups.iter().cloned() {
        match partitions.list.iter_mut().find(|p| p.iter().all(|h| h.iter().all(|m| !grp.contains(m)))) {
            Some(p) => p.push(grp),
            None => partitions.list.push(vec![grp]),
        }
    }
    finish_program(plan, g, params, inputs, partitions)
}

/// `force_fp32_communication` in a hand-written graph: every communication op on f16/bf16
/// values runs on f32 copies (a Cast before each half-precision input, one back after).
fn widen_half_collectives(src: &Graph) -> Result<Graph> {
    let mut g = Graph::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(src.len());
    for node in src.nodes() {
        let mut inputs: Vec<NodeId> = node.inputs.iter().map(|x| map[x.0]).collect();
        let widen = node.op.is_communication() && node.ty.dtype.is_half();
        if widen {
            for (k, x) in inputs.iter_mut().enumerate() {
                if g.node(*x).ty.dtype.is_half() {
                    let name = g.unique_name(&format!("{}.in{k}.to_f32", node.name));
                    *x = g.add(&name, Cast::to(DType::F32), &[*x])?;
                }
            }
        }
        let mut id = g.add(&node.name, node.op.clone(), &inputs)?;
        g.node_mut(id).pipeline_stage = node.pipeline_stage;
        if widen {
            let name = g.unique_name(&format!("{}.from_f32", node.name));
            id = g.add(&name, Cast::to(node.ty.dtype), &[id])?;
        }
        map.push(id);
    }
    g.outputs = src.outputs.iter().map(|o| map[o.0]).collect();
    Ok(g)
}
