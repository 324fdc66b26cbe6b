//! The plan as the memory budget, measured: for the zoo's models in every mode, each process's
//! true peak resident memory since it started (`VmHWM`) beside the plan's memory for the ranks
//! it runs, and their ratio to the plan plus the runtime's stated overhead
//! (`autopar_runtime::budget`). In process, one process runs every simulated rank; with an MPI
//! build of autopar (`AUTOPAR_MPI_BIN=path/to/autopar`, built with `--features mpi`) each job
//! also runs as one process per rank under `autopar launch`, each rank's peak read by
//! `/usr/bin/time` and its plan by `autopar plan --rank R`.
//!
//! With `AUTOPAR_TORCH_PYTHON` too (a Python with PyTorch), the GPT's auto_parallel job under
//! mpirun is followed by PyTorch FSDP2 on the same model, ranks and optimizer
//! (`benches/peers/fsdp_torch.py`), and the ratio of their worst ranks' peaks is printed.
//!
//! `cargo bench -p autopar --bench memory` (`AUTOPAR_BENCH_ONLY=gpt` runs the jobs whose name
//! contains it).

use std::process::Command;

use autopar_runtime::budget::{overhead, PROCESS_OVERHEAD, RANK_OVERHEAD};

const MIB: f64 = (1u64 << 20) as f64;

/// A job: its name, devices, and its `autopar train` arguments (model, mode).
struct Job {
    name: &'static str,
    devices: usize,
    args: Vec<&'static str>,
}

fn jobs() -> Vec<Job> {
    let mlp = ["--model", "mlp", "--width", "2048", "--depth", "2", "--batch-size", "64"];
    let gpt = ["--model", "gpt", "--width", "512", "--depth", "4", "--heads", "16", "--input-shape", "64", "--batch-size", "8"];
    let res = ["--model", "resnet18", "--width", "16", "--input-shape", "3,32,32", "--batch-size", "16"];
    let j = |name, devices, model: &[&'static str], mode: &[&'static str]| Job { name, devices, args: [model, mode].concat() };
    vec![
        j("mlp stand_alone", 1, &mlp, &[]),
        j("mlp data_parallel", 8, &mlp, &["--parallel-mode", "data_parallel"]),
        j("mlp semi_auto", 8, &mlp, &["--parallel-mode", "semi_auto_parallel"]),
        j("mlp auto_parallel", 8, &mlp, &["--parallel-mode", "auto_parallel"]),
        j("mlp parallel optimizer", 8, &mlp, &["--parallel-mode", "data_parallel", "--parallel", "enable_parallel_optimizer=true"]),
        j("gpt stand_alone", 1, &gpt, &[]),
        j("gpt stand_alone recompute", 1, &gpt, &["--recompute", "blocks"]),
        j("gpt data_parallel", 8, &gpt, &["--parallel-mode", "data_parallel"]),
        j("gpt auto_parallel", 8, &gpt, &["--parallel-mode", "auto_parallel"]),
        j("gpt auto_parallel recompute", 8, &gpt, &["--parallel-mode", "auto_parallel", "--recompute", "blocks"]),
        j("gpt pipeline 2 stages", 8, &gpt, &["--parallel", "pipeline_stages=2", "--micro-batches", "2"]),
        j("gpt parallel optimizer", 8, &gpt, &["--parallel-mode", "data_parallel", "--parallel", "enable_parallel_optimizer=true"]),
        j(
            "gpt parallel optimizer level2",
            8,
            &gpt,
            &[
                "--parallel-mode",
                "data_parallel",
                "--parallel",
                "enable_parallel_optimizer=true",
                "--parallel",
                r#"parallel_optimizer_config={"optimizer_level":"level2"}"#,
            ],
        ),
        j(
            "gpt parallel optimizer level3",
            8,
            &gpt,
            &[
                "--parallel-mode",
                "data_parallel",
                "--parallel",
                "enable_parallel_optimizer=true",
                "--parallel",
                r#"parallel_optimizer_config={"optimizer_level":"level3"}"#,
            ],
        ),
        j("resnet18 stand_alone", 1, &res, &[]),
        j("resnet18 data_parallel", 4, &res, &["--parallel-mode", "data_parallel"]),
        j("resnet18 auto_parallel", 4, &res, &["--parallel-mode", "auto_parallel"]),
    ]
}

/// The arguments `autopar train` and `autopar plan` share: the model, mode, devices, AdamW.
fn job_args(job: &Job) -> Vec<String> {
    let mut a: Vec<String> = job.args.iter().map(|s| s.to_string()).collect();
    a.extend(["--devices".to_string(), job.devices.to_string(), "--optimizer".into(), "adamw".into()]);
    a
}

/// The training arguments of `job`: 2 steps, no evaluation.
fn train_args(job: &Job) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--data", "synthetic", "--synthetic-samples", "512", "--steps", "2", "--eval", "false"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(job_args(job));
    a
}

fn json_of(out: &std::process::Output, what: &str) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{stdout}"))
}

/// In process: (plan of all ranks, peak of the process, setup seconds).
fn in_process(job: &Job) -> (u64, u64, f64) {
    let mut args = train_args(job);
    args.push("--json".into());
    let out = Command::new(env!("CARGO_BIN_EXE_autopar")).args(&args).output().expect("autopar runs");
    let v = json_of(&out, job.name);
    (v["plan_memory_bytes"].as_u64().unwrap_or(0), v["peak_rss_bytes"].as_u64().unwrap_or(0), v["setup_seconds"].as_f64().unwrap_or(0.0))
}

