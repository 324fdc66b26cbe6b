//! The error type of autopar-parallel. Variants carry values (options, ops, shapes, ranks), and
//! their messages end with a hint naming a CLI flag or command.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::context::ParallelMode;

#[derive(Debug, Error)]
pub enum ParallelError {
    #[error("unknown parallel option {option:?}\n  valid options: {}\nhint: check the spelling; options use MindSpore's set_auto_parallel_context names", valid.join(", "))]
    UnknownOption { option: String, valid: Vec<String> },

    #[error("invalid value {value} for parallel option {option}\n  expected {expected}\nhint: pass --parallel {option}=VALUE with a value of that form")]
    InvalidOption { option: String, value: String, expected: String },

    #[error("parallel option {option} conflicts with the other options\n  {conflict}")]
    Conflict { option: &'static str, conflict: Conflict },

    #[error("{kind} {name:?} cannot be planned\n  {why}\nhint: build the network without it (the library's ParallelJob::hybrid runs hand-written rank graphs that place their own collectives)")]
    UnsupportedOp { kind: &'static str, name: String, why: &'static str },

    #[error("input {input:?} with shape {shape:?} cannot be split over {devices} devices by its batch dimension ({mode})\nhint: use a --batch-size divisible by {devices}, or (semi_auto_parallel) --parallel dataset_strategy=full_batch")]
    BatchNotDivisible { input: String, shape: Vec<usize>, devices: usize, mode: &'static str },

    #[error("invalid dataset_strategy\n  {problem}\nhint: give one split list per network input, e.g. --parallel 'dataset_strategy=[[8, 1], [8]]'")]
    DatasetStrategy { problem: DatasetProblem },

    #[error("{node}: {source}")]
    Layout {
        node: String,
        #[source]
        source: autopar_layout::LayoutError,
    },

    #[error(transparent)]
    Graph(Box<autopar_graph::GraphError>),

    #[error("rank {rank} is out of range for {devices} devices\nhint: pass a rank below --devices")]
    RankOutOfRange { rank: usize, devices: usize },

    #[error("internal planner error on rank {rank}: local {kind} {name:?} has shape {got:?}, its layout expects {want:?}\nhint: this is a bug in autopar; please report it with the graph and strategies")]
    LocalShape { rank: usize, kind: &'static str, name: String, got: Vec<usize>, want: Vec<usize> },

    #[error("internal planner error: a graph redistribution for {node:?} planned a point-to-point permutation\nhint: this is a bug in autopar; please report it with the graph and strategies")]
    PermutationInGraph { node: String },

    #[error("parallel option {option} = {value} is not supported yet\n  autopar parses and validates it, but does not implement its behaviour\nhint: remove it from --parallel and the [parallel] table")]
    NotSupportedYet { option: String, value: String },

    #[error("device profile {origin}: {problem}\nhint: write a profile with `autopar calibrate --out FILE`, or leave --profile out for the built-in one")]
    BadProfile { origin: String, problem: String },

    #[error("auto_parallel: no strategy of {kind} {name:?} fits device_memory_capacity = {capacity} bytes\n  its cheapest strategy in memory needs {need} bytes per device; its largest tensors: {largest}\nhint: raise --parallel device_memory_capacity=BYTES, use more devices, or a smaller --batch-size")]
    OutOfMemory { kind: &'static str, name: String, capacity: u64, need: u64, largest: String },

    #[error("auto_parallel ({search}) needs a power-of-two device count, got {devices}\nhint: use --devices 2, 4, 8, ... or --parallel search_mode=dynamic_programming")]
    SearchDevices { search: &'static str, devices: usize },

    #[error("auto_parallel ({search}): the cost graph is too wide to search exactly: eliminating {name:?} needs a table of {entries} entries\nhint: use --parallel search_mode=recursive_programming or sharding_propagation, or set .shard() on some ops")]
    SearchTooWide { search: &'static str, name: String, entries: u128 },

    #[error("strategy file {}: item {item} matches no operator of the network\n  operators are named <Prim>_<parameter>, e.g. MatMul_fc1.weight\nhint: the file was saved for another network; check --strategy and strategy_ckpt_config.load_file", file.display())]
    UnknownStrategyItem { file: PathBuf, item: String },

    #[error("the loss {name:?} is {dtype}; training differentiates a floating-point loss\nhint: Cast the loss to f32, or pass the float value it is computed from")]
    LossNotFloat { name: String, dtype: autopar_graph::DType },

    #[error("pipeline_stages: {problem}\nhint: give each block its stage with GraphBuilder::set_pipeline_stage (MindSpore's cell.pipeline_stage), in execution order, from 0 to pipeline_stages-1")]
    Pipeline { problem: PipelineProblem },

    #[error("pipeline schedule: {0}")]
    Schedule(#[from] crate::pipeline::ScheduleError),

    #[error("hybrid_parallel: {problem}\nhint: build one graph per rank (--devices of them) with the same loss name, collectives over groups holding the rank")]
    Hybrid { problem: HybridProblem },
}

impl From<autopar_graph::GraphError> for ParallelError {
    fn from(e: autopar_graph::GraphError) -> Self {
        ParallelError::Graph(Box::new(e))
    }
}

/// Why a network cannot be cut into its pipeline stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipelineProblem {
    /// An op placed on an earlier stage than a value it consumes.
    ConsumerBeforeProducer {
        kind: &'static str,
        name: String,
        stage: usize,
        input: String,
        input_stage: usize,
    },
    StageOutOfRange {
        kind: &'static str,
        name: String,
        stage: usize,
        stages: usize,
    },
    EmptyStage {
        stage: usize,
        stages: usize,
    },
    LossNotOnLastStage {
        name: String,
        stage: usize,
        stages: usize,
    },
    /// Options the runtime does not run yet.
    Unsupported {
        what: &'static str,
    },
    /// A pipeline job handed to the one-stage planner.
    NeedsPipelinePlanner,
}

impl fmt::Display for PipelineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipelineProblem::ConsumerBeforeProducer { kind, name, stage, input, input_stage } => {
                write!(f, "{kind} {name:?} is placed on stage {stage}, before its input {input:?} on stage {input_stage}")
            }
            PipelineProblem::StageOutOfRange { kind, name, stage, stages } => {
                write!(f, "{kind} {name:?} is placed on stage {stage}, but the pipeline has {stages} stages (0..{stages})")
            }
            PipelineProblem::EmptyStage { stage, stages } => write!(f, "stage {stage} of {stages} has no operator"),
            PipelineProblem::LossNotOnLastStage { name, stage, stages } => {
                write!(f, "the loss {name:?} is computed on stage {stage}; it must be on the last stage ({})", stages - 1)
            }
            PipelineProblem::Unsupported { what } => write!(f, "{what} is not supported yet"),
            PipelineProblem::NeedsPipelinePlanner => write!(
                f,
                "a job of several stages is planned by plan_pipeline (the library's PipelineJob, `autopar train --micro-batches M`), not plan_job"
            ),
        }
    }
}

/// Why two parallel options cannot be used together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    GlobalRankNotBelowDeviceNum {
        global_rank: usize,
        device_num: usize,
    },
    /// `option` (set to a non-default value) does not apply to `mode`.
    ModeDoesNotSupport {
        mode: ParallelMode,
        applies_to: &'static str,
    },
    StagesDoNotDivide {
        stages: usize,
        device_num: usize,
    },
    OptimizerShardSizeAboveStage {
        size: i64,
        stage_devices: usize,
    },
    /// Two options that set the same thing.
    AlsoSetBy {
        other: &'static str,
    },
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::GlobalRankNotBelowDeviceNum { global_rank, device_num } => {
                write!(f, "global_rank {global_rank} is not below device_num {device_num}")
            }
            Conflict::ModeDoesNotSupport { mode, applies_to } => write!(f, "{mode} does not support it: it applies to {applies_to}"),
            Conflict::StagesDoNotDivide { stages, device_num } => write!(f, "{stages} stages do not divide device_num {device_num}"),
            Conflict::AlsoSetBy { other } => write!(f, "{other} sets the same thing; set one of them"),
            Conflict::OptimizerShardSizeAboveStage { size, stage_devices } => {
                write!(f, "{size} is above the {stage_devices} devices of a pipeline stage")
            }
        }
    }
}

