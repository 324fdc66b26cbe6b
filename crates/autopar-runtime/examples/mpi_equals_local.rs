//! Run under `mpirun -n N`: every process trains one rank of a semi_auto_parallel MLP job with
//! random strategies over `MpiComm`; rank 0 also runs the same job in-process with `LocalComm`
//! (N threads) and checks that losses and parameters agree (relative 1e-6: the collectives may
//! add in another order). Prints `mpi-equals-local: OK ...` on rank 0 and exits 0 on success.
//! With `data_parallel` as an argument the job is data parallel instead (each rank its rows of
//! the global batch).

use autopar_comm::{Communicator, MpiComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::{assign_random_strategies, ParallelContext};
use autopar_runtime::ParamSource;
use autopar_runtime::{gather_full_params, run_local, Job, RankTrainer};
use autopar_runtime::{LrSchedule, Momentum, Optimizer};
use autopar_tensor::Tensor;

fn mlp(batch: usize) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(7);
    let x = b.input("x", &[batch, 16], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[32, 16], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[32], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let h = b.matmul_t("fc1.mm", x, w1, false, true).unwrap();
    let h = b.add("fc1.add", h, b1).unwrap();
    let h = b.relu("act", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[32, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc2.mm", h, w2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batches(batch: usize, steps: usize) -> Vec<Vec<(String, Tensor)>> {
    let mut rng = autopar_data::Rng::new(0x9e37_79b9_u64);
    let mut next = move || rng.next_u64();
    (0..steps)
        .map(|_| {
            let x: Vec<f32> = (0..batch * 16).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let y: Vec<i64> = (0..batch).map(|_| (next() % 8) as i64).collect();
            vec![("x".to_string(), Tensor::from_vec(&[batch, 16], x).unwrap()), ("y".to_string(), Tensor::from_vec(&[batch], y).unwrap())]
        })
        .collect()
}

fn optimizer() -> autopar_runtime::Result<Box<dyn Optimizer>> {
    Ok(Box::new(Momentum::new(LrSchedule::Constant(0.1), 0.9)?))
}

fn main() {
    let data_parallel = std::env::args().any(|a| a == "data_parallel");
    // "semi_auto_parallel" (the default) or "data_parallel" as the first argument.
    let result = MpiComm::run(|comm| -> Result<(), String> {
        let n = comm.size();
        let (batch, mode) = if data_parallel { (4 * n, "data_parallel") } else { (16, "semi_auto_parallel") };
        let (mut graph, loss) = mlp(batch);
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &serde_json::json!(n)).map_err(|e| e.to_string())?;
        ctx.set("parallel_mode", &serde_json::json!(mode)).map_err(|e| e.to_string())?;
        if data_parallel {
            ctx.set("gradients_mean", &serde_json::json!(true)).map_err(|e| e.to_string())?;
        } else {
            assign_random_strategies(&mut graph, n, 2024);
        }
        let job = Job::new(&graph, loss, &ctx).map_err(|e| e.to_string())?;
        let steps = 3;
        let data = batches(batch, steps);
        // Each process generates its own pieces of the parameters (no full tensor).
        let mut trainer = RankTrainer::new(&job, &comm, ParamSource::Init).map_err(|e| e.to_string())?;
        let mut opt = optimizer().map_err(|e| e.to_string())?;
        let mut losses = Vec::new();
        for batch in &data {
            losses.push(trainer.step(opt.as_mut(), batch).map_err(|e| e.to_string())?);
        }
        // Every rank's slices, gathered (each process holds only its own).
        let mpi_params = gather_full_params(&job, &comm, trainer.params()).map_err(|e| e.to_string())?;
        let Some(mpi_params) = mpi_params else { return Ok(()) };
        // Every rank sees the job's loss.
        let mean_losses = losses;
        let local = run_local(&job, &data, optimizer).map_err(|e| e.to_string())?;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-7 + 1e-6 * b.abs();
        for (s, (a, b)) in mean_losses.iter().zip(&local.losses).enumerate() {
            if !close(*a, *b) {
                return Err(format!("step {s}: MPI loss {a}, LocalComm loss {b}"));
            }
        }
        let mut checked = 0;
        for (name, want) in local.params.iter() {
            let got = mpi_params.require(name).map_err(|e| e.to_string())?;
            for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                if !close(*a, b) {
                    return Err(format!("{name}[{i}]: MPI {a}, LocalComm {b}"));
                }
            }
            checked += 1;
        }
        println!("mpi-equals-local: OK {mode} on {n} ranks, {steps} steps, losses {mean_losses:?}, {checked} parameters equal");
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("mpi-equals-local: {e}");
        std::process::exit(2);
    }
}
