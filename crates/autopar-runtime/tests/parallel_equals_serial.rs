//! Parallel equals serial: loss and every parameter after K steps under semi_auto_parallel with
//! random valid strategies (and under data_parallel) match stand-alone training on the same data.
//! Tolerance: relative 1e-5 (absolute 1e-6 near zero), f32 arithmetic.

mod common;

use autopar_graph::{Graph, GraphBuilder, NodeId};
use autopar_parallel::{assign_random_layouts, assign_random_strategies, ParallelContext};
use autopar_runtime::LrSchedule;
use autopar_runtime::ParamSource;
use autopar_runtime::{run_local, Job, RankTrainer};
use autopar_runtime::{Momentum, Optimizer, ParamStore, Sgd};
use autopar_tensor::Tensor;
use common::{batches, mlp};
use serde_json::json;

const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-6;
const STEPS: usize = 10;

/// A small classifier: dense (transpose-b weight) + bias, GELU, LayerNorm, dense, ReLU, dense,
/// softmax cross-entropy.
fn optimizer(momentum: bool) -> Box<dyn Optimizer> {
    if momentum {
        Box::new(Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap())
    } else {
        Box::new(Sgd::new(LrSchedule::Constant(0.2)).unwrap())
    }
}

/// Stand-alone training: the reference.
fn serial(graph: &Graph, loss: NodeId, data: &[Vec<(String, Tensor)>], momentum: bool) -> (Vec<f64>, ParamStore) {
    let job = Job::new(graph, loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(graph).unwrap())).unwrap();
    let mut opt = optimizer(momentum);
    let losses = data.iter().map(|batch| step.step(opt.as_mut(), batch).unwrap()).collect();
    (losses, step.params().clone())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= ATOL + RTOL * b.abs()
}

fn assert_same(what: &str, losses: &[f64], params: &ParamStore, want_losses: &[f64], want: &ParamStore) {
    for (s, (a, b)) in losses.iter().zip(want_losses).enumerate() {
        assert!(close(*a, *b), "{what}: loss at step {s} is {a}, stand-alone {b}");
    }
    for (name, w) in want.iter() {
        let got = params.get(name).unwrap_or_else(|| panic!("{what}: parameter {name} missing"));
        assert_eq!(got.shape(), w.shape(), "{what}: {name}");
        for (i, (a, b)) in got.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(close(*a, b), "{what}: {name}[{i}] = {a}, stand-alone {b}");
        }
    }
}

fn semi_auto(n: usize) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    c
}

/// MindSpore `Layout`s on every op: named device axes in random orders, several on one
/// dimension, replica axes between them; training with the optimizer equals stand-alone.
#[test]
fn semi_auto_mlp_equals_stand_alone_over_random_layouts() {
    let batch = 16;
    let (graph, loss) = mlp(batch);
    let data = batches(batch, STEPS, 11);
    let (want_losses, want) = serial(&graph, loss, &data, true);
    let mut multi_axis = 0;
    for n in [2usize, 4, 8] {
        for seed in 0..12u64 {
            let mut g = graph.clone();
            assign_random_layouts(&mut g, n, seed * 104_729 + n as u64);
            let job = Job::new(&g, loss, &semi_auto(n)).unwrap_or_else(|e| panic!("n={n} seed={seed}: {e}"));
            let run = run_local(&job, &data, || Ok(optimizer(true))).unwrap_or_else(|e| panic!("n={n} seed={seed}: {e}"));
            assert_same(&format!("{n} devices, layout seed {seed}"), &run.losses, &run.params, &want_losses, &want);
            multi_axis += job.network().nodes.iter().filter(|p| p.inputs.iter().any(|l| l.dim_axes().iter().any(|a| a.len() > 1))).count();
        }
    }
    assert!(multi_axis > 10, "only {multi_axis} ops had a dimension split along several axes");
}

#[test]
fn semi_auto_mlp_equals_stand_alone_over_random_strategies() {
    let batch = 16;
    let (graph, loss) = mlp(batch);
    let data = batches(batch, STEPS, 11);
    let (want_losses, want) = serial(&graph, loss, &data, true);
    let mut runs = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for n in [2usize, 4, 8] {
        for seed in 0..40u64 {
            let mut g = graph.clone();
            assign_random_strategies(&mut g, n, seed * 7919 + n as u64);
            let mut ctx = semi_auto(n);
            ctx.set("enable_alltoall", &json!(seed % 2 == 1)).unwrap();
            let job = Job::new(&g, loss, &ctx).unwrap();
            let run = run_local(&job, &data, || Ok(optimizer(true))).unwrap_or_else(|e| panic!("n={n} seed={seed}: {e}"));
            assert_same(&format!("{n} devices, strategy seed {seed}"), &run.losses, &run.params, &want_losses, &want);
            // Counted when a split needs communication beyond the loss's all-reduce.
            let prog = job.program(0).unwrap().program;
            let split: Vec<&str> = prog
                .graph
                .nodes()
                .iter()
                .filter(|n| n.op.is_communication() && !n.name.starts_with("loss.out") && !n.name.starts_with("grad/loss.out"))
                .map(|n| n.op.kind())
                .collect();
            if !split.is_empty() {
                runs += 1;
                kinds.extend(split);
            }
        }
    }
    assert!(runs >= 100, "{runs} runs needed communication");
    for kind in ["AllReduce", "AllGather", "ReduceScatter", "AllToAll"] {
        assert!(kinds.contains(kind), "no {kind} in any run: {kinds:?}");
    }
}

