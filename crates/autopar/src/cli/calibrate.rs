//! `autopar calibrate`: measure the constants of auto_parallel's cost model on this machine
//! and write them as a device profile (TOML) for `autopar plan --profile` and
//! `autopar train --profile`: one simulated device's matrix-product rate and memory bandwidth
//! (one thread, as each simulated device runs), and the latency and bandwidth of an all-reduce
//! over groups of 2, 4, ... ranks of the in-process communicator.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use autopar_comm::{Communicator, LocalComm, ReduceOp};
use autopar_parallel::search::{DeviceProfile, Link};
use autopar_tensor::{ExecCtx, Tensor};
use clap::Args;

/// The flags of `autopar calibrate`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    autopar calibrate --out machine.toml\n  \
    autopar plan --model gpt --devices 8 --parallel-mode auto_parallel --profile machine.toml")]
pub struct CalibrateArgs {
    /// Write the profile to this file (default: print it).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Largest group measured (a power of two, 2 to 64; larger groups cost what the largest
    /// measured one does, per byte and per call).
    #[arg(long, default_value_t = 8, value_name = "N")]
    max_ranks: usize,
    /// Fewer repetitions (a rough profile in about a second).
    #[arg(long)]
    quick: bool,
}

/// The largest group `--max-ranks` may ask for.
const MAX_RANKS: usize = 64;

/// The median of `reps` timings of `f`, in seconds.
fn median(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Runs `autopar calibrate`: measures this machine and writes (or prints) its device profile.
pub fn run(args: CalibrateArgs) -> Result<ExitCode> {
    if !(2..=MAX_RANKS).contains(&args.max_ranks) || !args.max_ranks.is_power_of_two() {
        bail!(
            "invalid --max-ranks {}: a power of two from 2 to {MAX_RANKS} is expected (each simulated rank of a group holds a 4 MiB buffer; larger groups cost what the largest measured one does)\nhint: pass --max-ranks 8",
            args.max_ranks
        );
    }
    let reps = if args.quick { 3 } else { 11 };
    // Matrix products on one thread.
    let n = 256usize;
    let a = Tensor::from_vec(&[n, n], (0..n * n).map(|i| (i % 7) as f32 * 0.1).collect::<Vec<f32>>())?;
    let b = Tensor::from_vec(&[n, n], (0..n * n).map(|i| (i % 5) as f32 * 0.1).collect::<Vec<f32>>())?;
    let ctx = ExecCtx::serial();
    let t = median(reps, || {
        autopar_tensor::kernels::matmul::matmul(&ctx, &a, &b, false, false)?;
        Ok(())
    })?;
    let flops_per_s = 2.0 * (n * n * n) as f64 / t;
    // Memory: a copy reads and writes every byte.
    let src = vec![1.0f32; 8 << 20];
    let mut dst = vec![0.0f32; 8 << 20];
    let t = median(reps, || {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        Ok(())
    })?;
    let memory_bytes_per_s = 2.0 * (src.len() * 4) as f64 / t;
    // All-reduce latency (one value) and bandwidth (1M values) per group size.
    let mut links = Vec::new();
    let mut ranks = 2;
    while ranks <= args.max_ranks {
        let (small, big) = (1usize, 1usize << 20);
        let times = LocalComm::run(ranks, |c| -> Result<(f64, f64)> {
            let mut one = vec![1.0f32; small];
            let mut many = vec![1.0f32; big];
            let lat = median(reps * 5, || {
                c.all_reduce((&mut one[..]).into(), ReduceOp::Sum)?;
                Ok(())
            })?;
            let bw = median(reps, || {
                c.all_reduce((&mut many[..]).into(), ReduceOp::Sum)?;
                Ok(())
            })?;
            Ok((lat, bw))
        })
        .with_context(|| format!("measuring all-reduce over {ranks} ranks"))?;
        let (lat, bw) = times[0];
        let sent = (2 * big * 4 * (ranks - 1)).div_ceil(ranks) as f64;
        links.push(Link { ranks, latency_s: lat, seconds_per_byte: ((bw - lat) / sent).max(0.0) });
        ranks *= 2;
    }
    let host = std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "this machine".into());
    let profile = DeviceProfile { name: format!("calibrated on {host} (in-process devices)"), flops_per_s, memory_bytes_per_s, links };
    profile.validate("the measured profile")?;
    let text = profile.to_toml();
    match &args.out {
        Some(path) => {
            autopar_data::write_atomic(path, text.as_bytes())
                .with_context(|| format!("cannot write {}\nhint: check that the folder exists and is writable", path.display()))?;
            eprintln!("autopar calibrate: wrote {}", path.display());
        }
        None => std::io::stdout().lock().write_all(text.as_bytes())?,
    }
    Ok(ExitCode::SUCCESS)
}
