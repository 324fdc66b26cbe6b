//! Sharding rules: how every op of the IR may be split.
//!
//! Each op is described by its **logical dimensions** (the loops of its computation: MatMul
//! `[b.., i, k, j]`, an element-wise op the dimensions of its output, a convolution
//! `[n, c_out, c_in]`), which tensor dimension of each input and of the output runs along which
//! logical dimension, which logical dimensions may be split, and which are reduced (a split
//! reduced dimension makes the output a pending partial sum, to be all-reduced or
//! reduce-scattered by the redistribution its consumer needs). A strategy is then a split count
//! per logical dimension; the device matrix is the split counts (in logical order, sizes of 1
//! squeezed out) plus MindSpore's repeated-calculation axis on the right, and every tensor map
//! follows. This reproduces MindSpore's device matrices (MatMul `((2,1),(1,4))` -> `[2,4]`,
//! element-wise `(2,1)` on 8 devices -> `[2,4]` with the repeat axis).
//!
//! Some ops need the whole tensor and stay exact when split because the planner ties each
//! local op to the whole (see `planner::Emitter::local_op`): a training BatchNorm with a split
//! batch, a Softmax with a split axis and a LayerNorm with split normalised dimensions reduce
//! their statistics over the ranks that split them ([`OpSpec::synced`], counted in the cost), a
//! Dropout draws its block of the whole mask, and a Gather from a table split on the vocabulary
//! looks up its own rows, leaving a partial sum like a split contraction.
//!
//! [`op_rule`] has one arm per [`OpKind`] (an exhaustive match: a new op without a rule does not
//! compile). Ops whose layout follows their input (Reshape, Flatten) are handled by the planner;
//! ops without a sharded form run replicated; communication and backward ops have no rule in
//! semi_auto_parallel (the planner inserts communication, autodiff makes backward ops).

use autopar_graph::{normalize_axis, Node, OpKind, TensorType};
use autopar_layout::{DeviceMatrix, Strategy, TensorLayout};

use crate::error::{ParallelError, Result};

/// One loop dimension of an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalDim {
    pub size: usize,
    /// Whether this dimension may be split; when not, `why` says so in errors.
    pub splittable: bool,
    /// A reduced dimension: splitting it leaves a partial sum in the output.
    pub reduced: bool,
    pub why: &'static str,
}

impl LogicalDim {
    fn free(size: usize) -> Self {
        Self { size, splittable: true, reduced: false, why: "" }
    }
    fn fixed(size: usize, why: &'static str) -> Self {
        Self { size, splittable: false, reduced: false, why }
    }
    fn reduced(size: usize) -> Self {
        Self { size, splittable: true, reduced: true, why: "" }
    }
}

/// The sharding description of one op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSpec {
    pub dims: Vec<LogicalDim>,
    /// Per input, per tensor dimension: the logical dimension it runs along (None: a broadcast
    /// dimension of size 1 or one that is never split).
    pub inputs: Vec<Vec<Option<usize>>>,
    pub output: Vec<Option<usize>>,
    /// The output is a mean over the reduced dimensions: each rank's local result is scaled by
    /// its share before the partial sum is completed.
    pub mean_over_reduced: bool,
    /// Statistics taken over logical dimensions (BatchNorm in training over the batch, Softmax
    /// over its axis, LayerNorm over the normalised dimensions): when they are split, the op
    /// reduces `elements` values per step over the ranks that split them (synchronised
    /// statistics). `(logical dimensions, elements)`.
    pub synced: Option<(Vec<usize>, usize)>,
}

/// What the planner does with an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpRule {
    /// Split by a strategy over logical dimensions.
    Spec(OpSpec),
    /// The output layout derives from the input's (Reshape, Flatten).
    FollowInput,
    /// No sharded form: every input and the output replicated.
    Replicated,
    /// Cannot appear in a graph the planner shards.
    Unsupported(&'static str),
}

/// A chosen strategy with the layouts it gives (global shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct Sharding {
    pub strategy: Strategy,
    pub splits: Vec<usize>,
    pub mesh: DeviceMatrix,
    /// Layouts the inputs must have (never partial).
    pub inputs: Vec<TensorLayout>,
    /// Layout of the output (partial along the axes of split reduced dimensions).
    pub output: TensorLayout,
    /// Factor each rank applies to its local output (mean over split reduced dimensions).
    pub output_scale: Option<f64>,
}

