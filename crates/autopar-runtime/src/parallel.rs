//! Parallel training: one [`RankTrainer`] per rank runs its [`RankProgram`] (forward with the
//! planner's communication, backward by autodiff of that local graph), synchronises gradients
//! over each parameter's mirror group in fused buckets, and updates its local slices.
//!
//! * semi_auto_parallel: the graph has global shapes; the planner shards it ([`plan`]).
//! * data_parallel: every rank runs the graph as written on its own batch shard (the graph has
//!   per-rank shapes, as in MindSpore); gradients are all-reduced over all ranks and divided by
//!   the rank count when `gradients_mean` is set. Training BatchNorm takes its statistics over
//!   every rank's shard and a Dropout on data draws the rank's block of the whole batch's mask,
//!   so the run equals one device on the N-times batch (for batch-major tensors: the batch the
//!   outermost dimension, as in every model of the zoo).
//! * hybrid_parallel: every rank runs its own hand-written graph (local shapes, the collectives
//!   the user placed); `layerwise` parameters are the rank's own, the others are replicated and
//!   all-reduced over all ranks ([`ParallelJob::hybrid`]).
//! * stand_alone: one rank, no communication: the reference.
//!
//! In semi_auto_parallel each rank's loss is the replicated global loss; its backward starts from
//! 1/N so that the N replicas of the loss add up to one, and the sum of a parameter slice's
//! gradients over its mirror group is then the exact gradient (`gradients_mean` does not apply:
//! the gradient is already that of the global mean loss).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use autopar_comm::{Communicator, LocalComm, ReduceOp as CommReduce};
use autopar_graph::ops::Scale;
use autopar_graph::{Graph, NodeId, OpKind};
use autopar_layout::{Block, DeviceMatrix, TensorLayout};
use autopar_parallel::{plan, rank_program, FusionMode, InputSlot, ParallelContext, ParallelMode, ParallelPlan, ParamSlot, RankProgram};
use autopar_tensor::kernels::shape as sh;
use autopar_tensor::{DType, Tensor};

use crate::collective::CommGroups;
use crate::error::{Result, RuntimeError};
use crate::executor::ParamStore;
use crate::optim::Optimizer;
use crate::train::TrainStep;

/// Default AllReduce fusion threshold (MindSpore's `comm_fusion` auto mode): 64 MB.
pub const DEFAULT_FUSION_BYTES: usize = 64 << 20;

/// The rank programs of a job, built once from the global graph. Its parts are read through
/// methods: the plan is made from them once, so they do not change after construction.
#[derive(Clone, Debug)]
pub struct ParallelJob {
    mode: ParallelMode,
    device_num: usize,
    graph: Graph,
    loss: NodeId,
    ctx: ParallelContext,
    /// hybrid_parallel: the graph every rank runs (rank `r` runs `rank_graphs[r]`).
    rank_graphs: Vec<Graph>,
    /// hybrid_parallel: parameters that are each rank's own (never synchronised).
    layerwise: BTreeSet<String>,
    /// semi_auto_parallel and stand_alone: the plan of `graph`, made once by [`ParallelJob::new`]
    /// (so an invalid strategy or an indivisible batch is an error there).
    planned: Option<ParallelPlan>,
}

fn loss_first(mut graph: Graph, loss: NodeId) -> Graph {
    if graph.outputs.is_empty() || graph.outputs[0] != loss {
        graph.outputs.retain(|o| *o != loss);
        graph.outputs.insert(0, loss);
    }
    graph
}

