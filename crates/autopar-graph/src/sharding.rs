//! What every op says about running in parallel, next to its shape and gradient rules: how it
//! may be split ([`ShardingRule`]), what one rank runs ([`LocalCx`]) and what it costs
//! ([`OpCost`]). The planner in `autopar-parallel` reads these; it has no per-op knowledge of its
//! own.
//!
//! An op is described by its **logical dimensions** (the loops of its computation: MatMul
//! `[b.., i, k, j]`, an element-wise op the dimensions of its output, a convolution
//! `[n, c_out, c_in]`), which tensor dimension of each input and of the output runs along which
//! logical dimension, which logical dimensions may be split, and which are reduced (a split
//! reduced dimension makes the output a pending partial sum, to be all-reduced or
//! reduce-scattered by the redistribution its consumer needs). A strategy is a split count per
//! logical dimension; the device matrix is the split counts (in logical order, sizes of 1
//! squeezed out) plus MindSpore's repeated-calculation axis on the right, and every tensor map
//! follows. This reproduces MindSpore's device matrices (MatMul `((2,1),(1,4))` -> `[2,4]`,
//! element-wise `(2,1)` on 8 devices -> `[2,4]` with the repeat axis).
//!
//! Some ops need the whole tensor and stay exact when split because a rank's op is tied to the
//! whole ([`Tie`]): a training BatchNorm with a split batch, a Softmax with a split axis and a
//! LayerNorm with split normalised dimensions reduce their statistics over the ranks that split
//! them, a Dropout draws its block of the whole mask, and a Gather from a table split on the
//! vocabulary looks up its own rows, leaving a partial sum like a split contraction.

use std::fmt;

use autopar_layout::{DeviceMatrix, NamedLayout, Strategy, TensorLayout};

use crate::error::{GraphError, Result};
use crate::types::{DType, TensorType};

/// One loop dimension of an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalDim {
    /// The dimension's size (iterations of the loop).
    pub size: usize,
    /// Whether this dimension may be split; when not, `why` says so in errors.
    pub splittable: bool,
    /// A reduced dimension: splitting it leaves a partial sum in the output.
    pub reduced: bool,
    /// Why the dimension cannot be split, for errors; empty when it can.
    pub why: &'static str,
}

impl LogicalDim {
    /// A dimension that may be split and is not reduced.
    pub fn free(size: usize) -> Self {
        Self { size, splittable: true, reduced: false, why: "" }
    }
    /// A dimension that may not be split, `why` saying why.
    pub fn fixed(size: usize, why: &'static str) -> Self {
        Self { size, splittable: false, reduced: false, why }
    }
    /// A reduced dimension that may be split (leaving a partial sum in the output).
    pub fn reduced(size: usize) -> Self {
        Self { size, splittable: true, reduced: true, why: "" }
    }
}

/// How a rank's op is tied to the whole tensor when its inputs are split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tie {
    /// Each slice is computed on its own.
    None,
    /// Statistics over these logical dimensions: when they are split, the op reduces them over
    /// the ranks that split them (BatchNorm in training over the batch, Softmax over its axis,
    /// LayerNorm over the normalised dimensions). The local op gets that group.
    Stats(Vec<usize>),
    /// A result keyed by the element's position in the whole tensor (Dropout's randomness, the
    /// positions of RotaryEmbedding and causal Attention): the local op gets the block its slice
    /// of input 0 is.
    Block,
    /// Input `input` holds rows `dim` of a table split across ranks (Gather on a split
    /// vocabulary): the local op gets which rows.
    Rows {
        /// Position of the table input, counted from 0.
        input: usize,
        /// The table's row dimension, counted from 0.
        dim: usize,
    },
}

/// The sharding description of one op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSpec {
    /// The op's logical dimensions, in logical order.
    pub dims: Vec<LogicalDim>,
    /// Per input, per tensor dimension: the logical dimension it runs along (None: a broadcast
    /// dimension of size 1 or one that is never split).
    pub inputs: Vec<Vec<Option<usize>>>,
    /// Per output tensor dimension: the logical dimension it runs along (None: never split).
    pub output: Vec<Option<usize>>,
    /// The output is a mean over the reduced dimensions: each rank's local result is scaled by
    /// its share before the partial sum is completed.
    pub mean_over_reduced: bool,
    /// How a rank's op is tied to the whole tensor when split.
    pub tie: Tie,
}

