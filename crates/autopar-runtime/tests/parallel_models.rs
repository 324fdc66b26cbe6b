//! Parallel equals serial for the model zoo (small sizes): the MLP, the GPT model (with
//! dropout) and ResNet-18 under semi_auto_parallel with random valid strategies, 10 steps each,
//! counted only when a split needs communication (34 such runs each on 2, 4 and 8 devices), and
//! under data_parallel against stand-alone on the same global batches. Each test checks the
//! kinds of collectives its runs exercised. The random strategies
//! split BatchNorm's batch, Softmax's axis and LayerNorm's normalised dimensions (synchronised
//! statistics), Dropout's input and the embedding table's vocabulary; each test checks that
//! they did.
//! Loss and every parameter after K steps within a relative 1e-5 (f32 arithmetic; a wider
//! absolute floor for the deeper networks, stated per model).

use autopar_graph::{Graph, NodeId, OpKind};
use autopar_models::{Gpt, GptConfig, Llama, LlamaConfig, Mlp, MlpConfig, Mode, Model, ResNet, ResNetConfig};
use autopar_parallel::{assign_random_strategies, ParallelContext};
use autopar_runtime::{run_local, Job};
use autopar_runtime::{LrSchedule, Momentum, Optimizer, ParamStore};
use autopar_runtime::{ParamSource, RankTrainer};
use autopar_tensor::Tensor;
use serde_json::json;

struct Case {
    graph: Graph,
    loss: NodeId,
    x: String,
    y: String,
    x_shape: Vec<usize>,
    y_shape: Vec<usize>,
    /// Token ids below this bound (integer input), or float features.
    int_input: Option<usize>,
    classes: usize,
    rtol: f64,
    atol: f64,
}

fn case(model: &dyn Model, batch: usize, classes: usize, rtol: f64, atol: f64) -> Case {
    let (graph, m) = model.build_graph(batch, Mode::Train, 3).unwrap();
    let x_shape = graph.node(m.x).ty.shape.clone();
    let y_shape = graph.node(m.labels).ty.shape.clone();
    let int_input = (!graph.node(m.x).ty.dtype.is_float()).then_some(classes);
    Case {
        x: graph.node(m.x).name.clone(),
        y: graph.node(m.labels).name.clone(),
        loss: m.loss,
        graph,
        x_shape,
        y_shape,
        int_input,
        classes,
        rtol,
        atol,
    }
}

fn data(c: &Case, steps: usize, seed: u64) -> Vec<Vec<(String, Tensor)>> {
    let mut rng = autopar_data::Rng::new(seed | 1);
    let mut next = move || rng.next_u64();
    (0..steps)
        .map(|_| {
            let nx: usize = c.x_shape.iter().product();
            let x = match c.int_input {
                Some(v) => Tensor::from_vec(&c.x_shape, (0..nx).map(|_| (next() % v as u64) as i64).collect()).unwrap(),
                None => Tensor::from_vec(&c.x_shape, (0..nx).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect::<Vec<f32>>()).unwrap(),
            };
            let ny: usize = c.y_shape.iter().product();
            let y = Tensor::from_vec(&c.y_shape, (0..ny).map(|_| (next() % c.classes as u64) as i64).collect()).unwrap();
            vec![(c.x.clone(), x), (c.y.clone(), y)]
        })
        .collect()
}

fn optimizer() -> Box<dyn Optimizer> {
    Box::new(Momentum::new(LrSchedule::Constant(0.05), 0.9).unwrap())
}

fn serial(c: &Case, batches: &[Vec<(String, Tensor)>]) -> (Vec<f64>, ParamStore) {
    let job = Job::new(&c.graph, c.loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(&c.graph).unwrap())).unwrap();
    let mut opt = optimizer();
    let losses = batches.iter().map(|b| step.step(opt.as_mut(), b).unwrap()).collect();
    (losses, step.params().clone())
}

/// How often the rank-0 programs of a test used the sharded forms that tie a slice to the whole.
#[derive(Default, Debug)]
struct Seen {
    /// Counted runs (a split that needs communication) on each device count that also split a
    /// parameter (model parallel, not only the batch).
    model_parallel: std::collections::BTreeMap<usize, usize>,
    synced_batch_norm: usize,
    synced_softmax: usize,
    synced_layer_norm: usize,
    synced_rms_norm: usize,
    /// Rotary embeddings run on a later part of the positions (a split sequence).
    split_positions: usize,
    /// Fused attentions run on a later part of the query rows.
    split_queries: usize,
    dropout_blocks: usize,
    split_tables: usize,
    /// Kinds of communication ops the splits needed.
    collectives: std::collections::BTreeSet<&'static str>,
}

