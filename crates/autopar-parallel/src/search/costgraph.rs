//! The cost graph: every op with a sharding rule and its candidate strategies, what each
//! candidate costs on its own, and what every producer-consumer pair of candidates costs in
//! redistribution. In [`CostUnits::Seconds`] all costs are seconds of one device's step under a
//! [`DeviceProfile`] (MindSpore's units: below).
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
//!   optimizer slot, as the parallel optimizer's level keeps them (sharded values, gradients
//!   and state; level3's second all-gather is priced with the gradient sync); candidates above
//!   `device_memory_capacity` are dropped, and the elimination searches keep the plan's
//!   memory, summed over its ops, within it.
//!
//! The objective is `alpha * compute + beta * (communication + redistribution) + gamma *
//! gradient sync` (`costmodel_alpha/beta/gamma`, 1.0 by default: the profile already turns
//! everything into seconds).
//!
//! In [`CostUnits::MindSpore`] (dynamic_programming without a device profile) the same graph
//! holds MindSpore's own costs instead ([`super::mindspore_costs`]): `compute` is an op's
//! forward computation in bytes, `communication` its refined forward communication plus `γ`
//! times its parameters' gradient all-reduces, and `redistribution` the edges' costs already
//! weighted; the objective is `α · compute + β · communication + redistribution`, with
//! MindSpore's defaults (1, 400, 0.001) for the weights the context leaves unset.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use autopar_graph::{CostCx, Graph, NodeId, OpKind, OpLayouts, OpSpec, Recompute, ShardingRule, TensorType, Tie};
use autopar_layout::{plan_with, TensorLayout};

use super::mindspore_costs::{self as ms, Weights};
use super::profile::DeviceProfile;
use super::solve::{tandem_repeats, tied_index, CostProblem, Costs, EdgeCost, Repeat, Shape};
use super::StrategySource;
use crate::analysis::{batch_dim, depends_on_inputs, first_use, reshape_layout, whole_values};
use crate::context::{ParallelContext, SearchOptions};
use crate::error::{ParallelError, Result};

/// A cost split into the model's parts (seconds, memory in bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostSplit {
    /// Seconds of computation (forward, and backward in training).
    pub compute: f64,
    /// Seconds of the op's own communication (completing partial sums, synchronised statistics).
    pub communication: f64,
    /// Seconds of the redistributions before the op's inputs.
    pub redistribution: f64,
    /// Seconds of the gradient synchronisation of the parameters whose layout the op decides.
    pub gradient_sync: f64,
    /// Bytes per device: the output slice, and its parameters' slices with their gradients and one optimizer slot.
    pub memory: u64,
}

impl CostSplit {
    /// The objective's value of this cost in `units` under weights `w`.
    pub fn weighted(&self, w: Weights, units: CostUnits) -> f64 {
        if self.redistribution >= FORBIDDEN {
            return FORBIDDEN;
        }
        match units {
            CostUnits::Seconds => {
                w.alpha * self.compute + w.beta * (self.communication + self.redistribution) + w.gamma * self.gradient_sync
            }
            CostUnits::MindSpore => w.alpha * self.compute + w.beta * self.communication + self.redistribution,
        }
    }
}

/// What the cost graph's figures are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostUnits {
    /// Seconds of a step under a [`DeviceProfile`].
    Seconds,
    /// MindSpore's cost model: bytes ([`super::mindspore_costs`]).
    MindSpore,
}

impl CostUnits {
    /// The objective's weights `(costmodel_alpha, beta, gamma)` in these units: the context's,
    /// and for MindSpore's units MindSpore's defaults where the context leaves one unset.
    pub fn weights(self, ctx: &ParallelContext) -> Weights {
        let o = &ctx.search;
        let given = Weights { alpha: o.costmodel_alpha.get(), beta: o.costmodel_beta.get(), gamma: o.costmodel_gamma.get() };
        match self {
            CostUnits::Seconds => given,
            CostUnits::MindSpore => {
                let d = Weights::default();
                let pick = |key: &str, set: f64, default: f64| if ctx.is_set(key) { set } else { default };
                Weights {
                    alpha: pick("costmodel_alpha", given.alpha, d.alpha),
                    beta: pick("costmodel_beta", given.beta, d.beta),
                    gamma: pick("costmodel_gamma", given.gamma, d.gamma),
                }
            }
        }
    }
}

/// One strategy an op may take.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The strategy, its layouts and its cost without parameters or fixed inputs: built once
    /// for every op of the same kind, shapes and sharding (the blocks of a deep network) and
    /// shared by them.
    pub shared: Arc<SharedCandidate>,
    /// Its own cost (edges to other ops excluded).
    pub cost: CostSplit,
    /// The seconds of `cost.redistribution` that bring the network inputs the op reads to
    /// this candidate's layouts (its edges from the dataset, in sharding propagation).
    pub dataset: f64,
}

/// What identical ops' candidates have in common.
#[derive(Debug)]
pub struct SharedCandidate {
    /// Split count per logical dimension of the op.
    pub splits: Vec<usize>,
    /// The strategy and the layouts it gives.
    pub layouts: OpLayouts,
    /// Compute, in-op communication and the output's memory.
    own: CostSplit,
    /// The pricer's ids of its input layouts (edges look redistributions up by id).
    input_ids: Vec<u32>,
    /// The pricer's id of its output with the partial sums completed (what consumers read).
    output_id: u32,
}

impl std::ops::Deref for Candidate {
    type Target = SharedCandidate;
    fn deref(&self) -> &SharedCandidate {
        &self.shared
    }
}

/// An op of the cost graph.
#[derive(Clone, Debug)]
pub struct SearchOp {
    /// The op's node.
    pub node: NodeId,
    /// The op's name.
    pub name: String,
    /// The op's kind.
    pub kind: &'static str,
    /// The op's sharding description.
    pub spec: OpSpec,
    /// Set by the user or a strategy file: its one candidate is that strategy.
    pub configured: Option<StrategySource>,
    /// The strategies the op may take.
    pub candidates: Vec<Candidate>,
    /// The tensors it reads.
    pub inputs: usize,
    /// How many of them are network inputs.
    pub dataset_inputs: usize,
}

