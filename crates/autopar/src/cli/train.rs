//! `autopar train`: train a zoo model on a dataset, on one device or `--devices N` ranks.
//!
//! Every key can also come from a TOML file (`--config run.toml`, same names with `_` for `-`,
//! plus a `[parallel]` table of `set_auto_parallel_context` options); flags given on the
//! command line override the file. Unknown keys are errors.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use autopar_data::{DataError, Dataset, DatasetKind, Split, Subset, SyntheticDataset, SyntheticTask, Transforms};
use autopar_models::{model_by_name, Model, ModelOptions};
use autopar_parallel::report::html::Measured;
use autopar_runtime::callbacks::{Callback, LossMonitor, MetricsWriter, StepEvent};
use autopar_runtime::trainer::{CheckpointConfig, DataSource, OptimizerConfig, TrainReport, TrainResult, Trainer};
use autopar_runtime::{LossScale, LrSchedule, TrainConfig};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::common::{
    check_micro_batches, load_profile, model_options, open_training_data, optimizer_kind, parallel_context, pipeline_split, precision,
    read_config, recompute, FileConfig, ModelArgs, ParallelArgs,
};
use crate::verify;

/// Train a model: `autopar train --model mlp --data synthetic --epochs 2`.
#[derive(Args, Debug, Default)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// Read these settings from a TOML file (flags given here override it).
    #[arg(long, value_name = "FILE", help_heading = "Run")]
    pub(super) config: Option<PathBuf>,
    #[command(flatten)]
    pub(super) model: ModelArgs,
    #[command(flatten)]
    pub(super) parallel: ParallelArgs,
    /// Data: a CIFAR-10 binary folder, an MNIST folder, a .safetensors file (x, y), or `synthetic`.
    #[arg(long, value_name = "PATH|synthetic", help_heading = "Data")]
    pub(super) data: Option<String>,
    /// Epochs to train (with --steps, whichever ends first).
    #[arg(long, help_heading = "Run")]
    epochs: Option<u64>,
    /// Total steps to train.
    #[arg(long, help_heading = "Run")]
    steps: Option<u64>,
    /// Global batch size, split over the devices (default: 32, or the device count when it does not divide 32).
    #[arg(long, help_heading = "Run")]
    pub(super) batch_size: Option<usize>,
    /// Micro-batches per step of a pipeline (--parallel pipeline_stages=P): each global batch
    /// is cut into M equal parts that flow through the stages; one update per step.
    #[arg(long, value_name = "M", help_heading = "Parallel")]
    micro_batches: Option<usize>,
    /// Accumulate the gradients of K batches of --batch-size before each update: the same
    /// update as one batch K times larger (BatchNorm: statistics per batch).
    #[arg(long, value_name = "K", help_heading = "Run")]
    grad_accumulation: Option<usize>,
    /// Seed of parameter initialisation, shuffling and augmentation.
    #[arg(long, help_heading = "Run")]
    pub(super) seed: Option<u64>,
    /// Reshuffle the data every epoch.
    #[arg(long, value_name = "true|false", help_heading = "Data")]
    shuffle: Option<bool>,
    /// Samples of synthetic data (a tenth more are held out for evaluation): labels of a random
    /// linear teacher for classifiers, successor sequences for gpt.
    #[arg(long, help_heading = "Data")]
    pub(super) synthetic_samples: Option<usize>,
    /// Batches prepared ahead on a background thread.
    #[arg(long, help_heading = "Data")]
    pub(super) prefetch: Option<usize>,

    /// Optimizer: sgd, momentum or adamw.
    #[arg(long, help_heading = "Optimizer")]
    optimizer: Option<String>,
    /// Learning rate (the peak of a warm-up/cosine schedule).
    #[arg(long, help_heading = "Optimizer")]
    lr: Option<f64>,
    /// Learning-rate schedule: constant or cosine (linear warm-up, then cosine decay to --min-lr).
    #[arg(long, help_heading = "Optimizer")]
    schedule: Option<String>,
    /// Warm-up steps of the cosine schedule.
    #[arg(long, help_heading = "Optimizer")]
    warmup_steps: Option<u64>,
    /// Final learning rate of the cosine schedule.
    #[arg(long, help_heading = "Optimizer")]
    min_lr: Option<f64>,
    /// Momentum (momentum optimizer).
    #[arg(long, help_heading = "Optimizer")]
    momentum: Option<f64>,
    /// Weight decay (not applied to normalisation parameters).
    #[arg(long, help_heading = "Optimizer")]
    weight_decay: Option<f64>,
    /// Clip each step's gradients to this global L2 norm, over the whole job (MindSpore's ClipByGlobalNorm).
    #[arg(long, value_name = "NORM", help_heading = "Optimizer")]
    clip_grad_norm: Option<f64>,
    /// Scale the loss (MindSpore's loss-scale managers): none; fixed:S (a step whose gradients
    /// overflow is skipped on every rank; fixed:S:keep applies it anyway); dynamic[:INIT[:FACTOR:WINDOW]]
    /// (defaults 2^24, 2, 2000: divided by FACTOR at each overflow, multiplied after WINDOW steps without one)
    #[arg(long, value_name = "none|fixed:S[:keep]|dynamic[:INIT[:FACTOR:WINDOW]]", help_heading = "Optimizer")]
    loss_scale: Option<String>,

    /// Save checkpoints in this folder.
    #[arg(long, value_name = "DIR", help_heading = "Checkpoints")]
    checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every N steps (and at the end; 0, the default: at the end only).
    #[arg(long, value_name = "N", help_heading = "Checkpoints")]
    checkpoint_every: Option<u64>,
    /// Keep at most this many checkpoints (per rank), deleting the oldest; 0 keeps all.
    #[arg(long, value_name = "N", help_heading = "Checkpoints")]
    keep_checkpoint_max: Option<usize>,
    /// File name prefix of checkpoints.
    #[arg(long, help_heading = "Checkpoints")]
    checkpoint_prefix: Option<String>,
    /// Load parameters by name before training: a checkpoint file, or a folder of per-rank
    /// checkpoints (folders rank_0, rank_1, ...) saved under any strategy and device count (see --init-strategy)
    #[arg(long, value_name = "CHECKPOINT|DIR", help_heading = "Checkpoints")]
    init: Option<PathBuf>,
    /// The strategy file the per-rank --init checkpoints were saved under
    #[arg(long, value_name = "FILE", help_heading = "Checkpoints")]
    pub(super) init_strategy: Option<PathBuf>,
    /// Continue a run from this checkpoint (or the newest in this folder), on any device count,
    /// mode and strategy: its rank files are resharded (parameters and optimizer state)
    #[arg(long, value_name = "CHECKPOINT|DIR", help_heading = "Checkpoints")]
    resume: Option<PathBuf>,

    /// Write one JSON object per step (step, epoch, loss, lr, samples_per_sec; loss_scale and
    /// overflow when the loss is scaled) to this file.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    metrics: Option<PathBuf>,
    /// Also draw the loss curve as an SVG beside the metrics file.
    #[arg(long, help_heading = "Output")]
    plot: bool,
    /// Write the plan's web page (as `autopar plan --html` writes it) to this HTML file after the
    /// run, with the step times and memory it measured beside the plan's predictions.
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    report: Option<PathBuf>,
    /// Print `epoch: E step: S, loss is L` every N steps of the run, as MindSpore's LossMonitor (0: never); default: every 100 steps or once an epoch.
    #[arg(long, value_name = "N", help_heading = "Output")]
    log_every: Option<u64>,
    /// Evaluate accuracy on the test split after training.
    #[arg(long, value_name = "true|false", help_heading = "Output")]
    eval: Option<bool>,
    /// Batch size of evaluation (default: --batch-size, so that evaluation keeps to the plan's memory).
    #[arg(long, help_heading = "Output")]
    pub(super) eval_batch_size: Option<usize>,

    /// Also train stand_alone on the same data and print the largest loss and parameter
    /// differences; exit code 1 when a step's loss or a parameter tensor (normwise) differs by
    /// more than a relative 1e-3.
    #[arg(long, help_heading = "Parallel")]
    verify: bool,

    /// Print the summary as one JSON object on stdout (the step lines go to stderr).
    #[arg(long, help_heading = "Output")]
    json: bool,
}

