//! `parameter_broadcast(trainer, layout, cur_rank, initial_rank)`: ranks that initialised their
//! slices differently end with equal replicas, each piece being its MindSpore-chosen owner's
//! value, and then train equal to stand_alone; the layout may be the job's
//! `parameter_layout_dict` or its strategy file, the job data_parallel, semi_auto (fixed and
//! random strategies), optimizer-sharded or a pipeline. Every error fails on every rank, with
//! the error, and no rank hangs.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_layout::redundancy::group_owners;
use autopar_layout::Strategy;
use autopar_parallel::{assign_random_strategies, parameter_layout_dict, ParallelContext};
use autopar_runtime::ParamSource;
use autopar_runtime::{assemble_params, Job, RankTrainer};
use autopar_runtime::{parameter_broadcast, BroadcastError, LayoutSource, Momentum, Optimizer, ParamStore, RuntimeError};
use autopar_runtime::{LrSchedule, Result};
use autopar_tensor::Tensor;
use serde_json::json;

const STEPS: usize = 6;

fn network(batch: usize, shard: bool) -> (Graph, NodeId) {
    let s = |t: &str| -> Strategy { t.parse().unwrap() };
    let mut b = GraphBuilder::new(5);
    let x = b.input("x", &[batch, 32], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[32, 64], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[64], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let m1 = b.matmul("fc1.mm", x, w1).unwrap();
    let h = b.add("fc1.add", m1, b1).unwrap();
    let h = b.relu("act1", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[64, 16], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let m2 = b.matmul("fc2.mm", h, w2).unwrap();
    let w3 = b.parameter("fc3.weight", &[16, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc3.mm", m2, w3).unwrap();
    if shard {
        b.shard(m1, s("((2,1),(1,2))")).unwrap();
        b.shard(m2, s("((2,2),(2,1))")).unwrap();
    }
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batches(batch: usize) -> Vec<Vec<(String, Tensor)>> {
    let mut rng = autopar_data::Rng::new(17);
    let mut next = move || rng.next_u64();
    (0..STEPS)
        .map(|_| {
            let x: Vec<f32> = (0..batch * 32).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let y: Vec<i64> = (0..batch).map(|_| (next() % 8) as i64).collect();
            vec![("x".to_string(), Tensor::from_vec(&[batch, 32], x).unwrap()), ("y".to_string(), Tensor::from_vec(&[batch], y).unwrap())]
        })
        .collect()
}

fn context(mode: &str, n: usize, opt_shard: Option<i64>) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!(mode)).unwrap();
    // data_parallel averages the ranks' gradients; semi_auto equals stand-alone without it.
    c.set("gradients_mean", &json!(mode == "data_parallel")).unwrap();
    if let Some(size) = opt_shard {
        c.set("enable_parallel_optimizer", &json!(true)).unwrap();
        c.set("parallel_optimizer_config", &json!({"optimizer_weight_shard_size": size, "parallel_optimizer_threshold": 0})).unwrap();
    }
    c
}

fn momentum() -> Box<dyn Optimizer> {
    Box::new(Momentum::new(LrSchedule::Constant(0.05), 0.9).unwrap())
}

/// The full parameters as rank `rank` would initialise them with its own seed.
fn seeded(full: &ParamStore, rank: usize) -> ParamStore {
    let mut out = ParamStore::new();
    for (name, t) in full.iter() {
        let v: Vec<f32> =
            t.to_f64_vec().iter().enumerate().map(|(i, x)| *x as f32 + (rank as f32 + 1.0) * 0.01 * ((i % 7) as f32 - 3.0)).collect();
        out.insert(name, Tensor::from_vec(t.shape(), v).unwrap());
    }
    out
}

/// The job's layout as rank `rank` sees it: its parameter_layout_dict, or the strategy file.
fn layout(job: &Job, rank: usize, from_file: bool) -> LayoutSource {
    if from_file {
        LayoutSource::Strategy(autopar_parallel::strategy_files::strategy_file(job.network(), false, &|_| Vec::new()))
    } else {
        LayoutSource::Dict(parameter_layout_dict(job.network(), rank, &|_| Vec::new()))
    }
}

/// Runs `f` on a thread and fails the test if it takes longer than a minute (a hang).
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what}: a rank hangs"))
}

struct Broadcasted {
    /// Every rank's pieces before and after the broadcast, then after training.
    before: Vec<ParamStore>,
    after: Vec<ParamStore>,
    trained: Vec<ParamStore>,
    losses: Vec<f64>,
    redundancy: BTreeMap<String, Vec<Vec<usize>>>,
    moved: usize,
}

fn broadcast_then_train(job: &Job, full: &ParamStore, data: &[Vec<(String, Tensor)>], from_file: bool) -> Broadcasted {
    let out = LocalComm::run(job.device_num(), |comm| -> Result<_> {
        let rank = comm.rank();
        let mut t = RankTrainer::new(job, &comm, ParamSource::Full(&seeded(full, rank)))?;
        let before = t.params().clone();
        let report = parameter_broadcast(&mut t, None, &comm, &layout(job, rank, from_file), rank, 0)?;
        let after = t.params().clone();
        let mut opt = momentum();
        let mut losses = Vec::new();
        for batch in data {
            losses.push(t.step(opt.as_mut(), batch)?);
        }
        Ok((before, after, t.params().clone(), losses, report))
    })
    .unwrap();
    let moved = out.iter().map(|o| o.4.received.len()).sum();
    Broadcasted {
        before: out.iter().map(|o| o.0.clone()).collect(),
        after: out.iter().map(|o| o.1.clone()).collect(),
        trained: out.iter().map(|o| o.2.clone()).collect(),
        losses: out[0].3.clone(),
        redundancy: out[0].4.redundancy.clone(),
        moved,
    }
}

fn stand_alone(graph: &Graph, loss: NodeId, params: ParamStore, data: &[Vec<(String, Tensor)>]) -> (Vec<f64>, ParamStore) {
    let job = Job::new(graph, loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Full(&params)).unwrap();
    let mut opt = momentum();
    let losses = data.iter().map(|b| step.step(opt.as_mut(), b).unwrap()).collect();
    (losses, step.params().clone())
}

/// Every piece equals its owner's value from before the broadcast, and the job then trains
/// equal to stand_alone from the parameters the broadcast left.
fn check(what: &str, job: &Job, graph: &Graph, loss: NodeId, run: &Broadcasted) {
    let owners = group_owners(&run.redundancy);
    let mut replicated = 0;
    for (name, groups) in &run.redundancy {
        for g in groups.iter().filter(|g| g.len() > 1) {
            let owner = owners[&(name.clone(), g.clone())];
            let want = run.before[owner].require(name).unwrap().to_f64_vec();
            for &r in g {
                assert_eq!(run.after[r].require(name).unwrap().to_f64_vec(), want, "{what}: {name} on rank {r}, owner {owner}");
            }
            replicated += 1;
        }
    }
    assert!(replicated > 0 && run.moved > 0, "{what}: nothing was broadcast");
    let start = assemble_params(job, &run.after).unwrap();
    let (want_losses, want) = stand_alone(graph, loss, start, &run_data(graph));
    let got = assemble_params(job, &run.trained).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 + 1e-5 * b.abs();
    for (s, (a, b)) in run.losses.iter().zip(&want_losses).enumerate() {
        assert!(close(*a, *b), "{what}: loss at step {s} {a} vs stand-alone {b}");
    }
    for (name, w) in want.iter() {
        for (i, (a, b)) in got.require(name).unwrap().to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(close(*a, b), "{what}: {name}[{i}] {a} vs stand-alone {b}");
        }
    }
}

