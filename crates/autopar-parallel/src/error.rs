//! The error type of autopar-parallel. Variants carry values (options, ops, shapes, ranks), and
//! their messages end with a hint naming the options to change in backticks (`batch_size`,
//! `pipeline_stages=P`), which the command line spells as its flags.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::context::ParallelMode;

/// Everything that can go wrong while configuring and planning a parallel job.
#[derive(Debug, Error)]
pub enum ParallelError {
    /// A parallel option name (or a key of a table option) that MindSpore's `set_auto_parallel_context` does not have.
    #[error("unknown parallel option {option:?}\n  valid options: {}\nhint: check the spelling; options use MindSpore's set_auto_parallel_context names", valid.join(", "))]
    UnknownOption {
        /// The name given, as `option.key` for a key of a table option.
        option: String,
        /// The names valid in that place.
        valid: Vec<String>,
    },

    /// A parallel option set to a value of the wrong type or out of range.
    #[error(
        "invalid value {value} for parallel option {option}\n  expected {expected}\nhint: pass {} with a value of that form",
        option_flag(option)
    )]
    InvalidOption {
        /// The option's name.
        option: String,
        /// The value given, as JSON text.
        value: String,
        /// What was expected, in words.
        expected: String,
    },

    /// Two parallel options that cannot be used together (found by `ParallelContext::validate`).
    #[error("parallel option {option} conflicts with the other options\n  {conflict}")]
    Conflict {
        /// The option reported as conflicting.
        option: &'static str,
        /// Why it conflicts.
        conflict: Conflict,
    },

    /// An op whose sharding rule cannot be planned by the planner.
    #[error("{kind} {name:?} cannot be planned\n  {why}\nhint: build the network without it (the library's Job::hybrid runs hand-written rank graphs that place their own collectives)")]
    UnsupportedOp {
        /// The op's kind (its primitive's name).
        kind: &'static str,
        /// The node's name.
        name: String,
        /// Why the op cannot be planned, in words.
        why: &'static str,
    },

    /// A network input whose batch dimension (dimension 0) the device count does not divide, under a data-parallel dataset strategy.
    #[error("input {input:?} with shape {shape:?} cannot be split over {devices} devices by its batch dimension ({mode})\nhint: the {} rows of the batch dimension must divide by {devices}; with `micro_batches` or pipeline stages these are one micro-batch's rows (`batch_size` / micro-batches): use a `batch_size` that gives each micro-batch a multiple of {devices} rows, or (semi_auto_parallel, auto_parallel) `dataset_strategy=full_batch`", shape.first().copied().unwrap_or(0))]
    BatchNotDivisible {
        /// The input's name.
        input: String,
        /// The input's whole shape.
        shape: Vec<usize>,
        /// The number of devices the batch is split over.
        devices: usize,
        /// The parallel mode's MindSpore name.
        mode: &'static str,
    },

    /// An explicit `dataset_strategy` that does not fit the network's inputs.
    #[error("invalid dataset_strategy\n  {problem}\nhint: give one split list per network input, e.g. `dataset_strategy=[[8, 1], [8]]`")]
    DatasetStrategy {
        /// What does not fit.
        problem: DatasetProblem,
    },

    /// A tensor layout or device matrix that cannot be built.
    #[error("{node}: {source}")]
    Layout {
        /// The node whose layout failed (or what was being built, e.g. "device matrix").
        node: String,
        /// The layout error.
        #[source]
        source: autopar_layout::LayoutError,
    },

    /// An error of the graph (building it, checking it, or a strategy that does not fit an op).
    #[error(transparent)]
    Graph(Box<autopar_graph::GraphError>),

    /// A rank at or above the job's device count.
    #[error("rank {rank} is out of range for {devices} devices\nhint: pass a rank below `device_num`")]
    RankOutOfRange {
        /// The rank asked for, counted in the world.
        rank: usize,
        /// The job's device count.
        devices: usize,
    },

    /// A local node whose shape differs from the one its planned layout gives (a bug in the planner).
    #[error("internal planner error on rank {rank}: local {kind} {name:?} has shape {got:?}, its layout expects {want:?}\nhint: this is a bug in autopar; please report it with the graph and strategies")]
    LocalShape {
        /// The rank whose program was built.
        rank: usize,
        /// The op's kind.
        kind: &'static str,
        /// The node's name.
        name: String,
        /// The local shape the node has.
        got: Vec<usize>,
        /// The local shape its layout expects.
        want: Vec<usize>,
    },

    /// A redistribution inside the graph that needs a point-to-point permutation (a bug in the planner).
    #[error("internal planner error: a graph redistribution for {node:?} planned a point-to-point permutation\nhint: this is a bug in autopar; please report it with the graph and strategies")]
    PermutationInGraph {
        /// The name of the value being redistributed.
        node: String,
    },

    /// An option autopar parses and validates but whose behaviour it does not implement.
    #[error("parallel option {option} = {value} is not supported yet\n  autopar parses and validates it, but does not implement its behaviour\nhint: remove it from the options given and from the [parallel] table")]
    NotSupportedYet {
        /// The option's name.
        option: String,
        /// The value it was set to (with what makes it unsupported, if that is another option), in words.
        value: String,
    },

    /// A device profile that cannot be read or is invalid.
    #[error("device profile {origin}: {problem}\nhint: write a profile with `autopar calibrate --out FILE`, or leave `profile` unset for the built-in one")]
    BadProfile {
        /// Where the profile came from (a file path or a description).
        origin: String,
        /// What is wrong with it, in words.
        problem: String,
    },

    /// An op none of whose strategies fits `device_memory_capacity` (auto_parallel search).
    #[error("auto_parallel: no strategy of {kind} {name:?} fits device_memory_capacity = {capacity} bytes\n  its cheapest strategy in memory needs {need} bytes per device; its largest tensors: {largest}\nhint: raise `device_memory_capacity=BYTES`, use more devices, or a smaller `batch_size`")]
    OutOfMemory {
        /// The op's kind.
        kind: &'static str,
        /// The node's name.
        name: String,
        /// The memory a device holds, in bytes (`device_memory_capacity`).
        capacity: u64,
        /// The memory its cheapest strategy needs per device, in bytes.
        need: u64,
        /// Its largest tensors (at most three) with their sizes in bytes, in words.
        largest: String,
    },

    /// A search mode that needs a power-of-two device count (recursive_programming) given another.
    #[error("auto_parallel ({search}) needs a power-of-two device count, got {devices}\nhint: use `device_num=2`, 4, 8, ... or `search_mode=dynamic_programming` (or sharding_propagation), which plan any count")]
    SearchDevices {
        /// The search mode's MindSpore name.
        search: &'static str,
        /// The device count given.
        devices: usize,
    },

    /// No plan of an elimination search fits `device_memory_capacity`: the ops' memory per
    /// device, summed, exceeds it under every choice of strategies.
    #[error("auto_parallel ({search}): no plan fits device_memory_capacity = {capacity} bytes\n  whatever the strategies, the ops need at least {least} bytes per device; those needing the most: {largest}\nhint: raise `device_memory_capacity=BYTES`, use more devices, or a smaller `batch_size`")]
    PlanOverMemory {
        /// The search mode's name.
        search: &'static str,
        /// The memory a device holds, in bytes (`device_memory_capacity`).
        capacity: u64,
        /// The least memory per device any plan needs, in bytes.
        least: u64,
        /// The ops whose least memory is largest (at most three), with their bytes, in words.
        largest: String,
    },

    /// A search found no plan its cost model allows.
    #[error("{search} found no plan: {why}\nhint: give the ops that share it one strategy for it, or use another search_mode")]
    SearchNoPlan {
        /// The search mode's MindSpore name.
        search: &'static str,
        /// Why.
        why: String,
    },

    /// A cost graph whose exact search would need too large a table when eliminating an op.
    #[error("auto_parallel ({search}): the cost graph is too wide to search exactly: eliminating {name:?} needs a table of {entries} entries\nhint: use `search_mode=recursive_programming` or sharding_propagation, or set .shard() on some ops")]
    SearchTooWide {
        /// The search mode's MindSpore name.
        search: &'static str,
        /// The name of the op being eliminated.
        name: String,
        /// The number of entries its table would need.
        entries: u128,
    },

    /// A matrix product's strategy does not fit its transposed weight, but fits it the other
    /// way round: written for a weight stored `[in, out]`.
    #[error("{}\n  note: {weight} is stored transposed, [out, in] = {shape:?} (read with transpose_b, as torch.nn.Linear and MindSpore's nn.Dense store it); the strategy fits a weight stored [in, out], as a MatMul without transpose_b reads it\nhint: for this weight, swap its last two splits: {fits}", without_hint(.invalid))]
    TransposedWeight {
        /// The strategy's error.
        invalid: Box<autopar_graph::GraphError>,
        /// The weight's name.
        weight: String,
        /// Its shape.
        shape: Vec<usize>,
        /// The strategy with the weight's last two splits swapped, which fits.
        fits: String,
    },

    /// A strategy a strategy file gives an operator is invalid for it.
    #[error("strategy file {}: {source}", file.display())]
    InStrategyFile {
        /// The strategy file that was read.
        file: PathBuf,
        /// What is wrong with the strategy.
        source: Box<ParallelError>,
    },

    /// The strategy file names an operator the network lacks.
    #[error("strategy file {}: item {item} matches no operator of the network\n  operators are named <Prim>_<parameter>, e.g. MatMul_fc1.weight\nhint: the file was saved for another network; check the strategy file given (`strategy_ckpt_config.load_file`)", file.display())]
    UnknownStrategyItem {
        /// The strategy file that was read.
        file: PathBuf,
        /// The item's name, `<Prim>_<parameter>`.
        item: String,
    },

    /// An operator strategy file names an operator the network lacks (or a node that takes no
    /// strategy: a parameter, an input, a reshape).
    #[error("operator strategy file {}: operator {op:?} is not in the network, or takes no strategy\nhint: the file was saved for another network or configuration; save it again with op_strategy_config mode SAVE", file.display())]
    UnknownOperator {
        /// The operator strategy file that was read.
        file: PathBuf,
        /// The operator's name.
        op: String,
    },

    /// A strategy file (or group-info file) that could not be read or written.
    #[error("strategy file {}: {error}", path.display())]
    StrategyFile {
        /// The file.
        path: PathBuf,
        /// The checkpoint crate's error.
        error: Box<autopar_checkpoint::CheckpointError>,
    },

    /// `pipeline_result_broadcast` set for a training job.
    #[error("pipeline_result_broadcast sends a pipeline's inference outputs to every rank, and this job trains\nhint: training reports the loss on every rank already; leave pipeline_result_broadcast false (it applies to pipeline inference)")]
    ResultBroadcastInTraining,

    /// A micro-batch count a job cannot run: none, or one that does not divide the batch.
    #[error("{}\nhint: pass `micro_batches=M` with M dividing `batch_size` (1: no micro-batches)", if *given == 0 { "micro_batches = 0: a step runs at least one micro-batch".to_string() } else { format!("{given} micro-batches do not divide the batch of {batch} rows into equal parts") })]
    MicroBatches {
        /// The count given.
        given: usize,
        /// The global batch's rows (0 when not known yet).
        batch: usize,
    },

    /// `op_strategy_config` in mode LOAD without the operator strategies read from its file.
    #[error("op_strategy_config loads {path:?}, but the plan request carries no operator strategies\nhint: assemble the job with assemble_job, which reads them (or read them with strategy_files::load_plan_strategies and pass them as PlanRequest::strategy_file)")]
    OperatorStrategiesNotGiven {
        /// The file `op_strategy_config` names.
        path: String,
    },

    /// An operator strategy file lacks an operator of the network.
    #[error("operator strategy file {}: no strategy for operator {op:?} ({kind})\n  a loaded operator strategy file gives every operator its strategy\nhint: the file was saved for another network or configuration; save it again with op_strategy_config mode SAVE", file.display())]
    MissingOperator {
        /// The operator strategy file that was read.
        file: PathBuf,
        /// The operator's name.
        op: String,
        /// The operator's kind.
        kind: &'static str,
    },

    /// A loss whose dtype is not floating-point.
    #[error("the loss {name:?} is {dtype}; training differentiates a floating-point loss\nhint: Cast the loss to f32, or pass the float value it is computed from")]
    LossNotFloat {
        /// The loss node's name.
        name: String,
        /// The loss's dtype.
        dtype: autopar_graph::DType,
    },

    /// A network that cannot be cut into its pipeline stages.
    #[error("pipeline_stages: {problem}\nhint: {}", problem.hint())]
    Pipeline {
        /// Why it cannot.
        problem: PipelineProblem,
    },

    /// A pipeline schedule that cannot be built or does not run.
    #[error("pipeline schedule: {0}")]
    Schedule(#[from] crate::pipeline::ScheduleError),

    /// A set of hybrid_parallel rank graphs that cannot run together.
    #[error("hybrid_parallel: {problem}\nhint: build one graph per rank (`device_num` of them) with the same loss name, collectives over groups holding the rank")]
    Hybrid {
        /// What is wrong with them.
        problem: HybridProblem,
    },
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
        /// The op's kind.
        kind: &'static str,
        /// The op's name.
        name: String,
        /// The stage the op is placed on, counted from 0.
        stage: usize,
        /// The name of the input it consumes.
        input: String,
        /// The stage of that input, counted from 0.
        input_stage: usize,
    },
    /// An op placed on a stage at or above `pipeline_stages`.
    StageOutOfRange {
        /// The op's kind.
        kind: &'static str,
        /// The op's name.
        name: String,
        /// The stage the op is placed on, counted from 0.
        stage: usize,
        /// The number of stages (`pipeline_stages`).
        stages: usize,
    },
    /// A stage no operator is placed on.
    EmptyStage {
        /// The empty stage, counted from 0.
        stage: usize,
        /// The number of stages (`pipeline_stages`).
        stages: usize,
    },
    /// A loss computed on a stage other than the last.
    LossNotOnLastStage {
        /// The loss node's name.
        name: String,
        /// The stage it is computed on, counted from 0.
        stage: usize,
        /// The number of stages (`pipeline_stages`).
        stages: usize,
    },
    /// A split (`--pipeline-split`) naming other than `stages - 1` ops (with
    /// `pipeline_interleave`, other than `chunks * stages - 1`).
    SplitCount {
        /// The ops named.
        given: usize,
        /// The number of stages (`pipeline_stages`).
        stages: usize,
        /// Whether the pipeline is interleaved.
        interleave: bool,
    },
    /// A split naming something that is not an op of the network.
    SplitNotAnOp {
        /// The name given.
        name: String,
    },
    /// A split naming its ops out of network order (or one twice).
    SplitOrder {
        /// The op named out of order.
        name: String,
        /// The op named before it, which comes later (or is the same).
        after: String,
    },
    /// A split for a model that places its ops on stages itself.
    SplitOfPlacedModel,
    /// A split without pipeline stages.
    SplitWithoutStages,
    /// A split naming the network's first op (stage 0 would be empty).
    SplitAtFirstOp {
        /// The op named.
        name: String,
    },
    /// A split naming an op after the loss (the loss would not be on the last stage).
    SplitAfterLoss {
        /// The op named.
        name: String,
        /// The loss's name.
        loss: String,
    },
    /// The loss of an interleaved pipeline computed before the last chunk of the last stage.
    LossNotOnLastChunk {
        /// The loss node's name.
        name: String,
        /// The stage it is computed on, counted from 0.
        stage: usize,
        /// The chunk of that stage, counted from 0.
        chunk: usize,
        /// The number of stages.
        stages: usize,
        /// Chunks per stage.
        chunks: usize,
    },
    /// A network output (of a job without a loss) computed before the last stage.
    OutputNotOnLastStage {
        /// The output's name.
        name: String,
        /// The piece it is computed on (its stage without interleaving).
        stage: usize,
    },
    /// An interleaved pipeline's chunk (virtual stage) no operator is placed on.
    EmptyChunk {
        /// The stage, counted from 0.
        stage: usize,
        /// The chunk of the stage, counted from 0.
        chunk: usize,
        /// The chunks every stage has.
        chunks: usize,
    },
    /// A pipeline job handed to the one-stage planner.
    NeedsPipelinePlanner,
}