impl ParallelJob {
    /// A job for `graph` (forward only, `loss` its scalar loss) under `ctx`.
    pub fn new(graph: Graph, loss: NodeId, ctx: ParallelContext) -> Result<Self> {
        ctx.validate().map_err(|e| RuntimeError::Parallel { message: e.to_string() })?;
        ctx.check_supported().map_err(|e| RuntimeError::Parallel { message: e.to_string() })?;
        let graph = loss_first(graph, loss);
        let device_num = if ctx.parallel_mode == ParallelMode::StandAlone { 1 } else { ctx.device_num };
        if ctx.parallel_mode == ParallelMode::HybridParallel {
            return Err(RuntimeError::Parallel {
                message: "hybrid_parallel runs one graph per rank, written by hand\nhint: build the job with ParallelJob::hybrid".into(),
            });
        }
        let planned = match ctx.parallel_mode {
            ParallelMode::SemiAutoParallel | ParallelMode::StandAlone => {
                Some(plan(&graph, &ctx).map_err(|e| RuntimeError::Parallel { message: e.to_string() })?)
            }
            _ => None,
        };
        Ok(Self { mode: ctx.parallel_mode, device_num, graph, loss, ctx, rank_graphs: Vec::new(), layerwise: BTreeSet::new(), planned })
    }

    /// A hybrid_parallel job: rank `r` runs `graphs[r]` as written (local shapes, the
    /// collectives the user placed, with world-rank groups; nothing is inserted). Parameters
    /// named in `layerwise` are the rank's own slices (MindSpore's `layerwise_parallel`); every
    /// other parameter is replicated and its gradient all-reduced over all ranks. The job's loss
    /// is the mean of the ranks' losses with `gradients_mean` (each backward starts from 1/N),
    /// their sum without it.
    pub fn hybrid(graphs: Vec<Graph>, loss_name: &str, ctx: ParallelContext, layerwise: BTreeSet<String>) -> Result<Self> {
        ctx.validate().map_err(|e| RuntimeError::Parallel { message: e.to_string() })?;
        ctx.check_supported().map_err(|e| RuntimeError::Parallel { message: e.to_string() })?;
        if ctx.parallel_mode != ParallelMode::HybridParallel {
            return Err(RuntimeError::Parallel {
                message: format!("ParallelJob::hybrid needs parallel_mode = hybrid_parallel, the context says {}", ctx.parallel_mode),
            });
        }
        if graphs.len() != ctx.device_num {
            return Err(RuntimeError::Parallel {
                message: format!("hybrid_parallel: {} rank graphs for device_num {}", graphs.len(), ctx.device_num),
            });
        }
        let mut rank_graphs = Vec::with_capacity(graphs.len());
        for (r, g) in graphs.into_iter().enumerate() {
            let loss = g.find(loss_name).map_err(|_| RuntimeError::Parallel {
                message: format!("hybrid_parallel: the graph of rank {r} has no node {loss_name:?}"),
            })?;
            for name in &layerwise {
                if g.find(name).map(|id| !matches!(g.node(id).op, OpKind::Parameter(_))).unwrap_or(true) {
                    return Err(RuntimeError::Parallel {
                        message: format!("hybrid_parallel: layerwise parameter {name:?} is not a parameter of rank {r}'s graph"),
                    });
                }
            }
            rank_graphs.push(loss_first(g, loss));
        }
        let graph = rank_graphs[0].clone();
        let loss = graph.outputs[0];
        Ok(Self { mode: ParallelMode::HybridParallel, device_num: ctx.device_num, graph, loss, ctx, rank_graphs, layerwise, planned: None })
    }

    pub fn mode(&self) -> ParallelMode {
        self.mode
    }

    /// Ranks of the job (1 for stand_alone).
    pub fn device_num(&self) -> usize {
        self.device_num
    }