fn run_data(graph: &Graph) -> Vec<Vec<(String, Tensor)>> {
    batches(graph.node(graph.find("x").unwrap()).ty.shape[0])
}

#[test]
fn replicas_end_equal_to_their_owner_and_train_equal_to_stand_alone() {
    let batch = 16;
    let mut cases: Vec<(String, Graph, NodeId, ParallelContext)> = Vec::new();
    let (g, loss) = network(batch, false);
    cases.push(("data_parallel on 4".into(), g.clone(), loss, context("data_parallel", 4, None)));
    let (gs, loss_s) = network(batch, true);
    cases.push(("semi_auto on 8".into(), gs.clone(), loss_s, context("semi_auto_parallel", 8, None)));
    cases.push(("semi_auto on 8, optimizer shard 2".into(), gs, loss_s, context("semi_auto_parallel", 8, Some(2))));
    cases.push(("data_parallel on 8, optimizer shard 2".into(), g.clone(), loss, context("data_parallel", 8, Some(2))));
    for seed in 0..4u64 {
        let n = [4usize, 8][seed as usize % 2];
        let mut gr = g.clone();
        assign_random_strategies(&mut gr, n, 31 * seed + 5);
        cases.push((format!("random strategy {seed} on {n}"), gr, loss, context("semi_auto_parallel", n, None)));
    }
    for (k, (what, graph, loss, ctx)) in cases.into_iter().enumerate() {
        let job = Job::new(&graph, loss, &ctx).unwrap();
        let full = ParamStore::init(&graph).unwrap();
        let from_file = k % 2 == 1;
        let run = broadcast_then_train(&job, &full, &run_data(&graph), from_file);
        check(&format!("{what} (layout from {})", if from_file { "strategy file" } else { "dict" }), &job, &graph, loss, &run);
    }
}

