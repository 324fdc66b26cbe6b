//! The second half of `recursive_programming`: strategies for the ops its partition leaves
//! out, by MindSpore 2.10's rules (rec_core's strategy propagator: `GenerateStrategyV3` for a
//! training graph, `GenerateStrategyV1` for inference). No costs here: each op copies a
//! neighbour's strategy through a rule of its kind.
//!
//! 1. Training: the ops left out wait in a list, in the order of MindSpore's op list (a
//!    depth-first walk from the outputs, each op before its inputs). For `d` = the device count,
//!    halved down to 2, passes run until one changes nothing: a **forward** pass gives each
//!    waiting op the output strategy of its incoming op (the producer of its first input whose
//!    strategy splits something, else of its last input with a producer; never a network
//!    input); when a forward pass changes nothing, a **backward** pass gives each waiting op
//!    what its first consumer with a strategy wants of it. A copied strategy is taken only when
//!    it spans at least `d` devices. A pass walks the list from its end and leaves it reversed.
//!    Inference: the list starts reversed, and one forward then one backward pass take any
//!    strategy (no widest-first rounds).
//! 2. Then forward and backward passes that take any strategy, until the list stops
//!    shrinking; what is still waiting runs whole.
//! 3. Shared parameters. Training: a gather whose table another op also uses takes that op's
//!    split of the table. Inference: every parameter with several users takes the split of
//!    the user that cuts it over the most devices into the smallest pieces, and every other
//!    user is redone from it (a gather and a matrix product by their own rules).
//! 4. Per-kind rules turn a copied strategy into the op's: element-wise ops take it dimension
//!    by dimension from the left (a dimension of size 1 stays whole), binary ops broadcast it
//!    to the smaller input, a bias add gives the bias the channel's split, softmax and layer
//!    norm keep their last axis whole, a batched matmul reads it as its output's (k whole), a
//!    gather splits by its own shape rule, a flatten runs data parallel; reshapes, transposes
//!    and reductions map strategies between their input and output. A dimension whose size
//!    the split does not divide, or that the op cannot split, stays whole.
//!
//! Gathers pass nothing on. Reshapes and flattens follow their input's layout in autopar's
//! plan; here they take strategies like any other op so that they pass them on as MindSpore's do.

use autopar_graph::{normalize_axis, Graph, NodeId, OpKind, OpSpec};

use super::costgraph::CostGraph;

/// A tensor's strategy: the split of each of its dimensions.
type Strat = Vec<usize>;

/// The strategies of an op's inputs, in input order.
type Strats = Vec<Strat>;

/// How rec treats an op kind: in its partition graph, left to the rules, or not an op.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum RecOp {
    /// In the partition graph, cut as its kind is.
    Kept(Kind),
    /// A network input (MindSpore's VirtualDataset).
    Dataset,
    /// Left out of the partition: takes a neighbour's strategy by its kind's rule.
    Left(Rule),
    /// Not an op to rec: parameters, constants, ops run whole, backward and communication ops.
    Not,
}

/// How the partition cuts an op of its graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    /// A 2-D matrix product: i, j or k by their costs.
    MatMul,
    /// A convolution: its batch.
    Conv,
    /// Max pooling: its batch or channels.
    Pool,
    /// Batch-parallel ops (batch norm) and network inputs: the first even dimension, free.
    Batch,
    /// The loss: cut like a batch-parallel op, data parallel in the end.
    Loss,
    /// A kind rec does not know (average pooling, slices, pads): visited last, never cut.
    Unknown,
}

/// How a left-out op turns a neighbour's strategy into its own, and passes its own on.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Rule {
    /// Dimension by dimension from the left, a dimension of size 1 whole.
    Elementwise,
    /// A binary op: the copied strategy broadcast to the smaller input.
    Broadcast {
        /// Passes on its largest input's strategy (not so for a division, as in MindSpore).
        largest: bool,
    },
    /// The bias takes the channel's split.
    BiasAdd,
    /// Softmax and layer norm: this axis whole.
    WholeAxis {
        /// The axis.
        axis: i64,
        /// Splits that do not divide are undone at once (softmax's rule does; layer norm's
        /// leaves them to the end).
        fixed: bool,
    },
    /// The copied strategy read as the output's, k whole.
    BatchMatMul {
        /// `a` transposed.
        ta: bool,
        /// `b` transposed.
        tb: bool,
    },
    /// Fused attention: the copied strategy read as the output's `[N, KV, G, T, E]`; the keys and
    /// the head size whole.
    Attention,
    /// Its own shape rule, and passes nothing on.
    Gather(i64),
    /// The copied strategy is the output's.
    OneHot,
    /// Data parallel; passes on its strategy with the flattened dimensions merged.
    Flatten,
    /// Carries strategies between its input and output shapes.
    Reshape,
    /// Permutes strategies.
    Transpose(Vec<usize>),
    /// Reduces over these axes (keeping them or not).
    Reduce(Vec<i64>, bool),
}