/// An edge of the cost graph: how its redistribution seconds are found for a pair of
/// candidates (computed on demand and cached).
#[derive(Clone, Debug)]
pub struct EdgeRecipe {
    /// The producer's index in `CostGraph::ops`.
    pub from: usize,
    /// The consumer's index in `CostGraph::ops`.
    pub to: usize,
    /// The consumer's input slot.
    slot: usize,
    /// The producer is a parameter's home op: the layout is its input `slot` (None: its output).
    param_slot: Option<usize>,
    /// The pricer's id of the reshapes between producer and consumer (their output shapes, in order).
    chain: u32,
    elem: usize,
    /// `elementwise_op_strategy_follow`: the pair is allowed only without redistribution.
    follow: bool,
}

/// The cost graph of a network.
pub struct CostGraph {
    /// Every op with a sharding rule, with its candidates.
    pub ops: Vec<SearchOp>,
    /// Graph node -> op index.
    pub of_node: Vec<Option<usize>>,
    /// Every producer-consumer edge between two different ops.
    pub edges: Vec<EdgeRecipe>,
    /// The search options the costs are weighted with.
    pub options: SearchOptions,
    /// What the figures are.
    pub units: CostUnits,
    /// The objective's weights.
    pub weights: Weights,
    pricer: RefCell<Pricer>,
}

impl CostGraph {
    /// Redistribution seconds of edge `e` (unweighted) when its producer takes candidate `a`
    /// and its consumer `b`.
    pub fn edge_seconds(&self, e: usize, a: usize, b: usize) -> f64 {
        let r = &self.edges[e];
        let from = &self.ops[r.from].candidates[a];
        let src = match r.param_slot {
            Some(slot) => from.input_ids[slot],
            None => from.output_id,
        };
        let dst_id = self.ops[r.to].candidates[b].input_ids[r.slot];
        let mut p = self.pricer.borrow_mut();
        let (pre, src_id) = p.through_id(src, r.chain, r.elem);
        // MindSpore gives a parameter several ops read one layout for all (its TmpIdentity's
        // edges allow no redistribution).
        let redist = p.redist_ids(src_id, dst_id, r.elem);
        // MindSpore's shared-parameter node compares placements, not device matrices: a pair
        // is allowed when no data moves between the two layouts (whatever the weights).
        let shared = self.units == CostUnits::MindSpore && r.param_slot.is_some() && p.moves(src_id, dst_id);
        let forbidden = if (r.follow && src_id != dst_id) || shared { FORBIDDEN } else { 0.0 };
        pre + redist + forbidden
    }

    /// The weighted problem with every edge's table filled (the elimination searches).
    pub fn problem(&self) -> CostProblem {
        CostProblem {
            unary: (0..self.ops.len()).map(|k| (0..self.domain(k)).map(|c| self.unary(k, c)).collect()).collect(),
            edges: (0..self.edges.len())
                .map(|e| {
                    let (from, to) = self.ends(e);
                    let (du, dv) = (self.domain(from), self.domain(to));
                    EdgeCost { from, to, cost: (0..du * dv).map(|i| self.edge(e, i / dv, i % dv)).collect() }
                })
                .collect(),
        }
    }

    /// One signature per op, equal for two ops only when they are interchangeable in a search:
    /// the same candidates (shared, in the same order, at the same own costs), both configured
    /// or both not, and the same incoming edges (input slot, what the producer gives, the
    /// reshapes between) from producers the same number of ops back, or, for a parameter
    /// several ops read (a mask every layer adds), from the same op (the one whose layout the
    /// parameter takes). The copies of a repeated block (a network's layers) have equal
    /// signatures position by position.
    pub fn signatures(&self) -> Vec<usize> {
        let mut incoming: Vec<Vec<u64>> = vec![Vec::new(); self.ops.len()];
        for e in &self.edges {
            let (producer, param) = match e.param_slot {
                Some(slot) => (e.from as u64, slot as u64),
                None => ((e.to as i64 - e.from as i64) as u64, u64::MAX),
            };
            incoming[e.to].extend([producer, e.slot as u64, param, e.chain as u64, e.elem as u64, e.follow as u64]);
        }
        let mut ids: FastMap<Vec<u64>, usize> = FastMap::default();
        self.ops
            .iter()
            .zip(incoming)
            .map(|(op, edges)| {
                let mut key = vec![op.configured.is_some() as u64, op.candidates.len() as u64];
                for c in &op.candidates {
                    let s = &c.cost;
                    key.extend([Arc::as_ptr(&c.shared) as usize as u64, s.compute.to_bits(), s.communication.to_bits()]);
                    key.extend([s.redistribution.to_bits(), s.gradient_sync.to_bits(), s.memory]);
                }
                key.extend(edges);
                let next = ids.len();
                *ids.entry(key).or_insert(next)
            })
            .collect()
    }

    /// Each op's representative when the copies of every repeated block are tied to one
    /// choice: copies of a block of at least two ops repeated back to back
    /// ([`super::solve::tandem_repeats`] over [`CostGraph::signatures`]) take the first copy's
    /// op at the same position; every other op is its own.
    pub fn tied_ops(&self) -> (Vec<usize>, Vec<Repeat>) {
        let repeats = tandem_repeats(&self.signatures(), 2);
        let mut rep: Vec<usize> = (0..self.ops.len()).collect();
        for r in &repeats {
            for k in r.span() {
                rep[k] = r.start + (k - r.start) % r.period;
            }
        }
        (rep, repeats)
    }