impl PipelineProblem {
    /// What to do about it, in one line.
    pub fn hint(&self) -> &'static str {
        match self {
            PipelineProblem::SplitCount { .. }
            | PipelineProblem::SplitNotAnOp { .. }
            | PipelineProblem::SplitOrder { .. }
            | PipelineProblem::SplitAtFirstOp { .. }
            | PipelineProblem::SplitAfterLoss { .. } => {
                "`pipeline_split` names the first op of each stage after the first, in network order, as `autopar plan` lists them"
            }
            PipelineProblem::SplitOfPlacedModel => "drop `pipeline_split`: the model's own stages apply",
            PipelineProblem::SplitWithoutStages => "set `pipeline_stages=P`, or drop `pipeline_split`",

            PipelineProblem::ConsumerBeforeProducer { .. }
            | PipelineProblem::StageOutOfRange { .. }
            | PipelineProblem::EmptyStage { .. }
            | PipelineProblem::LossNotOnLastStage { .. }
            | PipelineProblem::EmptyChunk { .. }
            | PipelineProblem::OutputNotOnLastStage { .. }
            | PipelineProblem::LossNotOnLastChunk { .. }
            | PipelineProblem::NeedsPipelinePlanner => "give each block its stage with GraphBuilder::set_pipeline_stage (MindSpore's cell.pipeline_stage) or `pipeline_split`, in execution order, from 0 to pipeline_stages-1",
        }
    }
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
            PipelineProblem::SplitCount { given, stages, interleave: false } => {
                let ops = |k: usize| if k == 1 { "1 op".to_string() } else { format!("{k} ops") };
                write!(f, "the split names {}; {stages} stages need {}, where each stage after the first begins", ops(*given), ops(stages - 1))
            }
            PipelineProblem::SplitCount { given, stages, interleave: true } => write!(
                f,
                "the split names {given} ops; with pipeline_interleave it must name k*{stages}-1 ops for k chunks per stage ({}, {}, ...)",
                stages - 1,
                2 * stages - 1
            ),
            PipelineProblem::SplitNotAnOp { name } => {
                write!(f, "the split names {name:?}, which is not an op of the network (parameters and inputs belong to no stage)")
            }
            PipelineProblem::SplitOrder { name, after } => {
                write!(f, "the split names {name:?} after {after:?}, which does not come before it in the network; name the ops in network order")
            }
            PipelineProblem::SplitOfPlacedModel => {
                write!(f, "the model places its ops on stages itself (set_pipeline_stage); a split would override it")
            }
            PipelineProblem::SplitWithoutStages => write!(f, "a split cuts pipeline stages, but pipeline_stages is 1"),
            PipelineProblem::SplitAtFirstOp { name } => {
                write!(f, "the split names {name:?}, the network's first op: stage 0 would have no operator")
            }
            PipelineProblem::SplitAfterLoss { name, loss } => {
                write!(f, "the split names {name:?}, which comes after the loss {loss:?}: the loss must be on the last stage")
            }
            PipelineProblem::LossNotOnLastChunk { name, stage, chunk, stages, chunks } => write!(
                f,
                "the loss {name:?} is computed in chunk {chunk} of stage {stage}; it must be in the last chunk ({}) of the last stage ({})",
                chunks - 1,
                stages - 1
            ),
            PipelineProblem::OutputNotOnLastStage { name, stage } => write!(
                f,
                "the network output {name:?} is computed on stage {stage}; a pipeline's outputs come from its last stage"
            ),
            PipelineProblem::EmptyChunk { stage, chunk, chunks } => write!(
                f,
                "chunk {chunk} (virtual stage) of stage {stage} has no operator; with pipeline_interleave every stage runs {chunks} chunks, the stages 0..P repeated in execution order"
            ),
            PipelineProblem::NeedsPipelinePlanner => write!(
                f,
                "a job of several stages is planned in its stages by assemble_job (or plan_stages), not plan_network"
            ),

        }
    }
}

