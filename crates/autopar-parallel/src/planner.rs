//! From a forward graph and a parallel context to a [`ParallelPlan`] (every node's strategy and
//! layouts) and from the plan to each rank's [`RankProgram`] (its local forward graph with the
//! communication inserted). Both are pure functions of their inputs and plain data.
//!
//! Semantics (what makes parallel equal stand-alone): every local op computes exactly its slice
//! of the global op (or, for a split reduced dimension, a partial sum of it); redistributions
//! between a producer's layout and the layout its consumer needs are exact; the graph's outputs
//! end replicated on every rank. Autodiff of the local graph then uses the exact adjoints of
//! the collectives (all-gather <-> reduce-scatter, all-reduce <-> all-reduce), so with the loss
//! scaled by 1/N on each of the N ranks (the N replicas of the loss sum to the loss) every
//! rank's gradient of a parameter slice is its share, and the sum over the ranks holding that
//! slice (the mirror group) is the exact gradient.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;

use autopar_graph::ops::{DropoutBlock, Input, Parameter, Reshape, Scale, Slice, TableShard};
use autopar_graph::{normalize_axis, Graph, Node, NodeId, OpKind, ReduceOp, TensorType};
use autopar_layout::{group_of, plan_with, DeviceAxis, DeviceMatrix, Step, Strategy, TensorLayout};

use crate::context::{DatasetStrategy, ParallelContext, ParallelMode};
use crate::error::{ParallelError, Result};
use crate::rules::{op_rule, OpRule};

/// The plan of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    pub id: NodeId,
    pub name: String,
    pub kind: &'static str,
    /// The strategy the op runs with (the user's or the default); None for leaves and ops whose
    /// layout follows their input.
    pub strategy: Option<Strategy>,
    /// Whether `strategy` was given by the user.
    pub user_strategy: bool,
    /// Layouts the inputs must have when the op runs.
    pub inputs: Vec<TensorLayout>,
    /// Layout of the op's result (may be a pending partial sum).
    pub output: TensorLayout,
    /// Factor each rank applies to its local result (means over split reduced dimensions).
    pub output_scale: Option<f64>,
}

/// Every node's strategy and layouts for one parallel context.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelPlan {
    pub device_num: usize,
    pub mode: ParallelMode,
    pub nodes: Vec<NodePlan>,
    pub outputs: Vec<NodeId>,
}

impl ParallelPlan {
    /// Layout of every parameter, by name, in graph order.
    pub fn parameter_layouts(&self, graph: &Graph) -> Vec<(String, TensorLayout)> {
        self.nodes
            .iter()
            .filter(|p| matches!(graph.node(p.id).op, OpKind::Parameter(_)))
            .map(|p| (p.name.clone(), p.output.clone()))
            .collect()
    }

    /// One line per node: name, op, strategy, output layout.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for p in &self.nodes {
            let strategy = p.strategy.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "{:<28} {:<20} {:<24} dev_matrix {:?} tensor_map {} {}",
                p.name,
                p.kind,
                strategy,
                p.output.mesh().dims(),
                p.output.tensor_map(),
                if p.output.is_partial() { "(partial)" } else { "" }
            );
        }
        s
    }
}

