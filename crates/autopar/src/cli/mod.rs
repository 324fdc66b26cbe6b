//! The `autopar` command line, as a library: the binary parses [`Cli`] and calls [`run`]; the
//! Python package calls [`parse_args`] and [`run`] with the keyword arguments of `autopar.plan` / `autopar.train`
//! turned into flags. One module per subcommand, each exposing its clap `Args` and a `run`
//! returning the exit code. Results go to the given writer (plan reports, train summaries) or
//! stdout, progress and errors to stderr. Exit codes: 0 success, 1 a "no" answer (e.g. a
//! verification found a mismatch), 2 an error.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod calibrate;
pub mod ckpt;
pub mod common;
pub mod eval;
pub mod launch;
pub mod layout;
pub mod plan;
pub mod train;

/// The version, with whether this build runs under mpirun (`autopar launch` checks it).
pub const VERSION: &str =
    if cfg!(feature = "mpi") { concat!(env!("CARGO_PKG_VERSION"), " (mpi)") } else { concat!(env!("CARGO_PKG_VERSION"), " (no mpi)") };

/// autopar: distributed, automatically parallel deep-learning training.
///
/// Write a model once, say how it is split across devices (or let autopar find the split), and
/// run it on 1 to 4096 devices with the same numbers as on one device.
#[derive(Parser, Debug)]
#[command(name = "autopar", version = VERSION, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
    /// Log what autopar does on stderr: -v what was planned and each rank's milestones, -vv every
    /// step of every rank with timings, -vvv everything (AUTOPAR_LOG=FILTER overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

/// The subcommands of `autopar`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show how a tensor is split: each rank's slice and replica group, or a strategy's layouts,
    /// or the redistribution plan between two layouts.
    Layout(layout::LayoutArgs),
    /// Distributed checkpoints and strategy files: inspect, merge pipeline strategies, list the
    /// source ranks a destination rank needs, transform checkpoints between strategies.
    Ckpt(ckpt::CkptArgs),
    /// Start a job of N processes through OpenMPI's mpirun (one rank each, across hosts with
    /// --hostfile); says how to install OpenMPI when it is missing.
    Launch(launch::LaunchArgs),
    /// Train a model (mlp, resnet18/34/50, gpt, llama, moe) on CIFAR-10, MNIST, a tensor file or synthetic
    /// data, on one device or --devices N; checkpoints, resume, metrics, evaluation.
    Train(Box<train::TrainArgs>),
    /// Evaluate a checkpoint (a file, or a run's folder of per-rank files) on a data set, on one
    /// device or --devices N, each rank reading only its own pieces: accuracy and mean loss.
    Eval(Box<eval::EvalArgs>),
    /// Run a checkpoint on a data set like `eval` and write every sample's logits and predicted
    /// class to a safetensors file.
    Predict(Box<eval::PredictArgs>),
    /// Plan a job without training it: every op's strategy and its source, layouts,
    /// redistributions, gradient buckets, communication per step and memory per device.
    Plan(Box<plan::PlanArgs>),
    /// Measure this machine's compute rate, memory bandwidth and collective latency and
    /// bandwidth: the device profile of auto_parallel's cost model (TOML).
    Calibrate(calibrate::CalibrateArgs),
}

/// Run one parsed command line; `plan` and `train` write their report to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    crate::logging::init(cli.verbose).map_err(|e| anyhow::anyhow!(e))?;
    match cli.command {
        Command::Layout(args) => layout::run(args),
        Command::Ckpt(args) => ckpt::run(args),
        Command::Launch(args) => launch::run(args),
        Command::Train(args) => train::run(*args, out),
        Command::Plan(args) => plan::run(*args, out),
        Command::Eval(args) => eval::run_eval(*args, out),
        Command::Predict(args) => eval::run_predict(*args, out),
        Command::Calibrate(args) => calibrate::run(args),
    }
}

