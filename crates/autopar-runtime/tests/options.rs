//! Every `set_auto_parallel_context` option autopar accepts changes what MindSpore documents it
//! to change; each test sets one option and checks the effect (the collectives a step makes,
//! their kind, count or width, or the gradients), and that the job still equals stand-alone
//! where the option is meant to keep it so. (Trainer-level options: `tests/trainer.rs`;
//! options refused up front: `autopar-parallel`'s context tests and `autopar plan`'s.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use autopar_comm::{LocalComm, Metered, MeteredCall};
use autopar_graph::ops::Cast;
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId, ParamSpec};
use autopar_layout::Strategy;
use autopar_parallel::ParallelContext;
use autopar_runtime::ParamSource;
use autopar_runtime::ParamStore;
use autopar_runtime::{assemble_params, Job, RankTrainer};
use autopar_tensor::Tensor;
use serde_json::{json, Value};

fn ctx(n: usize, mode: &str, options: &[(&str, Value)]) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!(mode)).unwrap();
    for (k, v) in options {
        c.set(k, v).unwrap();
    }
    c
}

/// x [8, 16] -> dense (w1 [16, 16], `dtype` weights cast to f32) -> tanh -> dense (w2 [16, 4])
/// -> mean of squares. `shard`: strategies by op name.
fn net(dtype: DType, shard: &[(&str, &str)]) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(9);
    let x = b.input("x", &[8, 16], DType::F32).unwrap();
    let init = Initializer::Uniform { low: -0.5, high: 0.5 };
    let w1 = b.parameter_with("w1", ParamSpec::new(&[16, 16], init.clone()).dtype(dtype)).unwrap();
    let w2 = b.parameter_with("w2", ParamSpec::new(&[16, 4], init).dtype(dtype)).unwrap();
    let (w1, w2) = if dtype == DType::F32 {
        (w1, w2)
    } else {
        (b.op("w1.cast", Cast::to(DType::F32), &[w1]).unwrap(), b.op("w2.cast", Cast::to(DType::F32), &[w2]).unwrap())
    };
    let h = b.matmul("mm1", x, w1).unwrap();
    let h = b.tanh("act", h).unwrap();
    let o = b.matmul("mm2", h, w2).unwrap();
    let sq = b.mul("sq", o, o).unwrap();
    let loss = b.reduce_mean("loss", sq, &[], false).unwrap();
    let mut g = b.finish();
    for (op, s) in shard {
        let id = g.find(op).unwrap();
        g.set_strategy(id, s.parse::<Strategy>().unwrap()).unwrap();
    }
    (g, loss)
}

fn batch() -> Vec<(String, Tensor)> {
    let x: Vec<f32> = (0..8 * 16).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    vec![("x".to_string(), Tensor::from_vec(&[8, 16], x).unwrap())]
}

/// One step's synchronised gradients (assembled full tensors), loss, and every rank's metered
/// communicator calls.
fn gradients(job: &Job) -> (f64, ParamStore, Vec<Vec<MeteredCall>>) {
    gradients_on(job, &batch())
}

fn gradients_on(job: &Job, data: &[(String, Tensor)]) -> (f64, ParamStore, Vec<Vec<MeteredCall>>) {
    let full = ParamStore::init(job.graph()).unwrap();
    let out = LocalComm::run(job.device_num(), |comm| -> autopar_runtime::Result<(f64, ParamStore, Vec<MeteredCall>)> {
        let metered = Metered::new(Box::new(comm), Arc::new(Mutex::new(Vec::new())));
        let mut t = RankTrainer::new(job, &metered, ParamSource::Full(&full))?;
        metered.clear();
        let step = t.gradients(data)?;
        let mut grads = ParamStore::new();
        for (n, g) in step.grads {
            grads.insert(&n, g);
        }
        Ok((step.loss, grads, metered.calls()))
    })
    .unwrap();
    let loss = out[0].0;
    let calls = out.iter().map(|o| o.2.clone()).collect();
    let stores: Vec<ParamStore> = out.into_iter().map(|o| o.1).collect();
    (loss, assemble_params(job, &stores).unwrap(), calls)
}