/// Each rank's peak (bytes) of `program args` run on `n` ranks under mpirun (`autopar launch`).
fn peaks_under_mpi(n: usize, what: &str, program: &str, args: &[String]) -> Vec<u64> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_autopar"));
    // Each rank's peak, tagged with its rank by the shell mpirun starts it in.
    let script = "exec /usr/bin/time -f \"autopar-peak-kib $OMPI_COMM_WORLD_RANK %M\" \"$0\" \"$@\"";
    cmd.args(["launch", "-n", &n.to_string(), "--", "sh", "-c", script, program]).args(args);
    let out = cmd.output().expect("autopar launch runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} under mpirun failed:\n{err}");
    let mut peaks = vec![0u64; n];
    for l in err.lines().filter_map(|l| l.strip_prefix("autopar-peak-kib ")) {
        if let Some((r, kib)) = l.trim().split_once(' ').and_then(|(r, k)| Some((r.parse::<usize>().ok()?, k.parse::<u64>().ok()?))) {
            if let Some(p) = peaks.get_mut(r) {
                *p = kib * 1024;
            }
        }
    }
    peaks
}

/// PyTorch FSDP2 training the bench's GPT (vocabulary 256, context 64, width 512, 16 heads, 4
/// blocks; batch 8, 2 steps, AdamW) on `n` ranks under mpirun: each rank's peak.
fn fsdp2_peaks(python: &str, n: usize) -> Vec<u64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peers/fsdp_torch.py");
    let rendezvous = std::env::temp_dir().join(format!("autopar-fsdp-{}", std::process::id()));
    let _ = std::fs::remove_file(&rendezvous);
    let args: Vec<String> = [script, "--gpt", "256,64,512,16,4", "--batch", "8", "--steps", "2", "--init-file"]
        .iter()
        .map(|s| s.to_string())
        .chain([rendezvous.display().to_string()])
        .collect();
    let peaks = peaks_under_mpi(n, "FSDP2", python, &args);
    let _ = std::fs::remove_file(&rendezvous);
    peaks
}

/// Under mpirun with `bin`: for each rank, (plan, peak).
fn under_mpi(bin: &str, job: &Job) -> Vec<(u64, u64)> {
    let peaks = peaks_under_mpi(job.devices, job.name, bin, &train_args(job));
    (0..job.devices)
        .map(|r| {
            let mut args = vec!["plan".to_string()];
            args.extend(job_args(job));
            args.extend(["--rank".into(), r.to_string(), "--json".into()]);
            let v = json_of(&Command::new(bin).args(&args).output().expect("autopar plan runs"), "autopar plan");
            // A pipeline's plan nests the rank's figures under "plan".
            let plan = v["memory"]["total"].as_u64().or_else(|| v["plan"]["memory"]["total"].as_u64()).unwrap_or(0);
            (plan, peaks.get(r).copied().unwrap_or(0))
        })
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let only = std::env::var("AUTOPAR_BENCH_ONLY").unwrap_or_default();
    let mpi = std::env::var("AUTOPAR_MPI_BIN").ok().filter(|p| std::path::Path::new(p).is_file());
    let torch = std::env::var("AUTOPAR_TORCH_PYTHON").ok();
    println!(
        "peak resident memory (VmHWM) against the plan; budget = plan + {:.0} MiB per process + {:.0} MiB per simulated rank",
        PROCESS_OVERHEAD as f64 / MIB,
        RANK_OVERHEAD as f64 / MIB
    );
    println!(
        "{:<28} {:>8} {:>11} {:>11} {:>11} {:>14} {:>8}",
        "job", "ranks", "plan MiB", "budget MiB", "peak MiB", "peak / budget", "setup s"
    );
    for job in jobs().iter().filter(|j| j.name.contains(&only)) {
        let (plan, peak, setup) = in_process(job);
        let budget = plan + overhead(job.devices);
        println!(
            "{:<28} {:>8} {:>11.1} {:>11.1} {:>11.1} {:>14.2} {:>8.2}",
            job.name,
            format!("{} in 1", job.devices),
            plan as f64 / MIB,
            budget as f64 / MIB,
            peak as f64 / MIB,
            peak as f64 / budget as f64,
            setup
        );
        if let (Some(bin), true) = (&mpi, job.devices > 1) {
            let ranks = under_mpi(bin, job);
            let worst = ranks
                .iter()
                .map(|&(plan, peak)| (peak as f64 / (plan + overhead(1)) as f64, plan, peak))
                .fold((0.0, 0, 0), |a, b| if b.0 > a.0 { b } else { a });
            println!(
                "{:<28} {:>8} {:>11.1} {:>11.1} {:>11.1} {:>14.2} {:>8}",
                format!("  under mpirun, worst rank"),
                format!("1 of {}", job.devices),
                worst.1 as f64 / MIB,
                (worst.1 + overhead(1)) as f64 / MIB,
                worst.2 as f64 / MIB,
                worst.0,
                "-"
            );
            if let (Some(python), "gpt auto_parallel") = (&torch, job.name) {
                let fsdp = fsdp2_peaks(python, job.devices).into_iter().max().unwrap_or(0);
                let ours = ranks.iter().map(|r| r.1).max().unwrap_or(0);
                println!(
                    "{:<28} {:>8} {:>11} {:>11} {:>11.1} {:>14} {:>8}   autopar / FSDP2 worst rank {:.2}",
                    "  PyTorch FSDP2, worst rank",
                    format!("1 of {}", job.devices),
                    "-",
                    "-",
                    fsdp as f64 / MIB,
                    "-",
                    "-",
                    ours as f64 / fsdp.max(1) as f64
                );
            }
        }
    }
    if mpi.is_none() {
        println!("(no mpirun rows: set AUTOPAR_MPI_BIN to an autopar built with `cargo build --release -p autopar --features mpi`)");
    }
}