/// Estimated cost of one strategy, in bytes, per rank (MindSpore's cost model counts bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    pub compute: f64,
    pub communication: f64,
}

fn same_dims(shape: &[usize]) -> Vec<Option<usize>> {
    (0..shape.len()).map(Some).collect()
}

/// Broadcasting inputs aligned right on the output's dimensions; size-1 broadcast dims map to None.
fn broadcast_spec(out: &[usize], ins: &[&TensorType]) -> OpSpec {
    let n = out.len();
    let dims = out.iter().map(|&s| LogicalDim::free(s)).collect();
    let inputs = ins
        .iter()
        .map(|t| {
            let m = t.shape.len();
            t.shape.iter().enumerate().map(|(d, &s)| if s == out[n - m + d] { Some(n - m + d) } else { None }).collect()
        })
        .collect();
    OpSpec { dims, inputs, output: same_dims(out), mean_over_reduced: false, synced: None }
}

fn unary_spec(shape: &[usize], fixed: &[usize], why: &'static str) -> OpSpec {
    let dims =
        shape.iter().enumerate().map(|(d, &s)| if fixed.contains(&d) { LogicalDim::fixed(s, why) } else { LogicalDim::free(s) }).collect();
    OpSpec { dims, inputs: vec![same_dims(shape)], output: same_dims(shape), mean_over_reduced: false, synced: None }
}

/// `spec` with statistics over logical `dims`: `per_row` values for every element of the
/// other dimensions.
fn synced_over(mut spec: OpSpec, dims: &[usize], per_row: usize) -> OpSpec {
    let rows: usize = spec.dims.iter().enumerate().filter(|(l, _)| !dims.contains(l)).map(|(_, d)| d.size).product();
    spec.synced = Some((dims.to_vec(), per_row * rows + 1));
    spec
}

/// An axis attribute of a node whose shapes were checked when it was built.
fn axis(a: i64, rank: usize) -> usize {
    normalize_axis(a, rank).expect("graph nodes hold axes within their input's rank")
}

fn reduce_spec(shape: &[usize], axes: &[i64], keep_dims: bool, mean: bool, splittable: bool) -> OpSpec {
    let rank = shape.len();
    let reduced: Vec<usize> = if axes.is_empty() { (0..rank).collect() } else { axes.iter().map(|&a| axis(a, rank)).collect() };
    let dims = shape
        .iter()
        .enumerate()
        .map(|(d, &s)| {
            if !reduced.contains(&d) {
                LogicalDim::free(s)
            } else if splittable {
                LogicalDim::reduced(s)
            } else {
                LogicalDim::fixed(s, "a reduced dimension of ReduceMax cannot be split")
            }
        })
        .collect();
    let output = (0..rank).filter_map(|d| if reduced.contains(&d) { keep_dims.then_some(None) } else { Some(Some(d)) }).collect();
    OpSpec { dims, inputs: vec![same_dims(shape)], output, mean_over_reduced: mean, synced: None }
}

