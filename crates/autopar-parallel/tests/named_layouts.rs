//! MindSpore `Layout`s as op strategies: their device matrix and named axes reach the plan, the
//! parameter layouts and the strategy file as MindSpore writes them.

use std::path::PathBuf;

use autopar_checkpoint::StrategyFile;
use autopar_graph::{DType, Graph, GraphBuilder, Initializer};
use autopar_layout::NamedLayout;
use autopar_parallel::strategy_files::strategy_file;
use autopar_parallel::{plan, rank_program, ParallelContext};
use serde_json::json;

fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

fn semi_auto(n: usize) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    c.set("full_batch", &json!(true)).unwrap();
    c
}

/// `generate_layout.py`'s network: x [32, 64] times w [64, 128], the MatMul sharded by `layout`.
fn network(layout: &str) -> Graph {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[32, 64], DType::F32).unwrap();
    let w = b.parameter("w", &[64, 128], Initializer::Constant(1.0)).unwrap();
    let m = b.matmul("mm", x, w).unwrap();
    b.shard_layout(m, layout.parse::<NamedLayout>().unwrap()).unwrap();
    let loss = b.reduce_mean("loss", m, &[], false).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

const FIXTURE: &str = r#"Layout((2, 2, 2), ("dp", "sp", "mp"))(("dp", "None"), ("None", ("mp", "sp")))"#;

#[test]
fn a_layout_with_two_axes_on_one_dimension_is_mindspores_parameter_layout() {
    let g = network(FIXTURE);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let mine = strategy_file(&p, false, &|_| Vec::new());
    let theirs = StrategyFile::load(fixtures().join("strategies/layout/strategy_rank0.ckpt")).unwrap();
    let item = |f: &StrategyFile| f.layout_items.iter().find(|l| l.name == "w").map(|l| (l.dev_matrix.clone(), l.tensor_map.clone()));
    assert_eq!(item(&mine), item(&theirs));
    assert_eq!(item(&mine), Some((vec![2, 2, 2], vec![vec![-1], vec![0, 1]])));
    // The columns of w: rank r holds block mp * 2 + sp, mp the most significant.
    let w = p.nodes.iter().find(|n| n.name == "w").unwrap();
    for r in 0..8 {
        let (sp, mp) = ((r / 2) % 2, r % 2);
        assert_eq!(w.output.slice_of(r).unwrap()[1], (mp * 2 + sp) * 32..(mp * 2 + sp + 1) * 32, "rank {r}");
    }
    // The strategy the layout is, as MindSpore reports one.
    let mm = p.nodes.iter().find(|n| n.name == "mm").unwrap();
    assert_eq!(mm.strategy.as_ref().unwrap().to_string(), "((2, 1), (1, 4))");
}

