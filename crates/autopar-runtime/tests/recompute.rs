//! Recomputation (MindSpore's `Cell.recompute()` / `Primitive.recompute()`): the backward pass
//! recomputes marked ops from their saved inputs instead of keeping their values. Losses,
//! parameters and BatchNorm's running statistics are bit-identical with and without it, for the
//! GPT (dropout on) and ResNet-18 under random semi_auto strategies on 1, 2, 4 and 8 simulated
//! devices (the recomputed ops' collectives and dropout masks replay), through pipelines (per
//! micro-batch), and for single ops by name; the executor's measured peak of live values falls,
//! and the plan predicts the recomputed step's peak and bytes.

use std::sync::{Arc, Mutex};

use autopar_comm::{LocalComm, Metered};
use autopar_graph::{Graph, GraphError, NodeId, Recompute, RecomputeChoice};
use autopar_models::{Gpt, GptConfig, Mlp, MlpConfig, Mode, Model, ResNet, ResNetConfig};
use autopar_parallel::{assign_random_strategies, JobRequest, ParallelContext, RankCost};
use autopar_runtime::{run_local, Job, LocalRun, LrSchedule, Momentum, Optimizer, ParamSource, ParamStore, RankTrainer};
use autopar_tensor::Tensor;
use serde_json::json;

struct Net {
    graph: Graph,
    loss: NodeId,
    batches: Vec<Vec<(String, Tensor)>>,
}

fn net(model: &dyn Model, batch: usize, classes: usize, steps: usize) -> Net {
    let (graph, m) = model.build_graph(batch, Mode::Train, 3).unwrap();
    let mut rng = autopar_data::Rng::new(11);
    let mut next = move || rng.next_u64();
    let (xn, yn) = (graph.node(m.x).clone(), graph.node(m.labels).clone());
    let batches = (0..steps)
        .map(|_| {
            let nx: usize = xn.ty.shape.iter().product();
            let x = if xn.ty.dtype.is_float() {
                Tensor::from_vec(&xn.ty.shape, (0..nx).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect::<Vec<f32>>()).unwrap()
            } else {
                Tensor::from_vec(&xn.ty.shape, (0..nx).map(|_| (next() % classes as u64) as i64).collect()).unwrap()
            };
            let ny: usize = yn.ty.shape.iter().product();
            let y = Tensor::from_vec(&yn.ty.shape, (0..ny).map(|_| (next() % classes as u64) as i64).collect()).unwrap();
            vec![(xn.name.clone(), x), (yn.name.clone(), y)]
        })
        .collect();
    Net { graph, loss: m.loss, batches }
}

fn small_gpt() -> Gpt {
    let cfg = GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 2, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    Gpt::new(cfg).unwrap()
}

fn small_resnet() -> ResNet {
    let cfg = ResNetConfig::resnet18(5).with_width(4).with_stem(autopar_models::Stem::Cifar, &[3, 8, 8]);
    ResNet::new(cfg).unwrap()
}

fn optimizer() -> Box<dyn Optimizer> {
    Box::new(Momentum::new(LrSchedule::Constant(0.05), 0.9).unwrap())
}

fn context(n: usize) -> ParallelContext {
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!(if n == 1 { "stand_alone" } else { "semi_auto_parallel" })).unwrap();
    ctx
}

fn with(graph: &Graph, choice: &RecomputeChoice) -> Graph {
    let mut g = graph.clone();
    g.apply_recompute(choice).unwrap();
    g
}

/// Losses, assembled parameters and every rank's stored values, bit for bit.
fn assert_identical(what: &str, a: &LocalRun, b: &LocalRun) {
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.losses), bits(&b.losses), "{what}: losses {:?} vs {:?}", a.losses, b.losses);
    for (r, (pa, pb)) in a.rank_params.iter().zip(&b.rank_params).enumerate() {
        assert_eq!(pa.iter().count(), pb.iter().count(), "{what}: rank {r}'s parameters");
        for (name, t) in pa.iter() {
            let u = pb.require(name).unwrap();
            assert_eq!(bits(&t.to_f64_vec()), bits(&u.to_f64_vec()), "{what}: rank {r}'s {name}");
        }
    }
}

