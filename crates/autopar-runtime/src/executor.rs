//! The single-device executor: runs a [`Graph`] node by node on `autopar-tensor` kernels.
//!
//! [`Executor::new`] plans once ([`Graph::schedule`], the schedule memory predictions simulate):
//! it keeps only the nodes the fetched values need, in graph (topological) order, and computes
//! for every value the position of its last use. A run then
//! drops each intermediate right after its last user, so peak memory is the live set, not the
//! whole graph; fetched values are kept. With profiling on, each op's wall time is recorded.
//!
//! Every op's output is checked against the type inferred at build time, so a disagreement
//! between an op's shape inference and its kernel is an error, never a silently wrong result.
//!
//! Communication ops are identities when their group is one rank (the single-device case) and
//! an error otherwise: collectives across ranks belong to the parallel runtime.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use autopar_graph::ops::*;
use autopar_graph::{DType, Graph, Node, NodeId, OpKind, Recompute};
use autopar_tensor::kernels::{
    attention, conv, dropout, elementwise as ew, loss, matmul, norm, pool, reduce, rotary, routing, shape as sh,
};
use autopar_tensor::{Element, ExecCtx, Tensor, TensorError};

use crate::error::{Result, RuntimeError};

/// The graph's element type as the tensor crate's.
pub fn tensor_dtype(d: DType) -> autopar_tensor::DType {
    match d {
        DType::F16 => autopar_tensor::DType::F16,
        DType::BF16 => autopar_tensor::DType::BF16,
        DType::F32 => autopar_tensor::DType::F32,
        DType::F64 => autopar_tensor::DType::F64,
        DType::I32 => autopar_tensor::DType::I32,
        DType::I64 => autopar_tensor::DType::I64,
    }
}

/// The tensor crate's element type as the graph's.
pub fn graph_dtype(d: autopar_tensor::DType) -> DType {
    match d {
        autopar_tensor::DType::F16 => DType::F16,
        autopar_tensor::DType::BF16 => DType::BF16,
        autopar_tensor::DType::F32 => DType::F32,
        autopar_tensor::DType::F64 => DType::F64,
        autopar_tensor::DType::I32 => DType::I32,
        autopar_tensor::DType::I64 => DType::I64,
    }
}

/// Named persistent tensors: parameters, running statistics, optimizer state.
#[derive(Clone, Debug, Default)]
pub struct ParamStore {
    map: BTreeMap<String, Tensor>,
}

impl ParamStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Materialises every parameter of `graph` from its initialiser and seed.
    pub fn init(graph: &Graph) -> Result<Self> {
        let mut store = Self::new();
        for id in graph.parameters() {
            let node = graph.node(id);
            if let OpKind::Parameter(p) = &node.op {
                let values = p.init.generate(&node.name, &p.shape, p.seed)?;
                let t = Tensor::from_vec(&p.shape, values).expect("initialiser fills the shape").cast(tensor_dtype(p.dtype));
                store.insert(&node.name, t);
            }
        }
        Ok(store)
    }

    /// The pieces of `graph`'s parameters that `pieces` names (by parameter name, one range
    /// per dimension: a rank's slices, or its optimizer shards of them), each generated directly
    /// from its initialiser and seed: bit for bit that piece of [`ParamStore::init`]'s tensor,
    /// and no full tensor made. With `shared`, a piece another simulated rank of this process
    /// already generated is shared with it (copied only when either updates it) instead of
    /// generated again. A name `graph` has no parameter of is an error.
    pub fn init_pieces<'a>(
        graph: &Graph,
        pieces: impl IntoIterator<Item = (&'a str, &'a [std::ops::Range<usize>])>,
        shared: Option<&SharedInit>,
    ) -> Result<Self> {
        let mut store = Self::new();
        let (started, mut elements) = (std::time::Instant::now(), 0usize);
        for (name, ranges) in pieces {
            let node = graph.node(graph.find(name)?);
            let OpKind::Parameter(p) = &node.op else {
                return Err(RuntimeError::MissingParameter { name: name.to_string() });
            };
            let mut make = || -> Result<Tensor> {
                elements += ranges.iter().map(|r| r.len()).product::<usize>();
                fn piece<T: Element>(p: &Parameter, name: &str, ranges: &[std::ops::Range<usize>]) -> Result<Tensor> {
                    let values = p.init.generate_slice_as(name, &p.shape, p.seed, ranges, T::from_f64)?;
                    let shape: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
                    Ok(Tensor::from_vec(&shape, values).expect("initialiser fills the slice"))
                }
                // Made in the storage type directly: the same values as generating in f64 and casting.
                with_element!(tensor_dtype(p.dtype), T => piece::<T>(p, name, ranges))
            };
            let t = match shared {
                Some(shared) => shared.get_or_make(PieceKey::new(name, p, ranges), make)?,
                None => make()?,
            };
            store.insert(name, t);
        }
        if let Some(shared) = shared {
            shared.rank_done();
        }
        tracing::debug!(elements, secs = started.elapsed().as_secs_f64(), "parameter pieces initialised");
        Ok(store)
    }

    /// The tensor `name`, if stored.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.map.get(name)
    }

    /// The tensor `name`, or [`RuntimeError::MissingParameter`].
    pub fn require(&self, name: &str) -> Result<&Tensor> {
        self.map.get(name).ok_or_else(|| RuntimeError::MissingParameter { name: name.to_string() })
    }

    /// The tensor `name` for an update in place, or [`RuntimeError::MissingParameter`].
    pub fn require_mut(&mut self, name: &str) -> Result<&mut Tensor> {
        self.map.get_mut(name).ok_or_else(|| RuntimeError::MissingParameter { name: name.to_string() })
    }

    /// The tensor `name` for an update in place, if stored.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Tensor> {
        self.map.get_mut(name)
    }

    /// Stores `t` as `name`; returns the tensor it replaced, if any.
    pub fn insert(&mut self, name: &str, t: Tensor) -> Option<Tensor> {
        self.map.insert(name.to_string(), t)
    }

    /// Removes `name`; returns its tensor, if it was stored.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.map.remove(name)
    }

    /// The number of stored tensors.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no tensor is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Tensor)> {
        self.map.iter()
    }
}

/// Runs a graph's communication ops across ranks. The parallel runtime implements it over a
/// `Communicator`; [`Executor::run_with`] hands it every communication node (AllReduce,
/// AllGather, ReduceScatter, AllToAll, Broadcast, Reduce, Send, Recv) with its input, and
/// expects a tensor of the node's inferred type back.
pub trait Collectives {
    /// Runs communication node `node` on `input`; returns a tensor of the node's inferred type.
    fn execute(&self, node: &Node, input: &Tensor) -> Result<Tensor>;
    /// The element-wise reduction of `input` over the world ranks of `group`, for ops that
    /// communicate inside (statistics over a split batch or a split normalised axis); `node`
    /// names the op in errors. Without an implementation such ops fail with
    /// [`RuntimeError::NeedsCommunicator`].
    fn all_reduce(&self, node: &Node, group: &[usize], op: autopar_graph::ReduceOp, input: &Tensor) -> Result<Tensor> {
        let _ = (op, input);
        Err(RuntimeError::NeedsCommunicator { kind: node.op.kind(), name: node.name.clone(), group: group.to_vec() })
    }
}

/// Results one node of a run leaves for another.
#[derive(Default)]
struct Caches {
    /// A normalisation backward's `(dx, dgamma)` pair, for its sibling node.
    norm: HashMap<NormKey, (Tensor, Tensor)>,
    /// Statistics a synchronised normalisation gathered over its group in the forward pass, by
    /// its input, kind, eps and axis ([`SavedKey`]), for its backward (which then needs no second round of all-reduces).
    stats: HashMap<SavedKey, SyncedStats>,
    /// The statistics an unsynchronised batch or layer norm's forward pass saved, for its
    /// backward (which then does not read its input twice more to recompute them).
    saved: HashMap<SavedKey, norm::NormSaved>,
    /// The gradients an attention backward computed for its sibling nodes (of `k`, `v`, ...).
    attention: HashMap<AttentionKey, Tensor>,
}

/// Mean and (biased) variance over a whole batch or whole rows, and the element count.
#[derive(Clone)]
struct SyncedStats {
    mean: Tensor,
    var: Tensor,
    count: usize,
}

/// What every op of one run may read besides its inputs.
#[derive(Clone, Copy)]
struct RunArgs<'a> {
    feeds: &'a [(NodeId, Tensor)],
    step: u64,
    collectives: Option<&'a dyn Collectives>,
    micro: MicroBatch,
}

/// Which micro-batch of the step a run computes: micro-batch `index` of `count` equal parts of
/// the step's batch (dimension 0). Dropout draws its mask as the rows of the whole step's mask,
/// so a step run in micro-batches drops exactly what the whole batch would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroBatch {
    /// The micro-batch, counted from 0.
    pub index: usize,
    /// The number of micro-batches the step's batch splits into.
    pub count: usize,
}

impl MicroBatch {
    /// The whole batch in one run.
    pub const WHOLE: MicroBatch = MicroBatch { index: 0, count: 1 };
}