fn assert_close(c: &Case, what: &str, losses: &[f64], params: &ParamStore, want_losses: &[f64], want: &ParamStore) {
    let close = |a: f64, b: f64| (a - b).abs() <= c.atol + c.rtol * b.abs();
    assert_eq!(losses.len(), want_losses.len(), "{what}: steps");
    for (s, (a, b)) in losses.iter().zip(want_losses).enumerate() {
        assert!(close(*a, *b), "{what}: loss at step {s} {a} vs stand-alone {b}");
    }
    for (name, w) in want.iter() {
        let got = params.require(name).unwrap();
        for (i, (a, b)) in got.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
            assert!(close(*a, b), "{what}: {name}[{i}] {a} vs stand-alone {b}");
        }
    }
}

/// Runs counted per device count: random strategies on 2, 4 and 8 devices until this many
/// runs each had a split that needs communication.
const RUNS_PER_DEVICE_COUNT: usize = 34;

fn check(c: &Case, label: &str, steps: usize) -> Seen {
    assert!(steps >= 10, "random-strategy runs train at least 10 steps");
    let batches = data(c, steps, 17);
    let (want_losses, want) = serial(c, &batches);
    let mut seen = Seen::default();
    for n in [2usize, 4, 8] {
        let mut counted = 0;
        for seed in 0u64.. {
            if counted == RUNS_PER_DEVICE_COUNT {
                break;
            }
            assert!(seed < 4 * RUNS_PER_DEVICE_COUNT as u64, "{label} n={n}: too few random strategies communicate");
            let mut g = c.graph.clone();
            assign_random_strategies(&mut g, n, seed * 104_729 + n as u64);
            let mut ctx = ParallelContext::default();
            ctx.set("device_num", &json!(n)).unwrap();
            ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
            // Both lowerings of a shard-to-shard move.
            ctx.set("enable_alltoall", &json!(seed % 2 == 0)).unwrap();
            let job = Job::new(&g, c.loss, &ctx).unwrap();
            let prog = job.program(0).unwrap().program;
            let splits_a_parameter = prog.params.iter().any(|p| p.stored_shape() != p.layout.shape());
            // Communication a split needs: in the forward and backward graph, beyond the
            // all-reduce of the loss's mean (forward and backward) and the gradient buckets that
            // every data-parallel run has.
            let loss_out = format!("{}.out", c.graph.node(c.loss).name);
            let split_comm: Vec<&'static str> = prog
                .graph
                .nodes()
                .iter()
                .filter(|n| n.op.is_communication() && !n.name.starts_with(&loss_out) && !n.name.starts_with(&format!("grad/{loss_out}")))
                .map(|n| n.op.kind())
                .collect();
            let mut in_op = false;
            for node in prog.graph.nodes() {
                match &node.op {
                    OpKind::BatchNorm(bn) if bn.group.len() > 1 => seen.synced_batch_norm += 1,
                    OpKind::Softmax(sm) if sm.group.len() > 1 => seen.synced_softmax += 1,
                    OpKind::LayerNorm(ln) if ln.group.len() > 1 => seen.synced_layer_norm += 1,
                    OpKind::RmsNorm(n) if n.group.len() > 1 => seen.synced_rms_norm += 1,
                    OpKind::Dropout(d) if d.block.is_some() => seen.dropout_blocks += 1,
                    OpKind::Gather(g) if g.shard.is_some() => seen.split_tables += 1,
                    _ => continue,
                }
                in_op = true;
            }
            // The last rank holds the last positions of a split sequence.
            let last = job.program(n - 1).unwrap().program;
            seen.split_positions +=
                last.graph.nodes().iter().filter(|n| matches!(&n.op, OpKind::RotaryEmbedding(r) if r.offset > 0)).count();
            seen.split_queries += last.graph.nodes().iter().filter(|n| matches!(&n.op, OpKind::Attention(a) if a.row_offset > 0)).count();
            let run = run_local(&job, &batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{label} n={n} seed={seed}: {e}"));
            assert_close(c, &format!("{label} n={n} seed={seed}"), &run.losses, &run.params, &want_losses, &want);
            if !split_comm.is_empty() || in_op {
                counted += 1;
                *seen.model_parallel.entry(n).or_default() += usize::from(splits_a_parameter);
                seen.collectives.extend(split_comm);
            }
        }
    }
    // On every device count some runs split parameters (model parallel, not only the batch).
    for n in [2usize, 4, 8] {
        assert!(seen.model_parallel.get(&n).copied().unwrap_or(0) > 0, "{label} n={n}: no run split a parameter");
    }
    // The runs exercised every kind of collective a redistribution uses.
    for kind in ["AllReduce", "AllGather", "ReduceScatter", "AllToAll"] {
        assert!(seen.collectives.contains(kind), "{label}: no {kind} in any run; saw {:?}", seen.collectives);
    }
    seen
}

/// data_parallel on `n` ranks against stand-alone on the same global batches: every rank
/// reads its rows of each batch.
fn check_data_parallel(global: &Case, label: &str, n: usize, steps: usize) {
    let batches = data(global, steps, 23);
    let (want_losses, want) = serial(global, &batches);
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!("data_parallel")).unwrap();
    ctx.set("gradients_mean", &json!(true)).unwrap();
    let job = Job::new(&global.graph, global.loss, &ctx).unwrap();
    let run = run_local(&job, &batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{label} data_parallel n={n}: {e}"));
    assert_close(global, &format!("{label} data_parallel n={n}"), &run.losses, &run.params, &want_losses, &want);
}

#[test]
fn zoo_mlp_equals_stand_alone() {
    let m = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![16, 16], num_classes: 8 }).unwrap();
    let c = case(&m, 16, 8, 1e-5, 1e-6);
    check(&c, "mlp", 10);
}