/// The rule of `node`, given its input types.
pub fn op_rule(node: &Node, ins: &[&TensorType]) -> OpRule {
    let out = &node.ty.shape;
    let shape = |i: usize| ins[i].shape.as_slice();
    match &node.op {
        OpKind::Input(_) | OpKind::Parameter(_) => OpRule::Replicated,
        OpKind::Fill(_) => OpRule::Replicated,
        OpKind::Add(_) | OpKind::Sub(_) | OpKind::Mul(_) | OpKind::Div(_) => OpRule::Spec(broadcast_spec(out, ins)),
        OpKind::Neg(_)
        | OpKind::Scale(_)
        | OpKind::Exp(_)
        | OpKind::Log(_)
        | OpKind::Sqrt(_)
        | OpKind::Relu(_)
        | OpKind::Gelu(_)
        | OpKind::Tanh(_)
        | OpKind::Sigmoid(_) => OpRule::Spec(unary_spec(out, &[], "")),
        // A split axis takes the row maximum and sum over the ranks that split it (and the
        // backward's row sum): 3 values per row.
        OpKind::Softmax(s) => OpRule::Spec(synced_over(unary_spec(out, &[], ""), &[axis(s.axis, out.len())], 3)),
        OpKind::LogSoftmax(s) => OpRule::Spec(synced_over(unary_spec(out, &[], ""), &[axis(s.axis, out.len())], 3)),
        OpKind::ReduceSum(r) => OpRule::Spec(reduce_spec(shape(0), &r.axes, r.keep_dims, false, true)),
        OpKind::ReduceMean(r) => OpRule::Spec(reduce_spec(shape(0), &r.axes, r.keep_dims, true, true)),
        OpKind::ReduceMax(r) => OpRule::Spec(reduce_spec(shape(0), &r.axes, r.keep_dims, false, false)),
        OpKind::Reshape(_) | OpKind::Flatten(_) => OpRule::FollowInput,
        OpKind::Transpose(t) => {
            let x = shape(0);
            let dims = x.iter().map(|&s| LogicalDim::free(s)).collect();
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![same_dims(x)],
                output: t.perm.iter().map(|&p| Some(p)).collect(),
                mean_over_reduced: false,
                synced: None,
            })
        }
        OpKind::Concat(c) => {
            let a = axis(c.axis, out.len());
            let dims = out
                .iter()
                .enumerate()
                .map(|(d, &s)| if d == a { LogicalDim::fixed(s, "the concatenation axis cannot be split") } else { LogicalDim::free(s) })
                .collect();
            let inputs = ins.iter().map(|t| (0..t.shape.len()).map(|d| (d != a).then_some(d)).collect()).collect();
            OpRule::Spec(OpSpec {
                dims,
                inputs,
                output: (0..out.len()).map(|d| (d != a).then_some(d)).collect(),
                mean_over_reduced: false,
                synced: None,
            })
        }
        OpKind::Slice(s) => {
            let x = shape(0);
            let fixed: Vec<usize> = (0..x.len()).filter(|&d| s.begin[d] != 0 || s.size[d] != x[d]).collect();
            OpRule::Spec(unary_spec(x, &fixed, "a sliced dimension cannot be split"))
        }
        OpKind::Pad(p) => {
            let x = shape(0);
            let fixed: Vec<usize> = (0..x.len()).filter(|&d| p.before[d] != 0 || p.after[d] != 0).collect();
            let mut spec = unary_spec(x, &fixed, "a padded dimension cannot be split");
            for &d in &fixed {
                spec.dims[d].size = out[d];
                spec.inputs[0][d] = None;
                spec.output[d] = None;
            }
            OpRule::Spec(spec)
        }
        OpKind::Gather(g) => {
            // table [V, H..] gathered along axis 0 by indices [B..] -> [B.., H..]
            let (table, idx) = (shape(0), shape(1));
            if axis(g.axis, table.len()) != 0 {
                return OpRule::Replicated;
            }
            let mut dims: Vec<LogicalDim> = idx.iter().map(|&s| LogicalDim::free(s)).collect();
            let vocab = dims.len();
            // A split vocabulary: each rank gathers its rows (zeros elsewhere), a partial sum.
            dims.push(LogicalDim::reduced(table[0]));
            let mut tmap = vec![Some(vocab)];
            for &s in &table[1..] {
                tmap.push(Some(dims.len()));
                dims.push(LogicalDim::free(s));
            }
            let output: Vec<Option<usize>> = (0..idx.len()).map(Some).chain((vocab + 1..dims.len()).map(Some)).collect();
            OpRule::Spec(OpSpec { dims, inputs: vec![tmap, same_dims(idx)], output, mean_over_reduced: false, synced: None })
        }
        OpKind::OneHot(_) => {
            let idx = shape(0);
            let mut dims: Vec<LogicalDim> = idx.iter().map(|&s| LogicalDim::free(s)).collect();
            dims.push(LogicalDim::fixed(out[out.len() - 1], "the one-hot depth cannot be split"));
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![same_dims(idx)],
                output: (0..out.len()).map(Some).collect(),
                mean_over_reduced: false,
                synced: None,
            })
        }
        OpKind::MatMul(m) => OpRule::Spec(matmul_spec(shape(0), shape(1), m.transpose_a, m.transpose_b)),
        OpKind::BatchMatMul(m) => OpRule::Spec(matmul_spec(shape(0), shape(1), m.transpose_a, m.transpose_b)),
        OpKind::BiasAdd(_) => {
            let x = shape(0);
            let dims = x.iter().map(|&s| LogicalDim::free(s)).collect();
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![same_dims(x), vec![Some(1)]],
                output: same_dims(x),
                mean_over_reduced: false,
                synced: None,
            })
        }
        OpKind::Conv2D(c) => {
            // x [N, Cin, H, W], w [Cout, Cin/g, kh, kw] -> [N, Cout, H', W']; logical [n, co, ci]
            let (x, w) = (shape(0), shape(1));
            let grouped = c.conv.groups != 1;
            let dims = vec![
                LogicalDim::free(x[0]),
                if grouped {
                    LogicalDim::fixed(w[0], "output channels of a grouped convolution cannot be split")
                } else {
                    LogicalDim::free(w[0])
                },
                if grouped {
                    LogicalDim::fixed(x[1], "input channels of a grouped convolution cannot be split")
                } else {
                    LogicalDim::reduced(x[1])
                },
            ];
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![vec![Some(0), Some(2), None, None], vec![Some(1), Some(2), None, None]],
                output: vec![Some(0), Some(1), None, None],
                mean_over_reduced: false,
                synced: None,
            })
        }
        OpKind::MaxPool(_) | OpKind::AvgPool(_) => {
            let x = shape(0);
            let dims = vec![LogicalDim::free(x[0]), LogicalDim::free(x[1])];
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![vec![Some(0), Some(1), None, None]],
                output: vec![Some(0), Some(1), None, None],
                mean_over_reduced: false,
                synced: None,
            })
        }
        OpKind::GlobalAvgPool(_) => {
            let x = shape(0);
            let dims = vec![LogicalDim::free(x[0]), LogicalDim::free(x[1])];
            let mut input = vec![Some(0), Some(1)];
            input.resize(x.len(), None);
            let mut output = vec![Some(0), Some(1)];
            output.resize(out.len(), None);
            OpRule::Spec(OpSpec { dims, inputs: vec![input], output, mean_over_reduced: false, synced: None })
        }
        OpKind::BatchNorm(bn) => {
            // A split batch in training keeps exact statistics by summing them over the ranks
            // that split it (synchronised batch norm): 2C + 1 values forward, 2C backward (the
            // backward reuses the forward's statistics).
            let x = shape(0);
            let dims = vec![LogicalDim::free(x[0]), LogicalDim::free(x[1])];
            let mut xin = vec![Some(0), Some(1)];
            xin.resize(x.len(), None);
            let c = vec![Some(1)];
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![xin.clone(), c.clone(), c.clone(), c.clone(), c],
                output: xin,
                mean_over_reduced: false,
                synced: bn.training.then(|| (vec![0], 4 * x[1] + 1)),
            })
        }
        OpKind::LayerNorm(ln) => {
            // Split normalised dimensions sum each row's statistics over the ranks that split
            // them: 2 sums and a count forward, 2 sums backward per row.
            let x = shape(0);
            let b = axis(ln.begin_norm_axis, x.len());
            let mut spec = synced_over(unary_spec(x, &[], ""), &(b..x.len()).collect::<Vec<_>>(), 4);
            let param: Vec<Option<usize>> = (b..x.len()).map(Some).collect();
            spec.inputs.push(param.clone());
            spec.inputs.push(param);
            OpRule::Spec(spec)
        }
        // Each slice draws its block of the whole tensor's mask (the planner sets the block).
        OpKind::Dropout(_) => OpRule::Spec(unary_spec(out, &[], "")),
        OpKind::SoftmaxCrossEntropy(_) => {
            let logits = shape(0);
            let dims = vec![LogicalDim::reduced(logits[0]), LogicalDim::fixed(logits[1], "the class dimension cannot be split")];
            OpRule::Spec(OpSpec {
                dims,
                inputs: vec![vec![Some(0), Some(1)], vec![Some(0)]],
                output: vec![],
                mean_over_reduced: true,
                synced: None,
            })
        }
        OpKind::BroadcastTo(_) | OpKind::SumTo(_) => OpRule::Replicated,
        OpKind::AllReduce(_)
        | OpKind::AllGather(_)
        | OpKind::ReduceScatter(_)
        | OpKind::AllToAll(_)
        | OpKind::Broadcast(_)
        | OpKind::Reduce(_)
        | OpKind::Send(_)
        | OpKind::Recv(_) => OpRule::Unsupported(
            "communication is inserted automatically in semi_auto_parallel; write collectives by hand under hybrid_parallel",
        ),
        OpKind::ReluGrad(_)
        | OpKind::GeluGrad(_)
        | OpKind::ReduceMaxGrad(_)
        | OpKind::GatherGrad(_)
        | OpKind::Conv2DGradInput(_)
        | OpKind::Conv2DGradFilter(_)
        | OpKind::MaxPoolGrad(_)
        | OpKind::AvgPoolGrad(_)
        | OpKind::BatchNormGrad(_)
        | OpKind::LayerNormGrad(_) => {
            OpRule::Unsupported("backward ops are made by autodiff after sharding; give the planner the forward graph")
        }
    }
}