/// Rec's treatment of `op`, whose output has rank `out_rank`.
pub(super) fn rec_op(op: &OpKind, out_rank: usize) -> RecOp {
    use RecOp::{Left, Not};
    match op {
        OpKind::Input(_) => RecOp::Dataset,
        OpKind::MatMul(m) if out_rank != 2 => Left(Rule::BatchMatMul { ta: m.transpose_a, tb: m.transpose_b }),
        OpKind::MatMul(_) => RecOp::Kept(Kind::MatMul),
        OpKind::Conv2D(_) => RecOp::Kept(Kind::Conv),
        OpKind::MaxPool(_) => RecOp::Kept(Kind::Pool),
        OpKind::BatchNorm(_) => RecOp::Kept(Kind::Batch),
        OpKind::SoftmaxCrossEntropy(_) => RecOp::Kept(Kind::Loss),
        OpKind::AvgPool(_) | OpKind::Slice(_) | OpKind::Pad(_) => RecOp::Kept(Kind::Unknown),
        OpKind::Cast(_)
        | OpKind::Neg(_)
        | OpKind::Scale(_)
        | OpKind::LossScale(_)
        | OpKind::Exp(_)
        | OpKind::Log(_)
        | OpKind::Sqrt(_)
        | OpKind::Relu(_)
        | OpKind::Gelu(_)
        | OpKind::Silu(_)
        | OpKind::Tanh(_)
        | OpKind::Sigmoid(_)
        | OpKind::Concat(_)
        | OpKind::Dropout(_) => Left(Rule::Elementwise),
        OpKind::Add(_) | OpKind::Sub(_) | OpKind::Mul(_) => Left(Rule::Broadcast { largest: true }),
        OpKind::Div(_) => Left(Rule::Broadcast { largest: false }),
        OpKind::BiasAdd(_) => Left(Rule::BiasAdd),
        OpKind::Softmax(s) => Left(Rule::WholeAxis { axis: s.axis, fixed: true }),
        OpKind::LogSoftmax(s) => Left(Rule::WholeAxis { axis: s.axis, fixed: true }),
        // The rotated halves of the last axis stay together.
        OpKind::RotaryEmbedding(_) => Left(Rule::WholeAxis { axis: -1, fixed: true }),
        OpKind::Attention(_) => Left(Rule::Attention),
        OpKind::RouterTopK(_) => Left(Rule::WholeAxis { axis: -1, fixed: true }),
        // MindSpore's rule reads an `axis` a layer norm does not have: the last axis.
        OpKind::LayerNorm(_) | OpKind::RmsNorm(_) => Left(Rule::WholeAxis { axis: -1, fixed: false }),
        OpKind::BatchMatMul(m) => Left(Rule::BatchMatMul { ta: m.transpose_a, tb: m.transpose_b }),
        OpKind::Gather(g) => Left(Rule::Gather(g.axis)),
        OpKind::OneHot(_) => Left(Rule::OneHot),
        OpKind::Flatten(_) => Left(Rule::Flatten),
        OpKind::Reshape(_) => Left(Rule::Reshape),
        OpKind::Transpose(t) => Left(Rule::Transpose(t.perm.clone())),
        OpKind::ReduceSum(r) => Left(Rule::Reduce(r.axes.clone(), r.keep_dims)),
        OpKind::ReduceMean(r) => Left(Rule::Reduce(r.axes.clone(), r.keep_dims)),
        OpKind::ReduceMax(r) => Left(Rule::Reduce(r.axes.clone(), r.keep_dims)),
        OpKind::GlobalAvgPool(_) => Left(Rule::Reduce(vec![2, 3], false)),
        OpKind::Parameter(_)
        | OpKind::Fill(_)
        | OpKind::BroadcastTo(_)
        | OpKind::SumTo(_)
        | OpKind::ReluGrad(_)
        | OpKind::GeluGrad(_)
        | OpKind::SiluGrad(_)
        | OpKind::ReduceMaxGrad(_)
        | OpKind::GatherGrad(_)
        | OpKind::Conv2DGradInput(_)
        | OpKind::Conv2DGradFilter(_)
        | OpKind::MaxPoolGrad(_)
        | OpKind::AvgPoolGrad(_)
        | OpKind::BatchNormGrad(_)
        | OpKind::LayerNormGrad(_)
        | OpKind::RmsNormGrad(_)
        | OpKind::AttentionGrad(_)
        | OpKind::RouterTopKGrad(_)
        | OpKind::AllReduce(_)
        | OpKind::AllGather(_)
        | OpKind::ReduceScatter(_)
        | OpKind::AllToAll(_)
        | OpKind::Broadcast(_)
        | OpKind::Reduce(_)
        | OpKind::Send(_)
        | OpKind::Recv(_) => Not,
    }
}

/// The rules' state over the graph.
struct Rules<'a> {
    g: &'a Graph,
    cg: &'a CostGraph,
    devices: usize,
    /// Inputs are whole (full_batch): the dataset's strategy splits nothing.
    full_batch: bool,
    /// Each node's treatment.
    rec: Vec<RecOp>,
    /// Decided by the partition or the user: passes on its output's strategy.
    decided: Vec<bool>,
    /// Each op's input strategies, once it has some.
    state: Vec<Option<Strats>>,
    /// Each node's consumers that take strategies: (consumer, input slot), in MindSpore's list
    /// order.
    consumers: Vec<Vec<(usize, usize)>>,
}

impl RecOp {
    /// Whether the node is an op that has (or gets) a strategy.
    fn is_op(&self) -> bool {
        !matches!(self, RecOp::Dataset | RecOp::Not)
    }
}

