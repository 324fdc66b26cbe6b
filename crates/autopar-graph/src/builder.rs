//! The builder API, in the spirit of MindSpore's `Cell` and `ops`: declare inputs and
//! parameters, apply ops (shapes checked as they are added), annotate ops with `.shard` /
//! a pipeline stage, and finish with a [`Graph`].
//!
//! ```
//! use autopar_graph::{GraphBuilder, DType, Initializer};
//! use autopar_layout::Strategy;
//!
//! let mut b = GraphBuilder::new(42);
//! let x = b.input("x", &[64, 784], DType::F32).unwrap();
//! let w = b.parameter("l1.w", &[784, 512], Initializer::Normal { mean: 0.0, std: 0.01 }).unwrap();
//! let h = b.matmul("l1", x, w).unwrap();
//! b.shard(h, Strategy::new(vec![vec![2, 1], vec![1, 4]])).unwrap();
//! let err = b.matmul("l2", h, w).unwrap_err();
//! assert_eq!(err.to_string(), "MatMul l2: inner dimensions 512 and 784 differ");
//! ```

use autopar_layout::{NamedLayout, Strategy};

use crate::error::Result;
use crate::graph::Graph;
use crate::init::{derive_seed, Initializer};
use crate::ops::*;
use crate::types::{DType, NodeId};

/// How to create a parameter beyond the defaults of [`GraphBuilder::parameter`].
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// The parameter's shape.
    pub shape: Vec<usize>,
    /// The parameter's element type (f32 by default).
    pub dtype: DType,
    /// How its initial values are drawn.
    pub init: Initializer,
    /// `None`: derived from the builder's seed and the parameter's name.
    pub seed: Option<u64>,
    /// Whether optimizers update it (true by default); running statistics and masks are frozen.
    pub trainable: bool,
}

impl ParamSpec {
    /// A trainable f32 parameter of `shape` drawn from `init`, its seed derived from its name.
    pub fn new(shape: &[usize], init: Initializer) -> Self {
        Self { shape: shape.to_vec(), dtype: DType::F32, init, seed: None, trainable: true }
    }

    /// This spec with element type `dtype`.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// This spec with a fixed initialiser seed instead of the derived one.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// This spec made non-trainable (a frozen parameter such as a running statistic).
    pub fn frozen(mut self) -> Self {
        self.trainable = false;
        self
    }
}

/// Builds a [`Graph`]. Every method checks shapes and dtypes as it adds a node and names the op
/// in its error.
#[derive(Clone, Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
    seed: u64,
    stage: Option<usize>,
}

impl GraphBuilder {
    /// A builder whose parameters draw from `seed` (each mixed with the parameter's name).
    pub fn new(seed: u64) -> Self {
        Self { graph: Graph::new(), seed, stage: None }
    }