    /// The weighted problem with the ops tied as `rep` says: each op merged into `rep[k]`
    /// (which has the same candidates), a merged op's own cost the sum of its members', an
    /// edge between members of two merged ops joining those (inside one merged op, on its
    /// diagonal). The edges that tying makes alike (the same recipe between the same
    /// representatives) are priced once, so a deep network's problem costs what one block's
    /// does. Returns it and each op's index in it (merged ops numbered by first member).
    pub fn tied_problem(&self, rep: &[usize]) -> (CostProblem, Vec<usize>) {
        let domains: Vec<usize> = (0..self.ops.len()).map(|k| self.domain(k)).collect();
        let (index, merged) = tied_index(rep, &domains);
        let unary = self.merged_sums(&index, merged.len(), |k, c| self.unary(k, c));
        // Edges alike after tying: (representatives, recipe) -> (an edge, how many).
        let mut alike: BTreeMap<TiedEdge, (usize, f64)> = BTreeMap::new();
        for (i, e) in self.edges.iter().enumerate() {
            let key = (rep[e.from], rep[e.to], e.slot, e.param_slot, e.chain, e.elem, e.follow);
            alike.entry(key).or_insert((i, 0.0)).1 += 1.0;
        }
        let mut edges: Vec<EdgeCost> = Vec::new();
        let mut at: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        for &(e, times) in alike.values() {
            let (from, to) = self.ends(e);
            let (du, dv) = (domains[from], domains[to]);
            let cost = (0..du * dv).map(|x| {
                let c = self.edge(e, x / dv, x % dv);
                if c >= FORBIDDEN {
                    FORBIDDEN
                } else {
                    times * c
                }
            });
            let ends = (index[from], index[to]);
            match at.get(&ends) {
                Some(&j) => edges[j].cost.iter_mut().zip(cost).for_each(|(a, b)| *a = (*a + b).min(FORBIDDEN)),
                None => {
                    at.insert(ends, edges.len());
                    edges.push(EdgeCost { from: ends.0, to: ends.1, cost: cost.collect() });
                }
            }
        }
        (CostProblem { unary, edges }, index)
    }

    /// The shape of [`CostGraph::tied_problem`] (its ops and edges, without pricing them),
    /// and each op's merged op.
    pub fn tied_shape(&self, rep: &[usize]) -> (Shape, Vec<usize>) {
        let domains: Vec<usize> = (0..self.ops.len()).map(|k| self.domain(k)).collect();
        let (index, merged) = tied_index(rep, &domains);
        let ends: std::collections::BTreeSet<(usize, usize)> = self.edges.iter().map(|e| (index[e.from], index[e.to])).collect();
        (Shape { domains: merged, ends: ends.into_iter().collect() }, index)
    }

    /// Whether dynamic_programming's elimination of this graph (its repeated blocks tied) stays
    /// small: about `pairs` candidate pairs to price over its edges at most (counted once per
    /// pair of ops joined) and `entries` per elimination step.
    pub fn small_for_elimination(&self, pairs: u128, entries: u128) -> bool {
        let (rep, found) = self.tied_ops();
        let rep: Vec<usize> = if found.is_empty() { (0..self.ops.len()).collect() } else { rep };
        let (shape, _) = self.tied_shape(&rep);
        let priced: u128 = shape.ends.iter().map(|&(a, b)| shape.domains[a] as u128 * shape.domains[b] as u128).sum();
        priced <= pairs && super::solve::check_width(&shape, super::solve::Order::Eliminations, entries).is_ok()
    }

    /// The costs [`CostGraph::problem`] would hold: every op's candidates and every edge's pairs.
    pub fn problem_size(&self) -> u128 {
        let d = |k: usize| self.ops[k].candidates.len() as u128;
        (0..self.ops.len()).map(d).sum::<u128>() + self.edges.iter().map(|e| d(e.from) * d(e.to)).sum::<u128>()
    }

    /// What a redistribution figure is weighted with in the objective: `costmodel_beta` in
    /// seconds; MindSpore's are weighted already.
    fn redistribution_weight(&self) -> f64 {
        match self.units {
            CostUnits::Seconds => self.weights.beta,
            CostUnits::MindSpore => 1.0,
        }
    }

    /// The memory per device of `choice`: its ops' memory summed (bytes).
    pub fn memory_of(&self, choice: &[usize]) -> u64 {
        self.ops.iter().zip(choice).map(|(op, &c)| op.candidates[c].cost.memory).sum()
    }

    /// Each merged op's memory per candidate when op `k` is merged into `index[k]` (of
    /// `merged` ops): the sum of its members' (bytes).
    pub fn memory_table(&self, index: &[usize], merged: usize) -> Vec<Vec<f64>> {
        self.merged_sums(index, merged, |k, c| self.ops[k].candidates[c].cost.memory as f64)
    }

    /// `value(op, candidate)` summed per candidate over the members of each merged op, when op
    /// `k` is merged into `index[k]` (of `merged` ops, whose members share their candidates).
    fn merged_sums(&self, index: &[usize], merged: usize, value: impl Fn(usize, usize) -> f64) -> Vec<Vec<f64>> {
        let mut table: Vec<Vec<f64>> = vec![Vec::new(); merged];
        for (k, &i) in index.iter().enumerate() {
            let t = &mut table[i];
            t.resize(self.ops[k].candidates.len(), 0.0);
            t.iter_mut().enumerate().for_each(|(c, x)| *x += value(k, c));
        }
        table
    }

    /// Each op's cost under `choice`, edge redistributions charged to the consumer.
    pub fn split_of(&self, choice: &[usize]) -> Vec<CostSplit> {
        let mut out: Vec<CostSplit> = self.ops.iter().zip(choice).map(|(op, &c)| op.candidates[c].cost).collect();
        for (i, e) in self.edges.iter().enumerate() {
            let s = self.edge_seconds(i, choice[e.from], choice[e.to]);
            if s < FORBIDDEN {
                out[e.to].redistribution += s;
            }
        }
        out
    }
}

