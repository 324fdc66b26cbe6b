//! autopar beside PyTorch on the same work, interleaved round by round, PyTorch at its defaults
//! (only its thread count set where a row names one). One table: each side's median and the
//! median of the per-round ratios, time(autopar) / time(PyTorch) (below 1: autopar is faster).
//!
//! Rows: the README's quick-start job (the exact command README.md shows; PyTorch does the same
//! job in one process, `benches/peers/quickstart_torch.py`: same data recipe, model, optimizer,
//! schedule, evaluation and checkpoint; its time is measured inside the script, so Python's
//! start-up and `import torch` are not counted against it), the same job on one device, and the
//! MLP 784-512-512-10 training step at batch 64 and 256 on 1 and 2 threads.
//!
//! `AUTOPAR_BENCH_PYTHON=/path/to/python cargo bench -p autopar --bench versus`
//! (a Python with torch; without it the PyTorch columns say n/a). `AUTOPAR_BENCH_ROUNDS` (3),
//! `AUTOPAR_BENCH_SECONDS` per step row and side (3), `AUTOPAR_BENCH_EPOCHS` of the quick-start (3).

use std::process::Command;
use std::time::Instant;

use autopar_graph::NodeId;
use autopar_models::{Mlp, MlpConfig, Mode, Model};
use autopar_runtime::{LrSchedule, ParamStore, Sgd, TrainStep};
use autopar_tensor::Tensor;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn peer(script: &str, args: &[String]) -> Result<String, String> {
    let python = std::env::var("AUTOPAR_BENCH_PYTHON").map_err(|_| "AUTOPAR_BENCH_PYTHON is not set".to_string())?;
    let path = format!("{}/benches/peers/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python).arg(&path).args(args).output().map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{path} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let at = text.rfind(key)? + key.len();
    text[at..]
        .trim_start_matches([':', ' ', '"'])
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-'))
        .next()?
        .parse()
        .ok()
}

#[path = "common/quickstart.rs"]
mod quickstart;

/// The README's quick-start command (with `devices`), run as a user runs it; wall seconds.
fn quickstart_autopar(devices: &str, epochs: &str) -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    quickstart::run(dir.path(), epochs, &["--devices", devices]).0
}

fn quickstart_torch(epochs: &str) -> Result<f64, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let args = ["--samples", "65536", "--epochs", epochs, "--batch-size", "64", "--lr", "0.05", "--warmup-steps", "100", "--out"];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(dir.path().display().to_string());
    let text = peer("quickstart_torch.py", &args)?;
    number_after(&text, "wall ").ok_or_else(|| format!("no wall time in {text}"))
}

/// The MLP step at `batch` on `threads` threads; seconds per step.
fn step_autopar(batch: usize, threads: usize, seconds: f64) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    pool.install(|| {
        let m = Mlp::new(MlpConfig { input_shape: vec![784], hidden: vec![512, 512], num_classes: 10 }).expect("mlp");
        let (graph, io) = m.build_graph(batch, Mode::Train, 1).expect("graph");
        let mut params = ParamStore::init(&graph).expect("init");
        let mut rng = autopar_graph::Rng::new(7);
        let x: Vec<f32> = (0..batch * 784).map(|_| rng.normal() as f32).collect();
        let yd = graph.node(io.labels).ty.dtype;
        let y = Tensor::from_vec(&[batch], (0..batch).map(|_| (rng.next_u64() % 10) as i64).collect::<Vec<i64>>()).expect("y");
        let y = y.cast(autopar_runtime::tensor_dtype(yd));
        let feeds: Vec<(NodeId, Tensor)> = vec![(io.x, Tensor::from_vec(&[batch, 784], x).expect("x")), (io.labels, y)];
        let mut step = TrainStep::new(graph, io.loss).expect("step");
        let mut opt = Sgd::new(LrSchedule::Constant(0.01)).expect("sgd");
        for _ in 0..10 {
            step.run(&mut params, &mut opt, &feeds).expect("step runs");
        }
        let (mut steps, start) = (0usize, Instant::now());
        while steps < 5 || start.elapsed().as_secs_f64() < seconds {
            step.run(&mut params, &mut opt, &feeds).expect("step runs");
            steps += 1;
        }
        start.elapsed().as_secs_f64() / steps as f64
    })
}

fn step_torch(batch: usize, threads: usize, seconds: f64) -> Result<f64, String> {
    let args = ["--batch", &batch.to_string(), "--threads", &threads.to_string(), "--seconds", &seconds.to_string()].map(String::from);
    let text = peer("step_torch.py", &args)?;
    number_after(&text, "\"seconds_per_step\"").ok_or_else(|| format!("no seconds_per_step in {text}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = env_or("AUTOPAR_BENCH_ROUNDS", 3usize).max(1);
    let seconds: f64 = env_or("AUTOPAR_BENCH_SECONDS", 3.0);
    let epochs: String = env_or("AUTOPAR_BENCH_EPOCHS", "3".to_string());
    type Side = Box<dyn Fn() -> f64>;
    type Peer = Box<dyn Fn() -> Result<f64, String>>;
    let mut rows: Vec<(String, &str, Side, Peer)> = Vec::new();
    for devices in ["2", "1"] {
        let e = epochs.clone();
        let e2 = epochs.clone();
        rows.push((
            format!("README quick-start, --devices {devices}"),
            "s/job",
            Box::new(move || quickstart_autopar(devices, &e)),
            Box::new(move || quickstart_torch(&e2)),
        ));
    }
    for (batch, threads) in [(64, 1), (64, 2), (256, 1), (256, 2)] {
        rows.push((
            format!("MLP step, batch {batch}, {threads} thread(s)"),
            "ms/step",
            Box::new(move || 1e3 * step_autopar(batch, threads, seconds)),
            Box::new(move || step_torch(batch, threads, seconds).map(|s| 1e3 * s)),
        ));
    }
    let mut results: Vec<(Vec<f64>, Vec<f64>, Option<String>)> = rows.iter().map(|_| (Vec::new(), Vec::new(), None)).collect();
    for round in 1..=rounds {
        for (i, (name, unit, ours, theirs)) in rows.iter().enumerate() {
            let a = ours();
            results[i].0.push(a);
            if results[i].2.is_none() {
                match theirs() {
                    Ok(t) => results[i].1.push(t),
                    Err(e) => results[i].2 = Some(e),
                }
            }
            eprintln!("round {round}: {name}: autopar {a:.3} {unit}, pytorch {:?}", results[i].1.last());
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("autopar vs PyTorch on this machine ({cores} cores), median of {rounds} interleaved rounds");
    println!("{:<40} {:>8} {:>10} {:>10} {:>14}", "work", "unit", "autopar", "pytorch", "ratio (median)");
    for ((name, unit, _, _), (ours, theirs, err)) in rows.iter().zip(results) {
        let a = median(ours.clone());
        if theirs.len() == ours.len() {
            let ratio = median(ours.iter().zip(&theirs).map(|(a, t)| a / t).collect());
            println!("{name:<40} {unit:>8} {a:>10.3} {:>10.3} {ratio:>14.2}", median(theirs));
        } else {
            println!("{name:<40} {unit:>8} {a:>10.3} {:>10} {:>14}", "n/a", "n/a");
            if let Some(e) = err {
                eprintln!("  pytorch: {e}");
            }
        }
    }
}