    /// Continues building on an existing graph.
    pub fn from_graph(graph: Graph, seed: u64) -> Self {
        Self { graph, seed, stage: None }
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Ends building and returns the graph.
    pub fn finish(self) -> Graph {
        self.graph
    }

    /// Puts every node added from now on into pipeline stage `stage` (`None`: unassigned),
    /// like setting `cell.pipeline_stage` in MindSpore.
    pub fn set_pipeline_stage(&mut self, stage: Option<usize>) {
        self.stage = stage;
    }

    /// Records the ops added under `prefix` (`blocks.0.`) as one of the network's blocks
    /// ([`Graph::blocks`]): a cell that recomputation by blocks recomputes.
    pub fn block(&mut self, prefix: &str) {
        self.graph.blocks.push(prefix.to_string());
    }

    /// Marks op `id` for recomputation (MindSpore's `Primitive.recompute()`).
    pub fn recompute(&mut self, id: NodeId) -> Result<NodeId> {
        self.graph.recompute(id)?;
        Ok(id)
    }

    /// Marks the cell of the ops named under `prefix` for recomputation (MindSpore's
    /// `Cell.recompute()`): call it once the cell is built.
    pub fn recompute_block(&mut self, prefix: &str) -> Result<usize> {
        self.graph.recompute_block(prefix)
    }

    /// Marks `id` as a graph output.
    pub fn output(&mut self, id: NodeId) -> Result<NodeId> {
        self.graph.check_id(id)?;
        self.graph.outputs.push(id);
        Ok(id)
    }

    /// Annotates op `id` with a sharding strategy (MindSpore's `op.shard(strategy)`).
    pub fn shard(&mut self, id: NodeId, strategy: Strategy) -> Result<NodeId> {
        self.graph.set_strategy(id, strategy)?;
        Ok(id)
    }

    /// Annotates op `id` with MindSpore `Layout`s, one per input (`op.shard((layout("dp",
    /// "mp"), ...))`): the named device axes splitting each input dimension.
    pub fn shard_layout(&mut self, id: NodeId, layout: NamedLayout) -> Result<NodeId> {
        self.graph.set_layout(id, layout)?;
        Ok(id)
    }

    /// Puts op `id` into pipeline stage `stage`.
    pub fn stage(&mut self, id: NodeId, stage: usize) -> Result<NodeId> {
        self.graph.set_pipeline_stage(id, stage)?;
        Ok(id)
    }

    /// Adds any op.
    pub fn op(&mut self, name: &str, op: impl Into<OpKind>, inputs: &[NodeId]) -> Result<NodeId> {
        let id = self.graph.add(name, op, inputs)?;
        self.graph.node_mut(id).pipeline_stage = self.stage;
        Ok(id)
    }

    /// A graph input `name` that the caller feeds at every run (a batch, labels).
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<NodeId> {
        self.op(name, Input { shape: shape.to_vec(), dtype }, &[])
    }

    /// A trainable f32 parameter.
    pub fn parameter(&mut self, name: &str, shape: &[usize], init: Initializer) -> Result<NodeId> {
        self.parameter_with(name, ParamSpec::new(shape, init))
    }

    /// A parameter as `spec` describes it; errors when its initialiser cannot fill its shape.
    pub fn parameter_with(&mut self, name: &str, spec: ParamSpec) -> Result<NodeId> {
        let seed = spec.seed.unwrap_or_else(|| derive_seed(self.seed, name));
        // Validate the initialiser against the shape now rather than at the first run.
        if crate::init::fans(&spec.shape).is_none() || spec.shape.contains(&0) {
            spec.init.generate(name, &spec.shape, seed)?;
        }
        self.op(name, Parameter { shape: spec.shape, dtype: spec.dtype, init: spec.init, seed, trainable: spec.trainable }, &[])
    }

    /// A constant tensor of `shape` and `dtype` with every element `value`.
    pub fn fill(&mut self, name: &str, shape: &[usize], dtype: DType, value: f64) -> Result<NodeId> {
        self.op(name, Fill { shape: shape.to_vec(), dtype, value }, &[])
    }

    /// The 2-D matrix product `a b` (MindSpore's `MatMul`).
    pub fn matmul(&mut self, name: &str, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(name, MatMul { transpose_a: false, transpose_b: false }, &[a, b])
    }

    /// The 2-D matrix product with either operand transposed (MindSpore's `MatMul` with `transpose_a`/`transpose_b`).
    pub fn matmul_t(&mut self, name: &str, a: NodeId, b: NodeId, transpose_a: bool, transpose_b: bool) -> Result<NodeId> {
        self.op(name, MatMul { transpose_a, transpose_b }, &[a, b])
    }

    /// The batched matrix product over equal leading dimensions, either operand's last two dimensions transposed.
    pub fn batch_matmul(&mut self, name: &str, a: NodeId, b: NodeId, transpose_a: bool, transpose_b: bool) -> Result<NodeId> {
        self.op(name, BatchMatMul { transpose_a, transpose_b }, &[a, b])
    }

    /// Element-wise `a + b`, broadcasting.
    pub fn add(&mut self, name: &str, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(name, Add, &[a, b])
    }

    /// Element-wise `a - b`, broadcasting.
    pub fn sub(&mut self, name: &str, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(name, Sub, &[a, b])
    }

    /// Element-wise `a * b`, broadcasting.
    pub fn mul(&mut self, name: &str, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(name, Mul, &[a, b])
    }

    /// Element-wise `a / b`, broadcasting.
    pub fn div(&mut self, name: &str, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(name, Div, &[a, b])
    }

    /// Adds the `[C]` vector `bias` along dimension 1 of `x` (`[N, C, ...]`).
    pub fn bias_add(&mut self, name: &str, x: NodeId, bias: NodeId) -> Result<NodeId> {
        self.op(name, BiasAdd, &[x, bias])
    }

    /// `max(x, 0)`.
    pub fn relu(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Relu, &[x])
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    pub fn silu(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Silu, &[x])
    }