/// What recomputation added to rank 0's program: (recomputed copies, of which collectives,
/// of which dropouts).
fn replays(job: &Job) -> (usize, usize, usize) {
    let prog = job.program(0).unwrap();
    let graphs: Vec<&Graph> = match prog.chunks() {
        [] => vec![&prog.program.graph],
        chunks => chunks.iter().flat_map(|c| [&c.graph, &c.backward]).collect(),
    };
    let copies: Vec<_> = graphs.iter().flat_map(|g| g.nodes()).filter(|n| n.recompute == Recompute::Replay).collect();
    let comm = copies.iter().filter(|n| n.op.is_communication()).count();
    let dropout = copies.iter().filter(|n| n.op.kind() == "Dropout").count();
    (copies.len(), comm, dropout)
}

/// Every block recomputed against none, on random strategies over 1, 2, 4 and 8 devices;
/// returns (runs whose recomputed ops communicate, runs recomputing a dropout).
fn blocks_are_bit_identical(label: &str, net: &Net, seeds: u64) -> (usize, usize) {
    let (mut comm_runs, mut dropout_runs) = (0, 0);
    for n in [1usize, 2, 4, 8] {
        for seed in 0..if n == 1 { 1 } else { seeds } {
            let what = format!("{label} n={n} seed={seed}");
            let mut g = net.graph.clone();
            if n > 1 {
                assign_random_strategies(&mut g, n, seed * 31 + n as u64);
            }
            let plain = Job::new(&g, net.loss, &context(n)).unwrap();
            let recomputed = Job::new(&with(&g, &RecomputeChoice::Blocks), net.loss, &context(n)).unwrap();
            assert_eq!(replays(&plain).0, 0, "{what}: copies without recomputation");
            let (copies, comm, dropout) = replays(&recomputed);
            assert!(copies > 0, "{what}: nothing recomputed");
            comm_runs += usize::from(comm > 0);
            dropout_runs += usize::from(dropout > 0);
            let a = run_local(&plain, &net.batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
            let b = run_local(&recomputed, &net.batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what} recomputed: {e}"));
            assert_identical(&what, &a, &b);
        }
    }
    (comm_runs, dropout_runs)
}

#[test]
fn recomputing_the_gpts_blocks_is_bit_identical_with_dropout_and_model_parallel_collectives() {
    let net = net(&small_gpt(), 8, 16, 4);
    let (comm, dropout) = blocks_are_bit_identical("gpt", &net, 3);
    assert!(comm > 0, "no run recomputed a collective");
    assert!(dropout > 0, "no run recomputed a dropout");
}

#[test]
fn recomputing_resnet_blocks_keeps_batch_norms_running_statistics_bit_identical() {
    let net = net(&small_resnet(), 8, 5, 3);
    let (comm, _) = blocks_are_bit_identical("resnet18", &net, 2);
    assert!(comm > 0, "no run recomputed a collective (a synchronised batch norm or a redistribution)");
}

#[test]
fn recomputation_in_a_pipeline_replays_each_micro_batch() {
    // The network is built for one micro-batch (2 rows); a step feeds the 4 micro-batches' 8.
    let micro = net(&small_gpt(), 2, 16, 1);
    let net = Net { graph: micro.graph, loss: micro.loss, batches: net(&small_gpt(), 8, 16, 3).batches };
    for (devices, stages, scheduler) in [(2usize, 2usize, "1f1b"), (4, 2, "gpipe"), (4, 2, "1f1b")] {
        let what = format!("{devices} devices in {stages} stages, {scheduler}");
        let mut ctx = context(devices);
        ctx.set("pipeline_stages", &json!(stages)).unwrap();
        ctx.set("pipeline_config", &json!({ "pipeline_scheduler": scheduler })).unwrap();
        let job = |choice: &RecomputeChoice| -> Job {
            let req = JobRequest { micro_batches: Some(4), recompute: choice, ..JobRequest::new(&net.graph, Some(net.loss), &ctx) };
            Job::assemble(&req).unwrap()
        };
        let (plain, recomputed) = (job(&RecomputeChoice::AsBuilt), job(&RecomputeChoice::Blocks));
        let (copies, _, dropout) = replays(&recomputed);
        assert!(copies > 0 && dropout > 0, "{what}: {copies} copies, {dropout} dropouts recomputed");
        // The recomputed ops run in the backward pass: their inputs are saved, their values not.
        let saved = |j: &Job| j.program(0).unwrap().chunks().iter().map(|c| c.saved.len()).sum::<usize>();
        assert!(saved(&recomputed) < saved(&plain), "{what}: saved values {} vs {}", saved(&recomputed), saved(&plain));
        let a = run_local(&plain, &net.batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
        let b = run_local(&recomputed, &net.batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what} recomputed: {e}"));
        assert_identical(&what, &a, &b);
    }
}

#[test]
fn single_ops_and_cells_recompute_by_name() {
    let m = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![16, 16], num_classes: 8 }).unwrap();
    let net = net(&m, 16, 8, 3);
    let names: Vec<String> = ["relu1", "fc2.matmul"].iter().map(|s| s.to_string()).collect();
    let g = with(&net.graph, &RecomputeChoice::Named(names));
    let marked: Vec<&str> = g.nodes().iter().filter(|n| n.recompute == Recompute::Marked).map(|n| n.name.as_str()).collect();
    assert_eq!(marked, ["relu1", "fc2.matmul"]);
    // Under model-parallel strategies the marked values reach kept readers through
    // redistributions, which are recomputed with them: the kept ops read no forward value of a
    // marked op, directly or redistributed.
    let mut comm = 0;
    for (n, seed) in [(1usize, 0u64), (4, 5), (4, 6), (8, 7)] {
        let (mut plain_graph, mut marked_graph) = (net.graph.clone(), g.clone());
        if n > 1 {
            assign_random_strategies(&mut plain_graph, n, seed);
            assign_random_strategies(&mut marked_graph, n, seed);
        }
        let plain = Job::new(&plain_graph, net.loss, &context(n)).unwrap();
        let recomputed = Job::new(&marked_graph, net.loss, &context(n)).unwrap();
        let (copies, collectives, _) = replays(&recomputed);
        assert!(copies > 0, "n={n} seed={seed}");
        comm += collectives;
        let prog = recomputed.program(0).unwrap().program;
        let users = prog.graph.users();
        let marked = |id: &NodeId| prog.graph.node(*id).recompute == Recompute::Marked;
        for (i, node) in prog.graph.nodes().iter().enumerate() {
            if marked(&NodeId(i)) {
                let backward_reader = users[i].iter().find(|u| prog.graph.node(**u).name.starts_with("grad/"));
                assert!(backward_reader.is_none(), "n={n} seed={seed}: the backward pass reads {} itself", node.name);
            } else if node.name.contains(".in") && !node.name.starts_with("grad/") && node.inputs.iter().any(marked) {
                panic!("n={n} seed={seed}: {} redistributes a recomputed value but is kept", node.name);
            }
        }
        let a = run_local(&plain, &net.batches, || Ok(optimizer())).unwrap();
        let b = run_local(&recomputed, &net.batches, || Ok(optimizer())).unwrap();
        assert_identical(&format!("mlp by name n={n} seed={seed}"), &a, &b);
    }
    assert!(comm > 0, "no strategy recomputed a redistribution");
    // `none` drops every mark; bad names are refused with what was expected.
    assert_eq!(with(&g, &RecomputeChoice::Nothing).nodes().iter().filter(|n| n.recompute != Recompute::Keep).count(), 0);
    let err = |choice: RecomputeChoice| net.graph.clone().apply_recompute(&choice).unwrap_err();
    assert!(matches!(err(RecomputeChoice::Blocks), GraphError::NoBlocks));
    assert!(matches!(err(RecomputeChoice::Named(vec!["fc9.matmul".into()])), GraphError::UnknownName { .. }));
    let leaf = err(RecomputeChoice::Named(vec!["fc1.weight".into()]));
    assert!(matches!(leaf, GraphError::NotRecomputable { .. }), "{leaf}");
    assert!(leaf.to_string().contains("fc1.weight"), "{leaf}");
    let empty = err(RecomputeChoice::Named(vec!["nothing.".into()]));
    assert!(matches!(empty, GraphError::EmptyRecomputeBlock { .. }) && empty.to_string().contains("nothing."), "{empty}");
}