/// Why two parallel options cannot be used together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// A `global_rank` at or above `device_num`.
    GlobalRankNotBelowDeviceNum {
        /// The `global_rank` set.
        global_rank: usize,
        /// The `device_num` set.
        device_num: usize,
    },
    /// `option` (set to a non-default value) does not apply to `mode`.
    ModeDoesNotSupport {
        /// The parallel mode of the context.
        mode: ParallelMode,
        /// The modes the option applies to, in words.
        applies_to: &'static str,
    },
    /// A `pipeline_stages` that does not divide `device_num`.
    StagesDoNotDivide {
        /// The number of pipeline stages.
        stages: usize,
        /// The `device_num` set.
        device_num: usize,
    },
    /// An `optimizer_weight_shard_size` above the number of devices of one pipeline stage.
    OptimizerShardSizeAboveStage {
        /// The `optimizer_weight_shard_size` set.
        size: i64,
        /// The devices of one pipeline stage (`device_num / pipeline_stages`).
        stage_devices: usize,
    },
    /// An option that applies to other search modes than the one set.
    SearchModeDoesNotSupport {
        /// The `search_mode` set.
        search_mode: &'static str,
        /// The search modes the option applies to, in words.
        applies_to: &'static str,
    },
    /// An option of pipelines without pipeline stages.
    NeedsPipelineStages,
    /// Two options that set the same thing.
    AlsoSetBy {
        /// The other option's name.
        other: &'static str,
    },
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::GlobalRankNotBelowDeviceNum { global_rank, device_num } => {
                write!(f, "global_rank {global_rank} is not below device_num {device_num}")
            }
            Conflict::ModeDoesNotSupport { mode, applies_to } => {
                let wanted = match *applies_to {
                    "auto_parallel" => "auto_parallel",
                    "the parallel modes" => "data_parallel",
                    _ => "semi_auto_parallel",
                };
                write!(f, "{mode} does not support it: it applies to {applies_to}\nhint: pass `parallel_mode={wanted}`, or drop the option")
            }
            Conflict::StagesDoNotDivide { stages, device_num } => write!(f, "{stages} stages do not divide device_num {device_num}"),
            Conflict::SearchModeDoesNotSupport { search_mode, applies_to } => {
                write!(f, "search_mode {search_mode} does not support it: it applies to {applies_to}")
            }
            Conflict::AlsoSetBy { other } => write!(f, "{other} sets the same thing; set one of them"),
            Conflict::NeedsPipelineStages => write!(f, "it applies to pipelines; set pipeline_stages to 2 or more"),
            Conflict::OptimizerShardSizeAboveStage { size, stage_devices } => {
                write!(f, "{size} is above the {stage_devices} devices of a pipeline stage")
            }
        }
    }
}

