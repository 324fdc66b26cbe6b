//! `recursive_programming`, MindSpore's default search (its "rec_core", as 2.10 runs it):
//! a greedy of binary cuts that does not use the cost graph's costs.
//!
//! 1. **The partition graph** keeps the ops whose cuts matter: 2-D MatMuls, convolutions, max
//!    pooling, batch norm and the loss, the ops rec does not know (average pooling, slices,
//!    pads: never cut, visited last), plus one node for the network inputs (MindSpore's
//!    VirtualDataset, shaped as the first input: an op reading another input of another shape
//!    is not adjacent to it). Every other op (element-wise ops, activations, bias adds, reductions,
//!    reshapes, transposes, softmax, layer norm, batched matmuls, gathers, one-hots) is left
//!    out and gets its strategy afterwards (`rec_rules::rec_op` says which is which). Edges pass through
//!    the ops left out: a kept op's producer is every kept op reached through their
//!    (non-parameter) inputs. Tensors are seen as 4-D (right-aligned), each dimension with a
//!    count of halvings. Ops a strategy file set keep their strategy, and so do those the
//!    model's `.shard()` set when `MS_INTERFERED_SAPP` is on (otherwise the search overwrites
//!    them, as MindSpore 2.10 does): they are not cut, and their strategy counts as one halving
//!    per round, the first dimension's first (MindSpore's `DecomposeStrategy`), then as no cut.
//! 2. **log2(devices) rounds.** Each round visits every kept node once, in MindSpore's order:
//!    its list of ops is a depth-first walk from the loss, each op before its inputs, and it
//!    visits the list from the end, so a chain goes from the inputs forward and in a residual
//!    `x + f(x)` the top block's branch f comes first (above 32 devices: by weight, heaviest
//!    first). Each visit halves one dimension of the node:
//!    * MatMul `[i,k] x [k,j]` with current local sizes: cut i costs `j*k/2 * rp_matmul_mem_coef` (0.1 unless set; the weight
//!      every replica keeps), cut j `i*k/2`, cut k `i*j/2`, no cut `(1.5 * min)^2 / 350`; j and k
//!      are never both cut; each option adds a redistribution penalty: for every neighbour
//!      already visited this round whose cut differs from what the option needs, 16 times the
//!      op's current input (producer) or output (consumer) size, where the two exchange a
//!      tensor of one shape (MindSpore's `isAdjacent`: compared through the transposes and
//!      reshapes between them, see `rec_adjacency`). The first cheapest option wins.
//!    * Convolutions cut the batch (`filter/2` plus the penalty); pooling the batch or channels
//!      (the penalty alone); batch-parallel ops and inputs their first even dimension, free.
//! 3. **Strategies**: the halvings give each kept op its strategy (the loss runs data parallel).
//!    The ops left out copy their neighbours' by MindSpore's rules (see `rec_rules`): in
//!    training widest strategies first, forward from an op's producer, else backward from its
//!    consumer, each op kind with its own rule; in inference its inference rules.

use std::collections::{BTreeMap, BTreeSet};

use autopar_graph::{Graph, NodeId, OpKind};

use super::costgraph::CostGraph;
use super::rec_adjacency::{padded, Dims, ShapeMap};
use super::rec_rules::{self, rec_op, Kind, RecOp};
use crate::analysis::{default_splits, depends_on_inputs};
use crate::error::{ParallelError, Result};

/// What the recursive search reads besides the cost graph.
pub struct RecInput<'a> {
    /// The network.
    pub graph: &'a Graph,
    /// The number of devices to cut for.
    pub devices: usize,
    /// The graph is a pipeline's, built for one micro-batch (MindSpore's `micro_batch_size`
    /// rules apply: see `SearchOptions::pipelined`).
    pub pipelined: bool,
    /// MindSpore's `rp_matmul_mem_coef` (0.1 unless set).
    pub matmul_mem_coef: f64,
    /// A training graph (MindSpore's `GenerateStrategyV3` rules), else inference (`V1`).
    pub training: bool,
    /// `full_batch`: the dataset's strategy splits nothing (MindSpore's `MakeFullBatchStrategy`),
    /// so an op copying a strategy from its inputs passes over a network input.
    pub full_batch: bool,
}

/// What every cut of a search reads besides the nodes.
#[derive(Clone, Copy, Debug)]
struct Knobs {
    /// In a pipeline, the micro-batch's samples, below one of which per device a MatMul's rows
    /// are not cut.
    micro_batch: Option<usize>,
    /// The weight of the memory a MatMul keeps whole when it cuts its rows.
    matmul_mem_coef: f64,
}

/// MindSpore's `micro_batch_size` in a pipeline: the samples of one micro-batch (the first
/// network input's first dimension).
fn micro_batch_size(g: &Graph) -> usize {
    g.nodes().iter().find(|n| matches!(n.op, OpKind::Input(_))).and_then(|n| n.ty.shape.first().copied()).unwrap_or(1)
}

/// Penalty per element of a neighbour whose cut differs (`REDIS_COEF`).
const REDIS_COEF: f64 = 16.0;
const EXPERT_COEF: f64 = 1.5;
const REPLICATE_BELOW: f64 = 350.0;

type Cuts = [u32; 4];

