// A network of your own, trained semi_auto_parallel on 8 devices and checked equal to one device.
//
//   cargo run --release -p autopar --example custom_network
//
// Eight simulated devices (threads of this process) by default. Under MPI, one process per rank:
//   cargo build --release -p autopar --features mpi --example custom_network
//   mpirun -n 8 target/release/examples/custom_network
use std::sync::Arc;

use autopar::prelude::*;

/// A two-layer MLP split Megatron-style on a [2, 4] device grid: the batch over 2, fc1's outputs
/// over 4 (no communication), then fc2's inputs over the same 4 (a partial sum, all-reduced).
fn mlp(batch: usize, _training: bool) -> Result<Network, BuildError> {
    let mut b = GraphBuilder::new(42);
    let x = b.input("x", &[batch, 32], DType::F32)?;
    let labels = b.input("labels", &[batch], DType::I32)?;
    let w1 = b.parameter("fc1.weight", &[64, 32], Initializer::HeUniform)?;
    let b1 = b.parameter("fc1.bias", &[64], Initializer::Zeros)?;
    let h = b.matmul_t("fc1.matmul", x, w1, false, true)?; // x [N, 32] times w1 [64, 32] transposed
    b.shard(h, "((2, 1), (4, 1))".parse()?)?;
    let h = b.bias_add("fc1.bias_add", h, b1)?;
    b.shard(h, "((2, 4), (4,))".parse()?)?;
    let h = b.relu("relu", h)?;
    b.shard(h, "((2, 4),)".parse()?)?;
    let w2 = b.parameter("fc2.weight", &[10, 64], Initializer::HeUniform)?;
    let logits = b.matmul_t("fc2.matmul", h, w2, false, true)?;
    b.shard(logits, "((2, 4), (1, 4))".parse()?)?;
    let loss = b.softmax_cross_entropy("loss", logits, labels)?;
    Ok(Network { graph: b.finish(), x, labels, logits, loss })
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = DataSource::new(SyntheticDataset::classification(&[32], 10, 2048, 1)?);
    let cfg = TrainConfig {
        batch_size: 64,
        max_steps: Some(30),
        optimizer: OptimizerConfig { schedule: LrSchedule::Constant(0.05), ..Default::default() },
        parallel: ParallelContext::new().with("parallel_mode", "semi_auto_parallel")?.with("device_num", 8)?,
        gather_params: true, // under mpirun, rank 0 receives the full parameters that `verify` compares
        ..Default::default()
    };
    let trainer = Trainer::new("mlp", Arc::new(mlp), data, cfg);
    let report = trainer.fit(vec![Box::new(LossMonitor::new(10))])?;
    if autopar::comm::launch::mpi_rank().is_some_and(|r| r != 0) {
        return Ok(()); // under mpirun, rank 0 reports
    }
    println!("8 devices: loss {:.4} -> {:.4}", report.losses[0], report.losses[report.losses.len() - 1]);

    // Parallel equals serial: the same steps on one device give the same losses and parameters.
    let reference = verify::stand_alone(&trainer)?;
    let diff = verify::compare(&report, &reference)?;
    println!("beside one device: {diff}");
    if !diff.within(verify::RTOL) {
        return Err(format!("the 8-device run differs from stand-alone above {:e}", verify::RTOL).into());
    }
    Ok(())
}
