//! Every op's sharding rule, checked against the one-device result on simulated ranks: for each
//! op of the catalog (one small random-shaped graph per op kind), random valid strategies on 2, 4
//! and 8 devices must give every rank the op's full output, equal to a one-device run.

use autopar_comm::{Communicator, LocalComm};
use autopar_data::Rng;
use autopar_graph::catalog::{op_cases, Values};
use autopar_graph::{DType, NodeId};
use autopar_parallel::{assign_random_strategies, op_rule, plan, rank_program, OpRule, ParallelContext};
use autopar_runtime::collective::CommGroups;
use autopar_runtime::parallel::slice_tensor;
use autopar_runtime::{Executor, ParamStore};
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

#[test]
fn every_sharding_rule_gives_the_one_device_result() {
    let mut checked_kinds = std::collections::BTreeSet::new();
    for case_seed in 0..3u64 {
        for case in op_cases(DType::F64, case_seed).unwrap() {
            let node = case.graph.node(case.output);
            let ins: Vec<_> = node.inputs.iter().map(|x| &case.graph.node(*x).ty).collect();
            if matches!(op_rule(node, &ins), OpRule::Unsupported(_)) || node.op.is_leaf() {
                continue;
            }
            let mut rng = Rng::new(0x5eed ^ case_seed);
            let feeds: Vec<(String, Tensor)> = case
                .leaves
                .iter()
                .filter(|(id, _)| matches!(case.graph.node(*id).op, autopar_graph::OpKind::Input(_)))
                .map(|(id, v)| (case.graph.node(*id).name.clone(), value(*v, &case.graph.node(*id).ty.shape, &mut rng)))
                .collect();
            let mut graph = case.graph.clone();
            graph.outputs = vec![case.output];
            let mut params = ParamStore::init(&graph).unwrap();
            let serial_feeds: Vec<(NodeId, Tensor)> = feeds.iter().map(|(n, t)| (graph.find(n).unwrap(), t.clone())).collect();
            let want = Executor::new(graph.clone(), &[case.output]).unwrap().run(&mut params, &serial_feeds, 0).unwrap().values.remove(0);
            for n in [2usize, 4, 8] {
                for s in 0..3u64 {
                    let mut g = graph.clone();
                    assign_random_strategies(&mut g, n, s * 31 + n as u64 + case_seed * 1000);
                    let mut ctx = ParallelContext::default();
                    ctx.set("device_num", &json!(n)).unwrap();
                    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
                    ctx.set("dataset_strategy", &json!("full_batch")).unwrap();
                    let p = plan(&g, &ctx).unwrap_or_else(|e| panic!("{} on {n} devices: {e}", case.kind));
                    let full = ParamStore::init(&g).unwrap();
                    let outs = LocalComm::run(n, |comm| -> autopar_runtime::Result<Tensor> {
                        let prog = rank_program(&g, &p, comm.rank())
                            .map_err(|e| autopar_runtime::RuntimeError::Parallel { message: e.to_string() })?;
                        let groups = CommGroups::create(&comm, &prog.partitions)?;
                        let mut local = ParamStore::new();
                        for slot in &prog.params {
                            local.insert(&slot.name, slice_tensor(full.require(&slot.name)?, &slot.slice)?);
                        }
                        let local_feeds: Vec<(NodeId, Tensor)> = prog
                            .inputs
                            .iter()
                            .map(|slot| {
                                let t = &feeds.iter().find(|(name, _)| *name == slot.name).expect("every input is fed").1;
                                Ok((slot.local, slice_tensor(t, &slot.slice)?))
                            })
                            .collect::<autopar_runtime::Result<_>>()?;
                        let exec = Executor::new(prog.graph.clone(), &prog.outputs)?;
                        Ok(exec.run_with(&mut local, &local_feeds, 0, Some(&groups))?.values.remove(0))
                    })
                    .unwrap_or_else(|e| panic!("{} on {n} devices (strategy seed {s}): {e}", case.kind));
                    for (r, got) in outs.iter().enumerate() {
                        assert_eq!(got.shape(), want.shape(), "{} rank {r}", case.kind);
                        for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                            assert!(
                                (a - b).abs() <= 1e-10 + 1e-10 * b.abs(),
                                "{} on {n} devices, rank {r}: element {i} is {a}, one device {b}\n{}",
                                case.kind,
                                p.describe()
                            );
                        }
                    }
                }
            }
            checked_kinds.insert(case.kind);
        }
    }
    // Every forward op kind with a rule was exercised.
    for kind in [
        "MatMul",
        "BatchMatMul",
        "Add",
        "BiasAdd",
        "Conv2D",
        "BatchNorm",
        "LayerNorm",
        "Dropout",
        "Softmax",
        "Gather",
        "SoftmaxCrossEntropy",
        "ReduceMean",
        "Transpose",
        "Reshape",
    ] {
        assert!(checked_kinds.contains(kind), "{kind} was not checked; checked {checked_kinds:?}");
    }
}
