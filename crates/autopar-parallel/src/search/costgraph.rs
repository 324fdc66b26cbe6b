//! The cost graph: every op with a sharding rule and its candidate strategies, what each
//! candidate costs on its own, and what every producer-consumer pair of candidates costs in
//! redistribution. All costs are seconds of one device's step under a [`DeviceProfile`].
//!
//! * **Compute**: the op's local FLOPs and bytes (its cost rule on the candidate's slices) at
//!   the profile's rates; a training step counts the backward as twice the forward.
//! * **Communication** (in the op): a split contraction or reduction completes its partial sums
//!   with an all-reduce over the ranks splitting it (MindSpore's OperatorInfo does the same; the
//!   consumers then see the whole values), and synchronised statistics reduce over their group.
//! * **Redistribution**: the steps the planner inserts between a producer's layout (through
//!   reshapes, which follow their input) and the layout the consumer's candidate needs, each
//!   collective at the profile's alpha-beta constants (forward and, in training, its adjoint);
//!   local slices at the memory rate. Inputs (the dataset strategy) and ops run whole give fixed
//!   layouts, so their redistributions are the consumer's or producer's own cost.
//! * **Gradient synchronisation**: the all-reduce of a trainable parameter's gradient over the
//!   ranks holding the same slice, charged to the op whose layout the parameter takes (its
//!   first consumer). Gradients travel in fused buckets, so a parameter pays for its bytes and
//!   not for a call's latency.
//! * **Memory**: the op's output slice and its parameters' slices with their gradients and one
//!   optimizer slot; candidates above `device_memory_capacity` are dropped.
//!
//! The objective is `alpha * compute + beta * (communication + redistribution) + gamma *
//! gradient sync` (`costmodel_alpha/beta/gamma`, 1.0 by default: the profile already turns
//! everything into seconds).

use std::collections::{BTreeMap, HashMap};

use autopar_graph::{CostCx, Graph, NodeId, OpKind, OpLayouts, OpSpec, ShardingRule, TensorType, Tie};
use autopar_layout::{plan_with, TensorLayout};

use super::profile::DeviceProfile;
use super::solve::{CostProblem, EdgeCost};
use crate::context::{ParallelContext, SearchOptions};
use crate::error::{ParallelError, Result};
use crate::plan::StrategySource;
use crate::planner::reshape_layout;

/// A cost split into the model's parts (seconds, memory in bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostSplit {
    pub compute: f64,
    pub communication: f64,
    pub redistribution: f64,
    pub gradient_sync: f64,
    pub memory: u64,
}

impl CostSplit {
    /// The objective's value of this cost.
    pub fn weighted(&self, o: &SearchOptions) -> f64 {
        if self.redistribution >= FORBIDDEN {
            return FORBIDDEN;
        }
        o.costmodel_alpha.get() * self.compute
            + o.costmodel_beta.get() * (self.communication + self.redistribution)
            + o.costmodel_gamma.get() * self.gradient_sync
    }
}

/// One strategy an op may take.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub splits: Vec<usize>,
    pub layouts: OpLayouts,
    /// Its own cost (edges to other ops excluded).
    pub cost: CostSplit,
}

/// An op of the cost graph.
#[derive(Clone, Debug)]
pub struct SearchOp {
    pub node: NodeId,
    pub name: String,
    pub kind: &'static str,
    pub spec: OpSpec,
    /// Set by the user or a strategy file: its one candidate is that strategy.
    pub configured: Option<StrategySource>,
    pub candidates: Vec<Candidate>,
}

/// An edge of the cost graph with its raw redistribution seconds (before weighting).
#[derive(Clone, Debug)]
pub struct RawEdge {
    pub from: usize,
    pub to: usize,
    pub seconds: Vec<f64>,
}

/// The cost graph of a network.
#[derive(Clone, Debug)]
pub struct CostGraph {
    pub ops: Vec<SearchOp>,
    /// Graph node -> op index.
    pub of_node: Vec<Option<usize>>,
    pub edges: Vec<RawEdge>,
    pub options: SearchOptions,
}