/// Why a dataset strategy does not fit the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetProblem {
    MissingInput { input: String, index: usize, given: usize },
    Rank { input: String, shape: Vec<usize>, splits: Vec<usize> },
    Devices { input: String, splits: Vec<usize>, used: usize, devices: usize },
    NotDivisible { input: String, shape: Vec<usize>, splits: Vec<usize> },
}

impl fmt::Display for DatasetProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetProblem::MissingInput { input, index, given } => {
                write!(f, "network input {input:?} is input {index}, but dataset_strategy lists {given} inputs")
            }
            DatasetProblem::Rank { input, shape, splits } => {
                write!(f, "input {input:?} has shape {shape:?}, its dataset strategy {splits:?} has {} entries", splits.len())
            }
            DatasetProblem::Devices { input, splits, used, devices } => {
                write!(f, "strategy {splits:?} of input {input:?} uses {used} devices, which does not divide {devices}")
            }
            DatasetProblem::NotDivisible { input, shape, splits } => {
                write!(f, "strategy {splits:?} does not divide the shape {shape:?} of input {input:?}")
            }
        }
    }
}

/// What is wrong with a set of hybrid_parallel rank graphs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HybridProblem {
    GraphCount {
        graphs: usize,
        devices: usize,
    },
    MissingLoss {
        rank: usize,
        loss: String,
    },
    NotAParameter {
        rank: usize,
        name: String,
    },
    /// A collective (or synchronised op) whose group lacks the rank or names a rank out of range.
    BadGroup {
        rank: usize,
        kind: &'static str,
        name: String,
        group: Vec<usize>,
    },
    /// A replicated parameter whose shape, dtype or trainability (`what`) differs between ranks.
    ParameterDiffers {
        name: String,
        rank: usize,
        what: &'static str,
        here: String,
        rank0: String,
    },
    /// A replicated parameter of `rank` missing from the graph of `missing_from`.
    MissingParameter {
        name: String,
        rank: usize,
        missing_from: usize,
    },
    /// A communicating op that does not lead to its rank's loss.
    OffLossPath {
        rank: usize,
        kind: &'static str,
        name: String,
    },
    /// The ranks of a group call different collectives over it.
    CollectivesDiffer {
        group: Vec<usize>,
        rank: usize,
        here: Vec<String>,
        first: usize,
        there: Vec<String>,
    },
    /// A Send or Receive (`name`, on `rank`) of the transfer `from` -> `to` with `tag`.
    Transfer {
        rank: usize,
        name: String,
        from: usize,
        to: usize,
        tag: u32,
        problem: TransferProblem,
    },
    WrongMode {
        mode: ParallelMode,
    },
    /// A whole graph given for hybrid_parallel, which runs one graph per rank.
    NeedsRankGraphs,
}

