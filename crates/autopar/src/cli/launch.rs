//! `autopar launch`: start a multi-process (and multi-host) job through OpenMPI's `mpirun`.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use autopar_comm::launch::{mpirun_args, mpirun_command, LaunchSpec};
use clap::Args;

/// The flags of `autopar launch`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    autopar launch -n 4 -- autopar train --config gpt.toml\n  \
    autopar launch -n 16 --hostfile hosts.txt -- ./train_job --steps 1000\n  \
    autopar launch -n 8 --dry-run -- ./train_job\n\n\
    A hostfile lists the hosts and how many ranks each runs (same program path on every host):\n  \
    node1 slots=8\n  \
    node2 slots=8\n\n\
    Needs OpenMPI: apt-get install openmpi-bin libopenmpi-dev")]
pub struct LaunchArgs {
    /// Number of processes (ranks) to start.
    #[arg(short = 'n', long = "ranks", value_name = "N")]
    ranks: usize,
    /// OpenMPI hostfile for a job across hosts (lines like `node1 slots=8`).
    #[arg(long, value_name = "FILE")]
    hostfile: Option<PathBuf>,
    /// Extra argument passed to mpirun, repeatable (e.g. --mpirun-arg=--bind-to --mpirun-arg=none).
    #[arg(long = "mpirun-arg", value_name = "ARG", allow_hyphen_values = true)]
    mpirun_arg: Vec<String>,
    /// Print the mpirun command line instead of running it.
    #[arg(long)]
    dry_run: bool,
    /// The program every rank runs, with its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn quote(s: &OsString) -> String {
    let s = s.to_string_lossy();
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c)) {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// When the program is an autopar binary (its file name starts with `autopar`), it must be built
/// with MPI support: without it every process would run the whole job on its own (N duplicate
/// jobs). Other programs are not started; an autopar binary that does not answer `--version`
/// within a few seconds passes unchecked.
fn check_autopar_build(program: &OsString, ranks: usize) -> Result<()> {
    let named_autopar = Path::new(program).file_name().is_some_and(|f| f.to_string_lossy().starts_with("autopar"));
    if !named_autopar {
        return Ok(());
    }
    let Some(version) = version_of(program, Duration::from_secs(10)) else { return Ok(()) };
    if version.starts_with("autopar ") && !version.contains("(mpi)") {
        bail!(
            "{} was built without MPI support\n  under mpirun each of the {ranks} processes would run the whole job on its own\nhint: build it with MPI: cargo build --release --features mpi (needs libopenmpi-dev and libclang-dev)",
            program.to_string_lossy()
        );
    }
    Ok(())
}

/// What `program --version` prints, if it answers within `limit`.
fn version_of(program: &OsString, limit: Duration) -> Option<String> {
    let mut child =
        Command::new(program).arg("--version").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().ok()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Runs `autopar launch`: starts the command under mpirun.
pub fn run(args: LaunchArgs) -> Result<ExitCode> {
    if args.ranks == 0 {
        bail!("invalid number of ranks: 0\nhint: pass -n N with N >= 1, e.g. autopar launch -n 4 -- <command>");
    }
    if let Some(h) = &args.hostfile {
        if !h.is_file() {
            bail!(
                "hostfile \"{}\" {}\n  expected a file listing one host per line, e.g. `node1 slots=8`\nhint: create it, or drop --hostfile to run on this machine",
                h.display(),
                if h.is_dir() { "is a directory" } else { "not found" }
            );
        }
    }
    let spec = LaunchSpec {
        ranks: args.ranks,
        hostfile: args.hostfile.clone(),
        mpirun_args: args.mpirun_arg.iter().map(OsString::from).collect(),
        command: args.command.clone(),
    };
    if args.dry_run {
        let line: Vec<String> = std::iter::once("mpirun".to_string()).chain(mpirun_args(&spec)?.iter().map(quote)).collect();
        println!("{}", line.join(" "));
        return Ok(ExitCode::SUCCESS);
    }
    check_autopar_build(&args.command[0], args.ranks)?;
    let mut cmd = mpirun_command(&spec)?;
    let status = cmd.status().with_context(|| format!("could not start {}", cmd.get_program().to_string_lossy()))?;
    if status.success() {
        return Ok(ExitCode::SUCCESS);
    }
    let how = match status.code() {
        Some(c) => format!("mpirun exited with status {c}"),
        None => "mpirun was killed by a signal".to_string(),
    };
    bail!(
        "the job of {} ranks failed\n  {how}\n  command: {}\nhint: the failing rank's own message is above (autopar[RANK]: ...)",
        args.ranks,
        args.command.iter().map(quote).collect::<Vec<_>>().join(" ")
    );
}
