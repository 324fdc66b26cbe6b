//! Helpers the trainer tests share: zoo-model network builders, synthetic data, contexts.
// Not every test binary that shares these helpers uses each one.
#![allow(dead_code)]

use std::sync::Arc;

use autopar_data::{Dataset, SyntheticDataset, Transforms};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_layout::Strategy;
use autopar_models::{model_by_name, Mode, Model, ModelOptions};
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{BuildNetwork, DataSource, Network};
use autopar_tensor::Tensor;

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

/// x -> dense + bias -> gelu -> layer norm -> dense -> relu -> dense -> softmax cross-entropy.
pub fn mlp(batch: usize) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(7);
    let x = b.input("x", &[batch, 16], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[32, 16], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[32], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let h = b.matmul_t("fc1.mm", x, w1, false, true).unwrap();
    let h = b.add("fc1.add", h, b1).unwrap();
    let h = b.gelu("act1", h).unwrap();
    let g = b.parameter("ln.gamma", &[32], Initializer::Ones).unwrap();
    let be = b.parameter("ln.beta", &[32], Initializer::Zeros).unwrap();
    let h = b.layer_norm("ln", h, g, be, -1, 1e-5).unwrap();
    let w2 = b.parameter("fc2.weight", &[32, 16], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let h = b.matmul("fc2.mm", h, w2).unwrap();
    let h = b.relu("act2", h).unwrap();
    let w3 = b.parameter("fc3.weight", &[16, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc3.mm", h, w3).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

/// `steps` batches of `batch` rows for [`mlp`]: x uniform in [-1, 1], 8 classes.
pub fn batches(batch: usize, steps: usize, seed: u64) -> Vec<Vec<(String, Tensor)>> {
    let mut rng = autopar_data::Rng::new(seed | 1);
    let mut next = move || rng.next_u64();
    (0..steps)
        .map(|_| {
            let x: Vec<f32> = (0..batch * 16).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let y: Vec<i64> = (0..batch).map(|_| (next() % 8) as i64).collect();
            vec![("x".to_string(), Tensor::from_vec(&[batch, 16], x).unwrap()), ("y".to_string(), Tensor::from_vec(&[batch], y).unwrap())]
        })
        .collect()
}

/// A GPT with a tied embedding and dropout.
pub fn gpt() -> BuildNetwork {
    let gpt = autopar_models::Gpt::new(autopar_models::GptConfig {
        vocab: 16,
        context: 8,
        width: 16,
        heads: 2,
        layers: 2,
        dropout: 0.1,
        ..Default::default()
    })
    .unwrap();
    let model: Arc<dyn Model> = Arc::new(gpt);
    Arc::new(move |batch, train| {
        let (graph, m) = model.build_graph(batch, if train { Mode::Train } else { Mode::Eval }, 7).map_err(|e| e.to_string())?;
        Ok(Network { graph, x: m.x, labels: m.labels, logits: m.logits, loss: m.loss })
    })
}

/// Synthetic tokens for [`gpt`]: vocabulary 16, context 8, 256 samples.
pub fn tokens() -> Arc<dyn Dataset> {
    Arc::new(SyntheticDataset::tokens(16, 8, 256, 5).unwrap())
}
