//! The one error type of this crate. Variants carry the offending values, never preformatted text.

use autopar_graph::{DType, GraphError};
use autopar_tensor::TensorError;
use thiserror::Error;

/// Everything that can go wrong while running a graph or updating parameters.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Graph(Box<GraphError>),

    #[error("{kind} {name} failed: {source}")]
    Kernel { kind: &'static str, name: String, source: Box<TensorError> },

    #[error("{kind} {name} produced {got_dtype}{got:?}, but the graph inferred {dtype}{shape:?}\n  hint: the op's shape inference and its kernel disagree; this is a bug in the op definition")]
    TypeMismatch { kind: &'static str, name: String, shape: Vec<usize>, dtype: DType, got: Vec<usize>, got_dtype: DType },

    #[error("input {name} was not fed\n  expected: {dtype}{shape:?}\n  hint: pass it in the feeds of Executor::run")]
    MissingFeed { name: String, shape: Vec<usize>, dtype: DType },

    #[error("input {name} was fed {got_dtype}{got:?}, expected {dtype}{shape:?}\n  hint: the graph was built for this shape; rebuild it or reshape the batch")]
    FeedMismatch { name: String, shape: Vec<usize>, dtype: DType, got: Vec<usize>, got_dtype: DType },

    #[error("node %{id} ({name}) is fed but is not an input\n  hint: feed only Input nodes; parameters live in the parameter store")]
    FeedNotInput { id: usize, name: String },

    #[error("parameter {name} is missing from the parameter store\n  hint: create the store with ParamStore::init(&graph)")]
    MissingParameter { name: String },

    #[error("parameter {name} in the store is {got_dtype}{got:?}, the graph expects {dtype}{shape:?}")]
    ParameterMismatch { name: String, shape: Vec<usize>, dtype: DType, got: Vec<usize>, got_dtype: DType },

    #[error("{kind} {name} on group {group:?} needs a communicator; this executor runs one device\n  hint: run the rank programs of the parallel plan under the parallel runtime")]
    NeedsCommunicator { kind: &'static str, name: String, group: Vec<usize> },

    #[error("optimizer: no gradient given for trainable parameter {name}\n  hint: differentiate with respect to every parameter the optimizer updates")]
    MissingGradient { name: String },

    #[error("optimizer: gradient of {name} has shape {got:?}, the parameter has {shape:?}")]
    GradientMismatch { name: String, shape: Vec<usize>, got: Vec<usize> },

    #[error("optimizer: {what} = {value} is invalid; expected {expected}")]
    BadHyperparameter { what: &'static str, value: f64, expected: &'static str },

    #[error("the loss is {loss} at step {step}\n  hint: lower the learning rate or check the inputs for NaN/inf")]
    NonFiniteLoss { step: u64, loss: f64 },

    #[error("{what} failed\n  {message}")]
    Comm { what: String, message: String },

    #[error(
        "rank {rank} has no communicator for group {group:?}\nhint: the program's partitions must list every group its collectives use"
    )]
    MissingGroup { rank: usize, group: Vec<usize> },

    #[error("{kind} {name} is not a communication op")]
    NotCommunication { kind: &'static str, name: String },

    #[error("{message}")]
    Parallel { message: String },

    #[error("{what} must be a float tensor, got {dtype} ({name})")]
    NotFloat { what: &'static str, name: String, dtype: DType },
}

impl From<GraphError> for RuntimeError {
    fn from(e: GraphError) -> Self {
        RuntimeError::Graph(Box::new(e))
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
