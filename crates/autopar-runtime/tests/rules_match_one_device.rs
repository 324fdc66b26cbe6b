//! Every op's sharding rule, checked against one device, forward and backward: for each op of
//! the catalog (one small random-shaped graph per op kind, its float inputs made parameters),
//! `loss = sum(op(...) * r)` is trained for one step's gradients under random valid strategies
//! on 2, 4 and 8 simulated devices. The loss and every parameter's gradient (assembled from the
//! ranks' synchronised slices) must equal the one-device run. Op kinds without a sharded form
//! (backward and communication ops) must be refused by the planner, naming the op.

use std::collections::BTreeSet;

use autopar_comm::LocalComm;
use autopar_data::Rng;
use autopar_graph::catalog::{op_cases, OpCase, Values};
use autopar_graph::{DType, Graph, GraphBuilder, NodeId, OpKind, ParamSpec, RuleCx, ShardingRule, TensorType};
use autopar_parallel::{assign_random_layouts, assign_random_strategies, ParallelContext, ParallelError};
use autopar_runtime::ParamSource;
use autopar_runtime::{assemble_params, Job, RankTrainer};
use autopar_runtime::{ParamStore, RuntimeError};
use autopar_tensor::Tensor;
use serde_json::json;

fn value(v: Values, shape: &[usize], rng: &mut Rng) -> Tensor {
    let mut next = || rng.next_u64();
    let n: usize = shape.iter().product();
    match v {
        Values::Normal => Tensor::from_vec(shape, (0..n).map(|_| (next() % 2001) as f64 / 1000.0 - 1.0).collect()).unwrap(),
        Values::Positive => Tensor::from_vec(shape, (0..n).map(|_| 0.5 + (next() % 1501) as f64 / 1000.0).collect()).unwrap(),
        Values::Index(b) => Tensor::from_vec(shape, (0..n).map(|_| (next() % b as u64) as i64).collect()).unwrap(),
    }
}

/// The case's graph with its differentiable inputs as parameters and `loss = sum(op * r)`;
/// the values of the parameters and the feeds of the remaining inputs (and `r`).
struct Training {
    graph: Graph,
    loss: NodeId,
    params: ParamStore,
    feeds: Vec<(String, Tensor)>,
}

fn training(case: &OpCase, rng: &mut Rng) -> Training {
    let g = &case.graph;
    let mut b = GraphBuilder::new(0);
    let mut map = Vec::with_capacity(g.len());
    let mut params = ParamStore::new();
    let mut feeds = Vec::new();
    for node in g.nodes() {
        let leaf = case.leaves.iter().find(|(l, _)| g.node(*l).name == node.name).map(|(_, v)| *v);
        let id = match (&node.op, leaf) {
            (OpKind::Input(_), Some(v)) if case.wrt.iter().any(|w| g.node(*w).name == node.name) => {
                params.insert(&node.name, value(v, &node.ty.shape, rng));
                b.parameter_with(&node.name, ParamSpec::new(&node.ty.shape, autopar_graph::Initializer::Zeros).dtype(node.ty.dtype))
                    .unwrap()
            }
            (OpKind::Input(_), v) => {
                feeds.push((node.name.clone(), value(v.unwrap_or(Values::Normal), &node.ty.shape, rng)));
                b.input(&node.name, &node.ty.shape, node.ty.dtype).unwrap()
            }
            (OpKind::Parameter(_), v) => {
                params.insert(&node.name, value(v.unwrap_or(Values::Normal), &node.ty.shape, rng));
                b.op(&node.name, node.op.clone(), &[]).unwrap()
            }
            _ => {
                let ins: Vec<NodeId> = node.inputs.iter().map(|x| map[x.0]).collect();
                b.op(&node.name, node.op.clone(), &ins).unwrap()
            }
        };
        map.push(id);
    }
    let out = map[case.output.0];
    let shape = b.graph().node(out).ty.shape.clone();
    let r = b.input("r", &shape, DType::F64).unwrap();
    feeds.push(("r".into(), value(Values::Normal, &shape, rng)));
    let weighted = b.mul("weighted", out, r).unwrap();
    let loss = b.reduce_sum("loss", weighted, &[], false).unwrap();
    Training { graph: b.finish(), loss, params, feeds }
}

fn semi_auto(n: usize) -> ParallelContext {
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    ctx.set("dataset_strategy", &json!("full_batch")).unwrap();
    ctx
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-10 + 1e-10 * b.abs()
}