/// The weighted objective, computed on demand.
impl Costs for CostGraph {
    fn ops(&self) -> usize {
        self.ops.len()
    }
    fn domain(&self, op: usize) -> usize {
        self.ops[op].candidates.len()
    }
    fn unary(&self, op: usize, c: usize) -> f64 {
        self.ops[op].candidates[c].cost.weighted(self.weights, self.units)
    }
    fn edge_count(&self) -> usize {
        self.edges.len()
    }
    fn ends(&self, e: usize) -> (usize, usize) {
        (self.edges[e].from, self.edges[e].to)
    }
    fn edge(&self, e: usize, a: usize, b: usize) -> f64 {
        let s = self.edge_seconds(e, a, b);
        if s >= FORBIDDEN {
            FORBIDDEN
        } else {
            self.redistribution_weight() * s
        }
    }
    fn inputs(&self, op: usize) -> (usize, usize) {
        (self.ops[op].inputs, self.ops[op].dataset_inputs)
    }
    fn dataset(&self, op: usize, c: usize) -> f64 {
        self.redistribution_weight() * self.ops[op].candidates[c].dataset
    }
    fn replicated(&self, op: usize) -> Option<usize> {
        self.ops[op].candidates.iter().position(|c| c.splits.iter().all(|&s| s == 1))
    }
    /// MindSpore generates strategies input by input, dimension by dimension, each split
    /// growing from 1: lexicographic order of the strategy's splits.
    fn generation_key(&self, op: usize, c: usize) -> Vec<usize> {
        self.ops[op].candidates[c].layouts.strategy.0.iter().flatten().copied().collect()
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
    /// A network input, as the dataset gives it.
    Dataset(TensorLayout),
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
    /// Keep only candidates using every device or none (`fully_use_devices`).
    pub full_use: bool,
    /// What the costs are.
    pub units: CostUnits,
    /// The objective's weights (None: [`CostUnits::weights`] of the context).
    pub weights: Option<Weights>,
    /// Candidates ordered as MindSpore's cost lists, where ties go under MindSpore's cost
    /// model: the least computation first (its units, its tie-break for data parallelism), then
    /// generation order (each logical dimension's split growing from 1, the first outermost);
    /// otherwise those using more devices first, then those splitting the batch more.
    pub generation_order: bool,
}

struct Builder<'a> {
    b: &'a Build<'a>,
    n: usize,
}

/// Prices layouts and redistributions, with caches: the part of the builder the cost graph
/// keeps to cost edges on demand.
struct Pricer {
    profile: DeviceProfile,
    units: CostUnits,
    weights: Weights,
    training: bool,
    all_to_all: bool,
    n: usize,
    /// Every layout priced: its id, and the layout of each id.
    ids: FastMap<TensorLayout, u32>,
    layouts: Vec<TensorLayout>,
    /// Every chain of reshapes (their output shapes): its id, and the chain of each id (0: none).
    chain_ids: FastMap<Vec<Vec<usize>>, u32>,
    chains: Vec<Vec<Vec<usize>>>,
    /// (source id, destination id, element size) -> seconds.
    cache: FastMap<(u32, u32, usize), f64>,
    /// (layout id, chain id, element size) -> seconds through the reshapes and the id of the layout after them.
    through_cache: FastMap<(u32, u32, usize), (f64, u32)>,
    /// (source id, destination id) -> whether data moves between them.
    moves_cache: FastMap<(u32, u32), bool>,
}

/// FxHash's multiply-and-rotate: the cost graph hashes millions of small keys, where the
/// standard library's DoS-resistant hasher dominated planning time.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Build the cost graph.
pub(crate) fn build(b: &Build<'_>) -> Result<CostGraph> {
    let n = b.context.devices();
    let bl = Builder { b, n };
    let weights = b.weights.unwrap_or_else(|| b.units.weights(b.context));
    let mut pr = Pricer {
        profile: b.profile.clone(),
        units: b.units,
        weights,
        training: b.training,
        all_to_all: b.context.enable_alltoall,
        n,
        ids: FastMap::default(),
        layouts: Vec::new(),
        chain_ids: FastMap::from_iter([(Vec::new(), 0)]),
        chains: vec![Vec::new()],
        cache: FastMap::default(),
        through_cache: FastMap::default(),
        moves_cache: FastMap::default(),
    };
    let (roles, mut ops) = bl.search_ops(&mut pr)?;
    let of_node: Vec<Option<usize>> = roles.iter().map(|r| if let Role::Op(k) = r { Some(*k) } else { None }).collect();
    let param_home = bl.price_parameters(&roles, &of_node, &mut ops);
    if b.units == CostUnits::MindSpore {
        bl.finish_mindspore(&mut ops, weights.gamma);
    }
    bl.drop_over_capacity(&mut ops)?;
    let edges = bl.consumer_edges(&mut pr, &roles, &param_home, &of_node, &mut ops);
    Ok(CostGraph { ops, of_node, edges, options: b.context.search.clone(), units: b.units, weights, pricer: RefCell::new(pr) })
}

/// Where each parameter's layout is decided: its first consumer op and the slot it reads it in.
type ParamHomes = BTreeMap<NodeId, (usize, usize)>;

