//! Mixed precision (`amp_level`): the casts of the policy run the same on every slice, so a
//! parallel job equals stand-alone under each level, over random strategies; parameters and
//! gradients stay float32; the policy's casts move no data between devices; a model trained
//! in bf16 follows its float32 run.

mod common;

use autopar_graph::precision::{AmpLevel, Precision};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::{assign_random_strategies, JobRequest, ParallelContext};
use autopar_runtime::{run_local, Job, LrSchedule, Momentum, Optimizer, ParamSource, ParamStore, RankTrainer, TrainConfig, Trainer};
use autopar_tensor::Tensor;
use common::{batches, context, mlp};
use serde_json::json;

fn optimizer() -> Box<dyn Optimizer> {
    Box::new(Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap())
}

fn job(graph: &Graph, loss: NodeId, ctx: &ParallelContext, precision: Precision) -> Job {
    Job::assemble(&JobRequest { precision, ..JobRequest::new(graph, Some(loss), ctx) }).unwrap()
}

/// Stand-alone under `precision`: the losses and the final parameters.
fn serial(graph: &Graph, loss: NodeId, data: &[Vec<(String, Tensor)>], precision: Precision) -> (Vec<f64>, ParamStore) {
    let job = job(graph, loss, &ParallelContext::default(), precision);
    let mut t = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(graph).unwrap())).unwrap();
    let mut opt = optimizer();
    let losses = data.iter().map(|b| t.step(opt.as_mut(), b).unwrap()).collect();
    (losses, t.params().clone())
}

/// Within `tol` of the largest magnitude, elementwise.
fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * scale, "{what}[{i}]: {a} vs {b} (tolerance {tol} of {scale})");
    }
}

#[test]
fn parallel_equals_stand_alone_under_every_level_over_random_strategies() {
    let batch = 16;
    let (graph, loss) = mlp(batch);
    // Two steps: half-precision rounding amplifies any difference in a parameter from step to
    // step (as in every framework), and two steps test both the forward and the backward.
    let data = batches(batch, 2, 13);
    let (plain, _) = serial(&graph, loss, &data, Precision::default());
    for (level, dtype) in
        [(AmpLevel::O1, DType::BF16), (AmpLevel::O2, DType::BF16), (AmpLevel::O2, DType::F16), (AmpLevel::O3, DType::BF16)]
    {
        let p = Precision::new(level, dtype).unwrap();
        let (want_losses, want) = serial(&graph, loss, &data, p);
        // Half precision changes the numbers, a little.
        assert_ne!(want_losses, plain, "{p}: the policy changes the arithmetic");
        assert_close(&format!("{p} against float32"), &want_losses, &plain, 0.05);
        for (k, n) in [2usize, 4, 8].into_iter().enumerate() {
            // Data parallel splits no sum of a product: the same arithmetic, f32 gradients summed.
            let run = run_local(&job(&graph, loss, &context("data_parallel", n), p), &data, || Ok(optimizer())).unwrap();
            // (The f32 gradients are summed in another order, which can flip a later rounding; O3
            // takes each rank's mean loss in half precision.)
            let (tol, first) = if level == AmpLevel::O3 { (0.01, 0.01) } else { (1e-3, 1e-6) };
            assert_close(&format!("{p} data parallel on {n}"), &run.losses, &want_losses, tol);
            assert_close(&format!("{p} data parallel on {n}, step 1"), &run.losses[..1], &want_losses[..1], first);
            for (name, w) in want.iter() {
                assert_eq!(run.params.require(name).unwrap().dtype(), autopar_tensor::DType::F32, "{name} stays float32");
                assert_close(
                    &format!("{p} data parallel on {n}: {name}"),
                    &run.params.require(name).unwrap().to_f64_vec(),
                    &w.to_f64_vec(),
                    0.01,
                );
            }
            // Model parallel: a product split on its sum adds half-precision partial sums, rounded
            // once more than stand-alone's: within a few bf16 roundings.
            for seed in 0..4u64 {
                let mut g = graph.clone();
                assign_random_strategies(&mut g, n, 31 * seed + k as u64);
                let run = run_local(&job(&g, loss, &context("semi_auto_parallel", n), p), &data, || Ok(optimizer())).unwrap();
                assert_close(&format!("{p} on {n}, seed {seed}"), &run.losses, &want_losses, 0.01);
                for (name, w) in want.iter() {
                    let got = run.params.require(name).unwrap().to_f64_vec();
                    assert_close(&format!("{p} on {n}, seed {seed}: {name}"), &got, &w.to_f64_vec(), 0.01);
                }
            }
        }
    }
}