impl CostGraph {
    /// The weighted problem the searches solve.
    pub fn problem(&self) -> CostProblem {
        let o = &self.options;
        CostProblem {
            unary: self.ops.iter().map(|op| op.candidates.iter().map(|c| c.cost.weighted(o)).collect()).collect(),
            edges: self
                .edges
                .iter()
                .map(|e| EdgeCost {
                    from: e.from,
                    to: e.to,
                    cost: e.seconds.iter().map(|&s| if s >= FORBIDDEN { FORBIDDEN } else { o.costmodel_beta.get() * s }).collect(),
                })
                .collect(),
        }
    }

    /// Each op's cost under `choice`, edge redistributions charged to the consumer.
    pub fn split_of(&self, choice: &[usize]) -> Vec<CostSplit> {
        let mut out: Vec<CostSplit> = self.ops.iter().zip(choice).map(|(op, &c)| op.candidates[c].cost).collect();
        for e in &self.edges {
            let d = self.ops[e.to].candidates.len();
            let s = e.seconds[choice[e.from] * d + choice[e.to]];
            if s < FORBIDDEN {
                out[e.to].redistribution += s;
            }
        }
        out
    }
}

/// How the planner treats each node.
enum Role {
    Op(usize),
    Follow,
    Whole,
    Input,
    Parameter,
}

/// Where a consumer's input comes from.
enum Source {
    Op(usize),
    Fixed(TensorLayout),
    /// A parameter whose layout is that of its first consumer's input `slot` (op `op`).
    ParamOf {
        op: usize,
        slot: usize,
    },
}

/// What the builder needs.
pub(crate) struct Build<'a> {
    pub graph: &'a Graph,
    pub rules: &'a [ShardingRule],
    pub context: &'a ParallelContext,
    pub profile: &'a DeviceProfile,
    pub training: bool,
    /// Per node: its configured splits and where they came from.
    pub fixed: &'a [Option<(Vec<usize>, StrategySource)>],
    /// Per node: an input's layout (the dataset strategy).
    pub input_layouts: &'a [Option<TensorLayout>],
    /// Keep candidates that leave devices idle (sharding propagation follows layouts that may).
    pub partial_use: bool,
}

struct Builder<'a> {
    b: &'a Build<'a>,
    n: usize,
    cache: HashMap<(TensorLayout, TensorLayout, usize), f64>,
}