#[derive(Clone, Debug)]
struct RecNode {
    kind: Kind,
    /// Cost-graph op (None: a network input).
    op: Option<usize>,
    /// Full 4-D shapes of inputs 0 and 1 (MatMul: `[1,1,i,k]`, `[1,1,k,j]`) and the output.
    args: [Dims; 2],
    out: Dims,
    cuts: [Cuts; 2],
    out_cuts: Cuts,
    /// The nodes feeding it, through the ops left out.
    producers: Vec<Producer>,
    /// Set by the user or a strategy file: never cut here.
    fixed: bool,
    /// Place in MindSpore's list of ops ([`walk_positions`]; 0: not reached from an output).
    /// Rounds visit the highest first.
    pos: usize,
}

/// A node feeding another, as MindSpore's partition sees the edge.
#[derive(Clone, Debug)]
struct Producer {
    /// MindSpore's place of the edge in the consumer's `node_in`: the inputs before it that
    /// reach a kept op (a parameter does not, nor an op left out fed by parameters alone). Its
    /// cost compares the producer with the consumer's argument of that index, which is the
    /// input's own index unless such an input comes first.
    slot: usize,
    /// The producing node.
    node: usize,
    /// What the ops left out between them do to the shape.
    map: ShapeMap,
    /// The edges between the two: MindSpore links an op to each of its inputs, so an op
    /// reading one producer twice directly (`MatMul(x, x)`) has two, each charged; links made
    /// through ops left out are not repeated.
    edges: usize,
}

/// What a node did in the current round: the halvings of each dimension of its output and
/// input 0 (0 or 1).
#[derive(Clone, Copy, Debug)]
struct Round {
    out: Cuts,
    in0: Cuts,
}

/// Whether a round's halvings are the ones an option needs of that neighbour.
fn same(done: &Cuts, needs: &[bool; 4]) -> bool {
    done.iter().zip(needs).all(|(&c, &b)| c == b as u32)
}

/// What an option needs of (producer of input 0, producer of input 1, consumers).
type Modes = [[bool; 4]; 3];

/// The halvings an option makes: (input slot, or 2 for the output; 4-D dimension).
type Halvings = Vec<(usize, usize)>;

fn local(d: &Dims, c: &Cuts) -> [usize; 4] {
    [d[0] >> c[0], d[1] >> c[1], d[2] >> c[2], d[3] >> c[3]]
}

fn size(d: &[usize; 4]) -> f64 {
    d.iter().map(|&x| x as f64).product()
}

fn even(x: usize) -> bool {
    x >= 2 && x.is_multiple_of(2)
}

fn cut(dim: usize) -> [bool; 4] {
    let mut m = [false; 4];
    m[dim] = true;
    m
}

const NONE: [bool; 4] = [false; 4];