#[test]
fn the_policys_casts_follow_their_inputs_and_move_no_data() {
    let (graph, loss) = mlp(16);
    for seed in 0..20u64 {
        let mut g = graph.clone();
        assign_random_strategies(&mut g, 8, seed);
        let c = context("semi_auto_parallel", 8);
        let plain = job(&g, loss, &c, Precision::default());
        // O1 casts every product's output, partial sums included; O2 the layer norm's input.
        let level = if seed % 2 == 0 { AmpLevel::O1 } else { AmpLevel::O2 };
        let mixed = job(&g, loss, &c, Precision::new(level, DType::BF16).unwrap());
        // The same communication steps (some of half values now; a cast between a partial sum's
        // all-reduce and a gather parts them into two redistributions), and every parameter
        // split the same.
        let steps = |j: &Job| {
            let mut v: Vec<String> =
                j.network().redistributions.iter().flat_map(|r| r.plan.steps.iter().map(|s| s.step.to_string())).collect();
            v.sort();
            v
        };
        assert_eq!(steps(&plain), steps(&mixed), "seed {seed}");
        for (a, b) in plain.network().params.iter().zip(&mixed.network().params) {
            assert_eq!((&a.name, a.layout.to_string()), (&b.name, b.layout.to_string()), "seed {seed}");
        }
        let casts = mixed.network().graph.nodes().iter().filter(|n| n.op.kind() == "Cast").count();
        assert!(casts >= 5, "seed {seed}: {casts} casts");
        // O2's activations are smaller (O1's half-precision copies may not pay for themselves).
        let mem = |j: &Job| j.plan().program(0).unwrap().memory(j.plan(), 1).unwrap().activations;
        assert!(level == AmpLevel::O1 || mem(&mixed) < mem(&plain), "seed {seed}");
    }
}

#[test]
fn a_gpt_trained_in_bf16_follows_its_float32_run() {
    let run = |precision: Precision| {
        let cfg = TrainConfig { epochs: 1000, max_steps: Some(40), batch_size: 16, prefetch: 0, precision, ..Default::default() };
        let mut cfg = cfg;
        cfg.optimizer.schedule = LrSchedule::Constant(0.05);
        let opts = common::small_gpt();
        let data: std::sync::Arc<dyn autopar_data::Dataset> =
            std::sync::Arc::new(autopar_data::SyntheticDataset::tokens(16, 8, 512, 3).unwrap());
        Trainer::new("gpt", common::builder("gpt", opts, vec![]), common::source(data), cfg).fit(vec![]).unwrap()
    };
    let f32_run = run(Precision::default());
    let bf16_run = run(Precision::new(AmpLevel::O2, DType::BF16).unwrap());
    let tail = |r: &autopar_runtime::TrainReport| r.losses[30..].iter().sum::<f64>() / 10.0;
    let (a, b) = (tail(&f32_run), tail(&bf16_run));
    assert!((a - b).abs() <= 0.02 * a, "mean loss of the last 10 steps: f32 {a}, bf16 {b}");
    assert!(b < 0.9 * bf16_run.losses[0], "it learns: {:?}", bf16_run.losses);
    assert_ne!(f32_run.losses, bf16_run.losses);
}

#[test]
fn every_search_chooses_the_same_strategies_with_the_policys_casts() {
    let gpt = autopar_models::Gpt::new(autopar_models::GptConfig {
        vocab: 64,
        context: 16,
        width: 32,
        heads: 4,
        layers: 2,
        ..Default::default()
    })
    .unwrap();
    let (graph, m) = autopar_models::Model::build_graph(&gpt, 16, autopar_models::Mode::Train, 7).unwrap();
    for mode in ["dynamic_programming", "recursive_programming", "sharding_propagation"] {
        let mut c = context("auto_parallel", 8);
        c.set("search_mode", &json!(mode)).unwrap();
        let strategies = |p: Precision| -> std::collections::BTreeMap<String, String> {
            let j = job(&graph, m.loss, &c, p);
            j.network().nodes.iter().filter_map(|n| Some((n.name.clone(), format!("{:?}", n.strategy.as_ref()?)))).collect()
        };
        let plain = strategies(Precision::default());
        let mixed = strategies(Precision::new(AmpLevel::O2, DType::BF16).unwrap());
        assert!(!plain.is_empty());
        for (name, s) in &plain {
            assert_eq!(mixed.get(name), Some(s), "{mode}: {name}");
        }
    }
}