/// Gives every cost-graph op a candidate: `decided[k]` where set (the partition's or the
/// user's; in inference a shared parameter's other user may redo it), else by MindSpore's
/// rules for a `training` graph or an inference one; `order` lists every node in MindSpore's
/// op-list order (`recursive::list_order`). Returns each op's candidate and whether the rules
/// copied it from a neighbour (false: decided, or left whole).
pub(super) fn complete(
    g: &Graph,
    cg: &CostGraph,
    devices: usize,
    decided: &[Option<usize>],
    training: bool,
    full_batch: bool,
    order: &[usize],
) -> (Vec<usize>, Vec<bool>) {
    let n = g.len();
    let rec: Vec<RecOp> = (0..n)
        .map(|i| {
            let node = g.node(NodeId(i));
            // A cast of the precision policy passes strategies on as a reshape to its own shape.
            let op = match &node.op {
                OpKind::Cast(c) if c.inserted => RecOp::Left(Rule::Reshape),
                op => rec_op(op, node.ty.shape.len()),
            };
            match op {
                // Reshapes and flattens are no cost-graph ops but pass strategies on; any other
                // op without a cost-graph entry runs whole and takes none.
                r @ (RecOp::Dataset | RecOp::Left(Rule::Reshape | Rule::Flatten)) => r,
                _ if cg.of_node[i].is_none() => RecOp::Not,
                r => r,
            }
        })
        .collect();
    // MindSpore's op list (`ops_`, and the list of ops left out, `eli_list`) is in `order`,
    // each value's consumers too (`FindIndexOfOperatorOutgoing` takes the first in it).
    let mut consumers = vec![Vec::new(); n];
    for &i in order {
        if !rec[i].is_op() {
            continue;
        }
        for (slot, x) in g.node(NodeId(i)).inputs.iter().enumerate() {
            if !consumers[x.0].iter().any(|&(c, _)| c == i) {
                consumers[x.0].push((i, slot));
            }
        }
    }
    let mut rules = Rules { g, cg, devices, full_batch, rec, decided: vec![false; n], state: vec![None; n], consumers };
    let mut waiting = Vec::new();
    for &i in order {
        if !rules.rec[i].is_op() {
            continue;
        }
        match cg.of_node[i].and_then(|k| decided[k].map(|c| (k, c))) {
            Some((k, c)) => {
                let op = &cg.ops[k];
                rules.state[i] = Some(input_strats(&op.spec, &op.candidates[c].splits));
                rules.decided[i] = true;
            }
            None => waiting.push(i),
        }
    }

    let mut copied = vec![false; n];
    if training {
        let mut d = devices;
        while d > 1 {
            loop {
                if rules.pass(&mut waiting, d, true, &mut copied) > 0 {
                    continue;
                }
                if rules.pass(&mut waiting, d, false, &mut copied) == 0 {
                    break;
                }
            }
            d /= 2;
        }
    } else {
        // `GenerateStrategyV1` lists the ops left out in reverse, so its first pass walks
        // the list from its start (outputs first).
        waiting.reverse();
        rules.pass(&mut waiting, 1, true, &mut copied);
        rules.pass(&mut waiting, 1, false, &mut copied);
    }
    loop {
        let before = waiting.len();
        rules.pass(&mut waiting, 1, true, &mut copied);
        rules.pass(&mut waiting, 1, false, &mut copied);
        if waiting.len() >= before {
            break;
        }
    }
    // What is left takes its rule's strategy of nothing split (a gather still splits by its
    // shape, a flatten by the batch).
    for &i in &waiting {
        let rank = g.node(NodeId(i)).inputs.iter().map(|x| g.node(*x).ty.shape.len()).max().unwrap_or(0);
        rules.state[i] = Some(rules.generate(i, &vec![1; rank]));
    }
    let mut redone = vec![false; n];
    if training {
        rules.share_tables(&mut copied);
    } else {
        rules.share_parameters(&mut copied, &mut redone);
    }

    let mut choice = Vec::with_capacity(cg.ops.len());
    let mut reached = Vec::with_capacity(cg.ops.len());
    for (k, op) in cg.ops.iter().enumerate() {
        let i = op.node.0;
        let whole = || op.candidates.iter().position(|c| c.splits.iter().all(|&s| s == 1));
        let c = match (decided[k].filter(|_| !redone[i]), &rules.state[i]) {
            (Some(c), _) => Some(c),
            (None, Some(ins)) => {
                let splits = splits_of(&op.spec, ins, rules.rec[i] == RecOp::Left(Rule::OneHot));
                op.candidates.iter().position(|c| c.splits == splits).or_else(whole)
            }
            (None, None) => whole(),
        };
        choice.push(c.unwrap_or(0));
        reached.push((decided[k].is_none() || redone[i]) && copied[i]);
    }
    (choice, reached)
}

