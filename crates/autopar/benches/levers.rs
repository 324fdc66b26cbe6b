//! What the memory levers cost in time: the step time of a job with every block recomputed
//! against the same job without, and with `optimizer_level` level3 against level1, each pair
//! run interleaved (A, B, A, B, ...) so that the machine's drift falls on both alike. The job:
//! the 4-block GPT of width 1024, global batch 32, AdamW, on 8 simulated devices in one process
//! (data parallel); with `AUTOPAR_MPI_BIN` (an autopar built with `--features mpi`) the level
//! pair also runs as 8 processes under mpirun. A run's step time is the mean time of its steps
//! after the first (from the `samples_per_sec` of each step in its `--metrics` file); the
//! figure is the median over the rounds, and the ratio is B's median over A's.
//!
//! `cargo bench -p autopar --bench levers` (`AUTOPAR_BENCH_ROUNDS`, default 3;
//! `AUTOPAR_BENCH_ONLY=recompute|level` runs one pair).

use std::process::Command;

/// One side of a pair: its label and the `autopar train` arguments it adds.
type Side = (&'static str, &'static [&'static str]);

/// The global batch of [`JOB`] (`--batch-size`), which turns samples/s into step time.
const BATCH: f64 = 32.0;

/// The job both sides share: the model, data, steps, devices and optimizer.
const JOB: &[&str] = &[
    "train",
    "--model",
    "gpt",
    "--width",
    "1024",
    "--depth",
    "4",
    "--heads",
    "16",
    "--batch-size",
    "32",
    "--data",
    "synthetic",
    "--synthetic-samples",
    "512",
    "--steps",
    "4",
    "--eval",
    "false",
    "--optimizer",
    "adamw",
    "--devices",
    "8",
    "--parallel-mode",
    "data_parallel",
];

const LEVEL1: &[&str] = &["--parallel", "enable_parallel_optimizer=true"];
const LEVEL3: &[&str] =
    &["--parallel", "enable_parallel_optimizer=true", "--parallel", r#"parallel_optimizer_config={"optimizer_level":"level3"}"#];

/// Seconds per step after the first of one run of `program` (the autopar binary; `before`:
/// `launch -n 8 -- MPI_BINARY` to run it under mpirun), from the metrics file the run writes.
fn step_seconds(program: &str, before: &[String], args: &[&str]) -> f64 {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let metrics = dir.path().join("metrics.jsonl");
    let out = Command::new(program)
        .args(before)
        .args(JOB)
        .args(args)
        .arg("--metrics")
        .arg(&metrics)
        .output()
        .unwrap_or_else(|e| panic!("{program} does not run: {e}"));
    assert!(out.status.success(), "{program} {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&metrics).unwrap_or_else(|e| panic!("no metrics at {}: {e}", metrics.display()));
    // Each line: {"step": k, "samples_per_sec": ...}; a step's time is batch / samples_per_sec.
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["samples_per_sec"].as_f64())
        .map(|sps| BATCH / sps)
        .collect();
    assert!(times.len() >= 2, "{args:?}: fewer than 2 steps in {text}");
    times[1..].iter().sum::<f64>() / (times.len() - 1) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs the pair interleaved and prints each side's median step time and their ratio.
fn pair(what: &str, program: &str, before: &[String], (a_label, a): Side, (b_label, b): Side, rounds: usize) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        ta.push(step_seconds(program, before, a));
        tb.push(step_seconds(program, before, b));
    }
    let (ma, mb) = (median(ta), median(tb));
    println!("{what:<34} {a_label:<10} {:>9.1} ms  {b_label:<10} {:>9.1} ms  ratio {:.2}", ma * 1e3, mb * 1e3, mb / ma);
}

fn main() {
    let rounds: usize = std::env::var("AUTOPAR_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let only = std::env::var("AUTOPAR_BENCH_ONLY").unwrap_or_default();
    assert!(["", "recompute", "level"].contains(&only.as_str()), "AUTOPAR_BENCH_ONLY={only:?}: expected recompute or level");
    let autopar = env!("CARGO_BIN_EXE_autopar");
    println!("gpt width 1024, 4 blocks, batch 32, AdamW, 8 devices data_parallel; median step time over {rounds} interleaved rounds");
    if only != "level" {
        pair(
            "recompute, 8 in one process",
            autopar,
            &[],
            ("none", &["--recompute", "none"]),
            ("blocks", &["--recompute", "blocks"]),
            rounds,
        );
    }
    if only != "recompute" {
        pair("optimizer level, 8 in one process", autopar, &[], ("level1", LEVEL1), ("level3", LEVEL3), rounds);
        if let Ok(bin) = std::env::var("AUTOPAR_MPI_BIN") {
            // Through `autopar launch`, which knows mpirun's options.
            let before: Vec<String> = ["launch", "-n", "8", "--", bin.as_str()].iter().map(|s| s.to_string()).collect();
            pair("optimizer level, mpirun -n 8", autopar, &before, ("level1", LEVEL1), ("level3", LEVEL3), rounds);
        }
    }
}
