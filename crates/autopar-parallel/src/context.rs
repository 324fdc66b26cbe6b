//! `ParallelContext`: every option of MindSpore's `set_auto_parallel_context`, validated.
//!
//! Options are set by name with a JSON-like value (from the CLI, a TOML `[parallel]` section or
//! code), so an unknown name or a value of the wrong type or range is an error that names the
//! option. [`ParallelContext::validate`] checks the options against each other (global_rank
//! below device_num, options that only apply to some modes); [`ParallelContext::check_supported`]
//! rejects options whose behaviour autopar does not implement yet, instead of ignoring them.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

use crate::error::{Conflict, ParallelError, Result};

/// Every option name `set` accepts, in the order of MindSpore's documentation.
pub const OPTION_NAMES: &[&str] = &[
    "device_num",
    "global_rank",
    "gradients_mean",
    "gradient_fp32_sync",
    "loss_repeated_mean",
    "parallel_mode",
    "search_mode",
    "auto_parallel_search_mode",
    "parameter_broadcast",
    "strategy_ckpt_load_file",
    "strategy_ckpt_save_file",
    "full_batch",
    "dataset_strategy",
    "enable_parallel_optimizer",
    "enable_alltoall",
    "force_fp32_communication",
    "all_reduce_fusion_config",
    "pipeline_stages",
    "pipeline_result_broadcast",
    "pipeline_config",
    "parallel_optimizer_config",
    "comm_fusion",
    "strategy_ckpt_config",
    "group_ckpt_save_file",
    // The strategy search's knobs (MindSpore's `set_cost_model_context` and
    // `set_algo_parameters`); auto_parallel only.
    "device_memory_capacity",
    "costmodel_alpha",
    "costmodel_beta",
    "costmodel_gamma",
    "fully_use_devices",
    "elementwise_op_strategy_follow",
    "tensor_slice_align_enable",
    "tensor_slice_align_size",
    // MindSpore's `set_op_strategy_config(mode, path)` (sharding_propagation only).
    "op_strategy_config",
    // MindSpore's `_set_rp_matmul_mem_coef` (recursive_programming's MatMul memory weight).
    "rp_matmul_mem_coef",
];

/// The options of auto_parallel's strategy search that only it reads: the last ones of
/// [`OPTION_NAMES`].
pub const SEARCH_OPTION_NAMES: &[&str] = OPTION_NAMES.split_at(24).1;

/// How the model is spread over devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ParallelMode {
    /// One device: the reference every other mode must equal.
    #[default]
    StandAlone,
    /// Batch split over all devices, gradients all-reduced.
    DataParallel,
    /// The user places collectives by hand; nothing is inserted automatically.
    HybridParallel,
    /// Operators with a strategy keep it, the others get data parallel.
    SemiAutoParallel,
    /// autopar searches the strategies.
    AutoParallel,
}

impl ParallelMode {
    /// Every mode's MindSpore name, as `parallel_mode` takes it.
    pub const NAMES: &'static [&'static str] = &["stand_alone", "data_parallel", "hybrid_parallel", "semi_auto_parallel", "auto_parallel"];

    /// The mode's MindSpore name, e.g. "semi_auto_parallel".
    pub fn name(self) -> &'static str {
        match self {
            ParallelMode::StandAlone => "stand_alone",
            ParallelMode::DataParallel => "data_parallel",
            ParallelMode::HybridParallel => "hybrid_parallel",
            ParallelMode::SemiAutoParallel => "semi_auto_parallel",
            ParallelMode::AutoParallel => "auto_parallel",
        }
    }

    /// The mode of a MindSpore name; `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "stand_alone" => ParallelMode::StandAlone,
            "data_parallel" => ParallelMode::DataParallel,
            "hybrid_parallel" => ParallelMode::HybridParallel,
            "semi_auto_parallel" => ParallelMode::SemiAutoParallel,
            "auto_parallel" => ParallelMode::AutoParallel,
            _ => return None,
        })
    }

    /// Modes in which operators carry strategies (the AUTO_PARALLEL column of the options table).
    pub fn is_auto(self) -> bool {
        matches!(self, ParallelMode::SemiAutoParallel | ParallelMode::AutoParallel)
    }
}

impl fmt::Display for ParallelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Strategy search of `auto_parallel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SearchMode {
    /// "recursive_programming": MindSpore's default, greedy binary cuts of every op without the cost graph.
    #[default]
    RecursiveProgramming,
    /// "sharding_propagation": strategies spread from the ops that have one, then from the
    /// dataset, to their neighbours.
    ShardingPropagation,
    /// "dynamic_programming": variable elimination over the cost graph.
    DynamicProgramming,
}

impl SearchMode {
    /// Every search mode's MindSpore name, as `search_mode` takes it.
    pub const NAMES: &'static [&'static str] = &["recursive_programming", "sharding_propagation", "dynamic_programming"];

    /// The search mode's MindSpore name, e.g. "dynamic_programming".
    pub fn name(self) -> &'static str {
        match self {
            SearchMode::RecursiveProgramming => "recursive_programming",
            SearchMode::ShardingPropagation => "sharding_propagation",
            SearchMode::DynamicProgramming => "dynamic_programming",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "recursive_programming" => SearchMode::RecursiveProgramming,
            "sharding_propagation" => SearchMode::ShardingPropagation,
            "dynamic_programming" => SearchMode::DynamicProgramming,
            _ => return None,
        })
    }
}

/// How the dataset is split over ranks.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DatasetStrategy {
    /// Each rank reads its own shard of every batch (the batch dimension split over all ranks).
    #[default]
    DataParallel,
    /// Every rank reads the whole batch.
    FullBatch,
    /// One split per dimension of each network input, e.g. `((8, 1), (8,))`.
    Explicit(Vec<Vec<usize>>),
}

/// Pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PipelineScheduler {
    /// "1f1b": one forward, one backward, in turn once the pipeline is full (the default).
    #[default]
    OneFOneB,
    /// "gpipe": every micro-batch's forward, then every backward.
    GPipe,
}

impl PipelineScheduler {
    /// The name `pipeline_config.pipeline_scheduler` takes.
    pub fn name(self) -> &'static str {
        match self {
            PipelineScheduler::OneFOneB => "1f1b",
            PipelineScheduler::GPipe => "gpipe",
        }
    }
}

/// `pipeline_config`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PipelineConfig {
    /// `pipeline_interleave`: several chunks (virtual stages) per rank. The model's stages
    /// repeat in execution order (a lower stage than the op before starts a chunk; a model that
    /// places stages `0..P` once has one chunk per stage, so nothing is interleaved), a
    /// `--pipeline-split` names `chunks * stages - 1` ops, or autopar cuts 2 chunks per stage.
    /// Needs `pipeline_stages` > 1.
    pub pipeline_interleave: bool,
    /// `pipeline_scheduler`: the schedule of the micro-batches.
    pub pipeline_scheduler: PipelineScheduler,
}

/// The name [`ParallelContext::is_set`] knows `parallel_optimizer_config`'s `optimizer_level` by
/// when it was given.
pub const OPTIMIZER_LEVEL: &str = "parallel_optimizer_config.optimizer_level";

/// `parallel_optimizer_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParallelOptimizerConfig {
    /// Gradient accumulation reduce-scatters each micro-batch's gradients of sharded parameters, not their sum.
    pub gradient_accumulation_shard: bool,
    /// Parameters smaller than this many KB are not sharded.
    pub parallel_optimizer_threshold: u64,
    /// Size of the optimizer shard group; -1 = the parameter's whole data-parallel group.
    pub optimizer_weight_shard_size: i64,
    /// `optimizer_level`: what a rank keeps of a sharded weight between uses.
    pub optimizer_level: OptimizerLevel,
}

/// `parallel_optimizer_config.optimizer_level`: what a rank keeps of a sharded weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum OptimizerLevel {
    /// `level1`: the weight's slice is all-gathered before the forward pass and kept to the
    /// step's end (and its buffer from step to step); the optimizer state and the update are
    /// sharded.
    #[default]
    Level1,
    /// `level2`: as level1, and each sharded weight's gradient is reduce-scattered as the
    /// backward pass forms it (in every micro-batch), so the rank keeps only its shard of the
    /// gradient, never the whole slices of the step.
    Level2,
    /// `level3`: as level2, and only the rank's shard of the weight is kept between uses: the
    /// slice is all-gathered just before its forward use and freed after its last forward
    /// reader, and all-gathered again just before the backward pass reads it (a recomputed
    /// all-gather).
    Level3,
}