#[test]
fn a_contraction_split_along_a_named_axis_leaves_a_partial_sum_on_that_axis() {
    // (dp, sp) x (sp, mp): the product is a pending sum over sp, axis 1 of [2, 2, 2].
    let g = network(r#"Layout((2, 2, 2), ("dp", "sp", "mp"))(("dp", "sp"), ("sp", "mp"))"#);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let mm = p.nodes.iter().find(|n| n.name == "mm").unwrap();
    assert_eq!(mm.output.mesh().dims(), &[2, 2, 2]);
    assert_eq!(mm.output.dim_axes(), &[vec![0], vec![2]]);
    assert_eq!(mm.output.partial_axes(), &[1]);
    // Replicas on an axis no dimension names: mp's axis of x.
    let x_in = &mm.inputs[0];
    assert_eq!(x_in.replica_axes(), vec![2]);
    rank_program(&p, 0).unwrap();
}

#[test]
fn layouts_that_do_not_fit_say_why() {
    let ctx = semi_auto(8);
    for (layout, want) in [
        // The contracted dimension split along different axes by the two inputs.
        (r#"Layout((2, 2, 2), ("dp", "sp", "mp"))(("dp", "sp"), ("mp", "None"))"#, "along axes [\"mp\"] but another input"),
        // A device matrix of 4 devices on 8.
        (r#"Layout((2, 2), ("dp", "mp"))(("dp", "None"), ("None", "mp"))"#, "spans 4 devices and the op runs on 8"),
    ] {
        let e = plan(&network(layout), &ctx).unwrap_err().to_string();
        assert!(e.contains(want), "{layout}: {e}");
        assert!(e.contains("mm"), "{e}");
    }
    // Split counts that do not divide a dimension are refused when the layout is set.
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[6, 64], DType::F32).unwrap();
    let w = b.parameter("w", &[64, 128], Initializer::Zeros).unwrap();
    let m = b.matmul("mm", x, w).unwrap();
    let e = b.shard_layout(m, r#"Layout((4, 2), ("dp", "mp"))(("dp", "None"), ("None", "mp"))"#.parse().unwrap()).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("layout Layout((4, 2)") && e.contains("does not fit") && e.contains("(size 6) 4 ways"), "{e}");
}

#[test]
fn a_strategy_file_leaves_a_layout_op_to_the_network_as_mindspore_writes_it() {
    let g = network(FIXTURE);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let mine = strategy_file(&p, false, &|_| Vec::new());
    let theirs = StrategyFile::load(fixtures().join("strategies/layout/strategy_rank0.ckpt")).unwrap();
    let item = |f: &StrategyFile| f.strategy_items.iter().find(|s| s.node_name == "MatMul_w").map(|s| s.parallel_strategy.clone());
    assert_eq!(item(&mine), item(&theirs));
    assert_eq!(item(&mine), Some(vec![]));
    // Read back (MindSpore's file, then the same layout without a strategy on the network):
    // the file's empty item keeps the network's layout; without one the op takes the default.
    let mut ctx = semi_auto(8);
    let path = fixtures().join("strategies/layout/strategy_rank0.ckpt");
    ctx.set("strategy_ckpt_config", &json!({"load_file": path.display().to_string()})).unwrap();
    let request = |g: &Graph| {
        let items = autopar_parallel::strategy_files::load_plan_strategies(&ctx).unwrap();
        autopar_parallel::plan_network(&autopar_parallel::PlanRequest {
            graph: g,
            loss: None,
            context: &ctx,
            strategy_file: items.as_ref(),
            profile: None,
        })
        .unwrap()
    };
    let w = |p: &autopar_parallel::ParallelPlan| p.nodes.iter().find(|n| n.name == "w").unwrap().output.clone();
    assert_eq!(w(&request(&g)), w(&p));
    let mut bare = g.clone();
    let mm = bare.nodes().iter().position(|n| n.name == "mm").unwrap();
    bare.node_mut(autopar_graph::NodeId(mm)).layout = None;
    bare.node_mut(autopar_graph::NodeId(mm)).strategy = None;
    assert_ne!(w(&request(&bare)), w(&p));
}

/// sharding_propagation with a Layout op: the op keeps the user's layout (on its own device
/// matrix, where the search prices it), its neighbour is propagated from it among plain split
/// strategies, and a redistribution sits between them exactly where the slices differ (the
/// layout's columns are ordered (mp, sp) across the ranks, which no plain strategy on the
/// standard device matrix reproduces).
#[test]
fn sharding_propagation_plans_a_layout_ops_neighbour_with_the_redistribution_it_needs() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[32, 64], DType::F32).unwrap();
    let w = b.parameter("w", &[64, 128], Initializer::Constant(1.0)).unwrap();
    let m = b.matmul("mm", x, w).unwrap();
    b.shard_layout(m, FIXTURE.parse::<NamedLayout>().unwrap()).unwrap();
    let r = b.relu("act", m).unwrap();
    let loss = b.reduce_mean("loss", r, &[], false).unwrap();
    b.output(loss).unwrap();
    let g = b.finish();
    let mut ctx = semi_auto(8);
    ctx.set("parallel_mode", &json!("auto_parallel")).unwrap();
    ctx.set("search_mode", &json!("sharding_propagation")).unwrap();
    let p = plan(&g, &ctx).unwrap();
    let node = |name: &str| p.nodes.iter().find(|n| n.name == name).unwrap();
    let (mm, act) = (node("mm"), node("act"));
    assert_eq!(mm.strategy.as_ref().unwrap().to_string(), "((2, 1), (1, 4))");
    assert_eq!(mm.output.mesh().dims(), &[2, 2, 2], "the layout's own device matrix");
    assert_eq!(act.source, Some(autopar_parallel::StrategySource::Propagated));
    let id = g.find("act").unwrap();
    let moved = p.redistribution(autopar_parallel::Site::Input { consumer: id, slot: 0 }).is_some();
    let differ = (0..8).any(|r| act.inputs[0].slice_of(r).unwrap() != mm.output.slice_of(r).unwrap());
    assert!(differ, "no plain strategy holds the layout's column order");
    assert_eq!(moved, differ, "a redistribution where the slices differ");
    for r in 0..8 {
        rank_program(&p, r).unwrap();
    }
}