/// What [`step`] measured and the plan predicted on one rank.
struct StepFigures {
    /// The measured peak of live values and the predicted peak activations (gradients included).
    peak: (usize, usize),
    /// The measured peak of the values the step frees (activations alone) and the predicted.
    activations: (usize, usize),
    /// Whether the bytes each collective moved equal the plan's.
    bytes_match: bool,
}

/// One step of `job` on every rank through a metering communicator, per rank.
fn step(job: &Job, batch: &[(String, Tensor)]) -> Vec<StepFigures> {
    let full = ParamStore::init(job.graph()).unwrap();
    LocalComm::run(job.device_num(), |comm| -> autopar_runtime::Result<StepFigures> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let metered = Metered::new(Box::new(comm), log.clone());
        let mut t = RankTrainer::new(job, &metered, ParamSource::Full(&full))?;
        let predicted = RankCost::of(&t.program().program, 1)?;
        metered.clear();
        let out = t.gradients(batch)?;
        let mut measured = std::collections::BTreeMap::<(String, Vec<usize>), usize>::new();
        for call in metered.calls() {
            *measured.entry((call.kind.to_string(), call.group)).or_default() += call.bytes;
        }
        let want: std::collections::BTreeMap<(String, Vec<usize>), usize> = predicted
            .comm
            .iter()
            .filter(|c| c.bytes > 0 || c.kind.name() != "recv")
            .map(|c| ((c.kind.name().to_string(), c.group.clone()), c.bytes))
            .collect();
        Ok(StepFigures {
            peak: (out.run.peak_live_bytes, predicted.memory.peak_activations + predicted.memory.gradients),
            activations: (out.run.peak_activation_bytes, predicted.memory.activations),
            bytes_match: measured == want,
        })
    })
    .unwrap()
}