/// Build the cost graph.
pub(crate) fn build(b: &Build<'_>) -> Result<CostGraph> {
    let g = b.graph;
    let n = b.context.devices();
    let mut bl = Builder { b, n, cache: HashMap::new() };
    let nodes = g.nodes();

    // Roles and candidates.
    let on_data = crate::planner::depends_on_inputs(g);
    let mut roles = Vec::with_capacity(nodes.len());
    let mut ops: Vec<SearchOp> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let role = match (&node.op, &b.rules[i]) {
            (OpKind::Input(_), _) => Role::Input,
            (OpKind::Parameter(_), _) => Role::Parameter,
            (_, ShardingRule::Spec(spec)) => {
                let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &g.node(*x).ty).collect();
                let (all, configured) = match &b.fixed[i] {
                    Some((s, src)) => (vec![s.clone()], Some(*src)),
                    None => {
                        // The batch: the first dimension of the first input computed from the data.
                        let batch = node.inputs.iter().position(|x| on_data[x.0]).and_then(|i| spec.inputs[i].first().copied().flatten());
                        (bl.candidate_splits(spec, node.op.kind(), &ins, batch), None)
                    }
                };
                let mut candidates = Vec::with_capacity(all.len());
                for splits in all {
                    let layouts = spec.layouts(node.op.kind(), &node.name, &ins, &node.ty, &splits, n)?;
                    candidates.push(Candidate { splits, layouts, cost: CostSplit::default() });
                }
                ops.push(SearchOp {
                    node: NodeId(i),
                    name: node.name.clone(),
                    kind: node.op.kind(),
                    spec: spec.clone(),
                    configured,
                    candidates,
                });
                Role::Op(ops.len() - 1)
            }
            (_, ShardingRule::FollowInput) => Role::Follow,
            (_, ShardingRule::Replicated) | (_, ShardingRule::Unsupported(_)) => Role::Whole,
        };
        roles.push(role);
    }
    let of_node: Vec<Option<usize>> = roles.iter().map(|r| if let Role::Op(k) = r { Some(*k) } else { None }).collect();

    // Own costs: compute, in-op communication, memory of the output.
    for op in &mut ops {
        let node = g.node(op.node);
        for c in &mut op.candidates {
            c.cost = bl.own_cost(node.op.def(), &op.spec, &c.layouts, node.ty.dtype);
        }
    }

    // Parameters: the first consumer decides the layout and pays the gradient sync.
    let mut param_home: BTreeMap<NodeId, (usize, usize)> = BTreeMap::new(); // param -> (consumer node, slot)
    for (i, node) in nodes.iter().enumerate() {
        for (slot, x) in node.inputs.iter().enumerate() {
            if matches!(roles[x.0], Role::Parameter) {
                param_home.entry(*x).or_insert((i, slot));
            }
        }
    }
    for (&param, &(consumer, slot)) in &param_home {
        let Some(k) = of_node[consumer] else { continue };
        let OpKind::Parameter(p) = &g.node(param).op else { continue };
        let elem = p.dtype.size();
        for c in &mut ops[k].candidates {
            let l = &c.layouts.inputs[slot];
            let bytes = l.slice_len() * elem;
            c.cost.memory += 3 * bytes as u64;
            let replicas = n / l.num_slices().max(1);
            if b.training && p.trainable && replicas > 1 {
                let sent = (2 * bytes * (replicas - 1)).div_ceil(replicas);
                c.cost.gradient_sync += b.profile.bandwidth_time(replicas, sent);
            }
        }
    }

    // Consumers: edges between ops, fixed layouts as own costs.
    let mut edges: Vec<RawEdge> = Vec::new();
    let gathered = if b.training { 1.min(g.outputs.len()) } else { g.outputs.len() };
    // (consumer op and slot, or None for a value needed whole; the value)
    let mut uses: Vec<(Option<(usize, usize)>, NodeId)> = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        match roles[i] {
            Role::Op(k) => uses.extend(node.inputs.iter().enumerate().map(|(slot, x)| (Some((k, slot)), *x))),
            Role::Whole => uses.extend(node.inputs.iter().map(|x| (None, *x))),
            Role::Follow | Role::Input | Role::Parameter => {}
        }
    }
    uses.extend(g.outputs.iter().take(gathered).map(|&o| (None, o)));
    for (consumer, x) in uses {
        let (source, chain) = bl.source_of(x, &roles, &param_home, &of_node);
        let elem = g.node(x).ty.dtype.size();
        let producer = match &source {
            Source::Op(u) | Source::ParamOf { op: u, .. } => Some(*u),
            Source::Fixed(_) => None,
        };
        match (producer, consumer) {
            (None, None) => {}
            (None, Some((k, slot))) => {
                let Source::Fixed(l) = source else { unreachable!("a source without an op is fixed") };
                let (pre, l) = bl.through(l, &chain, elem);
                for ci in 0..ops[k].candidates.len() {
                    let dst = ops[k].candidates[ci].layouts.inputs[slot].clone();
                    ops[k].candidates[ci].cost.redistribution += pre + bl.redist(&l, &dst, elem);
                }
            }
            (Some(u), None) => {
                let whole = bl.whole(&g.node(x).ty.shape);
                for cu in 0..ops[u].candidates.len() {
                    let (pre, l) = bl.through(bl.source_layout(&ops[u], cu, &source), &chain, elem);
                    ops[u].candidates[cu].cost.redistribution += pre + bl.redist(&l, &whole, elem);
                }
            }
            (Some(u), Some((k, slot))) => {
                if let Source::ParamOf { slot: home, .. } = source {
                    if u == k && home == slot && chain.is_empty() {
                        continue; // the parameter's own layout: nothing moves
                    }
                }
                let (du, dv) = (ops[u].candidates.len(), ops[k].candidates.len());
                if u == k {
                    // The same op reads a value twice: its own cost.
                    for c in 0..du {
                        let (pre, l) = bl.through(bl.source_layout(&ops[u], c, &source), &chain, elem);
                        let dst = ops[k].candidates[c].layouts.inputs[slot].clone();
                        ops[k].candidates[c].cost.redistribution += pre + bl.redist(&l, &dst, elem);
                    }
                    continue;
                }
                let follow = b.context.search.elementwise_op_strategy_follow && slot == 0 && is_elementwise(&ops[k].spec);
                let mut seconds = vec![0.0; du * dv];
                for cu in 0..du {
                    let (pre, l) = bl.through(bl.source_layout(&ops[u], cu, &source), &chain, elem);
                    for cv in 0..dv {
                        let dst = &ops[k].candidates[cv].layouts.inputs[slot];
                        let forbidden = if follow && l != *dst { FORBIDDEN } else { 0.0 };
                        seconds[cu * dv + cv] = pre + bl.redist(&l, dst, elem) + forbidden;
                    }
                }
                edges.push(RawEdge { from: u, to: k, seconds });
            }
        }
    }

    // Memory capacity.
    let cap = b.context.search.device_memory_capacity;
    for op in &mut ops {
        if op.candidates.iter().all(|c| c.cost.memory > cap) {
            let need = op.candidates.iter().map(|c| c.cost.memory).min().unwrap_or(0);
            let node = g.node(op.node);
            let mut tensors: Vec<(String, usize)> = node
                .inputs
                .iter()
                .map(|x| g.node(*x))
                .chain(std::iter::once(node))
                .map(|t| (t.name.clone(), t.ty.numel() * t.ty.dtype.size()))
                .collect();
            tensors.sort_by_key(|t| std::cmp::Reverse(t.1));
            let largest = tensors.iter().take(3).map(|(n, b)| format!("{n} ({b} bytes)")).collect::<Vec<_>>().join(", ");
            return Err(ParallelError::OutOfMemory { kind: op.kind, name: op.name.clone(), capacity: cap, need, largest });
        }
    }
    let keep: Vec<Vec<bool>> = ops.iter().map(|op| op.candidates.iter().map(|c| c.cost.memory <= cap).collect()).collect();
    if keep.iter().any(|k| k.iter().any(|x| !x)) {
        let remap: Vec<Vec<Option<usize>>> = keep
            .iter()
            .map(|k| {
                let mut next = 0;
                k.iter()
                    .map(|&x| {
                        x.then(|| {
                            next += 1;
                            next - 1
                        })
                    })
                    .collect()
            })
            .collect();
        for e in &mut edges {
            let (du, dv) = (keep[e.from].len(), keep[e.to].len());
            let mut s = Vec::new();
            for a in 0..du {
                for b2 in 0..dv {
                    if remap[e.from][a].is_some() && remap[e.to][b2].is_some() {
                        s.push(e.seconds[a * dv + b2]);
                    }
                }
            }
            e.seconds = s;
        }
        for (op, k) in ops.iter_mut().zip(&keep) {
            let mut i = 0;
            op.candidates.retain(|_| {
                i += 1;
                k[i - 1]
            });
        }
    }
    Ok(CostGraph { ops, of_node, edges, options: b.context.search.clone() })
}