/// Each rank's outcome of a broadcast called with `args(rank) = (cur_rank, initial_rank)` and
/// `layout(rank)`, and whether its parameters stayed as they were.
fn failing_run(
    job: Job,
    args: fn(usize) -> (usize, usize),
    edit: fn(&mut Vec<(String, autopar_layout::ParameterLayout)>),
) -> Vec<(Option<RuntimeError>, bool)> {
    let full = ParamStore::init(job.graph()).unwrap();
    within_a_minute("failing broadcast", move || {
        LocalComm::run(job.device_num(), |comm| -> Result<_> {
            let rank = comm.rank();
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&seeded(&full, rank)))?;
            let before = t.params().clone();
            let mut dict = parameter_layout_dict(job.network(), rank, &|_| Vec::new());
            edit(&mut dict);
            let (cur, initial) = args(rank);
            let e = parameter_broadcast(&mut t, None, &comm, &LayoutSource::Dict(dict), cur, initial).err();
            let unchanged = t.params().iter().all(|(n, v)| before.require(n).unwrap().to_f64_vec() == v.to_f64_vec());
            Ok((e, unchanged))
        })
        .unwrap()
    })
}

fn broadcast_error(e: &Option<RuntimeError>) -> &BroadcastError {
    match e {
        Some(RuntimeError::Broadcast(b)) => b,
        other => panic!("expected a parameter_broadcast error, got {other:?}"),
    }
}

