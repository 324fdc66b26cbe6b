//! Every op kind's backward rule, through the graph: build the op's one-op graph from the
//! catalog, append `loss = sum(op(...) * r)` for a fixed random `r`, differentiate, execute, and
//! compare each gradient with central finite differences in f64.

use autopar_graph::catalog::{op_cases, OpCase, Values};
use autopar_graph::{differentiate, DType, GraphBuilder, NodeId, OpKind, Rng};
use autopar_runtime::{Executor, ParamStore};
use autopar_tensor::Tensor;

fn leaf_value(rng: &mut Rng, shape: &[usize], v: Values) -> Tensor {
    let n: usize = shape.iter().product();
    match v {
        Values::Normal => Tensor::from_vec(shape, (0..n).map(|_| rng.normal()).collect::<Vec<f64>>()).unwrap(),
        Values::Positive => Tensor::from_vec(shape, (0..n).map(|_| 0.5 + 1.5 * rng.uniform()).collect::<Vec<f64>>()).unwrap(),
        Values::Index(b) => Tensor::from_vec(shape, (0..n).map(|_| (rng.next_u64() % b as u64) as i64).collect::<Vec<i64>>()).unwrap(),
    }
}

struct Setup {
    feeds: Vec<(NodeId, Tensor)>,
    params: ParamStore,
}

impl Setup {
    fn new(case: &OpCase, rng: &mut Rng) -> Self {
        let mut params = ParamStore::init(&case.graph).unwrap();
        let mut feeds = Vec::new();
        for &(id, v) in &case.leaves {
            let node = case.graph.node(id);
            let t = leaf_value(rng, &node.ty.shape, v);
            match node.op {
                OpKind::Parameter(_) => {
                    params.insert(&node.name, t);
                }
                _ => feeds.push((id, t)),
            }
        }
        Self { feeds, params }
    }

    fn get(&self, case: &OpCase, id: NodeId) -> Tensor {
        let node = case.graph.node(id);
        match self.feeds.iter().find(|(f, _)| *f == id) {
            Some((_, t)) => t.clone(),
            None => self.params.get(&node.name).unwrap().clone(),
        }
    }

    fn set(&mut self, case: &OpCase, id: NodeId, t: Tensor) {
        if let Some(slot) = self.feeds.iter_mut().find(|(f, _)| *f == id) {
            slot.1 = t;
        } else {
            self.params.insert(&case.graph.node(id).name, t);
        }
    }
}

