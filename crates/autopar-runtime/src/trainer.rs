//! The trainer: epochs or steps of a network over a dataset, on one device or `device_num`
//! ranks, with callbacks (loss monitor, metrics), per-rank checkpoints, resume, `--init` and
//! evaluation.
//!
//! Every run is a parallel run: `device_num` ranks run as threads over [`LocalComm`], or, in a
//! build with the `mpi` feature started by `mpirun`, one rank per process over `MpiComm` (one rank
//! for stand_alone), each running its rank of the [`Job`]: the same training step in
//! every mode. The network is built for the global batch; each rank reads only the rows of
//! every global batch its inputs' layouts give it (under the dataset strategy `data_parallel`
//! its part of the batch, under `full_batch` all of it) and cuts its slices from them. The data
//! loader derives every batch from `(seed, epoch, index)`, so a resumed run reads exactly the
//! batches the uninterrupted run would have read, and the step counter (the key of the dropout
//! masks) resumes too. Logs, metrics and callbacks run on rank 0; checkpoints are written by
//! every rank (its local slices and optimizer state).
//!
//! A run resumes on any device count, mode and strategy: when its layouts differ from the
//! checkpoint's, the per-rank files are merged to full tensors (parameters and optimizer state,
//! through `strategy.json` beside them) and every rank cuts its slices from those; step, data
//! position and learning-rate schedule continue as in the uninterrupted run.

pub mod callbacks;
mod ckpt;
pub use ckpt::PieceSource;
mod error;
mod evaluate;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use autopar_checkpoint::StrategyFile;
use autopar_comm::{Communicator, LocalComm};
use autopar_data::{Batch, DataLoader, Dataset, LoaderConfig, ShardPadding, Transforms};
use autopar_graph::{Graph, NodeId, OpKind, RecomputeChoice};
use autopar_parallel::{ParallelContext, ParallelMode};
use autopar_tensor::{DType, Tensor};

use self::callbacks::{Callback, StepEvent};
pub use self::ckpt::{checkpoint_path, list_checkpoints, rank_file, save_checkpoint, step_of, DataStream, Loaded, RunPosition, FORMAT};
pub use self::error::{TrainError, TrainResult};
pub use self::evaluate::predicted_class;
use crate::error::{CommPhase, RuntimeError};
use crate::executor::{tensor_dtype, ParamStore, SharedInit};
use crate::job::Job;
use crate::loss_scale::LossScale;
use crate::optim::{decay_except_norm, AdamW, LrSchedule, Momentum, Optimizer, Sgd};
use crate::rank::{ParamSource, RankTrainer};

/// A network as the trainer sees it: a forward graph with its input, labels, logits (`[N, C]`)
/// and scalar loss.
#[derive(Clone, Debug)]
pub struct Network {
    /// The forward graph.
    pub graph: Graph,
    /// The input node (the data's samples).
    pub x: NodeId,
    /// The labels node.
    pub labels: NodeId,
    /// The logits node, `[N, C]`.
    pub logits: NodeId,
    /// The scalar loss node.
    pub loss: NodeId,
}

/// Why a network could not be built (the model crate's error, boxed).
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// Builds the network for a batch size, for training (`true`) or evaluation (`false`). Train and
/// evaluation graphs must name their parameters alike.
pub type BuildNetwork = Arc<dyn Fn(usize, bool) -> Result<Network, BuildError> + Send + Sync>;

/// A dataset and the transforms its samples go through.
#[derive(Clone, Debug)]
pub struct DataSource {
    /// The samples.
    pub dataset: Arc<dyn Dataset>,
    /// The transforms applied to every sample.
    pub transforms: Transforms,
}

impl DataSource {
    /// `dataset` as it is, without transforms.
    pub fn new(dataset: impl Dataset + 'static) -> Self {
        Self { dataset: Arc::new(dataset), transforms: Transforms::new() }
    }
}

/// The update rule.
#[derive(Clone, Debug, PartialEq)]
pub enum OptimizerKind {
    /// Stochastic gradient descent ([`Sgd`]).
    Sgd,
    /// MindSpore's Momentum ([`Momentum`]).
    Momentum {
        /// The momentum coefficient.
        momentum: f64,
        /// Whether the update uses Nesterov momentum.
        nesterov: bool,
    },
    /// Adam with decoupled weight decay ([`AdamW`]).
    AdamW {
        /// Decay rate of the first moment.
        beta1: f64,
        /// Decay rate of the second moment.
        beta2: f64,
        /// Term added to the denominator for numerical stability.
        eps: f64,
    },
}

impl OptimizerKind {
    /// The optimizer by its name (`sgd`, `momentum`, `adamw` or `adam`, any case) with the
    /// default hyper-parameters and the given momentum.
    pub fn by_name(name: &str, momentum: f64) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sgd" => Some(OptimizerKind::Sgd),
            "momentum" => Some(OptimizerKind::Momentum { momentum, nesterov: false }),
            "adamw" | "adam" => Some(OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8 }),
            _ => None,
        }
    }

    /// The names [`OptimizerKind::by_name`] takes.
    pub const NAMES: &'static str = "sgd, momentum, adamw";

    /// The name [`OptimizerKind::by_name`] takes for it.
    pub fn name(&self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum { .. } => "momentum",
            OptimizerKind::AdamW { .. } => "adamw",
        }
    }

    /// State tensors per trainable parameter (Momentum 1, Adam 2).
    pub fn state_slots(&self) -> usize {
        self.state_prefixes().len()
    }

    /// The prefixes of the state tensors' names (`moments.` + the parameter's name, ...).
    pub fn state_prefixes(&self) -> &'static [&'static str] {
        match self {
            OptimizerKind::Sgd => crate::optim::Sgd::STATE,
            OptimizerKind::Momentum { .. } => crate::optim::Momentum::STATE,
            OptimizerKind::AdamW { .. } => crate::optim::AdamW::STATE,
        }
    }
}

/// Optimizer, learning-rate schedule and weight decay.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerConfig {
    /// The update rule and its hyperparameters.
    pub kind: OptimizerKind,
    /// The learning rate by step.
    pub schedule: LrSchedule,
    /// Weight decay (0: none).
    pub weight_decay: f64,
    /// Leave normalisation parameters (`gamma`, `beta`) out of weight decay.
    pub decay_except_norm: bool,
    /// Clip the gradients of every step to this global norm, over the whole job's gradients
    /// (MindSpore's `ClipByGlobalNorm`; None: no clipping).
    pub clip_grad_norm: Option<f64>,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            kind: OptimizerKind::Momentum { momentum: 0.9, nesterov: false },
            schedule: LrSchedule::Constant(0.01),
            weight_decay: 0.0,
            decay_except_norm: false,
            clip_grad_norm: None,
        }
    }
}

impl OptimizerConfig {
    /// A fresh optimizer.
    pub fn build(&self) -> TrainResult<Box<dyn Optimizer>> {
        if let Some(m) = self.clip_grad_norm {
            crate::optim::check_max_norm(m)?;
        }
        let filter = if self.decay_except_norm { Some(decay_except_norm as fn(&str) -> bool) } else { None };
        let s = self.schedule.clone();
        Ok(match self.kind {
            OptimizerKind::Sgd => Box::new(Sgd::new(s)?.with_weight_decay(self.weight_decay, filter)?),
            OptimizerKind::Momentum { momentum, nesterov } => {
                Box::new(Momentum::new(s, momentum)?.with_nesterov(nesterov).with_weight_decay(self.weight_decay, filter)?)
            }
            OptimizerKind::AdamW { beta1, beta2, eps } => {
                Box::new(AdamW::new(s)?.with_betas(beta1, beta2)?.with_eps(eps)?.with_weight_decay(self.weight_decay, filter)?)
            }
        })
    }

    /// The names of the optimizer state of parameter `name`.
    pub fn state_keys(&self, name: &str) -> Vec<String> {
        self.kind.state_prefixes().iter().map(|p| format!("{p}{name}")).collect()
    }
}

/// The checkpoint callback's settings (MindSpore's `CheckpointConfig` + `ModelCheckpoint`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The folder checkpoints are written to (per-rank files under `rank_<k>/`).
    pub dir: PathBuf,
    /// The start of every checkpoint's file name (`<prefix>-<step>.safetensors`).
    pub prefix: String,
    /// Save every this many steps (0: only at the end).
    pub every_steps: u64,
    /// Keep at most this many checkpoints per rank, deleting the oldest (0: keep all).
    pub keep_max: usize,
}

impl CheckpointConfig {
    /// Refuses, before anything is written, a folder that cannot be made: the folder, or the
    /// nearest of its parents that exists, is a file.
    pub fn check_folder(&self) -> TrainResult<()> {
        let mut at = Some(self.dir.as_path());
        while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
            if p.exists() {
                return if p.is_dir() { Ok(()) } else { Err(TrainError::NotAFolder { path: self.dir.clone(), file: p.to_path_buf() }) };
            }
            at = p.parent();
        }
        Ok(())
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self { dir: PathBuf::from("checkpoints"), prefix: "autopar".into(), every_steps: 0, keep_max: 5 }
    }
}