/// What the planner does with an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardingRule {
    /// Split by a strategy over logical dimensions.
    Spec(OpSpec),
    /// The output layout derives from the input's (Reshape, Flatten).
    FollowInput,
    /// No sharded form: every input and the output replicated.
    Replicated,
    /// Cannot appear in a graph the planner shards; the text says why.
    Unsupported(&'static str),
}

/// What a sharding rule sees: the node's input and output types.
pub struct RuleCx<'a> {
    /// Types of the node's inputs, in input order.
    pub inputs: &'a [&'a TensorType],
    /// Type of the node's output.
    pub output: &'a TensorType,
}

impl RuleCx<'_> {
    /// Shape of input `i`.
    pub fn shape(&self, i: usize) -> &[usize] {
        &self.inputs[i].shape
    }
    /// Shape of the output.
    pub fn out(&self) -> &[usize] {
        &self.output.shape
    }
}

/// What a rank's op is made from: its local output shape and, for ops tied to the whole
/// tensor, the facts the planner resolved for this rank.
pub struct LocalCx<'a> {
    /// This rank's output shape.
    pub output: &'a [usize],
    /// [`Tie::Stats`]: the world ranks (ascending) the statistics are reduced over; empty when
    /// the statistics' dimensions are whole on this rank.
    pub group: &'a [usize],
    /// [`Tie::Block`]: where this rank's input sits in the whole tensor, when split.
    pub block: Option<DropoutBlock>,
    /// [`Tie::Rows`]: the rows of the split table this rank holds.
    pub rows: Option<TableShard>,
}

/// What a cost rule sees: the (local) input and output types and the rank running the op.
pub struct CostCx<'a> {
    /// Local types of the op's inputs, in input order.
    pub inputs: &'a [TensorType],
    /// Local type of the op's output.
    pub output: &'a TensorType,
    /// Global rank running the op.
    pub rank: usize,
}

impl CostCx<'_> {
    /// Bytes of a tensor of type `t`: elements times element size.
    pub fn bytes_of(t: &TensorType) -> usize {
        t.numel() * t.dtype.size()
    }
    /// Bytes of every input and the output: the memory traffic of one pass.
    pub fn traffic(&self) -> usize {
        self.inputs.iter().map(Self::bytes_of).sum::<usize>() + Self::bytes_of(self.output)
    }
    /// Elements of the output.
    pub fn out_numel(&self) -> usize {
        self.output.numel()
    }
    /// `flops_per_element` times the output's elements, with the op's memory traffic.
    pub fn per_element(&self, flops_per_element: f64) -> OpCost {
        OpCost { flops: flops_per_element * self.out_numel() as f64, bytes: self.traffic(), comm: Vec::new() }
    }
    /// `flops_per_element` times input `i`'s elements, with the op's memory traffic.
    pub fn per_input_element(&self, i: usize, flops_per_element: f64) -> OpCost {
        OpCost { flops: flops_per_element * self.inputs[i].numel() as f64, bytes: self.traffic(), comm: Vec::new() }
    }
    /// No arithmetic, only data movement (shape ops, copies).
    pub fn movement(&self) -> OpCost {
        OpCost { flops: 0.0, bytes: self.traffic(), comm: Vec::new() }
    }
}

/// The collectives a communicator offers, by the call a rank makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Collective {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// All-to-all.
    AllToAll,
    /// Broadcast from a root rank.
    Broadcast,
    /// A point-to-point send.
    Send,
    /// A receive: no bytes sent, listed so its pair group is known.
    Recv,
}

impl Collective {
    /// The call's name in snake case (`all_reduce`), also its `Display`.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::Broadcast => "broadcast",
            Collective::Send => "send",
            Collective::Recv => "recv",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One call into the communicator: its kind, the group (world ranks, ascending) and the bytes
/// this rank hands to it (the payload of its send buffer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommCall {
    /// Which call.
    pub kind: Collective,
    /// The ranks taking part: world ranks, ascending.
    pub group: Vec<usize>,
    /// Bytes this rank hands to the call (its send buffer).
    pub bytes: usize,
}

