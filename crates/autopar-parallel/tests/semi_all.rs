//! The fixture network of `fixtures/mindspore` planned with the `semi_all` strategies
//! yields MindSpore's parameter layouts and communication.

use std::collections::BTreeMap;
use std::path::PathBuf;

use autopar_graph::{DType, Graph, GraphBuilder, Initializer, OpKind};
use autopar_layout::{ParameterLayout, Strategy};
use autopar_parallel::{plan, rank_program, ParallelContext};
use serde_json::json;

fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

fn s(t: &str) -> Strategy {
    t.parse().unwrap()
}

/// x [256, 64] -> l1 (MatMul + Add + ReLU) -> l2 -> head MatMul -> ReduceMean, as
/// `generate_strategies.py` builds it, with the `semi_all` strategies.
fn fixture_network(shard: bool) -> Graph {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[256, 64], DType::F32).unwrap();
    let mut h = x;
    for (name, din, dout, mm, add, relu) in
        [("l1", 64, 128, "((2,1),(1,4))", "((2,4),(4,))", "((2,4),)"), ("l2", 128, 32, "((2,4),(4,1))", "((2,1),(1,))", "((2,1),)")]
    {
        let w = b.parameter(&format!("{name}.w"), &[din, dout], Initializer::Constant(0.01)).unwrap();
        let bias = b.parameter(&format!("{name}.b"), &[dout], Initializer::Zeros).unwrap();
        let m = b.matmul(&format!("{name}.mm"), h, w).unwrap();
        let a = b.add(&format!("{name}.add"), m, bias).unwrap();
        let r = b.relu(&format!("{name}.relu"), a).unwrap();
        if shard {
            b.shard(m, s(mm)).unwrap();
            b.shard(a, s(add)).unwrap();
            b.shard(r, s(relu)).unwrap();
        }
        h = r;
    }
    let head = b.parameter("head.w", &[32, 16], Initializer::Constant(0.01)).unwrap();
    let m = b.matmul("head.mm", h, head).unwrap();
    if shard {
        b.shard(m, s("((8,1),(1,1))")).unwrap();
    }
    let loss = b.reduce_mean("loss", m, &[], false).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

fn semi_auto(n: usize) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    c
}

#[test]
fn semi_all_parameter_layouts_match_mindspore() {
    let text = std::fs::read_to_string(fixtures().join("strategies/semi_all/layout_rank0.txt")).unwrap();
    let want: BTreeMap<String, ParameterLayout> = text.lines().map(|l| ParameterLayout::parse_line(l).unwrap()).collect();
    let g = fixture_network(true);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let mut checked = 0;
    for node in &p.nodes {
        let Some(w) = want.get(&node.name) else { continue };
        assert_eq!(node.output.mesh().dims(), w.dev_matrix.as_slice(), "{}", node.name);
        assert_eq!(node.output.tensor_map().flattened(), w.tensor_map, "{}", node.name);
        assert_eq!(node.output.slice_shape(), w.slice_shape, "{}", node.name);
        checked += 1;
    }
    assert_eq!(checked, want.len(), "every fixture entry (x and the five parameters) is planned");
}

#[test]
fn semi_all_rank_program_has_mindspores_communication() {
    let g = fixture_network(true);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let prog = rank_program(&p, 0).unwrap();
    let comm: Vec<(String, Vec<usize>)> = prog
        .graph
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            OpKind::AllGather(c) => Some(("AllGather".to_string(), c.group.clone())),
            OpKind::AllReduce(c) => Some(("AllReduce".to_string(), c.group.clone())),
            OpKind::ReduceScatter(c) => Some(("ReduceScatter".to_string(), c.group.clone())),
            OpKind::AllToAll(c) => Some(("AllToAll".to_string(), c.group.clone())),
            _ => None,
        })
        .collect();
    // The input [8],[0,-1] feeding l1 ((2,1),(1,4)): AllGather over ranks 0-3 (MindSpore's IR).
    assert_eq!(comm[0], ("AllGather".to_string(), vec![0, 1, 2, 3]));
    // l2's contracted dimension split 4 ways: AllReduce over ranks 0-3 before its Add.
    assert!(comm.contains(&("AllReduce".to_string(), vec![0, 1, 2, 3])), "{comm:?}");
    // The head's (8,1) input comes from a (2,1) layout: a local slice, no communication.
    let slices = prog.graph.nodes().iter().filter(|n| n.name.starts_with("head.mm.in0.redist") && matches!(n.op, OpKind::Slice(_))).count();
    assert_eq!(slices, 1);
    // Mirror groups: l1.w [2,4] [-1,0] is replicated over ranks {0,4}; head.w over all 8.
    assert_eq!(prog.param("l1.w").unwrap().mirror, vec![0, 4]);
    assert_eq!(prog.param("head.w").unwrap().mirror, (0..8).collect::<Vec<_>>());
    // The loss ends replicated on every rank.
    assert_eq!(prog.graph.node(prog.outputs[0]).ty.shape, Vec::<usize>::new());
}

#[test]
fn every_rank_program_builds_and_uses_the_same_partitions() {
    let g = fixture_network(true);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let first = rank_program(&p, 0).unwrap();
    for r in 1..8 {
        let prog = rank_program(&p, r).unwrap();
        assert_eq!(prog.partitions, first.partitions, "rank {r}");
        assert_eq!(prog.graph.len(), first.graph.len(), "rank {r}");
    }
}

#[test]
fn unannotated_ops_default_to_data_parallel() {
    let g = fixture_network(false);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let l1w = p.nodes.iter().find(|n| n.name == "l1.w").unwrap();
    assert!(l1w.output.split_axes().is_empty(), "weights are replicated under data parallel: {}", l1w.output);
    let mm = p.nodes.iter().find(|n| n.name == "l1.mm").unwrap();
    assert_eq!(mm.strategy.as_ref().unwrap(), &s("((8,1),(1,1))"));
}

#[test]
fn strategy_errors_name_the_op() {
    let mut g = fixture_network(false);
    let mm = g.find("l2.mm").unwrap();
    g.node_mut(mm).strategy = Some(s("((2,4),(2,1))"));
    let e = plan(&g, &semi_auto(8)).unwrap_err().to_string();
    assert!(e.contains("MatMul") && e.contains("l2.mm") && e.contains("must match"), "{e}");
    g.node_mut(mm).strategy = Some(s("((3,1),(1,1))"));
    let e = plan(&g, &semi_auto(8)).unwrap_err().to_string();
    assert!(e.contains("does not divide"), "{e}");
}

#[test]
fn parameter_layout_dict_prints_mindspores_lines() {
    let text = std::fs::read_to_string(fixtures().join("strategies/semi_all/layout_rank0.txt")).unwrap();
    let g = fixture_network(true);
    let p = plan(&g, &semi_auto(8)).unwrap();
    let ours: Vec<String> =
        autopar_parallel::parameter_layout_dict(&p, 0, &|_| Vec::new()).iter().map(|(n, l)| format!("{n}: {l}")).collect();
    let theirs: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(ours, theirs);
}