fn stand_alone(graph: &Graph, loss: NodeId) -> ParamStore {
    stand_alone_on(graph, loss, &batch())
}

fn stand_alone_on(graph: &Graph, loss: NodeId, data: &[(String, Tensor)]) -> ParamStore {
    let job = Job::new(graph, loss, &ParallelContext::default()).unwrap();
    let out = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(graph).unwrap())).unwrap().gradients(data).unwrap();
    let mut grads = ParamStore::new();
    for (n, g) in out.grads {
        grads.insert(&n, g);
    }
    grads
}

fn assert_scaled(got: &ParamStore, want: &ParamStore, factor: impl Fn(&str) -> f64, what: &str) {
    for (name, w) in want.iter() {
        let f = factor(name);
        for (i, (a, b)) in got.require(name).unwrap().to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!((a - f * b).abs() <= 1e-5 * (f * b).abs() + 1e-7, "{what}: {name}[{i}] = {a}, expected {f} x {b}");
        }
    }
}

/// Bytes per collective kind of one rank's calls.
fn bytes_by_kind(calls: &[MeteredCall]) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.kind).or_default() += c.bytes;
    }
    m
}

#[test]
fn enable_alltoall_chooses_all_to_all_or_an_all_gather_and_a_local_slice() {
    // mm1's output is split on its rows, act needs it split on its columns: S(0) -> S(1).
    let (graph, loss) = net(DType::F32, &[("act", "((1, 4))")]);
    let want = stand_alone(&graph, loss);
    let mut kinds = Vec::new();
    for on in [true, false] {
        let job = Job::new(&graph, loss, &ctx(4, "semi_auto_parallel", &[("enable_alltoall", json!(on))])).unwrap();
        let prog = job.program(0).unwrap().program;
        // Forward ops only (the backward has their adjoints).
        let count = |kind: &str| prog.graph.nodes().iter().filter(|n| n.op.kind() == kind && !n.name.starts_with("grad/")).count();
        kinds.push((count("AllToAll"), count("AllGather")));
        let (_, got, calls) = gradients(&job);
        assert_scaled(&got, &want, |_| 1.0, &format!("enable_alltoall={on}"));
        assert_eq!(bytes_by_kind(&calls[0]).contains_key("all_to_all"), on, "enable_alltoall={on}: {:?}", bytes_by_kind(&calls[0]));
    }
    let ((a2a_on, ag_on), (a2a_off, ag_off)) = (kinds[0], kinds[1]);
    assert!(a2a_on > 0 && a2a_off == 0, "{kinds:?}");
    assert_eq!(ag_off, ag_on + a2a_on, "each all-to-all becomes an all-gather: {kinds:?}");
}

#[test]
fn loss_repeated_mean_false_sums_the_gradients_of_the_replicated_losses() {
    let (graph, loss) = net(DType::F32, &[("mm1", "((2, 1), (1, 2))")]);
    let want = stand_alone(&graph, loss);
    let job = Job::new(&graph, loss, &ctx(4, "semi_auto_parallel", &[])).unwrap();
    assert_eq!(job.network().gradients.loss_seed, 0.25);
    let (_, mean, _) = gradients(&job);
    assert_scaled(&mean, &want, |_| 1.0, "loss_repeated_mean=true (default)");
    let job = Job::new(&graph, loss, &ctx(4, "semi_auto_parallel", &[("loss_repeated_mean", json!(false))])).unwrap();
    assert_eq!(job.network().gradients.loss_seed, 1.0);
    let (_, summed, _) = gradients(&job);
    assert_scaled(&summed, &want, |_| 4.0, "loss_repeated_mean=false: the 4 replicas of the loss are summed");
}

