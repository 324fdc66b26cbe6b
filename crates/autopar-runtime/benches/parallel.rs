//! Parallel training step of the MLP 784-512-512-10 on in-process ranks (`LocalComm`), the same
//! global batch (64 and 128) everywhere: stand-alone (its kernels on every core), data_parallel
//! on 2 and 8 ranks (also with the parallel optimizer), and 8 simulated devices with a (2, 4) data x model strategy (each rank's
//! kernels on one thread). Prints ms/step, samples/s and the ratio to the stand-alone step
//! (the goal: at most 1.3).
//! Run: `cargo bench -p autopar-runtime --bench parallel` (`AUTOPAR_BENCH_ROWS=data_parallel`:
//! only the rows whose name contains it, and the stand-alone rows they are compared with).
//! (Over MPI: `mpirun -n 2 target/release/examples/mpi_dp_bench` with `--features mpi`.)

use std::time::Instant;

use autopar_comm::{Communicator, LocalComm};
use autopar_layout::Strategy;
use autopar_models::{Mlp, MlpConfig, Mode, Model};
use autopar_parallel::ParallelContext;
use autopar_runtime::ParamSource;
use autopar_runtime::{Job, RankTrainer};
use autopar_runtime::{LrSchedule, ParamStore, Sgd};
use autopar_tensor::Tensor;
use serde_json::json;

#[path = "../../autopar/benches/common/mesh24.rs"]
mod mesh24;

const WARMUP: usize = 3;
const STEPS: usize = 20;

fn batch(n: usize) -> Vec<(String, Tensor)> {
    let x: Vec<f32> = (0..n * 784).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
    let y: Vec<i64> = (0..n).map(|i| (i % 10) as i64).collect();
    vec![("x".into(), Tensor::from_vec(&[n, 784], x).unwrap()), ("labels".into(), Tensor::from_vec(&[n], y).unwrap())]
}

/// Seconds per step of `job` on its ranks (every rank fed its part of `global` batches).
fn time_job(job: &Job, global: &[(String, Tensor)]) -> f64 {
    let full = ParamStore::init(job.graph()).unwrap();
    let times = LocalComm::run(job.device_num(), |comm| -> autopar_runtime::Result<f64> {
        let mut t = RankTrainer::new(job, &comm, ParamSource::Full(&full))?;
        let mut opt = Sgd::new(LrSchedule::Constant(0.01))?;
        for _ in 0..WARMUP {
            t.step(&mut opt, global)?;
        }
        comm.barrier().map_err(autopar_runtime::RuntimeError::comm(autopar_runtime::CommPhase::Run))?;
        let start = Instant::now();
        for _ in 0..STEPS {
            t.step(&mut opt, global)?;
        }
        Ok(start.elapsed().as_secs_f64() / STEPS as f64)
    })
    .unwrap();
    times.into_iter().fold(0.0, f64::max)
}

fn ctx(n: usize, mode: &str) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!(mode)).unwrap();
    if mode == "data_parallel" {
        c.set("gradients_mean", &json!(true)).unwrap();
    }
    c
}

fn main() {
    // As the `autopar` binary runs.
    autopar_runtime::keep_freed_memory();
    let model = Mlp::new(MlpConfig::default()).unwrap();
    println!(
        "MLP 784-512-512-10, SGD, f32, {STEPS} steps after {WARMUP} warm-up; {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("{:<56} {:>10} {:>12} {:>14}", "run", "ms/step", "samples/s", "x stand-alone");
    for global in [64usize, 128] {
        let (g, m) = model.build_graph(global, Mode::Train, 1).unwrap();
        let alone = time_job(&Job::new(&g, m.loss, &ctx(1, "stand_alone")).unwrap(), &batch(global));
        let only = std::env::var("AUTOPAR_BENCH_ROWS").unwrap_or_default();
        let wanted = |name: &str| name.contains(only.as_str());
        let report = |name: String, secs: f64| {
            println!("{name:<56} {:>10.2} {:>12.0} {:>14.2}", secs * 1e3, global as f64 / secs, secs / alone);
        };
        report(format!("stand_alone, batch {global}"), alone);
        for n in [2usize, 8] {
            for optimizer_shard in [false, true] {
                let mut c = ctx(n, "data_parallel");
                let name = if optimizer_shard {
                    c.set("enable_parallel_optimizer", &json!(true)).unwrap();
                    format!("data_parallel + parallel optimizer, {n} ranks, batch {global}")
                } else {
                    format!("data_parallel, {n} ranks, batch {global}")
                };
                if wanted(&name) {
                    let (g, m) = model.build_graph(global, Mode::Train, 1).unwrap();
                    report(name, time_job(&Job::new(&g, m.loss, &c).unwrap(), &batch(global)));
                }
            }
        }
        if !wanted(&format!("semi_auto_parallel, 8 devices (2,4), batch {global}")) {
            continue;
        }
        let (mut g, m) = model.build_graph(global, Mode::Train, 1).unwrap();
        // (2, 4): batch split 2 ways, the hidden layers 4 ways (column- then row-parallel).
        for (op, s) in mesh24::MESH_2X4 {
            m.shard_graph(&mut g, op, s.parse::<Strategy>().unwrap()).unwrap();
        }
        let semi = Job::new(&g, m.loss, &ctx(8, "semi_auto_parallel")).unwrap();
        report(format!("semi_auto_parallel, 8 devices (2,4), batch {global}"), time_job(&semi, &batch(global)));
    }
}