/// Plan `graph` (a forward graph) under `ctx`. `stand_alone` plans for one device; the sharding
/// modes use the ops' strategies (semi_auto_parallel) or data parallel everywhere
/// (data_parallel, as the batch split of semi_auto_parallel with default strategies).
pub fn plan(graph: &Graph, ctx: &ParallelContext) -> Result<ParallelPlan> {
    ctx.validate()?;
    ctx.check_supported()?;
    let n = match ctx.parallel_mode {
        ParallelMode::StandAlone => 1,
        _ => ctx.device_num,
    };
    let use_strategies = ctx.parallel_mode == ParallelMode::SemiAutoParallel;
    let nodes = graph.nodes();
    let flat = DeviceMatrix::flat(n).map_err(|e| ParallelError::Layout { context: "device matrix".into(), source: e })?;
    let types = |node: &Node| -> Vec<&TensorType> { node.inputs.iter().map(|x| &graph.node(*x).ty).collect() };

    // Pass 1: every op with a rule gets its strategy and layouts.
    let mut plans: Vec<Option<NodePlan>> = vec![None; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let ins = types(node);
        let rule = op_rule(node, &ins);
        let plan = match rule {
            OpRule::Spec(spec) => {
                let (splits, user) = match (&node.strategy, use_strategies) {
                    (Some(s), true) => (spec.splits_from_strategy(node, s)?, true),
                    _ => (spec.default_splits(n), false),
                };
                let sh = spec.sharding(node, &ins, &splits, n)?;
                NodePlan {
                    id: NodeId(i),
                    name: node.name.clone(),
                    kind: node.op.kind(),
                    strategy: Some(sh.strategy),
                    user_strategy: user,
                    inputs: sh.inputs,
                    output: sh.output,
                    output_scale: sh.output_scale,
                }
            }
            OpRule::Replicated if node.op.is_leaf() => continue,
            OpRule::Replicated => {
                if use_strategies && node.strategy.as_ref().is_some_and(|s| s.0.iter().flatten().any(|&x| x > 1)) {
                    return Err(ParallelError::InvalidStrategy {
                        kind: node.op.kind(),
                        name: node.name.clone(),
                        strategy: node.strategy.as_ref().map(|s| s.to_string()).unwrap_or_default(),
                        why: "this op has no sharded form yet; it runs replicated".into(),
                    });
                }
                NodePlan {
                    id: NodeId(i),
                    name: node.name.clone(),
                    kind: node.op.kind(),
                    strategy: None,
                    user_strategy: false,
                    inputs: ins.iter().map(|t| TensorLayout::replicated(flat.clone(), t.shape.clone())).collect(),
                    output: TensorLayout::replicated(flat.clone(), node.ty.shape.clone()),
                    output_scale: None,
                }
            }
            OpRule::FollowInput => continue,
            OpRule::Unsupported(why) => {
                return Err(ParallelError::UnsupportedOp { kind: node.op.kind(), name: node.name.clone(), why: why.to_string() });
            }
        };
        plans[i] = Some(plan);
    }

    // Pass 2: leaves. Parameters take the layout their first consumer needs; inputs the
    // dataset strategy's.
    let mut input_index = 0usize;
    for (i, node) in nodes.iter().enumerate() {
        let layout = match &node.op {
            OpKind::Parameter(_) => {
                first_use_layout(graph, &plans, NodeId(i)).unwrap_or_else(|| TensorLayout::replicated(flat.clone(), node.ty.shape.clone()))
            }
            OpKind::Input(_) => {
                let l = input_layout(node, &ctx.dataset_strategy, input_index, n, &flat, ctx.parallel_mode)?;
                input_index += 1;
                l
            }
            _ => continue,
        };
        plans[i] = Some(NodePlan {
            id: NodeId(i),
            name: node.name.clone(),
            kind: node.op.kind(),
            strategy: None,
            user_strategy: false,
            inputs: Vec::new(),
            output: layout,
            output_scale: None,
        });
    }

    // Pass 3: ops whose layout follows their input, in order.
    for (i, node) in nodes.iter().enumerate() {
        if plans[i].is_some() {
            continue;
        }
        let src = plans[node.inputs[0].0].as_ref().expect("inputs are planned before their users").output.clone();
        let src = TensorLayout::new(src.mesh().clone(), src.dim_axes().to_vec(), src.shape().to_vec())
            .expect("dropping partial sums keeps a layout valid");
        let (input, output) = match reshape_layout(&src, &node.ty.shape) {
            Some(out) => (src, out),
            None => (
                TensorLayout::replicated(flat.clone(), src.shape().to_vec()),
                TensorLayout::replicated(flat.clone(), node.ty.shape.clone()),
            ),
        };
        plans[i] = Some(NodePlan {
            id: NodeId(i),
            name: node.name.clone(),
            kind: node.op.kind(),
            strategy: None,
            user_strategy: false,
            inputs: vec![input],
            output,
            output_scale: None,
        });
    }
    Ok(ParallelPlan {
        device_num: n,
        mode: ctx.parallel_mode,
        nodes: plans.into_iter().map(|p| p.expect("every node is planned")).collect(),
        outputs: graph.outputs.clone(),
    })
}

fn first_use_layout(graph: &Graph, plans: &[Option<NodePlan>], id: NodeId) -> Option<TensorLayout> {
    for (j, node) in graph.nodes().iter().enumerate().skip(id.0 + 1) {
        if let Some(slot) = node.inputs.iter().position(|x| *x == id) {
            return plans[j].as_ref().map(|p| p.inputs[slot].clone());
        }
    }
    None
}