/// Everything about a training run except the network and the data.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// Epochs to run (with `max_steps`, whichever ends first).
    pub epochs: u64,
    /// Total steps (counted from step 0 of the run, a resumed run included).
    pub max_steps: Option<u64>,
    /// Global batch size.
    pub batch_size: usize,
    /// Micro-batches per step: each global batch is cut into this many equal parts whose
    /// gradients are accumulated into one update. In a pipeline (`pipeline_stages` > 1,
    /// MindSpore's `PipelineCell` micro_size) they flow through the stages in the order of
    /// `pipeline_config.pipeline_scheduler`; otherwise they run one after the other (gradient
    /// accumulation: the same update as the whole batch, but for BatchNorm's statistics).
    /// None: one per pipeline stage, 1 without ([`autopar_parallel::default_micro_batches`]).
    pub micro_batches: Option<usize>,
    /// Where a pipeline's stages begin (`--pipeline-split`): the first op of each stage after
    /// the first, in network order (with `pipeline_interleave`, of each piece: `chunks * P - 1`
    /// ops). Empty: the model's `set_pipeline_stage`, else stages of about equal FLOPs cut
    /// between blocks.
    pub pipeline_split: Vec<String>,
    /// What the backward pass recomputes instead of keeping (`--recompute`).
    pub recompute: RecomputeChoice,
    /// Seed of the data shuffle and the random augmentations.
    pub seed: u64,
    /// Whether the data is shuffled every epoch.
    pub shuffle: bool,
    /// Batches prepared ahead per rank (0: none).
    pub prefetch: usize,
    /// Optimizer, learning-rate schedule and weight decay.
    pub optimizer: OptimizerConfig,
    /// Which ops compute in half precision (MindSpore's `amp_level`,
    /// [`autopar_graph::precision`]): the casts inserted when the job is assembled, the
    /// parameters and their gradients kept in float32.
    pub precision: autopar_graph::Precision,
    /// Loss scaling ([`crate::loss_scale`]; MindSpore's loss-scale managers): the scale, the
    /// overflowed steps skipped on every rank, the scale saved in checkpoints.
    pub loss_scale: LossScale,
    /// The parallel settings (MindSpore's `set_auto_parallel_context`).
    pub parallel: ParallelContext,
    /// Checkpoints (None: none).
    pub checkpoint: Option<CheckpointConfig>,
    /// Load parameters from this checkpoint before training: one file, or a folder of per-rank
    /// checkpoints (`rank_<k>/*`) saved under `init_strategy` (any strategy and device count;
    /// resharded at load, MindSpore's `load_distributed_checkpoint`).
    pub init: Option<PathBuf>,
    /// The strategy file the per-rank `init` checkpoints were saved under (None: one unsplit
    /// checkpoint in `rank_0`).
    pub init_strategy: Option<PathBuf>,
    /// Resume from this checkpoint (a parallel run: rank 0's file; the others are found beside it).
    pub resume: Option<PathBuf>,
    /// Batch size of evaluation.
    pub eval_batch_size: usize,
    /// Under mpirun, send the full parameters to rank 0 at the end of the run (one copy of each
    /// distinct piece), for [`TrainReport::params`] there; otherwise every process keeps its own
    /// pieces only. (In process the report assembles them when asked.)
    pub gather_params: bool,
    /// The device profile of auto_parallel's cost model (None: the built-in one).
    pub profile: Option<autopar_parallel::DeviceProfile>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 1,
            max_steps: None,
            batch_size: 32,
            micro_batches: None,
            pipeline_split: Vec::new(),
            recompute: RecomputeChoice::AsBuilt,
            seed: 1,
            shuffle: true,
            prefetch: 2,
            optimizer: OptimizerConfig::default(),
            loss_scale: LossScale::None,
            precision: autopar_graph::Precision::default(),
            parallel: ParallelContext::default(),
            checkpoint: None,
            init: None,
            init_strategy: None,
            resume: None,
            eval_batch_size: 256,
            gather_params: false,
            profile: None,
        }
    }
}

/// Accuracy and mean loss over an evaluation set.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalResult {
    /// The fraction of predictions whose largest logit is the label's class (0 to 1).
    pub accuracy: f64,
    /// Mean loss per sample.
    pub loss: f64,
    /// Predictions scored (samples, or token positions for a language model).
    pub predictions: usize,
    /// Samples evaluated.
    pub samples: usize,
    /// Of an evaluated checkpoint: the frozen parameters it lacks, made from their
    /// initialisers (the network's own values, as `--init` keeps them); empty otherwise.
    pub made_from_init: Vec<String>,
}

/// What a run did.
#[derive(Debug)]
pub struct TrainReport {
    /// The step the run started from (0, or the resumed checkpoint's step).
    pub first_step: u64,
    /// The step it ended at.
    pub last_step: u64,
    /// Steps in one epoch.
    pub steps_per_epoch: u64,
    /// Loss of every step run (global; rank 0's view). Under `mpirun`, processes other than
    /// rank 0 keep no loss history: this is empty there.
    pub losses: Vec<f64>,
    /// Wall time of rank 0's training loop, in seconds.
    pub wall_secs: f64,
    /// Seconds before rank 0's first step: planning, building the rank programs, initialising
    /// or loading the parameters.
    pub setup_secs: f64,
    /// The plan's memory of a step, in bytes, summed over the ranks this process runs (every
    /// rank in process; its own under mpirun): parameters, gradients, optimizer state, peak
    /// activations and communication buffers.
    pub plan_memory: u64,
    /// Global samples per second over the run.
    pub samples_per_sec: f64,
    /// The final pieces each rank of this process stores, by global rank (every rank in
    /// process; its own under mpirun): [`TrainReport::params`] puts them together.
    pub pieces: Vec<(usize, ParamStore)>,
    /// Under mpirun with [`TrainConfig::gather_params`], the full parameters (rank 0).
    gathered: Option<ParamStore>,
    /// The job, to put the pieces together.
    job: Job,
    /// The evaluation after training ([`Trainer::with_eval`]; None: none was asked for, or the
    /// run trained no step).
    pub eval: Option<EvalResult>,
    /// Checkpoint files rank 0 wrote (the others wrote theirs beside).
    pub checkpoints: Vec<PathBuf>,
    /// The strategy file written beside the checkpoints (None: none was written).
    pub strategy_file: Option<PathBuf>,
    /// Ranks of the job.
    pub device_num: usize,
    /// The run's parallel mode.
    pub mode: ParallelMode,
    /// Entries of the `init` checkpoint that are not parameters of this network (optimizer
    /// state, counters), which were not loaded.
    pub init_ignored: Vec<String>,
    /// Frozen parameters of the network (constants it builds, such as an attention mask) the
    /// `init` checkpoint lacks, which kept their initial values.
    pub init_kept: Vec<String>,
    /// The names of the trainable parameters among `params` (the others are frozen).
    pub trainable: Vec<String>,
    /// Under mpirun, each rank's process's peak resident set (`VmHWM`) since it started, in
    /// bytes, by rank, taken at the end of training, before evaluation (None where `/proc`
    /// does not exist); empty in process, where the ranks share one process.
    pub peak_rss_by_rank: Vec<Option<u64>>,
}

impl TrainReport {
    /// The job the run trained (its plan: [`Job::plan`]).
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The final parameters, whole: assembled from the pieces of every rank in process (one
    /// full copy, made now), or, under mpirun, those sent to rank 0 when
    /// [`TrainConfig::gather_params`] asked for them.
    pub fn params(&self) -> TrainResult<ParamStore> {
        if let Some(full) = &self.gathered {
            return Ok(full.clone());
        }
        if self.pieces.len() != self.device_num {
            let ranks: Vec<usize> = self.pieces.iter().map(|(r, _)| *r).collect();
            return Err(TrainError::Config {
                option: "gather_params",
                value: format!("the report of rank(s) {ranks:?}"),
                expected: format!(
                    "rank 0's report of a run with `gather_params` set: this process holds the pieces of {} of the {} ranks",
                    self.pieces.len(),
                    self.device_num
                ),
                hint: "set `gather_params` before the run and read rank 0's report, or read the run's checkpoints".into(),
            });
        }
        let stores: Vec<&ParamStore> = self.pieces.iter().map(|(_, s)| s).collect();
        Ok(crate::assemble::assemble_refs(&self.job, &stores)?)
    }
}

/// The names of `graph`'s trainable parameters (`trainable`), or of its frozen ones.
fn parameter_names(graph: &Graph, trainable: bool) -> Vec<String> {
    graph.nodes().iter().filter(|nd| matches!(&nd.op, OpKind::Parameter(p) if p.trainable == trainable)).map(|nd| nd.name.clone()).collect()
}

/// The names and full shapes of `graph`'s parameters: the trainable ones, the frozen ones, or
/// (None) all, in graph order.
fn parameter_shapes(graph: &Graph, trainable: Option<bool>) -> Vec<(String, Vec<usize>)> {
    graph
        .nodes()
        .iter()
        .filter_map(|nd| match &nd.op {
            OpKind::Parameter(p) if trainable.is_none_or(|t| t == p.trainable) => Some((nd.name.clone(), p.shape.clone())),
            _ => None,
        })
        .collect()
}

/// Trains one network on one dataset.
#[derive(Clone)]
pub struct Trainer {
    name: String,
    build: BuildNetwork,
    train: DataSource,
    cfg: TrainConfig,
    /// Ranks as threads of this process even when started by mpirun.
    in_process: bool,
    /// Evaluated after training, by the ranks on their own pieces.
    eval: Option<DataSource>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer").field("name", &self.name).field("train", &self.train).field("cfg", &self.cfg).finish()
    }
}

