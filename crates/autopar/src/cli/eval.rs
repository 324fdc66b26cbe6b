//! `autopar eval` and `autopar predict`: a checkpoint (a file of whole tensors, or a run's
//! folder of per-rank files with its `strategy.json`) run forward on a data set, on one device
//! or `--devices N` ranks (in process, or one per process under mpirun): each rank reads only
//! its own pieces of the files and runs its part of an inference job planned for the batch size.
//! `eval` prints accuracy and mean loss; `predict` also writes every sample's logits and
//! predicted class to a safetensors file.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use autopar_runtime::trainer::EvalResult;
use clap::Args;

use super::common::{ModelArgs, ParallelArgs};
use super::train::{inference_trainer, TrainArgs};

/// Evaluate a checkpoint: `autopar eval CKPT --model mlp --data synthetic --devices 4`.
#[derive(Args, Debug, Default)]
#[command(allow_negative_numbers = true)]
pub struct EvalArgs {
    /// The checkpoint: a file of whole tensors, or a folder of per-rank checkpoints (rank_0,
    /// rank_1, ...) saved under any strategy and device count, with strategy.json beside them
    /// (or --ckpt-strategy).
    #[arg(value_name = "CHECKPOINT|DIR")]
    checkpoint: PathBuf,
    /// The strategy file the per-rank checkpoints were saved under (default: strategy.json in the folder).
    #[arg(long, value_name = "FILE", help_heading = "Checkpoints")]
    ckpt_strategy: Option<PathBuf>,
    /// Read model, data and parallel settings from the run's TOML file (flags given here override it).
    #[arg(long, value_name = "FILE", help_heading = "Run")]
    config: Option<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    parallel: ParallelArgs,
    /// Data: a CIFAR-10 binary folder or MNIST folder (its test split), a .safetensors file
    /// (x, y; a folder's test.safetensors), or `synthetic` (the samples `train` holds out).
    #[arg(long, value_name = "PATH|synthetic", help_heading = "Data")]
    data: Option<String>,
    /// Samples of synthetic training data whose held-out tenth is evaluated (as `train`'s).
    #[arg(long, help_heading = "Data")]
    synthetic_samples: Option<usize>,
    /// Seed of the synthetic data and of the parameters a checkpoint lacks (frozen constants).
    #[arg(long, help_heading = "Run")]
    seed: Option<u64>,
    /// Samples per batch (default: 32, or the device count when it does not divide 32).
    #[arg(long, help_heading = "Run")]
    batch_size: Option<usize>,
    /// Print the result as one JSON object.
    #[arg(long, help_heading = "Output")]
    json: bool,
}

/// Write a checkpoint's predictions: `autopar predict CKPT --model mlp --data synthetic --output preds.safetensors`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct PredictArgs {
    #[command(flatten)]
    eval: EvalArgs,
    /// Where to write the logits (`logits`, [samples, classes]; a gpt's [samples x context,
    /// vocabulary]) and the predicted classes (`predicted_class`, i64), as safetensors.
    #[arg(long, value_name = "FILE.safetensors", help_heading = "Output")]
    output: PathBuf,
}

impl EvalArgs {
    /// The training arguments of the inference job; flags that only training reads are refused.
    fn into_train_args(self) -> Result<TrainArgs> {
        if let Some(names) = &self.parallel.recompute {
            anyhow::bail!(
                "--recompute {} chooses what a training step's backward pass recomputes; evaluation and prediction run no backward pass\nhint: drop --recompute",
                names.join(",")
            );
        }
        let mut t = TrainArgs::default();
        t.config = self.config;
        t.model = self.model;
        t.parallel = self.parallel;
        t.data = self.data;
        t.synthetic_samples = self.synthetic_samples;
        t.seed = self.seed;
        t.batch_size = self.batch_size;
        t.eval_batch_size = self.batch_size;
        t.prefetch = Some(0);
        Ok(t)
    }
}

fn print_result(out: &mut dyn Write, json: bool, what: &str, r: &EvalResult, extra: Option<&PathBuf>) -> Result<()> {
    if json {
        let mut v = serde_json::json!({
            "checkpoint": what, "accuracy": r.accuracy, "loss": r.loss, "samples": r.samples, "predictions": r.predictions,
        });
        if let Some(p) = extra {
            v["output"] = serde_json::json!(p.display().to_string());
        }
        if !r.made_from_init.is_empty() {
            v["made_from_init"] = serde_json::json!(r.made_from_init);
        }
        writeln!(out, "{v}")?;
    } else {
        writeln!(
            out,
            "eval: accuracy {:.2}% loss {:.4} on {} samples ({} predictions)",
            100.0 * r.accuracy,
            r.loss,
            r.samples,
            r.predictions
        )?;
        if let Some(p) = extra {
            writeln!(out, "predictions written to {}", p.display())?;
        }
        if !r.made_from_init.is_empty() {
            writeln!(
                out,
                "the checkpoint lacks the frozen parameter{} {}: made from {} initialiser{} (--seed)",
                if r.made_from_init.len() == 1 { "" } else { "s" },
                r.made_from_init.join(", "),
                if r.made_from_init.len() == 1 { "its" } else { "their" },
                if r.made_from_init.len() == 1 { "" } else { "s" },
            )?;
        }
    }
    Ok(())
}

/// Runs `autopar eval`.
pub fn run_eval(args: EvalArgs, out: &mut dyn Write) -> Result<ExitCode> {
    let (path, json, strategy) = (args.checkpoint.clone(), args.json, args.ckpt_strategy.clone());
    let (mut trainer, data, desc) = inference_trainer(args.into_train_args()?, &path)?;
    trainer.config_mut().init_strategy = strategy;
    let quiet = autopar_comm::launch::mpi_rank().is_some_and(|r| r != 0);
    if !quiet && !json {
        eprintln!("autopar eval: {} on {desc}, {} device(s)", path.display(), trainer.config().parallel.devices());
    }
    let r = trainer.evaluate_checkpoint(&path, &data)?;
    if !quiet {
        print_result(out, json, &path.display().to_string(), &r, None)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `autopar predict`.
pub fn run_predict(args: PredictArgs, out: &mut dyn Write) -> Result<ExitCode> {
    if autopar_checkpoint::Format::of_path(&args.output) != Some(autopar_checkpoint::Format::Safetensors) {
        anyhow::bail!("--output {} is not a .safetensors file\nhint: pass --output preds.safetensors", args.output.display());
    }
    let (path, json, output, strategy) = (args.eval.checkpoint.clone(), args.eval.json, args.output, args.eval.ckpt_strategy.clone());
    let (mut trainer, data, desc) = inference_trainer(args.eval.into_train_args()?, &path)?;
    trainer.config_mut().init_strategy = strategy;
    if autopar_comm::launch::mpi_rank().is_none_or(|r| r == 0) && !json {
        eprintln!("autopar predict: {} on {desc}, {} device(s)", path.display(), trainer.config().parallel.devices());
    }
    let r = trainer.predict_checkpoint(&path, &data, &output)?;
    if autopar_comm::launch::mpi_rank().is_some_and(|r| r != 0) {
        return Ok(ExitCode::SUCCESS);
    }
    print_result(out, json, &path.display().to_string(), &r, Some(&output))?;
    Ok(ExitCode::SUCCESS)
}