fn input_layout(
    node: &Node,
    ds: &DatasetStrategy,
    index: usize,
    n: usize,
    flat: &DeviceMatrix,
    mode: ParallelMode,
) -> Result<TensorLayout> {
    let shape = node.ty.shape.clone();
    let layout_err = |e| ParallelError::Layout { context: format!("input {:?}", node.name), source: e };
    match ds {
        _ if n == 1 => Ok(TensorLayout::replicated(flat.clone(), shape)),
        DatasetStrategy::FullBatch => Ok(TensorLayout::replicated(flat.clone(), shape)),
        DatasetStrategy::DataParallel => {
            if shape.is_empty() || !shape[0].is_multiple_of(n) {
                return Err(ParallelError::BatchNotDivisible { input: node.name.clone(), shape, devices: n, mode: mode.name() });
            }
            let mut map = vec![Vec::new(); shape.len()];
            map[0].push(0);
            TensorLayout::new(flat.clone(), map, shape).map_err(layout_err)
        }
        DatasetStrategy::Explicit(all) => {
            let splits = all.get(index).ok_or_else(|| ParallelError::DatasetStrategy {
                why: format!("network input {:?} is input {index}, but dataset_strategy lists {} inputs", node.name, all.len()),
            })?;
            if splits.len() != shape.len() {
                return Err(ParallelError::DatasetStrategy {
                    why: format!("input {:?} has shape {shape:?}, its dataset strategy {splits:?} has {} entries", node.name, splits.len()),
                });
            }
            let product: usize = splits.iter().product();
            if product == 0 || !n.is_multiple_of(product) {
                return Err(ParallelError::DatasetStrategy {
                    why: format!("strategy {splits:?} of input {:?} uses {product} devices, which does not divide {n}", node.name),
                });
            }
            let mut dims = Vec::new();
            let mut map = Vec::new();
            for &s in splits {
                if s > 1 {
                    map.push(vec![dims.len()]);
                    dims.push(s);
                } else {
                    map.push(Vec::new());
                }
            }
            if n / product > 1 {
                dims.push(n / product);
            }
            if dims.is_empty() {
                dims.push(1);
            }
            let mesh = DeviceMatrix::new(dims).map_err(layout_err)?;
            TensorLayout::new(mesh, map, shape).map_err(layout_err)
        }
    }
}

/// The layout of a reshape's output when its input has layout `src`: each group of input
/// dimensions whose product equals a group of output dimensions may be split only on its first
/// (most significant) dimension, which then splits the group's first output dimension. `None`
/// when the split cannot follow the reshape (the planner then replicates around it).
pub fn reshape_layout(src: &TensorLayout, out: &[usize]) -> Option<TensorLayout> {
    let inp = src.shape();
    let axes = src.dim_axes();
    let mut map = vec![Vec::new(); out.len()];
    let (mut i, mut o) = (0usize, 0usize);
    while i < inp.len() || o < out.len() {
        // Skip size-1 dims (they are never split).
        if i < inp.len() && inp[i] == 1 && axes[i].is_empty() {
            i += 1;
            continue;
        }
        if o < out.len() && out[o] == 1 {
            o += 1;
            continue;
        }
        if i >= inp.len() || o >= out.len() {
            return None;
        }
        let (gi, go) = (i, o);
        let (mut pi, mut po) = (inp[i], out[o]);
        i += 1;
        o += 1;
        while pi != po {
            if pi < po {
                if i >= inp.len() {
                    return None;
                }
                pi *= inp[i];
                i += 1;
            } else {
                if o >= out.len() {
                    return None;
                }
                po *= out[o];
                o += 1;
            }
        }
        if (gi + 1..i).any(|d| !axes[d].is_empty()) {
            return None;
        }
        let split = src.split(gi);
        if !out[go].is_multiple_of(split) {
            return None;
        }
        map[go] = axes[gi].clone();
    }
    TensorLayout::new(src.mesh().clone(), map, out.to_vec()).ok()
}

/// A parameter of a rank's program.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSlot {
    pub name: String,
    /// The parameter's node in the global graph and in the local program.
    pub global: NodeId,
    pub local: NodeId,
    pub layout: TensorLayout,
    /// This rank's slice of the full parameter.
    pub slice: Vec<Range<usize>>,
    /// Ranks holding the same slice: the gradient is summed over them.
    pub mirror: Vec<usize>,
    pub trainable: bool,
}

/// A network input of a rank's program.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSlot {
    pub name: String,
    pub global: NodeId,
    pub local: NodeId,
    pub layout: TensorLayout,
    pub slice: Vec<Range<usize>>,
}

