//! The plan's predictions against what a step really does. For random strategies on 2, 4 and 8
//! simulated devices (the MLP, the GPT with dropout and ResNet-18, small sizes), every rank runs
//! one training step through a metering communicator: the bytes it hands to each kind of
//! collective over each group equal the prediction of its program exactly, and the executor's
//! peak of live values is within 10% of the predicted peak activation memory. The same holds for
//! the plans of every auto_parallel search and for the parallel optimizer's collectives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use autopar_comm::{LocalComm, Metered};
use autopar_graph::{Graph, NodeId};
use autopar_models::{Gpt, GptConfig, Mlp, MlpConfig, Mode, Model, ResNet, ResNetConfig};
use autopar_parallel::{assign_random_strategies, Memory, ParallelContext, RankCost};
use autopar_runtime::ParamSource;
use autopar_runtime::ParamStore;
use autopar_runtime::{Job, RankTrainer};
use autopar_tensor::Tensor;
use serde_json::json;

struct Net {
    graph: Graph,
    loss: NodeId,
    batch: Vec<(String, Tensor)>,
}

fn net(model: &dyn Model, batch: usize, classes: usize) -> Net {
    let (graph, m) = model.build_graph(batch, Mode::Train, 3).unwrap();
    let mut rng = autopar_data::Rng::new(7);
    let mut next = move || rng.next_u64();
    let (xn, yn) = (graph.node(m.x), graph.node(m.labels));
    let nx: usize = xn.ty.shape.iter().product();
    let x = if xn.ty.dtype.is_float() {
        Tensor::from_vec(&xn.ty.shape, (0..nx).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect::<Vec<f32>>()).unwrap()
    } else {
        Tensor::from_vec(&xn.ty.shape, (0..nx).map(|_| (next() % classes as u64) as i64).collect::<Vec<i64>>()).unwrap()
    };
    let ny: usize = yn.ty.shape.iter().product();
    let y = Tensor::from_vec(&yn.ty.shape, (0..ny).map(|_| (next() % classes as u64) as i64).collect::<Vec<i64>>()).unwrap();
    let batch = vec![(xn.name.clone(), x), (yn.name.clone(), y)];
    Net { loss: m.loss, graph, batch }
}

/// Bytes per (collective kind, group).
type Volumes = BTreeMap<(String, Vec<usize>), usize>;

fn check(label: &str, net: &Net, seeds: u64) -> usize {
    let mut collectives = 0;
    for n in [2usize, 4, 8] {
        for seed in 0..seeds {
            let mut g = net.graph.clone();
            assign_random_strategies(&mut g, n, seed * 7 + n as u64);
            let mut ctx = ParallelContext::default();
            ctx.set("device_num", &json!(n)).unwrap();
            ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
            collectives += measure(&format!("{label} n={n} seed={seed}"), net, Job::new(&g, net.loss, &ctx).unwrap());
        }
    }
    collectives
}

/// Run one step of `job` on every rank through a metering communicator and compare with the
/// predictions; the number of (collective, group) pairs seen.
fn measure(label: &str, net: &Net, job: Job) -> usize {
    let n = job.device_num();
    let mut collectives = 0;
    let full = ParamStore::init(job.graph()).unwrap();
    let results = LocalComm::run(n, |comm| -> autopar_runtime::Result<(RankCost, Volumes, usize, usize)> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let metered = Metered::new(Box::new(comm), log.clone());
        let mut t = RankTrainer::new(&job, &metered, ParamSource::Full(&full))?;
        let predicted = RankCost::of(&t.program().program, 1)?;
        let gathered = Memory::gathered_slices(&t.program().program, |_| true);
        metered.clear();
        let out = t.gradients(&net.batch)?;
        let mut measured = Volumes::new();
        for call in metered.calls() {
            *measured.entry((call.kind.to_string(), call.group)).or_default() += call.bytes;
        }
        Ok((predicted, measured, out.run.peak_live_bytes, gathered))
    })
    .unwrap_or_else(|e| panic!("{label}: {e}"));
    for (predicted, measured, peak, gathered) in results {
        let what = format!("{label} rank {}", predicted.rank);
        let want: Volumes = predicted
            .comm
            .iter()
            .filter(|c| c.bytes > 0 || c.kind.name() != "recv")
            .map(|c| ((c.kind.name().to_string(), c.group.clone()), c.bytes))
            .collect();
        assert_eq!(measured, want, "{what}: bytes per (collective, group), measured vs predicted");
        collectives += measured.len();
        // The executor's peak counts the gradients the step forms and keeps; the plan counts
        // them as `gradients`, its activations as what the step holds beyond them, and the
        // parallel optimizer's gathered slices (buffers outside the executor) there too.
        let p = (predicted.memory.peak_activations + predicted.memory.gradients - gathered) as f64;
        assert!((peak as f64 - p).abs() <= 0.1 * p, "{what}: peak live bytes {peak}, predicted {p}");
    }
    collectives
}