/// MatMul / BatchMatMul: logical `[b.., i, k, j]`, k reduced.
fn matmul_spec(a: &[usize], b: &[usize], ta: bool, tb: bool) -> OpSpec {
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
    OpSpec { dims, inputs: vec![amap, bmap], output: out, mean_over_reduced: false, synced: None }
}

impl OpSpec {
    /// Logical split counts from a user strategy (one split list per input, one split per
    /// dimension), checked against this op.
    pub fn splits_from_strategy(&self, node: &Node, strategy: &Strategy) -> Result<Vec<usize>> {
        let bad = |why: String| ParallelError::InvalidStrategy {
            kind: node.op.kind(),
            name: node.name.clone(),
            strategy: strategy.to_string(),
            why,
        };
        if strategy.0.len() != self.inputs.len() {
            return Err(bad(format!("the op has {} inputs, the strategy gives {}", self.inputs.len(), strategy.0.len())));
        }
        let mut splits: Vec<Option<usize>> = vec![None; self.dims.len()];
        for (i, (dims, given)) in self.inputs.iter().zip(&strategy.0).enumerate() {
            if dims.len() != given.len() {
                return Err(bad(format!("input {i} has {} dimensions, its strategy {} entries", dims.len(), given.len())));
            }
            for (d, (&l, &s)) in dims.iter().zip(given).enumerate() {
                if s == 0 {
                    return Err(bad(format!("input {i} dimension {d} has a split of 0")));
                }
                match l {
                    None if s != 1 => return Err(bad(format!("input {i} dimension {d} cannot be split (it is broadcast or not splittable), got {s}"))),
                    None => {}
                    Some(l) => match splits[l] {
                        None => splits[l] = Some(s),
                        Some(prev) if prev != s => {
                            return Err(bad(format!("input {i} dimension {d} is split {s} ways but another input splits the same dimension {prev} ways; they must match")))
                        }
                        Some(_) => {}
                    },
                }
            }
        }
        let splits: Vec<usize> = splits.into_iter().map(|s| s.unwrap_or(1)).collect();
        for (l, (dim, &s)) in self.dims.iter().zip(&splits).enumerate() {
            if s > 1 && !dim.splittable {
                return Err(bad(format!("{} (logical dimension {l}, split {s})", dim.why)));
            }
        }
        Ok(splits)
    }