    /// GELU, tanh approximation (MindSpore's default).
    pub fn gelu(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Gelu { approximate: true }, &[x])
    }

    /// Hyperbolic tangent.
    pub fn tanh(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Tanh, &[x])
    }

    /// Logistic sigmoid.
    pub fn sigmoid(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Sigmoid, &[x])
    }

    /// `e^x`.
    pub fn exp(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Exp, &[x])
    }

    /// Natural logarithm.
    pub fn log(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Log, &[x])
    }

    /// Square root.
    pub fn sqrt(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Sqrt, &[x])
    }

    /// `-x`.
    pub fn neg(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Neg, &[x])
    }

    /// `x * factor` for a constant `factor`.
    pub fn scale(&mut self, name: &str, x: NodeId, factor: f64) -> Result<NodeId> {
        self.op(name, Scale { factor }, &[x])
    }

    /// Softmax along `axis` (negative counts from the end).
    pub fn softmax(&mut self, name: &str, x: NodeId, axis: i64) -> Result<NodeId> {
        self.op(name, Softmax { axis, group: Vec::new() }, &[x])
    }

    /// Log of the softmax along `axis` (negative counts from the end), computed stably.
    pub fn log_softmax(&mut self, name: &str, x: NodeId, axis: i64) -> Result<NodeId> {
        self.op(name, LogSoftmax { axis, group: Vec::new() }, &[x])
    }

    /// Sum over `axes` (negative counts from the end, empty means all), keeping them as size 1 when `keep_dims`.
    pub fn reduce_sum(&mut self, name: &str, x: NodeId, axes: &[i64], keep_dims: bool) -> Result<NodeId> {
        self.op(name, ReduceSum { axes: axes.to_vec(), keep_dims }, &[x])
    }

    /// Mean over `axes` (negative counts from the end, empty means all), keeping them as size 1 when `keep_dims`.
    pub fn reduce_mean(&mut self, name: &str, x: NodeId, axes: &[i64], keep_dims: bool) -> Result<NodeId> {
        self.op(name, ReduceMean { axes: axes.to_vec(), keep_dims }, &[x])
    }

    /// Maximum over `axes` (negative counts from the end, empty means all), keeping them as size 1 when `keep_dims`.
    pub fn reduce_max(&mut self, name: &str, x: NodeId, axes: &[i64], keep_dims: bool) -> Result<NodeId> {
        self.op(name, ReduceMax { axes: axes.to_vec(), keep_dims }, &[x])
    }

    /// `x` with a new shape of the same size; one entry may be `-1` (inferred).
    pub fn reshape(&mut self, name: &str, x: NodeId, shape: &[i64]) -> Result<NodeId> {
        self.op(name, Reshape { shape: shape.to_vec() }, &[x])
    }

    /// `x` with its dimensions permuted: output dimension `i` is input dimension `perm[i]`.
    pub fn transpose(&mut self, name: &str, x: NodeId, perm: &[usize]) -> Result<NodeId> {
        self.op(name, Transpose { perm: perm.to_vec() }, &[x])
    }

    /// `[N, d1, d2, ...] -> [N, d1 * d2 * ...]`.
    pub fn flatten(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, Flatten, &[x])
    }

    /// Embedding lookup when `axis` is 0.
    pub fn gather(&mut self, name: &str, params: NodeId, indices: NodeId, axis: i64) -> Result<NodeId> {
        self.op(name, Gather { axis, shard: None }, &[params, indices])
    }

    /// One-hot encoding (1 and 0) of integer `indices` along a new last axis of size `depth`.
    pub fn one_hot(&mut self, name: &str, indices: NodeId, depth: usize, dtype: DType) -> Result<NodeId> {
        self.op(name, OneHot { depth, on_value: 1.0, off_value: 0.0, dtype }, &[indices])
    }

    /// Concatenation of `xs` along `axis` (negative counts from the end); all other dimensions must agree.
    pub fn concat(&mut self, name: &str, xs: &[NodeId], axis: i64) -> Result<NodeId> {
        self.op(name, Concat { axis }, xs)
    }

    /// The block `begin .. begin + size` of `x`.
    pub fn slice(&mut self, name: &str, x: NodeId, begin: &[usize], size: &[usize]) -> Result<NodeId> {
        self.op(name, Slice { begin: begin.to_vec(), size: size.to_vec() }, &[x])
    }

    /// 2-D convolution of `x [N, Cin, H, W]` with filter `w [Cout, Cin/groups, kh, kw]`.
    pub fn conv2d(&mut self, name: &str, x: NodeId, w: NodeId, conv: ConvAttrs) -> Result<NodeId> {
        self.op(name, Conv2D { conv }, &[x, w])
    }

    /// Inputs: `x, gamma, beta, running_mean, running_var`.
    pub fn batch_norm(&mut self, name: &str, inputs: [NodeId; 5], training: bool, eps: f64, momentum: f64) -> Result<NodeId> {
        self.op(name, BatchNorm { training, eps, momentum, group: Vec::new() }, &inputs)
    }

    /// A training BatchNorm whose statistics are taken over the batch parts of every rank of
    /// `group` (world ranks, ascending): synchronised batch norm for hand-written rank graphs.
    pub fn batch_norm_synced(&mut self, name: &str, inputs: [NodeId; 5], eps: f64, momentum: f64, group: &[usize]) -> Result<NodeId> {
        self.op(name, BatchNorm { training: true, eps, momentum, group: group.to_vec() }, &inputs)
    }

    /// Layer normalisation of `x` over the dimensions from `begin_norm_axis` on, scaled by `gamma` and shifted by `beta`.
    pub fn layer_norm(&mut self, name: &str, x: NodeId, gamma: NodeId, beta: NodeId, begin_norm_axis: i64, eps: f64) -> Result<NodeId> {
        self.op(name, LayerNorm { begin_norm_axis, eps, group: Vec::new() }, &[x, gamma, beta])
    }

    /// Root-mean-square normalisation of `x` over the dimensions from `begin_norm_axis` on, scaled by `gamma`.
    pub fn rms_norm(&mut self, name: &str, x: NodeId, gamma: NodeId, begin_norm_axis: i64, eps: f64) -> Result<NodeId> {
        self.op(name, RmsNorm { begin_norm_axis, eps, group: Vec::new() }, &[x, gamma])
    }

    /// Rotary position embedding of `x [..., T, D]` with base `theta` (positions along dimension -2).
    pub fn rotary_embedding(&mut self, name: &str, x: NodeId, theta: f64) -> Result<NodeId> {
        self.op(name, RotaryEmbedding { theta, offset: 0, inverse: false }, &[x])
    }

    /// Fused attention `softmax(scale · q kᵀ) v` of `q [N, KV, G, T, D]` over `k [N, KV, S, D]`,
    /// `v [N, KV, S, E]` ([`Attention`]), causal when asked.
    pub fn attention(&mut self, name: &str, q: NodeId, k: NodeId, v: NodeId, scale: f64, causal: bool) -> Result<NodeId> {
        self.op(name, Attention { scale, causal, row_offset: 0 }, &[q, k, v])
    }

    /// A mixture of experts' routing weights from expert probabilities `p [.., E]`: each row's
    /// `k` largest kept (renormalised when asked), the rest zero ([`RouterTopK`]).
    pub fn router_top_k(&mut self, name: &str, p: NodeId, k: usize, renormalize: bool, capacity: Option<usize>) -> Result<NodeId> {
        self.op(name, RouterTopK { k, renormalize, mask: false, capacity }, &[p])
    }

    /// The router's assignments of probabilities `p [.., E]`: 1 for each row's `k` largest, 0
    /// for the rest (no gradient).
    pub fn router_top_k_mask(&mut self, name: &str, p: NodeId, k: usize) -> Result<NodeId> {
        self.op(name, RouterTopK { k, renormalize: false, mask: true, capacity: None }, &[p])
    }

    /// Max pooling of `x [N, C, H, W]`.
    pub fn max_pool(&mut self, name: &str, x: NodeId, pool: PoolAttrs) -> Result<NodeId> {
        self.op(name, MaxPool { pool }, &[x])
    }

    /// Average pooling of `x [N, C, H, W]` (padding counts as zeros).
    pub fn avg_pool(&mut self, name: &str, x: NodeId, pool: PoolAttrs) -> Result<NodeId> {
        self.op(name, AvgPool { pool }, &[x])
    }

    /// Mean over the spatial dimensions: `[N, C, H, W] -> [N, C]`.
    pub fn global_avg_pool(&mut self, name: &str, x: NodeId) -> Result<NodeId> {
        self.op(name, GlobalAvgPool, &[x])
    }

    /// Dropout of `x` with drop probability `p` in `[0, 1)`, the mask drawn from `seed`.
    pub fn dropout(&mut self, name: &str, x: NodeId, p: f64, seed: u64) -> Result<NodeId> {
        self.op(name, Dropout { p, seed, block: None }, &[x])
    }

    /// Dropout of one block of a larger tensor (a hand-split batch): the mask is that block of
    /// the whole tensor's mask, so the ranks of a split draw what one device would.
    pub fn dropout_block(&mut self, name: &str, x: NodeId, p: f64, seed: u64, block: DropoutBlock) -> Result<NodeId> {
        self.op(name, Dropout { p, seed, block: Some(block) }, &[x])
    }

    /// Mean softmax cross-entropy of `logits [N, C]` against integer `labels [N]`; a scalar.
    pub fn softmax_cross_entropy(&mut self, name: &str, logits: NodeId, labels: NodeId) -> Result<NodeId> {
        self.op(name, SoftmaxCrossEntropy, &[logits, labels])
    }

    /// Element-wise reduction `op` across the global ranks `group`; every rank gets the result.
    pub fn all_reduce(&mut self, name: &str, x: NodeId, op: ReduceOp, group: &[usize]) -> Result<NodeId> {
        self.op(name, AllReduce { op, group: group.to_vec() }, &[x])
    }

    /// Concatenation of the tensors of the global ranks `group` along `dim`, in group order.
    pub fn all_gather(&mut self, name: &str, x: NodeId, dim: usize, group: &[usize]) -> Result<NodeId> {
        self.op(name, AllGather { dim, group: group.to_vec() }, &[x])
    }

    /// Reduction `op` across the global ranks `group`, rank `k` of the group keeping block `k` of `dim`.
    pub fn reduce_scatter(&mut self, name: &str, x: NodeId, op: ReduceOp, dim: usize, group: &[usize]) -> Result<NodeId> {
        self.op(name, ReduceScatter { op, dim, group: group.to_vec() }, &[x])
    }

    /// Splits `split_dim` into one block per rank of `group`, exchanges the blocks and concatenates them along `concat_dim`.
    pub fn all_to_all(&mut self, name: &str, x: NodeId, split_dim: usize, concat_dim: usize, group: &[usize]) -> Result<NodeId> {
        self.op(name, AllToAll { split_dim, concat_dim, group: group.to_vec() }, &[x])
    }

    /// Every rank of `group` receives the tensor of global rank `root`.
    pub fn broadcast(&mut self, name: &str, x: NodeId, root: usize, group: &[usize]) -> Result<NodeId> {
        self.op(name, Broadcast { root, group: group.to_vec() }, &[x])
    }

    /// Sends `x` to global rank `peer` with tag `tag`; the output is `x` itself.
    pub fn send(&mut self, name: &str, x: NodeId, peer: usize, tag: u32) -> Result<NodeId> {
        self.op(name, Send { peer, tag }, &[x])
    }

    /// Receives from global rank `peer` the tensor sent with tag `tag`; `like` gives its shape and dtype.
    pub fn recv(&mut self, name: &str, like: NodeId, peer: usize, tag: u32) -> Result<NodeId> {
        self.op(name, Recv { peer, tag }, &[like])
    }

    /// MindSpore's `nn.Dense`: weight `<name>.weight` `[out, in]` (applied transposed) and bias
    /// `<name>.bias` `[out]` (zeros); ops `<name>.matmul` and `<name>.bias_add`.
    pub fn dense(&mut self, name: &str, x: NodeId, out: usize, weight_init: Initializer) -> Result<NodeId> {
        let shape = self.graph.get(x)?.ty.shape.clone();
        let inp = *shape.last().unwrap_or(&0);
        let w = self.parameter(&format!("{name}.weight"), &[out, inp], weight_init)?;
        let b = self.parameter(&format!("{name}.bias"), &[out], Initializer::Zeros)?;
        let y = self.matmul_t(&format!("{name}.matmul"), x, w, false, true)?;
        self.bias_add(&format!("{name}.bias_add"), y, b)
    }
}