/// Wall time of one op in a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTiming {
    /// The op's node.
    pub node: NodeId,
    /// The node's name.
    pub name: String,
    /// The op's kind (e.g. `MatMul`).
    pub kind: &'static str,
    /// Wall time of the op, in seconds.
    pub seconds: f64,
}

/// What a run returns.
#[derive(Clone, Debug, Default)]
pub struct RunOutput {
    /// One tensor per fetched node, in the order given to [`Executor::new`].
    pub values: Vec<Tensor>,
    /// Per-op times, in execution order (empty unless profiling).
    pub timings: Vec<OpTiming>,
    /// The most intermediate values alive at once during the run.
    pub peak_live: usize,
    /// The most bytes held by intermediate values at once during the run (parameters' values,
    /// the stored tensors shared, not counted).
    pub peak_live_bytes: usize,
    /// [`RunOutput::peak_live_bytes`] without the parameters' gradients the executor was told
    /// of ([`Executor::with_gradients`]): the activations' own peak.
    pub peak_activation_bytes: usize,
}

/// Identifies the normalisation-gradient nodes computing siblings of one backward (`dx` and
/// `dgamma` of the same batch/layer norm): their inputs, a family tag, eps, and the mode (batch
/// norm) or the first normalised axis (layer norm).
type NormKey = (Vec<NodeId>, u8, u64, i64);

/// Identifies the statistics a normalisation's forward pass saves for its backward (mean and
/// `1/sqrt(var + eps)`): the normalised input, the family tag, eps, and the mode (batch norm)
/// or the first normalised axis (layer norm), the same for the forward node and its gradients.
type SavedKey = (NodeId, u8, u64, i64);

fn saved_key(node: &Node) -> Option<SavedKey> {
    match &node.op {
        OpKind::BatchNorm(bn) => Some((node.inputs[0], 0, bn.eps.to_bits(), bn.training as i64)),
        OpKind::BatchNormGrad(bn) => Some((node.inputs[1], 0, bn.eps.to_bits(), bn.training as i64)),
        OpKind::LayerNorm(ln) => Some((node.inputs[0], 1, ln.eps.to_bits(), ln.begin_norm_axis)),
        OpKind::LayerNormGrad(ln) => Some((node.inputs[1], 1, ln.eps.to_bits(), ln.begin_norm_axis)),
        OpKind::RmsNorm(n) => Some((node.inputs[0], 2, n.eps.to_bits(), n.begin_norm_axis)),
        OpKind::RmsNormGrad(n) => Some((node.inputs[1], 2, n.eps.to_bits(), n.begin_norm_axis)),
        _ => None,
    }
}

/// Identifies one gradient of an attention backward: the inputs `(dy, q, k, v)`, the mask and
/// the first query position, the scale, and which input (0 `q`, 1 `k`, 2 `v`).
type AttentionKey = (Vec<NodeId>, bool, usize, u64, u8);

fn attention_key(node: &Node) -> Option<AttentionKey> {
    let OpKind::AttentionGrad(a) = &node.op else { return None };
    let of = match a.of {
        AttentionGradOf::Query => 0,
        AttentionGradOf::Key => 1,
        AttentionGradOf::Value => 2,
    };
    Some((node.inputs.clone(), a.causal, a.row_offset, a.scale.to_bits(), of))
}

fn norm_key(node: &Node) -> Option<NormKey> {
    if let OpKind::BatchNormGrad(bn) = &node.op {
        Some((node.inputs.clone(), 0, bn.eps.to_bits(), bn.training as i64))
    } else if let OpKind::LayerNormGrad(ln) = &node.op {
        Some((node.inputs.clone(), 1, ln.eps.to_bits(), ln.begin_norm_axis))
    } else if let OpKind::RmsNormGrad(n) = &node.op {
        Some((node.inputs.clone(), 2, n.eps.to_bits(), n.begin_norm_axis))
    } else {
        None
    }
}

/// A graph planned for execution on one device.
#[derive(Clone, Debug)]
pub struct Executor {
    graph: Graph,
    fetch: Vec<NodeId>,
    order: Vec<usize>,
    /// For each position in `order`, the values that die after it.
    free_after: Vec<Vec<usize>>,
    /// Normalisation backward computations needed by two scheduled nodes (computed once).
    shared_norm: std::collections::HashSet<NormKey>,
    /// The attention gradients scheduled nodes compute (the three are computed together).
    attention_grads: std::collections::HashSet<AttentionKey>,
    ctx: ExecCtx,
    profile: bool,
    /// Per node: a parameter's gradient, left out of [`RunOutput::peak_activation_bytes`].
    gradient: Vec<bool>,
    /// The loss scale [`LossScale`] ops multiply by ([`Executor::set_loss_scale`]; 1: none).
    loss_scale: f64,
}

impl Executor {
    /// Plans `graph` to produce `fetch` (kernels parallel on the current rayon pool).
    pub fn new(graph: Graph, fetch: &[NodeId]) -> Result<Self> {
        let autopar_graph::Schedule { order, free_after } = graph.schedule(fetch)?;
        let mut seen = std::collections::HashSet::new();
        let mut shared_norm = std::collections::HashSet::new();
        for &i in &order {
            if let Some(key) = norm_key(&graph.nodes()[i]) {
                if !seen.insert(key.clone()) {
                    shared_norm.insert(key);
                }
            }
        }
        let attention_grads = order.iter().filter_map(|&i| attention_key(&graph.nodes()[i])).collect();
        let gradient = vec![false; graph.len()];
        Ok(Self {
            graph,
            fetch: fetch.to_vec(),
            order,
            free_after,
            shared_norm,
            attention_grads,
            ctx: ExecCtx::parallel(),
            profile: false,
            gradient,
            loss_scale: 1.0,
        })
    }

    /// Sets the kernels' execution context (e.g. [`ExecCtx::serial`] for simulated ranks).
    pub fn with_ctx(mut self, ctx: ExecCtx) -> Self {
        self.ctx = ctx;
        self
    }

    /// Sets the loss scale the graph's [`LossScale`] ops multiply by in the next runs (the
    /// runtime's loss scaling; 1 without it).
    pub fn set_loss_scale(&mut self, scale: f64) {
        self.loss_scale = scale;
    }

    /// The nodes that are the parameters' gradients, which the activations' peak leaves out.
    pub fn with_gradients(mut self, gradients: impl IntoIterator<Item = NodeId>) -> Self {
        for g in gradients {
            if let Some(flag) = self.gradient.get_mut(g.0) {
                *flag = true;
            }
        }
        self
    }

    /// Records each op's wall time in [`RunOutput::timings`].
    pub fn with_profiling(mut self, on: bool) -> Self {
        self.profile = on;
        self
    }

    /// The planned graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The fetched nodes, in the order given to [`Executor::new`].
    pub fn fetch(&self) -> &[NodeId] {
        &self.fetch
    }

    /// Feeds keyed by input name, resolved to node ids for [`Executor::run`].
    pub fn feeds_by_name(&self, named: Vec<(&str, Tensor)>) -> Result<Vec<(NodeId, Tensor)>> {
        named.into_iter().map(|(n, t)| Ok((self.graph.find(n)?, t))).collect()
    }

    /// The inputs a run reads (those its fetches depend on), in schedule order.
    pub fn inputs(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.order.iter().filter(|&&i| matches!(self.graph.nodes()[i].op, OpKind::Input(_))).map(|&i| NodeId(i))
    }

    /// Number of nodes a run executes.
    pub fn num_scheduled(&self) -> usize {
        self.order.len()
    }

    /// Runs the graph. `feeds` give every needed input; `params` holds every needed parameter
    /// and receives updated running statistics (batch norm in training); `step` seeds dropout.
    pub fn run(&self, params: &mut ParamStore, feeds: &[(NodeId, Tensor)], step: u64) -> Result<RunOutput> {
        self.run_with(params, feeds, step, None)
    }

    /// As [`Executor::run`], with communication ops executed by `collectives` (without it they
    /// are identities on one-rank groups and an error otherwise).
    pub fn run_with(
        &self,
        params: &mut ParamStore,
        feeds: &[(NodeId, Tensor)],
        step: u64,
        collectives: Option<&dyn Collectives>,
    ) -> Result<RunOutput> {
        self.run_micro(params, feeds, step, collectives, MicroBatch::WHOLE)
    }

    /// As [`Executor::run_with`], for micro-batch `micro` of the step.
    pub fn run_micro(
        &self,
        params: &mut ParamStore,
        feeds: &[(NodeId, Tensor)],
        step: u64,
        collectives: Option<&dyn Collectives>,
        micro: MicroBatch,
    ) -> Result<RunOutput> {
        match collectives {
            // A communicator belongs to the thread of its rank.
            Some(_) => self.run_here(params, feeds, step, collectives, micro),
            None => self.ctx.on_pool(|| self.run_here(params, feeds, step, None, micro)),
        }
    }

