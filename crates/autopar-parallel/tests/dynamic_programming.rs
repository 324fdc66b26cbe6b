//! dynamic_programming reproduces MindSpore's choices: the strategies MindSpore's own unit
//! tests assert for its dynamic_programming search (`tests/ut/python/parallel/`, from the
//! versions where it was auto_parallel's default: `fully_use_devices` on, the rest of the
//! cost model at its defaults, every network input split by the dataset's batch), on
//! networks of network inputs only; and MindSpore's cost model's own rules (data parallelism
//! on a perceptron, where a device profile's seconds split the wide layers; one layout for a
//! shared parameter; casts of a precision policy priced as MindSpore prices none).

use autopar_graph::{DType, Graph, GraphBuilder, NodeId};
use autopar_parallel::{plan_network, DeviceProfile, ParallelContext, PlanRequest};
use serde_json::json;

fn context(devices: usize, full_batch: bool) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("full_batch", &json!(full_batch)).unwrap();
    c.set("device_num", &json!(devices)).unwrap();
    c.set("parallel_mode", &json!("auto_parallel")).unwrap();
    c.set("search_mode", &json!("dynamic_programming")).unwrap();
    c.set("fully_use_devices", &json!(true)).unwrap();
    c
}

/// Each op's strategy by name, as `((a, b), (c, d))`.
fn strategies(g: &Graph, loss: Option<NodeId>, devices: usize, full_batch: bool, profile: Option<&DeviceProfile>) -> Vec<(String, String)> {
    let ctx = context(devices, full_batch);
    let p = plan_network(&PlanRequest { graph: g, loss, context: &ctx, strategy_file: None, profile }).unwrap();
    p.nodes.iter().filter_map(|n| n.strategy.as_ref().map(|s| (n.name.clone(), s.to_string()))).collect()
}

fn check(g: &Graph, loss: Option<NodeId>, devices: usize, full_batch: bool, want: &[(&str, &str)]) {
    let got = strategies(g, loss, devices, full_batch, None);
    for (name, strategy) in want {
        let found = got.iter().find(|(n, _)| n == name).map(|(_, s)| s.as_str());
        assert_eq!(found, Some(*strategy), "{name}: all chosen {got:?}");
    }
}

/// Two MatMuls of network inputs on 16 devices, then two transposes
/// (`test_auto_parallel_two_matmul.py`, `test_auto_parallel_transpose.py`).
#[test]
fn two_matmuls_and_transposes_as_mindspores_tests_assert() {
    let mut g = GraphBuilder::new(0);
    let x = g.input("x", &[128, 32], DType::F32).unwrap();
    let y = g.input("y", &[32, 64], DType::F32).unwrap();
    let b = g.input("b", &[64, 64], DType::F32).unwrap();
    let m1 = g.matmul("matmul1", x, y).unwrap();
    let m2 = g.matmul("matmul2", m1, b).unwrap();
    let t1 = g.transpose("transpose1", m2, &[1, 0]).unwrap();
    let t2 = g.transpose("transpose2", t1, &[1, 0]).unwrap();
    let loss = g.reduce_mean("loss", t2, &[], false).unwrap();
    g.output(loss).unwrap();
    let g = g.finish();
    check(
        &g,
        Some(loss),
        16,
        false,
        &[("matmul1", "((16, 1), (1, 1))"), ("matmul2", "((16, 1), (1, 1))"), ("transpose1", "((16, 1))"), ("transpose2", "((1, 16))")],
    );
}

/// Three MatMuls, the last of the other two's outputs cast to half precision
/// (`test_auto_parallel_cast.py::test_double_star_graph`).
#[test]
fn a_double_star_as_mindspores_test_asserts() {
    let mut g = GraphBuilder::new(0);
    let x = g.input("x", &[32, 8], DType::F32).unwrap();
    let y = g.input("y", &[8, 16], DType::F32).unwrap();
    let z = g.input("z", &[8, 16], DType::F32).unwrap();
    let w = g.input("w", &[16, 32], DType::F32).unwrap();
    let m1 = g.matmul("matmul1", x, y).unwrap();
    let m2 = g.matmul("matmul2", z, w).unwrap();
    let cast =
        |g: &mut GraphBuilder, name: &str, v| g.op(name, autopar_graph::ops::Cast { dtype: DType::F16, inserted: false }, &[v]).unwrap();
    let c2 = cast(&mut g, "cast2", m2);
    let c1 = cast(&mut g, "cast1", m1);
    let m3 = g.matmul("matmul3", c2, c1).unwrap();
    g.output(m3).unwrap();
    let g = g.finish();
    check(&g, None, 8, true, &[("matmul1", "((1, 1), (1, 8))"), ("matmul2", "((1, 1), (1, 1))"), ("matmul3", "((1, 1), (1, 8))")]);
}

