//! Every model of the zoo trained for a few dozen steps on a small synthetic task through the
//! autodiff, the executor and an optimizer; the GPT's tied embedding, causality and the ResNet's
//! running statistics checked through real runs.

use std::sync::Arc;

use autopar_data::{DataLoader, Dataset, LoaderConfig, SyntheticDataset, Transforms};
use autopar_graph::Graph;
use autopar_graph::{DType, NodeId};
use autopar_models::{Gpt, GptConfig, Mlp, MlpConfig, Mode, Model, ModelGraph, ResNet, ResNetConfig, Stem};
use autopar_parallel::ParallelContext;
use autopar_runtime::{AdamW, Executor, Job, LrSchedule, Momentum, Optimizer, ParamSource, ParamStore, RankTrainer};
use autopar_tensor::Tensor;

/// The input and label tensors of one batch for `model`.
fn feeds(model: &dyn Model, m: &ModelGraph, x: &[f32], y: &[i64], n: usize) -> Vec<(NodeId, Tensor)> {
    let mut xs = vec![n];
    xs.extend(model.input_shape());
    let x = match model.input_dtype() {
        DType::I64 => Tensor::from_vec(&xs, x.iter().map(|&v| v as i64).collect()).unwrap(),
        _ => Tensor::from_vec(&xs, x.to_vec()).unwrap(),
    };
    let mut ys = vec![n];
    ys.extend(model.label_shape());
    vec![(m.x, x), (m.labels, Tensor::from_vec(&ys, y.to_vec()).unwrap())]
}

fn loader(data: SyntheticDataset, batch: usize) -> DataLoader {
    let cfg = LoaderConfig { batch_size: batch, drop_remainder: true, prefetch: 0, seed: 3, ..LoaderConfig::default() };
    DataLoader::new(Arc::new(data), Transforms::new(), cfg).unwrap()
}

/// Trains `model` for `steps` steps; returns the losses, the parameters and the model graph.
fn train(model: &dyn Model, data: &DataLoader, steps: usize, opt: &mut dyn Optimizer) -> (Vec<f64>, ParamStore) {
    let batch = data.config().batch_size;
    let (graph, m) = model.build_graph(batch, Mode::Train, 11).unwrap();
    let mut step = alone(&graph, m.loss, ParamSource::Full(&ParamStore::init(&graph).unwrap()));
    let per_epoch = data.batches_per_epoch();
    let mut losses = Vec::new();
    for s in 0..steps {
        let b = data.batch((s / per_epoch) as u64, s % per_epoch).unwrap();
        let f = named(&graph, feeds(model, &m, &b.x, b.y.as_ref().unwrap(), batch));
        losses.push(step.step(opt, &f).unwrap());
    }
    (losses, step.params().clone())
}

/// One device's trainer of `graph`.
fn alone(graph: &Graph, loss: NodeId, params: ParamSource<'_>) -> RankTrainer {
    RankTrainer::alone(&Job::new(graph, loss, &ParallelContext::default()).unwrap(), params).unwrap()
}