/// Each op's candidate index, and whether propagation decided it (an op left out of the
/// partition graph).
pub fn choose(cg: &CostGraph, rec: &RecInput<'_>) -> Result<(Vec<usize>, Vec<bool>)> {
    if !rec.devices.is_power_of_two() {
        return Err(ParallelError::SearchDevices { search: "recursive_programming", devices: rec.devices });
    }
    let g = rec.graph;
    let positions = walk_positions(g);
    let mut nodes: Vec<RecNode> = Vec::new();
    let mut kept_of: Vec<Option<usize>> = vec![None; g.len()];
    // MindSpore's one VirtualDataset: every network input is an output of the first input's
    // node (its shape is the first input's; it is listed where the walk first reaches one).
    let mut dataset: Option<usize> = None;
    for (i, node) in g.nodes().iter().enumerate() {
        let op = rec_op(&node.op, node.ty.shape.len());
        if let (RecOp::Dataset, Some(d)) = (&op, dataset) {
            kept_of[i] = Some(d);
            if positions[i] != 0 && (nodes[d].pos == 0 || positions[i] < nodes[d].pos) {
                nodes[d].pos = positions[i];
            }
            continue;
        }
        let kind = match op {
            RecOp::Dataset => {
                dataset = Some(nodes.len());
                Some(Kind::Batch)
            }
            RecOp::Kept(kind) if cg.of_node[i].is_some() => Some(kind),
            RecOp::Kept(_) | RecOp::Left(_) | RecOp::Not => None,
        };
        let Some(kind) = kind else { continue };
        let shape = |x: usize| node.inputs.get(x).map(|id| g.node(*id).ty.shape.clone()).unwrap_or_default();
        let args = if kind == Kind::MatMul {
            let op = &cg.ops[cg.of_node[i].expect("kept ops are cost-graph ops")];
            // Logical [i, k, j] of a 2-D MatMul.
            let (si, sk, sj) = (op.spec.dims[0].size, op.spec.dims[1].size, op.spec.dims[2].size);
            [[1, 1, si, sk], [1, 1, sk, sj]]
        } else if matches!(node.op, OpKind::Input(_)) {
            [padded(&node.ty.shape), [1; 4]]
        } else {
            [padded(&shape(0)), padded(&shape(1))]
        };
        kept_of[i] = Some(nodes.len());
        nodes.push(RecNode {
            kind,
            op: cg.of_node[i],
            args,
            out: padded(&node.ty.shape),
            cuts: [[0; 4]; 2],
            out_cuts: [0; 4],
            producers: Vec::new(),
            fixed: false,
            pos: positions[i],
        });
    }
    // Ops with a given strategy start (and stay) cut as it says.
    for node in &mut nodes {
        let Some(k) = node.op else { continue };
        let op = &cg.ops[k];
        if op.configured.is_none() {
            continue;
        }
        let splits = &op.candidates[0].splits;
        let log = |s: usize| s.max(1).ilog2();
        node.fixed = true;
        if node.kind == Kind::MatMul {
            node.cuts = [[0, 0, log(splits[0]), log(splits[1])], [0, 0, log(splits[1]), log(splits[2])]];
            node.out_cuts = [0, 0, log(splits[0]), log(splits[2])];
        } else {
            for (t, l) in op.spec.inputs[0].iter().enumerate() {
                if let (Some(l), Some(d)) = (l, (t + 4).checked_sub(op.spec.inputs[0].len())) {
                    node.cuts[0][d] = log(splits[*l]);
                }
            }
            for (t, l) in op.spec.output.iter().enumerate() {
                if let (Some(l), Some(d)) = (l, (t + 4).checked_sub(op.spec.output.len())) {
                    node.out_cuts[d] = log(splits[*l]);
                }
            }
        }
    }
    // Producers through the ops left out, each edge with what the ops between do to the shape.
    let order = list_order(&positions);
    let edges = eliminated_edges(g, &kept_of, &order);
    for (i, node) in g.nodes().iter().enumerate() {
        let Some(k) = kept_of[i] else { continue };
        if matches!(node.op, OpKind::Input(_)) {
            continue;
        }
        nodes[k].producers = producers_of(g, NodeId(i), &kept_of, &edges);
    }
    let consumers: Vec<Vec<usize>> =
        (0..nodes.len()).map(|p| (0..nodes.len()).filter(|&c| nodes[c].producers.iter().any(|q| q.node == p)).collect()).collect();

    let knobs = Knobs { micro_batch: rec.pipelined.then(|| micro_batch_size(g)), matmul_mem_coef: rec.matmul_mem_coef };
    let rounds = rec.devices.ilog2();
    for round in 0..rounds {
        // Fixed ops first, as having made their cut of this round.
        let mut done: Vec<(usize, Round)> =
            (0..nodes.len()).filter(|&v| nodes[v].fixed).map(|v| (v, fixed_round(&nodes[v], round))).collect();
        for v in visit_order(&nodes, rec.devices, &knobs) {
            if nodes[v].fixed {
                continue;
            }
            let r = partition(&mut nodes, v, &consumers[v], &done, &knobs);
            done.push((v, r));
        }
    }

    // Strategies of the kept ops, then propagation to the rest.
    let on_data = depends_on_inputs(g);
    let mut configured: Vec<Option<usize>> = cg.ops.iter().map(|op| op.configured.map(|_| 0)).collect();
    for node in &nodes {
        let Some(k) = node.op else { continue };
        let op = &cg.ops[k];
        if op.configured.is_some() {
            continue;
        }
        let mut splits = vec![1usize; op.spec.dims.len()];
        match node.kind {
            Kind::MatMul => {
                splits[0] = 1 << node.cuts[0][2];
                splits[1] = 1 << node.cuts[0][3];
                splits[2] = 1 << node.cuts[1][3];
            }
            Kind::Loss => splits = default_splits(&op.spec, g.node(op.node), &on_data, rec.devices),
            Kind::Unknown => {}
            Kind::Conv | Kind::Pool | Kind::Batch => {
                let map = &op.spec.inputs[0];
                for (t, l) in map.iter().enumerate() {
                    if let (Some(l), Some(d)) = (l, (t + 4).checked_sub(map.len())) {
                        splits[*l] = splits[*l].max(1 << node.cuts[0][d]);
                    }
                }
            }
        }
        // A split the candidates lack (dropped for memory, say): the nearest one below it.
        configured[k] = op.candidates.iter().position(|c| c.splits == splits).or_else(|| {
            let below = |c: &&super::costgraph::Candidate| c.splits.iter().zip(&splits).all(|(&a, &b)| b.is_multiple_of(a));
            let best = op.candidates.iter().filter(below).map(|c| c.splits.iter().product::<usize>()).max()?;
            op.candidates.iter().position(|c| below(&c) && c.splits.iter().product::<usize>() == best)
        });
    }
    Ok(rec_rules::complete(g, cg, rec.devices, &configured, rec.training, rec.full_batch, &order))
}

/// What fixed node `n` counts as having halved in round `round` ([`decomposed`]).
fn fixed_round(n: &RecNode, round: u32) -> Round {
    Round { out: decomposed(&n.out_cuts, round), in0: decomposed(&n.cuts[0], round) }
}

/// MindSpore's `DecomposeStrategy`: a given strategy taken as one halving per round, the first
/// dimension's halvings first, then the second's, and so on; in the rounds after them, no cut
/// (the decomposed tensor's own split stays 1 there).
fn decomposed(cuts: &Cuts, round: u32) -> Cuts {
    let mut one = [0; 4];
    if let Some(d) = (0..4).flat_map(|d| std::iter::repeat_n(d, cuts[d] as usize)).nth(round as usize) {
        one[d] = 1;
    }
    one
}

/// The kept nodes a value comes from, through the ops left out (all their non-parameter
/// inputs); each node is walked once.
fn reach(g: &Graph, x: NodeId, kept_of: &[Option<usize>], seen: &mut BTreeSet<NodeId>, out: &mut BTreeSet<usize>) {
    if !seen.insert(x) {
        return;
    }
    if let Some(k) = kept_of[x.0] {
        out.insert(k);
        return;
    }
    let node = g.node(x);
    for y in &node.inputs {
        if !matches!(g.node(*y).op, OpKind::Parameter(_)) {
            reach(g, *y, kept_of, seen, out);
        }
    }
}