impl Rules<'_> {
    fn shape(&self, i: usize, slot: usize) -> &[usize] {
        &self.g.node(self.g.node(NodeId(i)).inputs[slot]).ty.shape
    }

    fn out_shape(&self, i: usize) -> &[usize] {
        &self.g.node(NodeId(i)).ty.shape
    }

    /// `ins` fitted to op `i`'s inputs: each as long as its input's rank, with the splits
    /// that do not divide undone (`FixInvalidStra`).
    fn fitted(&self, i: usize, mut ins: Strats) -> Strats {
        for (s, slot) in ins.iter_mut().zip(0..) {
            let shape = self.shape(i, slot);
            s.resize(shape.len(), 1);
            undo_indivisible(s, shape);
        }
        ins
    }

    fn rule(&self, i: usize) -> Option<&Rule> {
        match &self.rec[i] {
            RecOp::Left(rule) => Some(rule),
            _ => None,
        }
    }

    /// A gather whose table another op also uses (tied embeddings) takes that op's split of
    /// the table, its indices split over the devices left (MindSpore's
    /// `ModifyParamSharingOpsStrategy`: the other op a matmul, whose second input's strategy
    /// counts, or a multiplication or cast, whose first input's does; the last such wins).
    fn share_tables(&mut self, copied: &mut [bool]) {
        let gathers: Vec<usize> = (0..self.g.len()).filter(|&i| matches!(self.rule(i), Some(Rule::Gather(_)))).collect();
        for i in gathers {
            let table = self.g.node(NodeId(i)).inputs[0];
            if !matches!(self.g.node(table).op, OpKind::Parameter(_)) {
                continue;
            }
            for &(j, _) in &self.consumers[table.0] {
                let slot = match &self.g.node(NodeId(j)).op {
                    OpKind::MatMul(_) => 1,
                    OpKind::Mul(_) | OpKind::Cast(_) => 0,
                    _ => continue,
                };
                let Some(split) = self.state[j].as_ref().and_then(|s| s.get(slot)).cloned() else { continue };
                let used: usize = split.iter().product();
                let idx_rank = self.shape(i, 1).len();
                let mut idx = vec![1; idx_rank];
                if let Some(first) = idx.first_mut() {
                    *first = (self.devices / used.max(1)).max(1);
                }
                self.state[i] = Some(self.fitted(i, vec![split, idx]));
                copied[i] = true;
            }
        }
    }

    /// Inference: each parameter used by several ops takes the strategy of the user that
    /// splits it over the most devices, into the smallest pieces (the first such user on a
    /// tie), and every user that wants it split otherwise is redone from that strategy: a
    /// gather takes it for its table, a matrix product for its weight, an op the partition
    /// cuts left-aligned on its inputs, any other op by its rule (MindSpore's
    /// `SetParamStrategy`, then `ApplyParamStrategy` in parameter-name order). As there, the
    /// parameter's strategy is read from a matrix product's second input and any other op's
    /// first, whichever input the parameter is.
    fn share_parameters(&mut self, copied: &mut [bool], redone: &mut [bool]) {
        let g = self.g;
        let slot_of = |u: usize| usize::from(matches!(g.node(NodeId(u)).op, OpKind::MatMul(_) | OpKind::BatchMatMul(_)));
        let mut params: Vec<usize> = (0..g.len()).filter(|&p| matches!(g.node(NodeId(p)).op, OpKind::Parameter(_))).collect();
        params.sort_by(|&a, &b| g.node(NodeId(a)).name.cmp(&g.node(NodeId(b)).name));
        let mut chosen = Vec::new();
        for p in params {
            let users: Vec<usize> = self.consumers[p].iter().map(|&(u, _)| u).collect();
            if users.len() < 2 {
                continue;
            }
            let mut best: Option<Strat> = None;
            let (mut most, mut smallest) = (1, usize::MAX);
            for &u in &users {
                let slot = slot_of(u);
                let Some(s) = self.state[u].as_ref().and_then(|s| s.get(slot)).filter(|s| !s.is_empty()) else { continue };
                let pieces: usize = self.shape(u, slot).iter().zip(s).map(|(&size, &x)| size / x.max(1)).sum();
                let cut: usize = s.iter().product();
                if cut >= most && pieces < smallest {
                    (most, smallest, best) = (cut, pieces, Some(s.clone()));
                }
            }
            if let Some(best) = best {
                chosen.push((users, best));
            }
        }
        for (users, best) in chosen {
            for u in users {
                if self.state[u].as_ref().and_then(|s| s.get(slot_of(u))) == Some(&best) {
                    continue;
                }
                let ins = match (&g.node(NodeId(u)).op, &self.rec[u]) {
                    (OpKind::Gather(gather), _) => self.gather_from_table(u, gather.axis, &best),
                    (OpKind::MatMul(m), RecOp::Kept(Kind::MatMul)) if best.len() == 2 => {
                        self.matmul_from_weight(u, m.transpose_a, m.transpose_b, &best)
                    }
                    // The output's strategy, not an input's: not redone.
                    (_, RecOp::Left(Rule::OneHot)) => continue,
                    (_, RecOp::Left(_)) => self.generate(u, &best),
                    _ => (0..g.node(NodeId(u)).inputs.len()).map(|slot| left_aligned(&best, self.shape(u, slot))).collect(),
                };
                self.state[u] = Some(self.fitted(u, ins));
                copied[u] = true;
                redone[u] = true;
            }
        }
    }

    /// A gather whose table takes `table` (MindSpore's `MakeGatherStratFromParam`): the
    /// indices' first dimension over the devices the table leaves, unless the table splits
    /// the gathered axis.
    fn gather_from_table(&self, i: usize, axis: i64, table: &[usize]) -> Strats {
        let mut idx = vec![1; self.shape(i, 1).len()];
        let gathered = normalize_axis(axis, table.len()).and_then(|a| table.get(a)).copied().unwrap_or(1);
        if let (Some(first), 1) = (idx.first_mut(), gathered) {
            *first = (self.devices / table.iter().product::<usize>().max(1)).max(1);
        }
        vec![table.to_vec(), idx]
    }

    /// A matrix product whose weight (second input) takes `weight`, read as MindSpore's
    /// `MakeMatMulStratFromParam` reads it: its first entry is the contraction's split, and the
    /// two entries are swapped when the weight is transposed (as if `weight` were laid out
    /// (k, n) either way); the first input keeps its split of the other dimension, capped by
    /// the devices the contraction leaves. Without `ta` MindSpore
    /// caps the rows by the contraction's split instead (it compares with the entry it has just
    /// set); kept, as the strategies it chooses are the reference.
    fn matmul_from_weight(&self, i: usize, ta: bool, tb: bool, weight: &[usize]) -> Strats {
        let mut a = self.state[i].as_ref().and_then(|s| s.first()).cloned().unwrap_or_else(|| vec![1; 2]);
        a.resize(2, 1);
        let k = weight[0].max(1);
        let b = if tb { vec![weight[1], weight[0]] } else { weight.to_vec() };
        if ta {
            a[0] = k;
            a[1] = a[1].min(self.devices / k);
        } else {
            a[1] = k;
            a[0] = a[1].min(self.devices / k);
        }
        vec![a, b]
    }

    /// One forward or backward pass over the waiting ops at `d` devices; returns how many
    /// took a strategy.
    fn pass(&mut self, waiting: &mut Vec<usize>, d: usize, forward: bool, copied: &mut [bool]) -> usize {
        let mut left = Vec::new();
        let mut changes = 0;
        for &i in waiting.iter().rev() {
            let basic = if forward { self.copy_incoming(i) } else { self.copy_outgoing(i) };
            match basic {
                Some(b) if !b.is_empty() && b.iter().product::<usize>() >= d => {
                    self.state[i] = Some(self.generate(i, &b));
                    copied[i] = true;
                    changes += 1;
                }
                _ => left.push(i),
            }
        }
        *waiting = left;
        changes
    }

    /// The strategy op `i` copies from its incoming op (MindSpore's
    /// `FindIndexOfOperatorIncoming`, then the incoming op's output strategy).
    fn copy_incoming(&self, i: usize) -> Option<Strat> {
        let node = self.g.node(NodeId(i));
        let mut incoming = None;
        for x in &node.inputs {
            let p = x.0;
            let splits = match &self.rec[p] {
                RecOp::Not => continue,
                // The dataset's strategy splits the batch over every device where it divides,
                // nothing under full_batch.
                RecOp::Dataset => !self.full_batch && self.devices > 1 && self.out_shape(p).first().is_some_and(|&b| b > 1),
                _ => self.state[p].as_ref().is_some_and(|s| s.iter().flatten().any(|&x| x > 1)),
            };
            incoming = Some(p);
            if splits {
                break;
            }
        }
        let p = incoming?;
        if matches!(self.rec[p], RecOp::Dataset | RecOp::Left(Rule::Gather(_))) {
            return None;
        }
        let state = self.state[p].as_ref()?;
        if self.decided[p] {
            // The partition's output strategy, right-aligned to the op's first input.
            let op = &self.cg.ops[self.cg.of_node[p]?];
            let mut out = output_strat(op.spec.output.as_slice(), &splits_of(&op.spec, state, false));
            // Above 32 devices a matrix product whose first input is split over more devices
            // than its output (its contraction is cut) passes on its rows split by the
            // difference too: MindSpore's `ExtraShardMatmulOnBatchDim`, which gives the
            // product that output strategy (sequence parallelism: the partial sums are
            // reduce-scattered by rows instead of all-reduced; here the redistribution to
            // the consumer's split does the same).
            if self.devices > 32 && self.rec[p] == RecOp::Kept(Kind::MatMul) && out.len() == 2 {
                let a: usize = state[0].iter().product::<usize>().min(self.devices);
                let o: usize = out.iter().product();
                if a > o && o > 0 {
                    out[0] *= a / o;
                }
            }
            let rank = node.inputs.iter().map(|x| self.g.node(*x).ty.shape.len()).find(|&r| r > 0).unwrap_or(0);
            return Some(right_aligned(&out, rank));
        }
        if matches!(self.rule(i), Some(Rule::OneHot | Rule::Transpose(_))) {
            return None;
        }
        self.output_strategy(p, state)
    }

    /// What an op the rules decided passes forward (MindSpore's
    /// `PrepareIncomingOperatorInputStrategy` and its adjustments): its first input's strategy
    /// (a binary op's largest input), mapped through reshapes, transposes and reductions.
    fn output_strategy(&self, p: usize, state: &Strats) -> Option<Strat> {
        let first = || state.iter().find(|s| !s.is_empty()).cloned();
        match self.rule(p)? {
            Rule::Broadcast { largest: true } | Rule::BiasAdd => {
                let mut best = 0;
                for (slot, s) in state.iter().enumerate() {
                    if s.len() > state[best].len() {
                        best = slot;
                    }
                }
                state.get(best).cloned()
            }
            Rule::Reshape => Some(reshape_strategy(self.shape(p, 0), self.out_shape(p), &state[0])),
            Rule::Transpose(perm) => Some(perm.iter().map(|&a| state[0].get(a).copied().unwrap_or(1)).collect()),
            Rule::OneHot => {
                let op = &self.cg.ops[self.cg.of_node[p]?];
                Some(output_strat(&op.spec.output, &splits_of(&op.spec, state, true)))
            }
            // Kept dimensions pass on as they are.
            Rule::Reduce(_, true) => first(),
            Rule::Reduce(axes, false) => {
                let axes = resolve(axes, self.shape(p, 0).len());
                let s = first()?;
                Some(s.iter().enumerate().filter(|(d, _)| !axes.contains(d)).map(|(_, &x)| x).collect())
            }
            Rule::Flatten => {
                let s = first()?;
                Some(if s.len() > 1 { vec![s[0], s[1..].iter().product()] } else { s })
            }
            Rule::Gather(_) => Some(gather_output_strategy(self.out_shape(p), self.devices)),
            Rule::Elementwise
            | Rule::Broadcast { largest: false }
            | Rule::WholeAxis { .. }
            | Rule::BatchMatMul { .. }
            | Rule::Attention => first(),
        }
    }

    /// The strategy op `i` copies from its first consumer with a strategy (MindSpore's
    /// `FindIndexOfOperatorOutgoing` and `CopyOutgoingOperatorInputStrategy`).
    fn copy_outgoing(&self, i: usize) -> Option<Strat> {
        let rule = self.rule(i);
        if rule == Some(&Rule::Flatten) {
            return None;
        }
        let &(c, slot) = self.consumers[i].iter().find(|(c, _)| self.state[*c].is_some())?;
        if matches!(self.rule(c), Some(Rule::Gather(_))) {
            return None;
        }
        let want = self.state[c].as_ref()?.get(slot)?;
        let out_rank = self.out_shape(i).len();
        Some(match rule {
            Some(Rule::Reshape) => reshape_strategy(self.out_shape(i), self.shape(i, 0), want),
            Some(Rule::Gather(_)) => gather_output_strategy(self.out_shape(i), self.devices),
            // As MindSpore's rule has it: the consumer's strategy read through the permutation.
            Some(Rule::Transpose(perm)) => perm.iter().map(|&a| want.get(a).copied().unwrap_or(1)).collect(),
            Some(Rule::Reduce(axes, keep_dims)) => {
                let rank = self.shape(i, 0).len();
                let axes = resolve(axes, rank);
                let mut s = Vec::with_capacity(rank);
                let mut next = 0;
                for d in 0..rank {
                    if axes.contains(&d) {
                        s.push(1);
                        if *keep_dims {
                            next += 1;
                        }
                    } else {
                        s.push(want.get(next).copied().unwrap_or(1));
                        next += 1;
                    }
                }
                s
            }
            _ => want.iter().copied().take(out_rank).collect(),
        })
    }

    /// Op `i`'s input strategies from a copied strategy (MindSpore's
    /// `GenerateStrategiesFromStrategy`). As there, most rules keep a split that does not divide
    /// its dimension (it is passed on, and undone only when the op's candidate is chosen);
    /// binary ops and softmax undo it at once.
    fn generate(&self, i: usize, basic: &[usize]) -> Strats {
        let node = self.g.node(NodeId(i));
        let shapes: Vec<&[usize]> = (0..node.inputs.len()).map(|s| self.shape(i, s)).collect();
        let Some(rule) = self.rule(i) else { return shapes.iter().map(|s| vec![1; s.len()]).collect() };
        let (mut ins, fix): (Strats, bool) = match rule {
            Rule::Broadcast { .. } if shapes.len() == 2 => (broadcast(basic, shapes[0], shapes[1]), true),
            Rule::BiasAdd => (vec![basic.to_vec(), vec![basic.get(1).copied().unwrap_or(1)]], false),
            Rule::WholeAxis { axis, fixed } => (whole_axis(basic, *axis, &shapes), *fixed),
            Rule::BatchMatMul { ta, tb } => (batch_matmul(basic, *ta, *tb, &shapes), false),
            Rule::Gather(axis) => (gather_strategies(&shapes, *axis, self.devices), false),
            Rule::Attention => {
                let b = |j: usize| basic.get(j).copied().unwrap_or(1);
                (vec![vec![b(0), b(1), b(2), b(3), 1], vec![b(0), b(1), 1, 1], vec![b(0), b(1), 1, b(4)]], true)
            }
            Rule::OneHot => {
                // The copied strategy is the output's.
                let out = self.out_shape(i);
                let s = (0..out.len()).map(|j| basic.get(j).copied().filter(|&x| x <= out[j]).unwrap_or(1)).collect();
                return vec![s];
            }
            Rule::Flatten => (
                shapes
                    .iter()
                    .map(|s| (0..s.len()).map(|j| if j == 0 && s[0].is_multiple_of(self.devices) { self.devices } else { 1 }).collect())
                    .collect(),
                false,
            ),
            Rule::Elementwise | Rule::Broadcast { .. } | Rule::Reshape | Rule::Transpose(_) | Rule::Reduce(..) => {
                (shapes.iter().map(|s| left_aligned(basic, s)).collect(), false)
            }
        };
        // Every input its own rank.
        ins.resize(shapes.len(), Vec::new());
        for (s, shape) in ins.iter_mut().zip(&shapes) {
            s.resize(shape.len(), 1);
            if fix {
                undo_indivisible(s, shape);
            }
        }
        ins
    }
}