fn small_gpt() -> Gpt {
    let cfg = GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 1, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    Gpt::new(cfg).unwrap()
}

#[test]
fn gpt_equals_stand_alone() {
    let c = case(&small_gpt(), 8, 16, 1e-5, 1e-6);
    let seen = check(&c, "gpt", 10);
    assert!(seen.dropout_blocks > 0 && seen.split_tables > 0, "{seen:?}");
    assert!(seen.synced_softmax > 0 && seen.synced_layer_norm > 0, "{seen:?}");
}

fn small_llama() -> Llama {
    let cfg = LlamaConfig { vocab: 16, context: 8, width: 16, heads: 4, kv_heads: 2, layers: 1, ffn_width: 24, ..LlamaConfig::default() };
    Llama::new(cfg).unwrap()
}

/// The Llama block: RMSNorm with split normalised dimensions (synchronised mean squares), the
/// rotary embedding on split positions, fused causal grouped-query attention split by key/value
/// heads, query groups and query rows.
#[test]
fn llama_equals_stand_alone() {
    let c = case(&small_llama(), 8, 16, 1e-5, 1e-6);
    let seen = check(&c, "llama", 10);
    assert!(seen.synced_rms_norm > 0, "{seen:?}");
    assert!(seen.split_positions > 0, "{seen:?}");
    assert!(seen.split_queries > 0, "{seen:?}");
    assert!(seen.split_tables > 0, "{seen:?}");
    check_data_parallel(&c, "llama", 4, 10);
}

/// The mixture of experts: the router's top-k weights, the experts' concatenated weights, the
/// load-balancing loss over two blocks.
#[test]
fn moe_equals_stand_alone() {
    let cfg = LlamaConfig {
        vocab: 16,
        context: 8,
        width: 16,
        heads: 2,
        kv_heads: 1,
        layers: 2,
        aux_loss_coef: 0.05,
        ffn_width: 8,
        experts: 4,
        top_k: 2,
        ..LlamaConfig::default()
    };
    let c = case(&Llama::new(cfg.clone()).unwrap(), 8, 16, 1e-5, 1e-6);
    check(&c, "moe", 10);
    // Under an expert capacity (choices dropped, the tokens counted whole).
    let c = case(&Llama::new(LlamaConfig { capacity_factor: 0.75, ..cfg }).unwrap(), 8, 16, 1e-5, 1e-6);
    check(&c, "moe with capacity", 10);
}