/// Names, shapes and dtypes of the network's input and labels.
#[derive(Clone, Debug)]
struct Io {
    x_name: String,
    y_name: String,
    x_shape: Vec<usize>,
    y_shape: Vec<usize>,
    x_dtype: DType,
    y_dtype: DType,
}

impl Io {
    fn of(graph: &Graph, net: &Network) -> Self {
        let (xn, yn) = (graph.node(net.x), graph.node(net.labels));
        Io {
            x_name: xn.name.clone(),
            y_name: yn.name.clone(),
            x_shape: xn.ty.shape.clone(),
            y_shape: yn.ty.shape.clone(),
            x_dtype: tensor_dtype(xn.ty.dtype),
            y_dtype: tensor_dtype(yn.ty.dtype),
        }
    }

    /// The batch as tensors of the network's input and label types (the sample is reshaped
    /// when the element counts agree: `[1, 28, 28]` images into a `[784]` MLP).
    fn feeds(&self, b: Batch, network: &str) -> TrainResult<Vec<(String, Tensor)>> {
        let mismatch = |what, data: &[usize], expected: &[usize]| TrainError::DataMismatch {
            what,
            network: network.to_string(),
            data: data.to_vec(),
            expected: expected.to_vec(),
            hint: "choose the model's input shape to match the data (or the data for the model)".into(),
        };
        // A rank may read only some rows of the global batch.
        let rows = b.len();
        let x_shape: Vec<usize> = std::iter::once(rows).chain(self.x_shape[1..].iter().copied()).collect();
        let y_shape: Vec<usize> = std::iter::once(rows).chain(self.y_shape[1..].iter().copied()).collect();
        if b.x.len() != x_shape.iter().product::<usize>() {
            return Err(mismatch("batch shape", &b.x_shape, &self.x_shape));
        }
        let y = b.y.ok_or_else(|| TrainError::DataMismatch {
            what: "labels",
            network: network.to_string(),
            data: vec![],
            expected: self.y_shape.clone(),
            hint: "training needs a labelled dataset (a tensor dataset needs a `y` tensor)".into(),
        })?;
        if y.len() != y_shape.iter().product::<usize>() {
            return Err(mismatch("label shape", &b.y_shape, &self.y_shape));
        }
        let kernel =
            |name: &str, e| TrainError::Runtime(crate::RuntimeError::Kernel { kind: "feed", name: name.to_string(), source: Box::new(e) });
        let mut x = Tensor::from_vec(&x_shape, b.x).map_err(|e| kernel(&self.x_name, e))?;
        if self.x_dtype != DType::F32 {
            x = x.cast(self.x_dtype);
        }
        let mut yt = Tensor::from_vec(&y_shape, y).map_err(|e| kernel(&self.y_name, e))?;
        if self.y_dtype != DType::I64 {
            yt = yt.cast(self.y_dtype);
        }
        Ok(vec![(self.x_name.clone(), x), (self.y_name.clone(), yt)])
    }
}

/// What one rank's loop returns.
struct RankOut {
    losses: Vec<f64>,
    params: ParamStore,
    eval: Option<EvalResult>,
    checkpoints: Vec<PathBuf>,
    wall_secs: f64,
    last_step: u64,
    /// Seconds from the start of `fit` to this rank's first step (planning, initialisation,
    /// loading).
    setup_secs: f64,
    /// The plan's memory of this rank's step, in bytes.
    plan_memory: u64,
    /// Under mpirun, every rank's process's peak resident set (empty in process).
    peak_rss_by_rank: Vec<Option<u64>>,
}

/// The parameter pieces of the ranks a process ran, by global rank.
type Pieces = Vec<(usize, ParamStore)>;

/// Where a resumed run starts: the checkpoint's rank file and position, and, when this run's
/// layouts differ from the checkpoint's, the checkpoint's files that each rank reads its own
/// pieces of.
struct Resume {
    path: PathBuf,
    pos: RunPosition,
    reshard: Option<PieceSource>,
}

/// Facts every rank of a run shares.
struct Plan<'a> {
    job: &'a Job,
    io: &'a Io,
    /// The checkpoint `init` names, whose pieces each rank reads over those it generated
    /// from the initialisers.
    init: Option<PieceSource>,
    /// Devices of the job (under MPI, checked against the world's size).
    n: usize,
    steps_per_epoch: u64,
    total: u64,
    resume: Option<Resume>,
    trainable: Vec<String>,
    /// When `fit` began (setup time counts from it).
    started: Instant,
    /// In process, the pieces the simulated ranks generate once for all of them (under MPI,
    /// the ranks holding a piece alike generate it together).
    shared_init: Option<SharedInit>,
}

impl Trainer {
    /// A trainer of the network `build` makes (named `name` in messages) on `train`.
    pub fn new(name: impl Into<String>, build: BuildNetwork, train: DataSource, cfg: TrainConfig) -> Self {
        Self { name: name.into(), build, train, cfg, in_process: false, eval: None }
    }

    /// Runs every rank as a thread of this process, even in a process started by `mpirun`
    /// (which otherwise runs one rank per process): e.g. a stand-alone reference run beside an
    /// MPI job.
    pub fn in_process(mut self) -> Self {
        self.in_process = true;
        self
    }

    /// Evaluates the trained parameters on `data` at the end of [`Trainer::fit`], in parallel:
    /// every rank on its own pieces, under an inference job planned for the evaluation batch
    /// size ([`TrainReport::eval`]).
    pub fn with_eval(mut self, data: DataSource) -> Self {
        self.eval = Some(data);
        self
    }

    /// This trainer without the evaluation [`Trainer::with_eval`] asked for.
    pub fn without_eval(mut self) -> Self {
        self.eval = None;
        self
    }

    /// The run's configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The configuration, to change before [`Trainer::fit`].
    pub fn config_mut(&mut self) -> &mut TrainConfig {
        &mut self.cfg
    }

    fn network(&self, batch: usize, training: bool) -> TrainResult<Network> {
        let net = (self.build)(batch, training).map_err(|source| TrainError::Network { model: self.name.clone(), source })?;
        if let Some(loss) = net.graph.nodes().get(net.loss.0).filter(|l| !l.ty.shape.is_empty()) {
            return Err(TrainError::LossNotScalar { model: self.name.clone(), shape: loss.ty.shape.clone() });
        }
        Ok(net)
    }

    /// `device_memory_capacity`, when the parallel context sets it (the memory checks' limit).
    fn device_capacity(&self) -> Option<u64> {
        self.cfg.parallel.is_set("device_memory_capacity").then(|| self.cfg.parallel.search().device_memory_capacity)
    }

    fn config_error(option: &'static str, value: impl ToString, expected: impl Into<String>, hint: impl Into<String>) -> TrainError {
        TrainError::Config { option, value: value.to_string(), expected: expected.into(), hint: hint.into() }
    }

    /// Micro-batches per step of this run: the configured count, else the default (one per
    /// pipeline stage, 1 without).
    pub fn micro_batches(&self) -> TrainResult<usize> {
        let ctx = self.cfg.parallel.resolved()?;
        Ok(self.cfg.micro_batches.unwrap_or_else(|| autopar_parallel::default_micro_batches(&ctx)))
    }

    /// The steps an epoch has under this configuration.
    pub fn steps_per_epoch(&self) -> TrainResult<u64> {
        Ok(self.loader(None)?.batches_per_epoch() as u64)
    }

    /// Batches of the global batch size; `rows`: only these rows of each (what a rank reads).
    fn loader(&self, rows: Option<std::ops::Range<usize>>) -> TrainResult<DataLoader> {
        let cfg = LoaderConfig {
            batch_size: self.cfg.batch_size,
            shuffle: self.cfg.shuffle,
            seed: self.cfg.seed,
            drop_remainder: true,
            num_shards: 1,
            shard_id: 0,
            padding: ShardPadding::None,
            prefetch: self.cfg.prefetch,
            rows,
        };
        Ok(DataLoader::new(self.train.dataset.clone(), self.train.transforms.clone(), cfg)?)
    }