    /// The global graph (hybrid_parallel: rank 0's graph), with the loss as its first output.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn loss(&self) -> NodeId {
        self.loss
    }

    pub fn context(&self) -> &ParallelContext {
        &self.ctx
    }

    /// hybrid_parallel: the graph of every rank (empty in the other modes).
    pub fn rank_graphs(&self) -> &[Graph] {
        &self.rank_graphs
    }

    /// The plan of the job's graph: the one made by [`ParallelJob::new`], or (data_parallel,
    /// hybrid_parallel) the graph planned under the context, for strategy files.
    pub fn plan(&self) -> Result<ParallelPlan> {
        match &self.planned {
            Some(p) => Ok(p.clone()),
            None => plan(&self.graph, &self.ctx).map_err(|e| RuntimeError::Parallel { message: e.to_string() }),
        }
    }

    /// The program of `rank`.
    pub fn program(&self, rank: usize) -> Result<RankProgram> {
        let pe = |e: autopar_parallel::ParallelError| RuntimeError::Parallel { message: e.to_string() };
        match self.mode {
            ParallelMode::SemiAutoParallel | ParallelMode::StandAlone => {
                let p = self.planned.as_ref().expect("ParallelJob::new plans these modes");
                rank_program(&self.graph, p, rank).map_err(pe)
            }
            ParallelMode::HybridParallel => {
                let mut prog = data_parallel_program(&self.rank_graphs[rank], self.device_num, rank)?;
                for p in prog.params.iter_mut().filter(|p| self.layerwise.contains(&p.name)) {
                    p.mirror = vec![rank];
                }
                let mut partitions = hybrid_partitions(&self.rank_graphs)?;
                partitions.extend(prog.partitions);
                prog.partitions = partitions;
                Ok(prog)
            }
            _ => {
                let mut prog = data_parallel_program(&self.graph, self.device_num, rank)?;
                whole_batch_ops(&mut prog.graph, self.device_num, rank);
                Ok(prog)
            }
        }
    }
}

/// data_parallel: make the ops whose result depends on the whole batch behave as on one device
/// running the N-times batch. BatchNorm in training takes its statistics over every rank's
/// batch (synchronised batch norm). A Dropout on data (a value computed from a network input)
/// draws rank `r`'s block of the whole batch's mask, the `r`-th along dimension 0 (exact for
/// batch-major tensors); a Dropout on a value computed from parameters alone is the same on
/// every rank, as on one device.
fn whole_batch_ops(graph: &mut Graph, n: usize, rank: usize) {
    if n <= 1 {
        return;
    }
    // Whether each node's value depends on a network input (nodes are in topological order).
    let mut on_data = vec![false; graph.len()];
    for i in 0..graph.len() {
        let node = graph.node(NodeId(i));
        on_data[i] = matches!(node.op, OpKind::Input(_)) || node.inputs.iter().any(|x| on_data[x.0]);
    }
    for (i, &data) in on_data.iter().enumerate() {
        let shape = graph.node(NodeId(i)).ty.shape.clone();
        match &mut graph.node_mut(NodeId(i)).op {
            OpKind::BatchNorm(bn) if bn.training => bn.group = (0..n).collect(),
            OpKind::Dropout(d) if data && !shape.is_empty() => {
                let mut global_shape = shape.clone();
                global_shape[0] *= n;
                let mut begin = vec![0; shape.len()];
                begin[0] = rank * shape[0];
                d.block = Some(autopar_graph::ops::DropoutBlock { global_shape, begin });
            }
            _ => {}
        }
    }
}