#[test]
fn recomputation_lowers_the_measured_peak_and_the_plan_predicts_it() {
    let gpt =
        Gpt::new(GptConfig { vocab: 32, context: 16, width: 32, heads: 2, layers: 4, mlp_ratio: 4, dropout: 0.1, ..GptConfig::default() })
            .unwrap();
    let net = net(&gpt, 8, 32, 1);
    for (n, seed) in [(1usize, 0u64), (2, 1), (4, 2)] {
        let what = format!("gpt n={n} seed={seed}");
        let mut g = net.graph.clone();
        if n > 1 {
            assign_random_strategies(&mut g, n, seed);
        }
        let plain = step(&Job::new(&g, net.loss, &context(n)).unwrap(), &net.batches[0]);
        let recomputed = step(&Job::new(&with(&g, &RecomputeChoice::Blocks), net.loss, &context(n)).unwrap(), &net.batches[0]);
        for (r, (a, b)) in plain.iter().zip(&recomputed).enumerate() {
            assert!(b.bytes_match, "{what} rank {r}: recomputed collectives move other bytes than the plan says");
            let ((peak0, _), (peak1, predicted1)) = (a.peak, b.peak);
            assert!(peak1 < peak0, "{what} rank {r}: peak {peak1} with recomputation, {peak0} without");
            let close = |measured: usize, predicted: usize| (measured as f64 - predicted as f64).abs() <= 0.1 * predicted as f64;
            assert!(close(peak1, predicted1), "{what} rank {r}: peak live bytes {peak1}, predicted {predicted1}");
            // The activations alone, measured and predicted, each within 10% of the other.
            for (m, p) in [a.activations, b.activations] {
                assert!(close(m, p), "{what} rank {r}: activations {m} measured, {p} predicted");
            }
            assert!(
                b.activations.0 < a.activations.0,
                "{what} rank {r}: activations {:?} with recomputation, {:?} without",
                b.activations,
                a.activations
            );
        }
    }
}