/// The flags merged over the file.
struct Settings {
    args: TrainArgs,
    file: FileConfig,
}

macro_rules! pick {
    ($s:expr, $field:ident) => {
        $s.args.$field.clone().or_else(|| $s.file.$field.clone())
    };
}

fn parse_bool_or(v: Option<bool>, default: bool) -> bool {
    v.unwrap_or(default)
}

/// Progress bar on stderr (step, loss, samples/s), only on a terminal.
struct Progress {
    bar: ProgressBar,
}

impl Callback for Progress {
    fn on_train_begin(&mut self, first: u64, total: u64) -> TrainResult<()> {
        self.bar.set_length(total);
        self.bar.set_position(first);
        Ok(())
    }
    fn on_step_end(&mut self, e: &StepEvent) -> TrainResult<()> {
        self.bar.set_position(e.step);
        if e.step.is_multiple_of(5) || e.step == e.total_steps {
            self.bar.set_message(format!("loss {:.4} {:.0} samples/s", e.loss, e.samples_per_sec));
        }
        Ok(())
    }
    fn on_train_end(&mut self) -> TrainResult<()> {
        self.bar.finish_and_clear();
        Ok(())
    }
}

/// This process's memory at one step: peak and current resident set (Linux `/proc/self/status`
/// `VmHWM` / `VmRSS`), in bytes.
#[derive(Clone, Copy, Debug)]
struct MemorySample {
    step: u64,
    peak_rss: u64,
    rss: u64,
}

/// `VmHWM` and `VmRSS` of this process in bytes; `None` where `/proc` does not exist.
fn resident_memory() -> Option<(u64, u64)> {
    autopar_runtime::budget::ProcessMemory::now().map(|m| (m.peak, m.resident))
}

/// Samples the memory of the process every `every` steps and at the last step, so a long run
/// shows whether memory stays flat (the summary prints the first and last samples), and
/// records every step's time.
struct MemoryProbe {
    every: u64,
    samples: Arc<std::sync::Mutex<Vec<MemorySample>>>,
    step_seconds: Arc<std::sync::Mutex<Vec<f64>>>,
    scaled: Arc<std::sync::Mutex<ScaleSeen>>,
}

/// What loss scaling did over the run: steps scaled, steps whose gradients overflowed, the
/// last step's scale.
#[derive(Clone, Copy, Debug, Default)]
struct ScaleSeen {
    steps: u64,
    overflowed: u64,
    last: Option<f64>,
}