    /// The inputs of the network built for the micro-batch, and the job assembled for it (by
    /// the one entry point, [`autopar_parallel::assemble_job`]).
    fn assemble_job(&self) -> TrainResult<(Io, Job)> {
        let cfg = &self.cfg;
        let m = self.micro_batches()?;
        let micro = autopar_parallel::micro_batch_size(cfg.batch_size, m)?;
        let net = self.network(micro, true)?;
        let io = Io::of(&net.graph, &net);
        self.check_data(&net.graph, &net, &io)?;
        let job = Job::assemble(&autopar_parallel::JobRequest {
            graph: &net.graph,
            loss: Some(net.loss),
            context: &cfg.parallel,
            micro_batches: Some(m),
            pipeline_split: &cfg.pipeline_split,
            profile: cfg.profile.as_ref(),
            recompute: &cfg.recompute,
            precision: cfg.precision,
        })?;
        // Before any step runs, once per job (rank 0's process under mpirun).
        if autopar_comm::launch::mpi_rank().is_none_or(|r| r == 0) {
            for warning in job.network().warnings() {
                tracing::warn!("{warning}");
            }
        }
        Ok((io, job))
    }

    /// The strategy file of this job, planned but not trained: what a run writes as
    /// `strategy.json` beside its checkpoints (every parameter, frozen ones included, and the
    /// optimizer state), e.g. the destination strategy of [`autopar_checkpoint::transform_checkpoints`]
    /// for checkpoints this job will load. A pipeline gives the merged file of its stages.
    pub fn strategy_file(&self) -> TrainResult<StrategyFile> {
        let (_, job) = self.assemble_job()?;
        Ok(job.plan().strategy_file(false, &|name: &str| self.cfg.optimizer.state_keys(name)))
    }

    /// Runs the training; `callbacks` run on rank 0 after every step.
    pub fn fit(&self, callbacks: Vec<Box<dyn Callback>>) -> TrainResult<TrainReport> {
        let started = Instant::now();
        let cfg = &self.cfg;
        let n = cfg.parallel.resolved()?.devices();
        if let Some(ck) = &cfg.checkpoint {
            ck.check_folder()?;
        }
        if cfg.batch_size == 0 {
            return Err(Self::config_error("batch_size", 0, "a positive number", "set `batch_size`"));
        }
        let mpi = autopar_comm::launch::mpi_world_size().filter(|_| !self.in_process);
        #[cfg(not(feature = "mpi"))]
        if let Some(size) = mpi {
            return Err(TrainError::MpiNotBuilt { size });
        }
        if mpi.is_none() && cfg.parallel.explicit_global_rank().is_some() {
            return Err(RuntimeError::GlobalRankInProcess { devices: n }.into());
        }
        let (io, job) = self.assemble_job()?;
        let (init, init_ignored, init_kept) = match &cfg.init {
            Some(path) => {
                let (source, ignored, kept) = self.init_source(path, &job)?;
                (Some(source), ignored, kept)
            }
            None => (None, Vec::new(), Vec::new()),
        };
        let trainable = parameter_names(job.graph(), true);

        let steps_per_epoch = self.steps_per_epoch()?;
        if steps_per_epoch == 0 {
            return Err(Self::config_error(
                "batch_size",
                cfg.batch_size,
                format!("at most the {} samples of {}", self.train.dataset.len(), self.train.dataset.name()),
                "lower `batch_size`",
            ));
        }
        let by_epochs = cfg.epochs.saturating_mul(steps_per_epoch);
        let total = cfg.max_steps.map_or(by_epochs, |s| if cfg.epochs > 0 { s.min(by_epochs) } else { s });

        let resume = match &cfg.resume {
            Some(path) => Some(self.resume_from(path, &job)?),
            None => None,
        };
        let strategy_file = self.save_strategy_files(&job)?;
        let shared_init = if mpi.is_some() { None } else { Some(SharedInit::new(n)) };
        let plan = Plan { job: &job, io: &io, init, n, steps_per_epoch, total, resume, trainable, started, shared_init };
        let callbacks = Mutex::new(Some(callbacks));
        let first_error: Mutex<Option<TrainError>> = Mutex::new(None);
        #[cfg(feature = "mpi")]
        if let Some(size) = mpi {
            return self.fit_mpi(&plan, &callbacks, size, strategy_file).map(|r| TrainReport { init_ignored, init_kept, ..r });
        }
        crate::budget::check_stacks_fit(n, autopar_comm::LocalOptions::default().stack_size as u64)?;
        let results = LocalComm::run(n, |comm| -> Result<RankOut, String> {
            let rank = comm.rank();
            self.run_rank(&plan, &comm, &callbacks).map_err(|e| {
                let msg = e.to_string();
                let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                // An evaluation's error counts as its cause does.
                let is_comm = |e: &TrainError| matches!(e.cause(), TrainError::Runtime(RuntimeError::Comm { .. }));
                let replace = match &*slot {
                    None => true,
                    Some(TrainError::Rank { source, .. }) if is_comm(source) => !is_comm(&e),
                    Some(_) => false,
                };
                // The memory check's refusal is the same on every rank: not one rank's error.
                let job_wide = matches!(e.cause(), TrainError::Runtime(RuntimeError::DoesNotFit { .. }));
                if replace {
                    *slot = Some(if n > 1 && !job_wide { TrainError::Rank { rank, source: Box::new(e) } } else { e });
                }
                msg
            })
        });
        let outs = match results {
            Ok(outs) => outs,
            Err(e) => {
                let first = first_error.into_inner().unwrap_or_else(|p| p.into_inner());
                return Err(first.unwrap_or_else(|| RuntimeError::Comm { during: CommPhase::Run, source: Box::new(e) }.into()));
            }
        };
        let plan_memory = outs.iter().map(|o| o.plan_memory).sum();
        let mut outs = outs.into_iter();
        let mut out0 = outs.next().expect("a job has a rank");
        let mut pieces = vec![(0, std::mem::take(&mut out0.params))];
        pieces.extend(outs.enumerate().map(|(r, o)| (r + 1, o.params)));
        Ok(TrainReport { init_ignored, init_kept, ..self.report(&plan, out0, (pieces, None), plan_memory, strategy_file) })
    }

    /// The report of a run whose rank 0 (under mpirun: this process's rank) returned `out0`,
    /// with the pieces of this process's ranks (and the full parameters where gathered) and the
    /// plan's memory of those ranks (no initial checkpoint entries noted).
    fn report(
        &self,
        plan: &Plan<'_>,
        out0: RankOut,
        (pieces, gathered): (Pieces, Option<ParamStore>),
        plan_memory: u64,
        strategy_file: Option<PathBuf>,
    ) -> TrainReport {
        let first_step = plan.resume.as_ref().map_or(0, |r| r.pos.step);
        let run = out0.last_step - first_step;
        TrainReport {
            first_step,
            last_step: out0.last_step,
            steps_per_epoch: plan.steps_per_epoch,
            samples_per_sec: if out0.wall_secs > 0.0 { (run as f64 * self.cfg.batch_size as f64) / out0.wall_secs } else { 0.0 },
            losses: out0.losses,
            wall_secs: out0.wall_secs,
            setup_secs: out0.setup_secs,
            plan_memory,
            pieces,
            gathered,
            job: plan.job.clone(),
            eval: out0.eval,
            checkpoints: out0.checkpoints,
            strategy_file,
            device_num: plan.n,
            mode: plan.job.mode(),
            init_ignored: Vec::new(),
            init_kept: Vec::new(),
            trainable: plan.trainable.clone(),
            peak_rss_by_rank: out0.peak_rss_by_rank,
        }
    }