impl Builder<'_> {
    /// Every node's role, and the ops the search decides with their candidates, each priced
    /// with its own cost (ops alike in everything the candidates depend on share them).
    fn search_ops(&self, pr: &mut Pricer) -> Result<(Vec<Role>, Vec<SearchOp>)> {
        let (b, bl, n) = (self.b, self, self.n);
        let g = b.graph;
        let nodes = g.nodes();
        // Roles and candidates.
        let on_data = depends_on_inputs(g);
        let mut roles = Vec::with_capacity(nodes.len());
        let mut ops: Vec<SearchOp> = Vec::new();
        let mut alike: HashMap<String, Arc<[Arc<SharedCandidate>]>> = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            let role = match (&node.op, &b.rules[i]) {
                (OpKind::Input(_), _) => Role::Input,
                (OpKind::Parameter(_), _) => Role::Parameter,
                (_, ShardingRule::Spec(spec)) => {
                    let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &g.node(*x).ty).collect();
                    // Each candidate's strategy, layouts, own cost and layout ids.
                    // A user's MindSpore `Layout` is priced on its own device matrix, as it runs.
                    let mut price =
                        |all: Vec<Vec<usize>>, named: Option<&autopar_layout::NamedLayout>| -> Result<Arc<[Arc<SharedCandidate>]>> {
                            let mut priced = all
                                .into_iter()
                                .map(|splits| {
                                    let layouts = spec.layouts_for(node.op.kind(), &node.name, &ins, &node.ty, &splits, named, n)?;
                                    let own = bl.own_cost(node.op.def(), spec, &layouts, node.ty.dtype, node.recompute);
                                    let input_ids = layouts.inputs.iter().map(|l| pr.id(l)).collect();
                                    let output_id = pr.id(&whole_values(&layouts.output));
                                    Ok(Arc::new(SharedCandidate { splits, layouts, own, input_ids, output_id }))
                                })
                                .collect::<Result<Vec<_>>>()?;
                            if b.generation_order {
                                // MindSpore's cost lists keep the least computation first, then
                                // generation order: where totals tie, so do autopar's.
                                let key = |c: &SharedCandidate| bl.mindspore_computation(node.op.kind(), &c.layouts, node.ty.dtype);
                                priced.sort_by(|a, b| key(a).total_cmp(&key(b)));
                            }
                            Ok(priced.into())
                        };
                    let (shared, configured) = match &b.fixed[i] {
                        Some((s, src)) => (price(vec![s.clone()], src.user_layout(node, &spec.strategy_of(s)))?, Some(*src)),
                        None => {
                            let batch = batch_dim(spec, node, &on_data);
                            // Ops alike in everything the candidates depend on share them (a
                            // dropout's seed changes its mask, not its strategies or costs).
                            let op = match &node.op {
                                OpKind::Dropout(d) => OpKind::Dropout(autopar_graph::ops::Dropout { seed: 0, ..d.clone() }),
                                op => op.clone(),
                            };
                            let key = format!("{op:?}|{spec:?}|{ins:?}|{:?}|{batch:?}|{:?}", node.ty, node.recompute);
                            let shared = match alike.get(&key) {
                                Some(shared) => Arc::clone(shared),
                                None => {
                                    let shared = price(bl.candidate_splits(spec, node.op.kind(), &ins, batch), None)?;
                                    alike.insert(key, Arc::clone(&shared));
                                    shared
                                }
                            };
                            (shared, None)
                        }
                    };
                    let candidates = shared.iter().map(|c| Candidate { shared: Arc::clone(c), cost: c.own, dataset: 0.0 }).collect();
                    ops.push(SearchOp {
                        node: NodeId(i),
                        name: node.name.clone(),
                        kind: node.op.kind(),
                        spec: spec.clone(),
                        configured,
                        candidates,
                        inputs: node.inputs.len(),
                        dataset_inputs: 0,
                    });
                    Role::Op(ops.len() - 1)
                }
                (_, ShardingRule::FollowInput) => Role::Follow,
                (_, ShardingRule::Replicated) | (_, ShardingRule::Unsupported(_)) => Role::Whole,
            };
            roles.push(role);
        }
        Ok((roles, ops))
    }

    /// Parameters: the first consumer decides the layout and pays the memory and the gradient
    /// sync. Returns each parameter's home (consumer node, slot).
    fn price_parameters(&self, roles: &[Role], of_node: &[Option<usize>], ops: &mut [SearchOp]) -> ParamHomes {
        let (b, n) = (self.b, self.n);
        let g = b.graph;
        let nodes = g.nodes();
        // Parameters: the first consumer decides the layout and pays the gradient sync.
        // param -> (consumer node, slot)
        let param_home: BTreeMap<NodeId, (usize, usize)> = (0..nodes.len())
            .map(NodeId)
            .filter(|&id| matches!(roles[id.0], Role::Parameter))
            .filter_map(|id| first_use(g, id).map(|(c, slot)| (id, (c.0, slot))))
            .collect();
        for (&param, &(consumer, slot)) in &param_home {
            let Some(k) = of_node[consumer] else { continue };
            let OpKind::Parameter(p) = &g.node(param).op else { continue };
            let elem = p.dtype.size();
            for c in &mut ops[k].candidates {
                let l = &c.shared.layouts.inputs[slot];
                let bytes = l.slice_len() * elem;
                let sharded = parameter_memory(l, p, b.training, b.context);
                c.cost.memory += sharded.bytes;
                if b.units == CostUnits::MindSpore {
                    continue; // its gradients are priced per use (`mindspore_gradients`)
                }
                let replicas = n / l.num_slices().max(1);
                if b.training && p.trainable && replicas > 1 {
                    let sent = (2 * bytes * (replicas - 1)).div_ceil(replicas);
                    c.cost.gradient_sync += b.profile.bandwidth_time(replicas, sent);
                }
                if let Some(shard) = sharded.gathered_again {
                    // Level3's second all-gather of the slice, for the backward pass.
                    c.cost.gradient_sync += b.profile.bandwidth_time(shard, (bytes * (shard - 1)).div_ceil(shard));
                }
            }
        }
        if b.units == CostUnits::MindSpore && b.training {
            self.mindspore_gradients(roles, ops);
        }
        param_home
    }

    /// MindSpore's backward communication: every op that reads a trainable parameter directly,
    /// in an input its cost class counts, all-reduces the gradient of its slice when its
    /// strategy for that input does not use every device (bytes, in `gradient_sync` until
    /// [`Builder::finish_mindspore`]).
    fn mindspore_gradients(&self, roles: &[Role], ops: &mut [SearchOp]) {
        let g = self.b.graph;
        for (i, node) in g.nodes().iter().enumerate() {
            let Role::Op(k) = roles[i] else { continue };
            let counts = ms::gradient_inputs(node.op.kind());
            for (slot, x) in node.inputs.iter().enumerate() {
                // A precision policy's cast of a weight passes its gradient through.
                let mut x = *x;
                while let OpKind::Cast(c) = &g.node(x).op {
                    if !c.inserted {
                        break;
                    }
                    x = g.node(x).inputs[0];
                }
                let OpKind::Parameter(p) = &g.node(x).op else { continue };
                if !p.trainable || !counts.counts(slot) {
                    continue;
                }
                for c in &mut ops[k].candidates {
                    let l = &c.shared.layouts.inputs[slot];
                    if l.num_slices() != self.n {
                        c.cost.gradient_sync += (l.slice_len() * p.dtype.size()) as f64;
                    }
                }
            }
        }
    }

    /// MindSpore's tie-break for data parallelism and its refinement, on every candidate's
    /// forward computation, forward communication and gradients: `compute` and
    /// `communication` become what the objective weights with α and β.
    fn finish_mindspore(&self, ops: &mut [SearchOp], gamma: f64) {
        for op in ops {
            for c in &mut op.candidates {
                let first_split_all = c.shared.layouts.strategy.0.first().and_then(|d| d.first()) == Some(&self.n);
                let s = &mut c.cost;
                let (computation, communication) =
                    ms::op_cost(s.compute, s.communication, s.gradient_sync, first_split_all, gamma, self.b.training);
                (s.compute, s.communication, s.gradient_sync) = (computation, communication, 0.0);
            }
        }
    }

    /// Candidates needing more than a device holds are dropped; an op left with none is an error
    /// naming its largest tensors.
    fn drop_over_capacity(&self, ops: &mut [SearchOp]) -> Result<()> {
        let b = self.b;
        let g = b.graph;
        // Memory capacity: candidates needing more than a device holds are dropped.
        let cap = b.context.search.device_memory_capacity;
        for op in ops.iter_mut() {
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
            op.candidates.retain(|c| c.cost.memory <= cap);
        }
        Ok(())
    }

    /// Consumers: edges between ops, fixed layouts (inputs, the dataset, values needed whole)
    /// priced as the ops' own costs.
    fn consumer_edges(
        &self,
        pr: &mut Pricer,
        roles: &[Role],
        param_home: &ParamHomes,
        of_node: &[Option<usize>],
        ops: &mut [SearchOp],
    ) -> Vec<EdgeRecipe> {
        let (b, bl, n) = (self.b, self, self.n);
        let g = b.graph;
        let nodes = g.nodes();
        // Consumers: edges between ops, fixed layouts as own costs.
        let mut edges: Vec<EdgeRecipe> = Vec::new();
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
        // MindSpore's graph outputs ask for no layout.
        if b.units == CostUnits::Seconds {
            uses.extend(g.outputs.iter().take(gathered).map(|&o| (None, o)));
        }
        for (consumer, x) in uses {
            let (source, chain) = bl.source_of(x, roles, param_home, of_node);
            let chain: Vec<Vec<usize>> = chain.iter().map(|f| g.node(*f).ty.shape.clone()).collect();
            let elem = g.node(x).ty.dtype.size();
            let producer = match &source {
                Source::Op(u) | Source::ParamOf { op: u, .. } => Some(*u),
                Source::Fixed(_) | Source::Dataset(_) => None,
            };
            match (producer, consumer) {
                (None, None) => {}
                (None, Some((k, slot))) => {
                    let (l, dataset) = match source {
                        Source::Fixed(l) => (l, false),
                        Source::Dataset(l) => (l, true),
                        _ => unreachable!("a source without an op is fixed"),
                    };
                    let (pre, l) = pr.through(l, &chain, elem);
                    ops[k].dataset_inputs += usize::from(dataset);
                    for c in &mut ops[k].candidates {
                        let t = pre + pr.redist(&l, &c.layouts.inputs[slot], elem);
                        c.cost.redistribution += t;
                        if dataset {
                            c.dataset += t;
                        }
                    }
                }
                (Some(u), None) => {
                    let all = whole(n, &g.node(x).ty.shape);
                    for cu in 0..ops[u].candidates.len() {
                        let (pre, l) = pr.through(source_layout(&ops[u], cu, &source), &chain, elem);
                        ops[u].candidates[cu].cost.redistribution += pre + pr.redist(&l, &all, elem);
                    }
                }
                (Some(u), Some((k, slot))) => {
                    let param_slot = match source {
                        Source::ParamOf { slot: home, .. } if u == k && home == slot && chain.is_empty() => continue, // its own layout
                        Source::ParamOf { slot: home, .. } => Some(home),
                        _ => None,
                    };
                    if u == k {
                        // The same op reads a value twice: its own cost.
                        for c in 0..ops[u].candidates.len() {
                            let (pre, l) = pr.through(source_layout(&ops[u], c, &source), &chain, elem);
                            let t = pre + pr.redist(&l, &ops[k].candidates[c].layouts.inputs[slot], elem);
                            ops[k].candidates[c].cost.redistribution += t;
                        }
                        continue;
                    }
                    let follow = b.context.search.elementwise_op_strategy_follow && slot == 0 && is_elementwise(&ops[k].spec);
                    let chain = pr.chain_id(chain);
                    edges.push(EdgeRecipe { from: u, to: k, slot, param_slot, chain, elem, follow });
                }
            }
        }
        edges
    }
}