    /// The strategy (per input, per dimension) of logical splits.
    pub fn strategy_of(&self, splits: &[usize]) -> Strategy {
        Strategy(self.inputs.iter().map(|dims| dims.iter().map(|l| l.map_or(1, |l| splits[l])).collect()).collect())
    }

    /// MindSpore's default for an unannotated op: data parallel, the logical dimension of the
    /// first input's first dimension split over as many devices as divide it.
    pub fn default_splits(&self, n: usize) -> Vec<usize> {
        let mut splits = vec![1; self.dims.len()];
        if let Some(Some(l)) = self.inputs.first().and_then(|d| d.first()) {
            let dim = &self.dims[*l];
            if dim.splittable && !dim.reduced {
                splits[*l] = gcd(n, dim.size);
            }
        }
        splits
    }

    /// Every strategy whose splits are powers of two dividing their dimension and whose product
    /// divides `n` (MindSpore's candidate enumeration without `fully_use_devices`).
    pub fn valid_splits(&self, n: usize) -> Vec<Vec<usize>> {
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
    pub fn sharding(&self, node: &Node, ins: &[&TensorType], splits: &[usize], n: usize) -> Result<Sharding> {
        let strategy = self.strategy_of(splits);
        let bad = |why: String| ParallelError::InvalidStrategy {
            kind: node.op.kind(),
            name: node.name.clone(),
            strategy: strategy.to_string(),
            why,
        };
        let product: usize = splits.iter().product();
        if product == 0 || product > n || !n.is_multiple_of(product) {
            return Err(bad(format!("it uses {product} devices, which does not divide the {n} devices")));
        }
        let mut mesh_dims = Vec::new();
        let mut axis_of = vec![None; splits.len()];
        for (l, &s) in splits.iter().enumerate() {
            if s > 1 {
                axis_of[l] = Some(mesh_dims.len());
                mesh_dims.push(s);
            }
        }
        if n / product > 1 {
            mesh_dims.push(n / product);
        }
        if mesh_dims.is_empty() {
            mesh_dims.push(1);
        }
        let mesh = DeviceMatrix::new(mesh_dims).map_err(|e| bad(e.to_string()))?;
        let map =
            |dims: &[Option<usize>]| -> Vec<Vec<usize>> { dims.iter().map(|l| l.and_then(|l| axis_of[l]).into_iter().collect()).collect() };
        let inputs = self
            .inputs
            .iter()
            .zip(ins)
            .enumerate()
            .map(|(i, (dims, t))| TensorLayout::new(mesh.clone(), map(dims), t.shape.clone()).map_err(|e| bad(format!("input {i}: {e}"))))
            .collect::<Result<Vec<_>>>()?;
        let partial: Vec<usize> =
            self.dims.iter().enumerate().filter(|(l, d)| d.reduced && splits[*l] > 1).filter_map(|(l, _)| axis_of[l]).collect();
        let output = TensorLayout::new(mesh.clone(), map(&self.output), node.ty.shape.clone())
            .and_then(|l| l.with_partial(partial.clone()))
            .map_err(|e| bad(format!("output: {e}")))?;
        let reduced_split: usize = self.dims.iter().zip(splits).filter(|(d, _)| d.reduced).map(|(_, &s)| s).product();
        let output_scale = (self.mean_over_reduced && reduced_split > 1).then(|| 1.0 / reduced_split as f64);
        Ok(Sharding { strategy, splits: splits.to_vec(), mesh, inputs, output, output_scale })
    }

    /// Estimated per-rank cost of `splits`: bytes touched by the local computation, and bytes
    /// the completion of a partial output sends (ring all-reduce).
    pub fn cost(&self, sharding: &Sharding, elem_size: usize) -> Cost {
        let local = |l: &TensorLayout| (l.slice_len() * elem_size) as f64;
        let compute = sharding.inputs.iter().map(local).sum::<f64>() + local(&sharding.output);
        let p: usize = sharding.output.partial_axes().iter().map(|&a| sharding.mesh.dims()[a]).product();
        let ring = |bytes: f64, p: usize| if p > 1 { 2.0 * bytes * (p - 1) as f64 / p as f64 } else { 0.0 };
        let mut communication = ring(local(&sharding.output), p);
        if let Some((dims, elements)) = &self.synced {
            let split: usize = dims.iter().map(|&d| sharding.splits[d]).product();
            communication += ring((elements * elem_size) as f64, split);
        }
        Cost { compute, communication }
    }
}

pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Annotate every op that has a sharding rule with a strategy drawn from its valid ones (seeded),
/// for tests that compare random strategies against stand-alone runs.
pub fn assign_random_strategies(graph: &mut autopar_graph::Graph, n: usize, seed: u64) {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..graph.len() {
        let id = autopar_graph::NodeId(i);
        let node = graph.node(id).clone();
        let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &graph.node(*x).ty).collect();
        if let OpRule::Spec(spec) = op_rule(&node, &ins) {
            if node.op.is_leaf() {
                continue;
            }
            let options = spec.valid_splits(n);
            let pick = &options[(next() % options.len() as u64) as usize];
            graph.node_mut(id).strategy = Some(spec.strategy_of(pick));
        }
    }
}