    /// The strategy files of the run: those the parallel context asks for
    /// ([`autopar_parallel::strategy_files::job_strategy_files`]: `strategy_ckpt_config.save_file`,
    /// per stage and merged for a pipeline, the operator strategy file of `op_strategy_config`
    /// SAVE, the group-info file of each rank of this process), and `strategy.json` beside the
    /// checkpoints of a model-parallel run, which describes every tensor the rank checkpoints
    /// hold (frozen parameters and optimizer state too) so that they can be resharded whole.
    /// Under mpirun rank 0 writes the job's files and each process its own group-info file.
    /// Returns the one written beside the checkpoints.
    fn save_strategy_files(&self, job: &Job) -> TrainResult<Option<PathBuf>> {
        let ctx = self.cfg.parallel.resolved()?;
        let keys = |name: &str| self.cfg.optimizer.state_keys(name);
        let mpi_rank = autopar_comm::launch::mpi_rank();
        let quiet = mpi_rank.is_some_and(|r| r != 0);
        let ranks: Vec<usize> = match mpi_rank {
            Some(r) => vec![r],
            None => (0..job.device_num()).collect(),
        };
        for (path, file) in autopar_parallel::strategy_files::job_strategy_files(job.plan(), &ctx, &ranks, &keys)? {
            let own = matches!(file, autopar_parallel::strategy_files::SavedFile::Groups(_));
            if !quiet || own {
                file.save(&path)?;
            }
        }
        let mut beside = None;
        if let Some(ck) = &self.cfg.checkpoint {
            // Data-parallel checkpoints hold whole tensors unless the optimizer shards them.
            if job.device_num() > 1 && (ctx.parallel_mode().is_auto() || ctx.enable_parallel_optimizer()) {
                std::fs::create_dir_all(&ck.dir).map_err(|source| TrainError::Write { path: ck.dir.clone(), source })?;
                let path = ck.dir.join("strategy.json");
                if !quiet {
                    job.plan()
                        .strategy_file(false, &keys)
                        .save(&path)
                        .map_err(|e| TrainError::Checkpoint { path: path.clone(), error: Box::new(e) })?;
                }
                beside = Some(path);
            }
        }
        Ok(beside)
    }

    /// One rank of a job started by `mpirun`: this process runs rank `MPI rank` of `size` and
    /// keeps its own pieces; with [`TrainConfig::gather_params`] the full parameters are also
    /// sent to rank 0 (one copy of each distinct piece).
    #[cfg(feature = "mpi")]
    fn fit_mpi(
        &self,
        plan: &Plan<'_>,
        callbacks: &Mutex<Option<Vec<Box<dyn Callback>>>>,
        size: usize,
        strategy_file: Option<PathBuf>,
    ) -> TrainResult<TrainReport> {
        if size != plan.n {
            return Err(Self::config_error(
                "devices",
                plan.n,
                format!("the {size} processes mpirun started"),
                format!("pass `device_num={size}` (one device per MPI process)"),
            ));
        }
        let job = plan.job;
        let out = autopar_comm::MpiComm::run(|comm| -> Result<(RankOut, Pieces, Option<ParamStore>), TrainError> {
            if let Some(g) = self.cfg.parallel.explicit_global_rank() {
                if g != comm.rank() {
                    return Err(RuntimeError::GlobalRank { global_rank: g, rank: comm.rank(), size }.into());
                }
            }
            let mut o = self.run_rank(plan, &comm, callbacks)?;
            // Full parameters on rank 0 only when asked for (every process keeps its own pieces).
            let gathered = if self.cfg.gather_params { crate::assemble::gather_full_params(job, &comm, &o.params)? } else { None };
            let pieces = vec![(comm.rank(), std::mem::take(&mut o.params))];
            Ok((o, pieces, gathered))
        })
        .map_err(|e| TrainError::Runtime(RuntimeError::Comm { during: CommPhase::Run, source: Box::new(e) }))?;
        let (out0, pieces, gathered) = out;
        let plan_memory = out0.plan_memory;
        Ok(self.report(plan, out0, (pieces, gathered), plan_memory, strategy_file))
    }

    fn check_data(&self, graph: &Graph, net: &Network, io: &Io) -> TrainResult<()> {
        let ds = &self.train.dataset;
        let sample = self.train.transforms.output_shape(ds.sample_shape())?;
        let want: Vec<usize> = io.x_shape[1..].to_vec();
        if sample.iter().product::<usize>() != want.iter().product::<usize>() {
            return Err(TrainError::DataMismatch {
                what: "sample shape",
                network: self.name.clone(),
                data: sample,
                expected: want,
                hint: format!("{} holds samples of another shape; pick the model's input shape to match", ds.name()),
            });
        }
        let classes = graph.node(net.logits).ty.shape.last().copied().unwrap_or(0);
        if let Some(c) = ds.num_classes() {
            if c > classes {
                return Err(TrainError::DataMismatch {
                    what: "classes",
                    network: self.name.clone(),
                    data: vec![c],
                    expected: vec![classes],
                    hint: format!("{} has labels 0..{c}; give the model at least {c} classes", ds.name()),
                });
            }
        }
        Ok(())
    }

    /// What this run's data position counts in ([`RunPosition::data`]).
    fn data_stream(&self) -> DataStream {
        DataStream { samples: self.train.dataset.len() as u64, seed: self.cfg.seed, shuffle: self.cfg.shuffle }
    }

    /// The checkpoint a run resumes from (a file, or the newest in a folder), checked against
    /// this run; merged to full tensors when `job`'s layouts differ from the ones it was saved
    /// under (another device count, mode or strategy).
    fn resume_from(&self, path: &Path, job: &Job) -> TrainResult<Resume> {
        let path = if path.is_dir() { latest_in(path)? } else { path.to_path_buf() };
        let ck = Loaded::open(&path)?;
        let pos = RunPosition::from_metadata(&path, ck.file.metadata())?;
        let bad = |problem: String, hint: &str| TrainError::Resume { path: path.clone(), problem, hint: hint.into() };
        // Another network's checkpoint first: its other settings would not matter.
        let params = parameter_names(job.graph(), true);
        if let Some(first) = params.first().filter(|_| !params.iter().any(|p| ck.has(p))) {
            return Err(bad(
                format!("it holds none of this network's parameters (such as {first}): it was saved from another network"),
                "resume with the `model` and sizes of the run that saved it",
            ));
        }
        if pos.batch_size != self.cfg.batch_size {
            return Err(bad(
                format!("it was saved with batch size {}; this run has {}", pos.batch_size, self.cfg.batch_size),
                "resume with the same `batch_size` so that the data position means the same batches",
            ));
        }
        if let Some(saved) = &pos.data {
            let now = self.data_stream();
            let differs = if saved.samples != now.samples {
                Some(format!("it was saved by a run over {} training samples; this run has {}", saved.samples, now.samples))
            } else if saved.seed != now.seed {
                Some(format!("it was saved by a run with seed {}; this run has seed {}", saved.seed, now.seed))
            } else if saved.shuffle != now.shuffle {
                Some(format!("it was saved by a run with shuffle {}; this run has shuffle {}", saved.shuffle, now.shuffle))
            } else {
                None
            };
            if let Some(problem) = differs {
                return Err(bad(
                    problem,
                    &format!(
                        "resume with the run's data, `seed={}` and shuffle {}, so that its data position means the same batches; to train further on other data, start a new run from its parameters with `init`",
                        saved.seed, saved.shuffle
                    ),
                ));
            }
        }
        let n = job.device_num();
        let mode = self.cfg.parallel.parallel_mode().name();
        let world = pos.world_size;
        let root = if world > 1 { path.parent().and_then(Path::parent) } else { path.parent() }.unwrap_or(Path::new("."));
        let strategy = root.join("strategy.json");
        // Only a model-parallel run's files, or those of a run whose optimizer sharded its
        // parameters (which writes strategy.json in any mode), hold slices; the others hold
        // whole tensors.
        let sliced = world > 1 && (ParallelMode::parse(&pos.parallel_mode).is_some_and(|m| m.is_auto()) || strategy.is_file());
        let same = world == n && pos.parallel_mode == mode && (!sliced || !strategy.is_file() || self.same_layouts(job, &strategy)?);
        if same {
            return Ok(Resume { path, pos, reshard: None });
        }
        if world > 1 && pos.parallel_mode == ParallelMode::HybridParallel.name() {
            return Err(bad(
                format!("it was saved by a hybrid_parallel run on {world} devices, whose slices no strategy file describes"),
                &format!("resume it with `device_num={world}` `parallel_mode=hybrid_parallel`"),
            ));
        }
        if let Some(ck) = &self.cfg.checkpoint {
            let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            if world > 1 && canon(&ck.dir) == canon(root) {
                return Err(bad(
                    format!("this run's layouts differ from the checkpoint's, and it would write its own checkpoints and strategy.json into {}, beside the ones it reads", root.display()),
                    "pass `checkpoint_dir` a new folder for the resumed run",
                ));
            }
        }
        let reshard = if sliced {
            if !strategy.is_file() {
                return Err(bad(
                    format!(
                        "its per-rank slices must be resharded for this run ({n} device(s), {mode}), and {} is missing",
                        strategy.display()
                    ),
                    "keep strategy.json (written by `autopar train`) beside the rank_<k> folders",
                ));
            }
            let mut files = std::collections::BTreeMap::new();
            for k in 0..world {
                files.insert(k, open_rank_file(&path, &pos, k)?.0.path);
            }
            PieceSource { path: path.clone(), files, strategy: Some(strategy) }
        } else {
            PieceSource { path: path.clone(), files: [(0, path.clone())].into(), strategy: None }
        };
        // Every tensor the ranks will read is there, in its shape, before any rank starts.
        let mut reader = reshard.reader(0)?;
        for (name, shape) in parameter_shapes(job.graph(), None) {
            if reshard.check(&mut reader, &name, &shape)?.is_none() {
                return Err(TrainError::InitMissing { path: path.clone(), name, shape });
            }
            if pos.updates() > 0 && params.contains(&name) {
                for key in self.cfg.optimizer.state_keys(&name) {
                    if reshard.check(&mut reader, &key, &shape)?.is_none() {
                        return Err(missing_state(&path, &key));
                    }
                }
            }
        }
        Ok(Resume { path, pos, reshard: Some(reshard) })
    }