    /// [`Executor::run_micro`] on the calling thread.
    fn run_here(
        &self,
        params: &mut ParamStore,
        feeds: &[(NodeId, Tensor)],
        step: u64,
        collectives: Option<&dyn Collectives>,
        micro: MicroBatch,
    ) -> Result<RunOutput> {
        for (id, _) in feeds {
            let node = self.graph.get(*id)?;
            if !matches!(node.op, OpKind::Input(_)) {
                return Err(RuntimeError::FeedNotInput { id: id.0, name: node.name.clone() });
            }
        }
        let mut values: Vec<Option<Tensor>> = vec![None; self.graph.len()];
        let mut caches = Caches::default();
        let mut timings = Vec::new();
        let (mut live, mut live_bytes, mut peak_live, mut peak_live_bytes) = (0usize, 0usize, 0usize, 0usize);
        let (mut activation_bytes, mut peak_activation_bytes) = (0usize, 0usize);
        for (pos, &i) in self.order.iter().enumerate() {
            let node = &self.graph.nodes()[i];
            let start = self.profile.then(Instant::now);
            let out = {
                let ins: Vec<&Tensor> = node.inputs.iter().map(|x| values[x.0].as_ref().expect("inputs run before their users")).collect();
                match collectives {
                    Some(c) if node.op.is_communication() => c.execute(node, ins[0])?,
                    _ => self.eval_in_precision(node, &ins, params, &RunArgs { feeds, step, collectives, micro }, &mut caches)?,
                }
            };
            if out.shape() != node.ty.shape.as_slice() || graph_dtype(out.dtype()) != node.ty.dtype {
                return Err(RuntimeError::TypeMismatch {
                    kind: node.op.kind(),
                    name: node.name.clone(),
                    shape: node.ty.shape.clone(),
                    dtype: node.ty.dtype,
                    got: out.shape().to_vec(),
                    got_dtype: graph_dtype(out.dtype()),
                });
            }
            if let Some(start) = start {
                timings.push(OpTiming {
                    node: NodeId(i),
                    name: node.name.clone(),
                    kind: node.op.kind(),
                    seconds: start.elapsed().as_secs_f64(),
                });
            }
            live += 1;
            live_bytes += node.value_bytes();
            if !self.gradient[i] {
                activation_bytes += node.value_bytes();
            }
            peak_live = peak_live.max(live);
            peak_live_bytes = peak_live_bytes.max(live_bytes);
            peak_activation_bytes = peak_activation_bytes.max(activation_bytes);
            values[i] = Some(out);
            for &dead in &self.free_after[pos] {
                if values[dead].take().is_some() {
                    live -= 1;
                    live_bytes -= self.graph.nodes()[dead].value_bytes();
                    if !self.gradient[dead] {
                        activation_bytes -= self.graph.nodes()[dead].value_bytes();
                    }
                }
            }
        }
        let values = self.fetch.iter().map(|f| values[f.0].clone().expect("fetched values are kept")).collect();
        Ok(RunOutput { values, timings, peak_live, peak_live_bytes, peak_activation_bytes })
    }

    /// [`Executor::eval`], an op computing on half-precision values (f16, bf16) run on their
    /// f32 widening and its result rounded to its own type: the arithmetic of a half-precision
    /// kernel that accumulates in f32. Ops that only move values keep their type.
    fn eval_in_precision(
        &self,
        node: &Node,
        x: &[&Tensor],
        params: &mut ParamStore,
        args: &RunArgs<'_>,
        caches: &mut Caches,
    ) -> Result<Tensor> {
        let moves = matches!(
            node.op,
            OpKind::Input(_)
                | OpKind::Parameter(_)
                | OpKind::Fill(_)
                | OpKind::Cast(_)
                | OpKind::Reshape(_)
                | OpKind::Flatten(_)
                | OpKind::Transpose(_)
                | OpKind::Concat(_)
        ) || node.op.is_communication();
        // A bf16 matrix product has its own kernel (f32 accumulation, bf16 dot products where
        // the CPU has them).
        let native = matches!(node.op, OpKind::MatMul(_)) && x.iter().all(|t| t.dtype() == autopar_tensor::DType::BF16);
        if moves || native || !(node.ty.dtype.is_half() || x.iter().any(|t| t.dtype().is_half())) {
            return self.eval(node, x, params, args, caches);
        }
        let wide: Vec<Tensor> =
            x.iter().map(|t| if t.dtype().is_half() { t.cast(autopar_tensor::DType::F32) } else { (*t).clone() }).collect();
        let refs: Vec<&Tensor> = wide.iter().collect();
        Ok(self.eval(node, &refs, params, args, caches)?.cast(tensor_dtype(node.ty.dtype)))
    }