#[test]
fn every_error_fails_on_every_rank_without_a_hang() {
    let (g, loss) = network(16, false);
    let job = || Job::new(&g, loss, &context("data_parallel", 4, None)).unwrap();

    // Every rank passes cur_rank 0: ranks 1-3 are wrong, rank 0 hears it from rank 1.
    let out = failing_run(job(), |_| (0, 0), |_| {});
    for (r, (e, unchanged)) in out.iter().enumerate() {
        assert!(unchanged, "rank {r} changed its parameters");
        match broadcast_error(e) {
            BroadcastError::CurRank { cur_rank: 0, rank } => assert_eq!(*rank, r),
            BroadcastError::OnRank { rank: 1, message } => {
                assert_eq!(r, 0);
                assert!(message.contains("cur_rank 0 is not this rank, which is rank 1"), "{message}");
            }
            other => panic!("rank {r}: {other}"),
        }
    }

    // initial_rank 2 is not the start of the only stage.
    let out = failing_run(job(), |r| (r, 2), |_| {});
    for (r, (e, unchanged)) in out.iter().enumerate() {
        assert!(unchanged);
        match broadcast_error(e) {
            BroadcastError::InitialRank { initial_rank: 2, start: 0, rank, .. } => assert_eq!(*rank, r),
            other => panic!("rank {r}: {other}"),
        }
    }

    // A misspelled parameter: every rank names it and suggests the parameter.
    let out =
        failing_run(job(), |r| (r, 0), |d| d.iter_mut().filter(|(n, _)| n == "fc2.weight").for_each(|(n, _)| *n = "fc2.wieght".into()));
    for (r, (e, unchanged)) in out.iter().enumerate() {
        assert!(unchanged);
        let e = broadcast_error(e);
        assert!(
            matches!(e, BroadcastError::UnknownName { name, closest: Some(c) } if name == "fc2.wieght" && c == "fc2.weight"),
            "rank {r}: {e}"
        );
        assert!(e.to_string().contains("did you mean \"fc2.weight\""), "{e}");
    }

    // A layout of another strategy: fc1.weight split over 2 ranks is not this job's.
    let out = failing_run(
        job(),
        |r| (r, 0),
        |d| {
            for (n, l) in d.iter_mut().filter(|(n, _)| n == "fc1.weight") {
                let _ = n;
                l.dev_matrix = vec![2, 2];
                l.tensor_map = vec![-1, 0];
            }
        },
    );
    for (r, (e, unchanged)) in out.iter().enumerate() {
        assert!(unchanged);
        let e = broadcast_error(e);
        assert!(
            matches!(e, BroadcastError::Replicas { name, .. } if name == "fc1.weight") || matches!(e, BroadcastError::OnRank { .. }),
            "rank {r}: {e}"
        );
    }
    assert!(out.iter().any(|(e, _)| matches!(broadcast_error(e), BroadcastError::Replicas { .. })));

    // A layout for another device count.
    let out = failing_run(job(), |r| (r, 0), |d| d.iter_mut().for_each(|(_, l)| l.dev_matrix = vec![8]));
    for (e, _) in &out {
        assert!(matches!(broadcast_error(e), BroadcastError::Devices { devices: 8, stage_devices: 4, .. }), "{:?}", e);
    }
}

#[test]
fn pipeline_stages_broadcast_from_their_first_rank_and_refuse_another_initial_rank() {
    let mut b = GraphBuilder::new(9);
    let x = b.input("x", &[8, 8], DType::F32).unwrap();
    b.set_pipeline_stage(Some(0));
    let w0 = b.parameter("w0", &[8, 8], Initializer::HeUniform).unwrap();
    let h = b.matmul("mm0", x, w0).unwrap();
    b.set_pipeline_stage(Some(1));
    let w1 = b.parameter("w1", &[8, 8], Initializer::HeUniform).unwrap();
    let o = b.matmul("mm1", h, w1).unwrap();
    let loss = b.reduce_mean("loss", o, &[0, 1], false).unwrap();
    b.output(loss).unwrap();
    let g = b.finish();
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(4)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    ctx.set("pipeline_stages", &json!(2)).unwrap();
    let job = Job::with_micro_batches(&g, loss, &ctx, 2).unwrap();
    let full = ParamStore::init(&job.plan().plan.graph).unwrap();
    for wrong in [false, true] {
        let job = job.clone();
        let start = full.clone();
        let out = within_a_minute("pipeline broadcast", move || {
            LocalComm::run(4, |comm| -> Result<_> {
                let rank = comm.rank();
                let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&seeded(&start, rank)))?;
                let dict = autopar_parallel::report::pipeline_layout_dict(job.plan(), rank);
                let initial = if wrong { 0 } else { rank / 2 * 2 };
                let r = parameter_broadcast(&mut t, None, &comm, &LayoutSource::Dict(dict), rank, initial);
                Ok((r.map(|r| r.redundancy), t.params().clone()))
            })
            .unwrap()
        });
        if wrong {
            for (r, (res, _)) in out.iter().enumerate() {
                let e = res.as_ref().expect_err("stage 1 was given initial_rank 0");
                assert!(
                    e.to_string().contains(if r >= 2 { "initial_rank 0 is not the first rank" } else { "failed on rank 2" }),
                    "rank {r}: {e}"
                );
            }
            continue;
        }
        let seeds: Vec<ParamStore> = (0..4).map(|r| seeded(&full, r)).collect();
        for (stage, name) in [(0usize, "w0"), (1, "w1")] {
            let ranks = [2 * stage, 2 * stage + 1];
            let red = out[ranks[0]].0.as_ref().unwrap();
            assert_eq!(red[name], vec![ranks.to_vec()], "{name}: the stage's two ranks hold it");
            let owner = group_owners(red)[&(name.to_string(), ranks.to_vec())];
            let want = seeds[owner].require(name).unwrap().to_f64_vec();
            for r in ranks {
                assert_eq!(out[r].1.require(name).unwrap().to_f64_vec(), want, "{name} on rank {r}");
            }
        }
    }
}