/// Why a dataset strategy does not fit the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetProblem {
    /// A network input the dataset strategy lists no split list for.
    MissingInput {
        /// The input's name.
        input: String,
        /// The input's position among the network's inputs, counted from 0.
        index: usize,
        /// The number of split lists the dataset strategy gives.
        given: usize,
    },
    /// More split lists than the network has inputs.
    ExtraLists {
        /// The number of split lists the dataset strategy gives.
        given: usize,
        /// The network's inputs.
        inputs: usize,
    },
    /// A split list whose length differs from the input's rank (number of dimensions).
    Rank {
        /// The input's name.
        input: String,
        /// The input's shape.
        shape: Vec<usize>,
        /// The input's split list, one entry per dimension.
        splits: Vec<usize>,
    },
    /// A split list whose product (the devices it uses) is 0 or does not divide the device count.
    Devices {
        /// The input's name.
        input: String,
        /// The input's split list.
        splits: Vec<usize>,
        /// The product of the splits.
        used: usize,
        /// The job's device count.
        devices: usize,
    },
    /// A split that does not divide its dimension of the input's shape.
    NotDivisible {
        /// The input's name.
        input: String,
        /// The input's shape.
        shape: Vec<usize>,
        /// The input's split list.
        splits: Vec<usize>,
    },
}