    fn eval(&self, node: &Node, x: &[&Tensor], params: &mut ParamStore, args: &RunArgs<'_>, caches: &mut Caches) -> Result<Tensor> {
        let RunArgs { feeds, step, collectives, micro } = *args;
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let shape = &node.ty.shape;
        let axes = |a: &[i64], rank: usize| -> Vec<isize> { resolve(a, rank) };
        let comm = |group: &[usize]| -> Result<Tensor> {
            if group.len() == 1 {
                Ok(x[0].clone())
            } else {
                Err(RuntimeError::NeedsCommunicator { kind: node.op.kind(), name: node.name.clone(), group: group.to_vec() })
            }
        };
        let out = match &node.op {
            OpKind::Input(i) => {
                let id = self.graph.find(&node.name)?;
                let t = feeds.iter().find(|(f, _)| *f == id).map(|(_, t)| t.clone()).ok_or_else(|| RuntimeError::MissingFeed {
                    name: node.name.clone(),
                    shape: i.shape.clone(),
                    dtype: i.dtype,
                })?;
                if t.shape() != i.shape.as_slice() || graph_dtype(t.dtype()) != i.dtype {
                    return Err(RuntimeError::FeedMismatch {
                        name: node.name.clone(),
                        shape: i.shape.clone(),
                        dtype: i.dtype,
                        got: t.shape().to_vec(),
                        got_dtype: graph_dtype(t.dtype()),
                    });
                }
                t
            }
            OpKind::Parameter(p) => {
                let t = params.require(&node.name)?;
                if t.shape() != p.shape.as_slice() || graph_dtype(t.dtype()) != p.dtype {
                    return Err(RuntimeError::ParameterMismatch {
                        name: node.name.clone(),
                        shape: p.shape.clone(),
                        dtype: p.dtype,
                        got: t.shape().to_vec(),
                        got_dtype: graph_dtype(t.dtype()),
                    });
                }
                t.clone()
            }
            OpKind::Fill(f) => Tensor::full(&f.shape, f.value, tensor_dtype(f.dtype)),
            OpKind::Cast(c) => x[0].cast(tensor_dtype(c.dtype)),
            OpKind::Add(_) => ew::add(cx, x[0], x[1]).map_err(k)?,
            OpKind::Sub(_) => ew::sub(cx, x[0], x[1]).map_err(k)?,
            OpKind::Mul(_) => ew::mul(cx, x[0], x[1]).map_err(k)?,
            OpKind::Div(_) => ew::div(cx, x[0], x[1]).map_err(k)?,
            OpKind::Neg(_) => ew::neg(cx, x[0]).map_err(k)?,
            OpKind::Scale(s) => ew::scale(cx, x[0], s.factor).map_err(k)?,
            OpKind::LossScale(s) => ew::scale(cx, x[0], s.factor * self.loss_scale).map_err(k)?,
            OpKind::Exp(_) => ew::exp(cx, x[0]).map_err(k)?,
            OpKind::Log(_) => ew::log(cx, x[0]).map_err(k)?,
            OpKind::Sqrt(_) => ew::sqrt(cx, x[0]).map_err(k)?,
            OpKind::Relu(_) => ew::relu(cx, x[0]).map_err(k)?,
            // relu'(x) is read from the output: y > 0 exactly where x > 0.
            OpKind::ReluGrad(_) => ew::relu_backward(cx, x[1], x[0]).map_err(k)?,
            OpKind::Gelu(g) => ew::gelu(cx, x[0], g.approximate).map_err(k)?,
            OpKind::GeluGrad(g) => ew::gelu_backward(cx, x[1], x[0], g.approximate).map_err(k)?,
            OpKind::Silu(_) => ew::silu(cx, x[0]).map_err(k)?,
            OpKind::SiluGrad(_) => ew::silu_backward(cx, x[1], x[0]).map_err(k)?,
            OpKind::Tanh(_) => ew::tanh(cx, x[0]).map_err(k)?,
            OpKind::Sigmoid(_) => ew::sigmoid(cx, x[0]).map_err(k)?,
            OpKind::Softmax(s) if s.group.len() > 1 => self.synced_softmax(node, x[0], s.axis, &s.group, false, collectives)?,
            OpKind::Softmax(s) => reduce::softmax(cx, x[0], s.axis as isize).map_err(k)?,
            OpKind::LogSoftmax(s) if s.group.len() > 1 => self.synced_softmax(node, x[0], s.axis, &s.group, true, collectives)?,
            OpKind::LogSoftmax(s) => reduce::log_softmax(cx, x[0], s.axis as isize).map_err(k)?,
            OpKind::ReduceSum(r) => reduce::reduce_sum(cx, x[0], &axes(&r.axes, x[0].rank()), r.keep_dims).map_err(k)?,
            OpKind::ReduceMean(r) => reduce::reduce_mean(cx, x[0], &axes(&r.axes, x[0].rank()), r.keep_dims).map_err(k)?,
            OpKind::ReduceMax(r) => reduce::reduce_max(cx, x[0], &axes(&r.axes, x[0].rank()), r.keep_dims).map_err(k)?,
            OpKind::ReduceMaxGrad(r) => reduce::reduce_max_backward(cx, x[0], x[1], &axes(&r.axes, x[0].rank())).map_err(k)?,
            OpKind::Reshape(_) | OpKind::Flatten(_) => sh::reshape_to(x[0], shape).map_err(k)?,
            OpKind::Transpose(t) => sh::transpose(x[0], &t.perm).map_err(k)?,
            OpKind::BroadcastTo(b) => sh::broadcast_to(x[0], &b.shape).map_err(k)?,
            OpKind::SumTo(s) => ew::reduce_to_shape(cx, x[0], &s.shape).map_err(k)?,
            OpKind::Concat(c) => sh::concat(x, c.axis as isize).map_err(k)?,
            OpKind::Slice(s) => {
                let size: Vec<isize> = s.size.iter().map(|&d| d as isize).collect();
                sh::slice(x[0], &s.begin, &size).map_err(k)?
            }
            OpKind::Pad(p) => sh::slice_backward(x[0], shape, &p.before).map_err(k)?,
            OpKind::Gather(g) => match g.shard {
                None => sh::gather(cx, x[0], x[1], g.axis as isize).map_err(k)?,
                Some(t) => sh::gather_rows(cx, x[0], x[1], g.axis as isize, t.start, t.total).map_err(k)?,
            },
            OpKind::GatherGrad(g) => match g.shard {
                None => sh::gather_backward(cx, x[1], x[0], shape, g.axis as isize).map_err(k)?,
                Some(t) => sh::gather_rows_backward(cx, x[1], x[0], shape, g.axis as isize, t.start, t.total).map_err(k)?,
            },
            OpKind::OneHot(o) => sh::one_hot(x[0], o.depth, o.on_value, o.off_value, tensor_dtype(o.dtype)).map_err(k)?,
            OpKind::MatMul(m) => matmul::matmul(cx, x[0], x[1], m.transpose_a, m.transpose_b).map_err(k)?,
            OpKind::BatchMatMul(m) => matmul::batch_matmul(cx, x[0], x[1], m.transpose_a, m.transpose_b).map_err(k)?,
            OpKind::BiasAdd(_) => ew::bias_add(cx, x[0], x[1], 1).map_err(k)?,
            OpKind::Conv2D(c) => conv::conv2d(cx, x[0], x[1], &conv_params(&c.conv)).map_err(k)?,
            OpKind::Conv2DGradInput(c) => conv::conv2d_backward_input(cx, x[0], x[1], &c.input_shape, &conv_params(&c.conv)).map_err(k)?,
            OpKind::Conv2DGradFilter(c) => {
                conv::conv2d_backward_weight(cx, x[0], x[1], &c.filter_shape, &conv_params(&c.conv)).map_err(k)?
            }
            OpKind::MaxPool(m) => pool::max_pool2d(cx, x[0], &pool_params(&m.pool, false)).map_err(k)?.0,
            OpKind::MaxPoolGrad(m) => {
                // The argmax is recomputed from x: one output per node keeps liveness simple.
                let (_, argmax) = pool::max_pool2d(cx, x[0], &pool_params(&m.pool, false)).map_err(k)?;
                pool::max_pool2d_backward(cx, x[1], &argmax, x[0].shape()).map_err(k)?
            }
            OpKind::AvgPool(a) => pool::avg_pool2d(cx, x[0], &pool_params(&a.pool, true)).map_err(k)?,
            OpKind::AvgPoolGrad(a) => pool::avg_pool2d_backward(cx, x[0], &a.input_shape, &pool_params(&a.pool, true)).map_err(k)?,
            OpKind::GlobalAvgPool(_) => pool::global_avg_pool(cx, x[0], false).map_err(k)?,
            OpKind::BatchNorm(bn) => {
                // Running statistics the precision policy casts for a half-precision batch norm
                // are read from the float32 parameters they were cast from, so their updates
                // keep float32 precision.
                let stat = |slot: usize| -> Option<Tensor> {
                    let n = self.graph.node(node.inputs[slot]);
                    match &n.op {
                        OpKind::Cast(c) if c.inserted => params.get(&self.graph.node(n.inputs[0]).name).map(|t| t.cast(x[slot].dtype())),
                        _ => None,
                    }
                };
                let (mean32, var32) = (stat(3), stat(4));
                let (mean, var) = (mean32.as_ref().unwrap_or(x[3]), var32.as_ref().unwrap_or(x[4]));
                if bn.training {
                    let out = if bn.group.len() > 1 {
                        let stats = self.batch_stats(node, x[0], &bn.group, collectives)?;
                        caches.stats.insert(saved_key(node).expect("a normalisation"), stats.clone());
                        let stats = norm::BatchStats { mean: stats.mean, var: stats.var, count: stats.count };
                        norm::batch_norm_train_with(cx, x[0], x[1], x[2], mean, var, &stats, bn.momentum, bn.eps).map_err(k)?
                    } else {
                        let out = norm::batch_norm_train(cx, x[0], x[1], x[2], mean, var, bn.momentum, bn.eps).map_err(k)?;
                        caches.saved.insert(saved_key(node).expect("a normalisation"), out.saved.clone());
                        out
                    };
                    // Running statistics held as parameters are updated in the store, once a
                    // step: not again by the backward pass's recomputed copy.
                    let updates = if node.recompute == Recompute::Replay {
                        Vec::new()
                    } else {
                        vec![(node.inputs[3], out.running_mean), (node.inputs[4], out.running_var)]
                    };
                    for (input, value) in updates {
                        let mut stat = self.graph.node(input);
                        // Statistics the precision policy casts for a half-precision batch norm
                        // are updated in the parameters they were cast from, in their own type.
                        if stat.op.is_inserted_cast() {
                            stat = self.graph.node(stat.inputs[0]);
                        }
                        if let OpKind::Parameter(p) = &stat.op {
                            params.insert(&stat.name, value.cast(tensor_dtype(p.dtype)));
                        }
                    }
                    out.y
                } else {
                    norm::batch_norm_eval(cx, x[0], x[1], x[2], mean, var, bn.eps).map_err(k)?
                }
            }
            OpKind::BatchNormGrad(bn) => {
                // Inputs (dy, x, gamma, running_mean, running_var); computed once for the dx and
                // dgamma nodes together, from the statistics the forward pass saved in this run
                // (else recomputed: a pipeline's backward runs apart from its forward).
                let key = norm_key(node).expect("a normalisation gradient");
                let (dx, dgamma) = if let Some(pair) = caches.norm.remove(&key) {
                    pair
                } else {
                    let (dx, dgamma) = if bn.training && bn.group.len() > 1 {
                        let need_dx = bn.of == NormGradOf::Input || self.shared_norm.contains(&key);
                        let stats = match caches.stats.get(&saved_key(node).expect("a normalisation gradient")) {
                            Some(s) => s.clone(),
                            None => self.batch_stats(node, x[1], &bn.group, collectives)?,
                        };
                        self.synced_batch_norm_grad(node, x, &bn.group, &stats, bn.eps, need_dx, collectives)?
                    } else if bn.training {
                        let saved = match caches.saved.get(&saved_key(node).expect("a normalisation gradient")) {
                            Some(s) => s.clone(),
                            None => norm::batch_norm_saved(cx, x[1], bn.eps).map_err(k)?,
                        };
                        let (dx, dgamma, _) = norm::batch_norm_backward(cx, x[1], x[2], &saved, x[0]).map_err(k)?;
                        (dx, dgamma)
                    } else {
                        let var = x[4].to_f64_vec();
                        let inv: Vec<f64> = var.iter().map(|v| 1.0 / (v + bn.eps).sqrt()).collect();
                        let inv_std = Tensor::from_vec(x[4].shape(), inv).map_err(k)?.cast(x[4].dtype());
                        let saved = norm::NormSaved { mean: x[3].clone(), inv_std };
                        let (dx, dgamma, _) = norm::batch_norm_eval_backward(cx, x[1], x[2], &saved, x[0]).map_err(k)?;
                        (dx, dgamma)
                    };
                    self.share(&mut caches.norm, key, &dx, &dgamma);
                    (dx, dgamma)
                };
                match bn.of {
                    NormGradOf::Input => dx,
                    NormGradOf::Gamma => dgamma,
                }
            }
            OpKind::LayerNorm(ln) if ln.group.len() > 1 => {
                let stats = self.row_stats(node, x[0], ln.begin_norm_axis, &ln.group, true, collectives)?;
                let y =
                    norm::layer_norm_with(cx, x[0], x[1], x[2], ln.begin_norm_axis as isize, &stats.mean, &stats.var, ln.eps).map_err(k)?.0;
                caches.stats.insert(saved_key(node).expect("a normalisation"), stats);
                y
            }
            OpKind::LayerNorm(ln) => {
                let (y, saved) = norm::layer_norm(cx, x[0], x[1], x[2], ln.begin_norm_axis as isize, ln.eps).map_err(k)?;
                caches.saved.insert(saved_key(node).expect("a normalisation"), saved);
                y
            }
            OpKind::LayerNormGrad(ln) => {
                // Inputs (dy, x, gamma); computed once for both nodes, from the row statistics
                // the forward pass saved in this run (else recomputed).
                let key = norm_key(node).expect("a normalisation gradient");
                let (dx, dgamma) = if let Some(pair) = caches.norm.remove(&key) {
                    pair
                } else {
                    let (dx, dgamma) = if ln.group.len() > 1 {
                        let stats = match caches.stats.get(&saved_key(node).expect("a normalisation gradient")) {
                            Some(s) => s.clone(),
                            None => self.row_stats(node, x[1], ln.begin_norm_axis, &ln.group, true, collectives)?,
                        };
                        let need_dx = ln.of == NormGradOf::Input || self.shared_norm.contains(&key);
                        self.synced_layer_norm_grad(node, x, ln, &stats, need_dx, collectives)?
                    } else {
                        let saved = match caches.saved.get(&saved_key(node).expect("a normalisation gradient")) {
                            Some(s) => s.clone(),
                            None => norm::layer_norm_saved(cx, x[1], ln.begin_norm_axis as isize, ln.eps).map_err(k)?,
                        };
                        let (dx, dgamma, _) =
                            norm::layer_norm_backward(cx, x[1], x[2], &saved, x[0], ln.begin_norm_axis as isize).map_err(k)?;
                        (dx, dgamma)
                    };
                    self.share(&mut caches.norm, key, &dx, &dgamma);
                    (dx, dgamma)
                };
                match ln.of {
                    NormGradOf::Input => dx,
                    NormGradOf::Gamma => dgamma,
                }
            }
            OpKind::RmsNorm(n) if n.group.len() > 1 => {
                let stats = self.row_stats(node, x[0], n.begin_norm_axis, &n.group, false, collectives)?;
                let y = norm::rms_norm_with(cx, x[0], x[1], n.begin_norm_axis as isize, &stats.var, n.eps).map_err(k)?.0;
                caches.stats.insert(saved_key(node).expect("a normalisation"), stats);
                y
            }
            OpKind::RmsNorm(n) => {
                let (y, saved) = norm::rms_norm(cx, x[0], x[1], n.begin_norm_axis as isize, n.eps).map_err(k)?;
                caches.saved.insert(saved_key(node).expect("a normalisation"), saved);
                y
            }
            OpKind::RmsNormGrad(n) => self.rms_norm_grad(node, x, n, caches, collectives)?,
            OpKind::RotaryEmbedding(r) => rotary::rotary_embedding(cx, x[0], r.theta, r.offset, r.inverse).map_err(k)?,
            OpKind::RouterTopK(r) if r.mask => routing::top_k_mask(cx, x[0], r.k).map_err(k)?,
            OpKind::RouterTopK(r) => routing::top_k_weights(cx, x[0], r.k, r.renormalize, r.capacity).map_err(k)?,
            OpKind::RouterTopKGrad(r) => routing::top_k_weights_backward(cx, x[1], x[0], r.k, r.renormalize, r.capacity).map_err(k)?,
            OpKind::Attention(a) => attention::attention(cx, x[0], x[1], x[2], a.scale, a.causal, a.row_offset).map_err(k)?,
            OpKind::AttentionGrad(a) => self.attention_grad(node, x, a, caches)?,
            // The mask depends on (seed, step, the element's index in the whole tensor) only, so
            // the backward Dropout node (same seed, step and block) applies the same mask to dy.
            // A micro-batch's mask is its rows of the whole step's.
            OpKind::Dropout(d) => match (&d.block, micro.count) {
                (None, 1) => dropout::dropout(cx, x[0], d.p, dropout_seed(d.seed, step)).map_err(k)?.0,
                (block, _) => {
                    let (mut global, mut begin) = match block {
                        Some(b) => (b.global_shape.clone(), b.begin.clone()),
                        None => (x[0].shape().to_vec(), vec![0; x[0].rank()]),
                    };
                    if let (Some(g), Some(b)) = (global.first_mut(), begin.first_mut()) {
                        *b += micro.index * *g;
                        *g *= micro.count;
                    }
                    dropout::dropout_slice(cx, x[0], d.p, dropout_seed(d.seed, step), &global, &begin).map_err(k)?.0
                }
            },
            OpKind::SoftmaxCrossEntropy(_) => loss::softmax_cross_entropy_sparse(cx, x[0], x[1]).map_err(k)?.0,
            OpKind::AllReduce(c) => comm(&c.group)?,
            OpKind::AllGather(c) => comm(&c.group)?,
            OpKind::ReduceScatter(c) => comm(&c.group)?,
            OpKind::AllToAll(c) => comm(&c.group)?,
            OpKind::Broadcast(c) => comm(&c.group)?,
            OpKind::Reduce(c) => comm(&c.group)?,
            // Point-to-point ops are identities on one device.
            OpKind::Send(_) | OpKind::Recv(_) => x[0].clone(),
        };
        Ok(out)
    }
}

