//! The parallel optimizer (`enable_parallel_optimizer`): sharded runs equal unsharded ones —
//! the losses, every parameter and every optimizer-state tensor after 20 steps — bit for bit on
//! LocalComm, whether the shard covers the whole replica group or part of it (the gradient sum
//! runs over the replicas in one pass, as the unsharded all-reduce does);
//! data_parallel and semi_auto_parallel (fixed and random strategies), Momentum and AdamW,
//! thresholds 0 and 64 KB, shard sizes -1, 2 and 4, gradient accumulation, clipping by global
//! norm (equal to one device's clipping). Each rank stores
//! only its piece of a sharded parameter and of its optimizer state.

use autopar_comm::LocalComm;
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_layout::Strategy;
use autopar_parallel::{assign_random_strategies, OptDecision, ParallelContext};
use autopar_runtime::ParamSource;
use autopar_runtime::{assemble_params, Job, RankTrainer};
use autopar_runtime::{AdamW, LrSchedule, Momentum, Optimizer, ParamStore};
use autopar_tensor::Tensor;
use serde_json::json;

const STEPS: usize = 20;

/// fc1.weight is exactly 64 KB (sharded at the 64 KB threshold), fc2.weight 32 KB (not).
fn network(batch: usize, shard: bool) -> (Graph, NodeId) {
    let s = |t: &str| -> Strategy { t.parse().unwrap() };
    let mut b = GraphBuilder::new(3);
    let x = b.input("x", &[batch, 128], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[128, 128], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[128], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let m1 = b.matmul("fc1.mm", x, w1).unwrap();
    let h = b.add("fc1.add", m1, b1).unwrap();
    let h = b.relu("act1", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[128, 64], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let m2 = b.matmul("fc2.mm", h, w2).unwrap();
    let g = b.parameter("ln.gamma", &[64], Initializer::Ones).unwrap();
    let be = b.parameter("ln.beta", &[64], Initializer::Zeros).unwrap();
    let h = b.layer_norm("ln", m2, g, be, -1, 1e-5).unwrap();
    let w3 = b.parameter("fc3.weight", &[64, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc3.mm", h, w3).unwrap();
    if shard {
        b.shard(m1, s("((2,1),(1,2))")).unwrap();
        b.shard(m2, s("((2,2),(2,1))")).unwrap();
    }
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batches(batch: usize, seed: u64) -> Vec<Vec<(String, Tensor)>> {
    let mut rng = autopar_data::Rng::new(seed | 1);
    let mut next = move || rng.next_u64();
    (0..STEPS)
        .map(|_| {
            let x: Vec<f32> = (0..batch * 128).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let y: Vec<i64> = (0..batch).map(|_| (next() % 8) as i64).collect();
            vec![("x".to_string(), Tensor::from_vec(&[batch, 128], x).unwrap()), ("y".to_string(), Tensor::from_vec(&[batch], y).unwrap())]
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Opt {
    Momentum,
    AdamW,
}

impl Opt {
    fn build(self) -> Box<dyn Optimizer> {
        match self {
            Opt::Momentum => Box::new(Momentum::new(LrSchedule::Constant(0.05), 0.9).unwrap()),
            Opt::AdamW => Box::new(AdamW::new(LrSchedule::Constant(0.01)).unwrap().with_weight_decay(0.01, None).unwrap()),
        }
    }
}

fn context(mode: &str, n: usize, shard: Option<(i64, u64)>) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!(mode)).unwrap();
    c.set("gradients_mean", &json!(true)).unwrap();
    if let Some((size, threshold)) = shard {
        c.set("enable_parallel_optimizer", &json!(true)).unwrap();
        c.set("parallel_optimizer_config", &json!({"optimizer_weight_shard_size": size, "parallel_optimizer_threshold": threshold}))
            .unwrap();
    }
    c
}

/// Losses, full parameters, full optimizer state (by state name), and the per-rank stores.
struct Run {
    losses: Vec<f64>,
    params: ParamStore,
    state: ParamStore,
    rank_params: Vec<ParamStore>,
    rank_state: Vec<ParamStore>,
}

fn run(job: &Job, data: &[Vec<(String, Tensor)>], opt: Opt) -> Run {
    run_clipped(job, data, opt, None)
}

/// [`run`] with every step's gradients clipped to global norm `clip`.
fn run_clipped(job: &Job, data: &[Vec<(String, Tensor)>], opt: Opt, clip: Option<f64>) -> Run {
    let full = ParamStore::init(job.graph()).unwrap();
    let out = LocalComm::run(job.device_num(), |comm| {
        let mut t = RankTrainer::new(job, &comm, ParamSource::Full(&full)).unwrap();
        t.set_clip_grad_norm(clip).unwrap();
        let mut o = opt.build();
        let losses: Vec<f64> = data.iter().map(|batch| t.step(o.as_mut(), batch).unwrap()).collect();
        Ok::<_, autopar_comm::CommError>((losses, t.params().clone(), o.state().clone()))
    })
    .unwrap();
    let losses = out[0].0.clone();
    let rank_params: Vec<ParamStore> = out.iter().map(|o| o.1.clone()).collect();
    let rank_state: Vec<ParamStore> = out.iter().map(|o| o.2.clone()).collect();
    let params = assemble_params(job, &rank_params).unwrap();
    // Optimizer state has its parameter's layout (and shard): assembled the same way.
    let mut state = ParamStore::new();
    for prefix in ["moments.", "adam_m.", "adam_v."] {
        if !rank_state[0].iter().any(|(k, _)| k.starts_with(prefix)) {
            continue;
        }
        let per_rank: Vec<ParamStore> = rank_state
            .iter()
            .map(|s| {
                let mut p = ParamStore::new();
                for (k, v) in s.iter().filter(|(k, _)| k.starts_with(prefix)) {
                    p.insert(&k[prefix.len()..], v.clone());
                }
                p
            })
            .collect();
        for (name, t) in assemble_params(job, &per_rank).unwrap().iter() {
            state.insert(&format!("{prefix}{name}"), t.clone());
        }
    }
    Run { losses, params, state, rank_params, rank_state }
}

/// Equal bit for bit (`rtol` 0) or within relative `rtol` of the tensor's largest magnitude.
fn assert_close(what: &str, got: &ParamStore, want: &ParamStore, rtol: f64) {
    assert_eq!(got.iter().count(), want.iter().count(), "{what}: tensor count");
    for (name, w) in want.iter() {
        let g = got.get(name).unwrap_or_else(|| panic!("{what}: {name} missing"));
        assert_eq!(g.shape(), w.shape(), "{what}: {name}");
        let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
        let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            if rtol == 0.0 {
                assert_eq!(a.to_bits(), b.to_bits(), "{what}: {name}[{i}] = {a}, unsharded {b}");
            } else {
                assert!((a - b).abs() <= rtol * scale, "{what}: {name}[{i}] = {a}, unsharded {b}");
            }
        }
    }
}

fn compare(what: &str, sharded: &Run, plain: &Run, exact: bool) {
    let rtol = if exact { 0.0 } else { 1e-6 };
    for (s, (a, b)) in sharded.losses.iter().zip(&plain.losses).enumerate() {
        assert!(if exact { a == b } else { (a - b).abs() <= 1e-6 * b.abs() }, "{what}: loss at step {s}: {a} vs {b}");
    }
    assert_close(&format!("{what}: parameters"), &sharded.params, &plain.params, rtol);
    assert_close(&format!("{what}: optimizer state"), &sharded.state, &plain.state, rtol);
}

/// Whether every sharded parameter's shard covers its whole replica group.
fn whole_groups(job: &Job) -> bool {
    job.network().params.iter().filter_map(|p| p.opt.shard()).all(|s| s.rest.iter().all(|a| a.size == 1))
}

#[test]
fn sharded_equals_unsharded_in_data_parallel_and_semi_auto() {
    let batch = 16;
    let data = batches(batch, 5);
    let mut cases = 0;
    for (mode, n, strategies) in [("data_parallel", 4, false), ("semi_auto_parallel", 8, true), ("semi_auto_parallel", 4, false)] {
        let (graph, loss) = network(batch, strategies);
        for opt in [Opt::Momentum, Opt::AdamW] {
            let plain = run(&Job::new(&graph, loss, &context(mode, n, None)).unwrap(), &data, opt);
            for (size, threshold) in [(-1, 0), (-1, 64), (2, 0), (4, 0)] {
                let job = Job::new(&graph, loss, &context(mode, n, Some((size, threshold)))).unwrap();
                let sharded = job.network().params.iter().filter(|p| p.opt.shard().is_some()).count();
                assert!(sharded > 0, "{mode} {n} size {size} threshold {threshold}: nothing sharded");
                if threshold == 64 {
                    // exactly 64 KB is sharded, 32 KB is not
                    assert!(job.network().param("fc1.weight").unwrap().opt.shard().is_some());
                    assert!(matches!(&job.network().param("fc2.weight").unwrap().opt, OptDecision::Whole(w) if w.contains("threshold")));
                }
                let got = run(&job, &data, opt);
                let what = format!("{mode} on {n}, {opt:?}, shard size {size}, threshold {threshold}");
                compare(&what, &got, &plain, true);
                // Each rank stores only its piece of a sharded parameter and of its state.
                let program = job.program(1).unwrap().program;
                for slot in program.params.iter().filter(|s| s.shard.is_some()) {
                    let k = slot.shard.as_ref().unwrap().group.len();
                    let want: usize = slot.layout.slice_len() / k;
                    assert_eq!(got.rank_params[1].require(&slot.name).unwrap().numel(), want, "{what}: {}", slot.name);
                    for (key, t) in got.rank_state[1].iter().filter(|(key, _)| key.ends_with(&format!(".{}", slot.name))) {
                        assert_eq!(t.numel(), want, "{what}: {key}");
                    }
                }
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 24);
}

#[test]
fn sharded_equals_unsharded_over_random_strategies() {
    let batch = 16;
    let data = batches(batch, 9);
    let (graph, loss) = network(batch, false);
    let mut partial = 0;
    for n in [4usize, 8] {
        for seed in 0..6u64 {
            let mut g = graph.clone();
            assign_random_strategies(&mut g, n, seed * 31 + n as u64);
            let plain = run(&Job::new(&g, loss, &context("semi_auto_parallel", n, None)).unwrap(), &data, Opt::AdamW);
            let size = [-1i64, 2][seed as usize % 2];
            let job = Job::new(&g, loss, &context("semi_auto_parallel", n, Some((size, 0)))).unwrap();
            let got = run(&job, &data, Opt::AdamW);
            partial += usize::from(!whole_groups(&job));
            compare(&format!("{n} devices, strategy seed {seed}, shard size {size}"), &got, &plain, true);
        }
    }
    assert!(partial > 0, "no case sharded over part of a replica group");
}

#[test]
fn gradient_accumulation_shards_each_micro_batch_or_the_sum() {
    let batch = 16;
    let data = batches(batch, 13);
    // The network runs one micro-batch of 8 rows.
    let (graph, loss) = network(batch / 2, false);
    let plain = run(&Job::with_micro_batches(&graph, loss, &context("data_parallel", 4, None), 2).unwrap(), &data, Opt::Momentum);
    for (each, level) in [(true, "level1"), (false, "level1"), (true, "level2"), (true, "level3")] {
        let mut ctx = context("data_parallel", 4, Some((-1, 0)));
        let cfg = json!({"parallel_optimizer_threshold": 0, "gradient_accumulation_shard": each, "optimizer_level": level});
        ctx.set("parallel_optimizer_config", &cfg).unwrap();
        let job = Job::with_micro_batches(&graph, loss, &ctx, 2).unwrap();
        // Level2 and level3 reduce-scatter each micro-batch's gradients in its backward pass.
        let program = job.program(0).unwrap().program;
        assert_eq!(program.accumulation_shard, each && level == "level1");
        assert_eq!(program.scatter_in_pass.is_empty(), level == "level1", "{level}");
        let got = run(&job, &data, Opt::Momentum);
        // Shards of each micro-batch's sum add up in another order than the whole slices.
        compare(&format!("accumulation, gradient_accumulation_shard {each}, {level}"), &got, &plain, !each);
    }
    // Whole accumulated gradients are what level2 and level3 do not keep.
    for level in ["level2", "level3"] {
        let mut ctx = context("data_parallel", 4, Some((-1, 0)));
        let cfg = json!({"parallel_optimizer_threshold": 0, "gradient_accumulation_shard": false, "optimizer_level": level});
        let e = ctx.set("parallel_optimizer_config", &cfg).unwrap_err().to_string();
        assert!(e.contains("gradient_accumulation_shard") && e.contains(level), "{e}");
    }
}

/// Clipping by global norm counts every distinct piece once over all ranks: sharded runs clip
/// exactly as unsharded ones, and both as one device does.
#[test]
fn clipping_by_global_norm_stays_exact_when_sharded() {
    let batch = 16;
    let data = batches(batch, 21);
    let clip = Some(0.5);
    for (mode, n, strategies) in [("data_parallel", 4, false), ("semi_auto_parallel", 8, true)] {
        let (graph, loss) = network(batch, strategies);
        // One device with the same clipping.
        let mut alone = ParallelContext::default();
        alone.set("device_num", &json!(1)).unwrap();
        let one = Job::new(&graph, loss, &alone).unwrap();
        for opt in [Opt::Momentum, Opt::AdamW] {
            let plain_job = Job::new(&graph, loss, &context(mode, n, None)).unwrap();
            let plain = run_clipped(&plain_job, &data, opt, clip);
            let unclipped = run(&plain_job, &data, opt);
            let what = format!("{mode} on {n}, {opt:?}, clipped");
            assert!(
                plain.params.iter().any(|(k, v)| v.to_f64_vec() != unclipped.params.require(k).unwrap().to_f64_vec()),
                "{what}: clipping changed nothing (the norm never exceeded {clip:?})"
            );
            if mode == "data_parallel" {
                // data_parallel averages the ranks' gradients: the same update as one device.
                let single = run_clipped(&one, &data, opt, clip);
                assert_close(&format!("{what}: against one device"), &plain.params, &single.params, 1e-5);
            }
            for size in [-1i64, 2] {
                let job = Job::new(&graph, loss, &context(mode, n, Some((size, 0)))).unwrap();
                let got = run_clipped(&job, &data, opt, clip);
                compare(&format!("{what}, shard size {size}"), &got, &plain, whole_groups(&job));
            }
        }
    }
}

fn level3(ctx: ParallelContext, size: i64) -> ParallelContext {
    at_level(ctx, size, "level3")
}

fn at_level(mut ctx: ParallelContext, size: i64, level: &str) -> ParallelContext {
    let cfg = json!({"optimizer_weight_shard_size": size, "parallel_optimizer_threshold": 0, "optimizer_level": level});
    ctx.set("parallel_optimizer_config", &cfg).unwrap();
    ctx
}

/// `optimizer_level` level2 (and level3, which includes it): each sharded weight's gradient is
/// reduce-scattered by the backward pass as it is formed, so the step's gradients are the
/// rank's shards and no whole gradient lives to the pass's end. Bit for bit the unsharded run
/// (one micro-batch), in data_parallel, semi_auto (fixed and random strategies) and
/// auto_parallel, shard groups of the whole replica group or part of it; the plan's gradients
/// shrink to the shards and its peak is lower than level1's.
#[test]
fn level2_reduce_scatters_each_gradient_in_the_pass_and_equals_unsharded() {
    let batch = 16;
    let data = batches(batch, 19);
    let mut cases = 0;
    for (mode, n, strategies, seed) in [
        ("data_parallel", 4, false, None),
        ("semi_auto_parallel", 8, true, None),
        ("semi_auto_parallel", 8, false, Some(5u64)),
        ("auto_parallel", 8, false, None),
    ] {
        let (mut graph, loss) = network(batch, strategies);
        if let Some(seed) = seed {
            assign_random_strategies(&mut graph, n, seed);
        }
        for (opt, size, level) in [(Opt::Momentum, -1, "level2"), (Opt::AdamW, 2, "level2"), (Opt::Momentum, 2, "level3")] {
            let what = format!("{mode} on {n}, {opt:?}, shard size {size}, {level}");
            let plain = run(&Job::new(&graph, loss, &context(mode, n, None)).unwrap(), &data, opt);
            let level1 = Job::new(&graph, loss, &context(mode, n, Some((size, 0)))).unwrap();
            let job = Job::new(&graph, loss, &at_level(context(mode, n, Some((size, 0))), size, level)).unwrap();
            let program = job.program(1).unwrap().program;
            assert!(program.reduce_scatter.is_empty(), "{what}: the runtime reduce-scatters nothing after the pass");
            let sharded: Vec<_> = program.params.iter().filter(|s| s.shard.is_some() && s.trainable).collect();
            assert!(!sharded.is_empty(), "{what}: nothing sharded");
            for slot in &sharded {
                let (_, grad) = program.grads.iter().find(|(n, _)| n == &slot.name).expect("a trainable parameter has a gradient");
                assert_eq!(
                    program.graph.node(*grad).ty.shape.to_vec(),
                    slot.stored_shape(),
                    "{what}: {}'s gradient is its shard",
                    slot.name
                );
            }
            let memory = |j: &Job| j.plan().program(1).unwrap().memory(j.plan(), 1).unwrap();
            let (m1, m2) = (memory(&level1), memory(&job));
            assert!(m2.gradients < m1.gradients, "{what}: gradients {} against level1's {}", m2.gradients, m1.gradients);
            assert!(m2.total() < m1.total(), "{what}: {} in all against level1's {}", m2.total(), m1.total());
            let got = run(&job, &data, opt);
            compare(&what, &got, &plain, true);
            cases += 1;
        }
    }
    assert_eq!(cases, 12);
}

/// `optimizer_level` level3: a rank keeps only its shard of a sharded weight; the program
/// all-gathers the slice just before its forward use and again (a recomputed all-gather) just
/// before the backward pass reads it. Bit for bit the unsharded run, in data_parallel and
/// semi_auto, shard groups of the whole replica group or part of it, random strategies; the
/// plan holds no gathered slice from step to step.
#[test]
fn level3_gathers_each_weight_per_use_and_equals_unsharded() {
    let batch = 16;
    let data = batches(batch, 17);
    let mut cases = 0;
    for (mode, n, strategies, seed) in [
        ("data_parallel", 4, false, None),
        ("semi_auto_parallel", 8, true, None),
        ("semi_auto_parallel", 8, false, Some(3u64)),
        ("semi_auto_parallel", 8, false, Some(11u64)),
        ("auto_parallel", 8, false, None),
    ] {
        let (mut graph, loss) = network(batch, strategies);
        if let Some(seed) = seed {
            assign_random_strategies(&mut graph, n, seed);
        }
        for (opt, size) in [(Opt::Momentum, -1), (Opt::AdamW, 2)] {
            let what = format!("{mode} on {n}, {opt:?}, shard size {size}");
            let plain = run(&Job::new(&graph, loss, &context(mode, n, None)).unwrap(), &data, opt);
            let level1 = Job::new(&graph, loss, &context(mode, n, Some((size, 0)))).unwrap();
            let job = Job::new(&graph, loss, &level3(context(mode, n, Some((size, 0))), size)).unwrap();
            let program = job.program(1).unwrap().program;
            assert!(program.all_gather.is_empty(), "{what}: the runtime gathers nothing before the pass");
            let sharded: Vec<_> = program.params.iter().filter(|s| s.shard.is_some()).collect();
            assert!(!sharded.is_empty(), "{what}: nothing sharded");
            for slot in &sharded {
                let gather = slot.gathered.unwrap_or_else(|| panic!("{what}: {} not gathered in the program", slot.name));
                assert_eq!(program.graph.node(slot.local).ty.shape.to_vec(), slot.stored_shape(), "{what}: {}", slot.name);
                assert_eq!(program.graph.node(gather).ty.shape.to_vec(), slot.layout.slice_shape(), "{what}: {}", slot.name);
                let again =
                    program.graph.nodes().iter().filter(|nd| nd.recompute == autopar_graph::Recompute::Replay && nd.inputs == [slot.local]);
                assert_eq!(again.count(), 1, "{what}: {} is gathered again for the backward pass", slot.name);
            }
            // A gathered weight reaching an op through a redistribution is gathered and
            // redistributed again for the backward pass, never kept from the forward pass.
            let marked = |id: &autopar_graph::NodeId| program.graph.node(*id).recompute == autopar_graph::Recompute::Marked;
            for node in program.graph.nodes().iter().filter(|nd| !nd.name.starts_with("grad/") && nd.inputs.iter().any(marked)) {
                assert!(marked(&program.graph.find(&node.name).unwrap()) || !node.name.contains(".in"), "{what}: {} is kept", node.name);
            }
            let slots = |j: &Job| autopar_parallel::Memory::gathered_slices(&j.program(1).unwrap().program, |_| true);
            assert!(slots(&level1) > 0 && slots(&job) == 0, "{what}: gathered slices held {} / {}", slots(&level1), slots(&job));
            let got = run(&job, &data, opt);
            compare(&what, &got, &plain, true);
            for slot in &sharded {
                assert_eq!(got.rank_params[1].require(&slot.name).unwrap().shape(), slot.stored_shape().as_slice(), "{what}");
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 10);
}