/// Feeds by input name.
fn named(graph: &Graph, feeds: Vec<(NodeId, Tensor)>) -> Vec<(String, Tensor)> {
    feeds.into_iter().map(|(id, t)| (graph.node(id).name.clone(), t)).collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The mean of the last five losses is below `ratio` times the first loss.
fn assert_learned(name: &str, losses: &[f64], ratio: f64) {
    let (first, last) = (losses[0], mean(&losses[losses.len() - 5..]));
    eprintln!("{name}: loss {first:.4} -> {last:.4} (mean of the last five)");
    assert!(
        last < ratio * first,
        "{name}: loss went from {first:.4} to {last:.4} (wanted below {:.4}); losses {losses:.3?}",
        ratio * first
    );
}

fn momentum(lr: f64) -> Momentum {
    Momentum::new(LrSchedule::Constant(lr), 0.9).unwrap()
}

#[test]
fn the_mlp_learns_gaussian_clusters() {
    let model = Mlp::new(MlpConfig { input_shape: vec![1, 6, 6], hidden: vec![32, 32], num_classes: 5 }).unwrap();
    let data = loader(SyntheticDataset::classification(&[1, 6, 6], 5, 512, 1).unwrap(), 32);
    let (losses, _) = train(&model, &data, 30, &mut momentum(0.05));
    assert_learned("mlp", &losses, 0.3);
}

#[test]
fn resnet18_with_the_cifar_stem_learns_gaussian_clusters_and_updates_its_running_statistics() {
    let cfg = ResNetConfig::resnet18(4).with_width(4).with_stem(Stem::Cifar, &[3, 8, 8]);
    let model = ResNet::new(cfg).unwrap();
    let data = loader(SyntheticDataset::classification(&[3, 8, 8], 4, 256, 2).unwrap(), 16);
    let (losses, mut params) = train(&model, &data, 30, &mut momentum(0.05));
    assert_learned("resnet18", &losses, 0.4);

    // Training moved the running statistics away from their initial zeros and ones.
    let mean0 = params.require("layer1.0.bn1.moving_mean").unwrap().to_f64_vec();
    let var0 = params.require("layer4.1.bn2.moving_variance").unwrap().to_f64_vec();
    assert!(mean0.iter().any(|v| v.abs() > 1e-3), "{mean0:?}");
    assert!(var0.iter().any(|v| (v - 1.0).abs() > 1e-3), "{var0:?}");

    // The eval graph runs on the same parameters (running statistics) and scores the training
    // data well; it leaves the running statistics alone.
    let (graph, m) = model.build_graph(16, Mode::Eval, 11).unwrap();
    let exec = Executor::new(graph, &[m.loss]).unwrap();
    let b = data.batch(0, 0).unwrap();
    let out = exec.run(&mut params, &feeds(&model, &m, &b.x, b.y.as_ref().unwrap(), 16), 0).unwrap();
    let eval_loss = out.values[0].item().unwrap();
    assert!(eval_loss < 0.5 * losses[0], "eval loss {eval_loss} vs first training loss {}", losses[0]);
    assert_eq!(params.require("layer1.0.bn1.moving_mean").unwrap().to_f64_vec(), mean0);
}

#[test]
fn resnet34_with_a_tiny_width_learns_gaussian_clusters() {
    let model = ResNet::new(ResNetConfig::resnet34(3).with_width(4).with_stem(Stem::Cifar, &[3, 8, 8])).unwrap();
    let data = loader(SyntheticDataset::classification(&[3, 8, 8], 3, 256, 4).unwrap(), 16);
    let (losses, _) = train(&model, &data, 30, &mut momentum(0.02));
    assert_learned("resnet34", &losses, 0.4);
}

#[test]
fn resnet50_with_the_imagenet_stem_learns_gaussian_clusters() {
    let model = ResNet::new(ResNetConfig::resnet50(4).with_width(4).with_stem(Stem::ImageNet, &[3, 32, 32])).unwrap();
    let data = loader(SyntheticDataset::classification(&[3, 32, 32], 4, 256, 5).unwrap(), 16);
    let (losses, _) = train(&model, &data, 30, &mut momentum(0.02));
    assert_learned("resnet50", &losses, 0.4);
}

fn tiny_gpt() -> GptConfig {
    GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 2, ..GptConfig::default() }
}

#[test]
fn the_gpt_learns_next_token_structure() {
    let model = Gpt::new(tiny_gpt()).unwrap();
    let data = loader(SyntheticDataset::tokens(16, 8, 512, 6).unwrap(), 16);
    let mut opt = AdamW::new(LrSchedule::Constant(1e-2)).unwrap();
    let (losses, _) = train(&model, &data, 40, &mut opt);
    assert!((losses[0] - (16f64).ln()).abs() < 0.3, "an untrained model is near uniform: {}", losses[0]);
    assert_learned("gpt", &losses, 0.5);
}

/// Loss and gradients of one batch.
fn gradients(model: &Gpt, params: &mut ParamStore, x: &[f32], y: &[i64], n: usize) -> (f64, Vec<(String, Tensor)>) {
    let (graph, m) = model.build_graph(n, Mode::Train, 5).unwrap();
    let out = alone(&graph, m.loss, ParamSource::Full(params)).gradients(&named(&graph, feeds(model, &m, x, y, n))).unwrap();
    (out.loss, out.grads)
}

fn grad(grads: &[(String, Tensor)], name: &str) -> Vec<f64> {
    grads.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no gradient for {name}")).1.to_f64_vec()
}

