//! Data-parallel training step of the MLP 784-512-512-10 at batch 64 per rank over MPI.
//! Run: `cargo build --release -p autopar-runtime --features mpi --example mpi_dp_bench` then
//! `mpirun -n 2 target/release/examples/mpi_dp_bench` (as root add `--allow-run-as-root`).
//! Rank 0 prints steps/s and samples/s.

use std::time::Instant;

use autopar_comm::{Communicator, MpiComm};
use autopar_models::{Mlp, MlpConfig, Mode, Model};
use autopar_parallel::ParallelContext;
use autopar_runtime::ParamSource;
use autopar_runtime::{Job, RankTrainer};
use autopar_runtime::{LrSchedule, ParamStore, Sgd};
use autopar_tensor::Tensor;

fn main() {
    // As the `autopar` binary runs.
    autopar_runtime::keep_freed_memory();
    let result = MpiComm::run(|comm| -> Result<(), String> {
        let n = comm.size();
        let e = |e: autopar_runtime::RuntimeError| e.to_string();
        let (g, m) =
            Mlp::new(MlpConfig::default()).map_err(|e| e.to_string())?.build_graph(64 * n, Mode::Train, 1).map_err(|e| e.to_string())?;
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &serde_json::json!(n)).map_err(|e| e.to_string())?;
        ctx.set("parallel_mode", &serde_json::json!("data_parallel")).map_err(|e| e.to_string())?;
        ctx.set("gradients_mean", &serde_json::json!(true)).map_err(|e| e.to_string())?;
        let job = Job::new(&g, m.loss, &ctx).map_err(e)?;
        let full = ParamStore::init(job.graph()).map_err(e)?;
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full)).map_err(e)?;
        let mut opt = Sgd::new(LrSchedule::Constant(0.01)).map_err(e)?;
        // The global batch; each rank feeds its 64 rows.
        let x: Vec<f32> = (0..64 * n * 784).map(|i| ((i * 7919) % 1000) as f32 / 1000.0).collect();
        let y: Vec<i64> = (0..64 * n).map(|i| (i % 10) as i64).collect();
        let batch = vec![
            ("x".to_string(), Tensor::from_vec(&[64 * n, 784], x).map_err(|e| e.to_string())?),
            ("labels".to_string(), Tensor::from_vec(&[64 * n], y).map_err(|e| e.to_string())?),
        ];
        let feeds = &batch;
        for _ in 0..3 {
            t.step(&mut opt, feeds).map_err(e)?;
        }
        comm.barrier().map_err(|e| e.to_string())?;
        let steps = 300;
        let start = Instant::now();
        for _ in 0..steps {
            t.step(&mut opt, feeds).map_err(e)?;
        }
        let secs = start.elapsed().as_secs_f64() / steps as f64;
        if comm.rank() == 0 {
            println!(
                "data_parallel over MPI, {n} ranks x batch 64: {:.2} ms/step, {:.1} steps/s, {:.0} samples/s",
                secs * 1e3,
                1.0 / secs,
                64.0 * n as f64 / secs
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("mpi_dp_bench: {e}");
        std::process::exit(2);
    }
}