impl OptimizerLevel {
    /// MindSpore's name (`level1`).
    pub fn name(self) -> &'static str {
        match self {
            OptimizerLevel::Level1 => "level1",
            OptimizerLevel::Level2 => "level2",
            OptimizerLevel::Level3 => "level3",
        }
    }

    /// Whether each sharded weight's gradient is reduce-scattered inside the backward pass
    /// (level2 and level3).
    pub fn shards_gradients(self) -> bool {
        self != OptimizerLevel::Level1
    }

    /// Whether a sharded weight is all-gathered per use (level3).
    pub fn gathers_per_use(self) -> bool {
        self == OptimizerLevel::Level3
    }
}

impl Default for ParallelOptimizerConfig {
    fn default() -> Self {
        Self {
            gradient_accumulation_shard: true,
            parallel_optimizer_threshold: 64,
            optimizer_weight_shard_size: -1,
            optimizer_level: OptimizerLevel::Level1,
        }
    }
}

/// Fusion mode of one collective kind in `comm_fusion`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FusionMode {
    /// Buckets by gradient size with the default threshold (64 MB).
    Auto,
    /// Buckets of at most this many MB.
    Size(f64Bits),
    /// Bucket boundaries at these gradient indices (AllReduce only).
    Index(Vec<usize>),
}

/// An `f64` compared by bits so the config stays `Eq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct f64Bits(u64);

impl f64Bits {
    /// The bits of `v`.
    pub fn new(v: f64) -> Self {
        Self(v.to_bits())
    }
    /// The `f64` held.
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

/// `comm_fusion`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommFusion {
    /// Whether fusion is on; `false` gives every parameter its own collective.
    pub openstate: bool,
    /// Fusion of the gradient all-reduces.
    pub allreduce: FusionMode,
    /// Fusion of the parallel optimizer's parameter all-gathers.
    pub allgather: FusionMode,
    /// Fusion of the parallel optimizer's gradient reduce-scatters.
    pub reducescatter: FusionMode,
}

impl Default for CommFusion {
    fn default() -> Self {
        Self { openstate: true, allreduce: FusionMode::Auto, allgather: FusionMode::Auto, reducescatter: FusionMode::Auto }
    }
}

/// The strategy search's knobs (MindSpore's `set_cost_model_context` / `set_algo_parameters`
/// keys that apply to autopar's cost model; see `search`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchOptions {
    /// Bytes one device holds; strategies whose op needs more are not considered, and the
    /// elimination searches keep the plan's memory (summed over its ops) within it.
    pub device_memory_capacity: u64,
    /// Weight of computation in the objective (seconds; under dynamic_programming's MindSpore
    /// costs, bytes, MindSpore's 1 where unset).
    pub costmodel_alpha: f64Bits,
    /// Weight of communication (in-op and redistribution) in the objective (MindSpore's 400
    /// under dynamic_programming's MindSpore costs where unset).
    pub costmodel_beta: f64Bits,
    /// Weight of gradient synchronisation in the objective (MindSpore's 0.001 of
    /// communication under dynamic_programming's MindSpore costs where unset).
    pub costmodel_gamma: f64Bits,
    /// dynamic_programming and sharding_propagation consider only strategies using every
    /// device or none; otherwise (the default, as MindSpore's since 2.5) every candidate split
    /// (powers of two, and the odd factor of a device count such as 12), except that
    /// dynamic_programming takes the former where every split is more than it searches in
    /// seconds (its report says so). The recursive search's cuts may leave devices idle either
    /// way.
    pub fully_use_devices: bool,
    /// Element-wise ops take their first input's layout as it comes (no redistribution before them).
    pub elementwise_op_strategy_follow: bool,
    /// MatMul slices' last two dimensions must be multiples of `tensor_slice_align_size`.
    pub tensor_slice_align_enable: bool,
    /// The multiple `tensor_slice_align_enable` asks for, in elements.
    pub tensor_slice_align_size: usize,
    /// `op_strategy_config`: save every operator's strategy to, or load them all from, a JSON
    /// operator strategy file (MindSpore's `set_op_strategy_config`).
    pub op_strategy: Option<OpStrategyConfig>,
    /// MindSpore's `MS_INTERFERED_SAPP`: recursive_programming keeps the strategies the model's
    /// `.shard()` set (and cuts the rest around them). Off, as in MindSpore 2.10, it overwrites
    /// them (the search report lists the ops). The default reads the environment variable
    /// `MS_INTERFERED_SAPP` (`1`: on), as MindSpore does.
    pub interfered_sapp: bool,
    /// recursive_programming's weight of the memory a MatMul keeps whole when it cuts its rows
    /// (MindSpore's `rp_matmul_mem_coef`, set by `_set_rp_matmul_mem_coef`; 0.1).
    pub rp_matmul_mem_coef: f64Bits,
    /// Set by the pipeline planner (not a user key): the graph searched is a pipeline's, built
    /// for one micro-batch. recursive_programming then never cuts a MatMul's rows below one
    /// sample of the micro-batch per device, and above 32 devices orders its visits by weight
    /// only for micro-batches under 8 samples, as MindSpore's does with `pipeline_stages` > 1.
    pub pipelined: bool,
}

/// `op_strategy_config`: MindSpore's `set_op_strategy_config(mode, path)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpStrategyConfig {
    /// Whether the file is written after planning or read before it.
    pub mode: OpStrategyMode,
    /// The `.json` file.
    pub path: String,
}

/// What `op_strategy_config` does with its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpStrategyMode {
    /// `"SAVE"`: write every operator's strategy after planning.
    Save,
    /// `"LOAD"`: take every operator's strategy from the file instead of searching.
    Load,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            device_memory_capacity: 16 << 30,
            costmodel_alpha: f64Bits::new(1.0),
            costmodel_beta: f64Bits::new(1.0),
            costmodel_gamma: f64Bits::new(1.0),
            fully_use_devices: false,
            elementwise_op_strategy_follow: false,
            tensor_slice_align_enable: false,
            tensor_slice_align_size: 16,
            op_strategy: None,
            interfered_sapp: std::env::var("MS_INTERFERED_SAPP").is_ok_and(|v| v == "1"),
            pipelined: false,
            rp_matmul_mem_coef: f64Bits::new(0.1),
        }
    }
}

/// `strategy_ckpt_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrategyCkptConfig {
    /// The strategy file to load; empty for none.
    pub load_file: String,
    /// The strategy file to save; empty for none.
    pub save_file: String,
    /// The saved strategy file holds the layouts of trainable parameters only.
    pub only_trainable_params: bool,
}

impl Default for StrategyCkptConfig {
    fn default() -> Self {
        Self { load_file: String::new(), save_file: String::new(), only_trainable_params: true }
    }
}