/// The groups of every collective the ranks' graphs hold (and of ops that synchronise statistics), packed into partitions of disjoint
/// groups (every rank derives the same list). A collective whose group lacks its own rank is
/// an error naming it.
fn hybrid_partitions(graphs: &[Graph]) -> Result<Vec<Vec<Vec<usize>>>> {
    let n = graphs.len();
    let mut groups: BTreeSet<Vec<usize>> = BTreeSet::new();
    for (r, g) in graphs.iter().enumerate() {
        for node in g.nodes() {
            let group: Vec<usize> = match &node.op {
                OpKind::AllReduce(c) => c.group.clone(),
                OpKind::AllGather(c) => c.group.clone(),
                OpKind::ReduceScatter(c) => c.group.clone(),
                OpKind::AllToAll(c) => c.group.clone(),
                OpKind::Broadcast(c) => c.group.clone(),
                OpKind::Reduce(c) => c.group.clone(),
                OpKind::Send(s) => vec![r, s.peer],
                OpKind::Recv(s) => vec![r, s.peer],
                OpKind::BatchNorm(bn) if bn.training && bn.group.len() > 1 => bn.group.clone(),
                OpKind::Softmax(s) if s.group.len() > 1 => s.group.clone(),
                OpKind::LogSoftmax(s) if s.group.len() > 1 => s.group.clone(),
                OpKind::LayerNorm(ln) if ln.group.len() > 1 => ln.group.clone(),
                _ => continue,
            };
            let mut sorted = group.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if !sorted.contains(&r) || sorted.iter().any(|&m| m >= n) {
                return Err(RuntimeError::Parallel {
                    message: format!(
                        "hybrid_parallel: {} {:?} on rank {r} has group {group:?}, which must hold rank {r} and ranks below {n}",
                        node.op.kind(),
                        node.name
                    ),
                });
            }
            groups.insert(sorted);
        }
    }
    let mut partitions: Vec<Vec<Vec<usize>>> = Vec::new();
    for g in groups {
        match partitions.iter_mut().find(|p| p.iter().all(|h| h.iter().all(|m| !g.contains(m)))) {
            Some(p) => p.push(g),
            None => partitions.push(vec![g]),
        }
    }
    Ok(partitions)
}

/// Every rank runs `graph` unchanged; parameters are replicated and all-reduced over all ranks.
pub fn data_parallel_program(graph: &Graph, n: usize, rank: usize) -> Result<RankProgram> {
    let mesh = DeviceMatrix::flat(n).map_err(|e| RuntimeError::Parallel { message: e.to_string() })?;
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        let layout = TensorLayout::replicated(mesh.clone(), node.ty.shape.clone());
        let slice: Vec<Range<usize>> = node.ty.shape.iter().map(|&d| 0..d).collect();
        match &node.op {
            OpKind::Parameter(p) => params.push(ParamSlot {
                name: node.name.clone(),
                global: NodeId(i),
                local: NodeId(i),
                layout,
                slice,
                mirror: (0..n).collect(),
                trainable: p.trainable,
            }),
            OpKind::Input(_) => inputs.push(InputSlot { name: node.name.clone(), global: NodeId(i), local: NodeId(i), layout, slice }),
            _ => {}
        }
    }
    let partitions = if n > 1 { vec![vec![(0..n).collect()]] } else { Vec::new() };
    Ok(RankProgram { rank, device_num: n, graph: graph.clone(), outputs: graph.outputs.clone(), params, inputs, partitions })
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

/// Gradient buckets: parameters with the same mirror group, fused up to a size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub group: Vec<usize>,
    pub params: Vec<String>,
    pub bytes: usize,
}

/// Group trainable parameters into all-reduce buckets as `comm_fusion` says.
pub fn fusion_buckets(program: &RankProgram, ctx: &ParallelContext) -> Vec<Bucket> {
    let trainable: Vec<&ParamSlot> = program.params.iter().filter(|p| p.trainable && p.mirror.len() > 1).collect();
    let fusion = &ctx.comm_fusion;
    let limit = match (&fusion.allreduce, fusion.openstate) {
        (_, false) => 0,
        (FusionMode::Auto, true) => DEFAULT_FUSION_BYTES,
        (FusionMode::Size(mb), true) => (mb.get() * 1024.0 * 1024.0) as usize,
        (FusionMode::Index(_), true) => usize::MAX,
    };
    let boundaries: Vec<usize> = match &fusion.allreduce {
        FusionMode::Index(idx) if fusion.openstate => idx.clone(),
        _ => Vec::new(),
    };
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut open: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    for (i, p) in trainable.iter().enumerate() {
        let bytes = p.layout.slice_len() * 4;
        if boundaries.contains(&i) {
            open.clear();
        }
        let fits = open.get(&p.mirror).is_some_and(|&b| buckets[b].bytes + bytes <= limit);
        if fits {
            let b = open[&p.mirror];
            buckets[b].params.push(p.name.clone());
            buckets[b].bytes += bytes;
        } else {
            buckets.push(Bucket { group: p.mirror.clone(), params: vec![p.name.clone()], bytes });
            open.insert(p.mirror.clone(), buckets.len() - 1);
        }
    }
    buckets
}