/// What one rank runs: its local forward graph with communication ops, and how its parameters
/// and inputs relate to the global ones.
#[derive(Clone, Debug)]
pub struct RankProgram {
    pub rank: usize,
    pub device_num: usize,
    pub graph: Graph,
    /// Local nodes of the global graph's outputs (replicated values).
    pub outputs: Vec<NodeId>,
    pub params: Vec<ParamSlot>,
    pub inputs: Vec<InputSlot>,
    /// Every group partition the program's collectives use, in first-use order. Every rank
    /// creates the same sub-communicators in this order.
    pub partitions: Vec<Vec<Vec<usize>>>,
}

impl RankProgram {
    /// The local node of global node `id`, if it exists in this program.
    pub fn param(&self, name: &str) -> Option<&ParamSlot> {
        self.params.iter().find(|p| p.name == name)
    }
}

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

struct Emitter<'a> {
    graph: Graph,
    rank: usize,
    n: usize,
    partitions: &'a mut Vec<Vec<Vec<usize>>>,
}

impl Emitter<'_> {
    fn note_partition(&mut self, axes: &[DeviceAxis]) -> Vec<usize> {
        let p = partition(axes, self.n);
        let mine = p.iter().find(|g| g.contains(&self.rank)).cloned().expect("every rank is in one group");
        if !self.partitions.contains(&p) {
            self.partitions.push(p);
        }
        mine
    }

    fn add(&mut self, name: &str, op: impl Into<OpKind>, inputs: &[NodeId]) -> Result<NodeId> {
        let name = self.graph.unique_name(name);
        self.graph
            .add(&name, op, inputs)
            .map_err(|e| ParallelError::Graph { context: format!("rank {} program", self.rank), source: Box::new(e) })
    }

    /// Emit the steps turning `x` (layout `src`) into layout `dst`.
    fn redistribute(&mut self, base: &str, x: NodeId, src: &TensorLayout, dst: &TensorLayout) -> Result<NodeId> {
        if src == dst {
            return Ok(x);
        }
        let p =
            plan_with(src, dst, false).map_err(|e| ParallelError::Layout { context: format!("redistribution for {base}"), source: e })?;
        let mut cur = x;
        for (k, ps) in p.steps.iter().enumerate() {
            let name = format!("{base}.redist{k}");
            let r = self.rank;
            cur = match &ps.step {
                Step::Slice { dim, axis } => {
                    let shape = self.graph.node(cur).ty.shape.clone();
                    let size = shape[*dim] / axis.size;
                    let mut begin = vec![0; shape.len()];
                    begin[*dim] = axis.coord(r) * size;
                    let mut sizes = shape.clone();
                    sizes[*dim] = size;
                    self.add(&name, Slice { begin, size: sizes }, &[cur])?
                }
                Step::AllGather { dim, axis } => {
                    let group = self.note_partition(&[*axis]);
                    self.add(&name, autopar_graph::ops::AllGather { dim: *dim, group }, &[cur])?
                }
                Step::AllToAll { split_dim, concat_dim, axis } => {
                    let group = self.note_partition(&[*axis]);
                    self.add(&name, autopar_graph::ops::AllToAll { split_dim: *split_dim, concat_dim: *concat_dim, group }, &[cur])?
                }
                Step::AllReduce { axes } => {
                    let group = self.note_partition(axes);
                    self.add(&name, autopar_graph::ops::AllReduce { op: ReduceOp::Sum, group }, &[cur])?
                }
                Step::ReduceScatter { dim, axis } => {
                    let group = self.note_partition(&[*axis]);
                    self.add(&name, autopar_graph::ops::ReduceScatter { op: ReduceOp::Sum, dim: *dim, group }, &[cur])?
                }
                Step::MakePartial { axis } => {
                    let factor = if axis.coord(r) == 0 { 1.0 } else { 0.0 };
                    self.add(&name, Scale { factor }, &[cur])?
                }
                Step::Permute { .. } => {
                    return Err(ParallelError::Internal { what: format!("a graph redistribution for {base} planned a permutation") });
                }
            };
        }
        Ok(cur)
    }
}