#[test]
fn gradients_mean_under_semi_auto_divides_each_gradient_by_its_mirror_group() {
    // w1 split 2 ways on 4 devices (mirror groups of 2); w2 replicated (mirror groups of 4).
    let (graph, loss) = net(DType::F32, &[("mm1", "((1, 1), (1, 2))")]);
    let want = stand_alone(&graph, loss);
    let job = Job::new(&graph, loss, &ctx(4, "semi_auto_parallel", &[("gradients_mean", json!(true))])).unwrap();
    let mirror = |name: &str| job.network().param(name).unwrap().mirror.iter().map(|a| a.size).product::<usize>();
    assert_eq!((mirror("w1"), mirror("w2")), (2, 4));
    let (_, got, _) = gradients(&job);
    assert_scaled(&got, &want, |name| 1.0 / mirror(name) as f64, "gradients_mean=true");
}

#[test]
fn gradients_mean_under_data_parallel_averages_the_ranks_gradients_instead_of_summing_them() {
    let (graph, loss) = net(DType::F32, &[]);
    let want = stand_alone(&graph, loss);
    for (mean, factor) in [(true, 1.0), (false, 4.0)] {
        let job = Job::new(&graph, loss, &ctx(4, "data_parallel", &[("gradients_mean", json!(mean))])).unwrap();
        let (_, got, _) = gradients(&job);
        assert_scaled(&got, &want, |_| factor, &format!("data_parallel gradients_mean={mean}"));
    }
}

#[test]
fn gradient_fp32_sync_and_force_fp32_communication_set_the_width_of_half_precision_gradients() {
    let (graph, loss) = net(DType::F16, &[]);
    // 16 * 16 + 16 * 4 gradient values all-reduced in one bucket.
    let values = 16 * 16 + 16 * 4;
    let bucket_bytes = |job: &Job| {
        let (_, _, calls) = gradients(job);
        calls[0].iter().filter(|c| c.kind == "all_reduce").map(|c| c.bytes).max().unwrap()
    };
    for (mode, options, width) in [
        ("semi_auto_parallel", vec![], 4),
        ("semi_auto_parallel", vec![("gradient_fp32_sync", json!(false))], 2),
        ("data_parallel", vec![], 2),
        ("data_parallel", vec![("force_fp32_communication", json!(true))], 4),
    ] {
        let job = Job::new(&graph, loss, &ctx(4, mode, &options)).unwrap();
        assert_eq!(job.network().gradients.buckets.len(), 1);
        assert_eq!(bucket_bytes(&job), values * width, "{mode} {options:?}: the bucket is all-reduced in {width}-byte values");
    }
}

#[test]
fn the_plan_counts_the_flat_buffer_a_bucket_that_cannot_reduce_its_gradients_in_place_keeps() {
    let values = 16 * 16 + 16 * 4;
    for (dtype, mode, options, flat) in [
        // f32 gradients in an f32 bucket: reduced where they lie.
        (DType::F32, "data_parallel", vec![], 0),
        // f16 gradients synced in f32: packed into an f32 buffer.
        (DType::F16, "semi_auto_parallel", vec![], 4),
        // an f16 bucket: packed into an f16 buffer.
        (DType::F16, "data_parallel", vec![], 2),
        (DType::F16, "semi_auto_parallel", vec![("gradient_fp32_sync", json!(false))], 2),
    ] {
        let (graph, loss) = net(dtype, &[]);
        let job = Job::new(&graph, loss, &ctx(4, mode, &options)).unwrap();
        let memory = job.program(0).unwrap().memory(job.plan(), 0).unwrap();
        let program = &job.program(0).unwrap().program;
        assert_eq!(autopar_parallel::Memory::bucket_buffers(program, |_| true), values * flat, "{dtype:?} {mode} {options:?}");
        assert_eq!(memory.gradients, values * dtype.size() + values * flat, "{dtype:?} {mode} {options:?}");
    }
}