    /// Whether `job` gives every tensor the layout the strategy file `saved` records.
    fn same_layouts(&self, job: &Job, saved: &Path) -> TrainResult<bool> {
        let saved = autopar_checkpoint::StrategyFile::load(saved)
            .map_err(|source| TrainError::Checkpoint { path: saved.to_path_buf(), error: Box::new(source) })?;
        let keys = |name: &str| self.cfg.optimizer.state_keys(name);
        let now = job.plan().strategy_file(false, &keys);
        let by_name = |mut items: Vec<autopar_checkpoint::LayoutItem>| {
            items.sort_by(|a, b| a.name.cmp(&b.name));
            items
        };
        Ok(by_name(saved.layout_items) == by_name(now.layout_items))
    }

    fn run_rank(
        &self,
        plan: &Plan<'_>,
        comm: &dyn Communicator,
        callbacks: &Mutex<Option<Vec<Box<dyn Callback>>>>,
    ) -> TrainResult<RankOut> {
        let cfg = &self.cfg;
        let rank = comm.rank();
        // The plan's memory, checked against what the machine allows before any tensor is made.
        let program = plan.job.plan().program(rank)?;
        let memory = crate::budget::on_backend(&program, plan.job.plan(), cfg.optimizer.kind.state_slots(), comm)?;
        let capacity = self.device_capacity();
        crate::budget::check_plan_fits(comm, &memory, capacity)?;
        let plan_memory = memory.total() as u64;
        let mut trainer = RankTrainer::with_program(
            plan.job,
            comm,
            program,
            match &plan.shared_init {
                Some(shared) => ParamSource::InitShared(shared),
                None => ParamSource::Init,
            },
        )?;
        let mut opt = cfg.optimizer.build()?;
        trainer.set_clip_grad_norm(cfg.optimizer.clip_grad_norm)?;
        trainer.set_loss_scale(cfg.loss_scale)?;
        let (mut step, mut epoch, mut pos) = (0u64, 0u64, 0u64);
        if let Some(init) = &plan.init {
            self.read_pieces(&mut trainer, None, init, rank)?;
            trainer.sync_shared_parameters()?;
        }
        if let Some(r) = &plan.resume {
            let p = match &r.reshard {
                None => self.restore(&mut trainer, opt.as_mut(), &r.path, &r.pos, rank, &plan.trainable)?,
                Some(source) => {
                    let state: Option<(&mut dyn Optimizer, &[String])> =
                        if r.pos.updates() > 0 { Some((opt.as_mut(), &plan.trainable)) } else { None };
                    self.read_pieces(&mut trainer, state, source, rank)?;
                    r.pos.clone()
                }
            };
            // Each rank read its own copy of a shared parameter: the owner's wins.
            trainer.sync_shared_parameters()?;
            continue_counters(&mut trainer, opt.as_mut(), &p)?;
            (step, epoch, pos) = (p.step, p.epoch, p.step_in_epoch);
        }
        // Every checkpoint of the run (resumed runs included) carries its id, so that a rank
        // file of another run is refused on resume.
        let run_id = match plan.resume.as_ref().map(|r| r.pos.run_id.clone()).filter(|id| !id.is_empty()) {
            Some(id) => id,
            None => new_run_id(comm)?,
        };
        // This rank reads only the rows of each global batch its inputs need.
        let rows = trainer.rows();
        let loader = self.loader(Some(rows.clone()))?;
        let mut cbs: Vec<Box<dyn Callback>> =
            if rank == 0 { callbacks.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default() } else { Vec::new() };
        for cb in cbs.iter_mut() {
            cb.on_train_begin(step, plan.total)?;
        }
        let spe = plan.steps_per_epoch;
        tracing::info!(rank, rows = ?rows, from_step = step, total_steps = plan.total, "rank starts training");
        let mut losses = Vec::new();
        let mut checkpoints = Vec::new();
        let started = Instant::now();
        let setup_secs = (started - plan.started).as_secs_f64();
        let mut last = started;
        let mut saved_at = None;
        while step < plan.total {
            if pos >= spe {
                epoch += 1;
                pos = 0;
            }
            let before = step;
            for batch in loader.epoch_from(epoch, pos as usize) {
                let named = plan.io.feeds(batch?, &self.name)?;
                let lr = opt.current_lr();
                let loss = trainer.step_rows(opt.as_mut(), &named, rows.start)?;
                let scaled = trainer.last_loss_scale();
                step += 1;
                pos += 1;
                let now = Instant::now();
                let dt = (now - last).as_secs_f64();
                last = now;
                tracing::debug!(rank, step, loss, lr, ms = dt * 1e3, "step");
                if rank == 0 {
                    // Only rank 0's losses reach the report: other ranks keep no history.
                    losses.push(loss);
                }
                let event = StepEvent {
                    step,
                    epoch: epoch + 1,
                    step_in_epoch: pos,
                    steps_per_epoch: spe,
                    total_steps: plan.total,
                    loss,
                    lr,
                    samples_per_sec: if dt > 0.0 { cfg.batch_size as f64 / dt } else { 0.0 },
                    batch_size: cfg.batch_size,
                    loss_scale: scaled.map(|s| s.scale),
                    overflow: scaled.is_some_and(|s| s.overflow),
                };
                if let Some(ck) = &cfg.checkpoint {
                    if ck.every_steps > 0 && step.is_multiple_of(ck.every_steps) {
                        checkpoints.push(self.save(ck, &trainer, opt.as_ref(), comm, &run_id, (step, epoch, pos))?);
                        saved_at = Some(step);
                    }
                }
                for cb in cbs.iter_mut() {
                    cb.on_step_end(&event)?;
                    if pos == spe {
                        cb.on_epoch_end(event.epoch, &event)?;
                    }
                }
                if step >= plan.total || pos >= spe {
                    break;
                }
            }
            if step == before {
                return Err(TrainError::Config {
                    option: "resume position",
                    value: format!("epoch {epoch}, batch {pos}"),
                    expected: format!("a batch in 0..{} of the data", loader.batches_per_epoch()),
                    hint: "the data changed since the checkpoint was written; resume with the same data and batch size".into(),
                });
            }
        }
        if let Some(ck) = &cfg.checkpoint {
            if saved_at != Some(step) && step > 0 {
                checkpoints.push(self.save(ck, &trainer, opt.as_ref(), comm, &run_id, (step, epoch, pos))?);
            }
        }
        for cb in cbs.iter_mut() {
            cb.on_train_end()?;
        }
        tracing::info!(rank, last_step = step, seconds = started.elapsed().as_secs_f64(), "rank finished");
        let wall_secs = started.elapsed().as_secs_f64();
        drop(opt);
        let params = trainer.into_params();
        // Under mpirun each process runs one rank and measures it: gathered now, before the
        // evaluation, as the figure of the training the plan describes.
        #[cfg(feature = "mpi")]
        let peak_rss_by_rank =
            if autopar_comm::launch::mpi_world_size().is_some() && !self.in_process { peaks_by_rank(comm)? } else { Vec::new() };
        #[cfg(not(feature = "mpi"))]
        let peak_rss_by_rank = Vec::new();
        let eval = match &self.eval {
            Some(data) if step > plan.resume.as_ref().map_or(0, |r| r.pos.step) => {
                let trained = evaluate::EvalParams::Trained { job: plan.job, store: &params, budget: plan_memory };
                let result = self.evaluate_rank(comm, trained, data, None).map_err(|e| TrainError::EvalAfterTraining {
                    last_step: step,
                    checkpoint: cfg.checkpoint.as_ref().filter(|_| !checkpoints.is_empty()).map(|ck| ck.dir.clone()),
                    source: Box::new(e),
                })?;
                Some(result)
            }
            _ => None,
        };
        Ok(RankOut { losses, params, eval, checkpoints, wall_secs, last_step: step, setup_secs, plan_memory, peak_rss_by_rank })
    }