/// One rank of a parallel job.
pub struct RankTrainer {
    pub program: RankProgram,
    step: TrainStep,
    params: ParamStore,
    groups: CommGroups,
    buckets: Vec<Bucket>,
    mean: bool,
    fp32: bool,
    loss_factor: f64,
}

impl std::fmt::Debug for RankTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankTrainer").field("rank", &self.program.rank).field("buckets", &self.buckets).finish()
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
        Self::with_local_params(job, comm, params)
    }

    /// Like [`RankTrainer::new`], with this rank's slices given (for example from
    /// [`crate::distributed::load_distributed_checkpoint`]); every parameter must be present with
    /// its local shape.
    pub fn with_local_params(job: &ParallelJob, comm: &dyn Communicator, params: ParamStore) -> Result<Self> {
        let rank = comm.rank();
        if comm.size() != job.device_num {
            return Err(RuntimeError::Parallel {
                message: format!(
                    "the job has {} devices but the communicator has {} ranks\nhint: run with as many ranks as device_num",
                    job.device_num,
                    comm.size()
                ),
            });
        }
        let program = job.program(rank)?;
        let mut graph = program.graph.clone();
        let loss = program.outputs[0];
        let n = program.device_num;
        let replicated_loss =
            job.mode == ParallelMode::SemiAutoParallel || (job.mode == ParallelMode::HybridParallel && job.ctx.gradients_mean);
        let scaled = if replicated_loss && n > 1 {
            let name = graph.unique_name("loss.replica_share");
            graph.add(&name, Scale { factor: 1.0 / n as f64 }, &[loss])?
        } else {
            loss
        };
        let loss_factor = if scaled == loss { 1.0 } else { n as f64 };
        let step = TrainStep::new(graph, scaled)?.with_ctx(autopar_tensor::ExecCtx::serial());
        for p in &program.params {
            let t = params.require(&p.name)?;
            let want = p.layout.slice_shape();
            if t.shape() != want.as_slice() {
                return Err(RuntimeError::GradientMismatch { name: p.name.clone(), shape: want, got: t.shape().to_vec() });
            }
        }
        let groups = CommGroups::create(comm, &program.partitions)?;
        let mut params = params;
        if job.ctx.parameter_broadcast {
            broadcast_parameters(&program, &groups, &mut params)?;
        }
        let buckets = fusion_buckets(&program, &job.ctx);
        let mean = job.ctx.gradients_mean && job.mode == ParallelMode::DataParallel;
        Ok(Self { program, step, params, groups, buckets, mean, fp32: job.ctx.force_fp32_communication, loss_factor })
    }

    pub fn rank(&self) -> usize {
        self.program.rank
    }

    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    pub fn params_mut(&mut self) -> &mut ParamStore {
        &mut self.params
    }

    /// This rank's inputs cut from the global batch (`(input name, tensor)`), for runs where
    /// every rank sees the global batch (in-process simulation, `--verify`).
    pub fn local_feeds(&self, global: &[(String, Tensor)]) -> Result<Vec<(NodeId, Tensor)>> {
        self.program
            .inputs
            .iter()
            .map(|slot| {
                let t = global.iter().find(|(n, _)| *n == slot.name).map(|(_, t)| t).ok_or_else(|| RuntimeError::MissingFeed {
                    name: slot.name.clone(),
                    shape: slot.layout.shape().to_vec(),
                    dtype: self.program.graph.node(slot.local).ty.dtype,
                })?;
                Ok((slot.local, slice_tensor(t, &slot.slice)?))
            })
            .collect()
    }

    /// One training step on this rank's local feeds; returns the (global) loss.
    pub fn step(&mut self, opt: &mut dyn Optimizer, feeds: &[(NodeId, Tensor)]) -> Result<f64> {
        let out = self.step.gradients_with(&mut self.params, feeds, Some(&self.groups))?;
        let (loss, mut grads) = (out.loss, out.grads);
        self.sync(&mut grads)?;
        opt.step(&mut self.params, &grads)?;
        crate::train::finite_loss(loss.to_f64_vec().iter().sum::<f64>() * self.loss_factor)
    }

    /// All-reduce gradients over their mirror groups, bucket by bucket: the bucket's gradients
    /// are packed into one f32 buffer (f64 when they are all f64 and fp32 communication is not
    /// forced), reduced in place, and unpacked.
    fn sync(&self, grads: &mut [(String, Tensor)]) -> Result<()> {
        for b in &self.buckets {
            let comm = self.groups.get(&b.group)?;
            let idx: Vec<usize> = b
                .params
                .iter()
                .map(|n| grads.iter().position(|(g, _)| g == n).ok_or_else(|| RuntimeError::MissingGradient { name: n.clone() }))
                .collect::<Result<_>>()?;
            let c = |e: autopar_comm::CommError| RuntimeError::Comm {
                what: format!("gradient all-reduce over {:?}", b.group),
                message: e.to_string(),
            };
            let k = |name: &str| {
                let name = name.to_string();
                move |e| RuntimeError::Kernel { kind: "AllReduce", name, source: Box::new(e) }
            };
            let scale = if self.mean { 1.0 / b.group.len() as f64 } else { 1.0 };
            let wide = !self.fp32 && idx.iter().all(|&i| grads[i].1.dtype() == DType::F64);
            if wide {
                let mut flat: Vec<f64> = Vec::with_capacity(b.bytes / 4);
                for &i in &idx {
                    flat.extend(grads[i].1.to_vec::<f64>().map_err(k(&grads[i].0))?);
                }
                comm.all_reduce((&mut flat).into(), CommReduce::Sum).map_err(c)?;
                let mut off = 0;
                for &i in &idx {
                    let shape = grads[i].1.shape().to_vec();
                    let len: usize = shape.iter().product();
                    let vals: Vec<f64> = flat[off..off + len].iter().map(|x| x * scale).collect();
                    off += len;
                    grads[i].1 = Tensor::from_vec(&shape, vals).map_err(k(&grads[i].0))?;
                }
            } else {
                let mut flat: Vec<f32> = Vec::with_capacity(b.bytes / 4);
                for &i in &idx {
                    let g = &grads[i].1;
                    if g.dtype() == DType::F32 {
                        flat.extend(g.to_vec::<f32>().map_err(k(&grads[i].0))?);
                    } else {
                        flat.extend(g.cast(DType::F32).to_vec::<f32>().map_err(k(&grads[i].0))?);
                    }
                }
                comm.all_reduce((&mut flat).into(), CommReduce::Sum).map_err(c)?;
                if scale != 1.0 {
                    let f = scale as f32;
                    flat.iter_mut().for_each(|x| *x *= f);
                }
                let mut off = 0;
                for &i in &idx {
                    let dtype = grads[i].1.dtype();
                    let shape = grads[i].1.shape().to_vec();
                    let len: usize = shape.iter().product();
                    let t = Tensor::from_vec(&shape, flat[off..off + len].to_vec()).map_err(k(&grads[i].0))?;
                    off += len;
                    grads[i].1 = if dtype == DType::F32 { t } else { t.cast(dtype) };
                }
            }
        }
        Ok(())
    }
}