/// What one execution of an op costs on one rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpCost {
    /// Floating-point operations (a multiply-add counts 2).
    pub flops: f64,
    /// Bytes read and written (inputs plus output).
    pub bytes: usize,
    /// Communication the op does itself (collective ops, synchronised statistics).
    pub comm: Vec<CommCall>,
}

impl OpCost {
    /// This cost with `comm` as the op's own communication.
    pub fn with_comm(mut self, comm: Vec<CommCall>) -> Self {
        self.comm = comm;
        self
    }
}

/// The per-dimension logical map of a tensor that runs along the op's logical dims one to one.
pub fn same_dims(shape: &[usize]) -> Vec<Option<usize>> {
    (0..shape.len()).map(Some).collect()
}

/// Broadcasting inputs aligned right on the output's dimensions; size-1 broadcast dims map to None.
pub fn broadcast_spec(out: &[usize], ins: &[&TensorType]) -> OpSpec {
    let n = out.len();
    let dims = out.iter().map(|&s| LogicalDim::free(s)).collect();
    let inputs = ins
        .iter()
        .map(|t| {
            let m = t.shape.len();
            t.shape.iter().enumerate().map(|(d, &s)| if s == out[n - m + d] { Some(n - m + d) } else { None }).collect()
        })
        .collect();
    OpSpec { dims, inputs, output: same_dims(out), mean_over_reduced: false, tie: Tie::None }
}

/// One input and an output of the same shape, split freely except on `fixed` dims.
pub fn unary_spec(shape: &[usize], fixed: &[usize], why: &'static str) -> OpSpec {
    let dims =
        shape.iter().enumerate().map(|(d, &s)| if fixed.contains(&d) { LogicalDim::fixed(s, why) } else { LogicalDim::free(s) }).collect();
    OpSpec { dims, inputs: vec![same_dims(shape)], output: same_dims(shape), mean_over_reduced: false, tie: Tie::None }
}

/// A reduction of `shape` over `axes` (resolved), mean or sum; `splittable` false forbids
/// splitting the reduced dimensions (a max has no partial-sum form).
pub fn reduce_spec(shape: &[usize], axes: &[usize], keep_dims: bool, mean: bool, splittable: bool) -> OpSpec {
    let dims = shape
        .iter()
        .enumerate()
        .map(|(d, &s)| {
            if !axes.contains(&d) {
                LogicalDim::free(s)
            } else if splittable {
                LogicalDim::reduced(s)
            } else {
                LogicalDim::fixed(s, "a reduced dimension of ReduceMax cannot be split")
            }
        })
        .collect();
    let output = (0..shape.len()).filter_map(|d| if axes.contains(&d) { keep_dims.then_some(None) } else { Some(Some(d)) }).collect();
    OpSpec { dims, inputs: vec![same_dims(shape)], output, mean_over_reduced: mean, tie: Tie::None }
}

/// MatMul / BatchMatMul: logical `[b.., i, k, j]`, k reduced.
pub fn matmul_spec(a: &[usize], b: &[usize], ta: bool, tb: bool) -> OpSpec {
    let na = a.len();
    let nb = b.len();
    let batch = &a[..na - 2];
    let (i, k) = if ta { (a[na - 1], a[na - 2]) } else { (a[na - 2], a[na - 1]) };
    let j = if tb { b[nb - 2] } else { b[nb - 1] };
    let mut dims: Vec<LogicalDim> = batch.iter().map(|&s| LogicalDim::free(s)).collect();
    let nbatch = dims.len();
    dims.push(LogicalDim::free(i));
    dims.push(LogicalDim::reduced(k));
    dims.push(LogicalDim::free(j));
    let (li, lk, lj) = (nbatch, nbatch + 1, nbatch + 2);
    let mut amap: Vec<Option<usize>> = (0..nbatch).map(Some).collect();
    amap.extend(if ta { [Some(lk), Some(li)] } else { [Some(li), Some(lk)] });
    let b_batch = nb - 2;
    let mut bmap: Vec<Option<usize>> = (0..b_batch)
        .map(|t| {
            let p = nbatch - b_batch + t;
            (b[t] == batch[p]).then_some(p)
        })
        .collect();
    bmap.extend(if tb { [Some(lj), Some(lk)] } else { [Some(lk), Some(lj)] });
    let mut out: Vec<Option<usize>> = (0..nbatch).map(Some).collect();
    out.extend([Some(li), Some(lj)]);
    OpSpec { dims, inputs: vec![amap, bmap], output: out, mean_over_reduced: false, tie: Tie::None }
}