impl fmt::Display for DatasetProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetProblem::MissingInput { input, index, given } => {
                write!(f, "network input {input:?} is input {index}, but dataset_strategy lists {given} inputs")
            }
            DatasetProblem::ExtraLists { given, inputs } => {
                write!(f, "dataset_strategy lists {given} inputs, but the network has {inputs} (one list per input, in order)")
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
    /// A number of rank graphs other than `device_num`.
    GraphCount {
        /// The number of rank graphs given.
        graphs: usize,
        /// The job's device count.
        devices: usize,
    },
    /// A rank graph without a node named like the loss.
    MissingLoss {
        /// The rank whose graph lacks it.
        rank: usize,
        /// The loss's name.
        loss: String,
    },
    /// A name marked layerwise that is not a parameter of a rank's graph.
    NotAParameter {
        /// The rank whose graph was checked.
        rank: usize,
        /// The layerwise name.
        name: String,
    },
    /// A collective (or synchronised op) whose group lacks the rank or names a rank out of range.
    BadGroup {
        /// The rank whose graph holds the op.
        rank: usize,
        /// The op's kind.
        kind: &'static str,
        /// The op's name.
        name: String,
        /// The op's group, as global ranks.
        group: Vec<usize>,
    },
    /// A replicated parameter whose shape, dtype or trainability (`what`) differs between ranks.
    ParameterDiffers {
        /// The parameter's name.
        name: String,
        /// The rank whose copy differs from rank 0's.
        rank: usize,
        /// What differs: "shape", "dtype" or "trainable".
        what: &'static str,
        /// Its value on `rank`, in words.
        here: String,
        /// Its value on rank 0, in words.
        rank0: String,
    },
    /// A replicated parameter of `rank` missing from the graph of `missing_from`.
    MissingParameter {
        /// The parameter's name.
        name: String,
        /// The rank whose graph holds it.
        rank: usize,
        /// The rank whose graph lacks it.
        missing_from: usize,
    },
    /// A communicating op that does not lead to its rank's loss.
    OffLossPath {
        /// The rank whose graph holds the op.
        rank: usize,
        /// The op's kind.
        kind: &'static str,
        /// The op's name.
        name: String,
    },
    /// An op marked for recomputation: each rank's backward pass would replay its own
    /// collectives, which nothing checks match across the ranks.
    Recompute {
        /// The rank whose graph holds the op.
        rank: usize,
        /// The op's name.
        name: String,
    },
    /// The ranks of a group call different collectives over it.
    CollectivesDiffer {
        /// The group, as global ranks.
        group: Vec<usize>,
        /// The rank whose calls differ from those of the group's first rank.
        rank: usize,
        /// The collectives `rank` calls over the group, in graph order.
        here: Vec<String>,
        /// The group's first rank.
        first: usize,
        /// The collectives `first` calls over the group, in graph order.
        there: Vec<String>,
    },
    /// A Send or Receive (`name`, on `rank`) of the transfer `from` -> `to` with `tag`.
    Transfer {
        /// The rank whose graph holds the op.
        rank: usize,
        /// The Send's or Receive's name.
        name: String,
        /// The sending rank.
        from: usize,
        /// The receiving rank.
        to: usize,
        /// The transfer's tag.
        tag: u32,
        /// What is wrong with the transfer.
        problem: TransferProblem,
    },
    /// Rank graphs given to a context whose parallel mode is not hybrid_parallel.
    WrongMode {
        /// The context's parallel mode.
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
            HybridProblem::Recompute { rank, name } => write!(
                f,
                "op {name:?} of rank {rank}'s graph is marked for recomputation, which hybrid_parallel does not run (drop the marks: Graph::apply_recompute(&RecomputeChoice::Nothing))"
            ),
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
    TypeDiffers {
        /// The type the Send sends, in words.
        send: String,
        /// The type the Receive expects, in words.
        receive: String,
    },
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

/// `e`'s message without its hint lines (an error that gives its own hint instead).
fn without_hint(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().filter(|l| !l.starts_with("hint:")).collect::<Vec<_>>().join("\n")
}

/// The result type of autopar-parallel, with [`ParallelError`] as its default error.
pub type Result<T, E = ParallelError> = std::result::Result<T, E>;

/// Parallel option `option` with a value, as a hint names it (`option=VALUE`; a field of a
/// dictionary option within its dictionary, as JSON).
fn option_flag(option: &str) -> String {
    match option {
        "device_num" => "`device_num=N`".into(),
        "parallel_mode" => "`parallel_mode=MODE`".into(),
        // A field of a dictionary option is set with the dictionary, as JSON.
        _ => match option.split_once('.') {
            Some((top, rest)) => {
                let nested = rest.split('.').rev().fold("VALUE".to_string(), |inner, key| format!("{{\"{key}\": {inner}}}"));
                format!("`{top}={nested}`")
            }
            None => format!("`{option}=VALUE`"),
        },
    }
}