/// The kept nodes feeding graph node `id` (kept as `kept_of[id]`), through the ops left out,
/// with their edges' mappings (`edges`, from [`eliminated_edges`]).
fn producers_of(g: &Graph, id: NodeId, kept_of: &[Option<usize>], edges: &BTreeMap<(usize, usize), ShapeMap>) -> Vec<Producer> {
    let node = g.node(id);
    let k = kept_of[id.0].expect("a kept node");
    // Each input's kept producers; an input that reaches none (a parameter, or ops left out
    // fed by parameters alone, which MindSpore's elimination erases from `node_in`) takes no
    // number.
    let reached = node.inputs.iter().map(|x| {
        let mut found = BTreeSet::new();
        reach(g, *x, kept_of, &mut BTreeSet::new(), &mut found);
        found
    });
    let mut producers = Vec::new();
    // The first two numbered: the partition's options say what they need of two inputs.
    for (slot, found) in reached.filter(|f| !f.is_empty()).enumerate().take(2) {
        for p in found {
            // Network inputs (the one dataset node's outputs) count one link: MindSpore's
            // `test_auto_parallel_sapp_optimizer_parallel_restrict` (a MatMul of two inputs)
            // chooses as one link, not two, would.
            let direct = node.inputs.iter().filter(|y| kept_of[y.0] == Some(p) && !matches!(g.node(**y).op, OpKind::Input(_))).count();
            let map = edges.get(&(p, k)).cloned().unwrap_or_default();
            producers.push(Producer { slot, node: p, map, edges: direct.max(1) });
        }
    }
    producers
}

/// What a transpose or reshape does to its input's dimensions (none for other ops).
fn own_map(g: &Graph, x: NodeId) -> ShapeMap {
    let node = g.node(x);
    match &node.op {
        OpKind::Transpose(t) => ShapeMap::transpose(&t.perm),
        OpKind::Reshape(_) => {
            let input = node.inputs.first().map(|i| g.node(*i).ty.shape.clone()).unwrap_or_default();
            ShapeMap::reshape(&input, &node.ty.shape)
        }
        _ => ShapeMap::default(),
    }
}

/// The edges between kept nodes once the ops left out are eliminated, each with what the ops
/// between do to the tensor's shape: MindSpore's `EliminateGraph` replayed for its
/// `NodeDep` mappings. The ops left out go in `order`, MindSpore's op list ([`list_order`]; consumers
/// before producers mostly); eliminating X links each op feeding X to each op X feeds, the
/// mapping X's own followed by the one on that edge (`ShapeMappingCombine`), unless the two
/// are linked already: the edge made first stays, so where several paths join two ops the
/// one whose ops are eliminated first decides, as in MindSpore.
fn eliminated_edges(g: &Graph, kept_of: &[Option<usize>], order: &[usize]) -> BTreeMap<(usize, usize), ShapeMap> {
    let n = g.len();
    let is_op = |i: usize| !matches!(g.node(NodeId(i)).op, OpKind::Parameter(_));
    let mut out: Vec<Vec<(usize, ShapeMap)>> = vec![Vec::new(); n];
    let mut feeding: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (j, node) in g.nodes().iter().enumerate() {
        if !is_op(j) {
            continue;
        }
        for x in &node.inputs {
            if is_op(x.0) {
                out[x.0].push((j, ShapeMap::default()));
                feeding[j].insert(x.0);
            }
        }
    }
    for x in order.iter().copied().filter(|&i| is_op(i) && kept_of[i].is_none()) {
        let own = own_map(g, NodeId(x));
        let outs = std::mem::take(&mut out[x]);
        for i in std::mem::take(&mut feeding[x]) {
            out[i].retain(|(o, _)| *o != x);
            for (o, m) in &outs {
                if !out[i].iter().any(|(p, _)| p == o) {
                    out[i].push((*o, own.then(m)));
                    feeding[*o].insert(i);
                }
            }
        }
        for (o, _) in &outs {
            feeding[*o].remove(&x);
        }
    }
    let mut edges = BTreeMap::new();
    for (p, list) in out.into_iter().enumerate() {
        let Some(kp) = kept_of[p] else { continue };
        for (c, m) in list {
            if let Some(kc) = kept_of[c] {
                edges.entry((kp, kc)).or_insert(m);
            }
        }
    }
    edges
}

/// Every node in the order of MindSpore's list of ops (`positions` from [`walk_positions`]);
/// nodes no output depends on last, in graph order.
pub(super) fn list_order(positions: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..positions.len()).collect();
    order.sort_by_key(|&i| if positions[i] == 0 { (1, i) } else { (0, positions[i]) });
    order
}

/// Where each node stands in MindSpore's list of ops (`DeepScopedGraphSearch` from the
/// graph's return): a depth-first walk from the outputs in order (the loss first), each node
/// listed before its inputs, inputs in order; positions count from 1 (0: not reached). A
/// chain lists its last op first; `x + f(x)` lists the add, then x's producers, then f.
/// MindSpore visits the list from its end.
pub(super) fn walk_positions(g: &Graph) -> Vec<usize> {
    let mut pos = vec![0usize; g.len()];
    let mut next = 0;
    let mut stack: Vec<(NodeId, usize)> = Vec::new();
    for &root in &g.outputs {
        if pos[root.0] != 0 {
            continue;
        }
        next += 1;
        pos[root.0] = next;
        stack.push((root, 0));
        while let Some(&(n, i)) = stack.last() {
            match g.node(n).inputs.get(i) {
                Some(&x) => {
                    stack.last_mut().expect("not empty").1 += 1;
                    if pos[x.0] == 0 {
                        next += 1;
                        pos[x.0] = next;
                        stack.push((x, 0));
                    }
                }
                None => {
                    stack.pop();
                }
            }
        }
    }
    pos
}