/// An edge cost that rules a pair out (`elementwise_op_strategy_follow`).
pub const FORBIDDEN: f64 = 1e30;

/// Element-wise: every input and the output run along the logical dimensions one to one.
fn is_elementwise(spec: &OpSpec) -> bool {
    spec.tie == Tie::None && spec.dims.iter().all(|d| !d.reduced) && spec.output.iter().enumerate().all(|(d, l)| *l == Some(d))
}

impl Builder<'_> {
    fn candidate_splits(&self, spec: &OpSpec, kind: &'static str, ins: &[&TensorType], batch: Option<usize>) -> Vec<Vec<usize>> {
        let o = &self.b.context.search;
        let mut all = spec.valid_splits(self.n);
        if o.tensor_slice_align_enable && matches!(kind, "MatMul" | "BatchMatMul") {
            let a = o.tensor_slice_align_size;
            let aligned: Vec<Vec<usize>> = all
                .iter()
                .filter(|s| {
                    let st = spec.strategy_of(s);
                    ins.iter().zip(&st.0).all(|(t, sp)| {
                        let r = t.shape.len();
                        (r.saturating_sub(2)..r).all(|d| (t.shape[d] / sp[d]).is_multiple_of(a))
                    })
                })
                .cloned()
                .collect();
            if !aligned.is_empty() {
                all = aligned;
            }
        }
        if o.fully_use_devices && !self.b.partial_use {
            let most = all.iter().map(|s| s.iter().product::<usize>()).max().unwrap_or(1);
            all.retain(|s| s.iter().product::<usize>() == most);
        }
        // Ties go to the lower index in every search: candidates using more devices come
        // first, then those splitting the batch more (MindSpore's preference for data
        // parallelism).
        all.sort_by_key(|s| (std::cmp::Reverse(s.iter().product::<usize>()), std::cmp::Reverse(batch.map_or(1, |b| s[b]))));
        all
    }

    fn own_cost(&self, def: &dyn autopar_graph::OpDef, spec: &OpSpec, l: &OpLayouts, dtype: autopar_graph::DType) -> CostSplit {
        let p = self.b.profile;
        let ins: Vec<TensorType> = l.inputs.iter().map(|x| TensorType { shape: x.slice_shape(), dtype }).collect();
        // Input dtypes: the layouts carry shapes only; the cost rules read sizes.
        let out = TensorType { shape: l.output.slice_shape(), dtype };
        let c = def.cost(&CostCx { inputs: &ins, output: &out, rank: 0 });
        let passes = if self.b.training { 3.0 } else { 1.0 };
        let compute = passes * p.compute_time(c.flops, c.bytes);
        let mut communication = 0.0;
        let out_bytes = out.numel() * dtype.size();
        let partial: usize = l.output.partial_axes().iter().map(|&a| l.mesh.dims()[a]).product();
        if partial > 1 {
            // The all-reduce completing the partial sums, and in training its adjoint (an
            // all-reduce of the gradient).
            let passes = if self.b.training { 2.0 } else { 1.0 };
            communication += passes * p.comm_time(partial, (2 * out_bytes * (partial - 1)).div_ceil(partial));
        }
        if let Tie::Stats(dims) = &spec.tie {
            let group: usize = dims.iter().map(|&d| l.splits[d]).product();
            if group > 1 {
                // One (sum, sum of squares) pair of f64 per statistic: per local position
                // along the op's other logical dimensions.
                let count: usize = (0..spec.dims.len()).filter(|d| !dims.contains(d)).map(|d| spec.dims[d].size / l.splits[d]).product();
                communication += if self.b.training { 2.0 } else { 1.0 } * p.comm_time(group, 16 * count);
            }
        }
        CostSplit { compute, communication, redistribution: 0.0, gradient_sync: 0.0, memory: out_bytes as u64 }
    }

    /// Where value `x` comes from, and the reshapes it passes on the way (in order).
    fn source_of(
        &self,
        mut x: NodeId,
        roles: &[Role],
        homes: &BTreeMap<NodeId, (usize, usize)>,
        of_node: &[Option<usize>],
    ) -> (Source, Vec<NodeId>) {
        let g = self.b.graph;
        let mut chain = Vec::new();
        loop {
            match roles[x.0] {
                Role::Follow => {
                    chain.push(x);
                    x = g.node(x).inputs[0];
                }
                Role::Op(k) => {
                    chain.reverse();
                    return (Source::Op(k), chain);
                }
                Role::Input => {
                    chain.reverse();
                    let l = self.b.input_layouts[x.0].clone().unwrap_or_else(|| self.whole(&g.node(x).ty.shape));
                    return (Source::Fixed(l), chain);
                }
                Role::Whole => {
                    chain.reverse();
                    return (Source::Fixed(self.whole(&g.node(x).ty.shape)), chain);
                }
                Role::Parameter => {
                    chain.reverse();
                    let home = homes.get(&x).and_then(|&(c, slot)| of_node[c].map(|op| (op, slot)));
                    return match home {
                        Some((op, slot)) => (Source::ParamOf { op, slot }, chain),
                        None => (Source::Fixed(self.whole(&g.node(x).ty.shape)), chain),
                    };
                }
            }
        }
    }

    fn whole(&self, shape: &[usize]) -> TensorLayout {
        TensorLayout::replicated(autopar_layout::DeviceMatrix::flat(self.n).expect("n >= 1"), shape.to_vec())
    }

    /// The layout a source gives under candidate `c` of its op: the op's output with its
    /// partial sums completed (the op pays for that), or the parameter's home layout.
    fn source_layout(&self, op: &SearchOp, c: usize, src: &Source) -> TensorLayout {
        let l = &op.candidates[c].layouts;
        match src {
            Source::ParamOf { slot, .. } => l.inputs[*slot].clone(),
            _ => whole_values(&l.output),
        }
    }

    /// A layout passed through reshapes: the redistribution seconds on the way and the layout
    /// at the end.
    fn through(&mut self, mut l: TensorLayout, chain: &[NodeId], elem: usize) -> (f64, TensorLayout) {
        let mut t = 0.0;
        for &f in chain {
            let np = whole_values(&l);
            t += self.redist(&l, &np, elem);
            let shape = &self.b.graph.node(f).ty.shape;
            l = match reshape_layout(&np, shape) {
                Some(o) => o,
                None => {
                    let w = self.whole(np.shape());
                    t += self.redist(&np, &w, elem);
                    self.whole(shape)
                }
            };
        }
        (t, l)
    }

    /// Seconds of the redistribution from `src` to `dst` (forward and, in training, backward).
    fn redist(&mut self, src: &TensorLayout, dst: &TensorLayout, elem: usize) -> f64 {
        if src == dst {
            return 0.0;
        }
        let key = (src.clone(), dst.clone(), elem);
        if let Some(&t) = self.cache.get(&key) {
            return t;
        }
        let t = match plan_with(src, dst, false) {
            Ok(p) => {
                let p = if self.b.context.enable_alltoall { Ok(p) } else { p.without_all_to_all() };
                match p {
                    Ok(p) => {
                        let mut t = 0.0;
                        for s in &p.steps {
                            if s.step.is_communication() {
                                let ranks = s.step.group(0).len();
                                let one = self.b.profile.comm_time(ranks, s.step.bytes_sent(s.input_len, elem));
                                // In training each collective's adjoint runs too (all-gather <->
                                // reduce-scatter, all-reduce -> all-reduce, all-to-all back).
                                t += if self.b.training { 2.0 * one } else { one };
                            } else {
                                t += self.b.profile.compute_time(0.0, s.input_len * elem);
                            }
                        }
                        t
                    }
                    Err(_) => FORBIDDEN,
                }
            }
            Err(_) => FORBIDDEN,
        };
        self.cache.insert(key, t);
        t
    }
}

/// `l` without pending partial sums (the values once they are completed).
fn whole_values(l: &TensorLayout) -> TensorLayout {
    TensorLayout::new(l.mesh().clone(), l.dim_axes().to_vec(), l.shape().to_vec()).expect("dropping partial sums keeps a layout valid")
}