/// A tensor of `shape` split as `basic` says dimension by dimension from the left (MindSpore's
/// `CheckDivisible`): a dimension of size 1, or one `basic` does not reach, whole.
fn left_aligned(basic: &[usize], shape: &[usize]) -> Strat {
    (0..shape.len()).map(|j| if shape[j] == 1 { 1 } else { basic.get(j).copied().unwrap_or(1) }).collect()
}

/// Every split of `s` that does not divide its dimension of `shape` undone (`FixInvalidStra`).
fn undo_indivisible(s: &mut [usize], shape: &[usize]) {
    for (x, &size) in s.iter_mut().zip(shape) {
        if *x == 0 || *x > size || !size.is_multiple_of(*x) {
            *x = 1;
        }
    }
}

/// A binary op's inputs from a copied strategy (MindSpore's `CheckBroadcast`): inputs of one
/// rank take it from the left; otherwise a strategy of the larger input's rank is broadcast
/// (right-aligned) to the smaller one, and any other runs both whole.
fn broadcast(basic: &[usize], a: &[usize], b: &[usize]) -> Strats {
    let to_smaller = |shape: &[usize]| -> Strat {
        (0..shape.len()).map(|t| if shape[t] == 1 { 1 } else { basic.len().checked_sub(shape.len() - t).map_or(1, |j| basic[j]) }).collect()
    };
    let (ra, rb) = (a.len(), b.len());
    if ra == rb {
        vec![left_aligned(basic, a), left_aligned(basic, b)]
    } else if basic.len() == ra.max(rb) {
        if ra > rb {
            vec![basic.to_vec(), to_smaller(b)]
        } else {
            vec![to_smaller(a), basic.to_vec()]
        }
    } else {
        vec![vec![1; ra], vec![1; rb]]
    }
}

