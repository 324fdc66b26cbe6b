//! The one error type of this crate. Variants carry the offending values, never preformatted text.

use thiserror::Error;

use crate::types::DType;

/// Everything that can go wrong while building, checking or differentiating a graph.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GraphError {
    #[error("{kind} {name}: {what} {a} and {b} differ")]
    DimMismatch { kind: &'static str, name: String, what: &'static str, a: usize, b: usize },

    #[error("{kind} {name}: shapes {lhs:?} and {rhs:?} do not broadcast\n  hint: trailing dimensions must be equal or 1")]
    NotBroadcastable { kind: &'static str, name: String, lhs: Vec<usize>, rhs: Vec<usize> },

    #[error("{kind} {name}: input {input} has shape {shape:?}; expected {expected}")]
    BadShape { kind: &'static str, name: String, input: usize, shape: Vec<usize>, expected: &'static str },

    #[error("{kind} {name}: input {input} has dtype {dtype}; expected {expected}")]
    BadDType { kind: &'static str, name: String, input: usize, dtype: DType, expected: &'static str },

    #[error("{kind} {name}: inputs {a} and {b} have different dtypes {da} and {db}\n  hint: insert a Cast so both inputs share one dtype")]
    DTypeMismatch { kind: &'static str, name: String, a: usize, b: usize, da: DType, db: DType },

    #[error("{kind} {name}: attribute {attr} = {value} is invalid for input shapes {shapes:?}; expected {expected}")]
    BadAttr { kind: &'static str, name: String, attr: &'static str, value: String, shapes: Vec<Vec<usize>>, expected: &'static str },

    #[error("{kind} {name}: takes {expected} inputs, got {got}")]
    Arity { kind: &'static str, name: String, expected: String, got: usize },

    #[error("an op named {name:?} already exists (node %{existing})\n  hint: op and parameter names must be unique within a graph")]
    DuplicateName { name: String, existing: usize },

    #[error("node %{id} does not exist (the graph has {len} nodes)")]
    UnknownNode { id: usize, len: usize },

    #[error("{kind} {name}: input %{input} is defined after the op (node %{node})\n  hint: nodes are kept in topological order; add inputs first")]
    NotTopological { kind: &'static str, name: String, node: usize, input: usize },

    #[error("no node named {name:?}")]
    UnknownName { name: String },

    #[error("{kind} {name}: no backward rule gives the gradient of input {input}\n  hint: the op is not differentiable there (max/min collectives, or a gradient op differentiated a second time)")]
    NotDifferentiable { kind: &'static str, name: String, input: usize },

    #[error("cannot differentiate with respect to {name} ({kind}): its dtype {dtype} is not a floating-point type")]
    NonFloatGradient { kind: &'static str, name: String, dtype: DType },

    #[error("{kind} {name}: strategy {strategy} has {got} entries for {inputs} inputs\n  hint: give one split tuple per input")]
    StrategyArity { kind: &'static str, name: String, strategy: String, got: usize, inputs: usize },

    #[error("{kind} {name}: strategy {strategy} gives input {input} {got} splits but its shape is {shape:?}\n  hint: give one split count per dimension")]
    StrategyRank { kind: &'static str, name: String, strategy: String, input: usize, got: usize, shape: Vec<usize> },

    #[error("{kind} {name}: strategy {strategy} splits dimension {dim} of input {input} (size {size}) {split} ways, which does not divide it\n  hint: every split must divide its dimension")]
    StrategyNotDivisible { kind: &'static str, name: String, strategy: String, input: usize, dim: usize, size: usize, split: usize },

    #[error("invalid strategy {strategy} for {kind} {name:?}\n  {problem}\nhint: autopar layout --strategy '{strategy}' --devices N shows what a strategy does")]
    InvalidStrategy { kind: &'static str, name: String, strategy: String, problem: crate::sharding::StrategyProblem },

    #[error("parameter {name}: initializer {init} cannot fill shape {shape:?}: {reason}")]
    BadInitializer { name: String, init: String, shape: Vec<usize>, reason: &'static str },
}

pub type Result<T, E = GraphError> = std::result::Result<T, E>;