#[test]
fn resnet18_equals_stand_alone() {
    let cfg = ResNetConfig::resnet18(4).with_width(4).with_stem(autopar_models::Stem::Cifar, &[3, 8, 8]);
    let m = ResNet::new(cfg).unwrap();
    let c = case(&m, 8, 4, 1e-5, 1e-5);
    let seen = check(&c, "resnet18", 10);
    assert!(seen.synced_batch_norm > 0, "{seen:?}");
}

#[test]
fn data_parallel_with_batch_norm_and_dropout_equals_stand_alone_on_the_global_batch() {
    let cfg = ResNetConfig::resnet18(4).with_width(4).with_stem(autopar_models::Stem::Cifar, &[3, 8, 8]);
    let m = ResNet::new(cfg).unwrap();
    let gpt = small_gpt();
    for n in [2usize, 4] {
        check_data_parallel(&case(&m, 2 * n, 4, 1e-5, 1e-5), "resnet18", n, 2);
        check_data_parallel(&case(&gpt, 2 * n, 16, 1e-5, 1e-6), "gpt", n, 2);
    }
}

/// auto_parallel: every search's plan trains equal to stand-alone, for the MLP, the GPT model
/// and ResNet-18 (random sizes) on 2, 4 and 8 devices, and on models wide for their batch, where
/// recursive_programming's own costs choose model parallel: an MLP on a batch of 2 (it splits
/// a 1024-wide layer's weight rather than the batch) on 2 devices, a GPT block on 4.
#[test]
fn auto_parallel_plans_equal_stand_alone() {
    let mut rng = autopar_data::Rng::new(5);
    let mut cases: Vec<(String, Case, &[usize])> = Vec::new();
    for _ in 0..2 {
        let widths = [8usize, 16, 32, 64];
        let hidden = vec![widths[(rng.next_u64() % 4) as usize], widths[(rng.next_u64() % 4) as usize]];
        let m = Mlp::new(MlpConfig { input_shape: vec![12], hidden: hidden.clone(), num_classes: 8 }).unwrap();
        cases.push((format!("mlp {hidden:?}"), case(&m, 16, 8, 1e-5, 1e-6), &[2, 4, 8]));
    }
    let wide = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![1024, 1024], num_classes: 8 }).unwrap();
    cases.push(("wide mlp".into(), case(&wide, 2, 8, 1e-5, 1e-6), &[2]));
    // A GPT and a ResNet-18 of random sizes.
    let mut pick = |xs: &[usize]| xs[(rng.next_u64() % xs.len() as u64) as usize];
    let (width, heads, context, layers) = (pick(&[8, 16, 24]), pick(&[1, 2]), pick(&[4, 8]), pick(&[1, 2]));
    let cfg = GptConfig { vocab: 16, context, width, heads, layers, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    let label = format!("gpt width {width} heads {heads} context {context} layers {layers}");
    cases.push((label, case(&Gpt::new(cfg).unwrap(), 8, 16, 1e-5, 1e-6), &[2, 4, 8]));
    let (heads, kv_heads, context) = (pick(&[2, 4]), pick(&[1, 2]), pick(&[4, 8]));
    let cfg = LlamaConfig { vocab: 16, context, width: 16, heads, kv_heads, layers: 1, ffn_width: 24, ..LlamaConfig::default() };
    cases.push((
        format!("llama heads {heads} kv_heads {kv_heads} context {context}"),
        case(&Llama::new(cfg).unwrap(), 8, 16, 1e-5, 1e-6),
        &[2, 4, 8],
    ));
    let resnet_width = pick(&[2, 4]);
    // Width 256 on 4 sequences of 8 tokens: recursive_programming splits the projections'
    // columns and its rules carry that into the attention heads (model-parallel attention).
    let cfg = GptConfig { vocab: 64, context: 8, width: 256, heads: 4, layers: 1, mlp_ratio: 2, dropout: 0.0, ..GptConfig::default() };
    cases.push(("wide gpt".into(), case(&Gpt::new(cfg).unwrap(), 4, 64, 1e-5, 1e-6), &[4]));
    let cfg = ResNetConfig::resnet18(4).with_width(resnet_width).with_stem(autopar_models::Stem::Cifar, &[3, 8, 8]);
    cases.push((format!("resnet18 width {resnet_width}"), case(&ResNet::new(cfg).unwrap(), 8, 4, 1e-5, 1e-5), &[2, 4, 8]));
    // Per search: runs whose plan splits some parameter (model parallel, not only the batch).
    let mut model_parallel = std::collections::BTreeMap::new();
    for (label, c, devices) in &cases {
        let batches = data(c, 10, 29);
        let (want_losses, want) = serial(c, &batches);
        for &n in devices.iter() {
            for search in ["recursive_programming", "sharding_propagation", "dynamic_programming"] {
                let mut ctx = ParallelContext::default();
                ctx.set("device_num", &json!(n)).unwrap();
                ctx.set("parallel_mode", &json!("auto_parallel")).unwrap();
                ctx.set("search_mode", &json!(search)).unwrap();
                let what = format!("{label} n={n} {search}");
                let mut graph = c.graph.clone();
                if search == "sharding_propagation" {
                    set_first_matmul_model_parallel(&mut graph, n);
                }
                let job = Job::new(&graph, c.loss, &ctx).unwrap_or_else(|e| panic!("{what}: {e}"));
                let plan = job.network();
                assert_eq!(plan.search.as_ref().map(|r| r.search.name()), Some(search), "{what}");
                if plan.params.iter().any(|p| p.layout.num_slices() > 1) {
                    *model_parallel.entry(search).or_insert(0) += 1;
                }
                let run = run_local(&job, &batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_close(c, &what, &run.losses, &run.params, &want_losses, &want);
            }
        }
    }
    for search in ["recursive_programming", "sharding_propagation", "dynamic_programming"] {
        assert!(model_parallel.get(search).copied().unwrap_or(0) > 0, "{search} never split a parameter: {model_parallel:?}");
    }
}

/// More devices than sequences: a MatMul's rows (batch x tokens) split 8 ways over a batch of
/// 2 reach the attention's head reshape `[B * T, H] -> [B, T, heads, d]`, which carries them as
/// 2 ways over the batch and 4 over the tokens (the device axis factored: the reshape runs
/// locally, no gather around it), and back through the merge reshape; trains equal to
/// stand-alone.
#[test]
fn a_row_split_wider_than_the_batch_runs_through_the_head_reshapes() {
    use autopar_graph::{RuleCx, ShardingRule, TensorType};
    let cfg = GptConfig { vocab: 16, context: 8, width: 16, heads: 2, layers: 1, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    let c = case(&Gpt::new(cfg).unwrap(), 2, 16, 1e-5, 1e-6);
    let n = 8;
    let mut graph = c.graph.clone();
    for id in (0..graph.len()).map(NodeId) {
        let node = graph.node(id).clone();
        if node.op.kind() != "MatMul" {
            continue;
        }
        let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &graph.node(*x).ty).collect();
        let ShardingRule::Spec(spec) = node.op.def().sharding(&RuleCx { inputs: &ins, output: &node.ty }) else { continue };
        let mut rows = vec![1; spec.dims.len()];
        rows[spec.output[0].expect("a MatMul's rows")] = n;
        graph.node_mut(id).strategy = Some(spec.strategy_of(&rows));
    }
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    ctx.set("full_batch", &json!(true)).unwrap();
    let job = Job::new(&graph, c.loss, &ctx).unwrap();
    let carried: Vec<(&str, Vec<usize>)> = job
        .network()
        .nodes
        .iter()
        .filter(|p| p.kind == "Reshape" && p.output.mesh().ndim() > p.inputs[0].mesh().ndim())
        .map(|p| (p.name.as_str(), p.output.splits()))
        .collect();
    assert_eq!(carried.len(), 3, "q, k and v head reshapes carry the split: {carried:?}");
    for (name, splits) in &carried {
        assert_eq!(splits, &vec![2, 4, 1, 1], "{name}");
    }
    let batches = data(&c, 10, 37);
    let (want_losses, want) = serial(&c, &batches);
    let run = run_local(&job, &batches, || Ok(optimizer())).unwrap();
    assert_close(&c, "gpt rows over 8 devices, batch 2", &run.losses, &run.params, &want_losses, &want);
}

/// dynamic_programming's plan of a 3-block GPT, whose blocks it ties to one choice (model
/// parallel on 8 devices), trains equal to stand-alone, with dropout.
#[test]
fn a_tied_dynamic_programming_plan_equals_stand_alone() {
    let cfg = GptConfig { vocab: 32, context: 8, width: 256, heads: 2, layers: 3, mlp_ratio: 2, dropout: 0.1, ..GptConfig::default() };
    let c = case(&Gpt::new(cfg).unwrap(), 8, 32, 1e-5, 1e-6);
    let batches = data(&c, 10, 31);
    let (want_losses, want) = serial(&c, &batches);
    for n in [4usize, 8] {
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(n)).unwrap();
        ctx.set("parallel_mode", &json!("auto_parallel")).unwrap();
        ctx.set("search_mode", &json!("dynamic_programming")).unwrap();
        // Communication nearly free in MindSpore's cost model: the fewest bytes computed, so
        // weights are split.
        ctx.set("costmodel_beta", &json!(0.01)).unwrap();
        let job = Job::new(&c.graph, c.loss, &ctx).unwrap();
        let report = job.network().search.as_ref().unwrap();
        assert_eq!(report.tied.iter().map(|t| t.copies).collect::<Vec<_>>(), vec![2], "n={n}");
        if n == 8 {
            assert!(job.network().params.iter().any(|p| p.layout.num_slices() > 1), "n={n}: data parallel only");
        }
        let run = run_local(&job, &batches, || Ok(optimizer())).unwrap();
        assert_close(&c, &format!("tied gpt n={n}"), &run.losses, &run.params, &want_losses, &want);
    }
}