impl Executor {
    /// Reduce `t` over `group` through the collectives (an error without them).
    fn reduce_over(
        &self,
        node: &Node,
        group: &[usize],
        op: autopar_graph::ReduceOp,
        t: &Tensor,
        collectives: Option<&dyn Collectives>,
    ) -> Result<Tensor> {
        let c = collectives.ok_or_else(|| RuntimeError::NeedsCommunicator {
            kind: node.op.kind(),
            name: node.name.clone(),
            group: group.to_vec(),
        })?;
        c.all_reduce(node, group, op, t)
    }

    /// Sum `values` (partial sums of this rank's part of the data) over `group`, in f64.
    fn sum_over(&self, node: &Node, group: &[usize], values: Vec<f64>, collectives: Option<&dyn Collectives>) -> Result<Vec<f64>> {
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let t = Tensor::from_vec(&[values.len()], values).map_err(k)?;
        Ok(self.reduce_over(node, group, autopar_graph::ReduceOp::Sum, &t, collectives)?.to_f64_vec())
    }

    /// Softmax (or log-softmax) along an axis split over `group`: the row maximum and the sum
    /// of exponentials are taken over the group.
    fn synced_softmax(
        &self,
        node: &Node,
        x: &Tensor,
        axis: i64,
        group: &[usize],
        log: bool,
        collectives: Option<&dyn Collectives>,
    ) -> Result<Tensor> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let ax = [axis as isize];
        let m = reduce::reduce_max(cx, x, &ax, true).map_err(k)?;
        let m = self.reduce_over(node, group, autopar_graph::ReduceOp::Max, &m, collectives)?;
        let z = ew::sub(cx, x, &m).map_err(k)?;
        let e = ew::exp(cx, &z).map_err(k)?;
        let s = reduce::reduce_sum(cx, &e, &ax, true).map_err(k)?;
        let s = self.reduce_over(node, group, autopar_graph::ReduceOp::Sum, &s, collectives)?;
        if log {
            ew::sub(cx, &z, &ew::log(cx, &s).map_err(k)?).map_err(k)
        } else {
            ew::div(cx, &e, &s).map_err(k)
        }
    }

    /// A normalisation's row statistics over normalised dimensions split over `group`, with
    /// the whole row size: LayerNorm's (`centred`) mean and variance (two sums over the group),
    /// RMSNorm's mean square in `var` with a zero `mean` (one sum).
    fn row_stats(
        &self,
        node: &Node,
        x: &Tensor,
        axis: i64,
        group: &[usize],
        centred: bool,
        collectives: Option<&dyn Collectives>,
    ) -> Result<SyncedStats> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let a = axis as isize;
        let local = if centred { norm::row_sums(cx, x, a, None) } else { norm::row_square_sums(cx, x, a) }.map_err(k)?;
        let rows_shape = local.shape().to_vec();
        let rows = local.numel();
        let mut sums = local.to_f64_vec();
        sums.push((x.numel() / rows.max(1)) as f64);
        let sums = self.sum_over(node, group, sums, collectives)?;
        let count = sums[rows] as usize;
        let first: Vec<f64> = sums[..rows].iter().map(|s| s / count.max(1) as f64).collect();
        let first = Tensor::from_vec(&rows_shape, first).map_err(k)?.cast(x.dtype());
        if !centred {
            return Ok(SyncedStats { mean: Tensor::zeros(&rows_shape, x.dtype()), var: first, count });
        }
        let sq = norm::row_sums(cx, x, a, Some(&first)).map_err(k)?.to_f64_vec();
        let sq = self.sum_over(node, group, sq, collectives)?;
        let var = Tensor::from_vec(&rows_shape, sq.iter().map(|s| s / count.max(1) as f64).collect()).map_err(k)?.cast(x.dtype());
        Ok(SyncedStats { mean: first, var, count })
    }

    /// RMSNorm's backward, inputs `(dy, x, gamma)`: `dx` and `dgamma` computed once for both
    /// sibling nodes, from the forward's statistics (over the group when the normalised
    /// dimensions are split).
    fn rms_norm_grad(
        &self,
        node: &Node,
        x: &[&Tensor],
        n: &RmsNormGrad,
        caches: &mut Caches,
        collectives: Option<&dyn Collectives>,
    ) -> Result<Tensor> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        // Inputs (dy, x, gamma); computed once for both nodes, as LayerNormGrad.
        let key = norm_key(node).expect("a normalisation gradient");
        let (dx, dgamma) = if let Some(pair) = caches.norm.remove(&key) {
            pair
        } else {
            let a = n.begin_norm_axis as isize;
            let (dx, dgamma) = if n.group.len() > 1 {
                let stats = match caches.stats.get(&saved_key(node).expect("a normalisation gradient")) {
                    Some(s) => s.clone(),
                    None => self.row_stats(node, x[1], n.begin_norm_axis, &n.group, false, collectives)?,
                };
                let (_, saved) = norm::rms_norm_with(cx, x[1], x[2], a, &stats.var, n.eps).map_err(k)?;
                let sums = norm::rms_norm_grad_sums(cx, x[1], x[2], &saved, x[0], a).map_err(k)?;
                let sums = if n.of == NormGradOf::Input || self.shared_norm.contains(&key) {
                    let summed = self.sum_over(node, &n.group, sums.to_f64_vec(), collectives)?;
                    Tensor::from_vec(sums.shape(), summed).map_err(k)?.cast(sums.dtype())
                } else {
                    sums
                };
                norm::rms_norm_backward_with(cx, x[1], x[2], &saved, x[0], a, &sums, stats.count).map_err(k)?
            } else {
                let saved = match caches.saved.get(&saved_key(node).expect("a normalisation gradient")) {
                    Some(s) => s.clone(),
                    None => norm::rms_norm_saved(cx, x[1], a, n.eps).map_err(k)?,
                };
                norm::rms_norm_backward(cx, x[1], x[2], &saved, x[0], a).map_err(k)?
            };
            self.share(&mut caches.norm, key, &dx, &dgamma);
            (dx, dgamma)
        };
        Ok(match n.of {
            NormGradOf::Input => dx,
            NormGradOf::Gamma => dgamma,
        })
    }

    /// Attention's backward, inputs `(dy, q, k, v)`: the three gradients computed once, those of
    /// the sibling nodes kept for them.
    fn attention_grad(&self, node: &Node, x: &[&Tensor], a: &AttentionGrad, caches: &mut Caches) -> Result<Tensor> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let key = attention_key(node).expect("an attention gradient");
        Ok(match caches.attention.remove(&key) {
            Some(g) => g,
            None => {
                let grads = attention::attention_backward(cx, x[1], x[2], x[3], x[0], a.scale, a.causal, a.row_offset).map_err(k)?;
                let mut mine = None;
                for (of, g) in [grads.0, grads.1, grads.2].into_iter().enumerate() {
                    let sibling = (key.0.clone(), key.1, key.2, key.3, of as u8);
                    if sibling == key {
                        mine = Some(g);
                    } else if self.attention_grads.contains(&sibling) {
                        caches.attention.insert(sibling, g);
                    }
                }
                mine.expect("one of the three")
            }
        })
    }

    /// LayerNorm backward over normalised dimensions split over the op's group, inputs
    /// `(dy, x, gamma)`, with the forward's row `stats`: `dx` from the row sums over the group
    /// (when `need_dx`), and `dgamma` of this rank's part.
    fn synced_layer_norm_grad(
        &self,
        node: &Node,
        x: &[&Tensor],
        ln: &LayerNormGrad,
        stats: &SyncedStats,
        need_dx: bool,
        collectives: Option<&dyn Collectives>,
    ) -> Result<(Tensor, Tensor)> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let a = ln.begin_norm_axis as isize;
        let zeros = Tensor::zeros(x[2].shape(), x[2].dtype());
        let (_, saved) = norm::layer_norm_with(cx, x[1], x[2], &zeros, a, &stats.mean, &stats.var, ln.eps).map_err(k)?;
        let (s1, s2) = norm::layer_norm_grad_sums(cx, x[1], x[2], &saved, x[0], a).map_err(k)?;
        if need_dx {
            let rows_shape = s1.shape().to_vec();
            let rows = s1.numel();
            let mut both = s1.to_f64_vec();
            both.extend(s2.to_f64_vec());
            let both = self.sum_over(node, &ln.group, both, collectives)?;
            let dtype = x[1].dtype();
            let (s1, s2) = (&both[..rows], &both[rows..]);
            let s1 = Tensor::from_vec(&rows_shape, s1.to_vec()).map_err(k)?.cast(dtype);
            let s2 = Tensor::from_vec(&rows_shape, s2.to_vec()).map_err(k)?.cast(dtype);
            let (dx, dgamma, _) = norm::layer_norm_backward_with(cx, x[1], x[2], &saved, x[0], a, &s1, &s2, stats.count).map_err(k)?;
            Ok((dx, dgamma))
        } else {
            let (_, dgamma, _) = norm::layer_norm_backward_with(cx, x[1], x[2], &saved, x[0], a, &s1, &s2, stats.count).map_err(k)?;
            Ok((Tensor::zeros(x[1].shape(), x[1].dtype()), dgamma))
        }
    }

    /// Synchronised BatchNorm: the mean and variance over the batch parts of every rank of
    /// `group` (two sums over the group: of x with the element count, then of squared
    /// deviations from the mean).
    fn batch_stats(&self, node: &Node, x: &Tensor, group: &[usize], collectives: Option<&dyn Collectives>) -> Result<SyncedStats> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let c = x.shape().get(1).copied().unwrap_or(0);
        let mut sums = norm::channel_sums(cx, x, None).map_err(k)?.to_f64_vec();
        sums.push((x.numel() / c.max(1)) as f64);
        let sums = self.sum_over(node, group, sums, collectives)?;
        let count = sums[c] as usize;
        if count == 0 {
            return Err(RuntimeError::Kernel {
                kind: node.op.kind(),
                name: node.name.clone(),
                source: Box::new(TensorError::InvalidArgument {
                    op: "batch_norm",
                    name: "batch",
                    value: format!("{group:?}"),
                    expected: "at least one element per channel over the group",
                }),
            });
        }
        let mean: Vec<f64> = sums[..c].iter().map(|s| s / count as f64).collect();
        let mean = Tensor::from_vec(&[c], mean).map_err(k)?.cast(x.dtype());
        let sq = norm::channel_sums(cx, x, Some(&mean)).map_err(k)?.to_f64_vec();
        let sq = self.sum_over(node, group, sq, collectives)?;
        let var = Tensor::from_vec(&[c], sq.iter().map(|s| s / count as f64).collect()).map_err(k)?.cast(x.dtype());
        Ok(SyncedStats { mean, var, count })
    }

    /// Synchronised BatchNorm backward, inputs `(dy, x, gamma, ..)`, with the forward's batch
    /// `stats`: `dx` from the gradient sums over the group (when `need_dx`), and this rank's
    /// share of `dgamma`.
    #[allow(clippy::too_many_arguments)]
    fn synced_batch_norm_grad(
        &self,
        node: &Node,
        x: &[&Tensor],
        group: &[usize],
        stats: &SyncedStats,
        eps: f64,
        need_dx: bool,
        collectives: Option<&dyn Collectives>,
    ) -> Result<(Tensor, Tensor)> {
        let cx = &self.ctx;
        let k = |e: TensorError| RuntimeError::Kernel { kind: node.op.kind(), name: node.name.clone(), source: Box::new(e) };
        let batch = norm::BatchStats { mean: stats.mean.clone(), var: stats.var.clone(), count: stats.count };
        let zeros = Tensor::zeros(x[2].shape(), x[2].dtype());
        let fwd = norm::batch_norm_train_with(cx, x[1], x[2], &zeros, x[3], x[4], &batch, 0.0, eps).map_err(k)?;
        let (sum_dy, sum_dy_xhat) = norm::batch_norm_grad_sums(cx, x[1], &fwd.saved, x[0]).map_err(k)?;
        let dx = if need_dx {
            let c = sum_dy.numel();
            let mut both = sum_dy.to_f64_vec();
            both.extend(sum_dy_xhat.to_f64_vec());
            let both = self.sum_over(node, group, both, collectives)?;
            let dtype = x[1].dtype();
            let total_dy = Tensor::from_vec(&[c], both[..c].to_vec()).map_err(k)?.cast(dtype);
            let total_dyx = Tensor::from_vec(&[c], both[c..].to_vec()).map_err(k)?.cast(dtype);
            norm::batch_norm_backward_input(cx, x[1], x[2], &fwd.saved, x[0], &total_dy, &total_dyx, stats.count).map_err(k)?
        } else {
            Tensor::zeros(x[1].shape(), x[1].dtype())
        };
        Ok((dx, sum_dy_xhat))
    }

    /// Keeps a normalisation backward's pair of results for the sibling node, if one is
    /// scheduled and has not run yet.
    fn share(&self, cache: &mut HashMap<NormKey, (Tensor, Tensor)>, key: NormKey, dx: &Tensor, dgamma: &Tensor) {
        if self.shared_norm.contains(&key) {
            cache.insert(key, (dx.clone(), dgamma.clone()));
        }
    }
}