/// The parallel context of one job. `Default` is MindSpore's `reset_auto_parallel_context`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParallelContext {
    /// The number of devices (ranks) of the job.
    pub(crate) device_num: usize,
    /// This process's global rank, counted from 0.
    pub(crate) global_rank: usize,
    /// Gradients are averaged over the data-parallel ranks, not summed.
    pub(crate) gradients_mean: bool,
    /// Half-precision gradients are synchronised in f32 (semi_auto_parallel and auto_parallel).
    pub(crate) gradient_fp32_sync: bool,
    /// The backward starts from 1/device_num instead of 1 (semi_auto_parallel and auto_parallel).
    pub(crate) loss_repeated_mean: bool,
    /// How the model is spread over devices.
    pub(crate) parallel_mode: ParallelMode,
    /// The strategy search of auto_parallel (`search_mode`, or `auto_parallel_search_mode`).
    pub(crate) search_mode: SearchMode,
    /// Parameters are broadcast over their mirror groups before training.
    pub(crate) parameter_broadcast: bool,
    /// How the dataset is split over ranks (`dataset_strategy`, or `full_batch`).
    pub(crate) dataset_strategy: DatasetStrategy,
    /// The parallel optimizer: parameters and optimizer state sharded over their data-parallel ranks.
    pub(crate) enable_parallel_optimizer: bool,
    /// Redistributions may use AllToAll.
    pub(crate) enable_alltoall: bool,
    /// Half-precision values are communicated in f32.
    pub(crate) force_fp32_communication: bool,
    /// The number of pipeline stages; 1 for no pipeline.
    pub(crate) pipeline_stages: usize,
    /// Pipeline inference (`RankTrainer::predict`): the last stage's outputs reach every rank,
    /// not only the last stage's (pipelines only).
    pub(crate) pipeline_result_broadcast: bool,
    /// `pipeline_config`.
    pub(crate) pipeline_config: PipelineConfig,
    /// `parallel_optimizer_config`.
    pub(crate) parallel_optimizer_config: ParallelOptimizerConfig,
    /// `comm_fusion` (its all-reduce mode also set by `all_reduce_fusion_config`).
    pub(crate) comm_fusion: CommFusion,
    /// `strategy_ckpt_config` (its files also set by `strategy_ckpt_load_file` and `strategy_ckpt_save_file`).
    pub(crate) strategy_ckpt_config: StrategyCkptConfig,
    /// The group-info file each rank's communication groups are saved to (one file per rank beside it); empty for none.
    pub(crate) group_ckpt_save_file: String,
    /// The strategy search's knobs (auto_parallel only).
    pub(crate) search: SearchOptions,
    /// Names set explicitly (for the mode checks of `validate`).
    explicit: BTreeSet<&'static str>,
}

impl Default for ParallelContext {
    fn default() -> Self {
        Self {
            device_num: 1,
            global_rank: 0,
            gradients_mean: false,
            gradient_fp32_sync: true,
            loss_repeated_mean: true,
            parallel_mode: ParallelMode::StandAlone,
            search_mode: SearchMode::RecursiveProgramming,
            parameter_broadcast: false,
            dataset_strategy: DatasetStrategy::DataParallel,
            enable_parallel_optimizer: false,
            enable_alltoall: false,
            force_fp32_communication: false,
            pipeline_stages: 1,
            pipeline_result_broadcast: false,
            pipeline_config: PipelineConfig::default(),
            parallel_optimizer_config: ParallelOptimizerConfig::default(),
            comm_fusion: CommFusion::default(),
            strategy_ckpt_config: StrategyCkptConfig::default(),
            group_ckpt_save_file: String::new(),
            search: SearchOptions::default(),
            explicit: BTreeSet::new(),
        }
    }
}

impl ParallelContext {
    /// MindSpore's `MS_INTERFERED_SAPP=1` for recursive_programming (read from the environment
    /// when the context is made): set here for this context alone.
    pub fn set_interfered_sapp(&mut self, on: bool) {
        self.search.interfered_sapp = on;
    }
}

/// Every option's value. The options are set only through [`ParallelContext::set`] (validated
/// for type and range, and recorded as set), so they are read here.
impl ParallelContext {
    /// The number of devices (ranks) of the job.
    pub fn device_num(&self) -> usize {
        self.device_num
    }

    /// This process's global rank, counted from 0.
    pub fn global_rank(&self) -> usize {
        self.global_rank
    }

    /// Gradients are averaged over the data-parallel ranks, not summed.
    pub fn gradients_mean(&self) -> bool {
        self.gradients_mean
    }

    /// Half-precision gradients are synchronised in f32 (semi_auto_parallel and auto_parallel).
    pub fn gradient_fp32_sync(&self) -> bool {
        self.gradient_fp32_sync
    }

    /// The backward starts from 1/device_num instead of 1 (semi_auto_parallel and auto_parallel).
    pub fn loss_repeated_mean(&self) -> bool {
        self.loss_repeated_mean
    }

    /// How the model is spread over devices.
    pub fn parallel_mode(&self) -> ParallelMode {
        self.parallel_mode
    }

    /// The strategy search of auto_parallel (`search_mode`, or `auto_parallel_search_mode`).
    pub fn search_mode(&self) -> SearchMode {
        self.search_mode
    }

    /// Parameters are broadcast over their mirror groups before training.
    pub fn parameter_broadcast(&self) -> bool {
        self.parameter_broadcast
    }

    /// How the dataset is split over ranks (`dataset_strategy`, or `full_batch`).
    pub fn dataset_strategy(&self) -> &DatasetStrategy {
        &self.dataset_strategy
    }

    /// The parallel optimizer: parameters and optimizer state sharded over their data-parallel ranks.
    pub fn enable_parallel_optimizer(&self) -> bool {
        self.enable_parallel_optimizer
    }

    /// Redistributions may use AllToAll.
    pub fn enable_alltoall(&self) -> bool {
        self.enable_alltoall
    }

    /// Half-precision values are communicated in f32.
    pub fn force_fp32_communication(&self) -> bool {
        self.force_fp32_communication
    }

    /// The number of pipeline stages; 1 for no pipeline.
    pub fn pipeline_stages(&self) -> usize {
        self.pipeline_stages
    }

    /// Pipeline inference (`RankTrainer::predict`): the last stage's outputs reach every rank, not only the last stage's (pipelines only).
    pub fn pipeline_result_broadcast(&self) -> bool {
        self.pipeline_result_broadcast
    }

    /// `pipeline_config`.
    pub fn pipeline_config(&self) -> &PipelineConfig {
        &self.pipeline_config
    }

    /// `parallel_optimizer_config`.
    pub fn parallel_optimizer_config(&self) -> &ParallelOptimizerConfig {
        &self.parallel_optimizer_config
    }

    /// `comm_fusion` (its all-reduce mode also set by `all_reduce_fusion_config`).
    pub fn comm_fusion(&self) -> &CommFusion {
        &self.comm_fusion
    }

    /// `strategy_ckpt_config` (its files also set by `strategy_ckpt_load_file` and `strategy_ckpt_save_file`).
    pub fn strategy_ckpt_config(&self) -> &StrategyCkptConfig {
        &self.strategy_ckpt_config
    }

    /// The group-info file each rank's communication groups are saved to (one file per rank beside it); empty for none.
    pub fn group_ckpt_save_file(&self) -> &str {
        &self.group_ckpt_save_file
    }

    /// The strategy search's knobs (auto_parallel only).
    pub fn search(&self) -> &SearchOptions {
        &self.search
    }
}

fn bad(option: &str, value: &Value, expected: impl Into<String>) -> ParallelError {
    ParallelError::InvalidOption { option: option.to_string(), value: value.to_string(), expected: expected.into() }
}

fn as_bool(option: &str, v: &Value) -> Result<bool> {
    v.as_bool().ok_or_else(|| bad(option, v, "true or false"))
}

fn as_int(option: &str, v: &Value, lo: i64, hi: i64) -> Result<i64> {
    match v.as_i64() {
        Some(x) if (lo..=hi).contains(&x) => Ok(x),
        _ => Err(bad(option, v, format!("an integer in [{lo}, {hi}]"))),
    }
}

fn as_str<'a>(option: &str, v: &'a Value) -> Result<&'a str> {
    v.as_str().ok_or_else(|| bad(option, v, "a string"))
}