/// Sharding propagation spreads what the user set: give the first MatMul a strategy that splits
/// its weight (the output features) over every device it can.
fn set_first_matmul_model_parallel(graph: &mut Graph, n: usize) {
    use autopar_graph::{RuleCx, ShardingRule, TensorType};
    let Some(id) = (0..graph.len()).map(NodeId).find(|&id| graph.node(id).op.kind() == "MatMul") else { return };
    let node = graph.node(id).clone();
    let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &graph.node(*x).ty).collect();
    let ShardingRule::Spec(spec) = node.op.def().sharding(&RuleCx { inputs: &ins, output: &node.ty }) else { return };
    let j = spec.dims.len() - 1;
    if let Some(s) = spec.valid_splits(n).into_iter().filter(|s| s[j] > 1).max_by_key(|s| (s[j], s.iter().product::<usize>())) {
        graph.node_mut(id).strategy = Some(spec.strategy_of(&s));
    }
}

/// auto_parallel at scale: ResNet-50 (bottleneck blocks, ImageNet stem; width 8, 32x32 images,
/// 10 classes) on 64 simulated devices, planned by recursive_programming and by
/// dynamic_programming in seconds (whose plan splits some weights there: model parallel),
/// trains equal to stand-alone.
#[test]
fn resnet50_auto_parallel_on_64_devices_equals_stand_alone() {
    let cfg = ResNetConfig::resnet50(10).with_width(8).with_stem(autopar_models::Stem::ImageNet, &[3, 32, 32]);
    let c = case(&ResNet::new(cfg).unwrap(), 64, 10, 1e-5, 1e-5);
    let batches = data(&c, 3, 31);
    let (want_losses, want) = serial(&c, &batches);
    for search in ["recursive_programming", "dynamic_programming"] {
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(64)).unwrap();
        ctx.set("parallel_mode", &json!("auto_parallel")).unwrap();
        ctx.set("search_mode", &json!(search)).unwrap();
        let what = format!("resnet50 n=64 {search}");
        // dynamic_programming in seconds under the built-in device profile (MindSpore's cost
        // model keeps ResNet-50 data parallel here).
        let profile = autopar_parallel::DeviceProfile::builtin();
        let req =
            autopar_parallel::JobRequest { profile: Some(&profile), ..autopar_parallel::JobRequest::new(&c.graph, Some(c.loss), &ctx) };
        let job = Job::assemble(&req).unwrap_or_else(|e| panic!("{what}: {e}"));
        let split_weights = job.network().params.iter().filter(|p| p.layout.num_slices() > 1).count();
        if search == "dynamic_programming" {
            assert!(split_weights > 0, "{what}: no weight is split, so the test would not exercise model parallelism");
        }
        let run = run_local(&job, &batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_close(&c, &what, &run.losses, &run.params, &want_losses, &want);
    }
}

