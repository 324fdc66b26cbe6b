//! The `autopar` command line. Results go to stdout, progress and errors to stderr.
//! Exit codes: 0 success, 1 a "no" answer (e.g. a verification found a mismatch), 2 an error.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// The version, with whether this build runs under mpirun (`autopar launch` checks it).
const VERSION: &str =
    if cfg!(feature = "mpi") { concat!(env!("CARGO_PKG_VERSION"), " (mpi)") } else { concat!(env!("CARGO_PKG_VERSION"), " (no mpi)") };

/// autopar: distributed, automatically parallel deep-learning training.
///
/// Write a model once, say how it is split across devices (or let autopar find the split), and
/// run it on 1 to 4096 devices with the same numbers as on one device.
#[derive(Parser, Debug)]
#[command(name = "autopar", version = VERSION, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show how a tensor is split: each rank's slice and replica group, or a strategy's layouts,
    /// or the redistribution plan between two layouts.
    Layout(cli::layout::LayoutArgs),
    /// Distributed checkpoints and strategy files: inspect, merge pipeline strategies, list the
    /// source ranks a destination rank needs, transform checkpoints between strategies.
    Ckpt(cli::ckpt::CkptArgs),
    /// Start a job of N processes through OpenMPI's mpirun (one rank each, across hosts with
    /// --hostfile); says how to install OpenMPI when it is missing.
    Launch(cli::launch::LaunchArgs),
    /// Train a model (mlp, resnet18/34/50, gpt) on CIFAR-10, MNIST, a tensor file or synthetic
    /// data, on one device or --devices N; checkpoints, resume, metrics, evaluation.
    Train(Box<cli::train::TrainArgs>),
    /// Plan a job without training it: every op's strategy and its source, layouts,
    /// redistributions, gradient buckets, communication per step and memory per device.
    Plan(Box<cli::plan::PlanArgs>),
    /// Measure this machine's compute rate, memory bandwidth and collective latency and
    /// bandwidth: the device profile of auto_parallel's cost model (TOML).
    Calibrate(cli::calibrate::CalibrateArgs),
}

/// Commands whose output is read through pipes (`autopar ckpt inspect F | head`) end quietly
/// when the reader goes away, as other Unix tools do, instead of failing on the broken pipe.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Layout(_) | Command::Ckpt(_) | Command::Plan(_)) {
        quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Layout(args) => cli::layout::run(args),
        Command::Ckpt(args) => cli::ckpt::run(args),
        Command::Launch(args) => cli::launch::run(args),
        Command::Train(args) => cli::train::run(*args),
        Command::Plan(args) => cli::plan::run(*args),
        Command::Calibrate(args) => cli::calibrate::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            cli::report_error(&err);
            ExitCode::from(2)
        }
    }
}