/// An output's strategy under logical `splits`.
fn output_strat(map: &[Option<usize>], splits: &[usize]) -> Strat {
    map.iter().map(|l| l.map_or(1, |l| splits[l])).collect()
}

/// Axes resolved against `rank` (empty: all).
fn resolve(axes: &[i64], rank: usize) -> Vec<usize> {
    if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter().filter_map(|&a| normalize_axis(a, rank)).collect()
    }
}

/// Each input's strategy under logical `splits`.
fn input_strats(spec: &OpSpec, splits: &[usize]) -> Strats {
    spec.inputs.iter().map(|map| map.iter().map(|l| l.map_or(1, |l| splits[l])).collect()).collect()
}

/// The logical splits that input strategies `ins` give (the first input naming a dimension
/// decides it; `as_output`: `ins[0]` is the output's strategy); a dimension the op cannot
/// split, or that the split does not divide, stays whole.
fn splits_of(spec: &OpSpec, ins: &Strats, as_output: bool) -> Vec<usize> {
    let mut splits: Vec<Option<usize>> = vec![None; spec.dims.len()];
    let maps: Vec<&Vec<Option<usize>>> = if as_output { vec![&spec.output] } else { spec.inputs.iter().collect() };
    for (map, s) in maps.into_iter().zip(ins) {
        for (l, &x) in map.iter().zip(s) {
            if let Some(l) = l {
                splits[*l].get_or_insert(x);
            }
        }
    }
    splits
        .into_iter()
        .zip(&spec.dims)
        .map(|(s, dim)| match s {
            Some(s) if s > 1 && dim.splittable && dim.size.is_multiple_of(s) => s,
            _ => 1,
        })
        .collect()
}