/// MindSpore's visiting order (`SortByWeight`): the list from its end (a chain from its
/// inputs forward; in `x + f(x)` the branch f of the top block first), the ops rec does not
/// know last; above 32 devices (and micro-batches under 8 samples in a pipeline) the heaviest
/// first, ties from the list's end. Nodes no output depends on come last, in the graph's order.
fn visit_order(nodes: &[RecNode], devices: usize, knobs: &Knobs) -> Vec<usize> {
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    let later = |a: usize, b: usize| nodes[b].pos.cmp(&nodes[a].pos).then(a.cmp(&b));
    order.sort_by(|&a, &b| (nodes[a].kind == Kind::Unknown).cmp(&(nodes[b].kind == Kind::Unknown)).then(later(a, b)));
    if devices > 32 && knobs.micro_batch.is_none_or(|m| m < 8) {
        let w: Vec<f64> = nodes.iter().map(|n| weight(n, knobs.matmul_mem_coef)).collect();
        order.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(later(a, b)));
    }
    order
}

fn weight(n: &RecNode, matmul_mem_coef: f64) -> f64 {
    match n.kind {
        Kind::MatMul => {
            let (i, k, j) = matmul_sizes(n);
            let c = matmul_costs(i, k, j, matmul_mem_coef);
            c.iter().copied().fold(0.0, f64::max)
        }
        // `CostConvolution::GetMinCostIn`: the least of its seven cut costs, which is half the
        // smallest of input, filter and output.
        Kind::Conv => {
            let sizes = [size(&local(&n.args[0], &n.cuts[0])), size(&local(&n.args[1], &n.cuts[1])), size(&local(&n.out, &n.out_cuts))];
            sizes.into_iter().fold(f64::MAX, f64::min) / 2.0
        }
        Kind::Pool | Kind::Unknown => 0.0,
        Kind::Batch | Kind::Loss if n.op.is_none() => 0.0,
        Kind::Batch | Kind::Loss => f64::MAX,
    }
}

fn matmul_sizes(n: &RecNode) -> (usize, usize, usize) {
    let a = local(&n.args[0], &n.cuts[0]);
    let b = local(&n.args[1], &n.cuts[1]);
    (a[2], a[3], b[3])
}

/// MatMul's op costs of cutting i (the weight every replica keeps, times `mem_coef`), j, k
/// and of no cut.
fn matmul_costs(i: usize, k: usize, j: usize, mem_coef: f64) -> [f64; 4] {
    let (i, k, j) = (i as f64, k as f64, j as f64);
    let ci = j * k / 2.0 * mem_coef;
    let cj = i * k / 2.0;
    let ck = i * j / 2.0;
    let m = ci.min(cj).min(ck);
    [ci, cj, ck, (EXPERT_COEF * m).powi(2) / REPLICATE_BELOW]
}

/// The redistribution penalty of an option needing `modes` for node `v`.
fn redis(nodes: &[RecNode], v: usize, consumers: &[usize], done: &[(usize, Round)], modes: &Modes) -> f64 {
    let n = &nodes[v];
    let in_size = size(&local(&n.args[0], &n.cuts[0]));
    let out_size = size(&local(&n.out, &n.out_cuts));
    let mut total = 0.0;
    for (name, r) in done {
        for p in &n.producers {
            if p.node == *name && p.map.adjacent(&nodes[p.node].out, &n.args[p.slot]) && !same(&r.out, &modes[p.slot]) {
                total += in_size * REDIS_COEF * p.edges as f64;
            }
        }
        for &c in consumers {
            if c != *name {
                continue;
            }
            // The edge to the consumer, charged once per link MindSpore keeps between them.
            let Some(edge) = nodes[c].producers.iter().find(|q| q.node == v) else { continue };
            // MindSpore tries each of its 20 input slots; those past the op's inputs are 1x1x1x1.
            if nodes[c].args.iter().chain([&[1; 4]]).any(|a| edge.map.adjacent(&n.out, a)) && !same(&r.in0, &modes[2]) {
                total += out_size * REDIS_COEF * edge.edges as f64;
            }
        }
    }
    total
}