/// The 4-block GPT data parallel on 8 devices (and on 1): with every block recomputed, the
/// activations' own peak is at most 40% of the peak without, measured and in the plan, where
/// the step's peak (beside the gradients, which the step keeps to its end) need not fall.
#[test]
fn recomputing_every_block_keeps_at_most_40_percent_of_the_activations() {
    let gpt =
        Gpt::new(GptConfig { vocab: 64, context: 32, width: 64, heads: 4, layers: 4, mlp_ratio: 4, dropout: 0.0, ..GptConfig::default() })
            .unwrap();
    let net = net(&gpt, 32, 64, 1);
    for n in [1usize, 8] {
        let plain = step(&Job::new(&net.graph, net.loss, &context(n)).unwrap(), &net.batches[0]);
        let recomputed = step(&Job::new(&with(&net.graph, &RecomputeChoice::Blocks), net.loss, &context(n)).unwrap(), &net.batches[0]);
        for (r, (a, b)) in plain.iter().zip(&recomputed).enumerate() {
            let measured = b.activations.0 as f64 / a.activations.0 as f64;
            let planned = b.activations.1 as f64 / a.activations.1 as f64;
            assert!(measured <= 0.4 && planned <= 0.4, "n={n} rank {r}: {measured:.2} of the activations measured, {planned:.2} planned");
        }
    }
}

/// optimizer_level level3 under model-parallel strategies: a gathered weight that reaches an op
/// through a redistribution (the GPT's tied embedding, read by the lookup and the head) is
/// gathered and redistributed again for the backward pass, never kept from the forward pass;
/// the run equals the unsharded one bit for bit.
#[test]
fn a_level3_weight_is_redistributed_again_for_the_backward_pass() {
    let net = net(&small_gpt(), 8, 16, 2);
    let mut redistributed = 0;
    for seed in 0..8u64 {
        let mut g = net.graph.clone();
        assign_random_strategies(&mut g, 4, seed * 13 + 1);
        let mut ctx = context(4);
        let plain = Job::new(&g, net.loss, &ctx).unwrap();
        ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
        ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0, "optimizer_level": "level3"})).unwrap();
        let job = Job::new(&g, net.loss, &ctx).unwrap();
        let prog = job.program(0).unwrap().program;
        let gathers: Vec<NodeId> = prog.params.iter().filter_map(|p| p.gathered).collect();
        for (i, node) in prog.graph.nodes().iter().enumerate() {
            if node.inputs.iter().any(|x| gathers.contains(x)) && node.name.contains(".in") && !node.name.starts_with("grad/") {
                redistributed += 1;
                assert_eq!(node.recompute, Recompute::Marked, "seed {seed}: {} (node {i}) is kept", node.name);
            }
        }
        let a = run_local(&plain, &net.batches, || Ok(optimizer())).unwrap();
        let b = run_local(&job, &net.batches, || Ok(optimizer())).unwrap();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.losses), bits(&b.losses), "seed {seed}");
        for (name, t) in a.params.iter() {
            assert_eq!(bits(&t.to_f64_vec()), bits(&b.params.require(name).unwrap().to_f64_vec()), "seed {seed}: {name}");
        }
    }
    assert!(redistributed > 0, "no strategy redistributed a gathered weight");
}
