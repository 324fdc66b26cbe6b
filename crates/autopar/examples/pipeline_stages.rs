// Pipeline parallel: a network cut into 2 stages on 4 devices (2 per stage, each stage split
// over its own devices), 4 micro-batches under the 1F1B schedule, and a weight shared by the
// first and the last stage. Checked equal to one device.
//
//   cargo run --release -p autopar --example pipeline_stages
use std::sync::Arc;

use autopar::prelude::*;

const FEATURES: usize = 16;
const WIDTH: usize = 32;

/// Four dense blocks, two per stage; the embedding weight is used again by the head on the last
/// stage (the pipeline keeps the two copies equal: MindSpore's shared parameters).
fn network(batch: usize, _training: bool) -> Result<Network, BuildError> {
    let mut b = GraphBuilder::new(3);
    let x = b.input("x", &[batch, FEATURES], DType::F32)?;
    let labels = b.input("labels", &[batch], DType::I32)?;
    let embed = b.parameter("embed.weight", &[WIDTH, FEATURES], Initializer::HeUniform)?;
    b.set_pipeline_stage(Some(0)); // MindSpore's cell.pipeline_stage = 0
    let mut h = b.matmul_t("embed", x, embed, false, true)?;
    b.shard(h, "((2, 1), (1, 1))".parse()?)?; // the micro-batch over the stage's 2 devices
    for i in 0..4 {
        b.set_pipeline_stage(Some(i / 2));
        h = b.dense(&format!("block{i}"), h, WIDTH, Initializer::HeUniform)?;
        h = b.relu(&format!("block{i}.relu"), h)?;
    }
    // The head, on the last stage: logits = h @ embed, split over the stage's devices by columns.
    let logits = b.matmul("head", h, embed)?;
    b.shard(logits, "((1, 1), (1, 2))".parse()?)?;
    let loss = b.softmax_cross_entropy("loss", logits, labels)?;
    Ok(Network { graph: b.finish(), x, labels, logits, loss })
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = DataSource::new(SyntheticDataset::classification(&[FEATURES], FEATURES, 1024, 5)?);
    let parallel = ParallelContext::new()
        .with("parallel_mode", "semi_auto_parallel")?
        .with("device_num", 4)?
        .with("pipeline_stages", 2)?
        .with("pipeline_config", json!({ "pipeline_scheduler": "1f1b" }))?;
    // gather_params: under mpirun, rank 0 receives the full parameters that `verify` compares.
    let cfg =
        TrainConfig { batch_size: 32, micro_batches: Some(4), max_steps: Some(20), parallel, gather_params: true, ..Default::default() };
    let trainer = Trainer::new("tied-mlp", Arc::new(network), data, cfg);
    let report = trainer.fit(vec![Box::new(LossMonitor::new(5))])?;
    if autopar::comm::launch::mpi_rank().is_some_and(|r| r != 0) {
        return Ok(());
    }
    let diff = verify::compare(&report, &verify::stand_alone(&trainer)?)?;
    println!("2 stages x 2 devices, 4 micro-batches, 1f1b, beside one device: {diff}");
    if !diff.within(verify::RTOL) {
        return Err(format!("the pipeline differs from stand-alone above {:e}", verify::RTOL).into());
    }
    Ok(())
}