#[test]
fn data_parallel_equals_stand_alone_on_the_same_global_batch() {
    let per_rank = 4;
    for n in [2usize, 4] {
        let (global, gloss) = mlp(per_rank * n);
        let data = batches(per_rank * n, STEPS, 5);
        let (want_losses, want) = serial(&global, gloss, &data, false);
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(n)).unwrap();
        ctx.set("parallel_mode", &json!("data_parallel")).unwrap();
        ctx.set("gradients_mean", &json!(true)).unwrap();
        let job = Job::new(&global, gloss, &ctx).unwrap();
        // Planned as all-batch strategies: every parameter replicated over all ranks, every
        // rank's inputs its rows of the batch.
        for p in &job.network().params {
            assert_eq!(p.layout.num_slices(), 1, "{}", p.name);
        }
        let prog = job.program(1).unwrap().program;
        assert_eq!(prog.inputs[0].slice[0], per_rank..2 * per_rank);
        let run = run_local(&job, &data, || Ok(optimizer(false))).unwrap();
        assert_same(&format!("data_parallel on {n} ranks"), &run.losses, &run.params, &want_losses, &want);
    }
}

#[test]
fn a_loss_of_one_value_per_sample_trains_their_sum_in_every_mode() {
    let batch = 16;
    let (graph, _) = mlp(batch);
    let mut b = GraphBuilder::from_graph(graph, 7);
    let logits = b.graph().find("fc3.mm").unwrap();
    let sq = b.mul("sq", logits, logits).unwrap();
    let mean = b.reduce_mean("mean", sq, &[1], false).unwrap();
    let per_sample = b.op("per_sample", autopar_graph::ops::Scale { factor: 1.0 / batch as f64 }, &[mean]).unwrap();
    let graph = b.finish();
    let data = batches(batch, 3, 21);
    let (want_losses, want) = serial(&graph, per_sample, &data, false);
    for (n, mode, seed) in [(4usize, "semi_auto_parallel", 3u64), (8, "semi_auto_parallel", 4), (4, "data_parallel", 0)] {
        let mut g = graph.clone();
        let mut ctx = semi_auto(n);
        ctx.set("parallel_mode", &json!(mode)).unwrap();
        if mode == "semi_auto_parallel" {
            assign_random_strategies(&mut g, n, seed);
        } else {
            ctx.set("gradients_mean", &json!(true)).unwrap();
        }
        let job = Job::new(&g, per_sample, &ctx).unwrap();
        let run = run_local(&job, &data, || Ok(optimizer(false))).unwrap();
        assert_same(&format!("per-sample loss, {mode} on {n} devices"), &run.losses, &run.params, &want_losses, &want);
    }
}

#[test]
fn dataset_strategies_do_not_change_the_result() {
    let batch = 16;
    let (graph, loss) = mlp(batch);
    let data = batches(batch, 2, 9);
    let (want_losses, want) = serial(&graph, loss, &data, true);
    for (n, ds) in [(4usize, json!("full_batch")), (8, json!([[2, 4], [2]])), (4, json!([[4, 1], [4]])), (8, json!([[1, 8], [1]]))] {
        let mut ctx = semi_auto(n);
        ctx.set("dataset_strategy", &ds).unwrap();
        let mut g = graph.clone();
        assign_random_strategies(&mut g, n, 77);
        let job = Job::new(&g, loss, &ctx).unwrap();
        let run = run_local(&job, &data, || Ok(optimizer(true))).unwrap();
        assert_same(&format!("dataset_strategy {ds} on {n} devices"), &run.losses, &run.params, &want_losses, &want);
    }
    // A batch the devices do not divide is a clear error under the default data_parallel split.
    let (g, loss) = mlp(6);
    let e = Job::new(&g, loss, &semi_auto(4)).unwrap_err().to_string();
    assert!(e.contains("cannot be split over 4 devices"), "{e}");
}

