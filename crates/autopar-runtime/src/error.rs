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
    Op {
        /// The op's kind.
        kind: &'static str,
        /// The op's name.
        name: String,
        /// The rank, global.
        rank: usize,
    },
    /// The all-reduce of a gradient bucket.
    GradientSync {
        /// The ranks of the all-reduce's group.
        group: Vec<usize>,
    },
    /// `parameter_broadcast` of a parameter.
    ParameterBroadcast {
        /// The parameter's name (`(checks)` for the ranks' agreement before any broadcast).
        name: String,
    },
    /// Creating the sub-communicators of the program's groups.
    CreateGroups {
        /// The partition being created, counted from 0.
        partition: usize,
    },
    /// Gathering the parameter slices of every rank.
    GatherParameters,
    /// Gathering the plan's memory of the ranks of this process.
    MemoryCheck,
    /// Starting or running the ranks.
    Run,
    /// A transfer between pipeline stages.
    PipelineTransfer {
        /// The transfer, in words (e.g. "send of micro-batch 3 to rank 4").
        what: String,
    },
    /// The parallel optimizer's all-gather or reduce-scatter of a bucket.
    OptimizerShard {
        /// The collective, in words.
        kind: &'static str,
        /// The ranks of the bucket's group.
        group: Vec<usize>,
    },
    /// Moving a parameter's pieces to another job's layout.
    Relayout {
        /// The parameter.
        name: String,
    },
    /// Generating a parameter piece that several ranks hold, each a part of it.
    InitReplicas {
        /// The parameter.
        name: String,
        /// The ranks holding the piece.
        group: Vec<usize>,
    },
    /// Waiting for every rank to write its checkpoint of a step.
    Checkpoint {
        /// The step of the checkpoint.
        step: u64,
    },
}

impl fmt::Display for CommPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommPhase::Op { kind, name, rank } => write!(f, "{kind} {name:?} on rank {rank}"),
            CommPhase::GradientSync { group } => write!(f, "gradient all-reduce over ranks {group:?}"),
            CommPhase::ParameterBroadcast { name } => write!(f, "parameter broadcast of {name}"),
            CommPhase::CreateGroups { partition } => write!(f, "creating the communication groups of partition {partition}"),
            CommPhase::GatherParameters => write!(f, "gathering the parameter slices"),
            CommPhase::MemoryCheck => write!(f, "gathering the plan's memory of the ranks"),
            CommPhase::Run => write!(f, "the parallel run"),
            CommPhase::PipelineTransfer { what } => write!(f, "the pipeline {what}"),
            CommPhase::OptimizerShard { kind, group } => write!(f, "the parallel optimizer's {kind} over ranks {group:?}"),
            CommPhase::Relayout { name } => write!(f, "moving the pieces of {name} to another job's layout"),
            CommPhase::InitReplicas { name, group } => write!(f, "gathering the initial values of {name} made in parts by ranks {group:?}"),
            CommPhase::Checkpoint { step } => write!(f, "waiting for every rank's checkpoint of step {step}"),
        }
    }
}