fn check_case(case: &OpCase, seed: u64) -> usize {
    let mut checked = 0;
    let mut rng = Rng::new(seed.wrapping_mul(7919) ^ case.kind.len() as u64);
    let out_shape = case.graph.node(case.output).ty.shape.clone();
    let mut b = GraphBuilder::from_graph(case.graph.clone(), seed);
    let r = b.input("r", &out_shape, DType::F64).unwrap();
    let prod = b.mul("weighted", case.output, r).unwrap();
    let loss = b.reduce_sum("loss", prod, &[], false).unwrap();
    let mut graph = b.finish();
    let grads = differentiate(&mut graph, loss, &case.wrt).unwrap_or_else(|e| panic!("{}: {e}", case.kind));
    let mut setup = Setup::new(case, &mut rng);
    setup.feeds.push((r, leaf_value(&mut rng, &out_shape, Values::Normal)));
    let mut fetch = vec![loss];
    fetch.extend(grads.grads.iter().map(|g| g.1));
    let exec = Executor::new(graph.clone(), &fetch).unwrap();
    let fwd = Executor::new(graph, &[loss]).unwrap();
    let out = exec.run(&mut setup.params.clone(), &setup.feeds, 0).unwrap_or_else(|e| panic!("{}: {e}", case.kind));
    let h = 1e-6;
    for (k, &leaf) in case.wrt.iter().enumerate() {
        let analytic = out.values[k + 1].to_f64_vec();
        let base = setup.get(case, leaf);
        let shape = base.shape().to_vec();
        let values = base.to_f64_vec();
        assert_eq!(analytic.len(), values.len(), "{}: gradient size", case.kind);
        // Check up to 24 elements spread over the tensor.
        let stride = (values.len() / 24).max(1);
        for j in (0..values.len()).step_by(stride) {
            let mut eval = |delta: f64| {
                let mut v = values.clone();
                v[j] += delta;
                setup.set(case, leaf, Tensor::from_vec(&shape, v).unwrap());
                fwd.run(&mut setup.params.clone(), &setup.feeds, 0).unwrap().values[0].item().unwrap()
            };
            let numeric = (eval(h) - eval(-h)) / (2.0 * h);
            setup.set(case, leaf, base.clone());
            let a = analytic[j];
            assert!(
                (a - numeric).abs() <= 1e-5 + 1e-4 * numeric.abs(),
                "{} (seed {seed}): d loss / d {}[{j}]: backward rule gives {a}, finite differences {numeric}",
                case.kind,
                case.graph.node(leaf).name
            );
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_op_backward_matches_central_finite_differences() {
    for seed in 0..3 {
        let cases = op_cases(DType::F64, seed).unwrap();
        assert_eq!(cases.len(), OpKind::ALL_KINDS.len());
        let mut checked_kinds = 0;
        for case in &cases {
            if check_case(case, seed) > 0 {
                checked_kinds += 1;
            }
        }
        // Every kind with a differentiable float input was compared element by element.
        let expected = cases.iter().filter(|c| !c.wrt.is_empty()).count();
        assert_eq!(checked_kinds, expected);
        assert!(expected >= 50, "only {expected} op kinds have gradient checks");
    }
}

#[test]
fn grad_ops_that_are_linear_in_dy_differentiate_again() {
    // Second order through the *Grad ops the catalog marks differentiable (conv adjoints,
    // AvgPoolGrad, GatherGrad, ReluGrad, GeluGrad in dy) is covered above; here the cases whose
    // rule is undefined say so by name instead of building a wrong graph.
    let cases = op_cases(DType::F64, 1).unwrap();
    let case = cases.iter().find(|c| c.kind == "MaxPoolGrad").unwrap();
    let mut g = case.graph.clone();
    let dy = case.leaves[1].0;
    let err = differentiate(&mut g, case.output, &[dy]).unwrap_err();
    assert!(err.to_string().contains("MaxPoolGrad op"), "{err}");
}

#[test]
fn a_small_conv_net_gradient_matches_finite_differences_end_to_end() {
    use autopar_graph::{ConvAttrs, Initializer, ParamSpec, PoolAttrs};
    let mut b = GraphBuilder::new(5);
    let p = |b: &mut GraphBuilder, name: &str, shape: &[usize], init: Initializer| {
        b.parameter_with(name, ParamSpec::new(shape, init).dtype(DType::F64)).unwrap()
    };
    let x = b.input("x", &[2, 2, 6, 6], DType::F64).unwrap();
    let labels = b.input("labels", &[2], DType::I64).unwrap();
    let w = p(&mut b, "conv.weight", &[4, 2, 3, 3], Initializer::HeNormal);
    let gamma = p(&mut b, "bn.gamma", &[4], Initializer::Uniform { low: 0.5, high: 1.5 });
    let beta = p(&mut b, "bn.beta", &[4], Initializer::Normal { mean: 0.0, std: 0.1 });
    let mean = b.parameter_with("bn.moving_mean", ParamSpec::new(&[4], Initializer::Zeros).dtype(DType::F64).frozen()).unwrap();
    let var = b.parameter_with("bn.moving_variance", ParamSpec::new(&[4], Initializer::Ones).dtype(DType::F64).frozen()).unwrap();
    let h = b.conv2d("conv", x, w, ConvAttrs::new(1, 1)).unwrap();
    let h = b.batch_norm("bn", [h, gamma, beta, mean, var], true, 1e-5, 0.9).unwrap();
    let h = b.relu("relu", h).unwrap();
    let h = b.max_pool("pool", h, PoolAttrs::new(2, 2)).unwrap();
    let h = b.global_avg_pool("gap", h).unwrap();
    let fw = p(&mut b, "fc.weight", &[3, 4], Initializer::XavierUniform { gain: 1.0 });
    let fb = p(&mut b, "fc.bias", &[3], Initializer::Normal { mean: 0.0, std: 0.1 });
    let z = b.matmul_t("fc", h, fw, false, true).unwrap();
    let z = b.bias_add("fc.bias_add", z, fb).unwrap();
    let loss = b.softmax_cross_entropy("loss", z, labels).unwrap();
    let mut graph = b.finish();
    let grads = autopar_graph::backward(&mut graph, loss).unwrap();
    assert_eq!(grads.grads.len(), 5, "moving statistics are not trained");

    let mut rng = Rng::new(3);
    let feeds = vec![(x, leaf_value(&mut rng, &[2, 2, 6, 6], Values::Normal)), (labels, leaf_value(&mut rng, &[2], Values::Index(3)))];
    let params = ParamStore::init(&graph).unwrap();
    let mut fetch = vec![loss];
    fetch.extend(grads.grads.iter().map(|g| g.1));
    let out = Executor::new(graph.clone(), &fetch).unwrap().run(&mut params.clone(), &feeds, 0).unwrap();
    let fwd = Executor::new(graph.clone(), &[loss]).unwrap();
    let h = 1e-6;
    for (k, &(leaf, _)) in grads.grads.iter().enumerate() {
        let name = graph.node(leaf).name.clone();
        let base = params.get(&name).unwrap().clone();
        let values = base.to_f64_vec();
        let analytic = out.values[k + 1].to_f64_vec();
        for j in (0..values.len()).step_by((values.len() / 6).max(1)) {
            let eval = |delta: f64| {
                let mut v = values.clone();
                v[j] += delta;
                let mut ps = params.clone();
                ps.insert(&name, Tensor::from_vec(base.shape(), v).unwrap());
                fwd.run(&mut ps, &feeds, 0).unwrap().values[0].item().unwrap()
            };
            let numeric = (eval(h) - eval(-h)) / (2.0 * h);
            assert!((analytic[j] - numeric).abs() <= 1e-6 + 1e-4 * numeric.abs(), "{name}[{j}]: {} vs {numeric}", analytic[j]);
        }
    }
}

/// On one device a loss of several elements trains their sum, and a graph may hold
/// collectives of one rank (the identity): both give the gradients of the scalar sum.
#[test]
fn one_device_trains_the_sum_of_a_non_scalar_loss_and_runs_one_rank_collectives() {
    use autopar_graph::{Initializer, ReduceOp};
    use autopar_parallel::ParallelContext;
    use autopar_runtime::{Job, ParamSource, RankTrainer};
    let build = |scalar: bool| {
        let mut b = GraphBuilder::new(5);
        let x = b.input("x", &[4, 3], DType::F32).unwrap();
        let w = b.parameter("w", &[3, 2], Initializer::Uniform { low: -1.0, high: 1.0 }).unwrap();
        let y = b.matmul("mm", x, w).unwrap();
        let sq = b.mul("sq", y, y).unwrap();
        let per_row = b.reduce_sum("per_row", sq, &[1], false).unwrap();
        let loss = if scalar {
            let summed = b.all_reduce("one_rank", per_row, ReduceOp::Sum, &[0]).unwrap();
            b.reduce_sum("loss", summed, &[], false).unwrap()
        } else {
            per_row
        };
        (b.finish(), loss)
    };
    let x = Tensor::from_vec(&[4, 3], (0..12).map(|i| i as f32 / 6.0 - 1.0).collect::<Vec<f32>>()).unwrap();
    let mut out = Vec::new();
    for scalar in [false, true] {
        let (g, loss) = build(scalar);
        let job = Job::new(&g, loss, &ParallelContext::default()).unwrap();
        let mut step = RankTrainer::alone(&job, ParamSource::Full(&ParamStore::init(&g).unwrap())).unwrap();
        let o = step.gradients(&[("x".to_string(), x.clone())]).unwrap();
        out.push((o.loss, o.grads[0].1.to_f64_vec()));
    }
    let (a, b) = (&out[0], &out[1]);
    assert!((a.0 - b.0).abs() < 1e-5 * b.0.abs().max(1.0), "{} vs {}", a.0, b.0);
    for (p, q) in a.1.iter().zip(&b.1) {
        assert!((p - q).abs() < 1e-5 * q.abs().max(1.0), "{a:?} vs {b:?}");
    }
    // A collective naming a rank one device does not have is refused when planned.
    let mut b = GraphBuilder::new(5);
    let x = b.input("x", &[4, 3], DType::F32).unwrap();
    let w = b.parameter("w", &[3, 2], Initializer::Uniform { low: -1.0, high: 1.0 }).unwrap();
    let y = b.matmul("mm", x, w).unwrap();
    let y = b.all_reduce("two_ranks", y, ReduceOp::Sum, &[0, 1]).unwrap();
    let loss = b.reduce_sum("loss", y, &[], false).unwrap();
    let Err(e) = Job::new(&b.finish(), loss, &ParallelContext::default()) else {
        panic!("an all-reduce over ranks 0 and 1 planned on one device")
    };
    let e = e.to_string();
    assert!(e.contains("AllReduce \"two_ranks\" cannot be planned"), "{e}");
}