/// The local op of `node` with its attributes rewritten for local shapes.
fn localize(node: &Node, local_out: &[usize]) -> OpKind {
    match &node.op {
        OpKind::Input(i) => OpKind::Input(Input { shape: local_out.to_vec(), dtype: i.dtype }),
        OpKind::Parameter(p) => {
            let mut p: Parameter = p.clone();
            p.shape = local_out.to_vec();
            OpKind::Parameter(p)
        }
        OpKind::Reshape(_) => OpKind::Reshape(Reshape { shape: local_out.iter().map(|&d| d as i64).collect() }),
        OpKind::Slice(s) => {
            let begin = s.begin.iter().zip(&s.size).zip(local_out).map(|((&b, &sz), &l)| if sz == l { b } else { 0 }).collect();
            OpKind::Slice(Slice { begin, size: local_out.to_vec() })
        }
        other => other.clone(),
    }
}

impl Emitter<'_> {
    /// The ranks (ascending) whose slices of `x` together hold the whole of dimensions `dims`
    /// (the group an op's statistics over them are reduced in); empty when they are not split.
    fn stats_group(&mut self, x: &TensorLayout, dims: &[usize]) -> Vec<usize> {
        let axes: Vec<DeviceAxis> = dims.iter().flat_map(|&d| x.dim_axes()[d].iter().map(|&a| x.mesh().axis(a))).collect();
        if axes.is_empty() {
            Vec::new()
        } else {
            self.note_partition(&axes)
        }
    }

    /// The local op of `node` planned as `np` on this rank: local shapes, and the attributes
    /// that tie a slice to the whole (a BatchNorm's statistics group, a Dropout's block, a
    /// Gather's rows of a split table).
    fn local_op(&mut self, node: &Node, np: &NodePlan) -> Result<OpKind> {
        let layout_err = |e| ParallelError::Layout { context: node.name.clone(), source: e };
        let mut op = localize(node, &np.output.slice_shape());
        match &mut op {
            OpKind::BatchNorm(bn) if bn.training => bn.group = self.stats_group(&np.inputs[0], &[0]),
            OpKind::Softmax(sm) => {
                let a = normalize_axis(sm.axis, node.ty.shape.len()).expect("graph nodes hold axes within their input's rank");
                sm.group = self.stats_group(&np.inputs[0], &[a]);
            }
            OpKind::LogSoftmax(sm) => {
                let a = normalize_axis(sm.axis, node.ty.shape.len()).expect("graph nodes hold axes within their input's rank");
                sm.group = self.stats_group(&np.inputs[0], &[a]);
            }
            OpKind::LayerNorm(ln) => {
                let rank = node.ty.shape.len();
                let b = normalize_axis(ln.begin_norm_axis, rank).expect("graph nodes hold axes within their input's rank");
                ln.group = self.stats_group(&np.inputs[0], &(b..rank).collect::<Vec<_>>());
            }
            OpKind::Dropout(d) => {
                let x = &np.inputs[0];
                if x.dim_axes().iter().any(|a| !a.is_empty()) {
                    let slice = x.slice_of(self.rank).map_err(layout_err)?;
                    d.block = Some(DropoutBlock { global_shape: x.shape().to_vec(), begin: slice.iter().map(|r| r.start).collect() });
                }
            }
            OpKind::Gather(g) => {
                let table = &np.inputs[0];
                let axis = normalize_axis(g.axis, table.shape().len()).expect("graph nodes hold axes within their input's rank");
                if table.split(axis) > 1 {
                    let rows = table.slice_of(self.rank).map_err(layout_err)?[axis].start;
                    g.shard = Some(TableShard { start: rows, total: table.shape()[axis] });
                }
            }
            _ => {}
        }
        Ok(op)
    }
}