impl Callback for MemoryProbe {
    fn on_step_end(&mut self, e: &StepEvent) -> TrainResult<()> {
        if e.samples_per_sec > 0.0 {
            self.step_seconds.lock().unwrap_or_else(|p| p.into_inner()).push(e.batch_size as f64 / e.samples_per_sec);
        }
        if let Some(scale) = e.loss_scale {
            let mut seen = self.scaled.lock().unwrap_or_else(|p| p.into_inner());
            seen.steps += 1;
            seen.overflowed += u64::from(e.overflow);
            seen.last = Some(scale);
        }
        if e.step.is_multiple_of(self.every) || e.step == e.total_steps {
            if let Some((peak_rss, rss)) = resident_memory() {
                self.samples.lock().unwrap_or_else(|p| p.into_inner()).push(MemorySample { step: e.step, peak_rss, rss });
            }
        }
        Ok(())
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Stdout lines that do not tear the progress bar (stderr lines with `--json`, whose stdout is
/// the summary alone).
struct BarStdout {
    bar: Option<ProgressBar>,
    buf: Vec<u8>,
    to_stderr: bool,
}

impl Write for BarStdout {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        while let Some(i) = self.buf.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let out = || {
                let _ = if self.to_stderr {
                    std::io::stderr().lock().write_all(&line)
                } else {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&line).and_then(|()| o.flush())
                };
            };
            match &self.bar {
                Some(bar) => bar.suspend(out),
                None => out(),
            }
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Ends the run with [`TrainError::Interrupted`] after the step during which
/// [`super::interrupt`] was called.
struct StopWhenInterrupted;

impl Callback for StopWhenInterrupted {
    fn on_step_end(&mut self, event: &StepEvent) -> autopar_runtime::trainer::TrainResult<()> {
        if super::interrupted() {
            return Err(autopar_runtime::trainer::TrainError::Interrupted { step: event.step });
        }
        Ok(())
    }
}

/// What `train`, `eval` and `predict` set up alike: the flags over the file, the parallel
/// context (an option autopar does not implement refused before any data or model is loaded),
/// the data and the model.
struct Prepared {
    s: Settings,
    ctx: autopar_parallel::ParallelContext,
    seed: u64,
    data: Data,
    model: Arc<dyn Model>,
    build: autopar_runtime::trainer::BuildNetwork,
    name: String,
}

/// `weights`: the checkpoint an evaluation reads (training's is its `--init`), whose Hugging
/// Face `config.json` gives the sizes no flag sets.
fn prepare(args: TrainArgs, weights: Option<&Path>) -> Result<Prepared> {
    let file = read_config(args.config.as_deref())?;
    let s = Settings { args, file };
    // The parallel context first: an option autopar does not implement is refused before any
    // data or model is loaded. A build without MPI support started by mpirun would run the
    // whole job in every process: refuse it.
    #[cfg(not(feature = "mpi"))]
    if let Some(size) = autopar_comm::launch::mpi_world_size() {
        bail!(
            "this process was started by mpirun ({size} processes), but autopar was built without MPI support\nhint: build with MPI: cargo build --release --features mpi (needs libopenmpi-dev and libclang-dev)"
        );
    }
    let ctx = parallel_context(&s.args.parallel, &s.file)?;
    let (lower, mut opts) = model_options(&s.args.model, &s.file)?;
    if let Some(weights) = weights.map(Path::to_path_buf).or_else(|| pick!(s, init)) {
        if let Some(config) = super::common::hf_model_options(&lower, &weights, &mut opts)? {
            tracing::info!("model sizes not given take their values from {}", config.display());
        }
    }
    let seed = pick!(s, seed).unwrap_or(1);
    let data = load_data(&s, &lower, &mut opts, seed)?;
    let model: Arc<dyn Model> = Arc::from(model_by_name(&lower, &opts)?);
    let build = crate::model_network(model.clone(), seed);
    let name = model.name().to_string();
    Ok(Prepared { s, ctx, seed, data, model, build, name })
}

/// A trainer of the model, data and devices `args` give, for evaluation and prediction (its
/// evaluation batch size from `eval_batch_size`), with the data to run on (the held-out split,
/// else the whole data) and its description.
pub(super) fn inference_trainer(args: TrainArgs, weights: &Path) -> Result<(Trainer, DataSource, String)> {
    let Prepared { s, ctx, seed, data, build, name, .. } = prepare(args, Some(weights))?;
    let cfg = train_config(&s, ctx, seed)?;
    let (source, desc) = match data.eval {
        Some(eval) => (eval, format!("the held-out split of {}", data.desc)),
        None => (data.train.clone(), data.desc),
    };
    Ok((Trainer::new(name, build, data.train, cfg), source, desc))
}

/// Runs `autopar train`: the summary goes to `out`, step lines to stdout (stderr with `--json`).
pub fn run(args: TrainArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let Prepared { s, ctx, seed, data, model, build, name } = prepare(args, None)?;
    let cfg = with_checkpoints(&s, train_config(&s, ctx, seed)?, &name)?;
    let spe = Trainer::new(name.clone(), build.clone(), data.train.clone(), cfg.clone()).steps_per_epoch()?;
    let (cfg, total) = with_schedule(&s, cfg, spe)?;
    let mut trainer = Trainer::new(name.clone(), build, data.train.clone(), cfg);
    // Evaluated at the end of the run by the ranks, each on its own pieces.
    if let Some(eval) = data.eval.clone().filter(|_| parse_bool_or(pick!(s, eval), true)) {
        trainer = trainer.with_eval(eval);
    }
    // Under mpirun every process trains one rank; only rank 0 prints results.
    let quiet = autopar_comm::launch::mpi_rank().is_some_and(|r| r != 0);
    if let Some(path) = pick!(s, report) {
        super::common::check_output_file(&path, "--report", "report.html")?;
    }
    let outputs = callbacks(&s, trainer.config(), total, spe)?;
    let mode = mode_description(&trainer)?;
    let devices = match trainer.config().parallel.devices() {
        1 => format!("1 device ({mode})"),
        n => format!("{n} devices ({mode})"),
    };
    if !quiet {
        eprintln!(
            "autopar train: {} on {}, {devices}, {} ({spe} per epoch), batch {}",
            model.describe(),
            data.desc,
            if total == 1 { "1 step".to_string() } else { format!("{total} steps") },
            trainer.config().batch_size
        );
    }
    let report = trainer.fit(if quiet { Vec::new() } else { outputs.callbacks })?;
    if quiet {
        return Ok(ExitCode::SUCCESS);
    }
    let summary = summarise(&s, &trainer, &report, data.eval.is_some(), (spe, total))?;
    if let Some(path) = pick!(s, report) {
        write_report(&path, &trainer, &report, model.as_ref(), (&outputs.memory, &outputs.step_seconds))?;
    }
    let memory: Vec<MemorySample> = outputs.memory.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let scaled = *outputs.scaled.lock().unwrap_or_else(|p| p.into_inner());
    let facts =
        Facts { model: model.as_ref(), data: &data.desc, mode, devices, metrics: outputs.metrics, plot: outputs.plot, memory, scaled };
    if s.args.json {
        print_json(out, &trainer, &report, &summary, &facts, spe)
    } else {
        print_text(out, &trainer, &report, &summary, &facts)
    }
}

/// The training data, the held-out data for evaluation, and their description.
struct Data {
    train: DataSource,
    eval: Option<DataSource>,
    desc: String,
}

/// `--data`: synthetic data for the model, or a dataset's files (which fill in the model's
/// input shape and classes when not given).
fn load_data(s: &Settings, lower: &str, opts: &mut ModelOptions, seed: u64) -> Result<Data> {
    let data_arg =
        pick!(s, data).ok_or_else(|| anyhow!("no data given\nhint: pass --data <cifar10 dir|mnist dir|file.safetensors|synthetic>"))?;
    let synthetic = data_arg == "synthetic";
    let (train, eval, desc): (DataSource, Option<DataSource>, String) = if synthetic {
        let probe = model_by_name(lower, opts)?;
        let n = pick!(s, synthetic_samples).unwrap_or(8192);
        if n == 0 {
            bail!("--synthetic-samples 0 generates no data\nhint: pass --synthetic-samples N with N at least the batch size, such as 8192");
        }
        let held = (n / 10).max(1);
        let all: Arc<dyn Dataset> = if autopar_models::LANGUAGE_MODELS.contains(&lower) {
            let context = probe.input_shape()[0];
            Arc::new(SyntheticDataset::tokens(probe.num_classes(), context, n + held, seed)?)
        } else {
            let task = SyntheticTask::Teacher { num_classes: probe.num_classes(), shape: probe.input_shape() };
            Arc::new(SyntheticDataset::new(task, n + held, seed)?)
        };
        let train = Arc::new(Subset::range(all.clone(), 0..n)?);
        let test = Arc::new(Subset::range(all, n..n + held)?);
        (
            DataSource { dataset: train, transforms: Transforms::new() },
            Some(DataSource { dataset: test, transforms: Transforms::new() }),
            format!("synthetic data ({n} samples, {held} held out)"),
        )
    } else {
        let path = PathBuf::from(&data_arg);
        let (kind, ds, transforms) = open_training_data(&path, lower, opts)?;
        let test = match kind {
            DatasetKind::Cifar10 | DatasetKind::Mnist if path.is_dir() => match autopar_data::open(&path, Split::Test) {
                Ok((_, t)) => Some(DataSource { dataset: t, transforms: kind.default_transforms(Split::Test) }),
                Err(DataError::MissingFiles { .. } | DataError::MissingFile { .. }) => None,
                Err(e) => return Err(e.into()),
            },
            DatasetKind::Tensor if path.is_dir() && path.join("test.safetensors").is_file() => {
                let (_, t) = autopar_data::open(&path, Split::Test)?;
                Some(DataSource { dataset: t, transforms: Transforms::new() })
            }
            _ => None,
        };
        let desc = format!("{} ({} samples)", ds.name(), ds.len());
        (DataSource { dataset: ds, transforms }, test, desc)
    };
    Ok(Data { train, eval, desc })
}

/// The run's configuration from the flags and the file, checked (the learning-rate schedule and
/// the checkpoints are set after: [`with_schedule`], [`with_checkpoints`]).
fn train_config(s: &Settings, ctx: autopar_parallel::ParallelContext, seed: u64) -> Result<TrainConfig> {
    let lr = pick!(s, lr).unwrap_or(0.01);
    let epochs = pick!(s, epochs);
    let steps = pick!(s, steps);
    // As `autopar plan`: 32, or the device count when it does not divide 32.
    let n = ctx.devices();
    let mut batch_size = pick!(s, batch_size).unwrap_or(if 32 % n == 0 { 32 } else { n });
    let mut micro_batches = check_micro_batches(pick!(s, micro_batches))?;
    if let Some(k) = pick!(s, grad_accumulation) {
        if k == 0 {
            bail!("--grad-accumulation 0 accumulates nothing\nhint: pass --grad-accumulation 1 or more");
        }
        if let Some(m) = micro_batches.filter(|&m| m > 1) {
            bail!(
                "--grad-accumulation {k} and --micro-batches {m} both given\nhint: a pipeline accumulates over its micro-batches: pass --micro-batches {} and --batch-size {}",
                m * k,
                batch_size * k
            );
        }
        // K batches per update: one global batch K times larger, run in K micro-batches.
        batch_size *= k;
        micro_batches = Some(k);
    }
    let clip_grad_norm = pick!(s, clip_grad_norm);
    if let Some(c) = clip_grad_norm.filter(|c| !(*c > 0.0 && c.is_finite())) {
        bail!("--clip-grad-norm {c} is not a norm\nhint: pass a finite value > 0, such as --clip-grad-norm 1.0");
    }
    let loss_scale: LossScale = match pick!(s, loss_scale) {
        None => LossScale::None,
        Some(v) => v.parse().map_err(|e| {
            anyhow::anyhow!("--loss-scale (loss_scale in a config file): {e}\nhint: pass --loss-scale dynamic, or fixed:1024")
        })?,
    };
    let optimizer_name = pick!(s, optimizer).unwrap_or_else(|| "momentum".into());
    let given_momentum = pick!(s, momentum);
    if let Some(m) = given_momentum {
        if !optimizer_name.eq_ignore_ascii_case("momentum") {
            bail!(
                "--momentum {m} applies to --optimizer momentum, not {optimizer_name}\nhint: drop --momentum, or pass --optimizer momentum"
            );
        }
        if !(m.is_finite() && m >= 0.0) {
            bail!("--momentum {m} is not a momentum coefficient\nhint: pass a finite value of 0 or more, such as --momentum 0.9");
        }
    }
    let kind = optimizer_kind(&optimizer_name, given_momentum.unwrap_or(0.9))?;
    let profile = load_profile(&s.args.parallel, &s.file, &ctx)?;
    let cfg = TrainConfig {
        epochs: epochs.unwrap_or(if steps.is_some() { 0 } else { 1 }),
        max_steps: steps,
        batch_size,
        micro_batches,
        pipeline_split: pipeline_split(&s.args.parallel, &s.file)?,
        recompute: recompute(&s.args.parallel, &s.file)?,
        precision: precision(&s.args.parallel, &s.file)?,
        seed,
        shuffle: parse_bool_or(pick!(s, shuffle), true),
        prefetch: pick!(s, prefetch).unwrap_or(2),
        optimizer: OptimizerConfig {
            kind,
            schedule: LrSchedule::Constant(lr),
            weight_decay: pick!(s, weight_decay).unwrap_or(0.0),
            decay_except_norm: true,
            clip_grad_norm,
        },
        loss_scale,
        parallel: ctx,
        checkpoint: None,
        init: pick!(s, init),
        init_strategy: pick!(s, init_strategy),
        resume: pick!(s, resume),
        // The training batch by default: an evaluation pass then holds no more than a step does.
        eval_batch_size: pick!(s, eval_batch_size).unwrap_or(batch_size),
        // --verify compares the full parameters: under mpirun rank 0 receives them.
        gather_params: s.args.verify,
        profile,
    };
    if epochs == Some(0) || (cfg.epochs == 0 && steps.is_none()) {
        bail!("--epochs 0 trains nothing\nhint: pass --epochs 1 or more, or leave it out and pass --steps N");
    }
    if cfg.eval_batch_size == 0 {
        bail!("--eval-batch-size 0 evaluates nothing\nhint: pass --eval-batch-size 1 or more, or --eval false");
    }
    if steps == Some(0) {
        bail!("--steps 0 trains nothing\nhint: pass --steps 1 or more, or leave it out to train --epochs");
    }
    if s.args.verify && cfg.resume.is_some() {
        bail!(
            "--verify and --resume both given: --verify trains stand_alone from step 0 beside the run, and a resumed run starts later\nhint: verify the run that wrote the checkpoint, or a fresh run without --resume"
        );
    }
    if cfg.init.is_some() && cfg.resume.is_some() {
        bail!(
            "--init and --resume both given\nhint: --resume restores parameters, optimizer state and data position; --init only parameters"
        );
    }
    if let Some(strategy) = &cfg.init_strategy {
        if !cfg.init.as_deref().is_some_and(Path::is_dir) {
            bail!(
                "--init-strategy {} applies to a folder of per-rank checkpoints given to --init\nhint: pass --init DIR (the folder holding rank_<k>/), or drop --init-strategy",
                strategy.display()
            );
        }
    }
    Ok(cfg)
}

/// The learning-rate schedule (`--schedule`: constant, or warm-up and cosine decay over the
/// run's `total` steps, counted from `--steps` / `--epochs` and the `spe` steps of an epoch).
fn with_schedule(s: &Settings, mut cfg: TrainConfig, spe: u64) -> Result<(TrainConfig, u64)> {
    let (steps, epochs) = (pick!(s, steps), pick!(s, epochs));
    let total = match (steps, epochs) {
        (Some(st), Some(e)) => st.min(e * spe),
        (Some(st), None) => st,
        (None, e) => e.unwrap_or(1) * spe,
    };
    let schedule_name = pick!(s, schedule).unwrap_or_else(|| "constant".into());
    if schedule_name == "constant" {
        if let Some(flag) = [("--warmup-steps", pick!(s, warmup_steps).is_some()), ("--min-lr", pick!(s, min_lr).is_some())]
            .into_iter()
            .find_map(|(flag, given)| given.then_some(flag))
        {
            bail!("{flag} shapes the cosine schedule, and the learning rate is constant\nhint: add --schedule cosine, or drop {flag}");
        }
    } else {
        if schedule_name != "cosine" {
            bail!("unknown schedule {schedule_name:?}\n  valid schedules: constant, cosine\nhint: pass --schedule cosine --warmup-steps N");
        }
        cfg.optimizer.schedule = LrSchedule::WarmupCosine {
            base_lr: pick!(s, lr).unwrap_or(0.01),
            min_lr: pick!(s, min_lr).unwrap_or(0.0),
            warmup_steps: pick!(s, warmup_steps).unwrap_or(0),
            total_steps: total,
        };
    }
    Ok((cfg, total))
}

/// `--checkpoint-dir` and its companions (the files' prefix: the model's name unless given).
fn with_checkpoints(s: &Settings, mut cfg: TrainConfig, model: &str) -> Result<TrainConfig> {
    let ck_dir = pick!(s, checkpoint_dir);
    if let Some(prefix) = pick!(s, checkpoint_prefix).filter(|p| p.is_empty() || p.contains(['/', '\\']) || p == "." || p == "..") {
        bail!("--checkpoint-prefix {prefix:?} is not a file name prefix: the files go into <checkpoint-dir>/rank_<k>/<prefix>-<step>_<k>.safetensors\nhint: pass a name without slashes, such as --checkpoint-prefix mlp");
    }
    if let Some(dir) = ck_dir {
        let ck = CheckpointConfig {
            dir,
            prefix: pick!(s, checkpoint_prefix).unwrap_or_else(|| model.to_string()),
            every_steps: pick!(s, checkpoint_every).unwrap_or(0),
            keep_max: pick!(s, keep_checkpoint_max).unwrap_or(5),
        };
        // Before the banner and the metrics file: nothing is written for a run that cannot save.
        ck.check_folder()?;
        cfg.checkpoint = Some(ck);
    } else if pick!(s, checkpoint_every).is_some() || pick!(s, keep_checkpoint_max).is_some() || pick!(s, checkpoint_prefix).is_some() {
        bail!("--checkpoint-every / --keep-checkpoint-max / --checkpoint-prefix need a folder\nhint: add --checkpoint-dir DIR");
    }
    Ok(cfg)
}

/// `--report`: the plan's page of the run's job, on rank 0, with what the run measured: its
/// step times, and its memory at the last step (evaluation aside).
fn write_report(
    path: &Path,
    trainer: &Trainer,
    report: &TrainReport,
    model: &dyn Model,
    (memory, step_seconds): (&std::sync::Mutex<Vec<MemorySample>>, &std::sync::Mutex<Vec<f64>>),
) -> Result<()> {
    let cfg = trainer.config();
    let job = report.job().plan();
    let slots = cfg.optimizer.kind.state_slots();
    let mpi = autopar_comm::launch::mpi_world_size().is_some();
    let ranks = if mpi { 1 } else { cfg.parallel.devices() };
    let micro = trainer.micro_batches()?;
    let summary = super::plan::Summary {
        profile: cfg.profile.clone().unwrap_or_else(autopar_parallel::search::DeviceProfile::builtin),
        limit: super::plan::device_limit(&cfg.parallel),
        micro,
        rank: 0,
    };
    let optimizer = cfg.optimizer.kind.name();
    let facts = super::plan::Facts {
        summary,
        model,
        batch: cfg.batch_size,
        micro,
        rank: 0,
        seconds: report.job().planning_seconds(),
        optimizer,
        slots,
    };
    let last_sample = memory.lock().unwrap_or_else(|p| p.into_inner()).last().map(|m| m.peak_rss);
    let measured = Measured {
        first_step: report.first_step,
        losses: report.losses.clone(),
        step_seconds: step_seconds.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        peak_rss: last_sample.or_else(|| resident_memory().map(|(peak, _)| peak)),
        ranks_in_process: ranks,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ranks_on_host: if mpi {
            autopar_comm::launch::mpi_local_size().or(autopar_comm::launch::mpi_world_size()).unwrap_or(1)
        } else {
            ranks
        },
        plan_memory: report.plan_memory,
        overhead: autopar_runtime::budget::overhead(ranks),
        peak_rss_by_rank: report.peak_rss_by_rank.clone(),
    };
    let html = super::plan::page(job, &facts, Some(&measured), mpi)?;
    autopar_data::write_atomic(path, html.as_bytes())
        .with_context(|| format!("cannot write the report {}\nhint: check that the folder exists and is writable", path.display()))?;
    eprintln!("autopar train: wrote {}", path.display());
    Ok(())
}

/// The callbacks of rank 0 and what they write to.
struct Outputs {
    callbacks: Vec<Box<dyn Callback>>,
    /// The memory samples the probe takes.
    memory: Arc<std::sync::Mutex<Vec<MemorySample>>>,
    /// Every step's time, as the probe records it.
    step_seconds: Arc<std::sync::Mutex<Vec<f64>>>,
    /// What loss scaling did, as the probe saw it.
    scaled: Arc<std::sync::Mutex<ScaleSeen>>,
    metrics: Option<PathBuf>,
    plot: Option<PathBuf>,
}

/// Rank 0's callbacks: MindSpore's loss lines, the metrics file and its plot, the progress bar,
/// Ctrl-C, and memory at every checkpoint (else ten times over the run) and at the end.
fn callbacks(s: &Settings, cfg: &TrainConfig, total: u64, spe: u64) -> Result<Outputs> {
    let bar = super::common::progress_enabled().then(|| {
        let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("[step {pos}/{len}] {bar:16} {msg} eta {eta}").unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    });
    let log_every = pick!(s, log_every).unwrap_or(spe.clamp(1, 100));
    let to_stderr = s.args.json;
    let mut callbacks: Vec<Box<dyn Callback>> =
        vec![Box::new(LossMonitor::with_writer(log_every, Box::new(BarStdout { bar: bar.clone(), buf: Vec::new(), to_stderr })))];
    let plot = s.args.plot || s.file.plot.unwrap_or(false);
    let metrics = pick!(s, metrics);
    if plot && metrics.is_none() {
        bail!("--plot draws the loss curve beside the metrics file\nhint: add --metrics FILE");
    }
    if let Some(m) = &metrics {
        let mut w = MetricsWriter::create(m, cfg.resume.is_some())?;
        if plot {
            w = w.with_plot(MetricsWriter::plot_path(m));
        }
        callbacks.push(Box::new(w));
    }
    if let Some(b) = &bar {
        callbacks.push(Box::new(Progress { bar: b.clone() }));
    }
    callbacks.push(Box::new(StopWhenInterrupted));
    let memory = Arc::new(std::sync::Mutex::new(Vec::new()));
    let step_seconds = Arc::new(std::sync::Mutex::new(Vec::new()));
    let probe_every = cfg.checkpoint.as_ref().map_or(0, |c| c.every_steps);
    let probe_every = if probe_every > 0 { probe_every } else { (total / 10).max(1) };
    let scaled = Arc::new(std::sync::Mutex::new(ScaleSeen::default()));
    callbacks.push(Box::new(MemoryProbe {
        every: probe_every,
        samples: memory.clone(),
        step_seconds: step_seconds.clone(),
        scaled: scaled.clone(),
    }));
    let plot = metrics.as_ref().filter(|_| plot).map(|m| MetricsWriter::plot_path(m));
    Ok(Outputs { callbacks, memory, step_seconds, scaled, metrics, plot })
}

/// The run's mode in words: the parallel mode, and its pipeline or accumulated micro-batches.
fn mode_description(trainer: &Trainer) -> Result<String> {
    let parallel = &trainer.config().parallel;
    Ok(match (parallel.pipeline_stages(), trainer.micro_batches()?) {
        (p, m) if p > 1 => format!(
            "{}, {p} pipeline stages, {m} micro-batches, {}{}",
            parallel.parallel_mode().name(),
            parallel.pipeline_config().pipeline_scheduler.name(),
            if parallel.pipeline_config().pipeline_interleave { " interleaved" } else { "" }
        ),
        (_, 1) => parallel.parallel_mode().name().to_string(),
        (_, m) => format!("{}, gradients accumulated over {m} micro-batches", parallel.parallel_mode().name()),
    })
}

/// What the summary reports beyond the run's own report: the mean of the last losses, the
/// evaluation, and `--verify`'s comparison with the stand-alone reference's losses.
struct Summary {
    tail: usize,
    tail_mean: Option<f64>,
    /// None: not asked; Some(None): skipped, the data have no test split.
    eval: Option<Option<autopar_runtime::trainer::EvalResult>>,
    verify: Option<verify::Comparison>,
    reference_losses: Vec<f64>,
}

impl Summary {
    fn mismatch(&self) -> bool {
        self.verify.as_ref().is_some_and(|v| !v.within(verify::RTOL))
    }
}

/// After the run: says what it did not do, evaluates, runs `--verify`'s reference.
fn summarise(s: &Settings, trainer: &Trainer, report: &TrainReport, has_eval_data: bool, (spe, total): (u64, u64)) -> Result<Summary> {
    let run = report.last_step - report.first_step;
    // A finished run resumed (a restart loop after the last checkpoint) succeeds, and says so.
    if run == 0 {
        if let Some(dir) = &trainer.config().resume {
            eprintln!(
                "autopar train: nothing to train: the checkpoint in {} is at step {}, where this run ends (step {total})\nhint: pass --steps (or --epochs) beyond step {} to train on from it",
                dir.display(),
                report.first_step,
                report.first_step
            );
        }
    }
    let tail = &report.losses[report.losses.len().saturating_sub(spe.clamp(1, 50) as usize)..];
    let tail_mean = (!tail.is_empty()).then(|| tail.iter().sum::<f64>() / tail.len() as f64);
    let eval = match (has_eval_data, parse_bool_or(pick!(s, eval), true) && run > 0) {
        (true, true) => Some(report.eval.clone()),
        (false, true) => Some(None),
        (_, false) => None,
    };
    // With the comparison, why a mismatch may be expected: the reference's own losses.
    let (verify, reference_losses) = if s.args.verify {
        let reference = verify::stand_alone(trainer).context("the stand_alone reference run of --verify")?;
        (Some(verify::compare(report, &reference).context("--verify")?), reference.losses)
    } else {
        (None, Vec::new())
    };
    if !report.init_ignored.is_empty() {
        eprintln!(
            "--init: {} entr{} of the checkpoint are not parameters of this network and were not loaded: {}",
            report.init_ignored.len(),
            if report.init_ignored.len() == 1 { "y" } else { "ies" },
            report.init_ignored.join(", ")
        );
    }
    if !report.init_kept.is_empty() {
        eprintln!(
            "--init: the checkpoint lacks the frozen parameter{} {}, built by the network: kept as built",
            if report.init_kept.len() == 1 { "" } else { "s" },
            report.init_kept.join(", ")
        );
    }
    Ok(Summary { tail: tail.len(), tail_mean, eval, verify, reference_losses })
}

/// What the printed summary says of the run beside its report.
struct Facts<'a> {
    model: &'a dyn Model,
    data: &'a str,
    mode: String,
    devices: String,
    metrics: Option<PathBuf>,
    plot: Option<PathBuf>,
    memory: Vec<MemorySample>,
    scaled: ScaleSeen,
}

/// `--json`: the summary as one JSON object.
fn print_json(out: &mut dyn Write, trainer: &Trainer, report: &TrainReport, s: &Summary, f: &Facts<'_>, spe: u64) -> Result<ExitCode> {
    let eval_json = match &s.eval {
        Some(Some(e)) => serde_json::json!({"accuracy": e.accuracy, "loss": e.loss, "samples": e.samples, "predictions": e.predictions}),
        Some(None) => serde_json::json!("skipped: the data have no test split"),
        None => serde_json::Value::Null,
    };
    let parallel = &trainer.config().parallel;
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let summary = serde_json::json!({
        "model": f.model.name(),
        "description": f.model.describe(),
        "data": f.data,
        "devices": parallel.devices(),
        "parallel_mode": parallel.parallel_mode().name(),
        "mode": f.mode,
        "batch_size": trainer.config().batch_size,
        "steps_per_epoch": spe,
        "first_step": report.first_step,
        "last_step": report.last_step,
        "wall_seconds": report.wall_secs,
        "setup_seconds": report.setup_secs,
        "peak_rss_bytes": resident_memory().map(|(peak, _)| peak),
        "plan_memory_bytes": report.plan_memory,
        "samples_per_sec": report.samples_per_sec,
        "precision": trainer.config().precision.to_string(),
        "loss_scale": trainer.config().loss_scale.is_on().then(|| serde_json::json!({
            "choice": trainer.config().loss_scale.to_string(),
            "steps_overflowed": f.scaled.overflowed,
            "last_scale": f.scaled.last,
        })),
        "losses": report.losses,
        "loss_first": report.losses.first(),
        "loss_last": report.losses.last(),
        "loss_tail_mean": s.tail_mean,
        "eval": eval_json,
        "checkpoint": report.checkpoints.last().map(|p| p.display().to_string()),
        "checkpoints": report.checkpoints.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "strategy_file": path(&report.strategy_file),
        "metrics": path(&f.metrics),
        "plot": path(&f.plot),
        "init_ignored": report.init_ignored,
        "memory": f.memory.iter().map(|m| serde_json::json!({"step": m.step, "peak_rss_bytes": m.peak_rss, "rss_bytes": m.rss})).collect::<Vec<_>>(),
        "verify": s.verify.as_ref().map(|v| serde_json::json!({
            "loss_difference": v.loss_diff, "loss_relative": v.loss_rel,
            "parameter_difference": v.param_diff, "parameter_relative": v.param_rel, "parameter": v.param,
            "parameter_normwise_relative": v.norm_rel, "parameter_normwise": v.norm_param,
            "tolerance": verify::RTOL, "ok": v.within(verify::RTOL),
        })),
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&summary).map_err(|e| anyhow!("cannot print the summary as JSON: {e}"))?)?;
    Ok(if s.mismatch() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The summary's line on mixed precision and loss scaling (nothing without either), and a
/// warning when every step overflowed.
fn precision_text(out: &mut dyn Write, cfg: &TrainConfig, seen: &ScaleSeen) -> Result<()> {
    let mut parts = Vec::new();
    if cfg.precision.is_mixed() {
        parts.push(format!("precision {}", cfg.precision));
    }
    if cfg.loss_scale.is_on() {
        let what =
            if matches!(cfg.loss_scale, LossScale::Fixed { drop_overflow_update: false, .. }) { "applied anyway" } else { "skipped" };
        let last = seen.last.map_or(String::new(), |s| format!(", last scale {s:e}"));
        parts.push(format!("loss scale {}: {} of {} steps overflowed ({what}){last}", cfg.loss_scale, seen.overflowed, seen.steps));
    }
    if !parts.is_empty() {
        writeln!(out, "  {}", parts.join("; "))?;
    }
    if seen.steps > 0 && seen.overflowed == seen.steps {
        writeln!(
            out,
            "  warning: every step's gradients overflowed\n  hint: start the loss scale lower (--loss-scale dynamic:65536), or train longer: a dynamic scale falls by its factor at each overflow"
        )?;
    }
    Ok(())
}

/// The summary as text: steps and speed, losses, evaluation, memory, files, `--verify`.
fn print_text(out: &mut dyn Write, trainer: &Trainer, report: &TrainReport, s: &Summary, f: &Facts<'_>) -> Result<ExitCode> {
    let run = report.last_step - report.first_step;
    writeln!(
        out,
        "trained {} for {} (step {} to {}) in {:.1} s after {:.1} s of setup, on {}: {:.1} samples/s",
        f.model.name(),
        if run == 1 { "1 step".to_string() } else { format!("{run} steps") },
        report.first_step,
        report.last_step,
        report.wall_secs,
        report.setup_secs,
        f.devices,
        report.samples_per_sec
    )?;
    if let (Some(first), Some(last), Some(mean)) = (report.losses.first(), report.losses.last(), s.tail_mean) {
        writeln!(out, "  loss {first:.4} at the first step, {last:.4} at the last (mean of the last {} steps {mean:.4})", s.tail)?;
    }
    precision_text(out, trainer.config(), &f.scaled)?;
    let plan = &report.job().plan().plan;
    let recomputed = plan.graph.nodes().iter().filter(|n| n.recompute == autopar_graph::Recompute::Marked).count();
    if recomputed > 0 {
        let why = match plan.search.as_ref().and_then(|r| r.levers.as_ref()).filter(|c| !c.blocks.is_empty()) {
            Some(c) => format!(
                ", {} of {} blocks: auto_parallel's choice, as without it {}",
                c.blocks.len(),
                c.of_blocks,
                c.without.lines().next().unwrap_or_default()
            ),
            None => String::new(),
        };
        writeln!(
            out,
            "  recomputation: {recomputed} ops recomputed in the backward pass{why} (`autopar plan` shows each region's saving and cost)"
        )?;
    }
    if let Some(c) = plan.search.as_ref().and_then(|r| r.levers.as_ref()) {
        if let Some(level) = c.optimizer_level {
            writeln!(
                out,
                "  parallel optimizer: {}, auto_parallel's choice, as without it {}",
                level.name(),
                c.without.lines().next().unwrap_or_default()
            )?;
        }
    }
    match &s.eval {
        Some(Some(e)) => writeln!(
            out,
            "  eval: accuracy {:.2}% loss {:.4} on {} samples ({} predictions)",
            e.accuracy * 100.0,
            e.loss,
            e.samples,
            e.predictions
        )?,
        Some(None) => writeln!(out, "  eval: skipped (the data have no test split)")?,
        None => {}
    }
    if let Some((peak, _)) = resident_memory() {
        // Under mpirun this process runs one rank.
        let ranks = if autopar_comm::launch::mpi_world_size().is_some() { 1 } else { trainer.config().parallel.devices() };
        let overhead = autopar_runtime::budget::overhead(ranks);
        writeln!(
            out,
            "  memory: peak RSS {:.1} MiB since the process started; the plan: {:.1} MiB for its {ranks} rank(s), {:.1} MiB with the runtime's overhead",
            mib(peak),
            mib(report.plan_memory),
            mib(report.plan_memory + overhead)
        )?;
    }
    match (f.memory.first(), f.memory.last()) {
        (Some(a), Some(b)) if a.step != b.step => writeln!(
            out,
            "  memory: peak RSS {:.1} MiB at step {}, {:.1} MiB at step {} (resident {:.1} -> {:.1} MiB)",
            mib(a.peak_rss),
            a.step,
            mib(b.peak_rss),
            b.step,
            mib(a.rss),
            mib(b.rss)
        )?,
        (Some(a), _) => writeln!(out, "  memory: peak RSS {:.1} MiB at step {}", mib(a.peak_rss), a.step)?,
        _ => {}
    }
    if let Some(last) = report.checkpoints.last() {
        writeln!(out, "  checkpoint: {}", last.display())?;
    }
    if let Some(sf) = &report.strategy_file {
        writeln!(out, "  strategy file: {}", sf.display())?;
    }
    if let Some(m) = &f.metrics {
        write!(out, "  metrics: {}", m.display())?;
        if let Some(p) = &f.plot {
            write!(out, " (loss curve: {})", p.display())?;
        }
        writeln!(out)?;
    }
    let Some(v) = &s.verify else { return Ok(ExitCode::SUCCESS) };
    writeln!(out, "  verify: beside stand_alone on the same data, {v}")?;
    if !s.mismatch() {
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "  verify: MISMATCH above a relative {:e}", verify::RTOL)?;
    let ctx = &trainer.config().parallel;
    if ctx.gradients_mean() && ctx.parallel_mode().is_auto() {
        writeln!(
            out,
            "  verify: note: gradients_mean=true under {} divides each gradient by its mirror group (as MindSpore does), so the run differs from stand-alone by design",
            ctx.parallel_mode().name()
        )?;
    }
    if let (Some(first), Some(last)) = (s.reference_losses.first(), s.reference_losses.last()) {
        if !last.is_finite() || *last > 1.5 * first {
            writeln!(
                out,
                "  verify: note: the stand-alone reference diverged too (loss {first:.4} at the first step, {last:.4} at the last): a diverging run amplifies rounding; try a smaller --lr"
            )?;
        }
    }
    Ok(ExitCode::from(1))
}