#[test]
fn in_process_a_plan_counts_the_copies_a_collective_makes_but_no_packing() {
    let (graph, loss) = net(DType::F32, &[]);
    let values = 16 * 16 + 16 * 4;
    // data_parallel: one f32 bucket reduced where its gradients lie; MPI packs it, in process
    // there is nothing beyond the gradients.
    let job = Job::new(&graph, loss, &ctx(4, "data_parallel", &[])).unwrap();
    let program = &job.program(0).unwrap().program;
    assert_eq!(autopar_parallel::Memory::largest_packing(program, |_| true, true).0, values * 4);
    assert_eq!(autopar_parallel::Memory::largest_packing(program, |_| true, false), (0, 0));
    // The parallel optimizer with shard groups of 2 among 4 replicas: each gradient is
    // rearranged by shard and its parts gathered back, in process too.
    let options = [
        ("enable_parallel_optimizer", json!(true)),
        ("parallel_optimizer_config", json!({"optimizer_weight_shard_size": 2, "parallel_optimizer_threshold": 0})),
    ];
    let job = Job::new(&graph, loss, &ctx(4, "data_parallel", &options)).unwrap();
    let program = &job.program(0).unwrap().program;
    assert_eq!(program.reduce_scatter[0].shard_size, 2);
    let (in_process, _) = autopar_parallel::Memory::largest_packing(program, |_| true, false);
    let (mpi, _) = autopar_parallel::Memory::largest_packing(program, |_| true, true);
    assert!(in_process >= values * 4, "the rearranged gradients: {in_process} < {}", values * 4);
    assert!(mpi > in_process, "MPI packs the sends besides: {mpi} vs {in_process}");
}

#[test]
fn force_fp32_communication_widens_the_redistribution_of_half_precision_values() {
    // w (f16) is consumed split by one cast and whole by another: an all-gather of f16 values,
    // whose backward is a reduce-scatter. Everything after stays split on rows.
    let mut b = GraphBuilder::new(3);
    let w = b.parameter_with("w", ParamSpec::new(&[16, 16], Initializer::Uniform { low: -0.5, high: 0.5 }).dtype(DType::F16)).unwrap();
    let split = b.op("cast.split", Cast::to(DType::F32), &[w]).unwrap();
    let whole = b.op("cast.whole", Cast::to(DType::F32), &[w]).unwrap();
    let both = b.add("both", split, whole).unwrap();
    let sq = b.mul("sq", both, both).unwrap();
    let loss = b.reduce_mean("loss", sq, &[], false).unwrap();
    let mut graph = b.finish();
    for (id, s) in [(split, "((4, 1))"), (whole, "((1, 1))"), (both, "((4, 1), (4, 1))"), (sq, "((4, 1), (4, 1))"), (loss, "((4, 1))")] {
        graph.set_strategy(id, s.parse().unwrap()).unwrap();
    }
    let want = stand_alone_on(&graph, loss, &[]);
    let mut widths = Vec::new();
    for force in [false, true] {
        let job = Job::new(&graph, loss, &ctx(4, "semi_auto_parallel", &[("force_fp32_communication", json!(force))])).unwrap();
        assert!(job.network().redistributions.iter().any(|r| r.dtype == DType::F16 && r.in_f32 == force), "force={force}");
        let (_, got, calls) = gradients_on(&job, &[]);
        // f16 values on the way: compare loosely.
        for (name, w) in want.iter() {
            for (a, b) in got.require(name).unwrap().to_f64_vec().iter().zip(w.to_f64_vec()) {
                assert!((a - b).abs() <= 2e-2 * b.abs().max(1e-2), "force={force}: {name}: {a} vs {b}");
            }
        }
        let k = bytes_by_kind(&calls[0]);
        widths.push((k["all_gather"], k["reduce_scatter"]));
    }
    // A quarter of w ([4, 16]) is gathered, its gradient reduce-scattered: 2 or 4 bytes a value.
    assert_eq!(widths, vec![(4 * 16 * 2, 16 * 16 * 2), (4 * 16 * 4, 16 * 16 * 4)]);
}