/// The program of `rank`.
pub fn rank_program(graph: &Graph, plan: &ParallelPlan, rank: usize) -> Result<RankProgram> {
    let n = plan.device_num;
    if rank >= n {
        return Err(ParallelError::RankOutOfRange { rank, devices: n });
    }
    let mut partitions = Vec::new();
    let mut em = Emitter { graph: Graph::new(), rank, n, partitions: &mut partitions };
    let mut local: Vec<Option<(NodeId, TensorLayout)>> = vec![None; graph.len()];
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        let np = &plan.nodes[i];
        let slice_shape = np.output.slice_shape();
        let id = if node.op.is_leaf() {
            let id = em.add(&node.name, localize(node, &slice_shape), &[])?;
            let slice = np.output.slice_of(rank).map_err(|e| ParallelError::Layout { context: node.name.clone(), source: e })?;
            match &node.op {
                OpKind::Parameter(p) => {
                    let mirror =
                        np.output.replica_group(rank).map_err(|e| ParallelError::Layout { context: node.name.clone(), source: e })?;
                    params.push(ParamSlot {
                        name: node.name.clone(),
                        global: NodeId(i),
                        local: id,
                        layout: np.output.clone(),
                        slice,
                        mirror,
                        trainable: p.trainable,
                    });
                }
                _ => inputs.push(InputSlot { name: node.name.clone(), global: NodeId(i), local: id, layout: np.output.clone(), slice }),
            }
            id
        } else {
            let mut args = Vec::with_capacity(node.inputs.len());
            for (slot, x) in node.inputs.iter().enumerate() {
                let (xid, xl) = local[x.0].clone().expect("inputs precede users");
                args.push(em.redistribute(&format!("{}.in{slot}", node.name), xid, &xl, &np.inputs[slot])?);
            }
            let op = em.local_op(node, np)?;
            let mut id = em.add(&node.name, op, &args)?;
            if let Some(f) = np.output_scale {
                id = em.add(&format!("{}.share", node.name), Scale { factor: f }, &[id])?;
            }
            id
        };
        let got = &em.graph.node(id).ty.shape;
        if got != &slice_shape {
            return Err(ParallelError::Internal {
                what: format!(
                    "rank {rank}: local {} {:?} has shape {got:?}, its layout {} expects {slice_shape:?}",
                    node.op.kind(),
                    node.name,
                    np.output
                ),
            });
        }
        local[i] = Some((id, np.output.clone()));
    }
    let mut outputs = Vec::new();
    for &o in &plan.outputs {
        let (id, l) = local[o.0].clone().expect("outputs are nodes");
        let full = TensorLayout::replicated(l.mesh().clone(), l.shape().to_vec());
        let name = graph.node(o).name.clone();
        outputs.push(em.redistribute(&format!("{name}.out"), id, &l, &full)?);
    }
    let mut g = em.graph;
    g.outputs = outputs.clone();
    // Mirror groups of parameters are used by the gradient synchronisation.
    for p in &params {
        if p.mirror.len() > 1 {
            let axes: Vec<DeviceAxis> = p.layout.replica_axes().iter().map(|&a| p.layout.mesh().axis(a)).collect();
            let part = partition(&axes, n);
            if !partitions.contains(&part) {
                partitions.push(part);
            }
        }
    }
    Ok(RankProgram { rank, device_num: n, graph: g, outputs, params, inputs, partitions })
}

/// Parameter layouts as MindSpore's `parameter_layout_dict`, for strategy files and checks.
pub fn layouts_by_name(plan: &ParallelPlan, graph: &Graph) -> BTreeMap<String, TensorLayout> {
    plan.parameter_layouts(graph).into_iter().collect()
}

/// MindSpore's `parameter_layout_dict` of a plan: the 12-tuple of every network input and
/// parameter, in graph order (what `Cell.parameter_layout_dict` prints after compiling; the
/// optimizer-shard and pipeline fields are empty: autopar does not shard optimizer state or
/// pipeline yet).
pub fn parameter_layout_dict(graph: &Graph, plan: &ParallelPlan) -> Vec<(String, autopar_layout::ParameterLayout)> {
    plan.nodes
        .iter()
        .filter(|p| graph.node(p.id).op.is_leaf())
        .map(|p| {
            let l = &p.output;
            let dims = l.mesh().dims();
            let mut after = Vec::new();
            for (d, axes) in l.dim_axes().iter().enumerate() {
                let full = l.shape()[d];
                if axes.len() <= 1 {
                    after.push(full / l.split(d));
                } else {
                    // A dimension over several axes is viewed as one dimension per axis.
                    let lead: usize = axes[..axes.len() - 1].iter().map(|&a| dims[a]).product();
                    after.extend(std::iter::repeat_n(1, axes.len() - 1));
                    after.push(full / lead / dims[axes[axes.len() - 1]]);
                }
            }
            (
                p.name.clone(),
                autopar_layout::ParameterLayout {
                    dev_matrix: dims.to_vec(),
                    tensor_map: l.tensor_map().flattened(),
                    slice_shape: l.slice_shape(),
                    field_size: 0,
                    uniform_split: true,
                    opt_shard_group: String::new(),
                    full_shape: l.shape().to_vec(),
                    after_reshape_slice_shape: after,
                    pipeline_shared: false,
                    is_send: false,
                    peer_rank: 0,
                    sr_tag: 0,
                },
            )
        })
        .collect()
}
