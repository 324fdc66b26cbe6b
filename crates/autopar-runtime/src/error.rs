//! The one error type of this crate. Variants carry the offending values, never preformatted
//! text; hints name `autopar` flags.

use std::fmt;
use std::path::PathBuf;

use autopar_graph::{DType, GraphError};
use autopar_tensor::TensorError;
use thiserror::Error;

/// What a rank was doing when a communicator call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommPhase {
    /// A communication op of the rank's program.
    Op { kind: &'static str, name: String, rank: usize },
    /// The all-reduce of a gradient bucket.
    GradientSync { group: Vec<usize> },
    /// `parameter_broadcast` of a parameter.
    ParameterBroadcast { name: String },
    /// Creating the sub-communicators of the program's groups.
    CreateGroups { partition: usize },
    /// Gathering the parameter slices of every rank.
    GatherParameters,
    /// Starting or running the ranks.
    Run,
    /// A transfer between pipeline stages.
    PipelineTransfer { what: String },
    /// The parallel optimizer's all-gather or reduce-scatter of a bucket.
    OptimizerShard { kind: &'static str, group: Vec<usize> },
    /// Waiting for every rank to write its checkpoint of a step.
    Checkpoint { step: u64 },
}

impl fmt::Display for CommPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommPhase::Op { kind, name, rank } => write!(f, "{kind} {name:?} on rank {rank}"),
            CommPhase::GradientSync { group } => write!(f, "gradient all-reduce over ranks {group:?}"),
            CommPhase::ParameterBroadcast { name } => write!(f, "parameter broadcast of {name}"),
            CommPhase::CreateGroups { partition } => write!(f, "creating the communication groups of partition {partition}"),
            CommPhase::GatherParameters => write!(f, "gathering the parameter slices"),
            CommPhase::Run => write!(f, "the parallel run"),
            CommPhase::PipelineTransfer { what } => write!(f, "the pipeline {what}"),
            CommPhase::OptimizerShard { kind, group } => write!(f, "the parallel optimizer's {kind} over ranks {group:?}"),
            CommPhase::Checkpoint { step } => write!(f, "waiting for every rank's checkpoint of step {step}"),
        }
    }
}