fn resolve(axes: &[i64], rank: usize) -> Vec<isize> {
    if axes.is_empty() {
        return (0..rank as isize).collect();
    }
    axes.iter().map(|&a| a as isize).collect()
}

fn conv_params(c: &ConvAttrs) -> conv::Conv2dParams {
    conv::Conv2dParams { stride: c.stride, padding: c.padding, dilation: c.dilation, groups: c.groups }
}

fn pool_params(p: &PoolAttrs, count_include_pad: bool) -> pool::Pool2dParams {
    pool::Pool2dParams { kernel: p.kernel, stride: p.stride, padding: p.padding, count_include_pad }
}

/// Dropout seed of one step: the op's seed mixed with the step number (SplitMix64 finaliser).
pub fn dropout_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What identifies a generated piece: the parameter (name, shape, dtype, initialiser, seed; the
/// ranks of hybrid_parallel have graphs of their own) and the piece's ranges.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PieceKey {
    name: String,
    shape: Vec<usize>,
    dtype: String,
    init: String,
    seed: u64,
    ranges: Vec<std::ops::Range<usize>>,
}

impl PieceKey {
    fn new(name: &str, p: &Parameter, ranges: &[std::ops::Range<usize>]) -> Self {
        Self {
            name: name.to_string(),
            shape: p.shape.clone(),
            dtype: format!("{:?}", p.dtype),
            init: p.init.to_string(),
            seed: p.seed,
            ranges: ranges.to_vec(),
        }
    }
}