#[test]
fn force_fp32_communication_widens_the_hand_placed_collectives_of_hybrid_graphs() {
    // Each rank's own f16 weight, summed over both ranks by an all-reduce the user wrote.
    let graph = || {
        let mut b = GraphBuilder::new(5);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let w = b.parameter_with("w", ParamSpec::new(&[8, 8], Initializer::Uniform { low: -0.5, high: 0.5 }).dtype(DType::F16)).unwrap();
        let summed = b.all_reduce("w.sum", w, autopar_graph::ReduceOp::Sum, &[0, 1]).unwrap();
        let w32 = b.op("w.f32", Cast::to(DType::F32), &[summed]).unwrap();
        let h = b.matmul("mm", x, w32).unwrap();
        let sq = b.mul("sq", h, h).unwrap();
        let loss = b.reduce_mean("loss", sq, &[], false).unwrap();
        b.output(loss).unwrap();
        b.finish()
    };
    let x: Vec<f32> = (0..32).map(|i| (i % 7) as f32 / 7.0 - 0.5).collect();
    let data = vec![("x".to_string(), Tensor::from_vec(&[4, 8], x).unwrap())];
    let mut runs = Vec::new();
    for force in [false, true] {
        let c = ctx(2, "hybrid_parallel", &[("force_fp32_communication", json!(force))]);
        let job = Job::hybrid(vec![graph(), graph()], "loss", &c, ["w".to_string()].into()).unwrap();
        let (loss, grads, calls) = gradients_on(&job, &data);
        // The forward all-reduce and its backward, 64 values each.
        assert_eq!(bytes_by_kind(&calls[0])["all_reduce"], 2 * 64 * if force { 4 } else { 2 }, "force={force}");
        runs.push((loss, grads.require("w").unwrap().to_f64_vec()));
    }
    assert!((runs[0].0 - runs[1].0).abs() <= 1e-2 * runs[1].0.abs(), "{} vs {}", runs[0].0, runs[1].0);
    for (a, b) in runs[0].1.iter().zip(&runs[1].1) {
        assert!((a - b).abs() <= 2e-2 * b.abs().max(1e-2), "{a} vs {b}");
    }
}

#[test]
fn comm_fusion_settings_set_the_number_of_gradient_all_reduces_and_keep_the_result() {
    // Data parallel: w1 and w2 replicated on every rank. Per step one all-reduce of the loss
    // (forward and backward), then the buckets.
    let (graph, loss) = net(DType::F32, &[]);
    let want = stand_alone(&graph, loss);
    for (fusion, buckets) in [
        (json!({"allreduce": {"mode": "auto"}}), 1),
        (json!({"allreduce": {"mode": "size", "config": 0.0005}}), 2),
        (json!({"allreduce": {"mode": "index", "config": [1]}}), 2),
        (json!({"openstate": false}), 2),
    ] {
        let options = [("comm_fusion", fusion.clone()), ("gradients_mean", json!(true))];
        let job = Job::new(&graph, loss, &ctx(4, "data_parallel", &options)).unwrap();
        assert_eq!(job.network().gradients.buckets.len(), buckets, "{fusion}");
        let (_, got, calls) = gradients(&job);
        assert_scaled(&got, &want, |_| 1.0, &format!("comm_fusion {fusion}"));
        let all_reduces = calls[0].iter().filter(|c| c.kind == "all_reduce").count();
        assert_eq!(all_reduces, 2 + buckets, "comm_fusion {fusion}: all-reduces per step");
    }
    // all_reduce_fusion_config is the index mode.
    let job = Job::new(&graph, loss, &ctx(4, "data_parallel", &[("all_reduce_fusion_config", json!([1]))])).unwrap();
    assert_eq!(job.network().gradients.buckets.len(), 2);
}