/// Parse `words` (what follows `autopar` on a command line) without exiting the process: a
/// bad flag is clap's message, usage and hint included.
pub fn parse_args<I, S>(words: I) -> Result<Cli, String>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let argv = std::iter::once(std::ffi::OsString::from("autopar")).chain(words.into_iter().map(Into::into));
    Cli::try_parse_from(argv).map_err(|e| e.render().to_string().trim_end().to_string())
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks a running `train` to stop after its current step, with an error saying so (what the
/// Python package does on Ctrl-C; the binary stops on the signal itself).
pub fn interrupt() {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Forgets an earlier [`interrupt`] (before a command starts).
pub fn clear_interrupt() {
    INTERRUPTED.store(false, std::sync::atomic::Ordering::SeqCst);
}

/// Whether [`interrupt`] was called since [`clear_interrupt`].
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// An error as the command line shows it: `autopar: <first line>` followed by indented facts,
/// hints and causes; the error of a failed rank as `autopar[RANK]: ...`. A cause whose text the
/// lines above already hold (a wrapper that prints its source, a rank's error and the error
/// itself) is left out, and so is a hint already given.
pub fn error_text(err: &anyhow::Error) -> String {
    let (prefix, text) = match err.downcast_ref::<autopar_runtime::TrainError>() {
        Some(autopar_runtime::TrainError::Rank { rank, source }) => (format!("autopar[{rank}]"), source.to_string()),
        _ => ("autopar".to_string(), format!("{err}")),
    };
    let mut out = String::new();
    let mut hints: Vec<String> = Vec::new();
    let mut hint_or_fact = |out: &mut String, line: &str, indent: &str| {
        let line = as_flags(line.trim_start());
        let line = line.as_str();
        if line.starts_with("hint:") {
            if !hints.iter().any(|h| h == line) {
                hints.push(line.to_string());
                out.push_str(&format!("{line}\n"));
            }
        } else {
            out.push_str(&format!("{indent}{line}\n"));
        }
    };
    let mut lines = text.lines();
    if let Some(first) = lines.next() {
        out.push_str(&format!("{prefix}: {}\n", as_flags(first)));
    }
    for line in lines {
        hint_or_fact(&mut out, line, "  ");
    }
    let mut shown = vec![text];
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if cause.trim().is_empty() || shown.iter().any(|s| s.contains(cause.trim())) {
            continue;
        }
        let mut lines = cause.lines();
        if let Some(first) = lines.next() {
            out.push_str(&format!("  caused by: {}\n", as_flags(first)));
        }
        for line in lines {
            hint_or_fact(&mut out, line, "    ");
        }
        shown.push(cause);
    }
    out
}

/// The command line's flags for the options a library message names in backticks: `name` or
/// `name=value`, a training setting (`batch_size` -> `--batch-size`, `device_num=N` ->
/// `--devices N`) or a parallel option (`pipeline_stages=P` -> `--parallel pipeline_stages=P`);
/// other backticked text is left as it is.
pub fn as_flags(line: &str) -> String {
    const FLAGS: &[(&str, &str)] = &[
        ("batch_size", "--batch-size"),
        ("micro_batches", "--micro-batches"),
        ("pipeline_split", "--pipeline-split"),
        ("device_num", "--devices"),
        ("parallel_mode", "--parallel-mode"),
        ("strategy_ckpt_config.load_file", "--strategy"),
        ("init", "--init"),
        ("init_strategy", "--init-strategy"),
        ("resume", "--resume"),
        ("checkpoint_dir", "--checkpoint-dir"),
        ("model", "--model"),
        ("width", "--width"),
        ("depth", "--depth"),
        ("heads", "--heads"),
        ("kv_heads", "--kv-heads"),
        ("ffn_width", "--ffn-width"),
        ("rope_theta", "--rope-theta"),
        ("rms_eps", "--rms-eps"),
        ("tie_embeddings", "--tie-embeddings"),
        ("experts", "--experts"),
        ("top_k", "--top-k"),
        ("aux_loss_coef", "--aux-loss-coef"),
        ("capacity_factor", "--capacity-factor"),
        ("num_classes", "--num-classes"),
        ("input_shape", "--input-shape"),
        ("data", "--data"),
        ("lr", "--lr"),
        ("min_lr", "--min-lr"),
        ("seed", "--seed"),
        ("optimizer", "--optimizer"),
        ("clip_grad_norm", "--clip-grad-norm"),
        ("loss_scale", "--loss-scale"),
        ("profile", "--profile"),
        ("src_strategy", "--src-strategy"),
        ("dst_strategy", "--dst-strategy"),
        ("strict", "--strict"),
    ];
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let Some(len) = rest[open + 1..].find('`') else { break };
        let token = &rest[open + 1..open + 1 + len];
        let (name, value) = match token.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (token, None),
        };
        let top = name.split('.').next().unwrap_or(name);
        let parallel = autopar_parallel::OPTION_NAMES.contains(&top) || autopar_parallel::SEARCH_OPTION_NAMES.contains(&top);
        let flag = match (FLAGS.iter().find(|(n, _)| *n == name), value) {
            (Some((_, flag)), Some(v)) => Some(format!("{flag} {v}")),
            (Some((_, flag)), None) => Some(flag.to_string()),
            (None, Some(v)) if parallel && v.contains([' ', '[', '{', '"', '\'']) => {
                Some(format!("--parallel '{name}={}'", v.replace('\'', "'\\''")))
            }
            (None, Some(v)) if parallel => Some(format!("--parallel {name}={v}")),
            (None, None) if parallel => Some(format!("--parallel {name}")),
            _ => None,
        };
        out.push_str(&rest[..open]);
        match flag {
            Some(f) => out.push_str(&f),
            None => out.push_str(&rest[open..open + len + 2]),
        }
        rest = &rest[open + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Print [`error_text`] on stderr.
pub fn report_error(err: &anyhow::Error) {
    // Not `eprint!`: a closed stderr (`autopar train 2>&1 | head -1`) must not turn an error
    // into a panic.
    use std::io::Write;
    let _ = write!(std::io::stderr(), "{}", error_text(err));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_option_names_become_the_command_lines_flags() {
        assert_eq!(
            as_flags("hint: pick `batch_size` a multiple of `micro_batches`"),
            "hint: pick --batch-size a multiple of --micro-batches"
        );
        assert_eq!(
            as_flags("pass `device_num=N` or `init=DIR` `init_strategy=FILE`"),
            "pass --devices N or --init DIR --init-strategy FILE"
        );
        assert_eq!(
            as_flags("set `pipeline_stages=P`, or drop `pipeline_split`"),
            "set --parallel pipeline_stages=P, or drop --pipeline-split"
        );
        assert_eq!(as_flags("e.g. `dataset_strategy=[[8, 1], [8]]`"), "e.g. --parallel 'dataset_strategy=[[8, 1], [8]]'");
        assert_eq!(
            as_flags("`search_mode='x y'`"),
            r#"--parallel 'search_mode='\''x y'\'''"#,
            "a quote in a value is escaped for the shell"
        );
        assert_eq!(
            as_flags("drop `global_rank`; `fully_use_devices=true`"),
            "drop --parallel global_rank; --parallel fully_use_devices=true"
        );
        // Anything else in backticks stays as written; an unclosed backtick too.
        assert_eq!(as_flags("as `autopar plan` lists them, `x"), "as `autopar plan` lists them, `x");
    }
}