#[test]
fn parameter_broadcast_makes_replicas_start_from_the_first_rank_of_their_mirror_group() {
    use autopar_comm::{Communicator, LocalComm};
    use autopar_runtime::RankTrainer;
    let batch = 16;
    let (mut graph, loss) = mlp(batch);
    // A frozen fc3.weight split in two and mirrored over pairs of ranks no other collective
    // uses: no gradient bucket syncs it, the broadcast still must.
    let mm = graph.find("fc3.mm").unwrap();
    graph.set_strategy(mm, "((2, 1), (1, 2))".parse().unwrap()).unwrap();
    let w3 = graph.find("fc3.weight").unwrap();
    if let autopar_graph::OpKind::Parameter(p) = &mut graph.node_mut(w3).op {
        p.trainable = false;
    }
    let job = Job::new(&graph, loss, &semi_auto(4)).unwrap();
    let prog = job.program(0).unwrap().program;
    let mirror = &prog.param("fc3.weight").unwrap().mirror;
    assert_eq!(mirror.len(), 2);
    assert!(!prog.partitions.iter().flatten().any(|g| g == mirror), "{mirror:?} is used without the broadcast");
    let data = batches(batch, 2, 4);
    let (want_losses, _) = serial(&graph, loss, &data, false);
    for broadcast in [true, false] {
        let mut ctx = semi_auto(4);
        ctx.set("parameter_broadcast", &json!(broadcast)).unwrap();
        let job = Job::new(&graph, loss, &ctx).unwrap();
        let full = ParamStore::init(&graph).unwrap();
        let losses = LocalComm::run(4, |comm| -> autopar_runtime::Result<Vec<f64>> {
            let prog = job.program(comm.rank())?;
            let mut local = ParamStore::new();
            for slot in &prog.program.params {
                let mut t = autopar_runtime::slice_tensor(full.require(&slot.name)?, &slot.slice)?;
                if comm.rank() != slot.mirror[0] {
                    // Every rank but the first of each mirror group starts from other values.
                    let v: Vec<f32> = t.to_vec::<f32>().unwrap().iter().map(|x| x + 0.5).collect();
                    t = Tensor::from_vec(t.shape(), v).unwrap();
                }
                local.insert(&slot.name, t);
            }
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Local(local))?;
            let mut opt = optimizer(false);
            data.iter().map(|b| t.step(opt.as_mut(), b)).collect()
        })
        .unwrap();
        let same = losses[0].iter().zip(&want_losses).all(|(a, b)| close(*a, *b));
        assert_eq!(same, broadcast, "parameter_broadcast = {broadcast}: losses {:?} vs stand-alone {want_losses:?}", losses[0]);
    }
}

/// The ranks kept running between calls (the Python front end's driver) step as `run_local`
/// does, over random strategies, and a full-parameter load reaches every rank's slices with the
/// optimizer state kept.
#[test]
fn ranks_stepped_one_batch_per_call_equal_stand_alone_and_take_new_parameters() {
    use autopar_runtime::LocalRanks;
    use std::sync::Arc;
    let batch = 16;
    let (graph, loss) = mlp(batch);
    let data = batches(batch, 4, 5);
    let (want_losses, want) = serial(&graph, loss, &data, true);
    for (n, seed) in [(2usize, 1u64), (4, 2), (8, 3)] {
        let mut g = graph.clone();
        assign_random_strategies(&mut g, n, seed);
        let job = Job::new(&g, loss, &semi_auto(n)).unwrap();
        let full = ParamStore::init(&graph).unwrap();
        let mut ranks = LocalRanks::start(job, Some(full.clone()), Some(Arc::new(|| Ok(optimizer(true))))).unwrap();
        let losses: Vec<f64> = data.iter().map(|b| ranks.step(b.clone()).unwrap()).collect();
        assert_same(&format!("{n} ranks stepped per call"), &losses, &ranks.params().unwrap(), &want_losses, &want);
        // New values for every parameter: the ranks hold them, sliced, at once.
        ranks.load(full.clone()).unwrap();
        assert_same(&format!("{n} ranks after a load"), &[], &ranks.params().unwrap(), &[], &full);
    }
    // A step in two halves (functional training): the gradients, kept by the ranks and read
    // whole, then the update; or the update with the caller's own values (here the same
    // gradients, whole): either way the stand-alone run, step for step.
    for (n, seed, own) in [(4usize, 4u64, false), (8, 5, true)] {
        let mut g = graph.clone();
        assign_random_strategies(&mut g, n, seed);
        let job = Job::new(&g, loss, &semi_auto(n)).unwrap();
        let full = ParamStore::init(&graph).unwrap();
        let mut ranks = LocalRanks::start(job, Some(full), Some(Arc::new(|| Ok(optimizer(true))))).unwrap();
        let mut losses = Vec::new();
        for b in &data {
            losses.push(ranks.gradients(b.clone()).unwrap());
            let grads = ranks.grads().unwrap();
            let trainable = graph.trainable_parameters().len();
            assert_eq!(grads.len(), trainable, "one whole gradient per trainable parameter");
            ranks.update(own.then_some(grads)).unwrap();
        }
        assert_same(&format!("{n} ranks in two halves, own gradients {own}"), &losses, &ranks.params().unwrap(), &want_losses, &want);
    }
    // A rank's error (a batch of the wrong shape) is the call's error, and the ranks stop.
    let job = Job::new(&graph, loss, &semi_auto(2)).unwrap();
    let mut ranks = LocalRanks::start(job, None, Some(Arc::new(|| Ok(optimizer(false))))).unwrap();
    let wrong = batches(batch / 2, 1, 1).remove(0);
    assert!(ranks.step(wrong).is_err());
    let err = ranks.step(data[0].clone()).unwrap_err().to_string();
    assert!(err.contains("stopped"), "{err}");
}