/// `parameter_broadcast`: every parameter slice is copied from the first rank of its mirror
/// group (the ranks holding the same slice, along the data-parallel axes) to the others, so
/// replicas start equal whatever each rank initialised.
fn broadcast_parameters(program: &RankProgram, groups: &CommGroups, params: &mut ParamStore) -> Result<()> {
    for p in program.params.iter().filter(|p| p.mirror.len() > 1) {
        let comm = groups.get(&p.mirror)?;
        let t = params.require(&p.name)?;
        let (shape, dtype) = (t.shape().to_vec(), t.dtype());
        let c =
            |e: autopar_comm::CommError| RuntimeError::Comm { what: format!("parameter broadcast of {}", p.name), message: e.to_string() };
        let k = |e| RuntimeError::Kernel { kind: "Broadcast", name: p.name.clone(), source: Box::new(e) };
        let out = if dtype == DType::F64 {
            let mut v = t.to_vec::<f64>().map_err(k)?;
            comm.broadcast((&mut v).into(), 0).map_err(c)?;
            Tensor::from_vec(&shape, v).map_err(k)?
        } else {
            let mut v = t.cast(DType::F32).to_vec::<f32>().map_err(k)?;
            comm.broadcast((&mut v).into(), 0).map_err(c)?;
            Tensor::from_vec(&shape, v).map_err(k)?.cast(dtype)
        };
        params.insert(&p.name, out);
    }
    Ok(())
}