/// An edge once its ends are tied: (producer's and consumer's representatives, the consumer's
/// slot, the parameter slot, the reshape chain, the element size, follow); edges with the same
/// key have the same costs.
type TiedEdge = (usize, usize, usize, Option<usize>, u32, usize, bool);

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
        if self.b.full_use {
            let most = all.iter().map(|s| s.iter().product::<usize>()).max().unwrap_or(1);
            all.retain(|s| {
                let used = s.iter().product::<usize>();
                used == 1 || used == most
            });
        }
        // Ties go to the lower index in every search: candidates using more devices come
        // first, then those splitting the batch more (MindSpore's preference for data
        // parallelism); under MindSpore's cost model, MindSpore's generation order, which
        // pricing then sorts by computation as MindSpore's cost lists are.
        if !self.b.generation_order {
            all.sort_by_key(|s| (std::cmp::Reverse(s.iter().product::<usize>()), std::cmp::Reverse(batch.map_or(1, |b| s[b]))));
        }
        all
    }

    /// An op's own cost under one candidate: its compute (forward, and in training the backward
    /// pass at twice that, plus the forward again for an op marked for recomputation), the
    /// collectives completing it, and the activation it keeps for the backward pass (none for
    /// a recomputed op, whose value is recomputed when the backward pass needs it).
    fn own_cost(
        &self,
        def: &dyn autopar_graph::OpDef,
        spec: &OpSpec,
        l: &OpLayouts,
        dtype: autopar_graph::DType,
        recompute: Recompute,
    ) -> CostSplit {
        let p = self.b.profile;
        let ins: Vec<TensorType> = l.inputs.iter().map(|x| TensorType { shape: x.slice_shape(), dtype }).collect();
        // Input dtypes: the layouts carry shapes only; the cost rules read sizes.
        let out = TensorType { shape: l.output.slice_shape(), dtype };
        let recomputed = self.b.training && recompute == Recompute::Marked;
        let out_bytes = out.numel() * dtype.size();
        let kept = if recomputed { 0 } else { out_bytes as u64 };
        if self.b.units == CostUnits::MindSpore {
            // The forward computation and communication, bytes; the parameters' gradients and
            // MindSpore's refinement come once the op's inputs are known (`finish_mindspore`).
            let bytes = |t: &TensorType| (t.numel() * dtype.size()) as f64;
            let split = !l.output.partial_axes().is_empty();
            let (computation, forward) = ms::op_bytes(def.kind(), &ins.iter().map(bytes).collect::<Vec<_>>(), bytes(&out), split);
            return CostSplit { compute: computation, communication: forward, redistribution: 0.0, gradient_sync: 0.0, memory: kept };
        }
        let c = def.cost(&CostCx { inputs: &ins, output: &out, rank: 0 });
        let passes = match (self.b.training, recomputed) {
            (false, _) => 1.0,
            (true, false) => 3.0,
            (true, true) => 4.0,
        };
        let compute = passes * p.compute_time(c.flops, c.bytes);
        let mut communication = 0.0;
        let partial: usize = l.output.partial_axes().iter().map(|&a| l.mesh.dims()[a]).product();
        if partial > 1 {
            // The all-reduce completing the partial sums, and in training its adjoint (an
            // all-reduce of the gradient), and again when the op is recomputed.
            let passes = match (self.b.training, recomputed) {
                (false, _) => 1.0,
                (true, false) => 2.0,
                (true, true) => 3.0,
            };
            communication += passes * p.comm_time(partial, (2 * out_bytes * (partial - 1)).div_ceil(partial));
        }
        if let Tie::Stats(dims) = &spec.tie {
            let group: usize = dims.iter().map(|&d| l.splits[d]).product();
            if group > 1 {
                // One (sum, sum of squares) pair of f64 per statistic: per local position
                // along the op's other logical dimensions.
                let count: usize = (0..spec.dims.len()).filter(|d| !dims.contains(d)).map(|d| spec.dims[d].size / l.splits[d]).product();
                let passes = match (self.b.training, recomputed) {
                    (false, _) => 1.0,
                    (true, false) => 2.0,
                    (true, true) => 3.0,
                };
                communication += passes * p.comm_time(group, 16 * count);
            }
        }
        CostSplit { compute, communication, redistribution: 0.0, gradient_sync: 0.0, memory: kept }
    }

    /// An op's forward computation in MindSpore's units under layouts `l`, its tie-break for
    /// data parallelism applied (the key MindSpore's cost lists are sorted by).
    fn mindspore_computation(&self, kind: &str, l: &OpLayouts, dtype: autopar_graph::DType) -> f64 {
        let bytes = |t: &TensorLayout| (t.slice_len() * dtype.size()) as f64;
        let ins: Vec<f64> = l.inputs.iter().map(bytes).collect();
        let (computation, _) = ms::op_bytes(kind, &ins, bytes(&l.output), !l.output.partial_axes().is_empty());
        let first_split_all = l.strategy.0.first().and_then(|d| d.first()) == Some(&self.n);
        if first_split_all && computation > 1.0 {
            computation - 1.0
        } else {
            computation
        }
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
                    let l = self.b.input_layouts[x.0].clone().unwrap_or_else(|| whole(self.n, &g.node(x).ty.shape));
                    return (Source::Dataset(l), chain);
                }
                Role::Whole => {
                    chain.reverse();
                    return (Source::Fixed(whole(self.n, &g.node(x).ty.shape)), chain);
                }
                Role::Parameter => {
                    chain.reverse();
                    let home = homes.get(&x).and_then(|&(c, slot)| of_node[c].map(|op| (op, slot)));
                    return match home {
                        Some((op, slot)) => (Source::ParamOf { op, slot }, chain),
                        None => (Source::Fixed(whole(self.n, &g.node(x).ty.shape)), chain),
                    };
                }
            }
        }
    }
}