/// Everything that can go wrong while running a graph or updating parameters.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// Building, checking or differentiating the graph failed.
    #[error(transparent)]
    Graph(Box<GraphError>),

    /// A parameter group of an optimizer is wrong.
    #[error("parameter {name}: {problem}\nhint: give each parameter to at most one group")]
    BadParamGroup {
        /// The parameter.
        name: String,
        /// What is wrong, in words.
        problem: String,
    },
    /// A rank of an in-process job kept between calls has stopped ([`crate::LocalRanks`]).
    #[error(
        "rank {rank} of the in-process job has stopped: {problem}\nhint: start the job again (an earlier error on that rank stopped it)"
    )]
    RankStopped {
        /// The rank.
        rank: usize,
        /// Why, in words.
        problem: String,
    },
    /// A pipeline schedule went wrong on a rank (a bug in autopar).
    #[error("pipeline rank {rank}: {problem}\nhint: this is a bug in autopar's pipeline schedules; please report it with `pipeline_stages` and `micro_batches`")]
    Pipeline {
        /// The rank, global.
        rank: usize,
        /// What went wrong, in words.
        problem: String,
    },

    /// Planning the parallel job failed.
    #[error(transparent)]
    Plan(Box<autopar_parallel::ParallelError>),

    /// A tensor kernel failed.
    #[error("{kind} {name} failed: {source}")]
    Kernel {
        /// The op kind, or what ran the kernel (e.g. "Optimizer").
        kind: &'static str,
        /// The node or parameter name (may be empty).
        name: String,
        /// The kernel's error.
        source: Box<TensorError>,
    },

    /// A kernel's output has another shape or element type than the graph inferred (a bug in the op definition).
    #[error("{kind} {name} produced {got_dtype}{got:?}, but the graph inferred {dtype}{shape:?}\n  hint: the op's shape inference and its kernel disagree; this is a bug in the op definition")]
    TypeMismatch {
        /// The op's kind.
        kind: &'static str,
        /// The node's name.
        name: String,
        /// The shape the graph inferred.
        shape: Vec<usize>,
        /// The element type the graph inferred.
        dtype: DType,
        /// The output's shape.
        got: Vec<usize>,
        /// The output's element type.
        got_dtype: DType,
    },

    /// A network input was not fed.
    #[error(
        "input {name} was not fed\n  expected: {dtype}{shape:?}\nhint: the data must provide every network input; check `data` and `model`"
    )]
    MissingFeed {
        /// The input's name.
        name: String,
        /// The input's shape.
        shape: Vec<usize>,
        /// The input's element type.
        dtype: DType,
    },

    /// An input was fed a tensor of another shape or element type than the graph declares.
    #[error("input {name} was fed {got_dtype}{got:?}, expected {dtype}{shape:?}\nhint: the batch does not fit the network; check `batch_size` and `input_shape`")]
    FeedMismatch {
        /// The input's name.
        name: String,
        /// The shape the graph declares.
        shape: Vec<usize>,
        /// The element type the graph declares.
        dtype: DType,
        /// The fed tensor's shape.
        got: Vec<usize>,
        /// The fed tensor's element type.
        got_dtype: DType,
    },

    /// A feed names a node that is not a network input.
    #[error("node %{id} ({name}) is fed but is not an input\nhint: only network inputs come from the data; parameters come from initialisation, `init` or `resume`")]
    FeedNotInput {
        /// The node's id in the graph.
        id: usize,
        /// The node's name.
        name: String,
    },

    /// The graph needs a parameter the parameter store lacks.
    #[error("parameter {name} is missing from the parameter store\nhint: the network or the checkpoint lacks it; check `model`, `init` and `resume`")]
    MissingParameter {
        /// The parameter's name.
        name: String,
    },

    /// A stored parameter's shape or element type differs from what the graph expects.
    #[error("parameter {name} in the store is {got_dtype}{got:?}, the graph expects {dtype}{shape:?}\nhint: check `init`, `resume` and the model options (`width`, `depth`, `num_classes`, `input_shape`)")]
    ParameterMismatch {
        /// The parameter's name.
        name: String,
        /// The shape the graph expects.
        shape: Vec<usize>,
        /// The element type the graph expects.
        dtype: DType,
        /// The stored tensor's shape.
        got: Vec<usize>,
        /// The stored tensor's element type.
        got_dtype: DType,
    },

    /// An op over several ranks ran without a communicator (on a single-device executor).
    #[error("{kind} {name} on group {group:?} needs a communicator; this executor runs one device\nhint: ops over several ranks run under `device_num=N` (or mpirun)")]
    NeedsCommunicator {
        /// The op's kind.
        kind: &'static str,
        /// The op's name.
        name: String,
        /// The ranks of the op's group.
        group: Vec<usize>,
    },

    /// The optimizer got no gradient for a trainable parameter (a bug in autopar).
    #[error("optimizer: no gradient given for trainable parameter {name}\nhint: this is a bug in autopar (every trained parameter gets a gradient); please report it")]
    MissingGradient {
        /// The parameter's name.
        name: String,
    },

    /// An update was asked for with no gradients computed since the last one.
    #[error("no gradients to apply: the update follows the gradients of a step, once\nhint: compute the gradients (value_and_grad's function) before each update")]
    NoGradients,

    /// An update was asked of ranks that have no optimizer.
    #[error("the ranks have no optimizer to apply the gradients with\nhint: give the job an optimizer before its first update")]
    NoOptimizer,

    /// Gradients or optimizer state a caller gave ([`crate::RankTrainer::gradient_pieces`],
    /// [`crate::RankTrainer::load_optimizer_state`]) miss a trainable parameter or have another
    /// shape than it.
    #[error("the values given for the update: {name}: {problem}\nhint: give one whole value per trainable parameter (a gradient, an optimizer state entry), of the parameter's shape")]
    BadGradient {
        /// The parameter's name.
        name: String,
        /// What is wrong, in words.
        problem: String,
    },

    /// A gradient's shape differs from its parameter's (a bug in autopar).
    #[error(
        "optimizer: gradient of {name} has shape {got:?}, the parameter has {shape:?}\nhint: this is a bug in autopar; please report it"
    )]
    GradientMismatch {
        /// The parameter's name.
        name: String,
        /// The parameter's shape.
        shape: Vec<usize>,
        /// The gradient's shape.
        got: Vec<usize>,
    },

    /// A rank's stored parameter has another shape than its slice under the plan.
    #[error("parameter {name} of rank {rank} has shape {got:?}, its slice under the plan is {shape:?}\nhint: the per-rank parameters come from another strategy; reshard them with `init=DIR` `init_strategy=FILE`")]
    SliceMismatch {
        /// The parameter's name.
        name: String,
        /// The rank, global.
        rank: usize,
        /// The slice's shape under the plan.
        shape: Vec<usize>,
        /// The stored tensor's shape.
        got: Vec<usize>,
    },

    /// An optimizer hyperparameter is out of range.
    #[error("optimizer: {what} = {value} is invalid; expected {expected}\nhint: {}leave it out to take the default", if *value < 0.0 { "it cannot be negative; " } else { "" })]
    BadHyperparameter {
        /// The hyperparameter's name.
        what: &'static str,
        /// The value that was given.
        value: f64,
        /// What was expected, in words.
        expected: &'static str,
    },

    /// A loss scale out of range.
    #[error("loss scale {scale}: {problem}\nhint: MindSpore's defaults are fixed:128 and dynamic:16777216:2:2000")]
    BadLossScale {
        /// The scale, as `--loss-scale` writes it.
        scale: String,
        /// What is wrong.
        problem: String,
    },

    /// A step's loss is NaN or infinite.
    #[error("the loss is {loss} at step {step}\nhint: lower `lr` or check the data for NaN/inf")]
    NonFiniteLoss {
        /// The step, counted from 1.
        step: u64,
        /// The loss of that step.
        loss: f64,
    },

    /// A communicator call failed.
    #[error("{during} failed\n  {source}")]
    Comm {
        /// What the rank was doing.
        during: CommPhase,
        /// The communicator's error.
        #[source]
        source: Box<autopar_comm::CommError>,
    },

    /// A collective needs a group the rank created no sub-communicator for (a bug in autopar).
    #[error("rank {rank} has no communicator for group {group:?}\nhint: this is a bug in autopar (the plan lists every group its collectives use); please report it")]
    MissingGroup {
        /// The rank that lacks the group.
        rank: usize,
        /// The group's ranks, as the collective named them.
        group: Vec<usize>,
    },

    /// A node run as a collective is not a communication op.
    #[error("{kind} {name} is not a communication op")]
    NotCommunication {
        /// The node's op kind.
        kind: &'static str,
        /// The node's name.
        name: String,
    },

    /// A tensor that must be floating point (a trained parameter, a gradient) is not.
    #[error("{what} must be a float tensor, got {dtype} ({name})")]
    NotFloat {
        /// What the tensor is, in words (e.g. "a trained parameter").
        what: &'static str,
        /// The tensor's name.
        name: String,
        /// The tensor's element type.
        dtype: DType,
    },

    /// Parameters could not be moved to another job's layouts.
    #[error("cannot move the parameter pieces{} to the other job's layouts: {problem}\nhint: evaluate with the network and devices the parameters were trained with", if name.is_empty() { String::new() } else { format!(" of {name}") })]
    Relayout {
        /// The parameter (empty: the job as a whole).
        name: String,
        /// What stands in the way, in words.
        problem: String,
    },

    /// A training call on an inference job, or the other way round.
    #[error("{}", if *inference { "the job was planned without a loss (Job::inference): it predicts, it does not train\nhint: plan a training job with its loss (Job::new)" } else { "predict runs a job planned without a loss (Job::inference); this one trains\nhint: plan the network without its loss with Job::inference to predict" })]
    JobKind {
        /// Whether the job is an inference job.
        inference: bool,
    },

    /// The job's device count differs from the communicator's number of ranks.
    #[error("the job has {job} devices but the communicator has {ranks} ranks\nhint: run with as many ranks as `device_num` (mpirun -n N with `device_num=N`)")]
    DeviceCount {
        /// The job's device count (`device_num`).
        job: usize,
        /// The communicator's number of ranks.
        ranks: usize,
    },

    /// A rank was given the program of another rank.
    #[error("rank {rank} was given the program of rank {program}\nhint: build each rank's program with `job.plan().program(rank)` for its own rank")]
    ProgramOfAnotherRank {
        /// The rank the program was built for.
        program: usize,
        /// The communicator's rank.
        rank: usize,
    },

    /// The plan's memory for the ranks of this process does not fit what the machine allows.
    #[error(
        "{} {} ({need} bytes), but {limit}\n  {}\nhint: spread the model over more devices (`device_num`), split its large operators (a model-parallel strategy, or auto_parallel with `device_memory_capacity` set to a device's memory), shard the optimizer state (`enable_parallel_optimizer`), or run the ranks as processes under mpirun on more hosts",
        limit.needing(),
        crate::budget::size(*need),
        crate::budget::describe(demand)
    )]
    DoesNotFit {
        /// What the limit compares: the process's resident bytes, or one rank's plan.
        need: u64,
        /// The ranks and the plan's figures.
        demand: Box<crate::budget::Demand>,
        /// The limit exceeded.
        limit: Box<crate::budget::Limit>,
    },

    /// The simulated ranks' thread stacks do not fit the address-space limit.
    #[error("{ranks} simulated ranks need {} of address space for their threads' stacks ({} each), but {limit}\nhint: simulate fewer devices in one process, raise the limit (ulimit -v), or run the ranks as processes under mpirun", crate::budget::size(*ranks as u64 * *stack), crate::budget::size(*stack))]
    StacksDoNotFit {
        /// The simulated ranks.
        ranks: usize,
        /// Each thread's stack, bytes.
        stack: u64,
        /// The address-space limit.
        limit: Box<crate::budget::Limit>,
    },

    /// The `global_rank` option is not this process's rank in the communicator.
    #[error("global_rank {global_rank} does not match this process, rank {rank} of {size}\nhint: drop `global_rank` (each process learns its rank from mpirun), or pass this process's rank")]
    GlobalRank {
        /// The `global_rank` that was configured.
        global_rank: usize,
        /// This process's rank in the communicator.
        rank: usize,
        /// The communicator's number of ranks.
        size: usize,
    },

    /// `global_rank` was set for a run that simulates every rank in one process.
    #[error("global_rank applies to one process per rank (mpirun); this run simulates all {devices} ranks in one process\nhint: drop `global_rank`, or start the job with mpirun -n {devices}")]
    GlobalRankInProcess {
        /// The devices of the job.
        devices: usize,
    },

    /// An input's batch dimension does not split evenly across the ranks.
    #[error("input {name:?} has shape {shape:?}; its first dimension must split into {parts} equal parts\nhint: use a `batch_size` divisible by `device_num`")]
    BatchSplit {
        /// The input's name.
        name: String,
        /// The input's shape.
        shape: Vec<usize>,
        /// The number of equal parts dimension 0 must split into.
        parts: usize,
    },

    /// Reading or writing a checkpoint failed.
    #[error("checkpoint {}: {error}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// The checkpoint crate's error (in this message, not repeated as its cause).
        error: Box<autopar_checkpoint::CheckpointError>,
    },

    /// Reading or writing a strategy file failed (the message names the file).
    #[error("{error}")]
    StrategyFile {
        /// The checkpoint crate's error.
        error: Box<autopar_checkpoint::CheckpointError>,
    },

    /// A checkpoint tensor has an element type autopar cannot train (not a float type).
    #[error("checkpoint {}: tensor {name} has element type {dtype}, which autopar cannot train\nhint: store parameters as float16/bfloat16/float32/float64", path.display())]
    CheckpointDType {
        /// The checkpoint file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The tensor's element type, as the checkpoint names it.
        dtype: String,
    },

    /// No checkpoint of the folder holds a parameter the rank needs.
    #[error("load_distributed_checkpoint: parameter {name} of rank {rank} is in no checkpoint of {}\nhint: the checkpoints were saved from another network, or `init_strategy` lacks this parameter", dir.display())]
    NotResharded {
        /// The parameter's name.
        name: String,
        /// The rank that needs it, global.
        rank: usize,
        /// The folder of checkpoints that was read.
        dir: PathBuf,
    },

    /// A parameter of distributed checkpoints has another full shape than the job's.
    #[error("load_distributed_checkpoint: parameter {name} (needed by rank {rank}) has shape {got:?} in the checkpoints of {}, the job's is {want:?}\nhint: the checkpoints were saved from another network, or under another strategy than `init_strategy`", dir.display())]
    ReshardedShape {
        /// The parameter's name.
        name: String,
        /// The rank that needs it, global.
        rank: usize,
        /// Its full shape as the checkpoints and their strategy give it.
        got: Vec<usize>,
        /// Its full shape in the job.
        want: Vec<usize>,
        /// The folder of checkpoints that was read.
        dir: PathBuf,
    },

    /// Writing a file or creating a folder failed.
    #[error("cannot write {}: {source}\nhint: check that the folder exists and is writable", path.display())]
    Io {
        /// The file or folder that was written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// `parameter_broadcast` refused to run.
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

/// This crate's result type; the error defaults to [`RuntimeError`].
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
