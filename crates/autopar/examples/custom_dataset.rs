// A dataset of your own (the `Dataset` trait), a model from the zoo, data_parallel on 4 devices,
// and a callback of your own that logs each epoch.
//
//   cargo run --release -p autopar --example custom_dataset
use std::sync::Arc;

use autopar::prelude::*;

/// Points in the plane, labelled by the ring they lie in: radius in [0, 1), [1, 2) or [2, 3).
#[derive(Debug)]
struct Rings {
    len: usize,
    seed: u64,
}

/// A uniform number in [0, 1) from a key (splitmix64): sample `i` is the same whoever reads it.
fn uniform(key: u64) -> f32 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
}

impl Dataset for Rings {
    fn name(&self) -> String {
        format!("rings ({} points)", self.len)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn sample_shape(&self) -> &[usize] {
        &[2]
    }
    fn label_shape(&self) -> Option<&[usize]> {
        Some(&[]) // one class index per sample
    }
    fn num_classes(&self) -> Option<usize> {
        Some(3)
    }
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> Result<(), DataError> {
        let key = (self.seed << 32) ^ (index as u64 * 2);
        let radius = 3.0 * uniform(key);
        let angle = std::f32::consts::TAU * uniform(key + 1);
        x[0] = radius * angle.cos();
        x[1] = radius * angle.sin();
        y[0] = radius as i64; // 0, 1 or 2
        Ok(())
    }
}

/// Prints the mean loss of every epoch.
struct EpochLog {
    losses: Vec<f64>,
}

impl Callback for EpochLog {
    fn on_step_end(&mut self, event: &StepEvent) -> Result<(), TrainError> {
        self.losses.push(event.loss);
        Ok(())
    }
    fn on_epoch_end(&mut self, epoch: u64, _last: &StepEvent) -> Result<(), TrainError> {
        let mean = self.losses.iter().sum::<f64>() / self.losses.len() as f64;
        println!("epoch {epoch}: mean loss {mean:.4} over {} steps", self.losses.len());
        self.losses.clear();
        Ok(())
    }
}

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let opts = ModelOptions { input_shape: Some(vec![2]), num_classes: Some(3), width: Some(64), depth: Some(2), ..Default::default() };
    let model = model_by_name("mlp", &opts)?;
    let cfg = TrainConfig {
        epochs: 6,
        batch_size: 64,
        optimizer: OptimizerConfig { schedule: LrSchedule::Constant(0.1), ..Default::default() },
        parallel: ParallelContext::new().with("parallel_mode", "data_parallel")?.with("device_num", 4)?,
        ..Default::default()
    };
    let train = DataSource::new(Rings { len: 4096, seed: 1 });
    let trainer = Trainer::new("rings-mlp", autopar::model_network(Arc::from(model), 1), train, cfg);
    let report = trainer.fit(vec![Box::new(EpochLog { losses: Vec::new() })])?;

    let test = DataSource::new(Rings { len: 1024, seed: 2 });
    let eval = trainer.evaluate(&report.params()?, &test)?;
    println!("test accuracy {:.1}% on {} points (chance: 33%)", 100.0 * eval.accuracy, eval.samples);
    if eval.accuracy < 0.8 {
        return Err(format!("the rings were not learnt: accuracy {:.3}", eval.accuracy).into());
    }
    Ok(())
}