/// `shape` whole on each of `n` devices.
fn whole(n: usize, shape: &[usize]) -> TensorLayout {
    TensorLayout::replicated(autopar_layout::DeviceMatrix::flat(n).expect("n >= 1"), shape.to_vec())
}

/// The layout a source gives under candidate `c` of its op: the op's output with its partial
/// sums completed (the op pays for that), or the parameter's home layout.
fn source_layout(op: &SearchOp, c: usize, src: &Source) -> TensorLayout {
    let l = &op.candidates[c].layouts;
    match src {
        Source::ParamOf { slot, .. } => l.inputs[*slot].clone(),
        _ => whole_values(&l.output),
    }
}

impl Pricer {
    /// A layout passed through reshapes (their output shapes, in order): the redistribution
    /// seconds on the way and the layout at the end.
    fn through(&mut self, mut l: TensorLayout, chain: &[Vec<usize>], elem: usize) -> (f64, TensorLayout) {
        let mut t = 0.0;
        for shape in chain {
            let np = whole_values(&l);
            t += self.redist(&l, &np, elem);
            if self.units == CostUnits::MindSpore && np.shape() != shape.as_slice() {
                // MindSpore's reshape: twice its slice in computation (a pass-through that
                // keeps the shape, such as a precision cast, is no reshape).
                t += self.weights.alpha * (2 * np.slice_len() * elem) as f64;
            }
            l = match reshape_layout(&np, shape) {
                Some(o) => o,
                None => {
                    let w = whole(self.n, np.shape());
                    t += self.redist(&np, &w, elem);
                    whole(self.n, shape)
                }
            };
        }
        (t, l)
    }

    /// [`Pricer::through`] of the layout and chain of these ids: the seconds and the id of
    /// the layout at the end.
    fn through_id(&mut self, src: u32, chain: u32, elem: usize) -> (f64, u32) {
        if chain == 0 {
            return (0.0, src);
        }
        if let Some(&hit) = self.through_cache.get(&(src, chain, elem)) {
            return hit;
        }
        let shapes = self.chains[chain as usize].clone();
        let (t, l) = self.through(self.layouts[src as usize].clone(), &shapes, elem);
        let out = (t, self.id(&l));
        self.through_cache.insert((src, chain, elem), out);
        out
    }

    /// Seconds of the redistribution from `src` to `dst` (forward and, in training, backward).
    fn redist(&mut self, src: &TensorLayout, dst: &TensorLayout, elem: usize) -> f64 {
        let (s, d) = (self.id(src), self.id(dst));
        self.redist_ids(s, d, elem)
    }