#[test]
fn the_tied_embedding_is_one_parameter_whose_gradient_sums_the_lookup_and_the_lm_head() {
    let tied = Gpt::new(tiny_gpt()).unwrap();
    let untied = Gpt::new(GptConfig { tie_embeddings: false, ..tiny_gpt() }).unwrap();
    let data = SyntheticDataset::tokens(16, 8, 4, 7).unwrap();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..4 {
        let (a, b) = data.get(i).unwrap();
        x.extend(a);
        y.extend(b);
    }
    let (graph, _) = tied.build_graph(4, Mode::Train, 5).unwrap();
    let mut p_tied = ParamStore::init(&graph).unwrap();
    let mut p_untied = p_tied.clone();
    p_untied.insert("lm_head.weight", p_tied.require("wte.weight").unwrap().clone());

    let (loss_t, g_t) = gradients(&tied, &mut p_tied, &x, &y, 4);
    let (loss_u, g_u) = gradients(&untied, &mut p_untied, &x, &y, 4);
    assert!((loss_t - loss_u).abs() < 1e-6, "same values, same loss: {loss_t} vs {loss_u}");
    assert!(g_t.iter().all(|(n, _)| n != "lm_head.weight"), "the tied model has no separate head");

    let (lookup, head, both) = (grad(&g_u, "wte.weight"), grad(&g_u, "lm_head.weight"), grad(&g_t, "wte.weight"));
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(norm(&lookup) > 1e-4 && norm(&head) > 1e-4, "both uses contribute: {} {}", norm(&lookup), norm(&head));
    for (i, ((a, b), t)) in lookup.iter().zip(&head).zip(&both).enumerate() {
        assert!((a + b - t).abs() <= 1e-5 + 1e-4 * t.abs(), "element {i}: lookup {a} + head {b} != tied {t}");
    }

    // And a central finite difference of the loss agrees with the tied gradient on the
    // embedding rows of tokens that occur (gathered) and of one that is only scored.
    let wte = p_tied.require("wte.weight").unwrap().to_f64_vec();
    let h = 1e-2;
    let width = tiny_gpt().width;
    for &(row, col) in &[(x[0] as usize, 3usize), (y[5] as usize, 7)] {
        let k = row * width + col;
        let loss_at = |delta: f64| {
            let mut p = p_tied.clone();
            let mut w = wte.clone();
            w[k] += delta;
            p.insert("wte.weight", Tensor::from_vec(&[16, width], w.iter().map(|&v| v as f32).collect()).unwrap());
            gradients(&tied, &mut p, &x, &y, 4).0
        };
        let fd = (loss_at(h) - loss_at(-h)) / (2.0 * h);
        assert!((fd - both[k]).abs() < 2e-3 + 0.05 * fd.abs(), "wte[{row}, {col}]: finite difference {fd} vs gradient {}", both[k]);
    }
}

#[test]
fn the_gpt_is_causal_changing_a_later_token_leaves_earlier_logits_unchanged() {
    let model = Gpt::new(tiny_gpt()).unwrap();
    let (graph, m) = model.build_graph(1, Mode::Eval, 9).unwrap();
    let mut params = ParamStore::init(&graph).unwrap();
    let exec = Executor::new(graph, &[m.logits]).unwrap();
    let mut x: Vec<f32> = (0..8).map(|i| ((i * 5) % 16) as f32).collect();
    let y = vec![0i64; 8];
    let before = exec.run(&mut params, &feeds(&model, &m, &x, &y, 1), 0).unwrap().values[0].to_f64_vec();
    x[5] = ((x[5] as usize + 3) % 16) as f32;
    let after = exec.run(&mut params, &feeds(&model, &m, &x, &y, 1), 0).unwrap().values[0].to_f64_vec();
    let vocab = 16;
    assert_eq!(before[..5 * vocab], after[..5 * vocab], "positions 0..5 must not see token 5");
    assert!(before[5 * vocab..].iter().zip(&after[5 * vocab..]).any(|(a, b)| (a - b).abs() > 1e-6), "positions from 5 on see the change");
}

#[test]
fn a_gpt_with_dropout_trains_and_its_eval_graph_is_deterministic() {
    let model = Gpt::new(GptConfig { dropout: 0.2, ..tiny_gpt() }).unwrap();
    let data = loader(SyntheticDataset::tokens(16, 8, 64, 8).unwrap(), 8);
    let mut opt = AdamW::new(LrSchedule::Constant(1e-2)).unwrap();
    let (losses, mut params) = train(&model, &data, 10, &mut opt);
    assert!(losses.iter().all(|l| l.is_finite()));

    let (graph, m) = model.build_graph(8, Mode::Eval, 11).unwrap();
    let exec = Executor::new(graph, &[m.loss]).unwrap();
    let b = data.batch(0, 0).unwrap();
    let f = feeds(&model, &m, &b.x, b.y.as_ref().unwrap(), 8);
    let first = exec.run(&mut params, &f, 0).unwrap().values[0].item().unwrap();
    let second = exec.run(&mut params, &f, 1).unwrap().values[0].item().unwrap();
    assert_eq!(first, second, "no dropout in evaluation");
}
