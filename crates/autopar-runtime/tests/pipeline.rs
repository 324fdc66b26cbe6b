//! Pipeline parallel equals stand-alone: a network of dense blocks spread over P stages, with a
//! weight tied between the first and the last stage (a shared parameter), a skip connection
//! from stage 0 to the last stage and dropout, trained on 8 ranks with P in {2, 4},
//! micro-batches M in {P, 2P+1}, GPipe and 1F1B, plain and interleaved (2 chunks per stage),
//! and random strategies inside the stages. Loss and every parameter after 10 steps match
//! stand-alone on the whole batch within a relative 1e-5 (f32).

use autopar_comm::Communicator;
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::{assign_random_strategies, ParallelContext};
use autopar_runtime::{run_local, Job, LrSchedule, Momentum, Optimizer, ParamSource, ParamStore, RankTrainer};
use autopar_tensor::Tensor;
use serde_json::json;

const FEATURES: usize = 8;
const WIDTH: usize = 16;
const BLOCKS: usize = 4;

/// The network for `batch` rows, block `i` on stage `i * stages / BLOCKS`.
fn network(batch: usize, stages: usize) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(7);
    let x = b.input("x", &[batch, FEATURES], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I32).unwrap();
    let tied = b.parameter("tied.weight", &[FEATURES, WIDTH], Initializer::HeUniform).unwrap();
    b.set_pipeline_stage(Some(0));
    let h0 = b.matmul("embed", x, tied).unwrap();
    let mut h = b.relu("embed.relu", h0).unwrap();
    for i in 0..BLOCKS {
        b.set_pipeline_stage(Some(i * stages / BLOCKS));
        h = b.dense(&format!("block{i}"), h, WIDTH, Initializer::HeUniform).unwrap();
        h = b.relu(&format!("block{i}.relu"), h).unwrap();
        if i == 1 {
            h = b.dropout(&format!("block{i}.dropout"), h, 0.25, 11).unwrap();
        }
    }
    b.set_pipeline_stage(Some(stages - 1));
    let skip = b.add("skip", h, h0).unwrap();
    // The head reuses the embedding weight: logits = skip @ tied^T.
    let logits = b.matmul_t("head", skip, tied, false, true).unwrap();
    let loss = b.softmax_cross_entropy("loss", logits, y).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batches(batch: usize, steps: usize) -> Vec<Vec<(String, Tensor)>> {
    let mut state = 0x9e37_79b9_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..steps)
        .map(|_| {
            let x: Vec<f32> = (0..batch * FEATURES).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let y: Vec<i32> = (0..batch).map(|_| (next() % FEATURES as u64) as i32).collect();
            vec![
                ("x".to_string(), Tensor::from_vec(&[batch, FEATURES], x).unwrap()),
                ("y".to_string(), Tensor::from_vec(&[batch], y).unwrap()),
            ]
        })
        .collect()
}

fn optimizer() -> Box<dyn Optimizer> {
    Box::new(Momentum::new(LrSchedule::Constant(0.05), 0.9).unwrap())
}

fn stand_alone(batch: usize, data: &[Vec<(String, Tensor)>]) -> (Vec<f64>, ParamStore) {
    let (g, loss) = network(batch, 1);
    stand_alone_of(g, loss, data)
}

/// Losses and final parameters of `g` trained on one device.
fn stand_alone_of(g: Graph, loss: NodeId, data: &[Vec<(String, Tensor)>]) -> (Vec<f64>, ParamStore) {
    let job = Job::new(&g, loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(&g).unwrap())).unwrap();
    let mut opt = optimizer();
    let losses = data.iter().map(|b| step.step(opt.as_mut(), b).unwrap()).collect();
    (losses, step.params().clone())
}

fn assert_close(what: &str, losses: &[f64], params: &ParamStore, want_losses: &[f64], want: &ParamStore) {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 + 1e-5 * b.abs();
    for (s, (a, b)) in losses.iter().zip(want_losses).enumerate() {
        assert!(close(*a, *b), "{what}: loss at step {s} {a} vs stand-alone {b}");
    }
    for (name, w) in want.iter() {
        let got = params.require(name).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (i, (a, b)) in got.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(close(*a, b), "{what}: {name}[{i}] {a} vs stand-alone {b}");
        }
    }
}