#[test]
fn optimizer_state_named_by_the_layout_follows_its_owner_too() {
    let (g, loss) = network(16, false);
    let job = Job::new(&g, loss, &context("data_parallel", 4, None)).unwrap();
    let full = ParamStore::init(&g).unwrap();
    let data = run_data(&g);
    let out = LocalComm::run(4, |comm| -> Result<_> {
        let rank = comm.rank();
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        let mut opt = momentum();
        t.step(opt.as_mut(), &data[0])?;
        let name = "moments.fc1.weight";
        let drifted: Vec<f32> = opt.state().require(name)?.to_f64_vec().iter().map(|v| *v as f32 + rank as f32).collect();
        opt.state_mut().insert(name, Tensor::from_vec(&[32, 64], drifted).unwrap());
        let before = opt.state().require(name)?.to_f64_vec();
        let keys = |p: &str| vec![format!("moments.{p}")];
        let dict = LayoutSource::Dict(parameter_layout_dict(job.network(), rank, &keys));
        let report = parameter_broadcast(&mut t, Some(opt.as_mut()), &comm, &dict, rank, 0)?;
        Ok((before, opt.state().require(name)?.to_f64_vec(), report))
    })
    .unwrap();
    let owner = group_owners(&out[0].2.redundancy)[&("moments.fc1.weight".to_string(), vec![0, 1, 2, 3])];
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.1, out[owner].0, "moments.fc1.weight on rank {r} is not its owner's (rank {owner})");
    }
    assert_ne!(out[0].0, out[1].0, "the ranks' state differed before");
}

/// What each rank of a 4-rank data_parallel job returns from a broadcast with a momentum
/// state it may have dropped, an optimizer it chooses and a layout it may edit; `None` when it
/// succeeded, with the state of `moments.fc1.weight` before (None: absent) and after.
type StateRun = Vec<(Option<RuntimeError>, Option<Vec<f64>>, Option<Vec<f64>>)>;

fn state_run(
    optimizer: fn(usize) -> Box<dyn Optimizer>,
    drop_state: fn(usize) -> bool,
    edit: fn(usize, &mut Vec<(String, autopar_layout::ParameterLayout)>),
) -> StateRun {
    let (g, loss) = network(16, false);
    let job = Job::new(&g, loss, &context("data_parallel", 4, None)).unwrap();
    let full = ParamStore::init(&g).unwrap();
    let data = run_data(&g);
    within_a_minute("broadcast of optimizer state", move || {
        LocalComm::run(4, |comm| -> Result<_> {
            let rank = comm.rank();
            let name = "moments.fc1.weight";
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
            let mut opt = optimizer(rank);
            t.step(opt.as_mut(), &data[0])?;
            if let Some(m) = opt.state_mut().remove(name) {
                let drifted: Vec<f32> = m.to_f64_vec().iter().map(|v| *v as f32 + rank as f32).collect();
                opt.state_mut().insert(name, Tensor::from_vec(m.shape(), drifted).unwrap());
            }
            if drop_state(rank) {
                opt.state_mut().remove(name);
            }
            let before = opt.state().get(name).map(|t| t.to_f64_vec());
            let keys = |p: &str| vec![format!("moments.{p}")];
            let mut dict = parameter_layout_dict(job.network(), rank, &keys);
            edit(rank, &mut dict);
            let e = parameter_broadcast(&mut t, Some(opt.as_mut()), &comm, &LayoutSource::Dict(dict), rank, 0).err();
            Ok((e, before, opt.state().get(name).map(|t| t.to_f64_vec())))
        })
        .unwrap()
    })
}