#[test]
fn every_sharding_rule_gives_the_one_device_result_forward_and_backward() {
    let mut checked_kinds = BTreeSet::new();
    let mut refused_kinds = BTreeSet::new();
    // Kinds that ran split under some strategy, and kinds no strategy splits here: those run
    // whole, and those whose layout follows their input, which the catalog feeds from a
    // parameter (replicated; the model tests run them split after split ops).
    let mut split_kinds = BTreeSet::new();
    let mut unsplittable = BTreeSet::new();
    // Kinds that ran split under a random MindSpore layout.
    let mut layout_kinds = BTreeSet::new();
    for case_seed in 0..3u64 {
        for case in op_cases(DType::F64, case_seed).unwrap() {
            let node = case.graph.node(case.output);
            if node.op.is_leaf() {
                continue;
            }
            let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &case.graph.node(*x).ty).collect();
            let mut rng = Rng::new(0x5eed ^ case_seed);
            let t = training(&case, &mut rng);
            let rule = node.op.def().sharding(&RuleCx { inputs: &ins, output: &node.ty });
            if matches!(rule, ShardingRule::Replicated | ShardingRule::FollowInput) {
                unsplittable.insert(case.kind);
            }
            if let ShardingRule::Unsupported(_) = rule {
                // The planner refuses the op and names it.
                let e = Job::new(&t.graph, t.loss, &semi_auto(2)).unwrap_err();
                assert!(
                    matches!(&e, RuntimeError::Plan(p) if matches!(**p, ParallelError::UnsupportedOp { ref name, .. } if *name == node.name)),
                    "{}: {e}",
                    case.kind
                );
                refused_kinds.insert(case.kind);
                continue;
            }
            let alone = Job::new(&t.graph, t.loss, &ParallelContext::default()).unwrap();
            let want = RankTrainer::alone(&alone, ParamSource::Full(&t.params)).unwrap().gradients(&t.feeds).unwrap();
            let want_loss = want.loss;
            for n in [2usize, 4, 8] {
                // Three random strategies, then six random MindSpore layouts (the same splits on
                // named axes in a random order, several on one dimension, replica axes between).
                for s in 0..9u64 {
                    let mut g = t.graph.clone();
                    let seed = s * 31 + n as u64 + case_seed * 1000;
                    if s < 3 {
                        assign_random_strategies(&mut g, n, seed);
                    } else {
                        assign_random_layouts(&mut g, n, seed);
                    }
                    let job = Job::new(&g, t.loss, &semi_auto(n)).unwrap_or_else(|e| panic!("{} on {n} devices: {e}", case.kind));
                    let under_test = job.network().nodes.iter().find(|p| p.name == node.name).expect("the op is planned");
                    if under_test.inputs.iter().chain([&under_test.output]).any(|l| l.slice_shape() != l.shape()) {
                        split_kinds.insert(case.kind);
                    }
                    // Under a layout the op runs on the layout's device matrix, its slices most
                    // often not those its split counts alone would give.
                    let given = g.nodes().iter().find(|x| x.name == node.name).and_then(|x| x.layout.clone());
                    if let Some(layout) = given.filter(|_| s >= 3) {
                        let (mesh, _) = layout.mesh().unwrap();
                        assert_eq!(under_test.output.mesh(), &mesh, "{} under {layout}", case.kind);
                        let ShardingRule::Spec(spec) = &rule else { unreachable!("a layout is given to ops with a rule") };
                        let splits = spec.splits_from_strategy(case.kind, &node.name, &layout.strategy()).unwrap();
                        let default = spec.layouts(case.kind, &node.name, &ins, &node.ty, &splits, n).unwrap();
                        if under_test.inputs.iter().any(|l| l.slice_shape() != l.shape()) && default.inputs != under_test.inputs {
                            layout_kinds.insert(case.kind);
                        }
                    }
                    let outs = LocalComm::run(n, |comm| -> autopar_runtime::Result<(f64, ParamStore)> {
                        let mut rank = RankTrainer::new(&job, &comm, ParamSource::Full(&t.params))?;
                        let out = rank.gradients(&t.feeds)?;
                        let mut grads = ParamStore::new();
                        for (name, g) in out.grads {
                            grads.insert(&name, g);
                        }
                        Ok((out.loss, grads))
                    })
                    .unwrap_or_else(|e| panic!("{} on {n} devices (strategy seed {s}): {e}", case.kind));
                    let what =
                        |r: usize| format!("{} on {n} devices, strategy seed {s}, rank {r}\n{}", case.kind, job.network().describe());
                    for (r, (loss, _)) in outs.iter().enumerate() {
                        assert!(close(*loss, want_loss), "{}: loss {loss} vs one device {want_loss}", what(r));
                    }
                    let stores: Vec<ParamStore> = outs.into_iter().map(|(_, g)| g).collect();
                    let got = assemble_params(&job, &stores).unwrap();
                    for (name, w) in &want.grads {
                        let g = got.require(name).unwrap();
                        for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                            assert!(close(*a, b), "{}: gradient of {name}[{i}] is {a}, one device {b}", what(0));
                        }
                    }
                }
            }
            checked_kinds.insert(case.kind);
        }
    }
    // Every op kind with a sharded form ran split in some case (a check of whole ops only would
    // prove nothing of its rule).
    let never: Vec<&&str> = checked_kinds.iter().filter(|k| !split_kinds.contains(*k) && !unsplittable.contains(*k)).collect();
    assert!(never.is_empty(), "{never:?} were checked but never split; split: {split_kinds:?}");
    let no_layout: Vec<&&str> = split_kinds.iter().filter(|k| !layout_kinds.contains(*k)).collect();
    assert!(no_layout.is_empty(), "{no_layout:?} never ran split under a layout");
    // Every op kind was either checked on simulated ranks or refused by the planner.
    for kind in autopar_graph::OpKind::ALL_KINDS {
        if ["Input", "Parameter", "Fill"].contains(kind) {
            continue;
        }
        assert!(checked_kinds.contains(kind) || refused_kinds.contains(kind), "{kind} was neither checked nor refused");
    }
    for kind in [
        "MatMul",
        "BatchMatMul",
        "Add",
        "BiasAdd",
        "Conv2D",
        "BatchNorm",
        "LayerNorm",
        "RmsNorm",
        "RotaryEmbedding",
        "Attention",
        "RouterTopK",
        "Dropout",
        "Softmax",
        "Gather",
        "SoftmaxCrossEntropy",
    ] {
        assert!(checked_kinds.contains(kind), "{kind} has a sharding rule but was not checked; checked {checked_kinds:?}");
    }
}