/// `s`'s last `rank` entries (ones in front where it is shorter).
fn right_aligned(s: &[usize], rank: usize) -> Strat {
    let mut out = vec![1; rank];
    for (o, x) in out.iter_mut().rev().zip(s.iter().rev()) {
        *o = *x;
    }
    out
}

/// Softmax and layer norm: the copied strategy with `axis` whole (other inputs whole).
fn whole_axis(basic: &[usize], axis: i64, shapes: &[&[usize]]) -> Strats {
    let mut s = basic.to_vec();
    if let Some(a) = normalize_axis(axis, shapes.first().map_or(0, |s| s.len())) {
        if let Some(x) = s.get_mut(a) {
            *x = 1;
        }
    }
    let mut out = vec![s];
    out.extend(shapes.iter().skip(1).map(|s| vec![1; s.len()]));
    out
}

/// A batched matmul from its output's strategy: batch dimensions and i, j as given
/// (right-aligned), k whole (MindSpore's `PreparePropagateBatchMatMul`).
fn batch_matmul(basic: &[usize], ta: bool, tb: bool, shapes: &[&[usize]]) -> Strats {
    let at = |from_end: usize| basic.len().checked_sub(from_end).map_or(1, |j| basic[j]);
    // One input: batch dimensions right-aligned, its outer dimension (i or j) as the output's,
    // k whole; `k_second`: k is the second-to-last dimension when not transposed (input b).
    let side = |rank: usize, outer: usize, transposed: bool, k_second: bool| -> Strat {
        let mut s = vec![1; rank];
        if rank < 2 {
            return s;
        }
        for idx in 3..=rank {
            s[rank - idx] = at(idx);
        }
        let x_pos = if transposed != k_second { rank - 1 } else { rank - 2 };
        s[x_pos] = at(outer);
        s
    };
    let a = side(shapes[0].len(), 2, ta, false);
    let b = side(shapes.get(1).map_or(0, |s| s.len()), 1, tb, true);
    vec![a, b]
}

/// MindSpore's `GenGatherStra`: halve the first dimension, then the others from the largest,
/// until all devices are used.
fn gather_output_strategy(shape: &[usize], devices: usize) -> Strat {
    let mut shape = shape.to_vec();
    let mut s = vec![1; shape.len()];
    if shape.is_empty() {
        return s;
    }
    let mut order: Vec<usize> = (1..shape.len()).collect();
    order.sort_by(|&a, &b| shape[b].cmp(&shape[a]));
    order.insert(0, 0);
    let mut cut = 1;
    for d in order {
        while shape[d] > 0 && shape[d].is_multiple_of(2) && cut < devices {
            shape[d] /= 2;
            cut *= 2;
            s[d] *= 2;
        }
        if cut == devices {
            break;
        }
    }
    s
}

/// MindSpore's `PrepareGather` on axis 0 (autopar splits no other gather): the indices' first
/// dimension is halved, then the table's rows, until all devices are used; the rows stay whole
/// when the indices are split, except where a 2-D table and 2-D indices share the devices
/// between their first dimensions (MindSpore's batch-and-axis mode).
fn gather_strategies(shapes: &[&[usize]], axis: i64, devices: usize) -> Strats {
    let (table, idx) = (shapes[0], shapes.get(1).copied().unwrap_or(&[]));
    let mut s = vec![vec![1; table.len()], vec![1; idx.len()]];
    if normalize_axis(axis, table.len()) != Some(0) {
        return s;
    }
    let mut cut = 1;
    for slot in (0..2).rev() {
        let Some(&first) = shapes.get(slot).and_then(|s| s.first()) else { continue };
        let mut size = first;
        while size > 0 && size.is_multiple_of(2) && cut < devices {
            size /= 2;
            cut *= 2;
            s[slot][0] *= 2;
        }
        if cut == devices {
            break;
        }
    }
    let both = table.len() == 2 && idx.len() == 2 && s[0][0] * s[1][0] == devices && s[0][0] != devices && s[1][0] != devices;
    if s[1].iter().product::<usize>() != 1 && !both {
        s[0][0] = 1;
    }
    s
}

