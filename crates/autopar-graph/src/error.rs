//! The one error type of this crate. Variants carry the offending values, never preformatted text.

use thiserror::Error;

use crate::types::DType;

/// Everything that can go wrong while building, checking or differentiating a graph.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GraphError {
    /// A precision policy named by something that is not one.
    #[error(
        "{what} {given:?} is not one autopar knows; expected {expected}\nhint: give one of those, e.g. amp level O2 with amp dtype bf16"
    )]
    BadPrecision {
        /// What was named (`amp level`, `amp dtype`).
        what: &'static str,
        /// The name given.
        given: String,
        /// The names autopar takes.
        expected: &'static str,
    },

    /// Two sizes that must agree differ (inner dimensions of a MatMul, channels of a convolution, ...).
    #[error("{kind} {name}: {what} {a} and {b} differ")]
    DimMismatch {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Which sizes, in words (`inner dimensions`).
        what: &'static str,
        /// The first size.
        a: usize,
        /// The second size.
        b: usize,
    },

    /// The shapes of two inputs of an elementwise op do not broadcast (NumPy rules).
    #[error("{kind} {name}: shapes {lhs:?} and {rhs:?} do not broadcast\n  hint: trailing dimensions must be equal or 1")]
    NotBroadcastable {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Shape of the first input.
        lhs: Vec<usize>,
        /// Shape of the second input.
        rhs: Vec<usize>,
    },

    /// An input has a shape the op does not accept (wrong rank, ...).
    #[error("{kind} {name}: input {input} has shape {shape:?}; expected {expected}")]
    BadShape {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Position of the input, counted from 0.
        input: usize,
        /// The input's shape.
        shape: Vec<usize>,
        /// What was expected, in words.
        expected: &'static str,
    },

    /// An input has a dtype the op does not accept.
    #[error("{kind} {name}: input {input} has dtype {dtype}; expected {expected}")]
    BadDType {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Position of the input, counted from 0.
        input: usize,
        /// The input's dtype.
        dtype: DType,
        /// What was expected, in words.
        expected: &'static str,
    },

    /// Two inputs that must share a dtype differ.
    #[error("{kind} {name}: inputs {a} and {b} have different dtypes {da} and {db}\n  hint: insert a Cast so both inputs share one dtype")]
    DTypeMismatch {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Position of the first input, counted from 0.
        a: usize,
        /// Position of the second input, counted from 0.
        b: usize,
        /// Dtype of input `a`.
        da: DType,
        /// Dtype of input `b`.
        db: DType,
    },

    /// An attribute of the op is invalid for its input shapes (an axis out of range, ...).
    #[error("{kind} {name}: attribute {attr} = {value} is invalid for input shapes {shapes:?}; expected {expected}")]
    BadAttr {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// The attribute's name (`axis`).
        attr: &'static str,
        /// The attribute's value, as text.
        value: String,
        /// Shapes of all inputs.
        shapes: Vec<Vec<usize>>,
        /// What was expected, in words.
        expected: &'static str,
    },

    /// The op got the wrong number of inputs.
    #[error("{kind} {name}: takes {expected} inputs, got {got}")]
    Arity {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// How many inputs the op takes, in words (`2`, `at least 1`).
        expected: String,
        /// How many it got.
        got: usize,
    },

    /// A node was added under a name the graph already has.
    #[error("an op named {name:?} already exists (node %{existing})\n  hint: op and parameter names must be unique within a graph")]
    DuplicateName {
        /// The name.
        name: String,
        /// Index of the node that already has it.
        existing: usize,
    },

    /// A node id is out of range.
    #[error("node %{id} does not exist (the graph has {len} nodes)")]
    UnknownNode {
        /// The node id (index).
        id: usize,
        /// Number of nodes in the graph.
        len: usize,
    },

    /// A node takes as input a node that comes at or after it (the graph must be in topological order).
    #[error("{kind} {name}: input %{input} is defined after the op (node %{node})\n  hint: nodes are kept in topological order; add inputs first")]
    NotTopological {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Index of the node.
        node: usize,
        /// Index of the offending input node.
        input: usize,
    },

    /// No node has the name that was looked up.
    #[error("no node named {name:?}")]
    UnknownName {
        /// The name that was looked up.
        name: String,
    },

    /// Autodiff needs the gradient of an op input that has no backward rule.
    #[error("{kind} {name}: no backward rule gives the gradient of input {input}\n  hint: the op is not differentiable there (max/min collectives, or a gradient op differentiated a second time)")]
    NotDifferentiable {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// Position of the input, counted from 0.
        input: usize,
    },

    /// A gradient was asked for a node whose dtype is not floating-point.
    #[error("cannot differentiate with respect to {name} ({kind}): its dtype {dtype} is not a floating-point type")]
    NonFloatGradient {
        /// The node's op kind (`Parameter`, `Input`, ...).
        kind: &'static str,
        /// The node's name.
        name: String,
        /// The node's dtype.
        dtype: DType,
    },

    /// A sharding strategy has a different number of split tuples than the op has inputs.
    #[error("{kind} {name}: strategy {strategy} has {got} entries for {inputs} inputs\n  hint: give one split tuple per input")]
    StrategyArity {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// The strategy, as text (`((2, 1), (1, 1))`).
        strategy: String,
        /// Split tuples in the strategy.
        got: usize,
        /// Inputs of the op.
        inputs: usize,
    },

    /// A strategy's split tuple for an input has a different length than the input's rank.
    #[error("{kind} {name}: strategy {strategy} gives input {input} {got} splits but its shape is {shape:?}\n  hint: give one split count per dimension")]
    StrategyRank {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// The strategy, as text.
        strategy: String,
        /// Position of the input, counted from 0.
        input: usize,
        /// Splits given for it.
        got: usize,
        /// The input's shape.
        shape: Vec<usize>,
    },

    /// A strategy splits a dimension by a count that is zero or does not divide its size.
    #[error("{kind} {name}: strategy {strategy} splits dimension {dim} of input {input} (size {size}) {split} ways, which does not divide it\n  hint: every split must divide its dimension")]
    StrategyNotDivisible {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// The strategy, as text.
        strategy: String,
        /// Position of the input, counted from 0.
        input: usize,
        /// The dimension, counted from 0.
        dim: usize,
        /// The dimension's size.
        size: usize,
        /// The split count.
        split: usize,
    },

    /// A MindSpore `Layout` does not fit the op's inputs (their count, ranks or sizes).
    #[error("layout {layout} does not fit: {source}")]
    LayoutDoesNotFit {
        /// The layout, as text.
        layout: String,
        /// What the split counts it gives ran into.
        source: Box<GraphError>,
    },

    /// A MindSpore `Layout` is not valid for the op (see the `problem`).
    #[error("invalid layout {layout} for {kind} {name:?}\n  {problem}\nhint: name for each input dimension the device-matrix axes splitting it; inputs sharing a dimension (a product's contracted one) name the same axes")]
    InvalidLayout {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// The layout and the split counts it gives, as text.
        layout: String,
        /// What is wrong with it.
        problem: crate::sharding::StrategyProblem,
    },

    /// A strategy is not valid for the op (see the `problem`).
    #[error("invalid strategy {strategy} for {kind} {name:?}\n  {problem}\nhint: autopar layout --strategy '{strategy}' --devices N shows what a strategy does")]
    InvalidStrategy {
        /// The op kind (MindSpore's name, `MatMul`).
        kind: &'static str,
        /// The op's node name.
        name: String,
        /// The strategy, as text.
        strategy: String,
        /// What is wrong with it.
        problem: crate::sharding::StrategyProblem,
    },

    /// A parameter's initializer cannot fill its shape.
    #[error("parameter {name}: initializer {init} cannot fill shape {shape:?}: {reason}")]
    BadInitializer {
        /// The parameter's name.
        name: String,
        /// The initializer, as text.
        init: String,
        /// The parameter's shape.
        shape: Vec<usize>,
        /// Why not, in words.
        reason: &'static str,
    },

    /// An op that cannot be recomputed was marked for recomputation.
    #[error("{kind} {name} cannot be recomputed: it is a parameter, an input, a constant or a pipeline transfer\n  hint: mark the ops that compute from it")]
    NotRecomputable {
        /// The op kind (MindSpore's name).
        kind: &'static str,
        /// The op's name.
        name: String,
    },
    /// A block marked for recomputation has no op to recompute.
    #[error("no op named {prefix:?}... can be recomputed (there are none, or only the block's outputs, which are kept)\n  hint: name a block by the prefix of its ops' names as `autopar plan` prints them (`blocks.0.`)")]
    EmptyRecomputeBlock {
        /// The block's name prefix.
        prefix: String,
    },
    /// Recomputation by blocks was asked of a network that names no blocks.
    #[error("the network names no blocks to recompute\n  hint: name the ops or cells to recompute (`blocks.0.` for the ops under a prefix), as `autopar plan` prints them")]
    NoBlocks,
    /// A tensor needs more than [`crate::graph::MAX_TENSOR_BYTES`] (16 TiB).
    #[error("{kind} {name}: its output of shape {shape:?} ({dtype}) needs more than 16 TiB\n  hint: make the model or the batch smaller (`width`, `depth`, `batch_size`)")]
    TooLarge {
        /// The op kind (MindSpore's name).
        kind: &'static str,
        /// The op's name.
        name: String,
        /// The output's shape.
        shape: Vec<usize>,
        /// The output's element type.
        dtype: crate::types::DType,
    },
}

/// `std::result::Result` with [`GraphError`] as the default error type.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;