/// A multi-layer perceptron with parameters `[in, out]` as MindSpore's `MatMul` reads them:
/// MindSpore's dynamic_programming picks pure data parallelism on every layer (the gradients'
/// all-reduce weighs `γ = 0.001` of a redistribution); the seconds of the built-in device
/// profile split the wide layers' weights instead.
#[test]
fn a_perceptron_is_data_parallel_under_mindspores_costs_and_not_in_seconds() {
    let widths = [784, 2048, 2048, 10];
    let mut g = GraphBuilder::new(0);
    let mut h = g.input("x", &[256, widths[0]], DType::F32).unwrap();
    for i in 0..3 {
        let w = g.parameter(&format!("l{i}.w"), &[widths[i], widths[i + 1]], autopar_graph::Initializer::Zeros).unwrap();
        let b = g.parameter(&format!("l{i}.b"), &[widths[i + 1]], autopar_graph::Initializer::Zeros).unwrap();
        let m = g.matmul(&format!("l{i}.matmul"), h, w).unwrap();
        h = g.add(&format!("l{i}.add"), m, b).unwrap();
        if i < 2 {
            h = g.relu(&format!("l{i}.relu"), h).unwrap();
        }
    }
    let loss = g.reduce_mean("loss", h, &[], false).unwrap();
    g.output(loss).unwrap();
    let g = g.finish();
    for devices in [8, 16] {
        let dp = format!("(({devices}, 1), (1, 1))");
        let want: Vec<(String, &str)> = (0..3).map(|i| (format!("l{i}.matmul"), dp.as_str())).collect();
        let want: Vec<(&str, &str)> = want.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        check(&g, Some(loss), devices, false, &want);
        let seconds = strategies(&g, Some(loss), devices, false, Some(&DeviceProfile::builtin()));
        assert!(seconds.iter().any(|(n, s)| n.ends_with("matmul") && *s != dp), "{devices} devices: {seconds:?}");
    }
}

/// A weight two MatMuls read, one of them transposed: MindSpore's cost model gives it one
/// layout for both (its shared-parameter node allows no redistribution between them), so two
/// `.shard()` strategies that split it differently leave no plan, where the seconds model
/// redistributes it.
#[test]
fn a_shared_parameter_keeps_one_layout() {
    let build = |shard: bool| {
        let mut g = GraphBuilder::new(0);
        let x = g.input("x", &[8, 1024], DType::F32).unwrap();
        let y = g.input("y", &[8, 1024], DType::F32).unwrap();
        let w = g.parameter("w", &[1024, 1024], autopar_graph::Initializer::Zeros).unwrap();
        let m1 = g.matmul("matmul1", x, w).unwrap();
        let m2 = g.matmul_t("matmul2", y, w, false, true).unwrap();
        if shard {
            // w split by columns for the first, by rows for the second.
            g.shard(m1, "((1,1),(1,8))".parse().unwrap()).unwrap();
            g.shard(m2, "((1,1),(8,1))".parse().unwrap()).unwrap();
        }
        let s = g.add("sum", m1, m2).unwrap();
        let loss = g.reduce_mean("loss", s, &[], false).unwrap();
        g.output(loss).unwrap();
        (g.finish(), loss)
    };
    let ctx = context(8, true);
    let (g, loss) = build(false);
    let p = plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &ctx, strategy_file: None, profile: None }).unwrap();
    let of = |name: &str| p.nodes.iter().find(|n| n.name == name).unwrap().strategy.clone().unwrap().0[1].clone();
    assert_eq!(of("matmul1"), of("matmul2"), "the weight's splits differ between its users");
    let (g, loss) = build(true);
    let e = plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &ctx, strategy_file: None, profile: None })
        .unwrap_err()
        .to_string();
    assert!(e.contains("dynamic_programming found no plan") && e.contains("shared parameter"), "{e}");
    // Whatever the weights: with computation free, slicing the weight costs nothing, and it
    // still moves data.
    let mut free = context(8, true);
    free.set("costmodel_alpha", &json!(0.0)).unwrap();
    let e = plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &free, strategy_file: None, profile: None })
        .unwrap_err()
        .to_string();
    assert!(e.contains("dynamic_programming found no plan"), "{e}");
    let profile = DeviceProfile::builtin();
    plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &ctx, strategy_file: None, profile: Some(&profile) }).unwrap();
}

/// A precision policy's casts of the weights (here to the weights' own float32, so that only
/// the casts differ) are no reshapes and pass the weights' gradients through: every layer takes
/// the strategy it takes without them, on small and large batches.
#[test]
fn casts_of_a_precision_policy_change_no_choice() {
    let widths = [784, 2048, 2048, 10];
    let mut model_parallel = 0;
    for batch in [8, 32, 256] {
        let choices = |cast: bool| -> Vec<String> {
            let mut g = GraphBuilder::new(0);
            let mut h = g.input("x", &[batch, widths[0]], DType::F32).unwrap();
            for i in 0..3 {
                let mut w = g.parameter(&format!("l{i}.w"), &[widths[i], widths[i + 1]], autopar_graph::Initializer::Zeros).unwrap();
                if cast {
                    w = g.op(&format!("l{i}.cast"), autopar_graph::ops::Cast { dtype: DType::F32, inserted: true }, &[w]).unwrap();
                }
                h = g.matmul(&format!("l{i}.matmul"), h, w).unwrap();
            }
            let loss = g.reduce_mean("loss", h, &[], false).unwrap();
            g.output(loss).unwrap();
            strategies(&g.finish(), Some(loss), 8, false, None).into_iter().filter(|(n, _)| n.ends_with("matmul")).map(|(_, s)| s).collect()
        };
        let plain = choices(false);
        model_parallel += usize::from(plain.iter().any(|s| !s.starts_with("((8, 1)")));
        assert_eq!(choices(true), plain, "batch {batch}");
    }
    assert!(model_parallel > 0, "every batch is data parallel: the casts' prices are not exercised");
}
