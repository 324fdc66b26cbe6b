//! Helpers the trainer tests share: zoo-model network builders, synthetic data, contexts.

use std::sync::Arc;

use autopar_data::{Dataset, SyntheticDataset, Transforms};
use autopar_layout::Strategy;
use autopar_models::{model_by_name, Mode, Model, ModelOptions};
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{BuildNetwork, DataSource, Network};

/// A network builder for a zoo model, with optional strategies `(op, strategy)` set on the
/// training and the evaluation graph.
pub fn builder(name: &str, opts: ModelOptions, strategies: Vec<(&'static str, Strategy)>) -> BuildNetwork {
    let model: Arc<dyn Model> = Arc::from(model_by_name(name, &opts).unwrap());
    Arc::new(move |batch, train| {
        let mode = if train { Mode::Train } else { Mode::Eval };
        let (mut graph, m) = model.build_graph(batch, mode, 7).map_err(|e| e.to_string())?;
        for (op, s) in &strategies {
            m.shard_graph(&mut graph, op, s.clone()).map_err(|e| e.to_string())?;
        }
        Ok(Network { graph, x: m.x, labels: m.labels, logits: m.logits, loss: m.loss })
    })
}

#[allow(dead_code)] // not every test binary that shares these helpers uses each one
pub fn small_mlp() -> ModelOptions {
    ModelOptions { input_shape: Some(vec![16]), width: Some(32), depth: Some(2), num_classes: Some(4), ..Default::default() }
}

/// A one-block GPT over 16 tokens, context 8.
#[allow(dead_code)] // not every test binary that shares these helpers uses each one
pub fn small_gpt() -> ModelOptions {
    ModelOptions {
        input_shape: Some(vec![8]),
        num_classes: Some(16),
        width: Some(16),
        depth: Some(1),
        heads: Some(2),
        ..Default::default()
    }
}

#[allow(dead_code)]
pub fn clusters(shape: &[usize], classes: usize, len: usize) -> Arc<dyn Dataset> {
    Arc::new(SyntheticDataset::classification(shape, classes, len, 3).unwrap())
}

pub fn source(ds: Arc<dyn Dataset>) -> DataSource {
    DataSource { dataset: ds, transforms: Transforms::new() }
}

pub fn context(mode: &str, n: usize) -> ParallelContext {
    let mut ctx = ParallelContext::default();
    ctx.set_str("parallel_mode", mode).unwrap();
    ctx.set_str("device_num", &n.to_string()).unwrap();
    if mode == "data_parallel" {
        ctx.set_str("gradients_mean", "true").unwrap();
    }
    ctx
}