/// `parallel_optimizer_config` from its table, and whether it gives `optimizer_level`.
fn parse_parallel_optimizer_config(v: &Value) -> Result<(ParallelOptimizerConfig, bool)> {
    let o = as_object(
        "parallel_optimizer_config",
        v,
        &["gradient_accumulation_shard", "parallel_optimizer_threshold", "optimizer_weight_shard_size", "optimizer_level"],
    )?;
    let mut c = ParallelOptimizerConfig::default();
    if let Some(x) = o.get("gradient_accumulation_shard") {
        c.gradient_accumulation_shard = as_bool("parallel_optimizer_config.gradient_accumulation_shard", x)?;
    }
    if let Some(x) = o.get("parallel_optimizer_threshold") {
        c.parallel_optimizer_threshold = as_int("parallel_optimizer_config.parallel_optimizer_threshold", x, 0, i64::MAX)? as u64;
    }
    if let Some(x) = o.get("optimizer_weight_shard_size") {
        let s = as_int("parallel_optimizer_config.optimizer_weight_shard_size", x, -1, 4096)?;
        if s == 0 {
            return Err(bad("parallel_optimizer_config.optimizer_weight_shard_size", x, "-1 or an integer in (0, device_num]"));
        }
        c.optimizer_weight_shard_size = s;
    }
    if let Some(x) = o.get("optimizer_level") {
        c.optimizer_level = one_of("parallel_optimizer_config.optimizer_level", x, &["level1", "level2", "level3"], |s| match s {
            "level1" => Some(OptimizerLevel::Level1),
            "level2" => Some(OptimizerLevel::Level2),
            "level3" => Some(OptimizerLevel::Level3),
            _ => None,
        })?;
    }
    if c.optimizer_level.shards_gradients() && !c.gradient_accumulation_shard {
        return Err(bad(
                "parallel_optimizer_config.gradient_accumulation_shard",
                &serde_json::Value::Bool(false),
                format!(
                    "true under optimizer_level {} (it reduce-scatters each micro-batch's gradients as the backward pass forms them; gradient_accumulation_shard false keeps their whole sum, as level1 does)",
                    c.optimizer_level.name()
                ),
            ));
    }
    Ok((c, o.contains_key("optimizer_level")))
}

fn one_of<T>(option: &str, v: &Value, names: &[&str], parse: impl Fn(&str) -> Option<T>) -> Result<T> {
    v.as_str().and_then(parse).ok_or_else(|| bad(option, v, format!("one of {}", names.join(", "))))
}

fn as_object<'a>(option: &str, v: &'a Value, keys: &[&str]) -> Result<&'a serde_json::Map<String, Value>> {
    let obj = v.as_object().ok_or_else(|| {
        bad(option, v, format!("a table with keys {} (on the command line a JSON object, e.g. {{\"{}\": ...}})", keys.join(", "), keys[0]))
    })?;
    if let Some(k) = obj.keys().find(|k| !keys.contains(&k.as_str())) {
        return Err(ParallelError::UnknownOption { option: format!("{option}.{k}"), valid: keys.iter().map(|s| s.to_string()).collect() });
    }
    Ok(obj)
}

impl ParallelContext {
    /// Back to MindSpore's defaults (`reset_auto_parallel_context`).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// MindSpore's defaults: stand_alone on one device.
    pub fn new() -> Self {
        Self::default()
    }