    /// The id of layout `l` (a new one the first time).
    fn id(&mut self, l: &TensorLayout) -> u32 {
        if let Some(&i) = self.ids.get(l) {
            return i;
        }
        let i = self.layouts.len() as u32;
        self.ids.insert(l.clone(), i);
        self.layouts.push(l.clone());
        i
    }

    /// The id of a chain of reshapes (their output shapes; 0 for none).
    fn chain_id(&mut self, chain: Vec<Vec<usize>>) -> u32 {
        if let Some(&i) = self.chain_ids.get(&chain) {
            return i;
        }
        let i = self.chains.len() as u32;
        self.chain_ids.insert(chain.clone(), i);
        self.chains.push(chain);
        i
    }

    /// Whether data moves from layout `sid` to layout `did`: their redistribution has steps
    /// (layouts of one placement on different device matrices move nothing).
    fn moves(&mut self, sid: u32, did: u32) -> bool {
        if sid == did {
            return false;
        }
        if let Some(&m) = self.moves_cache.get(&(sid, did)) {
            return m;
        }
        let (src, dst) = (&self.layouts[sid as usize], &self.layouts[did as usize]);
        let m = plan_with(src, dst, false).map_or(true, |p| !p.steps.is_empty());
        self.moves_cache.insert((sid, did), m);
        m
    }

    /// [`Pricer::redist`] of layouts by id.
    fn redist_ids(&mut self, sid: u32, did: u32, elem: usize) -> f64 {
        if sid == did {
            return 0.0;
        }
        let key = (sid, did, elem);
        if let Some(&t) = self.cache.get(&key) {
            return t;
        }
        let (src, dst) = (&self.layouts[sid as usize], &self.layouts[did as usize]);
        let t = match plan_with(src, dst, false) {
            Ok(p) => {
                let p = if self.all_to_all { Ok(p) } else { p.without_all_to_all() };
                match p {
                    Ok(p) if self.units == CostUnits::MindSpore => {
                        ms::redistribution_cost(ms::redistribution_bytes(src, dst, &p, elem), self.weights, self.training)
                    }
                    Ok(p) => {
                        let mut t = 0.0;
                        for s in &p.steps {
                            if s.step.is_communication() {
                                let ranks = s.step.group(0).len();
                                let one = self.profile.comm_time(ranks, s.step.bytes_sent(s.input_len, elem));
                                // In training each collective's adjoint runs too (all-gather <->
                                // reduce-scatter, all-reduce -> all-reduce, all-to-all back).
                                t += if self.training { 2.0 * one } else { one };
                            } else {
                                t += self.profile.compute_time(0.0, s.input_len * elem);
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

/// What a parameter of layout `l` costs a device in the search's memory model: its value, its
/// gradient and one optimizer slot, as the parallel optimizer's level keeps them
/// ([`crate::shard_rule::decide`] on the candidate's layout): whole slices unsharded;
/// sharded over `s` ranks, level1 holds the gathered slice, the stored shard, the whole
/// gradient and the state's shard (`2b + 2b/s`), level2 the slice and three shards
/// (`b + 3b/s`), level3 three shards (`3b/s`, the slice alive only around each use, gathered a
/// second time for the backward pass).
struct ParameterMemory {
    bytes: u64,
    /// Level3: the shard size of the backward pass's second all-gather.
    gathered_again: Option<usize>,
}

fn parameter_memory(l: &TensorLayout, p: &autopar_graph::ops::Parameter, training: bool, ctx: &ParallelContext) -> ParameterMemory {
    let b = (l.slice_len() * p.dtype.size()) as u64;
    let mirror: Vec<autopar_layout::DeviceAxis> = l.replica_axes().iter().map(|&a| l.mesh().axis(a)).collect();
    let full = l.shape().iter().product::<usize>() * p.dtype.size();
    let shard = crate::shard_rule::decide(&l.slice_shape(), full, &mirror, p.trainable && training, ctx);
    let Some(s) = shard.shard() else { return ParameterMemory { bytes: 3 * b, gathered_again: None } };
    let piece = b / s.size as u64;
    match ctx.parallel_optimizer_config.optimizer_level {
        crate::context::OptimizerLevel::Level1 => ParameterMemory { bytes: 2 * b + 2 * piece, gathered_again: None },
        crate::context::OptimizerLevel::Level2 => ParameterMemory { bytes: b + 3 * piece, gathered_again: None },
        crate::context::OptimizerLevel::Level3 => ParameterMemory { bytes: 3 * piece, gathered_again: Some(s.size) },
    }
}

#[cfg(test)]
mod parameter_memory_tests {
    use super::*;
    use autopar_layout::DeviceMatrix;
    use serde_json::json;

    /// A [64, 32] f32 parameter replicated over 4 devices: 8 KiB a slice.
    #[test]
    fn each_optimizer_level_keeps_less_of_a_sharded_parameter() {
        let l = TensorLayout::replicated(DeviceMatrix::new(vec![4]).unwrap(), vec![64, 32]);
        let p = autopar_graph::ops::Parameter {
            shape: vec![64, 32],
            dtype: autopar_graph::DType::F32,
            init: autopar_graph::Initializer::Zeros,
            seed: 0,
            trainable: true,
        };
        let b = 64 * 32 * 4;
        let at = |level: Option<&str>| {
            let mut ctx = ParallelContext::default();
            if let Some(level) = level {
                ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
                ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0, "optimizer_level": level})).unwrap();
            }
            let m = parameter_memory(&l, &p, true, &ctx);
            (m.bytes, m.gathered_again)
        };
        assert_eq!(at(None), (3 * b, None));
        assert_eq!(at(Some("level1")), (2 * b + 2 * b / 4, None));
        assert_eq!(at(Some("level2")), (b + 3 * b / 4, None));
        assert_eq!(at(Some("level3")), (3 * b / 4, Some(4)));
        // Inference shards nothing (the model still counts a value, a gradient and a slot).
        let mut ctx = ParallelContext::default();
        ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
        assert_eq!(parameter_memory(&l, &p, false, &ctx).bytes, 3 * b);
    }
}