/// Why a strategy does not fit an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StrategyProblem {
    /// The strategy gives `given` split tuples for an op of `inputs` inputs.
    InputCount {
        /// Inputs of the op.
        inputs: usize,
        /// Split tuples in the strategy.
        given: usize,
    },
    /// Input `input` has `dims` dimensions, its split tuple `given` entries.
    Rank {
        /// Position of the input, counted from 0.
        input: usize,
        /// The input's rank (its number of dimensions).
        dims: usize,
        /// Entries in its split tuple.
        given: usize,
    },
    /// A split of 0.
    ZeroSplit {
        /// Position of the input, counted from 0.
        input: usize,
        /// The input's dimension, counted from 0.
        dim: usize,
    },
    /// A dimension that is broadcast (or never split) is split.
    NotSplittable {
        /// Position of the input, counted from 0.
        input: usize,
        /// The input's dimension, counted from 0.
        dim: usize,
        /// The split count asked for.
        split: usize,
    },
    /// Two inputs split the same logical dimension differently.
    Mismatch {
        /// Position of the input, counted from 0.
        input: usize,
        /// The input's dimension, counted from 0.
        dim: usize,
        /// Its split count.
        split: usize,
        /// The split count an earlier input gives the same logical dimension.
        other: usize,
    },
    /// A logical dimension the op cannot split.
    Fixed {
        /// The logical dimension, counted from 0.
        logical: usize,
        /// The split count asked for.
        split: usize,
        /// Why the op cannot split it.
        why: &'static str,
    },
    /// The splits use more devices than there are, or a number that does not divide them.
    Devices {
        /// Devices the splits use: the product of the split counts.
        used: usize,
        /// Devices available.
        devices: usize,
    },
    /// The layouts the strategy gives are invalid (a split that does not divide a dimension).
    Layout {
        /// What has the invalid layout, in words (`input`, `output`, `device matrix of input`).
        what: &'static str,
        /// Position of the input, counted from 0 (0 for the output and the device matrix).
        input: usize,
        /// The layout error, as text.
        detail: String,
    },
    /// Two inputs split the same logical dimension along different named axes (a `Layout`).
    AxesMismatch {
        /// Position of the input, counted from 0.
        input: u32,
        /// The input's dimension, counted from 0.
        dim: u32,
        /// The axes it names, as text (`["mp", "sp"]`).
        axes: Box<str>,
        /// The axes an earlier input names for the same logical dimension, as text.
        other: Box<str>,
    },
    /// A `Layout`'s device matrix spans another number of devices than the op runs on.
    LayoutDevices {
        /// Devices the layout's device matrix spans (its virtual axis left out).
        spans: usize,
        /// Devices the op runs on (the job's, or its pipeline stage's).
        devices: usize,
    },
    /// The op has no sharded form.
    NoShardedForm,
}