/// Everything that can go wrong while running a graph or updating parameters.
#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Graph(Box<GraphError>),

    #[error("pipeline rank {rank}: {problem}\nhint: this is a bug in autopar's pipeline schedules; please report it with --parallel pipeline_stages and --micro-batches")]
    Pipeline { rank: usize, problem: String },

    #[error(transparent)]
    Plan(Box<autopar_parallel::ParallelError>),

    #[error("{kind} {name} failed: {source}")]
    Kernel { kind: &'static str, name: String, source: Box<TensorError> },

    #[error("{kind} {name} produced {got_dtype}{got:?}, but the graph inferred {dtype}{shape:?}\n  hint: the op's shape inference and its kernel disagree; this is a bug in the op definition")]
    TypeMismatch { kind: &'static str, name: String, shape: Vec<usize>, dtype: DType, got: Vec<usize>, got_dtype: DType },

    #[error(
        "input {name} was not fed\n  expected: {dtype}{shape:?}\nhint: the data must provide every network input; check --data and --model"
    )]
    MissingFeed { name: String, shape: Vec<usize>, dtype: DType },

    #[error("input {name} was fed {got_dtype}{got:?}, expected {dtype}{shape:?}\nhint: the batch does not fit the network; check --batch-size and --input-shape")]
    FeedMismatch { name: String, shape: Vec<usize>, dtype: DType, got: Vec<usize>, got_dtype: DType },

    #[error("node %{id} ({name}) is fed but is not an input\nhint: only network inputs come from the data; parameters come from initialisation, --init or --resume")]
    FeedNotInput { id: usize, name: String },

    #[error("parameter {name} is missing from the parameter store\nhint: the network or the checkpoint lacks it; check --model, --init and --resume")]
    MissingParameter { name: String },

    #[error("parameter {name} in the store is {got_dtype}{got:?}, the graph expects {dtype}{shape:?}\nhint: check --init, --resume and the model options (--width, --depth, --num-classes, --input-shape)")]
    ParameterMismatch { name: String, shape: Vec<usize>, dtype: DType, got: Vec<usize>, got_dtype: DType },

    #[error("{kind} {name} on group {group:?} needs a communicator; this executor runs one device\nhint: ops over several ranks run under --devices N (or mpirun)")]
    NeedsCommunicator { kind: &'static str, name: String, group: Vec<usize> },

    #[error("optimizer: no gradient given for trainable parameter {name}\nhint: this is a bug in autopar (every trained parameter gets a gradient); please report it")]
    MissingGradient { name: String },

    #[error(
        "optimizer: gradient of {name} has shape {got:?}, the parameter has {shape:?}\nhint: this is a bug in autopar; please report it"
    )]
    GradientMismatch { name: String, shape: Vec<usize>, got: Vec<usize> },

    #[error("parameter {name} of rank {rank} has shape {got:?}, its slice under the plan is {shape:?}\nhint: the per-rank parameters come from another strategy; reshard them with --init DIR --init-strategy FILE")]
    SliceMismatch { name: String, rank: usize, shape: Vec<usize>, got: Vec<usize> },

    #[error("optimizer: {what} = {value} is invalid; expected {expected}")]
    BadHyperparameter { what: &'static str, value: f64, expected: &'static str },

    #[error("the loss is {loss} at step {step}\nhint: lower --lr or check the data for NaN/inf")]
    NonFiniteLoss { step: u64, loss: f64 },

    #[error("{during} failed\n  {source}")]
    Comm {
        during: CommPhase,
        #[source]
        source: Box<autopar_comm::CommError>,
    },

    #[error("rank {rank} has no communicator for group {group:?}\nhint: this is a bug in autopar (the plan lists every group its collectives use); please report it")]
    MissingGroup { rank: usize, group: Vec<usize> },

    #[error("{kind} {name} is not a communication op")]
    NotCommunication { kind: &'static str, name: String },

    #[error("{what} must be a float tensor, got {dtype} ({name})")]
    NotFloat { what: &'static str, name: String, dtype: DType },

    #[error("the job has {job} devices but the communicator has {ranks} ranks\nhint: run with as many ranks as --devices (mpirun -n N with --devices N)")]
    DeviceCount { job: usize, ranks: usize },

    #[error("global_rank {global_rank} does not match this process, rank {rank} of {size}\nhint: drop --parallel global_rank (each process learns its rank from mpirun), or pass this process's rank")]
    GlobalRank { global_rank: usize, rank: usize, size: usize },

    #[error("global_rank applies to one process per rank (mpirun); this run simulates all {devices} ranks in one process\nhint: drop --parallel global_rank, or start the job with mpirun -n {devices}")]
    GlobalRankInProcess { devices: usize },

    #[error("input {name:?} has shape {shape:?}; its first dimension must split into {parts} equal parts\nhint: use a --batch-size divisible by --devices")]
    BatchSplit { name: String, shape: Vec<usize>, parts: usize },

    #[error("checkpoint {}: {source}", path.display())]
    Checkpoint { path: PathBuf, source: Box<autopar_checkpoint::CheckpointError> },

    #[error("checkpoint {}: tensor {name} has element type {dtype}, which autopar cannot train\nhint: store parameters as float16/bfloat16/float32/float64", path.display())]
    CheckpointDType { path: PathBuf, name: String, dtype: String },

    #[error("load_distributed_checkpoint: parameter {name} of rank {rank} is in no checkpoint of {}\nhint: the checkpoints were saved from another network, or --init-strategy lacks this parameter", dir.display())]
    NotResharded { name: String, rank: usize, dir: PathBuf },

    #[error("load_distributed_checkpoint: parameter {name} of rank {rank} resharded to shape {got:?}, the job needs {want:?} (full {full:?})\nhint: check --init-strategy")]
    ReshardedShape { name: String, rank: usize, got: Vec<usize>, want: Vec<usize>, full: Vec<usize> },

    #[error("cannot write {}: {source}\nhint: check that the folder exists and is writable", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    #[error(transparent)]
    Broadcast(Box<crate::broadcast::BroadcastError>),
}

impl From<GraphError> for RuntimeError {
    fn from(e: GraphError) -> Self {
        RuntimeError::Graph(Box::new(e))
    }
}

impl From<autopar_parallel::ParallelError> for RuntimeError {
    fn from(e: autopar_parallel::ParallelError) -> Self {
        RuntimeError::Plan(Box::new(e))
    }
}

impl RuntimeError {
    /// A failed communicator call during `during`.
    pub fn comm(during: CommPhase) -> impl FnOnce(autopar_comm::CommError) -> RuntimeError {
        move |e| RuntimeError::Comm { during, source: Box::new(e) }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