#[test]
fn optimizer_state_missing_on_some_ranks_is_taken_as_zeros_without_a_hang() {
    // Ranks 1 and 3 have not created moments.fc1.weight (as before their first update): they
    // take part all the same and end with the owner's value; an owner without it sends zeros.
    let out = state_run(|_| momentum(), |r| r % 2 == 1, |_, _| {});
    let owner = {
        let keys = |p: &str| vec![format!("moments.{p}")];
        let (g, loss) = network(16, false);
        let job = Job::new(&g, loss, &context("data_parallel", 4, None)).unwrap();
        let red = LayoutSource::Dict(parameter_layout_dict(job.network(), 0, &keys)).redundancy(0, 4).unwrap();
        group_owners(&red)[&("moments.fc1.weight".to_string(), vec![0, 1, 2, 3])]
    };
    let want = out[owner].1.clone().unwrap_or_else(|| vec![0.0; 32 * 64]);
    for (r, (e, before, after)) in out.iter().enumerate() {
        assert!(e.is_none(), "rank {r}: {e:?}");
        assert_eq!(before.is_none(), r % 2 == 1);
        assert_eq!(after.as_ref(), Some(&want), "rank {r} does not hold the owner's (rank {owner}) state");
    }
}

/// The rank found a disagreement, or heard of one.
fn disagree(e: &Option<RuntimeError>) -> bool {
    match broadcast_error(e) {
        BroadcastError::Disagree { .. } => true,
        BroadcastError::OnRank { message, .. } => message.contains("would broadcast different"),
        _ => false,
    }
}

#[test]
fn ranks_that_disagree_on_the_state_or_the_layout_fail_together() {
    // Rank 0 runs AdamW (no moments.*), the others Momentum: rank 0 would skip what they send.
    let out = state_run(
        |r| if r == 0 { Box::new(autopar_runtime::AdamW::new(LrSchedule::Constant(0.01)).unwrap()) } else { momentum() },
        |_| false,
        |_, _| {},
    );
    for (r, (e, before, after)) in out.iter().enumerate() {
        assert!(disagree(e), "rank {r}: {e:?}");
        assert!(broadcast_error(e).to_string().contains("layouts or optimizers differ"), "{e:?}");
        assert_eq!(before, after, "rank {r} changed its state");
    }

    // Rank 2 passes an empty layout, the others the job's.
    let out = state_run(
        |_| momentum(),
        |_| false,
        |r, d| {
            if r == 2 {
                d.clear()
            }
        },
    );
    for (r, (e, ..)) in out.iter().enumerate() {
        assert!(disagree(e), "rank {r}: {e:?}");
    }

    // The layout's moments.fc1.weight is split, but the job keeps it whole on every rank.
    let out = state_run(
        |_| momentum(),
        |_| false,
        |_, d| {
            for (_, l) in d.iter_mut().filter(|(n, _)| n == "moments.fc1.weight") {
                l.tensor_map = vec![-1, 0];
            }
        },
    );
    for (r, (e, before, after)) in out.iter().enumerate() {
        let e = broadcast_error(e);
        assert!(
            matches!(e, BroadcastError::Replicas { name, .. } if name == "moments.fc1.weight")
                || matches!(e, BroadcastError::OnRank { message, .. } if message.contains("moments.fc1.weight")),
            "rank {r}: {e}"
        );
        assert_eq!(before, after);
    }
}