/// One round of node `v`: pick its cheapest cut, apply it, and say what it halved.
fn partition(nodes: &mut [RecNode], v: usize, consumers: &[usize], done: &[(usize, Round)], knobs: &Knobs) -> Round {
    let n = nodes[v].clone();
    // Options: (cost, modes, halvings of (input slot or 2 = output, 4-D dim)).
    let mut options: Vec<(f64, Halvings)> = Vec::new();
    match n.kind {
        Kind::MatMul => {
            let (i, k, j) = matmul_sizes(&n);
            let c = matmul_costs(i, k, j, knobs.matmul_mem_coef);
            let k_cut = n.cuts[0][3] > 0;
            let j_cut = n.cuts[1][3] > 0;
            let rows_left = knobs.micro_batch.is_none_or(|m| m > 1 << n.cuts[0][2]);
            let opts: [(bool, f64, Modes, Halvings); 4] = [
                (even(i) && rows_left, c[0], [cut(2), NONE, cut(2)], vec![(0, 2), (2, 2)]),
                (even(j) && !k_cut, c[1], [NONE, cut(3), cut(3)], vec![(1, 3), (2, 3)]),
                (even(k) && !j_cut, c[2], [cut(3), cut(2), NONE], vec![(0, 3), (1, 2)]),
                (true, c[3], [NONE, NONE, NONE], vec![]),
            ];
            for (ok, cost, modes, halve) in opts {
                let total = if ok { (cost + redis(nodes, v, consumers, done, &modes)).abs() } else { f64::MAX };
                options.push((total, halve));
            }
        }
        Kind::Conv => {
            let a = local(&n.args[0], &n.cuts[0]);
            let filter = size(&local(&n.args[1], &n.cuts[1])) / 2.0;
            let modes = [cut(0), NONE, cut(0)];
            let total = if even(a[0]) { (filter + redis(nodes, v, consumers, done, &modes)).abs() } else { f64::MAX };
            options.push((total, vec![(0, 0), (2, 0)]));
        }
        Kind::Pool => {
            let o = local(&n.out, &n.out_cuts);
            for (d, &size) in o.iter().enumerate().take(2) {
                let modes = [cut(d), cut(d), cut(d)];
                let total = if even(size) { redis(nodes, v, consumers, done, &modes).abs() } else { f64::MAX };
                options.push((total, vec![(0, d), (2, d)]));
            }
        }
        Kind::Unknown => {}
        Kind::Batch | Kind::Loss => {
            let a = local(&n.args[0], &n.cuts[0]);
            for (d, &size) in a.iter().enumerate() {
                options.push((if even(size) { 0.0 } else { f64::MAX }, vec![(0, d), (2, d)]));
            }
        }
    }
    // The first cheapest option.
    let mut best: Option<usize> = None;
    for (x, o) in options.iter().enumerate() {
        if best.is_none_or(|b| o.0 < options[b].0) {
            best = Some(x);
        }
    }
    let mut r = Round { out: [0; 4], in0: [0; 4] };
    let Some(b) = best.filter(|&b| options[b].0 < f64::MAX) else { return r };
    let node = &mut nodes[v];
    for &(slot, d) in &options[b].1 {
        match slot {
            2 => {
                node.out_cuts[d] += 1;
                r.out[d] = 1;
            }
            s => {
                node.cuts[s][d] += 1;
                if s == 0 {
                    r.in0[d] = 1;
                }
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MindSpore's partition numbers an op's incoming edges by its inputs that reach a kept op
    /// (its `node_in`: parameters, and ops left out fed by parameters alone, take no number)
    /// and compares each producer with the argument of that number; an op reading one producer
    /// twice has two links from it, each charged.
    #[test]
    fn producers_take_mindspores_edge_numbers_and_links() {
        use autopar_graph::{DType, GraphBuilder, Initializer};
        let mut b = GraphBuilder::new(1);
        let x = b.input("x", &[4, 4], DType::F32).unwrap();
        let w = b.parameter("w", &[4, 4], Initializer::Zeros).unwrap();
        let first = b.matmul("first", x, w).unwrap();
        // A weight before the activation: the activation's edge is MindSpore's first.
        let weight_first = b.matmul("weight_first", w, first).unwrap();
        let twice = b.matmul("twice", weight_first, weight_first).unwrap();
        let relu = b.relu("relu", twice).unwrap();
        // One link through an op left out, one direct: not repeated.
        let mixed = b.matmul("mixed", twice, relu).unwrap();
        // An op left out fed by a parameter alone takes no number either.
        let wt = b.transpose("wt", w, &[1, 0]).unwrap();
        let transposed_first = b.matmul("transposed_first", wt, mixed).unwrap();
        // Two network inputs: one link from the one dataset node.
        let y = b.input("y", &[4, 4], DType::F32).unwrap();
        let inputs = b.matmul("inputs", x, y).unwrap();
        let out = b.add("out", transposed_first, inputs).unwrap();
        b.output(out).unwrap();
        let g = b.finish();
        let mut kept_of = vec![None; g.len()];
        for (k, id) in [x, first, weight_first, twice, mixed, transposed_first, inputs].into_iter().enumerate() {
            kept_of[id.0] = Some(k);
        }
        kept_of[y.0] = Some(0);
        let edges = eliminated_edges(&g, &kept_of, &list_order(&walk_positions(&g)));
        let seen = |id| producers_of(&g, id, &kept_of, &edges).iter().map(|p| (p.slot, p.node, p.edges)).collect::<Vec<_>>();
        assert_eq!(seen(first), vec![(0, 0, 1)]);
        assert_eq!(seen(weight_first), vec![(0, 1, 1)]);
        assert_eq!(seen(twice), vec![(0, 2, 2), (1, 2, 2)]);
        assert_eq!(seen(mixed), vec![(0, 3, 1), (1, 3, 1)]);
        assert_eq!(seen(transposed_first), vec![(0, 4, 1)]);
        assert_eq!(seen(inputs), vec![(0, 0, 1), (1, 0, 1)]);
        // Each link is charged: a disagreeing cut of `twice`'s producer costs four times the
        // input (two numbered edges, each with two links), as MindSpore's loops count it.
        let node = |producers| RecNode {
            kind: Kind::MatMul,
            op: Some(0),
            args: [[1, 1, 4, 4], [1, 1, 4, 4]],
            out: [1, 1, 4, 4],
            cuts: [[0; 4]; 2],
            out_cuts: [0; 4],
            producers,
            fixed: false,
            pos: 1,
        };
        let nodes = [node(Vec::new()), node(Vec::new()), node(Vec::new()), node(producers_of(&g, twice, &kept_of, &edges))];
        let done = [(2, Round { out: [0; 4], in0: [0; 4] })];
        assert_eq!(redis(&nodes, 3, &[], &done, &[cut(2), cut(2), cut(2)]), 4.0 * 16.0 * REDIS_COEF);
        // And from the producer's side, once per link.
        let done = [(3, Round { out: [0; 4], in0: [0; 4] })];
        assert_eq!(redis(&nodes, 2, &[3], &done, &[NONE, NONE, cut(2)]), 2.0 * 16.0 * REDIS_COEF);
    }

    #[test]
    fn matmul_costs_prefer_the_batch_for_small_batches_of_large_weights() {
        // [32, 8192] x [8192, 8192]: cut i keeps the weight whole (its cost is the weight's).
        let c = matmul_costs(32, 8192, 8192, 0.1);
        assert_eq!(c[0], 8192.0 * 8192.0 / 2.0 * 0.1);
        assert_eq!(c[1], 32.0 * 8192.0 / 2.0);
        assert!(c[3] > c[0], "no cut is dearer than any cut of a big MatMul");
        // Tiny matrices: no cut is cheapest.
        let c = matmul_costs(4, 4, 4, 0.1);
        assert!(c[3] < c[0].min(c[1]).min(c[2]));
    }

    /// MindSpore lists the ops depth first from the loss (each before its inputs, inputs in
    /// order) and visits the list from its end: a chain from the input forward, and in
    /// `h + f(h)` the branch f before h's producers.
    #[test]
    fn the_walk_lists_a_residual_branch_after_the_stream_so_it_is_visited_first() {
        use autopar_graph::{DType, GraphBuilder, Initializer};
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[8, 16], DType::F32).unwrap();
        let w = b.parameter("w", &[16, 16], Initializer::Zeros).unwrap();
        let h = b.matmul("h", x, w).unwrap();
        let v = b.parameter("v", &[16, 16], Initializer::Zeros).unwrap();
        let f = b.matmul("f", h, v).unwrap();
        let sum = b.add("sum", h, f).unwrap();
        let out = b.relu("out", sum).unwrap();
        b.output(out).unwrap();
        let unused = b.relu("unused", x).unwrap();
        let g = b.finish();
        let pos = walk_positions(&g);
        // out, sum, h, x, w, f, v; `unused` feeds no output.
        let order = [out, sum, h, x, w, f, v];
        for (k, id) in order.iter().enumerate() {
            assert_eq!(pos[id.0], k + 1, "{}", g.node(*id).name);
        }
        assert_eq!(pos[unused.0], 0);
        // Visited: the branch f, then the input x, then h.
        assert!(pos[f.0] > pos[x.0] && pos[x.0] > pos[h.0]);
    }

    /// Above 32 devices a convolution weighs half its smallest tensor (MindSpore's
    /// `CostConvolution::GetMinCostIn`), a MatMul its dearest cut.
    #[test]
    fn a_convolution_weighs_half_its_smallest_tensor() {
        let conv = RecNode {
            kind: Kind::Conv,
            op: Some(0),
            args: [[32, 64, 8, 8], [128, 64, 3, 3]],
            out: [32, 128, 8, 8],
            cuts: [[1, 0, 0, 0], [0; 4]],
            out_cuts: [1, 0, 0, 0],
            producers: Vec::new(),
            fixed: false,
            pos: 1,
        };
        // Input 16x64x8x8 = 65536, filter 73728, output 131072.
        assert_eq!(weight(&conv, 0.1), 65536.0 / 2.0);
    }

    /// A MatMul reading a pooled image through a reshape `[2, 16, 4, 4] -> [2, 256]` is the
    /// pool's neighbour (MindSpore's `isAdjacent` maps the shapes through the reshape): a cut
    /// of its rows disagrees with a round in which the pool cut nothing, and pays for the
    /// redistribution; cutting its columns needs nothing of the pool. Without the reshape's
    /// mapping the shapes differ and nothing is charged.
    #[test]
    fn a_neighbour_through_a_reshape_is_charged_for_a_disagreeing_cut() {
        use autopar_graph::{DType, GraphBuilder, Initializer, PoolAttrs};
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2, 16, 4, 4], DType::F32).unwrap();
        let pool = b.max_pool("pool", x, PoolAttrs { kernel: [1, 1], stride: [1, 1], padding: [0; 4] }).unwrap();
        let flat = b.reshape("flat", pool, &[2, 256]).unwrap();
        let w = b.parameter("w", &[256, 64], Initializer::Zeros).unwrap();
        let mm = b.matmul("mm", flat, w).unwrap();
        b.output(mm).unwrap();
        let g = b.finish();
        let mut kept_of = vec![None; g.len()];
        kept_of[x.0] = Some(2);
        kept_of[pool.0] = Some(0);
        kept_of[mm.0] = Some(1);
        let mut edges = eliminated_edges(&g, &kept_of, &list_order(&walk_positions(&g)));
        let map = edges.remove(&(0, 1)).expect("the pool produces the MatMul's input");
        assert_eq!(map, ShapeMap::reshape(&[2, 16, 4, 4], &[2, 256]));

        let node = |kind, args: [Dims; 2], out, producers| RecNode {
            kind,
            op: Some(0),
            args,
            out,
            cuts: [[0; 4]; 2],
            out_cuts: [0; 4],
            producers,
            fixed: false,
            pos: 1,
        };
        let pooled = node(Kind::Pool, [[2, 16, 4, 4], [1; 4]], [2, 16, 4, 4], Vec::new());
        let matmul = |map: ShapeMap| {
            node(Kind::MatMul, [[1, 1, 2, 256], [1, 1, 256, 64]], [1, 1, 2, 64], vec![Producer { slot: 0, node: 0, map, edges: 1 }])
        };
        let done = [(0, Round { out: [0; 4], in0: [0; 4] })];
        let rows: Modes = [cut(2), NONE, cut(2)];
        let cols: Modes = [NONE, cut(3), cut(3)];
        let nodes = [pooled.clone(), matmul(map)];
        assert_eq!(redis(&nodes, 1, &[], &done, &rows), 2.0 * 256.0 * REDIS_COEF);
        assert_eq!(redis(&nodes, 1, &[], &done, &cols), 0.0);
        let unmapped = [pooled, matmul(ShapeMap::default())];
        assert_eq!(redis(&unmapped, 1, &[], &done, &rows), 0.0);
    }

    /// Eliminating the ops between two kept ones composes their mappings in path order (a
    /// chain P -> T1 -> T2 -> C maps by T1 then T2); where two paths join the same two ops,
    /// the edge made first stays: MindSpore eliminates the op nearer the consumer first, so in
    /// `C(add(transpose(P), P))` the edge comes through the add alone, without the transpose.
    #[test]
    fn eliminated_ops_compose_their_mappings_and_the_first_edge_stays() {
        use autopar_graph::{DType, GraphBuilder, Initializer};
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 8, 16, 32], DType::F32).unwrap();
        let w = b.parameter("w", &[32, 32], Initializer::Zeros).unwrap();
        let p = b.max_pool("p", x, autopar_graph::PoolAttrs { kernel: [1, 1], stride: [1, 1], padding: [0; 4] }).unwrap();
        let t1 = b.transpose("t1", p, &[0, 2, 1, 3]).unwrap();
        let t2 = b.transpose("t2", t1, &[1, 0, 2, 3]).unwrap();
        let r = b.reshape("r", t2, &[512, 32]).unwrap();
        let c = b.matmul("c", r, w).unwrap();
        b.output(c).unwrap();
        let g = b.finish();
        let mut kept_of = vec![None; g.len()];
        (kept_of[x.0], kept_of[p.0], kept_of[c.0]) = (Some(0), Some(1), Some(2));
        let edges = eliminated_edges(&g, &kept_of, &list_order(&walk_positions(&g)));
        let want = ShapeMap::transpose(&[0, 2, 1, 3])
            .then(&ShapeMap::transpose(&[1, 0, 2, 3]))
            .then(&ShapeMap::reshape(&[8, 4, 16, 32], &[512, 32]));
        assert_eq!(edges[&(1, 2)], want);
        // t1 then t2 takes dimension t1[t2[i]]: (8, 4, 16, 32) from (4, 8, 16, 32).
        assert!(ShapeMap::transpose(&[0, 2, 1, 3]).then(&ShapeMap::transpose(&[1, 0, 2, 3])).adjacent(&[4, 8, 16, 32], &[16, 4, 8, 32]));

        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 8, 16, 32], DType::F32).unwrap();
        let p = b.max_pool("p", x, autopar_graph::PoolAttrs { kernel: [1, 1], stride: [1, 1], padding: [0; 4] }).unwrap();
        let t = b.transpose("t", p, &[0, 1, 3, 2]).unwrap();
        let t = b.transpose("tt", t, &[0, 1, 3, 2]).unwrap();
        let sum = b.add("sum", t, p).unwrap();
        let c = b.max_pool("c", sum, autopar_graph::PoolAttrs { kernel: [1, 1], stride: [1, 1], padding: [0; 4] }).unwrap();
        b.output(c).unwrap();
        let g = b.finish();
        let mut kept_of = vec![None; g.len()];
        (kept_of[x.0], kept_of[p.0], kept_of[c.0]) = (Some(0), Some(1), Some(2));
        let edges = eliminated_edges(&g, &kept_of, &list_order(&walk_positions(&g)));
        assert_eq!(edges[&(1, 2)], ShapeMap::default());
    }

    /// A given strategy counts as one halving per round, dimension by dimension, then whole.
    #[test]
    fn a_given_strategy_is_decomposed_one_halving_per_round() {
        // (2, 4) on a 2-D tensor: 4-D halvings [0, 0, 1, 2].
        let cuts = [0, 0, 1, 2];
        assert_eq!(decomposed(&cuts, 0), [0, 0, 1, 0]);
        assert_eq!(decomposed(&cuts, 1), [0, 0, 0, 1]);
        assert_eq!(decomposed(&cuts, 2), [0, 0, 0, 1]);
        // Past its halvings it counts as no cut, as does a strategy that splits nothing.
        assert!(same(&decomposed(&cuts, 3), &NONE));
        assert!(same(&decomposed(&[0, 0, 1, 0], 1), &NONE));
        assert!(same(&decomposed(&[0; 4], 0), &NONE));
    }
}