impl fmt::Display for HybridProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HybridProblem::GraphCount { graphs, devices } => write!(f, "{graphs} rank graphs for device_num {devices}"),
            HybridProblem::MissingLoss { rank, loss } => write!(f, "the graph of rank {rank} has no node {loss:?}"),
            HybridProblem::NotAParameter { rank, name } => {
                write!(f, "layerwise parameter {name:?} is not a parameter of rank {rank}'s graph")
            }
            HybridProblem::BadGroup { rank, kind, name, group } => {
                write!(f, "{kind} {name:?} on rank {rank} has group {group:?}, which must hold rank {rank} and ranks below device_num")
            }
            HybridProblem::ParameterDiffers { name, rank, what, here, rank0 } => write!(
                f,
                "replicated parameter {name:?} has {what} {here} on rank {rank} but {rank0} on rank 0; mark it layerwise if each rank holds its own"
            ),
            HybridProblem::MissingParameter { name, rank, missing_from } => write!(
                f,
                "replicated parameter {name:?} of rank {rank} is missing from rank {missing_from}'s graph; mark it layerwise if each rank holds its own"
            ),
            HybridProblem::OffLossPath { rank, kind, name } => write!(
                f,
                "{kind} {name:?} on rank {rank} does not lead to the loss; the step computes only what the loss needs, so rank {rank} would skip it while its peers wait (use its output on the way to the loss; a Send returns the value it sends)"
            ),
            HybridProblem::CollectivesDiffer { group, rank, here, first, there } => write!(
                f,
                "the ranks of group {group:?} call different collectives over it: rank {rank} calls {here:?}, rank {first} calls {there:?}; each would wait for a call the other never makes"
            ),
            HybridProblem::Transfer { rank, name, from, to, tag, problem } => {
                write!(f, "{name:?} on rank {rank} (rank {from} -> rank {to}, tag {tag}): {problem}")
            }
            HybridProblem::WrongMode { mode } => write!(f, "rank graphs need parallel_mode = hybrid_parallel, the context says {mode}"),
            HybridProblem::NeedsRankGraphs => write!(f, "it runs one hand-written graph per rank, not one whole graph the planner splits"),
        }
    }
}

/// What is wrong with a point-to-point transfer of hand-written rank graphs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransferProblem {
    /// A Send no Receive on the peer matches.
    NoReceive,
    /// A Receive no Send on the peer matches.
    NoSend,
    /// Two Sends (or two Receives) of the same ranks and tag.
    Repeated,
    /// The Receive expects another shape or dtype than the Send sends.
    TypeDiffers { send: String, receive: String },
    /// A rank sending to itself.
    ToItself,
    /// The value sent, or the Receive's template, depends on a trainable parameter.
    NeedsGradient,
}

impl fmt::Display for TransferProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferProblem::NoReceive => write!(f, "no Receive of this tag on the receiving rank"),
            TransferProblem::NoSend => write!(f, "no Send of this tag on the sending rank"),
            TransferProblem::Repeated => write!(f, "a second transfer of the same ranks and tag; give each its own tag"),
            TransferProblem::TypeDiffers { send, receive } => write!(f, "the Send sends {send} but the Receive expects {receive}"),
            TransferProblem::ToItself => write!(f, "a rank cannot send to itself"),
            TransferProblem::NeedsGradient => write!(
                f,
                "it depends on a trainable parameter, and gradients do not cross hand-written transfers (not supported yet): send values computed from the inputs, and give a Receive an input or a Fill as its template"
            ),
        }
    }
}

pub type Result<T, E = ParallelError> = std::result::Result<T, E>;
