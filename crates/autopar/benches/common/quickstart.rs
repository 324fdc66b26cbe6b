//! The README's quick-start command, shared by the benches that run it.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Runs the README's quick-start `autopar train` command in `dir` with `--epochs epochs` and
/// `extra` arguments appended (`--devices N`), as a user runs it. Returns the process's wall
/// seconds and its standard output; panics with its output when it fails.
pub fn run(dir: &Path, epochs: &str, extra: &[&str]) -> (f64, String) {
    let mut args = vec![
        "train",
        "--model",
        "mlp",
        "--data",
        "synthetic",
        "--synthetic-samples",
        "65536",
        "--epochs",
        epochs,
        "--batch-size",
        "64",
        "--lr",
        "0.05",
        "--schedule",
        "cosine",
        "--warmup-steps",
        "100",
        "--metrics",
        "run/metrics.jsonl",
        "--plot",
        "--checkpoint-dir",
        "run/ckpt",
        "--log-every",
        "512",
    ];
    args.extend(extra);
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir).args(&args).output().expect("autopar runs");
    let wall = start.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    (wall, stdout)
}
