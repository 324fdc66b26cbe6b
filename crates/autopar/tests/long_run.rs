//! A long run, stopped and resumed: an 8-device semi_auto run (data x model parallel, AdamW,
//! cosine schedule, reshuffled epochs) of 5,000 steps with a checkpoint every 500 equals, bit
//! for bit, the same run stopped at a random one of its checkpoints and resumed; its memory
//! stays flat. `AUTOPAR_LONG_RUN_SEED=S` replays a choice of checkpoint (the test prints its
//! seed). The same run resumed across the in-process/MPI boundary is checked by
//! `.ci/mpi-tests.sh`.

use std::path::Path;
use std::process::Command;

const STEPS: u64 = 5000;
const EVERY: u64 = 500;

/// fc1 split on its output columns over 4 devices (2 data-parallel replicas), fc2 on its rows.
const STRATEGY: &str = r#"{"current_stage": 2, "parallel_strategy_item": {
  "MatMul_fc1.weight": {"stage": 0, "parallel_strategy": [[2, 1], [4, 1]]},
  "MatMul_fc2.weight": {"stage": 0, "parallel_strategy": [[2, 4], [1, 4]]}},
  "parallel_layout_item": {}}"#;

/// Runs the job in `dir` with `extra` flags and returns its JSON summary.
fn train(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "train",
        "--model",
        "mlp",
        "--width",
        "32",
        "--data",
        "synthetic",
        "--synthetic-samples",
        "2048",
        "--batch-size",
        "32",
        "--devices",
        "8",
        "--strategy",
        "strategy8.json",
        "--optimizer",
        "adamw",
        "--lr",
        "0.003",
        "--schedule",
        "cosine",
        "--warmup-steps",
        "100",
        "--steps",
        "5000",
        "--checkpoint-every",
        "500",
        "--keep-checkpoint-max",
        "0",
        "--log-every",
        "0",
        "--eval",
        "false",
        "--json",
    ];
    args.extend(extra);
    let o = Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir).args(&args).output().expect("autopar runs");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "autopar {args:?}\n{out}\n{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("the summary is not JSON ({e}):\n{out}"))
}

fn file(dir: &Path, rank: usize, step: u64) -> std::path::PathBuf {
    dir.join(format!("rank_{rank}/mlp-{step}_{rank}.safetensors"))
}

fn seed() -> u64 {
    std::env::var("AUTOPAR_LONG_RUN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64))
}

#[test]
fn an_8_device_run_of_5000_steps_equals_itself_stopped_at_a_random_checkpoint_and_resumed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("strategy8.json"), STRATEGY).unwrap();
    let whole = train(dir.path(), &["--checkpoint-dir", "whole"]);
    let losses = whole["losses"].as_array().unwrap().clone();
    assert_eq!(losses.len() as u64, STEPS);

    // The run as it was when stopped right after checkpoint `stop`: its folder holds the
    // checkpoints up to `stop` and the strategy file.
    let seed = seed();
    let stop = EVERY * (1 + seed % (STEPS / EVERY - 1));
    println!("stopped at step {stop} of {STEPS} (AUTOPAR_LONG_RUN_SEED={seed})");
    let stopped = dir.path().join("stopped");
    for rank in 0..8 {
        std::fs::create_dir_all(stopped.join(format!("rank_{rank}"))).unwrap();
        for step in (EVERY..=stop).step_by(EVERY as usize) {
            std::fs::copy(file(&dir.path().join("whole"), rank, step), file(&stopped, rank, step)).unwrap();
        }
    }
    std::fs::copy(dir.path().join("whole/strategy.json"), stopped.join("strategy.json")).unwrap();

    // Resumed in its own folder, it continues from `stop` to the end.
    let resumed = train(dir.path(), &["--checkpoint-dir", "stopped", "--resume", "stopped"]);
    assert_eq!((resumed["first_step"].as_u64(), resumed["last_step"].as_u64()), (Some(stop), Some(STEPS)));
    let tail = resumed["losses"].as_array().unwrap();
    assert_eq!(tail.len() as u64, STEPS - stop);
    for (i, (a, b)) in losses[stop as usize..].iter().zip(tail).enumerate() {
        assert_eq!(
            a.as_f64().map(f64::to_bits),
            b.as_f64().map(f64::to_bits),
            "loss of step {} after resuming at {stop}",
            stop + 1 + i as u64
        );
    }
    // Every later checkpoint of every rank, byte for byte (parameters, optimizer state, step).
    for step in (stop + EVERY..=STEPS).step_by(EVERY as usize) {
        for rank in 0..8 {
            let (a, b) = (file(&dir.path().join("whole"), rank, step), file(&stopped, rank, step));
            assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(), "{} and {} differ", a.display(), b.display());
        }
    }

    // Memory stays flat: the peak at the end is within a few MiB of the peak at step 500.
    let memory = whole["memory"].as_array().unwrap();
    assert!(!memory.is_empty() || !cfg!(target_os = "linux"), "no memory samples in {whole}");
    if let (Some(first), Some(last)) = (memory.first(), memory.last()) {
        let (p0, p1) = (first["peak_rss_bytes"].as_u64().unwrap(), last["peak_rss_bytes"].as_u64().unwrap());
        println!(
            "peak RSS {:.1} MiB at step {}, {:.1} MiB at step {}",
            p0 as f64 / 1048576.0,
            first["step"],
            p1 as f64 / 1048576.0,
            last["step"]
        );
        assert_eq!((first["step"].as_u64(), last["step"].as_u64()), (Some(EVERY), Some(STEPS)));
        assert!(p1 <= p0 + p0 / 10 + (4 << 20), "peak RSS grew from {p0} bytes at step {EVERY} to {p1} at step {STEPS}");
    }
}