/// MindSpore's `PrepareReshape`: a strategy of `from` (shape) carried to `to`: first each
/// split whole onto a dimension it divides, then what is left by common factors.
fn reshape_strategy(from: &[usize], to: &[usize], strategy: &[usize]) -> Strat {
    let mut out = vec![1; to.len()];
    let mut left: Vec<usize> = (0..from.len()).map(|d| strategy.get(d).copied().unwrap_or(1)).collect();
    let (mut f, mut t) = (from.to_vec(), to.to_vec());
    let (mut i, mut j) = (0, 0);
    while i < f.len() && j < t.len() {
        if f[i] > t[j] {
            if left[i] > 0 && t[j].is_multiple_of(left[i]) {
                out[j] *= left[i];
                left[i] = 1;
            }
            f[i] /= t[j].max(1);
            j += 1;
        } else if f[i] < t[j] {
            t[j] /= f[i].max(1);
            i += 1;
        } else {
            if left[i] > 0 && t[j].is_multiple_of(left[i]) {
                out[j] *= left[i];
                left[i] = 1;
            }
            i += 1;
            j += 1;
        }
    }
    let (mut f, mut t) = (from.to_vec(), to.to_vec());
    let (mut i, mut j) = (0, 0);
    while i < f.len() && j < t.len() {
        if f[i] > t[j] {
            let d = gcd(left[i], t[j]);
            out[j] *= d;
            left[i] /= d.max(1);
            f[i] /= t[j].max(1);
            j += 1;
        } else if f[i] < t[j] {
            out[j] *= left[i];
            t[j] /= f[i].max(1);
            i += 1;
        } else {
            out[j] *= left[i];
            i += 1;
            j += 1;
        }
    }
    out
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reshape_carries_each_split_to_the_dimension_it_lands_on() {
        // [8, 16, 64] split (2, 4, 1) -> [8, 16, 4, 16]: the heads stay whole.
        assert_eq!(reshape_strategy(&[8, 16, 64], &[8, 16, 4, 16], &[2, 4, 1]), vec![2, 4, 1, 1]);
        // [8, 16, 4, 16] split (2, 1, 4, 1) -> [8, 16, 64]: the heads' split lands on the hidden dimension.
        assert_eq!(reshape_strategy(&[8, 16, 4, 16], &[8, 16, 64], &[2, 1, 4, 1]), vec![2, 1, 4]);
        // [8, 4, 4] split (8, 1, 1) -> [128]: the batch's split on the flattened dimension.
        assert_eq!(reshape_strategy(&[8, 4, 4], &[128], &[8, 1, 1]), vec![8]);
    }

    #[test]
    fn a_gather_splits_its_output_from_the_first_dimension_then_the_largest() {
        assert_eq!(gather_output_strategy(&[4, 16, 64], 16), vec![4, 1, 4]);
        assert_eq!(gather_output_strategy(&[3, 16, 64], 8), vec![1, 1, 8]);
        // An embedding lookup: the indices split, the table whole.
        let s = gather_strategies(&[&[1000, 64], &[8, 16]], 0, 4);
        assert_eq!(s, vec![vec![1, 1], vec![4, 1]]);
        // Indices too few to split: the table's rows.
        let s = gather_strategies(&[&[1000, 64], &[1, 16]], 0, 4);
        assert_eq!(s, vec![vec![4, 1], vec![1, 1]]);
        // Indices of 4 on 8 devices: the table's rows take the other 2.
        let s = gather_strategies(&[&[1000, 64], &[4, 16]], 0, 8);
        assert_eq!(s, vec![vec![2, 1], vec![4, 1]]);
        // 1-D indices: the rows whole.
        let s = gather_strategies(&[&[1000, 64], &[4]], 0, 8);
        assert_eq!(s, vec![vec![1, 1], vec![4]]);
    }

    #[test]
    fn a_batched_matmul_reads_the_copied_strategy_as_its_outputs() {
        // [b, h, s, d] x [b, h, d, s'] from (2, 2, 2, 1): k whole, i and j from the last two.
        let s = batch_matmul(&[2, 2, 2, 1], false, false, &[&[4, 4, 8, 16], &[4, 4, 16, 8]]);
        assert_eq!(s, vec![vec![2, 2, 2, 1], vec![2, 2, 1, 1]]);
        let s = batch_matmul(&[2, 2, 4, 2], false, true, &[&[4, 4, 8, 16], &[4, 4, 8, 16]]);
        assert_eq!(s, vec![vec![2, 2, 4, 1], vec![2, 2, 2, 1]]);
        let s = batch_matmul(&[2, 2, 4, 2], true, false, &[&[4, 4, 16, 8], &[4, 4, 16, 8]]);
        assert_eq!(s, vec![vec![2, 2, 1, 4], vec![2, 2, 1, 2]]);
    }

    #[test]
    fn softmax_and_layer_norm_keep_their_axis_whole() {
        assert_eq!(whole_axis(&[2, 4], -1, &[&[8, 8]]), vec![vec![2, 1]]);
        assert_eq!(whole_axis(&[2, 2, 2], -1, &[&[8, 8, 8], &[8], &[8]]), vec![vec![2, 2, 1], vec![1], vec![1]]);
    }

    #[test]
    fn right_alignment_pads_and_truncates_at_the_front() {
        assert_eq!(right_aligned(&[2, 4], 3), vec![1, 2, 4]);
        assert_eq!(right_aligned(&[2, 4, 8], 2), vec![4, 8]);
    }
}