/// auto_parallel plans are ordinary plans: the bytes each search's plan predicts are the bytes
/// the ranks hand to the communicator.
#[test]
fn auto_parallel_plans_predict_their_communication() {
    let mlp = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![64, 32], num_classes: 8 }).unwrap();
    let cfg = GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 1, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    let gpt = Gpt::new(cfg).unwrap();
    for (label, net) in [("mlp", net(&mlp, 16, 8)), ("gpt", net(&gpt, 8, 16))] {
        for n in [2usize, 4, 8] {
            for search in ["recursive_programming", "sharding_propagation", "dynamic_programming"] {
                let mut ctx = ParallelContext::default();
                ctx.set("device_num", &json!(n)).unwrap();
                ctx.set("parallel_mode", &json!("auto_parallel")).unwrap();
                ctx.set("search_mode", &json!(search)).unwrap();
                let job = Job::new(&net.graph, net.loss, &ctx).unwrap();
                assert!(measure(&format!("{label} n={n} {search}"), &net, job) > 0, "{label} n={n} {search}: no communication");
            }
        }
    }
}

#[test]
fn predicted_bytes_equal_the_metered_bytes_and_peak_memory_is_close_for_the_mlp() {
    let m = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![16, 16], num_classes: 8 }).unwrap();
    assert!(check("mlp", &net(&m, 16, 8), 6) > 0);
}

#[test]
fn predicted_bytes_equal_the_metered_bytes_and_peak_memory_is_close_for_the_gpt() {
    let cfg = GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 1, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    assert!(check("gpt", &net(&Gpt::new(cfg).unwrap(), 8, 16), 4) > 0);
}

#[test]
fn predicted_bytes_equal_the_metered_bytes_and_peak_memory_is_close_for_resnet18() {
    let cfg = ResNetConfig::resnet18(4).with_width(4).with_stem(autopar_models::Stem::Cifar, &[3, 8, 8]);
    assert!(check("resnet18", &net(&ResNet::new(cfg).unwrap(), 8, 4), 3) > 0);
}

/// The parallel optimizer's all-gathers and reduce-scatters are counted like every other
/// collective (the send buffer): shards over whole replica groups and over groups of 2, data
/// parallel and with random strategies, at every optimizer level (level2 and level3
/// reduce-scatter inside the backward pass, level3 gathers there too).
#[test]
fn the_parallel_optimizer_predicts_its_communication() {
    let m = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![16, 16], num_classes: 8 }).unwrap();
    let net = net(&m, 16, 8);
    let mut sharded = 0;
    for n in [4usize, 8] {
        for (mode, seed) in [("data_parallel", 0u64), ("semi_auto_parallel", 1), ("semi_auto_parallel", 2)] {
            for (size, level) in [(-1i64, "level1"), (2, "level1"), (-1, "level2"), (2, "level2"), (-1, "level3"), (2, "level3")] {
                let mut g = net.graph.clone();
                if mode == "semi_auto_parallel" {
                    assign_random_strategies(&mut g, n, seed * 31 + n as u64);
                }
                let mut ctx = ParallelContext::default();
                ctx.set("device_num", &json!(n)).unwrap();
                ctx.set("parallel_mode", &json!(mode)).unwrap();
                ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
                let cfg = json!({"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": size, "optimizer_level": level});
                ctx.set("parallel_optimizer_config", &cfg).unwrap();
                let job = Job::new(&g, net.loss, &ctx).unwrap();
                let program = job.program(0).unwrap().program;
                sharded += usize::from(!program.reduce_scatter.is_empty() || !program.scatter_in_pass.is_empty());
                measure(&format!("{mode} seed={seed} n={n} shard size {size} {level}"), &net, job);
            }
        }
    }
    assert!(sharded >= 24, "only {sharded} runs sharded anything");
}

/// Gradient accumulation holds the running sums of the earlier micro-batches beside the
/// gradients the current one forms: the plan of an accumulating job counts both.
#[test]
fn an_accumulating_step_plans_its_running_sums_beside_the_gradients_it_forms() {
    let net = net(&Mlp::new(MlpConfig { input_shape: vec![64], hidden: vec![256, 256], num_classes: 10 }).unwrap(), 8, 10);
    let ctx = ParallelContext::default();
    let memory = |micro: usize| {
        let job = Job::with_micro_batches(&net.graph, net.loss, &ctx, micro).unwrap();
        job.plan().program(0).unwrap().memory(job.plan(), 0).unwrap()
    };
    let (once, twice) = (memory(1), memory(2));
    assert_eq!(twice.gradients, once.gradients);
    assert!(twice.peak_activations >= once.peak_activations + once.gradients, "accumulating {twice:?}, one pass {once:?}");
}