    /// This context with option `name` set (MindSpore's `set_auto_parallel_context(name=value)`),
    /// for chaining: `ParallelContext::new().with("parallel_mode", "semi_auto_parallel")?.with("device_num", 8)?`.
    /// Values are what [`set`](Self::set) takes: strings, numbers, booleans, and JSON tables
    /// (`serde_json::json!({"pipeline_scheduler": "1f1b"})`) for the nested options.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Result<Self> {
        self.set(name, &value.into())?;
        Ok(self)
    }

    /// The devices a job of this context runs on: 1 in stand_alone (whatever `device_num`
    /// says), `device_num` otherwise.
    pub fn devices(&self) -> usize {
        match self.parallel_mode {
            ParallelMode::StandAlone => 1,
            ParallelMode::DataParallel | ParallelMode::SemiAutoParallel | ParallelMode::AutoParallel | ParallelMode::HybridParallel => {
                self.device_num
            }
        }
    }

    /// The context a job runs under: this one with autopar's defaults for what was not set
    /// (the same for the Rust API, the command line and Python): more than one device and no
    /// `parallel_mode` runs semi_auto_parallel; data_parallel averages gradients
    /// (`gradients_mean`) unless told otherwise, so that it trains as one device does.
    pub fn resolved(&self) -> Result<Self> {
        let mut ctx = self.clone();
        if !ctx.is_set("parallel_mode") && ctx.device_num > 1 {
            ctx.set("parallel_mode", &Value::String("semi_auto_parallel".into()))?;
        }
        if ctx.parallel_mode == ParallelMode::DataParallel && !ctx.is_set("gradients_mean") {
            ctx.set("gradients_mean", &Value::Bool(true))?;
        }
        Ok(ctx)
    }

    /// Whether `name` was set explicitly.
    pub fn is_set(&self, name: &str) -> bool {
        self.explicit.contains(name)
    }

    /// Set one option by its MindSpore name. The value's type and range are checked here; the
    /// options' consistency with each other in [`validate`](Self::validate).
    pub fn set(&mut self, name: &str, value: &Value) -> Result<()> {
        let Some(&key) = OPTION_NAMES.iter().find(|&&n| n == name) else {
            return Err(ParallelError::UnknownOption {
                option: name.to_string(),
                valid: OPTION_NAMES.iter().map(|s| s.to_string()).collect(),
            });
        };
        let v = value;
        match key {
            "device_num" => self.device_num = as_int(key, v, 1, 4096)? as usize,
            "global_rank" => self.global_rank = as_int(key, v, 0, 4095)? as usize,
            "gradients_mean" => self.gradients_mean = as_bool(key, v)?,
            "gradient_fp32_sync" => self.gradient_fp32_sync = as_bool(key, v)?,
            "loss_repeated_mean" => self.loss_repeated_mean = as_bool(key, v)?,
            "parallel_mode" => self.parallel_mode = one_of(key, v, ParallelMode::NAMES, ParallelMode::parse)?,
            "search_mode" | "auto_parallel_search_mode" => {
                self.search_mode = one_of(key, v, SearchMode::NAMES, SearchMode::parse)?;
                self.explicit.insert("search_mode");
            }
            "parameter_broadcast" => self.parameter_broadcast = as_bool(key, v)?,
            "strategy_ckpt_load_file" => self.strategy_ckpt_config.load_file = as_str(key, v)?.to_string(),
            "strategy_ckpt_save_file" => self.strategy_ckpt_config.save_file = as_str(key, v)?.to_string(),
            "full_batch" => {
                self.dataset_strategy = if as_bool(key, v)? { DatasetStrategy::FullBatch } else { DatasetStrategy::DataParallel };
                self.explicit.insert("dataset_strategy");
            }
            "dataset_strategy" => self.dataset_strategy = parse_dataset_strategy(v)?,
            "enable_parallel_optimizer" => self.enable_parallel_optimizer = as_bool(key, v)?,
            "enable_alltoall" => self.enable_alltoall = as_bool(key, v)?,
            "force_fp32_communication" => self.force_fp32_communication = as_bool(key, v)?,
            // The index mode of comm_fusion's all-reduce fusion, in MindSpore's older spelling.
            "all_reduce_fusion_config" => self.comm_fusion.allreduce = FusionMode::Index(parse_fusion_indices(key, v)?),
            "pipeline_stages" => self.pipeline_stages = as_int(key, v, 1, 4096)? as usize,
            "pipeline_result_broadcast" => self.pipeline_result_broadcast = as_bool(key, v)?,
            "pipeline_config" => {
                let o = as_object(key, v, &["pipeline_interleave", "pipeline_scheduler"])?;
                let mut c = PipelineConfig::default();
                if let Some(x) = o.get("pipeline_interleave") {
                    c.pipeline_interleave = as_bool("pipeline_config.pipeline_interleave", x)?;
                }
                if let Some(x) = o.get("pipeline_scheduler") {
                    c.pipeline_scheduler = one_of("pipeline_config.pipeline_scheduler", x, &["1f1b", "gpipe"], |s| match s {
                        "1f1b" => Some(PipelineScheduler::OneFOneB),
                        "gpipe" => Some(PipelineScheduler::GPipe),
                        _ => None,
                    })?;
                }
                self.pipeline_config = c;
            }
            "parallel_optimizer_config" => {
                let (c, level_given) = parse_parallel_optimizer_config(v)?;
                if level_given {
                    self.explicit.insert(OPTIMIZER_LEVEL);
                } else {
                    self.explicit.remove(OPTIMIZER_LEVEL);
                }
                self.parallel_optimizer_config = c;
            }
            "comm_fusion" => {
                let mut fusion = parse_comm_fusion(v)?;
                if v.get("allreduce").is_none() && self.is_set("all_reduce_fusion_config") {
                    // all_reduce_fusion_config set it.
                    fusion.allreduce = self.comm_fusion.allreduce.clone();
                }
                self.comm_fusion = fusion;
                for (kind, name) in [
                    ("allreduce", "comm_fusion.allreduce"),
                    ("allgather", "comm_fusion.allgather"),
                    ("reducescatter", "comm_fusion.reducescatter"),
                ] {
                    if v.get(kind).is_some() {
                        self.explicit.insert(name);
                    }
                }
            }
            "strategy_ckpt_config" => {
                let o = as_object(key, v, &["load_file", "save_file", "only_trainable_params"])?;
                let mut c = StrategyCkptConfig::default();
                if let Some(x) = o.get("load_file") {
                    c.load_file = as_str("strategy_ckpt_config.load_file", x)?.to_string();
                }
                if let Some(x) = o.get("save_file") {
                    c.save_file = as_str("strategy_ckpt_config.save_file", x)?.to_string();
                }
                if let Some(x) = o.get("only_trainable_params") {
                    c.only_trainable_params = as_bool("strategy_ckpt_config.only_trainable_params", x)?;
                }
                self.strategy_ckpt_config = c;
            }
            "group_ckpt_save_file" => self.group_ckpt_save_file = as_str(key, v)?.to_string(),
            "device_memory_capacity" => {
                let x = v.as_f64().filter(|x| *x >= 1.0).ok_or_else(|| bad(key, v, "a number of bytes, at least 1"))?;
                self.search.device_memory_capacity = x as u64;
            }
            "costmodel_alpha" | "costmodel_beta" | "costmodel_gamma" => {
                let x = v.as_f64().filter(|x| *x >= 0.0 && x.is_finite()).ok_or_else(|| bad(key, v, "a number >= 0"))?;
                let slot = match key {
                    "costmodel_alpha" => &mut self.search.costmodel_alpha,
                    "costmodel_beta" => &mut self.search.costmodel_beta,
                    _ => &mut self.search.costmodel_gamma,
                };
                *slot = f64Bits::new(x);
            }
            "rp_matmul_mem_coef" => {
                let x = v.as_f64().filter(|x| *x > 0.0 && x.is_finite()).ok_or_else(|| bad(key, v, "a number > 0"))?;
                self.search.rp_matmul_mem_coef = f64Bits::new(x);
            }
            "fully_use_devices" => self.search.fully_use_devices = as_bool(key, v)?,
            "elementwise_op_strategy_follow" => self.search.elementwise_op_strategy_follow = as_bool(key, v)?,
            "tensor_slice_align_enable" => self.search.tensor_slice_align_enable = as_bool(key, v)?,
            "tensor_slice_align_size" => self.search.tensor_slice_align_size = as_int(key, v, 1, 1 << 20)? as usize,
            "op_strategy_config" => {
                let o = as_object(key, v, &["mode", "path"])?;
                let mode = match o.get("mode") {
                    None => OpStrategyMode::Save,
                    Some(m) => one_of("op_strategy_config.mode", m, &["SAVE", "LOAD"], |m| match m {
                        "SAVE" => Some(OpStrategyMode::Save),
                        "LOAD" => Some(OpStrategyMode::Load),
                        _ => None,
                    })?,
                };
                let path = o.get("path").ok_or_else(|| bad(key, v, "a table with a path (the .json file)"))?;
                let path = as_str("op_strategy_config.path", path)?;
                if !path.ends_with(".json") {
                    return Err(bad("op_strategy_config.path", &Value::String(path.into()), "a path ending in .json"));
                }
                self.search.op_strategy = Some(OpStrategyConfig { mode, path: path.to_string() });
            }
            _ => unreachable!("every name of OPTION_NAMES has an arm"),
        }
        self.explicit.insert(key);
        Ok(())
    }

    /// Set an option from command-line text: booleans, integers, names, and JSON for lists and
    /// tables (`--parallel comm_fusion='{"allreduce": {"mode": "size", "config": 32}}'`).
    /// MindSpore's Python forms are read too: tuples (`dataset_strategy=((8, 1), (8,))`),
    /// single-quoted strings, `True`, `False` and `None`.
    pub fn set_str(&mut self, name: &str, text: &str) -> Result<()> {
        let value = serde_json::from_str::<Value>(text)
            .ok()
            .or_else(|| python_literal_as_json(text).and_then(|json| serde_json::from_str::<Value>(&json).ok()))
            .unwrap_or_else(|| Value::String(text.to_string()));
        // An invalid value is named as typed (`1e-400`, not the 0.0 it parses to).
        self.set(name, &value).map_err(|e| match e {
            ParallelError::InvalidOption { option, expected, .. } if value.is_number() => {
                ParallelError::InvalidOption { option, value: text.to_string(), expected }
            }
            e => e,
        })
    }

    /// Apply every key of a `[parallel]` table (already parsed into JSON values), in order.
    pub fn apply_table(&mut self, table: &serde_json::Map<String, Value>) -> Result<()> {
        for (k, v) in table {
            self.set(k, v)?;
        }
        Ok(())
    }

    /// Check the options against each other.
    pub fn validate(&self) -> Result<()> {
        let conflict = |option: &'static str, conflict: Conflict| Err(ParallelError::Conflict { option, conflict });
        let mode = self.parallel_mode;
        let auto_only = |option: &'static str| {
            conflict(option, Conflict::ModeDoesNotSupport { mode, applies_to: "semi_auto_parallel and auto_parallel" })
        };
        if self.global_rank >= self.device_num && (self.is_set("global_rank") || self.is_set("device_num")) {
            return conflict(
                "global_rank",
                Conflict::GlobalRankNotBelowDeviceNum { global_rank: self.global_rank, device_num: self.device_num },
            );
        }
        if mode == ParallelMode::StandAlone && self.gradients_mean {
            return conflict("gradients_mean", Conflict::ModeDoesNotSupport { mode, applies_to: "the parallel modes" });
        }
        if !mode.is_auto() && self.is_set("gradient_fp32_sync") && !self.gradient_fp32_sync {
            return auto_only("gradient_fp32_sync");
        }
        if !mode.is_auto() && self.is_set("loss_repeated_mean") && !self.loss_repeated_mean {
            return auto_only("loss_repeated_mean");
        }
        if !mode.is_auto() && self.strategy_load_file().is_some() {
            return auto_only("strategy_ckpt_load_file");
        }
        if mode != ParallelMode::AutoParallel && self.is_set("search_mode") {
            return conflict("search_mode", Conflict::ModeDoesNotSupport { mode, applies_to: "auto_parallel" });
        }
        if mode != ParallelMode::AutoParallel {
            if let Some(option) = SEARCH_OPTION_NAMES.iter().find(|o| self.is_set(o)) {
                return conflict(option, Conflict::ModeDoesNotSupport { mode, applies_to: "auto_parallel" });
            }
        }
        if self.pipeline_result_broadcast && self.pipeline_stages <= 1 {
            return conflict("pipeline_result_broadcast", Conflict::NeedsPipelineStages);
        }
        if self.pipeline_config.pipeline_interleave && self.pipeline_stages <= 1 {
            return conflict("pipeline_config.pipeline_interleave", Conflict::NeedsPipelineStages);
        }
        if self.is_set("rp_matmul_mem_coef") && mode == ParallelMode::AutoParallel && self.search_mode != SearchMode::RecursiveProgramming {
            return conflict(
                "rp_matmul_mem_coef",
                Conflict::SearchModeDoesNotSupport { search_mode: self.search_mode.name(), applies_to: "recursive_programming" },
            );
        }
        if let Some(op) = &self.search.op_strategy {
            if mode == ParallelMode::AutoParallel && self.search_mode != SearchMode::ShardingPropagation {
                return conflict(
                    "op_strategy_config",
                    Conflict::SearchModeDoesNotSupport { search_mode: self.search_mode.name(), applies_to: "sharding_propagation" },
                );
            }
            if op.mode == OpStrategyMode::Load && self.strategy_load_file().is_some() {
                return conflict("op_strategy_config", Conflict::AlsoSetBy { other: "strategy_ckpt_config.load_file" });
            }
        }
        if self.dataset_strategy != DatasetStrategy::DataParallel && !mode.is_auto() {
            return auto_only(if self.is_set("full_batch") { "full_batch" } else { "dataset_strategy" });
        }
        if self.is_set("all_reduce_fusion_config") && self.is_set("comm_fusion.allreduce") {
            return conflict("all_reduce_fusion_config", Conflict::AlsoSetBy { other: "comm_fusion.allreduce" });
        }
        if self.pipeline_stages > 1 {
            if !mode.is_auto() {
                return auto_only("pipeline_stages");
            }
            if !self.device_num.is_multiple_of(self.pipeline_stages) {
                return conflict(
                    "pipeline_stages",
                    Conflict::StagesDoNotDivide { stages: self.pipeline_stages, device_num: self.device_num },
                );
            }
        }
        if self.enable_parallel_optimizer && mode == ParallelMode::StandAlone {
            return conflict("enable_parallel_optimizer", Conflict::ModeDoesNotSupport { mode, applies_to: "the parallel modes" });
        }
        let size = self.parallel_optimizer_config.optimizer_weight_shard_size;
        let stage_devices = self.device_num / self.pipeline_stages.max(1);
        if size > 0 && size as usize > stage_devices {
            return conflict(
                "parallel_optimizer_config.optimizer_weight_shard_size",
                Conflict::OptimizerShardSizeAboveStage { size, stage_devices },
            );
        }
        Ok(())
    }

    /// Reject options whose behaviour autopar does not implement yet (never ignore them).
    pub fn check_supported(&self) -> Result<()> {
        let unsupported = |option: &str, value: String| Err(ParallelError::NotSupportedYet { option: option.to_string(), value });
        if self.enable_parallel_optimizer && self.parallel_mode == ParallelMode::HybridParallel {
            return unsupported("enable_parallel_optimizer", "true under hybrid_parallel (its graphs are written by hand)".into());
        }
        if let (Some(op), true) = (&self.search.op_strategy, self.pipeline_stages > 1) {
            return unsupported("op_strategy_config", format!("{:?} with pipeline_stages={}", op.path, self.pipeline_stages));
        }
        if !self.group_ckpt_save_file.is_empty() && (self.parallel_mode == ParallelMode::HybridParallel || self.pipeline_stages > 1) {
            return unsupported("group_ckpt_save_file", format!("{:?} under hybrid_parallel or pipelines", self.group_ckpt_save_file));
        }
        Ok(())
    }

    /// The strategy file to write, if any (`strategy_ckpt_config.save_file` or
    /// `strategy_ckpt_save_file`).
    pub fn strategy_save_file(&self) -> Option<&str> {
        Some(self.strategy_ckpt_config.save_file.as_str()).filter(|s| !s.is_empty())
    }

    /// The operator strategy file to read (`op_strategy_config` in mode `LOAD`), if any.
    pub fn op_strategy_load_file(&self) -> Option<&str> {
        self.search.op_strategy.as_ref().filter(|o| o.mode == OpStrategyMode::Load).map(|o| o.path.as_str())
    }

    /// The operator strategy file to write (`op_strategy_config` in mode `SAVE`), if any.
    pub fn op_strategy_save_file(&self) -> Option<&str> {
        self.search.op_strategy.as_ref().filter(|o| o.mode == OpStrategyMode::Save).map(|o| o.path.as_str())
    }

    /// The strategy file to load, if any (`strategy_ckpt_config.load_file` or
    /// `strategy_ckpt_load_file`).
    pub fn strategy_load_file(&self) -> Option<&str> {
        Some(self.strategy_ckpt_config.load_file.as_str()).filter(|s| !s.is_empty())
    }

    /// `global_rank` when it was set explicitly (checked against the communicator's rank).
    pub fn explicit_global_rank(&self) -> Option<usize> {
        self.is_set("global_rank").then_some(self.global_rank)
    }

    /// Devices of one pipeline stage.
    pub fn stage_device_num(&self) -> usize {
        self.device_num / self.pipeline_stages.max(1)
    }
}