impl fmt::Display for StrategyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StrategyProblem::InputCount { inputs, given } => write!(f, "the op has {inputs} inputs, the strategy gives {given}"),
            StrategyProblem::Rank { input, dims, given } => write!(f, "input {input} has {dims} dimensions, its strategy {given} entries"),
            StrategyProblem::ZeroSplit { input, dim } => write!(f, "input {input} dimension {dim} has a split of 0"),
            StrategyProblem::NotSplittable { input, dim, split } => {
                write!(f, "input {input} dimension {dim} cannot be split (it is broadcast or not splittable), got {split}")
            }
            StrategyProblem::Mismatch { input, dim, split, other } => write!(
                f,
                "input {input} dimension {dim} is split {split} ways but another input splits the same dimension {other} ways; they must match"
            ),
            StrategyProblem::Fixed { logical, split, why } => write!(f, "{why} (logical dimension {logical}, split {split})"),
            StrategyProblem::Devices { used, devices } => {
                write!(f, "it uses {used} devices, which does not divide the {devices} devices")
            }
            StrategyProblem::Layout { what, input, detail } => write!(f, "{what} {input}: {detail}"),
            StrategyProblem::AxesMismatch { input, dim, axes, other } => write!(
                f,
                "input {input} dimension {dim} is split along axes {axes} but another input splits the same dimension along {other}; they must name the same axes"
            ),
            StrategyProblem::LayoutDevices { spans, devices } => write!(
                f,
                "its device matrix spans {spans} devices and the op runs on {devices}; the product of a Layout's device matrix is the devices of the job (or of its pipeline stage)"
            ),
            StrategyProblem::NoShardedForm => write!(f, "this op has no sharded form yet; it runs replicated"),
        }
    }
}

/// A chosen strategy with the layouts it gives (global shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct OpLayouts {
    /// The strategy, per input and per tensor dimension.
    pub strategy: Strategy,
    /// Split count per logical dimension.
    pub splits: Vec<usize>,
    /// The device-matrix axes each logical dimension is split over, the most significant
    /// first (empty: not split; several under a MindSpore `Layout` naming several).
    pub logical_axes: Vec<Vec<usize>>,
    /// The device matrix (MindSpore's `dev_matrix`): the split counts plus the repeat axis on the right.
    pub mesh: DeviceMatrix,
    /// Layouts the inputs must have (never partial).
    pub inputs: Vec<TensorLayout>,
    /// Layout of the output (partial along the axes of split reduced dimensions).
    pub output: TensorLayout,
    /// Factor each rank applies to its local output (mean over split reduced dimensions).
    pub output_scale: Option<f64>,
}

impl OpSpec {
    fn bad(&self, kind: &'static str, name: &str, strategy: &Strategy, problem: StrategyProblem) -> GraphError {
        GraphError::InvalidStrategy { kind, name: name.to_string(), strategy: strategy.to_string(), problem }
    }

    /// Logical split counts from a user strategy (one split list per input, one split per
    /// dimension), checked against this op (`kind` and `name` appear in errors).
    pub fn splits_from_strategy(&self, kind: &'static str, name: &str, strategy: &Strategy) -> Result<Vec<usize>> {
        let bad = |p| self.bad(kind, name, strategy, p);
        if strategy.0.len() != self.inputs.len() {
            return Err(bad(StrategyProblem::InputCount { inputs: self.inputs.len(), given: strategy.0.len() }));
        }
        let mut splits: Vec<Option<usize>> = vec![None; self.dims.len()];
        for (i, (dims, given)) in self.inputs.iter().zip(&strategy.0).enumerate() {
            if dims.len() != given.len() {
                return Err(bad(StrategyProblem::Rank { input: i, dims: dims.len(), given: given.len() }));
            }
            for (d, (&l, &s)) in dims.iter().zip(given).enumerate() {
                if s == 0 {
                    return Err(bad(StrategyProblem::ZeroSplit { input: i, dim: d }));
                }
                match l {
                    None if s != 1 => return Err(bad(StrategyProblem::NotSplittable { input: i, dim: d, split: s })),
                    None => {}
                    Some(l) => match splits[l] {
                        None => splits[l] = Some(s),
                        Some(prev) if prev != s => {
                            return Err(bad(StrategyProblem::Mismatch { input: i, dim: d, split: s, other: prev }));
                        }
                        Some(_) => {}
                    },
                }
            }
        }
        let splits: Vec<usize> = splits.into_iter().map(|s| s.unwrap_or(1)).collect();
        for (l, (dim, &s)) in self.dims.iter().zip(&splits).enumerate() {
            if s > 1 && !dim.splittable {
                return Err(bad(StrategyProblem::Fixed { logical: l, split: s, why: dim.why }));
            }
        }
        Ok(splits)
    }