/// Trains `job` on `data` and checks it against stand-alone (`want`: losses and parameters),
/// and that the tied weight's copies on the first and the last stage stayed equal.
fn train_tied_and_check(what: &str, job: &Job, data: &[Vec<(String, Tensor)>], want: (&[f64], &ParamStore)) {
    let run = run_local(job, data, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_close(what, &run.losses, &run.params, want.0, want.1);
    let last_stage = job.device_num() - job.plan().stage_devices();
    let first = run.rank_params[0].require("tied.weight").unwrap().to_f64_vec();
    let last = run.rank_params[last_stage].require("tied.weight").unwrap().to_f64_vec();
    assert_eq!(first, last, "{what}: copies of the shared weight diverged");
}

fn context(devices: usize, stages: usize, scheduler: &str) -> ParallelContext {
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(devices)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    ctx.set("pipeline_stages", &json!(stages)).unwrap();
    ctx.set("pipeline_config", &json!({"pipeline_scheduler": scheduler})).unwrap();
    ctx
}

#[test]
fn pipelines_equal_stand_alone_with_a_shared_weight_a_skip_and_dropout() {
    let devices = 8;
    let steps = 10;
    let mut runs = 0;
    for stages in [2usize, 4] {
        let d = devices / stages;
        for micro in [stages, 2 * stages + 1] {
            let batch = micro * d * 2;
            let data = batches(batch, steps);
            let (want_losses, want) = stand_alone(batch, &data);
            for (k, scheduler) in ["gpipe", "1f1b"].into_iter().enumerate() {
                for seed in 0..2u64 {
                    let (mut g, loss) = network(batch / micro, stages);
                    if seed > 0 {
                        assign_random_strategies(&mut g, d, seed * 7919 + (stages * 10 + micro + k) as u64);
                    }
                    let job = Job::with_micro_batches(&g, loss, &context(devices, stages, scheduler), micro).unwrap();
                    let what = format!("P={stages} M={micro} {scheduler} seed={seed}");
                    train_tied_and_check(&what, &job, &data, (&want_losses, &want));
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 16);
}

#[test]
fn stage_errors_name_the_op() {
    let (g, loss) = network(8, 2);
    // Three stages asked of a network placed on two.
    let e = Job::with_micro_batches(&g, loss, &context(6, 3, "1f1b"), 2).unwrap_err().to_string();
    assert!(e.contains("stage 2 of 3 has no operator"), "{e}");
    let e = Job::with_micro_batches(&g, loss, &context(8, 2, "1f1b"), 0).unwrap_err().to_string();
    assert!(e.contains("micro-batch"), "{e}");
    // A step's batch must be exactly M micro-batches: 2 of 8 rows here, so 16 rows.
    let job = Job::with_micro_batches(&g, loss, &context(8, 2, "1f1b"), 2).unwrap();
    for rows in [24usize, 8] {
        let data = batches(rows, 1);
        let e = run_local(&job, &data, || Ok(optimizer())).unwrap_err().to_string();
        assert!(e.contains("\"x\"") || e.contains("input x"), "{rows} rows: {e}");
        assert!(e.contains(&format!("[{rows}, 8]")) && e.contains("[16, 8]"), "{rows} rows: {e}");
    }
}

/// The model zoo's GPT (tied embedding, dropout), Llama (grouped-query attention) and MLP, cut into stages (or, interleaved,
/// 2 chunks per stage) of equal FLOPs, against stand-alone on the whole batch.
#[test]
fn zoo_models_cut_by_flops_equal_stand_alone() {
    use autopar_models::{Gpt, GptConfig, Llama, LlamaConfig, Mlp, MlpConfig, Mode, Model};
    let gpt =
        Gpt::new(GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 2, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() })
            .unwrap();
    let mlp = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![16, 16, 16], num_classes: 8 }).unwrap();
    let llama = Llama::new(LlamaConfig {
        vocab: 16,
        context: 8,
        width: 16,
        heads: 4,
        kv_heads: 2,
        layers: 2,
        ffn_width: 24,
        ..LlamaConfig::default()
    })
    .unwrap();
    let models: [(&str, &dyn Model, usize); 3] = [("gpt", &gpt, 16), ("llama", &llama, 16), ("mlp", &mlp, 8)];
    let devices = 8;
    for (label, model, classes) in models {
        // Plain pipelines, then every interleaved shape the issue names: P in {2, 4}, M in {P, 2P+1},
        // gpipe and 1f1b; random strategies inside the stages on every other run.
        let mut configs = vec![(2usize, 5usize, "1f1b", false, None), (4, 4, "gpipe", false, None)];
        for stages in [2usize, 4] {
            for micro in [stages, 2 * stages + 1] {
                for (k, scheduler) in ["gpipe", "1f1b"].into_iter().enumerate() {
                    configs.push((stages, micro, scheduler, true, (k == 1).then_some((stages * 31 + micro) as u64)));
                }
            }
        }
        for (stages, micro, scheduler, interleave, random) in configs {
            let d = devices / stages;
            let batch = micro * d;
            let (g, m) = model.build_graph(batch, Mode::Train, 3).unwrap();
            let x = g.node(m.x).clone();
            let y = g.node(m.labels).clone();
            let mut state = 0x2545_f491_u64 + stages as u64;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let data: Vec<Vec<(String, Tensor)>> = (0..10)
                .map(|_| {
                    let nx = x.ty.numel();
                    let xt = if x.ty.dtype.is_float() {
                        Tensor::from_vec(&x.ty.shape, (0..nx).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect::<Vec<f32>>()).unwrap()
                    } else {
                        Tensor::from_vec(&x.ty.shape, (0..nx).map(|_| (next() % classes as u64) as i64).collect::<Vec<i64>>()).unwrap()
                    };
                    let yt =
                        Tensor::from_vec(&y.ty.shape, (0..y.ty.numel()).map(|_| (next() % classes as u64) as i64).collect::<Vec<i64>>())
                            .unwrap();
                    vec![(x.name.clone(), xt), (y.name.clone(), yt)]
                })
                .collect();
            let (want_losses, params) = stand_alone_of(g, m.loss, &data);
            let (mut mg, mm) = model.build_graph(batch / micro, Mode::Train, 3).unwrap();
            if let Some(seed) = random {
                assign_random_strategies(&mut mg, d, seed);
            }
            let ctx =
                if interleave { interleaved(context(devices, stages, scheduler), scheduler) } else { context(devices, stages, scheduler) };
            let job = Job::with_micro_batches(&mg, mm.loss, &ctx, micro).unwrap();
            assert_eq!(job.plan().chunks, if interleave { 2 } else { 1 });
            let what = format!("{label} P={stages} M={micro} {scheduler} interleave={interleave} random={random:?}");
            let run = run_local(&job, &data, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_close(&what, &run.losses, &run.params, &want_losses, &params);
        }
    }
}

fn fixtures() -> std::path::PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

/// The fixture `pp2` network (generate_strategies.py --pp 2 --shard none --train, batch 128,
/// micro_size 4): l1 on stage 0; l2 and the head on stage 1; for one micro-batch of 32 rows.
fn pp2_network() -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(1);
    let x = b.input("inputs0", &[32, 64], DType::F32).unwrap();
    let mut h = x;
    for (stage, name, din, dout) in [(0, "l1", 64, 128), (1, "l2", 128, 32)] {
        b.set_pipeline_stage(Some(stage));
        let w = b.parameter(&format!("{name}.w"), &[din, dout], Initializer::HeUniform).unwrap();
        let bias = b.parameter(&format!("{name}.b"), &[dout], Initializer::Zeros).unwrap();
        let m = b.matmul(&format!("{name}.mm"), h, w).unwrap();
        let a = b.add(&format!("{name}.add"), m, bias).unwrap();
        h = b.relu(&format!("{name}.relu"), a).unwrap();
    }
    let head = b.parameter("head.w", &[32, 16], Initializer::HeUniform).unwrap();
    let o = b.matmul("head.mm", h, head).unwrap();
    let loss = b.reduce_mean("loss", o, &[0, 1], false).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

#[test]
fn the_pp2_stage_0_program_sends_one_8_by_128_tensor_to_rank_4_per_micro_batch_and_writes_mindspores_stage_files() {
    use autopar_parallel::pipeline::{Action, Pass};
    use autopar_parallel::{assemble_job, JobRequest};
    let (g, loss) = pp2_network();
    let ctx = context(8, 2, "1f1b");
    let pp = assemble_job(&JobRequest { micro_batches: Some(4), ..JobRequest::new(&g, Some(loss), &ctx) }).unwrap();
    let sp = pp.program(0).unwrap();
    assert_eq!(sp.chunks().len(), 1);
    let chunk = &sp.chunks()[0];
    assert_eq!(chunk.send.len(), 1);
    assert_eq!(chunk.graph.node(chunk.send[0]).ty.shape.to_vec(), vec![8, 128]);
    let d = pp.stage_devices();
    let sends: Vec<(usize, usize)> = pp.schedule.stages[0]
        .iter()
        .filter_map(|a| match a {
            Action::Send { work, peer } if work.pass == Pass::Forward => Some((work.micro, peer * d + sp.position)),
            _ => None,
        })
        .collect();
    assert_eq!(sends, vec![(0, 4), (1, 4), (2, 4), (3, 4)]);

    // The per-stage strategy files hold what MindSpore's ranks 0 and 4 wrote (MindSpore's
    // gradient accumulation buffers accu_grads.* aside, which autopar does not keep as
    // parameters), with the same device matrices and tensor maps.
    let keys = |n: &str| vec![format!("moments.{n}")];
    let ours = autopar_parallel::strategy_files::pipeline_strategy_files(&pp, false, &keys);
    for (stage, rank) in [(0usize, 0usize), (1, 4)] {
        let theirs =
            autopar_checkpoint::StrategyFile::load(fixtures().join(format!("strategies/pp2/src/strategy_rank{rank}.ckpt"))).unwrap();
        let layouts = |f: &autopar_checkpoint::StrategyFile| {
            let mut v: Vec<(String, Vec<u32>, Vec<Vec<i32>>)> = f
                .layout_items
                .iter()
                .filter(|l| !l.name.starts_with("accu_grads."))
                .map(|l| (l.name.clone(), l.dev_matrix.clone(), l.tensor_map.clone()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(layouts(&ours[stage]), layouts(&theirs), "stage {stage}");
        let items = |f: &autopar_checkpoint::StrategyFile| {
            let mut v: Vec<(String, u32)> =
                f.strategy_items.iter().filter(|s| !s.node_name.starts_with("Receive_")).map(|s| (s.node_name.clone(), s.stage)).collect();
            v.sort();
            v
        };
        assert_eq!(items(&ours[stage]), items(&theirs), "stage {stage}");
    }
}

/// The network of the fixture `pp_shared` (generate_pp_shared.py): an embedding weight used on
/// stage 0 and again by the head on stage 1, on 2 devices.
#[test]
fn a_weight_shared_by_two_stages_has_mindspores_pipeline_layout_fields_and_sync_copies_the_owners_value() {
    use autopar_parallel::report::pipeline_layout_dict;
    let mut b = GraphBuilder::new(1);
    let x = b.input("x", &[1, 4], DType::F32).unwrap();
    let w = b.parameter("network.word_embedding.w", &[4, 4], Initializer::HeUniform).unwrap();
    b.set_pipeline_stage(Some(0));
    let e = b.matmul("embed", x, w).unwrap();
    b.set_pipeline_stage(Some(1));
    let o = b.matmul_t("head", e, w, false, true).unwrap();
    let loss = b.reduce_mean("loss", o, &[0, 1], false).unwrap();
    b.output(loss).unwrap();
    let g = b.finish();
    let job = Job::with_micro_batches(&g, loss, &context(2, 2, "1f1b"), 2).unwrap();
    let line = |rank: usize| {
        let dict = pipeline_layout_dict(job.plan(), rank);
        let (name, l) = dict.iter().find(|(n, _)| n == "network.word_embedding.w").unwrap();
        format!("{name} {l}")
    };
    // As MindSpore printed them (mindspore-internals.md §1).
    assert_eq!(line(0), "network.word_embedding.w ([1], [-1, -1], [4, 4], 0, True, '', [4, 4], [4, 4], True, True, 1, 1)");
    assert_eq!(line(1), "network.word_embedding.w ([1], [-1, -1], [4, 4], 0, True, '', [4, 4], [4, 4], True, False, 0, 1)");

    // Stage 1's copy drifts; sync_shared_parameters brings back stage 0's value.
    let full = ParamStore::init(&job.plan().plan.graph).unwrap();
    let values = autopar_comm::LocalComm::run(2, |comm| -> Result<Vec<f64>, String> {
        use autopar_comm::Communicator;
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full)).unwrap();
        if comm.rank() == 1 {
            let name = "network.word_embedding.w";
            let drifted = Tensor::from_vec(&[4, 4], vec![7.0f32; 16]).unwrap();
            t.params_mut().insert(name, drifted);
        }
        t.sync_shared_parameters().unwrap();
        Ok(t.params().require("network.word_embedding.w").unwrap().to_f64_vec())
    })
    .unwrap();
    assert_eq!(values[0], values[1]);
    assert_eq!(values[0], full.require("network.word_embedding.w").unwrap().to_f64_vec());
}

/// Clipping by global norm over every stage (the tied weight counted once) equals one
/// device's clipping.
#[test]
fn clipping_by_global_norm_spans_every_stage() {
    let (devices, stages, micro) = (4usize, 2usize, 2usize);
    let batch = micro * 2 * 2;
    let data = batches(batch, 6);
    let clip = 0.05;
    let (g1, loss1) = network(batch, 1);
    let clipped_alone = |clip: Option<f64>| {
        let job = Job::new(&g1, loss1, &ParallelContext::default()).unwrap();
        let mut step = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(&g1).unwrap())).unwrap();
        step.set_clip_grad_norm(clip).unwrap();
        let mut opt = optimizer();
        let losses: Vec<f64> = data.iter().map(|b| step.step(opt.as_mut(), b).unwrap()).collect();
        (losses, step.params().clone())
    };
    let (want_losses, want) = clipped_alone(Some(clip));
    let (_, unclipped) = clipped_alone(None);
    assert!(want.iter().any(|(k, v)| v.to_f64_vec() != unclipped.require(k).unwrap().to_f64_vec()), "the norm never exceeded {clip}");
    let (g, loss) = network(batch / micro, stages);
    let job = Job::with_micro_batches(&g, loss, &context(devices, stages, "1f1b"), micro).unwrap();
    let full = ParamStore::init(&job.plan().plan.graph).unwrap();
    let out = autopar_comm::LocalComm::run(devices, |comm| -> Result<(Vec<f64>, ParamStore), autopar_runtime::RuntimeError> {
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        t.set_clip_grad_norm(Some(clip))?;
        let mut opt = optimizer();
        let losses = data.iter().map(|b| t.step(opt.as_mut(), b)).collect::<Result<Vec<_>, _>>()?;
        Ok((losses, t.params().clone()))
    })
    .unwrap();
    let stores: Vec<ParamStore> = out.iter().map(|o| o.1.clone()).collect();
    let params = autopar_runtime::assemble_params(&job, &stores).unwrap();
    assert_close("pipeline, clipped", &out[0].0, &params, &want_losses, &want);
}

#[test]
fn a_rank_that_dies_mid_schedule_fails_every_other_rank_naming_it() {
    // 8 ranks, 4 stages of 2, 1F1B: rank 5 (stage 2) panics at the start of the second step,
    // while the others are inside that step's schedule, waiting on its sends and receives.
    let (devices, stages, micro) = (8usize, 4usize, 4usize);
    let batch = micro * 2 * 2;
    let data = batches(batch, 3);
    let (g, loss) = network(batch / micro, stages);
    let job = Job::with_micro_batches(&g, loss, &context(devices, stages, "1f1b"), micro).unwrap();
    let full = ParamStore::init(&job.plan().plan.graph).unwrap();
    let seen = std::sync::Mutex::new(vec![None::<String>; devices]);
    let start = std::time::Instant::now();
    let options = autopar_comm::LocalOptions::default().timeout(std::time::Duration::from_secs(600));
    let out = autopar_comm::LocalComm::run_with(devices, options, |comm| -> Result<(), autopar_runtime::RuntimeError> {
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        let mut opt = optimizer();
        let r = data.iter().enumerate().try_for_each(|(s, b)| {
            if s == 1 && comm.rank() == 5 {
                panic!("rank 5 dies on purpose");
            }
            t.step(opt.as_mut(), b).map(|_| ())
        });
        if let Err(e) = &r {
            seen.lock().unwrap()[comm.rank()] = Some(e.to_string());
        }
        r
    });
    let took = start.elapsed();
    assert!(took < std::time::Duration::from_secs(30), "the ranks took {took:?} to notice");
    let e = out.expect_err("a rank died").to_string();
    assert!(e.contains("rank 5") && e.contains("dies on purpose"), "{e}");
    for (r, s) in seen.into_inner().unwrap().iter().enumerate().filter(|(r, _)| *r != 5) {
        let s = s.as_deref().unwrap_or_else(|| panic!("rank {r} returned without an error"));
        assert!(s.contains("rank 5 failed") && s.contains("dies on purpose"), "rank {r}: {s}");
    }
}

/// The parallel optimizer inside pipelines: each stage's replicas store their parameters (and
/// optimizer state) sharded, all-gathered before the micro-batches and reduce-scattered after
/// them (or after each one, with `gradient_accumulation_shard`; at level2 and level3 inside each
/// micro-batch's backward pass). With the shard over the whole replica group and accumulation
/// before the reduce-scatter, 20 steps give the unsharded pipeline's parameters bit for bit;
/// shard groups of 2, and per-micro-batch reduce-scatters, add in another order (relative
/// 1e-5). The shared weight's copies stay equal.
#[test]
fn the_parallel_optimizer_inside_pipelines_equals_the_unsharded_pipeline() {
    let (devices, stages, micro, steps) = (8, 2, 4, 20);
    let d = devices / stages;
    let batch = micro * d * 2;
    let data = batches(batch, steps);
    let (want_losses, want) = stand_alone(batch, &data);
    let bits = |s: &ParamStore| -> Vec<(String, Vec<u64>)> {
        s.iter().map(|(n, t)| (n.to_string(), t.to_f64_vec().iter().map(|x| x.to_bits()).collect())).collect()
    };
    for seed in 0..2u64 {
        let (mut g, loss) = network(batch / micro, stages);
        if seed > 0 {
            assign_random_strategies(&mut g, d, 4242 + seed);
        }
        let plain = Job::with_micro_batches(&g, loss, &context(devices, stages, "1f1b"), micro).unwrap();
        let base = run_local(&plain, &data, || Ok(optimizer())).unwrap();
        let levels = [
            (-1, false, "level1"),
            (-1, true, "level1"),
            (2, false, "level1"),
            (2, true, "level1"),
            (-1, true, "level2"),
            (2, true, "level2"),
            (-1, true, "level3"),
            (2, true, "level3"),
        ];
        for (size, each, level) in levels {
            let what = format!("seed={seed} optimizer_weight_shard_size={size} gradient_accumulation_shard={each} optimizer_level={level}");
            let mut ctx = context(devices, stages, "1f1b");
            ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
            ctx.set(
                "parallel_optimizer_config",
                &json!({"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": size, "gradient_accumulation_shard": each, "optimizer_level": level}),
            )
            .unwrap();
            let job = Job::with_micro_batches(&g, loss, &ctx, micro).unwrap();
            // Level3: each chunk gathers its sharded weights itself, per micro-batch, and again
            // in its backward pass.
            let chunks = job.program(0).unwrap();
            let gathers = chunks
                .chunks()
                .iter()
                .flat_map(|c| [&c.graph, &c.backward])
                .flat_map(|g| g.nodes())
                .filter(|n| n.name.ends_with(".gather") || n.name.starts_with("recompute/") && n.op.kind() == "AllGather")
                .count();
            assert_eq!(gathers > 0, level == "level3", "{what}: {gathers} all-gathers in the chunks");
            // Level2 and level3: each chunk's backward pass reduce-scatters the gradients it forms.
            let scatters = chunks.chunks().iter().flat_map(|c| c.backward.nodes()).filter(|n| n.name.contains(".grad_shard/")).count();
            assert_eq!(scatters > 0, level != "level1", "{what}: {scatters} in-pass reduce-scatter nodes");
            if seed == 0 && size == -1 {
                // parameter_layout_dict names the shard group by world ranks: stage 1's ranks 4-7.
                let dict = autopar_parallel::report::pipeline_layout_dict(job.plan(), 5);
                let (_, l) = dict.iter().find(|(n, _)| n == "block3.weight").expect("stage 1 holds block3");
                assert_eq!(l.opt_shard_group, autopar_parallel::group_name(&[4, 5, 6, 7], devices), "{what}");
            }
            let run = run_local(&job, &data, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
            // Sharded: some rank stores less of a weight than the unsharded pipeline does.
            let stored = |r: &ParamStore| r.iter().map(|(_, t)| t.numel()).sum::<usize>();
            assert!(stored(&run.rank_params[0]) < stored(&base.rank_params[0]), "{what}: nothing was sharded");
            if (size, each) == (-1, false) {
                assert_eq!(bits(&run.params), bits(&base.params), "{what}: not bit-identical to the unsharded pipeline");
                assert_eq!(run.losses, base.losses, "{what}");
            }
            assert_close(&what, &run.losses, &run.params, &want_losses, &want);
            let first = run.rank_params[0].require("tied.weight").unwrap().to_f64_vec();
            let last = run.rank_params[devices - d].require("tied.weight").unwrap().to_f64_vec();
            assert_eq!(first, last, "{what}: copies of the shared weight diverged");
        }
    }
}

/// Blocks of the interleaved network: 8, so 2 chunks of 2 or 4 stages get at least one each.
const INTERLEAVED_BLOCKS: usize = 8;

/// The network for `batch` rows cut into `stages * chunks` pieces, block `i` on piece
/// `i * stages * chunks / 8` and so on stage `piece % stages` (the stages repeat in execution
/// order, as MindSpore's interleaved models place their cells): the embedding weight tied to
/// the head (stage 0 and the last), a weight used by block 0 and block 4 (stage 0 in chunks 0
/// and 1 of a 2-chunk pipeline: one rank computes both gradients), a skip from the first piece
/// to the last (relayed from the last stage back to the first between chunks) and dropout.
fn interleaved_network(batch: usize, stages: usize, chunks: usize) -> (Graph, NodeId) {
    blocks_network(batch, stages, chunks, true)
}

/// [`interleaved_network`]; without `train`, no dropout and no loss: the network's output is
/// its logits (and the node returned).
fn blocks_network(batch: usize, stages: usize, chunks: usize, train: bool) -> (Graph, NodeId) {
    blocks_network_with(batch, stages, chunks, train, false)
}

/// [`blocks_network`]; with `dead_branch`, a value of the first piece ("side") is used on the
/// last piece by an op that reaches no output ("dead").
fn blocks_network_with(batch: usize, stages: usize, chunks: usize, train: bool, dead_branch: bool) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(7);
    let x = b.input("x", &[batch, FEATURES], DType::F32).unwrap();
    let tied = b.parameter("tied.weight", &[FEATURES, WIDTH], Initializer::HeUniform).unwrap();
    let looped = b.parameter("loop.weight", &[WIDTH, WIDTH], Initializer::HeUniform).unwrap();
    b.set_pipeline_stage(Some(0));
    let h0 = b.matmul("embed", x, tied).unwrap();
    let side = dead_branch.then(|| b.relu("side", h0).unwrap());
    let mut h = b.relu("embed.relu", h0).unwrap();
    for i in 0..INTERLEAVED_BLOCKS {
        let piece = i * stages * chunks / INTERLEAVED_BLOCKS;
        b.set_pipeline_stage(Some(piece % stages));
        h = b.dense(&format!("block{i}"), h, WIDTH, Initializer::HeUniform).unwrap();
        if i % 4 == 0 {
            let l = b.matmul(&format!("block{i}.loop"), h, looped).unwrap();
            h = b.add(&format!("block{i}.loop_add"), h, l).unwrap();
        }
        h = b.relu(&format!("block{i}.relu"), h).unwrap();
        if i == 2 && train {
            h = b.dropout(&format!("block{i}.dropout"), h, 0.25, 11).unwrap();
        }
    }
    b.set_pipeline_stage(Some(stages - 1));
    if let Some(side) = side {
        b.add("dead", side, side).unwrap();
    }
    let skip = b.add("skip", h, h0).unwrap();
    let logits = b.matmul_t("head", skip, tied, false, true).unwrap();
    if !train {
        b.output(logits).unwrap();
        return (b.finish(), logits);
    }
    let y = b.input("y", &[batch], DType::I32).unwrap();
    let loss = b.softmax_cross_entropy("loss", logits, y).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn interleaved(mut ctx: ParallelContext, scheduler: &str) -> ParallelContext {
    ctx.set("pipeline_config", &json!({"pipeline_scheduler": scheduler, "pipeline_interleave": true})).unwrap();
    ctx
}

#[test]
fn interleaved_pipelines_of_two_chunks_equal_stand_alone() {
    let devices = 8;
    let steps = 10;
    let mut runs = 0;
    for stages in [2usize, 4] {
        let d = devices / stages;
        for micro in [stages, 2 * stages + 1] {
            let batch = micro * d * 2;
            let data = batches(batch, steps);
            let (g1, loss1) = interleaved_network(batch, 1, 1);
            let (want_losses, want) = stand_alone_of(g1, loss1, &data);
            for scheduler in ["gpipe", "1f1b"] {
                for seed in 0..2u64 {
                    let (mut g, loss) = interleaved_network(batch / micro, stages, 2);
                    if seed > 0 {
                        assign_random_strategies(&mut g, d, seed * 7919 + (stages * 10 + micro) as u64);
                    }
                    let job =
                        Job::with_micro_batches(&g, loss, &interleaved(context(devices, stages, scheduler), scheduler), micro).unwrap();
                    let what = format!("interleaved P={stages} M={micro} {scheduler} seed={seed}");
                    assert_eq!(job.plan().chunks, 2, "{what}");
                    assert_eq!(job.plan().schedule.shape.chunks, 2, "{what}");
                    // Stage 0 runs two chunks, and the last stage's first chunk sends to stage 0.
                    let sp = job.plan().program(devices - d).unwrap();
                    assert_eq!(sp.chunks().iter().map(|c| c.piece).collect::<Vec<_>>(), vec![stages - 1, 2 * stages - 1], "{what}");
                    assert!(!sp.chunks()[0].send.is_empty() && sp.chunks()[1].loss.is_some(), "{what}");
                    train_tied_and_check(&what, &job, &data, (&want_losses, &want));
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 16);
}

/// Without the interleave flag the same placement is an error naming the op placed before
/// its input; the model zoo cut into 2 chunks per stage by FLOPs (no placement) trains equal
/// to the plain pipeline's stand-alone, with the parallel optimizer and
/// gradient_accumulation_shard too.
#[test]
fn interleave_is_what_lets_stages_repeat_and_autopar_cuts_two_chunks_when_the_model_places_none() {
    let (g, loss) = interleaved_network(8, 2, 2);
    let e = Job::with_micro_batches(&g, loss, &context(4, 2, "1f1b"), 2).unwrap_err().to_string();
    assert!(e.contains("before its input"), "{e}");
    let (devices, stages, micro) = (8usize, 2usize, 4usize);
    let d = devices / stages;
    let batch = micro * d * 2;
    let data = batches(batch, 6);
    let (want_losses, want) = stand_alone(batch, &data);
    // `network` with no placement at all: autopar balances 4 pieces.
    let unplaced = || {
        let (mut g, loss) = network(batch / micro, stages);
        for i in 0..g.len() {
            g.node_mut(NodeId(i)).pipeline_stage = None;
        }
        (g, loss)
    };
    let (g, loss) = unplaced();
    for (shard, each) in [(false, false), (true, false), (true, true)] {
        let mut ctx = interleaved(context(devices, stages, "1f1b"), "1f1b");
        if shard {
            ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
            ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0, "gradient_accumulation_shard": each})).unwrap();
        }
        let job = Job::with_micro_batches(&g, loss, &ctx, micro).unwrap();
        let what = format!("balanced interleave, parallel optimizer {shard}, gradient_accumulation_shard {each}");
        assert_eq!(job.plan().chunks, autopar_parallel::DEFAULT_CHUNKS, "{what}");
        let run = run_local(&job, &data, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&what, &run.losses, &run.params, &want_losses, &want);
    }
}

/// A batch of `batch` rows of the network's input `x`, and the stand-alone forward's logits on
/// it ([`blocks_network`] without a loss).
fn inference_batch(batch: usize) -> (Vec<(String, Tensor)>, Tensor) {
    let data = batches(batch, 1).remove(0);
    let x: Vec<(String, Tensor)> = data.into_iter().filter(|(n, _)| n == "x").collect();
    let (g1, logits1) = blocks_network(batch, 1, 1, false);
    let mut alone = ParamStore::init(&g1).unwrap();
    let want = autopar_runtime::Executor::new(g1.clone(), &[logits1])
        .unwrap()
        .run(&mut alone, &[(g1.find("x").unwrap(), x[0].1.clone())], 0)
        .unwrap()
        .values
        .remove(0);
    (x, want)
}

/// Pipeline inference: the network's logits, micro-batch by micro-batch through the stages
/// (plain and interleaved, random strategies inside the stages), equal the stand-alone forward
/// on the whole batch; they reach the last stage's ranks, and every rank with
/// pipeline_result_broadcast. A training job refuses to predict and an inference job to train.
#[test]
fn pipeline_inference_gives_the_stand_alone_outputs_on_the_last_stage_or_on_every_rank_with_result_broadcast() {
    use autopar_runtime::RankTrainer;
    let (devices, stages, micro) = (4usize, 2usize, 3usize);
    let d = devices / stages;
    let batch = micro * d * 2;
    let (x, want) = inference_batch(batch);
    for (chunks, broadcast, seed) in [(1usize, false, None), (1, true, Some(5u64)), (2, true, None), (2, false, Some(9))] {
        let (mut g, _) = blocks_network(batch / micro, stages, chunks, false);
        if let Some(seed) = seed {
            assign_random_strategies(&mut g, d, seed);
        }
        let mut ctx = context(devices, stages, "1f1b");
        ctx.set("pipeline_config", &json!({"pipeline_interleave": chunks > 1})).unwrap();
        ctx.set("pipeline_result_broadcast", &json!(broadcast)).unwrap();
        let job = Job::inference(&g, &ctx, micro).unwrap();
        assert_eq!(job.plan().chunks, chunks);
        let full = ParamStore::init(&job.plan().plan.graph).unwrap();
        let what = format!("chunks={chunks} broadcast={broadcast} random={seed:?}");
        let outs = autopar_comm::LocalComm::run(devices, |comm| -> Result<Option<Vec<Tensor>>, autopar_runtime::RuntimeError> {
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
            let e = t.step(optimizer().as_mut(), &x).unwrap_err().to_string();
            assert!(e.contains("planned without a loss"), "{e}");
            t.predict(&x)
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        for (r, out) in outs.iter().enumerate() {
            match out {
                None => assert!(!broadcast && r < devices - d, "{what}: rank {r} got no outputs"),
                Some(o) => {
                    assert!(broadcast || r >= devices - d, "{what}: rank {r} got outputs without pipeline_result_broadcast");
                    assert_eq!(o.len(), 1);
                    assert_eq!(o[0].shape(), want.shape(), "{what}");
                    assert!(o[0].allclose(&want, 1e-5, 1e-6), "{what}: rank {r}: {:?} vs stand-alone", o[0].max_abs_diff(&want));
                }
            }
        }
    }
    // A training job refuses to predict.
    let (g, loss) = network(4, 2);
    let job = Job::with_micro_batches(&g, loss, &context(devices, stages, "1f1b"), 2).unwrap();
    let full = ParamStore::init(&job.plan().plan.graph).unwrap();
    let errs = autopar_comm::LocalComm::run(devices, |comm| -> Result<String, autopar_runtime::RuntimeError> {
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        Ok(t.predict(&batches(8, 1)[0]).unwrap_err().to_string())
    })
    .unwrap();
    assert!(errs.iter().all(|e| e.contains("this one trains")), "{errs:?}");
}

/// A value that crosses from the first piece to the last but does not reach the loss (a dead
/// branch) gets a zero gradient back, and the run equals stand-alone, plain and interleaved.
/// Without interleaving the network also has two weights shared by both stages and first used
/// in another order on each: their gradients are summed across the stages in one order.
#[test]
fn a_dead_branch_across_stages_and_two_shared_weights_equal_stand_alone() {
    let build = |batch: usize, stages: usize, chunks: usize| blocks_network_with(batch, stages, chunks, true, true);
    let (devices, stages, micro) = (4usize, 2usize, 2usize);
    let batch = micro * 2 * 2;
    let data = batches(batch, 3);
    let (g1, loss1) = build(batch, 1, 1);
    let (want_losses, want) = stand_alone_of(g1, loss1, &data);
    for chunks in [1usize, 2] {
        let (g, loss) = build(batch / micro, stages, chunks);
        let mut ctx = context(devices, stages, "1f1b");
        ctx.set("pipeline_config", &json!({"pipeline_interleave": chunks > 1})).unwrap();
        let job = Job::with_micro_batches(&g, loss, &ctx, micro).unwrap();
        let sp = job.plan().program(devices - 2).unwrap();
        let last = sp.chunks().last().unwrap();
        assert!(last.recv.iter().any(|&r| last.graph.node(r).name == "pipe/side"), "chunks={chunks}: side is received");
        let what = format!("dead branch, chunks={chunks}");
        let run = run_local(&job, &data, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&what, &run.losses, &run.params, &want_losses, &want);
    }
}

/// recursive_programming plans a pipeline's inference as MindSpore's `AjustToNoTraining` does
/// a whole network's: the inputs run whole on every rank of the first stage (MindSpore sets
/// the dataset's strategy back to nothing split), so micro-batches of 3 rows run on 2 devices
/// per stage, and the outputs equal the stand-alone forward. A dataset strategy the user chose
/// is kept: split, the same micro-batches are refused.
#[test]
fn recursive_programming_runs_a_pipelines_inference_inputs_whole_as_mindspore() {
    use autopar_runtime::RankTrainer;
    let (devices, stages, micro) = (4usize, 2usize, 3usize);
    let batch = micro * 3;
    let (x, want) = inference_batch(batch);
    let (g, _) = blocks_network(batch / micro, stages, 1, false);
    let mut ctx = context(devices, stages, "1f1b");
    ctx.set("parallel_mode", &json!("auto_parallel")).unwrap();
    ctx.set("search_mode", &json!("recursive_programming")).unwrap();
    ctx.set("pipeline_result_broadcast", &json!(true)).unwrap();
    let job = Job::inference(&g, &ctx, micro).unwrap();
    assert_eq!(job.plan().plan.dataset, autopar_parallel::DatasetStrategy::FullBatch);
    let full = ParamStore::init(&job.plan().plan.graph).unwrap();
    let outs = autopar_comm::LocalComm::run(devices, |comm| -> Result<Option<Vec<Tensor>>, autopar_runtime::RuntimeError> {
        RankTrainer::new(&job, &comm, ParamSource::Full(&full))?.predict(&x)
    })
    .unwrap();
    for (r, out) in outs.iter().enumerate() {
        let o = out.as_ref().unwrap_or_else(|| panic!("rank {r} got no outputs"));
        assert!(o[0].allclose(&want, 1e-5, 1e-6), "rank {r}: {:?} vs stand-alone", o[0].max_abs_diff(&want));
    }
    ctx.set("full_batch", &json!(false)).unwrap();
    let err = Job::inference(&g, &ctx, micro).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("cannot be split"), "{err}");
}

#[test]
fn a_pipeline_ranks_predicted_memory_holds_its_stages_parameters_and_the_micro_batches_in_flight() {
    use autopar_parallel::{assemble_job, JobRequest, RankCost};
    let (g, loss) = pp2_network();
    let memory = |scheduler: &str, rank: usize| {
        let ctx = context(8, 2, scheduler);
        let pp = assemble_job(&JobRequest { micro_batches: Some(4), ..JobRequest::new(&g, Some(loss), &ctx) }).unwrap();
        let program = pp.program(rank).unwrap();
        let whole = RankCost::of(&program.program, 2).unwrap().memory;
        (program.memory(&pp, 2).unwrap(), whole)
    };
    let (first, whole) = memory("1f1b", 0);
    let (last, _) = memory("1f1b", 4);
    // Each stage holds its own parameters (with their gradients and Adam's two slots), never
    // the other stage's: together they are the whole network's.
    assert!(first.parameters > 0 && last.parameters > 0);
    assert_eq!(first.parameters + last.parameters, whole.parameters);
    assert_eq!(first.gradients + last.gradients, whole.gradients);
    assert_eq!(first.optimizer_state + last.optimizer_state, whole.optimizer_state);
    assert!(first.total() < whole.total(), "{first:?} vs the whole network's {whole:?}");
    // GPipe keeps all 4 micro-batches' activations on stage 0; 1F1B at most 2 (P - s).
    let (gpipe, _) = memory("gpipe", 0);
    assert_eq!(gpipe.parameters, first.parameters);
    assert!(gpipe.peak_activations > first.peak_activations, "gpipe {gpipe:?} vs 1f1b {first:?}");
}