    /// This rank's checkpoint at `step`, written atomically. With `keep_checkpoint_max`, the
    /// oldest files go only after every rank has written its file of `step` (a barrier), so a
    /// run killed at any moment leaves a complete checkpoint ([`latest_in`] finds it). Temp
    /// files a killed earlier run left in the rank's folder are removed.
    fn save(
        &self,
        ck: &CheckpointConfig,
        trainer: &RankTrainer,
        opt: &dyn Optimizer,
        comm: &dyn Communicator,
        run_id: &str,
        (step, epoch, pos): (u64, u64, u64),
    ) -> TrainResult<PathBuf> {
        let (rank, n) = (comm.rank(), comm.size());
        let position = RunPosition {
            step,
            epoch,
            step_in_epoch: pos,
            world_size: n,
            rank,
            batch_size: self.cfg.batch_size,
            parallel_mode: self.cfg.parallel.parallel_mode().name().to_string(),
            run_id: run_id.to_string(),
            data: Some(self.data_stream()),
            optimizer_steps: Some(opt.steps()),
            loss_scale: trainer.loss_scale_state(),
        };
        let path = checkpoint_path(&ck.dir, &ck.prefix, step, rank, n);
        // Temp files of a killed earlier run, whichever step it was writing.
        let folder = path.parent().unwrap_or(Path::new("."));
        autopar_checkpoint::io::remove_stale_temps(folder, |target| target.starts_with(&format!("{}-", ck.prefix)))
            .map_err(|source| TrainError::Checkpoint { path: folder.to_path_buf(), error: Box::new(source.into()) })?;
        let t = Instant::now();
        save_checkpoint(&path, trainer.params(), opt.state(), &position)?;
        tracing::info!(rank, step, path = %path.display(), ms = t.elapsed().as_secs_f64() * 1e3, "checkpoint written");
        if ck.keep_max > 0 {
            comm.barrier().map_err(|e| TrainError::Runtime(RuntimeError::comm(CommPhase::Checkpoint { step })(e)))?;
            let found = list_checkpoints(&ck.dir, &ck.prefix, rank, n);
            let excess = found.len().saturating_sub(ck.keep_max);
            for (_, old) in found.into_iter().take(excess) {
                std::fs::remove_file(&old).map_err(|source| TrainError::Write { path: old.clone(), source })?;
                tracing::debug!(rank, path = %old.display(), "old checkpoint removed (keep_checkpoint_max)");
            }
        }
        Ok(path)
    }

    /// This rank's parameters and optimizer state from its own file of the checkpoint (saved
    /// under this run's layouts).
    fn restore(
        &self,
        trainer: &mut RankTrainer,
        opt: &mut dyn Optimizer,
        path0: &Path,
        pos0: &RunPosition,
        rank: usize,
        trainable: &[String],
    ) -> TrainResult<RunPosition> {
        let (ck, p) = open_rank_file(path0, pos0, rank)?;
        let names: Vec<(String, Vec<usize>, DType)> =
            trainer.params().iter().map(|(k, t)| (k.clone(), t.shape().to_vec(), t.dtype())).collect();
        for (name, shape, dtype) in &names {
            let t = ck.tensor(name, shape)?.cast(*dtype);
            trainer.params_mut().insert(name, t);
            if p.updates() > 0 && trainable.contains(name) {
                for key in self.cfg.optimizer.state_keys(name) {
                    if !ck.has(&key) {
                        return Err(missing_state(&ck.path, &key));
                    }
                    let st = ck.tensor(&key, shape)?;
                    opt.state_mut().insert(&key, st);
                }
            }
        }
        Ok(p)
    }

    /// This rank's pieces of every parameter it holds, read from `source` over those it made
    /// (a parameter the source lacks keeps its value: checked before the ranks started), and
    /// with `state` the optimizer state of the trainable ones.
    fn read_pieces(
        &self,
        trainer: &mut RankTrainer,
        mut state: Option<(&mut dyn Optimizer, &[String])>,
        source: &PieceSource,
        rank: usize,
    ) -> TrainResult<()> {
        let mut reader = source.reader(rank)?;
        let slots: Vec<(String, Vec<usize>, Vec<std::ops::Range<usize>>)> = trainer
            .param_slots()
            .iter()
            .filter(|s| trainer.params().get(&s.name).is_some())
            .map(|s| (s.name.clone(), s.layout.shape().to_vec(), s.slice.clone()))
            .collect();
        for (name, shape, slice) in slots {
            let dtype = trainer.params().require(&name)?.dtype();
            if let Some(t) = source.piece(&mut reader, &name, &shape, &slice, dtype)? {
                trainer.params_mut().insert(&name, t);
            }
            let Some((opt, trainable)) = state.as_mut() else { continue };
            if !trainable.contains(&name) {
                continue;
            }
            for key in self.cfg.optimizer.state_keys(&name) {
                let t = source.piece(&mut reader, &key, &shape, &slice, dtype)?.ok_or_else(|| missing_state(&source.path, &key))?;
                opt.state_mut().insert(&key, t);
            }
        }
        Ok(())
    }

    /// The checkpoint `init` names (a file of whole tensors, a folder of per-rank files with
    /// their strategy, or a Hugging Face checkpoint: its folder or its shards' index), checked
    /// before any rank starts: every trainable parameter is there in
    /// its shape. Returns it with the names of its entries the network has no parameter for
    /// (ignored), and of the frozen parameters it lacks (which keep their values).
    fn init_source(&self, init: &Path, job: &Job) -> TrainResult<(PieceSource, Vec<String>, Vec<String>)> {
        let ck_err = |e: autopar_checkpoint::CheckpointError| TrainError::Checkpoint { path: init.to_path_buf(), error: Box::new(e) };
        let source = PieceSource::open(init, self.cfg.init_strategy.clone())?;
        let mut reader = source.reader(0)?;
        let mut kept = Vec::new();
        let trainable = parameter_names(job.graph(), true);
        let mut wanted = parameter_shapes(job.graph(), None);
        wanted.sort(); // the first problem in name order, whatever the graph's order
        for (name, shape) in wanted {
            let trainable = trainable.contains(&name);
            let found = source.check(&mut reader, &name, &shape).map_err(|e| one_rank_of_many(init, e))?;
            match found {
                Some(()) => {}
                None if !trainable => kept.push(name),
                None => return Err(one_rank_of_many(init, TrainError::InitMissing { path: init.to_path_buf(), name, shape })),
            }
        }
        // entries the network has no parameter for (optimizer state, counters): said, not used
        let params: Vec<String> = parameter_shapes(job.graph(), None).into_iter().map(|p| p.0).collect();
        let names = reader.names().map_err(ck_err)?;
        let ignored = names.into_iter().filter(|n| !params.contains(n)).collect();
        Ok((source, ignored, kept))
    }

    /// Accuracy and mean loss of `params` (full tensors) on `data` (every sample once, in
    /// order), on the run's devices as threads of this process: each rank slices its pieces from
    /// `params` and runs its part of an inference job planned for the evaluation batch size.
    pub fn evaluate(&self, params: &ParamStore, data: &DataSource) -> TrainResult<EvalResult> {
        let n = self.cfg.parallel.resolved()?.devices();
        self.run_in_process(n, |comm| self.evaluate_rank(comm, evaluate::EvalParams::Full(params), data, None))
    }

    /// Accuracy and mean loss on `data` of the parameters in the checkpoint `path` (a file of
    /// whole tensors, or a folder of per-rank files with the strategy they were saved under,
    /// as [`TrainConfig::init`] takes), on the run's devices: as threads of this process, or
    /// one rank per process under mpirun. Each rank reads only its own pieces of the files.
    pub fn evaluate_checkpoint(&self, path: &Path, data: &DataSource) -> TrainResult<EvalResult> {
        self.checkpoint_outputs(path, data, None)
    }

    /// [`Trainer::evaluate_checkpoint`], writing the outputs to the safetensors file `output`
    /// as they come, in the data's order: `logits` `[predictions, classes]` (f32; a row per
    /// sample, or per token position) and `predicted_class` `[predictions]` (i64). The rank
    /// reporting the outputs (the last pipeline stage's first) writes it, batch by batch,
    /// holding only the predicted classes until the end; the file appears when complete.
    pub fn predict_checkpoint(&self, path: &Path, data: &DataSource, output: &Path) -> TrainResult<EvalResult> {
        self.checkpoint_outputs(path, data, Some(evaluate::Predictions { output, checkpoint: path }))
    }

    fn checkpoint_outputs(&self, path: &Path, data: &DataSource, output: Option<evaluate::Predictions<'_>>) -> TrainResult<EvalResult> {
        let n = self.cfg.parallel.resolved()?.devices();
        let job = self.eval_job(self.cfg.eval_batch_size.max(1), n)?.job;
        let (source, _, made) = self.init_source(path, &job)?;
        let run = |comm: &dyn Communicator| self.evaluate_rank(comm, evaluate::EvalParams::Pieces(&source), data, output);
        let with_made = |r: EvalResult| EvalResult { made_from_init: made.clone(), ..r };
        match autopar_comm::launch::mpi_world_size().filter(|_| !self.in_process) {
            #[cfg(feature = "mpi")]
            Some(size) => {
                if size != n {
                    return Err(Self::config_error(
                        "devices",
                        n,
                        format!("the {size} processes mpirun started"),
                        format!("pass `device_num={size}` (one device per MPI process)"),
                    ));
                }
                autopar_comm::MpiComm::run(|comm| run(&comm))
                    .map_err(|e| TrainError::Runtime(RuntimeError::Comm { during: CommPhase::Run, source: Box::new(e) }))
                    .map(with_made)
            }
            #[cfg(not(feature = "mpi"))]
            Some(size) => Err(TrainError::MpiNotBuilt { size }),
            None => self.run_in_process(n, run).map(with_made),
        }
    }