/// x -> dense -> batch norm (running statistics as frozen parameters) -> relu -> dense -> loss.
fn bn_net(batch: usize) -> (Graph, NodeId) {
    use autopar_graph::ParamSpec;
    let mut b = GraphBuilder::new(5);
    let x = b.input("x", &[batch, 16], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[16, 32], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let h = b.matmul("fc1.mm", x, w1).unwrap();
    let g = b.parameter("bn.gamma", &[32], Initializer::Ones).unwrap();
    let be = b.parameter("bn.beta", &[32], Initializer::Zeros).unwrap();
    let mean = b.parameter_with("bn.moving_mean", ParamSpec::new(&[32], Initializer::Zeros).frozen()).unwrap();
    let var = b.parameter_with("bn.moving_variance", ParamSpec::new(&[32], Initializer::Ones).frozen()).unwrap();
    let h = b.batch_norm("bn", [h, g, be, mean, var], true, 1e-5, 0.9).unwrap();
    let h = b.relu("act", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[32, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc2.mm", h, w2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

#[test]
fn a_half_precision_batch_norm_updates_its_running_statistics() {
    let (graph, loss) = bn_net(16);
    let data = batches(16, 2, 13);
    let (_, plain) = serial(&graph, loss, &data, Precision::default());
    for level in [AmpLevel::O2, AmpLevel::O3] {
        let (_, mixed) = serial(&graph, loss, &data, Precision::new(level, DType::BF16).unwrap());
        for name in ["bn.moving_mean", "bn.moving_variance"] {
            let (got, want) = (mixed.require(name).unwrap(), plain.require(name).unwrap());
            assert_eq!(got.dtype(), autopar_tensor::DType::F32, "{level}: {name}");
            assert_close(&format!("{level}: {name}"), &got.to_f64_vec(), &want.to_f64_vec(), 0.02);
            let start = ParamStore::init(&graph).unwrap();
            assert!(!got.bit_eq(start.require(name).unwrap()), "{level}: {name} was updated");
        }
    }
}

#[test]
fn strategy_files_saved_under_one_level_load_under_another() {
    let (graph, loss) = mlp(16);
    let mut g = graph.clone();
    assign_random_strategies(&mut g, 8, 5);
    let dir = tempfile::tempdir().unwrap();
    let o2 = Precision::new(AmpLevel::O2, DType::BF16).unwrap();
    for (save, load) in [(Precision::default(), o2), (o2, Precision::default())] {
        let saved = job(&g, loss, &context("semi_auto_parallel", 8), save);
        let path = dir.path().join("s.json");
        saved.plan().strategy_file(false, &|_| Vec::new()).save(&path).unwrap();
        let mut c = context("semi_auto_parallel", 8);
        c.set("strategy_ckpt_config", &json!({ "load_file": path.to_str().unwrap() })).unwrap();
        let loaded = job(&graph, loss, &c, load);
        let strategies = |j: &Job| -> Vec<(String, String)> {
            j.network().nodes.iter().filter(|n| n.kind == "MatMul").map(|n| (n.name.clone(), format!("{:?}", n.strategy))).collect()
        };
        assert_eq!(strategies(&saved), strategies(&loaded), "saved under {save}, loaded under {load}");
        assert!(strategies(&loaded).iter().all(|(_, s)| s != "None"));
    }
}

#[test]
fn in_a_pipeline_the_stages_are_float32s_and_each_cast_is_on_its_readers_stage() {
    let gpt = autopar_models::Gpt::new(autopar_models::GptConfig {
        vocab: 64,
        context: 16,
        width: 32,
        heads: 4,
        layers: 4,
        ..Default::default()
    })
    .unwrap();
    let (graph, m) = autopar_models::Model::build_graph(&gpt, 8, autopar_models::Mode::Train, 7).unwrap();
    let mut c = context("semi_auto_parallel", 4);
    c.set("pipeline_stages", &json!(2)).unwrap();
    let assemble = |c: &ParallelContext, p: Precision| {
        Job::assemble(&JobRequest { micro_batches: Some(2), precision: p, ..JobRequest::new(&graph, Some(m.loss), c) }).unwrap()
    };
    let o2 = Precision::new(AmpLevel::O2, DType::BF16).unwrap();
    let (plain, mixed) = (assemble(&c, Precision::default()), assemble(&c, o2));
    // The same cut between the stages.
    let stages = |j: &Job| -> std::collections::BTreeMap<String, Option<usize>> {
        let p = j.plan();
        p.plan
            .graph
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, n)| n.op.kind() != "Cast")
            .map(|(i, n)| (n.name.clone(), p.stage_of[i]))
            .collect()
    };
    assert_eq!(stages(&plain), stages(&mixed));
    let plan = mixed.plan();
    let g = &plan.plan.graph;
    let users = g.users();
    let mut checked = 0;
    for (i, node) in g.nodes().iter().enumerate() {
        if node.op.is_inserted_cast() && g.node(node.inputs[0]).is_stageless() {
            for reader in &users[i] {
                assert_eq!(plan.stage_of[i], plan.stage_of[reader.0], "{} and its reader {}", node.name, g.node(*reader).name);
            }
            checked += 1;
        }
    }
    assert!(checked > 10, "{checked} casts of parameters");
    // Interleaved pieces assemble too, the outputs' casts with their producers.
    c.set("pipeline_config", &json!({ "pipeline_interleave": true })).unwrap();
    for p in [o2, Precision::new(AmpLevel::O3, DType::BF16).unwrap()] {
        Job::assemble(&JobRequest { micro_batches: Some(4), precision: p, ..JobRequest::new(&graph, Some(m.loss), &c) }).unwrap();
    }
}