/// The simulated ranks of one process initialising together: a parameter piece several of them
/// hold (a replica) is generated once and shared (tensors copy on write, so each rank gets its
/// own copy only when it updates it), instead of generated by every rank. Once every one of the
/// `ranks` ranks has its pieces, the shared set is dropped (a rank that fails before then leaves
/// it to the end of the run, which fails too). A rank waiting for a piece another is making
/// keeps its core meanwhile: the piece would otherwise be made twice.
#[derive(Debug)]
pub struct SharedInit {
    ranks: usize,
    state: std::sync::Mutex<SharedState>,
}

#[derive(Debug, Default)]
struct SharedState {
    done: usize,
    made: usize,
    pieces: HashMap<PieceKey, std::sync::Arc<std::sync::Mutex<Option<Tensor>>>>,
}

impl SharedInit {
    /// For the `ranks` ranks this process runs.
    pub fn new(ranks: usize) -> Self {
        Self { ranks, state: Default::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The piece `key`: made by `make` by the first rank that asks (the others wait for it
    /// rather than make it too), shared afterwards.
    fn get_or_make(&self, key: PieceKey, make: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
        let slot = {
            let mut state = self.lock();
            if state.done >= self.ranks {
                return make();
            }
            state.pieces.entry(key).or_default().clone()
        };
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(t) => Ok(t.clone()),
            None => {
                let t = make()?;
                self.lock().made += t.numel();
                *slot = Some(t.clone());
                Ok(t)
            }
        }
    }

    /// The elements generated through this set so far (each shared piece counted once).
    pub fn elements_made(&self) -> usize {
        self.lock().made
    }

    /// One more rank has all its pieces; after the last, the shared set is dropped.
    fn rank_done(&self) {
        let mut state = self.lock();
        state.done += 1;
        if state.done >= self.ranks {
            state.pieces.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_graph::{GraphBuilder, Initializer, ParamSpec, ReduceOp};

    fn v(shape: &[usize], x: &[f64]) -> Tensor {
        Tensor::from_vec(shape, x.to_vec()).unwrap()
    }

    #[test]
    fn intermediates_are_freed_after_their_last_use() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[64], DType::F64).unwrap();
        let mut h = x;
        for i in 0..12 {
            h = b.tanh(&format!("t{i}"), h).unwrap();
        }
        let g = b.finish();
        let out = Executor::new(g, &[h]).unwrap().run(&mut ParamStore::new(), &[(x, v(&[64], &[0.5; 64]))], 0).unwrap();
        // A chain needs its current value and the one being produced, never all 13.
        assert!(out.peak_live <= 2, "peak live {}", out.peak_live);
        assert_eq!(out.peak_live_bytes, 2 * 64 * 8);
        assert!((out.values[0].to_f64_vec()[0] - (0..12).fold(0.5f64, |a, _| a.tanh())).abs() < 1e-15);
    }

    #[test]
    fn only_the_nodes_the_fetched_values_need_are_run_and_timed() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2], DType::F64).unwrap();
        let y = b.exp("y", x).unwrap();
        let _unused = b.log("unused", x).unwrap();
        let g = b.finish();
        let exec = Executor::new(g.clone(), &[y]).unwrap();
        assert_eq!(exec.num_scheduled(), 2);
        let out = exec.run(&mut ParamStore::new(), &[(x, v(&[2], &[0.0, 1.0]))], 0).unwrap();
        assert!(out.timings.is_empty());
        let out =
            Executor::new(g, &[y]).unwrap().with_profiling(true).run(&mut ParamStore::new(), &[(x, v(&[2], &[0.0, 1.0]))], 0).unwrap();
        let names: Vec<&str> = out.timings.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["x", "y"]);
        assert_eq!(out.timings[1].kind, "Exp");
    }

    #[test]
    fn bad_feeds_and_missing_parameters_are_reported_by_name() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("batch", &[2, 3], DType::F32).unwrap();
        let w = b.parameter("w", &[3, 1], Initializer::Ones).unwrap();
        let y = b.matmul("mm", x, w).unwrap();
        let g = b.finish();
        let exec = Executor::new(g.clone(), &[y]).unwrap();
        let mut params = ParamStore::init(&g).unwrap();
        let err = exec.feeds_by_name(vec![("btch", v(&[2, 3], &[0.0; 6]))]).unwrap_err();
        assert_eq!(err.to_string(), "no node named \"btch\"");
        let feeds = exec.feeds_by_name(vec![("batch", v(&[2, 3], &[1.0; 6]).cast(autopar_tensor::DType::F32))]).unwrap();
        assert_eq!(exec.run(&mut params, &feeds, 0).unwrap().values[0].to_f64_vec(), vec![3.0, 3.0]);
        let err = exec.run(&mut params, &[], 0).unwrap_err();
        assert!(err.to_string().starts_with("input batch was not fed"), "{err}");
        let err = exec.run(&mut params, &[(x, v(&[3, 2], &[0.0; 6]))], 0).unwrap_err();
        assert!(err.to_string().starts_with("input batch was fed f64[3, 2], expected f32[2, 3]"), "{err}");
        let err = exec.run(&mut params, &[(w, v(&[3, 1], &[0.0; 3]))], 0).unwrap_err();
        assert!(matches!(err, RuntimeError::FeedNotInput { .. }), "{err}");
        let err = exec.run(&mut ParamStore::new(), &[(x, v(&[2, 3], &[0.0; 6]).cast(autopar_tensor::DType::F32))], 0).unwrap_err();
        assert!(err.to_string().starts_with("parameter w is missing from the parameter store"), "{err}");
    }

    #[test]
    fn kernel_errors_name_the_op() {
        let mut b = GraphBuilder::new(0);
        let t = b.input("table", &[3, 2], DType::F32).unwrap();
        let i = b.input("ids", &[2], DType::I64).unwrap();
        let y = b.gather("embedding", t, i, 0).unwrap();
        let exec = Executor::new(b.finish(), &[y]).unwrap();
        let feeds = [(t, v(&[3, 2], &[0.0; 6]).cast(autopar_tensor::DType::F32)), (i, Tensor::from_vec(&[2], vec![1i64, 7]).unwrap())];
        let err = exec.run(&mut ParamStore::new(), &feeds, 0).unwrap_err();
        assert!(err.to_string().starts_with("Gather embedding failed: "), "{err}");
    }

    #[test]
    fn an_output_that_disagrees_with_the_inferred_type_is_an_error() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2, 3, 4], DType::F64).unwrap();
        let y = b.transpose("tr", x, &[2, 1, 0]).unwrap();
        let mut g = b.finish();
        // A rewrite that changes the op without re-running inference (Graph::validate).
        if let OpKind::Transpose(t) = &mut g.node_mut(y).op {
            t.perm = vec![1, 0, 2];
        }
        let err = Executor::new(g, &[y]).unwrap().run(&mut ParamStore::new(), &[(x, v(&[2, 3, 4], &[0.0; 24]))], 0).unwrap_err();
        assert!(err.to_string().starts_with("Transpose tr produced f64[3, 2, 4], but the graph inferred f64[4, 3, 2]"), "{err}");
    }

    #[test]
    fn collectives_across_ranks_need_a_communicator() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2], DType::F64).unwrap();
        let y = b.all_reduce("grad_sync", x, ReduceOp::Sum, &[0, 1]).unwrap();
        let err = Executor::new(b.finish(), &[y]).unwrap().run(&mut ParamStore::new(), &[(x, v(&[2], &[1.0, 2.0]))], 0).unwrap_err();
        assert!(matches!(err, RuntimeError::NeedsCommunicator { ref group, .. } if group == &vec![0, 1]), "{err}");
    }

    /// Counts the in-op reductions; each is the identity (a group of one rank in effect).
    struct Counting(std::cell::Cell<usize>);
    impl Collectives for Counting {
        fn execute(&self, _: &Node, input: &Tensor) -> Result<Tensor> {
            Ok(input.clone())
        }
        fn all_reduce(&self, _: &Node, _: &[usize], _: ReduceOp, input: &Tensor) -> Result<Tensor> {
            self.0.set(self.0.get() + 1);
            Ok(input.clone())
        }
    }

    /// BatchNorm (training) of x [4, 3] -> sum of squares, synchronised over `group`; gradients
    /// of `wrt` ("x", "gamma").
    fn batch_norm_net(group: &[usize], wrt: &[&str]) -> (Executor, NodeId) {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 3], DType::F64).unwrap();
        let gamma =
            b.parameter_with("gamma", ParamSpec::new(&[3], Initializer::Uniform { low: 0.5, high: 1.5 }).dtype(DType::F64)).unwrap();
        let beta = b.parameter_with("beta", ParamSpec::new(&[3], Initializer::Zeros).dtype(DType::F64)).unwrap();
        let mean = b.parameter_with("mean", ParamSpec::new(&[3], Initializer::Zeros).dtype(DType::F64).frozen()).unwrap();
        let var = b.parameter_with("var", ParamSpec::new(&[3], Initializer::Ones).dtype(DType::F64).frozen()).unwrap();
        let y = b.batch_norm_synced("bn", [x, gamma, beta, mean, var], 1e-5, 0.9, group).unwrap();
        let sq = b.mul("sq", y, y).unwrap();
        let w = b.parameter_with("w", ParamSpec::new(&[4, 3], Initializer::Uniform { low: -1.0, high: 1.0 }).dtype(DType::F64)).unwrap();
        let weighted = b.mul("weighted", sq, w).unwrap();
        let loss = b.reduce_sum("loss", weighted, &[], false).unwrap();
        let mut g = b.finish();
        let ids: Vec<NodeId> = wrt.iter().map(|n| g.find(n).unwrap()).collect();
        let grads = autopar_graph::differentiate(&mut g, loss, &ids).unwrap();
        let mut fetch = vec![loss];
        fetch.extend(grads.grads.iter().map(|(_, d)| *d));
        (Executor::new(g, &fetch).unwrap(), x)
    }

    #[test]
    fn a_synchronised_batch_norm_reduces_its_statistics_once_per_pass_and_needs_collectives() {
        let xv = v(&[4, 3], &[0.1, -0.4, 2.0, 0.7, 0.3, -1.0, -0.2, 0.9, 0.5, 1.3, -0.6, 0.0]);
        // forward: the sums, then the squared deviations; backward: the gradient sums for dx only.
        for (wrt, calls) in [(&["x", "gamma"][..], 3), (&["gamma"][..], 2), (&["x"][..], 3)] {
            let (synced, x) = batch_norm_net(&[0, 1], wrt);
            let (plain, _) = batch_norm_net(&[], wrt);
            let mut params = ParamStore::init(synced.graph()).unwrap();
            let counting = Counting(std::cell::Cell::new(0));
            let got = synced.run_with(&mut params.clone(), &[(x, xv.clone())], 0, Some(&counting)).unwrap();
            assert_eq!(counting.0.get(), calls, "reductions with gradients of {wrt:?}");
            // With one rank in effect, the synchronised op is the plain one.
            let want = plain.run(&mut params, &[(x, xv.clone())], 0).unwrap();
            for (a, b) in got.values.iter().zip(&want.values) {
                for (p, q) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                    assert!((p - q).abs() < 1e-12, "{wrt:?}: {p} vs {q}");
                }
            }
            let err = synced.run(&mut ParamStore::init(synced.graph()).unwrap(), &[(x, xv.clone())], 0).unwrap_err();
            assert!(matches!(err, RuntimeError::NeedsCommunicator { kind: "BatchNorm", .. }), "{err}");
        }
    }

    #[test]
    fn communication_ops_go_to_the_collectives_when_given() {
        struct Doubling;
        impl Collectives for Doubling {
            fn execute(&self, node: &Node, input: &Tensor) -> Result<Tensor> {
                assert_eq!(node.op.kind(), "AllReduce");
                Ok(ew::scale(&ExecCtx::serial(), input, 2.0).unwrap())
            }
            fn all_reduce(&self, _: &Node, _: &[usize], _: ReduceOp, input: &Tensor) -> Result<Tensor> {
                Ok(ew::scale(&ExecCtx::serial(), input, 2.0).unwrap())
            }
        }
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2], DType::F64).unwrap();
        let y = b.all_reduce("grad_sync", x, ReduceOp::Sum, &[0, 1]).unwrap();
        let z = b.exp("z", y).unwrap();
        let exec = Executor::new(b.finish(), &[z]).unwrap();
        let out = exec.run_with(&mut ParamStore::new(), &[(x, v(&[2], &[0.0, 0.5]))], 0, Some(&Doubling)).unwrap();
        assert_eq!(out.values[0].to_f64_vec(), vec![1.0, 1f64.exp()]);
    }

    #[test]
    fn training_batch_norm_updates_the_running_statistics_in_the_store() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2, 1], DType::F64).unwrap();
        let p = |b: &mut GraphBuilder, n: &str, init| b.parameter_with(n, ParamSpec::new(&[1], init).dtype(DType::F64)).unwrap();
        let gamma = p(&mut b, "bn.gamma", Initializer::Ones);
        let beta = p(&mut b, "bn.beta", Initializer::Zeros);
        let b2 = &mut b;
        let mean = b2.parameter_with("bn.moving_mean", ParamSpec::new(&[1], Initializer::Zeros).dtype(DType::F64).frozen()).unwrap();
        let var = b2.parameter_with("bn.moving_variance", ParamSpec::new(&[1], Initializer::Ones).dtype(DType::F64).frozen()).unwrap();
        let y = b.batch_norm("bn", [x, gamma, beta, mean, var], true, 1e-5, 0.9).unwrap();
        let g = b.finish();
        let mut params = ParamStore::init(&g).unwrap();
        Executor::new(g, &[y]).unwrap().run(&mut params, &[(x, v(&[2, 1], &[1.0, 3.0]))], 0).unwrap();
        // batch mean 2, unbiased variance 2: 0.9 * old + 0.1 * batch
        assert!((params.get("bn.moving_mean").unwrap().to_f64_vec()[0] - 0.2).abs() < 1e-12);
        assert!((params.get("bn.moving_variance").unwrap().to_f64_vec()[0] - 1.1).abs() < 1e-12);
    }

    #[test]
    fn dropout_masks_repeat_within_a_step_and_change_between_steps() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[256], DType::F64).unwrap();
        let d1 = b.dropout("d1", x, 0.5, 3).unwrap();
        let d2 = b.dropout("d2", x, 0.5, 3).unwrap();
        let exec = Executor::new(b.finish(), &[d1, d2]).unwrap();
        let feeds = [(x, v(&[256], &[1.0; 256]))];
        let a = exec.run(&mut ParamStore::new(), &feeds, 5).unwrap();
        assert_eq!(a.values[0].to_f64_vec(), a.values[1].to_f64_vec());
        let again = exec.run(&mut ParamStore::new(), &feeds, 5).unwrap();
        assert_eq!(a.values[0].to_f64_vec(), again.values[0].to_f64_vec());
        let next = exec.run(&mut ParamStore::new(), &feeds, 6).unwrap();
        assert_ne!(a.values[0].to_f64_vec(), next.values[0].to_f64_vec());
    }

    #[test]
    fn parameters_are_materialised_from_their_seeded_initialisers() {
        let mut b = GraphBuilder::new(11);
        b.parameter("w", &[4, 3], Initializer::Normal { mean: 0.0, std: 1.0 }).unwrap();
        let g = b.finish();
        let (s1, s2) = (ParamStore::init(&g).unwrap(), ParamStore::init(&g).unwrap());
        assert_eq!(s1.get("w").unwrap().to_f64_vec(), s2.get("w").unwrap().to_f64_vec());
        assert_eq!(s1.get("w").unwrap().dtype(), autopar_tensor::DType::F32);
        let mut b = GraphBuilder::new(12);
        b.parameter("w", &[4, 3], Initializer::Normal { mean: 0.0, std: 1.0 }).unwrap();
        assert_ne!(ParamStore::init(&b.finish()).unwrap().get("w").unwrap().to_f64_vec(), s1.get("w").unwrap().to_f64_vec());
    }
}