/// Put every rank's slices back together into full tensors (one owner per distinct slice).
pub fn assemble_params(job: &ParallelJob, per_rank: &[ParamStore]) -> Result<ParamStore> {
    let prog0 = job.program(0)?;
    let mut full = ParamStore::new();
    for slot in &prog0.params {
        let owners = slot.layout.slice_owners();
        let shape = slot.layout.shape().to_vec();
        let first = per_rank[owners[0]].require(&slot.name)?;
        let lay = |e: autopar_layout::LayoutError| RuntimeError::Parallel { message: format!("assembling {}: {e}", slot.name) };
        let mut values = Block::<f64>::zeros(shape.clone());
        for &o in &owners {
            let piece = per_rank[o].require(&slot.name)?;
            let piece = Block::new(piece.shape().to_vec(), piece.to_f64_vec()).map_err(lay)?;
            values.write(&slot.layout.slice_of(o).map_err(lay)?, &piece).map_err(lay)?;
        }
        let t = Tensor::from_vec(&shape, values.into_data()).map_err(|e| RuntimeError::Kernel {
            kind: "assemble",
            name: slot.name.clone(),
            source: Box::new(e),
        })?;
        full.insert(&slot.name, t.cast(first.dtype()));
    }
    Ok(full)
}

/// Every rank's local slices, gathered so that each rank holds the full parameters (for runs
/// with one rank per process, where no rank sees the others' stores). Collective.
pub fn gather_full_params(job: &ParallelJob, comm: &dyn Communicator, local: &ParamStore) -> Result<ParamStore> {
    let n = comm.size();
    if n == 1 {
        return Ok(local.clone());
    }
    let c = |e: autopar_comm::CommError| RuntimeError::Comm { what: "gathering parameters".into(), message: e.to_string() };
    let mut stores = vec![ParamStore::new(); n];
    for (name, t) in local.iter() {
        let mine = t.to_f64_vec();
        let mut all = vec![0.0f64; mine.len() * n];
        comm.all_gather((&mine).into(), (&mut all).into()).map_err(c)?;
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
    /// Loss of every step (rank 0's in semi_auto_parallel, where every rank's is the same; the
    /// mean over ranks in data_parallel and hybrid_parallel).
    pub losses: Vec<f64>,
    /// Every rank's losses.
    pub rank_losses: Vec<Vec<f64>>,
    /// Final parameters, assembled from the ranks' slices (hybrid_parallel: rank 0's).
    pub params: ParamStore,
    /// Every rank's final local parameters.
    pub rank_params: Vec<ParamStore>,
}

/// Split global batches (by input name) along dimension 0 into `n` equal parts, in the order
/// [`run_local`] reads per-rank batches: part `r` of batch `s` at `s * n + r` (data_parallel on
/// `n` ranks then sees the data of one device on the global batches). An input whose first
/// dimension `n` does not divide is an error naming it.
pub fn rank_batches(batches: &[Vec<(String, Tensor)>], n: usize) -> Result<Vec<Vec<(String, Tensor)>>> {
    if n == 0 {
        return Err(RuntimeError::Parallel {
            message: "rank_batches: splitting a batch for 0 ranks\nhint: give the rank count, at least 1".into(),
        });
    }
    let mut out = Vec::with_capacity(batches.len() * n);
    for batch in batches {
        for r in 0..n {
            let part = batch
                .iter()
                .map(|(name, t)| {
                    let rows = t.shape().first().copied().unwrap_or(0);
                    if t.shape().is_empty() || !rows.is_multiple_of(n) {
                        return Err(RuntimeError::Parallel {
                            message: format!(
                                "input {name:?} has shape {:?}; its first dimension must split into {n} equal parts",
                                t.shape()
                            ),
                        });
                    }
                    let per = rows / n;
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

/// Run `job` on `device_num` threads with [`LocalComm`]: every step feeds each rank its part of
/// `batches[step]` (global batches by input name; under data_parallel and hybrid_parallel,
/// where ranks read their own data, `batches[step * n + rank]`), with an optimizer from
/// `make_opt` per rank.
pub fn run_local<F>(job: &ParallelJob, batches: &[Vec<(String, Tensor)>], make_opt: F) -> Result<LocalRun>
where
    F: Fn() -> Result<Box<dyn Optimizer>> + Sync,
{
    let n = job.device_num;
    let per_rank = matches!(job.mode, ParallelMode::DataParallel | ParallelMode::HybridParallel);
    let full: Vec<ParamStore> = if job.mode == ParallelMode::HybridParallel {
        job.rank_graphs.iter().map(ParamStore::init).collect::<Result<_>>()?
    } else {
        vec![ParamStore::init(&job.graph)?]
    };
    let steps = if per_rank { batches.len() / n } else { batches.len() };
    let results = LocalComm::run(n, |comm| -> Result<(Vec<f64>, ParamStore)> {
        let r = comm.rank();
        let mut t = RankTrainer::new(job, &comm, &full[r.min(full.len() - 1)])?;
        let mut opt = make_opt()?;
        let mut losses = Vec::with_capacity(steps);
        for s in 0..steps {
            let batch = if per_rank { &batches[s * n + r] } else { &batches[s] };
            let feeds = t.local_feeds(batch)?;
            losses.push(t.step(opt.as_mut(), &feeds)?);
        }
        Ok((losses, t.params().clone()))
    })
    .map_err(|e| RuntimeError::Comm { what: "parallel run".into(), message: e.to_string() })?;
    let (rank_losses, stores): (Vec<Vec<f64>>, Vec<ParamStore>) = results.into_iter().unzip();
    let params = if job.mode == ParallelMode::HybridParallel { stores[0].clone() } else { assemble_params(job, &stores)? };
    let losses = if per_rank {
        (0..steps).map(|s| rank_losses.iter().map(|l| l[s]).sum::<f64>() / n as f64).collect()
    } else {
        rank_losses[0].clone()
    };
    Ok(LocalRun { losses, rank_losses, params, rank_params: stores })
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_graph::{DType as GDType, GraphBuilder, Initializer};

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
        assert!(rank_batches(&[vec![("x".to_string(), x)]], 0).unwrap_err().to_string().contains("0 ranks"));
    }

    #[test]
    fn data_parallel_gives_blocks_to_dropouts_on_data_only() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2, 3], GDType::F32).unwrap();
        let w = b.parameter("w", &[2, 3], Initializer::Ones).unwrap();
        b.dropout("on_data", x, 0.5, 1).unwrap();
        b.dropout("on_weight", w, 0.5, 2).unwrap();
        let mut g = b.finish();
        whole_batch_ops(&mut g, 4, 3);
        let block = |name: &str| match &g.node(g.find(name).unwrap()).op {
            OpKind::Dropout(d) => d.block.clone(),
            _ => unreachable!(),
        };
        let on_data = block("on_data").expect("a dropout on data draws its block");
        assert_eq!((on_data.global_shape, on_data.begin), (vec![8, 3], vec![6, 0]));
        assert!(block("on_weight").is_none(), "a dropout on parameters is the same on every rank");
    }
}