    /// The strategy (per input, per dimension) of logical splits.
    pub fn strategy_of(&self, splits: &[usize]) -> Strategy {
        Strategy(self.inputs.iter().map(|dims| dims.iter().map(|l| l.map_or(1, |l| splits[l])).collect()).collect())
    }

    /// MindSpore's candidate strategies for `n` devices (without `fully_use_devices`): when `n`
    /// is a power of two, every strategy whose splits are powers of two dividing their
    /// dimension and whose product divides `n`; when `n` is `2^k * m` with `m` odd and above 1,
    /// each of those for `2^k` devices with one splittable dimension split `m` times more
    /// (where the dimension divides), and the strategy that splits nothing.
    pub fn valid_splits(&self, n: usize) -> Vec<Vec<usize>> {
        let odd = if n == 0 { 1 } else { n >> n.trailing_zeros() };
        let base = self.power_of_two_splits(n / odd);
        if odd == 1 {
            return base;
        }
        let mut out = vec![vec![1; self.dims.len()]];
        for s in &base {
            for (j, dim) in self.dims.iter().enumerate() {
                if dim.splittable && dim.size.is_multiple_of(s[j] * odd) {
                    let mut t = s.clone();
                    t[j] *= odd;
                    if !out.contains(&t) {
                        out.push(t);
                    }
                }
            }
        }
        out
    }

    /// The power-of-two part of [`Self::valid_splits`].
    fn power_of_two_splits(&self, n: usize) -> Vec<Vec<usize>> {
        let mut out = vec![vec![]];
        for dim in &self.dims {
            let mut next = Vec::new();
            for prefix in &out {
                let used: usize = prefix.iter().product();
                let mut s = 1;
                loop {
                    if used * s > n || !n.is_multiple_of(used * s) {
                        break;
                    }
                    if dim.size.is_multiple_of(s) && (s == 1 || dim.splittable) {
                        let mut p = prefix.clone();
                        p.push(s);
                        next.push(p);
                    }
                    if !dim.splittable {
                        break;
                    }
                    s *= 2;
                }
            }
            out = next;
        }
        out
    }

    /// Device matrix and layouts for logical `splits` on `n` devices (repeat axis on the right).
    pub fn layouts(
        &self,
        kind: &'static str,
        name: &str,
        ins: &[&TensorType],
        out: &TensorType,
        splits: &[usize],
        n: usize,
    ) -> Result<OpLayouts> {
        let strategy = self.strategy_of(splits);
        let bad = |p| self.bad(kind, name, &strategy, p);
        let product: usize = splits.iter().product();
        if product == 0 || product > n || !n.is_multiple_of(product) {
            return Err(bad(StrategyProblem::Devices { used: product, devices: n }));
        }
        let (mesh, axis_of) = DeviceMatrix::of_splits(splits, n)
            .map_err(|e| bad(StrategyProblem::Layout { what: "device matrix of input", input: 0, detail: e.to_string() }))?;
        let axes = axis_of.into_iter().map(|a| a.into_iter().collect()).collect();
        self.layouts_on(kind, name, ins, out, strategy, splits, mesh, axes)
    }

    /// The op's layouts on `n` devices: on the user's MindSpore `layout` where it runs on one
    /// ([`OpSpec::named_layouts`]), else for logical `splits` ([`OpSpec::layouts`]).
    #[allow(clippy::too_many_arguments)]
    pub fn layouts_for(
        &self,
        kind: &'static str,
        name: &str,
        ins: &[&TensorType],
        out: &TensorType,
        splits: &[usize],
        layout: Option<&NamedLayout>,
        n: usize,
    ) -> Result<OpLayouts> {
        match layout {
            Some(l) => self.named_layouts(kind, name, ins, out, l, n),
            None => self.layouts(kind, name, ins, out, splits, n),
        }
    }