    /// `f` on `n` ranks as threads of this process; rank 0's answer, or the first rank's error.
    fn run_in_process<T: Send>(&self, n: usize, f: impl Fn(&dyn Communicator) -> TrainResult<T> + Sync) -> TrainResult<T> {
        crate::budget::check_stacks_fit(n, autopar_comm::LocalOptions::default().stack_size as u64)?;
        let first_error: Mutex<Option<TrainError>> = Mutex::new(None);
        let results = LocalComm::run(n, |comm| -> Result<T, String> {
            f(&comm).map_err(|e| {
                let msg = e.to_string();
                let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(e);
                }
                msg
            })
        });
        match results {
            Ok(outs) => Ok(outs.into_iter().next().expect("a job has a rank")),
            Err(e) => {
                let first = first_error.into_inner().unwrap_or_else(|p| p.into_inner());
                Err(first.unwrap_or_else(|| RuntimeError::Comm { during: CommPhase::Run, source: Box::new(e) }.into()))
            }
        }
    }
}

/// Rank `rank`'s file of the checkpoint that `path0` (rank `pos0.rank`'s file) belongs to,
/// opened and checked to be that rank's file of the same step and device count.
fn open_rank_file(path0: &Path, pos0: &RunPosition, rank: usize) -> TrainResult<(Loaded, RunPosition)> {
    let path = rank_file(path0, pos0.rank, rank, pos0.world_size);
    let ck = Loaded::open(&path)?;
    let p = RunPosition::from_metadata(&path, ck.file.metadata())?;
    if !p.run_id.is_empty() && !pos0.run_id.is_empty() && p.run_id != pos0.run_id {
        return Err(TrainError::Resume {
            path,
            problem: format!(
                "it belongs to another run (run id {}) than rank {}'s file {} (run id {})",
                p.run_id,
                pos0.rank,
                path0.display(),
                pos0.run_id
            ),
            hint: "keep every rank's files of one checkpoint together: a rank_<k> folder was copied from another run".into(),
        });
    }
    if p.rank != rank || p.step != pos0.step || p.world_size != pos0.world_size {
        return Err(TrainError::Resume {
            path,
            problem: format!(
                "it is rank {}'s file at step {} of {} device(s); rank {rank}'s file of step {} of {} is needed",
                p.rank, p.step, p.world_size, pos0.step, pos0.world_size
            ),
            hint: "keep every rank's files of one checkpoint together (rank_<k>/<prefix>-<step>_<k>.safetensors)".into(),
        });
    }
    Ok((ck, p))
}

/// Tensor `name` of the checkpoint `path` merged to full tensors, checked against `shape`.
/// `e`, a parameter missing from or shaped otherwise in the `--init` file `path`, said as what
/// it is when the file is one rank's file of a parallel run (whose slices the whole folder
/// holds together).
fn one_rank_of_many(path: &Path, e: TrainError) -> TrainError {
    if !matches!(e, TrainError::InitMissing { .. } | TrainError::InitShape { .. }) {
        return e;
    }
    let Ok(ck) = Loaded::open_metadata(path) else { return e };
    match RunPosition::from_metadata(path, ck.file.metadata()) {
        Ok(pos) if pos.world_size > 1 => {
            // The problem without its own hint (another network), which this one replaces.
            let problem = e.to_string().lines().filter(|l| !l.starts_with("hint:")).collect::<Vec<_>>().join("\n  ");
            let root = path.parent().and_then(Path::parent).unwrap_or(Path::new("."));
            TrainError::Config {
                option: "init",
                value: path.display().to_string(),
                expected: format!(
                    "a whole checkpoint; this is rank {}'s file of a run on {} devices, which holds its slices only:\n  {problem}",
                    pos.rank, pos.world_size
                ),
                hint: format!(
                    "pass the run's folder, `init={}` (its strategy.json says how the ranks' files fit together)",
                    root.display()
                ),
            }
        }
        _ => e,
    }
}

/// The error for optimizer state `key` missing from the checkpoint `path`.
fn missing_state(path: &Path, key: &str) -> TrainError {
    TrainError::Resume {
        path: path.to_path_buf(),
        problem: format!("optimizer state {key} is missing"),
        hint: "resume with the optimizer the checkpoint was trained with (`optimizer`)".into(),
    }
}

/// Continue the counters of a resumed run at `step`: the step counter keys the dropout masks;
/// the optimizer counts its updates (learning-rate schedule, Adam's bias correction) and is
/// advanced with empty updates.
fn continue_counters(trainer: &mut RankTrainer, opt: &mut dyn Optimizer, pos: &RunPosition) -> TrainResult<()> {
    trainer.set_steps(pos.step);
    trainer.resume_loss_scale(pos.step, pos.loss_scale);
    // Steps whose update loss scaling skipped did not advance the optimizer.
    let updates = pos.updates();
    if opt.steps() < updates {
        opt.set_steps(updates);
    }
    Ok(())
}

/// Every rank's process's peak resident set (`VmHWM`), gathered on every rank.
#[cfg(feature = "mpi")]
/// (None where `/proc` does not exist.)
fn peaks_by_rank(comm: &dyn Communicator) -> TrainResult<Vec<Option<u64>>> {
    let own = vec![crate::budget::ProcessMemory::now().map_or(-1, |m| m.peak as i64)];
    let mut all = vec![0i64; comm.size()];
    comm.all_gather((&own).into(), (&mut all).into()).map_err(|e| TrainError::Runtime(RuntimeError::comm(CommPhase::Run)(e)))?;
    Ok(all.into_iter().map(|b| u64::try_from(b).ok()).collect())
}

/// A new run's id: rank 0's random 64 bits, in hex, broadcast to every rank.
fn new_run_id(comm: &dyn Communicator) -> TrainResult<String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut id = vec![(nanos ^ (u64::from(std::process::id()) << 32)) as i64];
    comm.broadcast((&mut id).into(), 0).map_err(|e| TrainError::Runtime(RuntimeError::comm(CommPhase::Run)(e)))?;
    Ok(format!("{:016x}", id[0] as u64))
}

/// The newest complete checkpoint under `dir`: a stand-alone `<prefix>-<step>.safetensors`, or
/// rank 0's file of a parallel run (`rank_0/<prefix>-<step>_0.safetensors`) whose every rank
/// wrote its file. A step some rank has not written (the run was killed while saving) is
/// passed over; a file that cannot be read is an error naming it. Only metadata is read here:
/// the resume that loads the file checks its CRC.
pub fn latest_in(dir: &Path) -> TrainResult<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for (folder, suffix) in [(dir.to_path_buf(), ""), (dir.join("rank_0"), "_0")] {
        for e in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let Ok(name) = e.file_name().into_string() else { continue };
            let Some(stem) = name.strip_suffix(&format!("{suffix}.safetensors")) else { continue };
            let Some((_, digits)) = stem.rsplit_once('-') else { continue };
            if let Ok(s) = digits.parse::<u64>() {
                found.push((s, e.path()));
            }
        }
    }
    found.sort();
    let mut incomplete = Vec::new();
    for (step, path) in found.into_iter().rev() {
        let ck = Loaded::open_metadata(&path)?;
        let pos = RunPosition::from_metadata(&path, ck.file.metadata())?;
        if pos.rank != 0 {
            return Err(TrainError::Resume {
                path,
                problem: format!("it lies where rank 0's file of step {step} goes, but its metadata says it is rank {}'s file", pos.rank),
                hint: format!("put each rank's file back into its folder rank_<k> (this one into rank_{})", pos.rank),
            });
        }
        let missing: Vec<usize> =
            (0..pos.world_size).filter(|&r| r != pos.rank && !rank_file(&path, pos.rank, r, pos.world_size).is_file()).collect();
        if missing.is_empty() {
            return Ok(path);
        }
        incomplete.push(format!("step {step} (no file of rank(s) {missing:?})"));
    }
    Err(TrainError::Resume {
        path: dir.to_path_buf(),
        problem: if incomplete.is_empty() {
            "the folder holds no checkpoint (<prefix>-<step>.safetensors or rank_0/<prefix>-<step>_0.safetensors)".into()
        } else {
            format!("the folder holds no complete checkpoint: {}", incomplete.join(", "))
        },
        hint: "pass a checkpoint file, or the folder given to `checkpoint_dir`".into(),
    })
}