/// Megatron's sequence parallelism on Llama blocks, from strategies alone: the norms and residual
/// adds split by rows (tokens), the projections into a block's attention and MLP split by
/// columns, those out of them by rows, the head transposes, rotations and attention by heads. Each tensor-parallel region's input is all-gathered from
/// the token split and its output reduce-scattered back to it: no all-reduce of activations in
/// the forward pass. Trains equal to stand-alone on 2 and 4 devices.
#[test]
fn llama_sequence_parallel_strategies_gather_into_and_reduce_scatter_out_of_each_tensor_parallel_region() {
    use autopar_graph::Strategy;
    let cfg = LlamaConfig { vocab: 16, context: 8, width: 16, heads: 4, kv_heads: 4, layers: 2, ffn_width: 32, ..LlamaConfig::default() };
    let model = Llama::new(cfg).unwrap();
    let c = case(&model, 4, 16, 1e-5, 1e-6);
    let batches = data(&c, 3, 41);
    let (want_losses, want) = serial(&c, &batches);
    for mp in [2usize, 4] {
        let (mut graph, m) = model.build_graph(4, Mode::Train, 3).unwrap();
        let s = |v: &[&[usize]]| Strategy::new(v.iter().map(|x| x.to_vec()).collect());
        let mut set = |name: String, st: Strategy| {
            m.shard_graph(&mut graph, &name, st).unwrap();
        };
        for i in 0..2 {
            let p = |x: &str| format!("model.layers.{i}.{x}");
            for norm in ["input_layernorm", "post_attention_layernorm"] {
                set(p(norm), s(&[&[mp, 1], &[1]]));
            }
            for add in ["add1", "add2"] {
                set(p(add), s(&[&[mp, 1], &[mp, 1]]));
            }
            for col in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"] {
                set(p(&format!("{col}.matmul")), s(&[&[1, 1], &[mp, 1]]));
            }
            for row in ["self_attn.o_proj", "mlp.down_proj"] {
                set(p(&format!("{row}.matmul")), s(&[&[1, mp], &[1, mp]]));
            }
            for heads in ["self_attn.q.heads", "self_attn.k.heads", "self_attn.v.heads"] {
                set(p(heads), s(&[&[1, 1, mp, 1]]));
            }
            set(p("self_attn.merge"), s(&[&[1, mp, 1, 1]]));
            set(p("self_attn.q_rope"), s(&[&[1, mp, 1, 1]]));
            set(p("self_attn.k_rope"), s(&[&[1, mp, 1, 1]]));
            set(p("self_attn.attention"), s(&[&[1, mp, 1, 1, 1], &[1, mp, 1, 1], &[1, mp, 1, 1]]));
            set(p("mlp.silu"), s(&[&[1, mp]]));
            set(p("mlp.swiglu"), s(&[&[1, mp], &[1, mp]]));
        }
        set("model.norm".into(), s(&[&[mp, 1], &[1]]));
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(mp)).unwrap();
        ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
        let job = Job::new(&graph, m.loss, &ctx).unwrap();
        let prog = job.program(0).unwrap().program;
        // The forward pass's collectives inside the blocks: all-gathers of the token-split
        // input of each column-parallel projection, reduce-scatters of the row-parallel ones'
        // outputs into the residual adds, nothing else.
        let mut seen = (0, 0);
        for n in prog.graph.nodes().iter().filter(|n| n.op.is_communication() && n.name.starts_with("model.layers.")) {
            if n.name.starts_with("grad/") {
                continue;
            }
            match n.op.kind() {
                "AllGather" if n.name.ends_with("_proj.matmul.in0.redist0") => seen.0 += 1,
                "ReduceScatter" if n.name.ends_with(".add1.in1.redist0") || n.name.ends_with(".add2.in1.redist0") => seen.1 += 1,
                _ => panic!("mp={mp}: {} {} in the forward pass", n.name, n.op),
            }
        }
        assert_eq!(seen.1, 4, "mp={mp}: a reduce-scatter out of each attention and MLP");
        assert!(seen.0 >= 4, "mp={mp}: {seen:?}");
        let run = run_local(&job, &batches, || Ok(optimizer())).unwrap_or_else(|e| panic!("mp={mp}: {e}"));
        assert_close(&c, &format!("sequence parallel mp={mp}"), &run.losses, &run.params, &want_losses, &want);
    }
}