    /// Device matrix and layouts for MindSpore `Layout`s (one per input) on `n` devices: the
    /// layout's device matrix, each logical dimension split along the axes its inputs name (the
    /// same axes in every input that reads it), the output split as its logical dimensions are
    /// and a pending partial sum along the axes of split reduced dimensions. Axes no dimension
    /// names hold replicas.
    pub fn named_layouts(
        &self,
        kind: &'static str,
        name: &str,
        ins: &[&TensorType],
        out: &TensorType,
        layout: &NamedLayout,
        n: usize,
    ) -> Result<OpLayouts> {
        let strategy = layout.strategy();
        // Errors name the layout as the user wrote it, with the split counts it gives.
        let named = |e: GraphError| match e {
            GraphError::InvalidStrategy { kind, name, strategy, problem } => {
                GraphError::InvalidLayout { kind, name, layout: format!("{layout} (split counts {strategy})"), problem }
            }
            other => other,
        };
        let splits = self.splits_from_strategy(kind, name, &strategy).map_err(named)?;
        let bad = |p| named(self.bad(kind, name, &strategy, p));
        if layout.devices() != n {
            return Err(bad(StrategyProblem::LayoutDevices { spans: layout.devices(), devices: n }));
        }
        let detail = |e: autopar_layout::LayoutError| bad(StrategyProblem::Layout { what: "layout", input: 0, detail: e.to_string() });
        let (mesh, _) = layout.mesh().map_err(detail)?;
        let names = |i: usize, d: usize| -> Box<str> {
            let v: Vec<&String> =
                layout.input_axes(i)[d].iter().map(|&a| &layout.alias()[a]).filter(|a| *a != autopar_layout::INTERLEAVED).collect();
            format!("{v:?}").into()
        };
        let mut axes: Vec<Option<(Vec<usize>, usize, usize)>> = vec![None; self.dims.len()];
        for (i, dims) in self.inputs.iter().enumerate() {
            let given = layout.mesh_axes(i).map_err(detail)?;
            for (d, l) in dims.iter().enumerate() {
                let Some(l) = *l else { continue };
                match &axes[l] {
                    None => axes[l] = Some((given[d].clone(), i, d)),
                    Some((prev, pi, pd)) if *prev != given[d] => {
                        let (input, dim) = (i as u32, d as u32);
                        return Err(bad(StrategyProblem::AxesMismatch { input, dim, axes: names(i, d), other: names(*pi, *pd) }));
                    }
                    Some(_) => {}
                }
            }
        }
        let axes = axes.into_iter().map(|a| a.map(|(a, _, _)| a).unwrap_or_default()).collect();
        self.layouts_on(kind, name, ins, out, strategy, &splits, mesh, axes)
    }

    /// The layouts of `splits` on `mesh`, each logical dimension split along `axes`.
    #[allow(clippy::too_many_arguments)]
    fn layouts_on(
        &self,
        kind: &'static str,
        name: &str,
        ins: &[&TensorType],
        out: &TensorType,
        strategy: Strategy,
        splits: &[usize],
        mesh: DeviceMatrix,
        axes: Vec<Vec<usize>>,
    ) -> Result<OpLayouts> {
        let bad = |p| self.bad(kind, name, &strategy, p);
        let map =
            |dims: &[Option<usize>]| -> Vec<Vec<usize>> { dims.iter().map(|l| l.map(|l| axes[l].clone()).unwrap_or_default()).collect() };
        let inputs = self
            .inputs
            .iter()
            .zip(ins)
            .enumerate()
            .map(|(i, (dims, t))| {
                TensorLayout::new(mesh.clone(), map(dims), t.shape.clone())
                    .map_err(|e| bad(StrategyProblem::Layout { what: "input", input: i, detail: e.to_string() }))
            })
            .collect::<Result<Vec<_>>>()?;
        let partial: Vec<usize> =
            self.dims.iter().enumerate().filter(|(l, d)| d.reduced && splits[*l] > 1).flat_map(|(l, _)| axes[l].iter().copied()).collect();
        let output = TensorLayout::new(mesh.clone(), map(&self.output), out.shape.clone())
            .and_then(|l| l.with_partial(partial.clone()))
            .map_err(|e| bad(StrategyProblem::Layout { what: "output", input: 0, detail: e.to_string() }))?;
        let reduced_split: usize = self.dims.iter().zip(splits).filter(|(d, _)| d.reduced).map(|(_, &s)| s).product();
        let output_scale = (self.mean_over_reduced && reduced_split > 1).then(|| 1.0 / reduced_split as f64);
        Ok(OpLayouts { strategy, splits: splits.to_vec(), logical_axes: axes, mesh, inputs, output, output_scale })
    }
}

