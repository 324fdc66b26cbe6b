// Resharding checkpoints from code (MindSpore's transform_checkpoints): train on 8 devices, move
// the rank checkpoints to another strategy on 4 devices, check that only bytes moved, and go on
// training on 4 devices from the resharded files.
//
//   cargo run --release -p autopar --example reshard_checkpoint
use std::path::Path;
use std::sync::Arc;

use autopar::prelude::*;
use autopar::runtime::trainer::Loaded;

/// An MLP whose layers are split over `dp` (batch) x `mp` (model) devices.
fn mlp(dp: usize, mp: usize) -> BuildNetwork {
    Arc::new(move |batch, _training| {
        let mut b = GraphBuilder::new(11);
        let x = b.input("x", &[batch, 24], DType::F32)?;
        let labels = b.input("labels", &[batch], DType::I32)?;
        let w1 = b.parameter("fc1.weight", &[48, 24], Initializer::HeUniform)?;
        let h = b.matmul_t("fc1", x, w1, false, true)?;
        b.shard(h, Strategy::new(vec![vec![dp, 1], vec![mp, 1]]))?;
        let h = b.relu("relu", h)?;
        let w2 = b.parameter("fc2.weight", &[6, 48], Initializer::HeUniform)?;
        let logits = b.matmul_t("fc2", h, w2, false, true)?;
        b.shard(logits, Strategy::new(vec![vec![dp, mp], vec![1, mp]]))?;
        let loss = b.softmax_cross_entropy("loss", logits, labels)?;
        Ok(Network { graph: b.finish(), x, labels, logits, loss })
    })
}

fn config(devices: usize, checkpoints: &Path) -> Result<TrainConfig, ParallelError> {
    Ok(TrainConfig {
        batch_size: 48,
        max_steps: Some(12),
        parallel: ParallelContext::new().with("parallel_mode", "semi_auto_parallel")?.with("device_num", devices)?,
        checkpoint: Some(CheckpointConfig { dir: checkpoints.to_path_buf(), ..Default::default() }),
        ..Default::default()
    })
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("autopar-reshard-example-{}", std::process::id()));
    let data = DataSource::new(SyntheticDataset::classification(&[24], 6, 960, 3)?);

    // 1. Train on 8 devices, [2, 4]: rank checkpoints in dir/eight/rank_<k>, strategy.json beside.
    let eight = Trainer::new("mlp", mlp(2, 4), data.clone(), config(8, &dir.join("eight"))?).fit(vec![])?;
    let src = eight.strategy_file.clone().ok_or("the 8-device run wrote no strategy file")?;

    // 2. The strategy of a 4-device job, [2, 2]: planned, not trained.
    let dst = dir.join("four.json");
    let mut four = Trainer::new("mlp", mlp(2, 2), data, config(4, &dir.join("four-run"))?);
    four.strategy_file()?.save(&dst)?;
    println!("rank 0 of 4 reads the files of ranks {:?} of 8", rank_list_for_transform(0, Some(&src), Some(&dst))?);

    // 3. Reshard 8 -> 4, then 4 -> 1 (stand-alone, dst_strategy None): the one file must hold
    //    exactly the parameters the 8-device run ended with.
    let opts = TransformOptions { format: Format::Safetensors, ..Default::default() };
    transform_checkpoints(&dir.join("eight"), &dir.join("four"), Some(&src), Some(&dst), &opts)?;
    transform_checkpoints(&dir.join("four"), &dir.join("one"), Some(&dst), None, &opts)?;
    let whole = Loaded::open(&dir.join("one/rank_0/checkpoint_0.safetensors"))?;
    let trained_params = eight.params()?;
    for (name, trained) in trained_params.iter() {
        if whole.tensor(name, trained.shape())?.to_f64_vec() != trained.to_f64_vec() {
            return Err(format!("{name} changed on its way 8 -> 4 -> 1 devices").into());
        }
    }
    println!("8 -> 4 -> 1 devices: {} parameters unchanged", trained_params.len());

    // 4. Go on training on 4 devices from the resharded files (resharded again at load).
    let cfg = four.config_mut();
    (cfg.init, cfg.init_strategy) = (Some(dir.join("four")), Some(dst.clone()));
    let report = four.fit(vec![])?;
    println!("8 devices ended at loss {:.4}; 4 devices from there: {:.4} -> {:.4}", eight.losses[11], report.losses[0], report.losses[11]);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