fn parse_dataset_strategy(v: &Value) -> Result<DatasetStrategy> {
    let key = "dataset_strategy";
    match v {
        Value::String(s) if s == "data_parallel" => Ok(DatasetStrategy::DataParallel),
        Value::String(s) if s == "full_batch" => Ok(DatasetStrategy::FullBatch),
        Value::Array(inputs) if !inputs.is_empty() => inputs
            .iter()
            .map(|inp| {
                let dims = inp
                    .as_array()
                    .ok_or_else(|| bad(key, v, "\"data_parallel\", \"full_batch\" or one split list per input, e.g. [[8, 1], [8]]"))?;
                dims.iter()
                    .map(|d| match d.as_u64() {
                        Some(x) if (1..=4096).contains(&x) => Ok(x as usize),
                        _ => Err(bad(key, v, "split counts in [1, 4096]")),
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()
            .map(DatasetStrategy::Explicit),
        _ => Err(bad(key, v, "\"data_parallel\", \"full_batch\" or one split list per input, e.g. [[8, 1], [8]]")),
    }
}

fn parse_fusion_indices(option: &str, v: &Value) -> Result<Vec<usize>> {
    let expected = "a strictly increasing list of gradient indices, e.g. [20, 35]";
    let arr = v.as_array().ok_or_else(|| bad(option, v, expected))?;
    let idx = arr.iter().map(|x| x.as_u64().map(|x| x as usize).ok_or_else(|| bad(option, v, expected))).collect::<Result<Vec<_>>>()?;
    if idx.is_empty() || idx.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad(option, v, expected));
    }
    Ok(idx)
}

fn parse_comm_fusion(v: &Value) -> Result<CommFusion> {
    let o = as_object("comm_fusion", v, &["openstate", "allreduce", "allgather", "reducescatter"])?;
    let mut c = CommFusion::default();
    if let Some(x) = o.get("openstate") {
        c.openstate = as_bool("comm_fusion.openstate", x)?;
    }
    for (kind, allow_index) in [("allreduce", true), ("allgather", false), ("reducescatter", false)] {
        let Some(x) = o.get(kind) else { continue };
        let name = format!("comm_fusion.{kind}");
        let t = as_object(&name, x, &["mode", "config"])?;
        let modes: &[&str] = if allow_index { &["auto", "size", "index"] } else { &["auto", "size"] };
        let mode =
            t.get("mode").and_then(Value::as_str).filter(|m| modes.contains(m)).ok_or_else(|| {
                bad(&format!("{name}.mode"), t.get("mode").unwrap_or(&Value::Null), format!("one of {}", modes.join(", ")))
            })?;
        let config = t.get("config").unwrap_or(&Value::Null);
        let m = match mode {
            "auto" => FusionMode::Auto,
            "size" => match config.as_f64() {
                Some(mb) if mb > 0.0 => FusionMode::Size(f64Bits::new(mb)),
                _ => return Err(bad(&format!("{name}.config"), config, "a size in MB above 0")),
            },
            _ => FusionMode::Index(parse_fusion_indices(&format!("{name}.config"), config)?),
        };
        match kind {
            "allreduce" => c.allreduce = m,
            "allgather" => c.allgather = m,
            _ => c.reducescatter = m,
        }
    }
    Ok(c)
}

/// A Python literal of tuples, lists, dicts, numbers, strings and `True`/`False`/`None` as
/// JSON text: tuples become lists (a trailing comma dropped), single-quoted strings
/// double-quoted. None when `text` is neither a container, a single-quoted string nor one of
/// those three names.
fn python_literal_as_json(text: &str) -> Option<String> {
    let text = text.trim();
    match text {
        "True" => return Some("true".into()),
        "False" => return Some("false".into()),
        "None" => return Some("null".into()),
        _ if !text.starts_with(['(', '[', '{', '\'']) => return None,
        _ => {}
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                out.push('"');
                while let Some(d) = chars.next() {
                    match d {
                        // Python's `\'` is JSON's `'`; every other escape is JSON's too.
                        '\\' => match chars.next()? {
                            '\'' => out.push('\''),
                            e => {
                                out.push('\\');
                                out.push(e);
                            }
                        },
                        '"' if c == '\'' => out.push_str("\\\""),
                        d if d == c => break,
                        d => out.push(d),
                    }
                }
                out.push('"');
            }
            '(' => out.push('['),
            ')' | ']' | '}' => {
                // Python allows a trailing comma, `(8,)`; JSON does not.
                let trimmed = out.trim_end().len();
                if out[..trimmed].ends_with(',') {
                    out.truncate(trimmed - 1);
                }
                out.push(if c == ')' { ']' } else { c });
            }
            // An exponent: `1e-3`.
            'e' | 'E' if out.ends_with(|d: char| d.is_ascii_digit() || d == '.') => out.push(c),
            c if c.is_ascii_alphabetic() => {
                let mut word = String::from(c);
                while let Some(&d) = chars.peek().filter(|d| d.is_ascii_alphanumeric() || **d == '_') {
                    word.push(d);
                    chars.next();
                }
                out.push_str(match word.as_str() {
                    "True" => "true",
                    "False" => "false",
                    "None" => "null",
                    _ => return None,
                });
            }
            c => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn python_literals_read_as_json() {
        let cases = [
            ("((8, 1), (8,))", "[[8, 1], [8]]"),
            ("[(2, 4), (4,)]", "[[2, 4], [4]]"),
            ("{'allreduce': {'mode': 'size', 'config': 32}}", r#"{"allreduce": {"mode": "size", "config": 32}}"#),
            ("(True, False, None, 1e-3)", "[true, false, null, 1e-3]"),
            ("('it\"s',)", r#"["it\"s"]"#),
            ("'it\\'s'", r#""it's""#),
            ("True", "true"),
            ("None", "null"),
            ("'semi_auto_parallel'", r#""semi_auto_parallel""#),
        ];
        for (python, json) in cases {
            assert_eq!(super::python_literal_as_json(python).as_deref(), Some(json), "{python}");
        }
        for not_python in ["data_parallel", "(8, x)", "8"] {
            assert_eq!(super::python_literal_as_json(not_python), None, "{not_python}");
        }
        // MindSpore's tuple form of a dataset strategy sets what the JSON form sets.
        let (mut tuples, mut lists) = (super::ParallelContext::default(), super::ParallelContext::default());
        tuples.set_str("dataset_strategy", "((8, 1), (8,))").unwrap();
        lists.set_str("dataset_strategy", "[[8, 1], [8]]").unwrap();
        assert_eq!(tuples.dataset_strategy, lists.dataset_strategy);
        assert!(matches!(tuples.dataset_strategy, super::DatasetStrategy::Explicit(_)), "{:?}", tuples.dataset_strategy);
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_mindsporess_reset_values() {
        let c = ParallelContext::default();
        assert_eq!((c.device_num, c.global_rank, c.parallel_mode), (1, 0, ParallelMode::StandAlone));
        assert!(c.gradient_fp32_sync && c.loss_repeated_mean && !c.gradients_mean);
        assert_eq!(c.parallel_optimizer_config.parallel_optimizer_threshold, 64);
        assert_eq!(c.parallel_optimizer_config.optimizer_weight_shard_size, -1);
        assert!(c.strategy_ckpt_config.only_trainable_params);
        c.validate().unwrap();
        c.check_supported().unwrap();
    }

    #[test]
    fn every_option_name_is_settable() {
        let values = [
            ("device_num", json!(8)),
            ("global_rank", json!(3)),
            ("gradients_mean", json!(true)),
            ("gradient_fp32_sync", json!(true)),
            ("loss_repeated_mean", json!(false)),
            ("parallel_mode", json!("semi_auto_parallel")),
            ("search_mode", json!("sharding_propagation")),
            ("auto_parallel_search_mode", json!("dynamic_programming")),
            ("parameter_broadcast", json!(true)),
            ("strategy_ckpt_load_file", json!("a.ckpt")),
            ("strategy_ckpt_save_file", json!("b.json")),
            ("full_batch", json!(true)),
            ("dataset_strategy", json!([[8, 1], [8]])),
            ("enable_parallel_optimizer", json!(true)),
            ("enable_alltoall", json!(true)),
            ("force_fp32_communication", json!(true)),
            ("all_reduce_fusion_config", json!([2, 5])),
            ("pipeline_stages", json!(2)),
            ("pipeline_result_broadcast", json!(true)),
            ("pipeline_config", json!({"pipeline_interleave": true, "pipeline_scheduler": "gpipe"})),
            ("parallel_optimizer_config", json!({"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": 2})),
            ("comm_fusion", json!({"openstate": false, "allreduce": {"mode": "size", "config": 32}, "allgather": {"mode": "auto"}})),
            ("strategy_ckpt_config", json!({"save_file": "s.ckpt", "only_trainable_params": false})),
            ("group_ckpt_save_file", json!("g.pb")),
            ("device_memory_capacity", json!(1u64 << 30)),
            ("costmodel_alpha", json!(2.0)),
            ("costmodel_beta", json!(0.5)),
            ("costmodel_gamma", json!(0.001)),
            ("fully_use_devices", json!(true)),
            ("elementwise_op_strategy_follow", json!(true)),
            ("tensor_slice_align_enable", json!(true)),
            ("tensor_slice_align_size", json!(32)),
            ("op_strategy_config", json!({"mode": "LOAD", "path": "/tmp/ops.json"})),
            ("rp_matmul_mem_coef", json!(1024)),
        ];
        assert_eq!(values.len(), OPTION_NAMES.len());
        assert_eq!(SEARCH_OPTION_NAMES.first(), Some(&"device_memory_capacity"));
        assert_eq!(SEARCH_OPTION_NAMES.len(), 10);
        let mut c = ParallelContext::default();
        for (k, v) in &values {
            c.set(k, v).unwrap_or_else(|e| panic!("{k}: {e}"));
        }
        assert_eq!(c.dataset_strategy, DatasetStrategy::Explicit(vec![vec![8, 1], vec![8]]));
        assert_eq!(c.comm_fusion.allreduce, FusionMode::Size(f64Bits::new(32.0)));
        assert_eq!(c.pipeline_config.pipeline_scheduler, PipelineScheduler::GPipe);
        assert_eq!(c.strategy_ckpt_config.save_file, "s.ckpt");
        assert_eq!((c.search.device_memory_capacity, c.search.costmodel_gamma.get()), (1 << 30, 0.001));
        assert!(c.search.fully_use_devices && c.search.elementwise_op_strategy_follow && c.search.tensor_slice_align_size == 32);
        assert_eq!(c.search.rp_matmul_mem_coef.get(), 1024.0);
        c.reset();
        assert_eq!(c, ParallelContext::default());
    }

    #[test]
    fn unknown_option_names_it_and_lists_the_valid_ones() {
        let mut c = ParallelContext::default();
        let e = c.set("device_nums", &json!(8)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ParallelError::UnknownOption { .. }));
        assert!(msg.contains("device_nums") && msg.contains("device_num,") && msg.contains("comm_fusion"), "{msg}");
        let e = c.set("pipeline_config", &json!({"scheduler": "1f1b"})).unwrap_err();
        assert!(e.to_string().contains("pipeline_config.scheduler"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_errors() {
        let mut c = ParallelContext::default();
        for (k, v) in [
            ("device_num", json!(0)),
            ("device_num", json!(4097)),
            ("global_rank", json!(4096)),
            ("global_rank", json!(-1)),
            ("parallel_mode", json!("model_parallel")),
            ("search_mode", json!("greedy")),
            ("gradients_mean", json!("yes")),
            ("pipeline_stages", json!(0)),
            ("all_reduce_fusion_config", json!([5, 2])),
            ("dataset_strategy", json!("half_batch")),
            ("parallel_optimizer_config", json!({"optimizer_weight_shard_size": 0})),
            ("parallel_optimizer_config", json!({"parallel_optimizer_threshold": -1})),
            ("parallel_optimizer_config", json!({"optimizer_level": "level4"})),
            ("parallel_optimizer_config", json!({"optimizer_level": "level2", "gradient_accumulation_shard": false})),
            ("parallel_optimizer_config", json!({"optimizer_level": 3})),
            ("comm_fusion", json!({"allgather": {"mode": "index", "config": [1]}})),
            ("comm_fusion", json!({"allreduce": {"mode": "size", "config": 0}})),
        ] {
            let e = c.set(k, &v).unwrap_err();
            assert!(matches!(e, ParallelError::InvalidOption { .. }), "{k}={v}: {e}");
            assert!(e.to_string().contains(k), "{e}");
        }
        assert_eq!(c, ParallelContext::default());
        // Command-line text is named as typed, not as the number it parsed to.
        let e = c.set_str("rp_matmul_mem_coef", "1e-400").unwrap_err();
        assert!(e.to_string().contains("invalid value 1e-400 "), "{e}");
    }

    #[test]
    fn options_are_checked_against_each_other() {
        let conflict = |pairs: &[(&str, Value)]| {
            let mut c = ParallelContext::default();
            for (k, v) in pairs {
                c.set(k, v).unwrap();
            }
            c.validate().unwrap_err()
        };
        let e = conflict(&[("device_num", json!(4)), ("global_rank", json!(4)), ("parallel_mode", json!("data_parallel"))]);
        assert!(e.to_string().contains("global_rank 4 is not below device_num 4"), "{e}");
        let e = conflict(&[("gradients_mean", json!(true))]);
        assert!(e.to_string().contains("gradients_mean") && e.to_string().contains("stand_alone does not support it"), "{e}");
        let e = conflict(&[
            ("device_num", json!(8)),
            ("parallel_mode", json!("semi_auto_parallel")),
            ("search_mode", json!("dynamic_programming")),
        ]);
        assert!(e.to_string().contains("search_mode") && e.to_string().contains("applies to auto_parallel"), "{e}");
        let e = conflict(&[("device_num", json!(8)), ("parallel_mode", json!("semi_auto_parallel")), ("pipeline_stages", json!(3))]);
        assert!(e.to_string().contains("3 stages do not divide device_num 8"), "{e}");
        let e = conflict(&[("device_num", json!(8)), ("parallel_mode", json!("data_parallel")), ("dataset_strategy", json!([[8, 1]]))]);
        assert!(e.to_string().contains("dataset_strategy"), "{e}");
        let e = conflict(&[("device_num", json!(8)), ("parallel_mode", json!("data_parallel")), ("gradient_fp32_sync", json!(false))]);
        assert!(e.to_string().contains("gradient_fp32_sync") && e.to_string().contains("data_parallel does not support it"), "{e}");
        let e =
            conflict(&[("device_num", json!(8)), ("parallel_mode", json!("data_parallel")), ("strategy_ckpt_load_file", json!("s.ckpt"))]);
        assert!(e.to_string().contains("strategy_ckpt_load_file") && e.to_string().contains("data_parallel does not support it"), "{e}");
        let e = conflict(&[("device_num", json!(8)), ("parallel_mode", json!("data_parallel")), ("loss_repeated_mean", json!(false))]);
        assert!(e.to_string().contains("loss_repeated_mean") && e.to_string().contains("data_parallel does not support it"), "{e}");
        for mode in ["data_parallel", "hybrid_parallel"] {
            let e = conflict(&[("device_num", json!(8)), ("parallel_mode", json!(mode)), ("full_batch", json!(true))]);
            assert!(e.to_string().contains("full_batch") && e.to_string().contains(&format!("{mode} does not support it")), "{e}");
        }
        // all_reduce_fusion_config is comm_fusion's all-reduce index mode: one of them, in either order.
        let both = [("all_reduce_fusion_config", json!([2])), ("comm_fusion", json!({"allreduce": {"mode": "auto"}}))];
        for pairs in [both.clone(), [both[1].clone(), both[0].clone()]] {
            let e = conflict(&pairs);
            assert!(
                e.to_string().contains("all_reduce_fusion_config") && e.to_string().contains("comm_fusion.allreduce sets the same"),
                "{e}"
            );
        }
    }

    #[test]
    fn all_reduce_fusion_config_survives_a_comm_fusion_without_allreduce() {
        let mut c = ParallelContext::default();
        c.set("all_reduce_fusion_config", &json!([2, 5])).unwrap();
        c.set("comm_fusion", &json!({"openstate": true})).unwrap();
        assert_eq!(c.comm_fusion.allreduce, FusionMode::Index(vec![2, 5]));
        c.validate().unwrap();
        // A comm_fusion replaces an earlier one whole.
        let mut c = ParallelContext::default();
        c.set("comm_fusion", &json!({"allreduce": {"mode": "size", "config": 8}})).unwrap();
        c.set("comm_fusion", &json!({"openstate": true})).unwrap();
        assert_eq!(c.comm_fusion.allreduce, FusionMode::Auto);
    }

    #[test]
    fn unimplemented_behaviour_is_rejected_not_ignored() {
        let opt = ("enable_parallel_optimizer", json!(true));
        for (settings, mode) in [
            (vec![opt.clone()], "hybrid_parallel"),
            (vec![("group_ckpt_save_file", json!("groups.pb"))], "hybrid_parallel"),
            (
                vec![
                    ("pipeline_stages", json!(2)),
                    ("search_mode", json!("sharding_propagation")),
                    ("op_strategy_config", json!({"path": "ops.json"})),
                ],
                "auto_parallel",
            ),
        ] {
            let mut c = ParallelContext::default();
            c.set("device_num", &json!(8)).unwrap();
            c.set("parallel_mode", &json!(mode)).unwrap();
            for (k, v) in &settings {
                c.set(k, v).unwrap();
            }
            c.validate().unwrap();
            let e = c.check_supported().unwrap_err();
            assert!(matches!(e, ParallelError::NotSupportedYet { .. }), "{e}");
            assert!(e.to_string().contains("not supported yet"), "{e}");
        }
        // The parallel optimizer and its fusion options are accepted where they are built.
        let mut c = ParallelContext::default();
        c.set("device_num", &json!(8)).unwrap();
        c.set("parallel_mode", &json!("data_parallel")).unwrap();
        c.set("enable_parallel_optimizer", &json!(true)).unwrap();
        c.set("comm_fusion", &json!({"reducescatter": {"mode": "size", "config": 4}})).unwrap();
        c.set("group_ckpt_save_file", &json!("groups.pb")).unwrap();
        c.validate().unwrap();
        c.check_supported().unwrap();
        // ... and inside pipelines.
        c.set("group_ckpt_save_file", &json!("")).unwrap();
        c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
        c.set("pipeline_stages", &json!(2)).unwrap();
        c.validate().unwrap();
        c.check_supported().unwrap();
        // pipeline_result_broadcast applies to pipelines alone.
        c.set("pipeline_result_broadcast", &json!(true)).unwrap();
        c.validate().unwrap();
        c.set("pipeline_stages", &json!(1)).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("pipeline_result_broadcast") && e.contains("pipeline_stages"), "{e}");
        c.set("pipeline_result_broadcast", &json!(false)).unwrap();
        c.set("pipeline_config", &json!({"pipeline_interleave": true})).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("pipeline_interleave") && e.contains("pipeline_stages"), "{e}");
    }

    #[test]
    fn search_options_apply_to_auto_parallel_alone() {
        let mut c = ParallelContext::default();
        c.set("device_num", &json!(8)).unwrap();
        c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
        c.set("costmodel_beta", &json!(2.0)).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("costmodel_beta") && e.contains("applies to auto_parallel"), "{e}");
        c.set("parallel_mode", &json!("auto_parallel")).unwrap();
        c.validate().unwrap();
        c.check_supported().unwrap();
        for (k, v) in [
            ("costmodel_alpha", json!(-1.0)),
            ("device_memory_capacity", json!(0)),
            ("tensor_slice_align_size", json!(0)),
            ("rp_matmul_mem_coef", json!(0)),
        ] {
            let e = c.set(k, &v).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
        // recursive_programming's own knob is refused under the other searches.
        c.set("rp_matmul_mem_coef", &json!(1024)).unwrap();
        c.validate().unwrap();
        c.set("search_mode", &json!("dynamic_programming")).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("rp_matmul_mem_coef") && e.contains("recursive_programming"), "{e}");
    }

    #[test]
    fn command_line_text_is_parsed_as_json_or_a_name() {
        let mut c = ParallelContext::default();
        c.set_str("parallel_mode", "data_parallel").unwrap();
        c.set_str("device_num", "4").unwrap();
        c.set_str("gradients_mean", "true").unwrap();
        c.set_str("comm_fusion", r#"{"allreduce": {"mode": "index", "config": [3]}}"#).unwrap();
        assert_eq!(c.comm_fusion.allreduce, FusionMode::Index(vec![3]));
        c.validate().unwrap();
    }
}