/// The cost of a collective op on its local input `x`: one call of `kind` over `group` with
/// `x`'s bytes (an empty list on a group of one rank).
pub fn collective_cost(cx: &CostCx<'_>, kind: Collective, group: &[usize]) -> OpCost {
    let comm =
        if group.len() > 1 { vec![CommCall { kind, group: sorted(group), bytes: CostCx::bytes_of(&cx.inputs[0]) }] } else { Vec::new() };
    cx.movement().with_comm(comm)
}

fn sorted(group: &[usize]) -> Vec<usize> {
    let mut g = group.to_vec();
    g.sort_unstable();
    g
}

/// An all-reduce of `count` values of `dtype` over `group`, as ops that synchronise statistics
/// make (sums in f64, a softmax's row maxima and sums in its dtype); none on a group of one.
pub fn group_reduce(group: &[usize], count: usize, dtype: DType) -> Option<CommCall> {
    (group.len() > 1).then(|| CommCall { kind: Collective::AllReduce, group: sorted(group), bytes: count * dtype.size() })
}

/// Where a local block sits in the whole tensor: its offset per dimension and the whole shape
/// (what Dropout's mask and the positions of RotaryEmbedding and Attention are keyed by).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DropoutBlock {
    /// Shape of the whole tensor.
    pub global_shape: Vec<usize>,
    /// Offset of the block in each dimension of the whole tensor.
    pub begin: Vec<usize>,
}

/// Rows `start..start + len` (along the gathered axis) of a table of `total` rows, `len` the
/// local size: an index outside the rows this rank holds gathers zeros, so the sum of the
/// ranks' results is the gather from the whole table; an index outside `0..total` is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableShard {
    /// The first row this rank holds.
    pub start: usize,
    /// Rows of the whole table.
    pub total: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dims: Vec<LogicalDim>) -> OpSpec {
        let n = dims.len();
        OpSpec {
            dims,
            inputs: vec![(0..n).map(Some).collect()],
            output: (0..n).map(Some).collect(),
            mean_over_reduced: false,
            tie: Tie::None,
        }
    }

    #[test]
    fn candidates_are_powers_of_two_and_on_other_counts_one_dimension_takes_the_odd_factor() {
        let s = spec(vec![LogicalDim::free(12), LogicalDim::free(8), LogicalDim::fixed(6, "kept whole")]);
        let mut got = s.valid_splits(8);
        got.sort();
        assert_eq!(got, [[1, 1, 1], [1, 2, 1], [1, 4, 1], [1, 8, 1], [2, 1, 1], [2, 2, 1], [2, 4, 1], [4, 1, 1], [4, 2, 1]]);
        // 6 = 2 * 3: the splits for 2 devices, each 3 times more on one dimension that divides
        // (12 does, 8 does not; the fixed one never), and no split at all.
        let mut got = s.valid_splits(6);
        got.sort();
        assert_eq!(got, [[1, 1, 1], [3, 1, 1], [3, 2, 1], [6, 1, 1]]);
        // No dimension takes the odd factor: nothing is split (as MindSpore, which does not
        // split 2 ways and leave 3 replicas).
        let small = spec(vec![LogicalDim::free(4), LogicalDim::free(8)]);
        assert_eq!(small.valid_splits(6), [[1, 1]]);
        // An odd count: the odd factor alone.
        let mut got = s.valid_splits(3);
        got.sort();
        assert_eq!(got, [[1, 1, 1], [3, 1, 1]]);
        for n in 1..=24 {
            for split in s.valid_splits(n) {
                let p: usize = split.iter().product();
                assert!(n.is_multiple_of(p), "{n}: {split:?}");
                assert!(split.iter().zip(&s.dims).all(|(&k, d)| d.size.is_multiple_of(k) && (k == 1 || d.splittable)), "{n}: {split:?}");
            }
        }
    }
}
