//! Ops whose local result depends on where the slice sits in the whole tensor: a BatchNorm with
//! a split batch, a Softmax with a split axis and a LayerNorm with split normalised dimensions
//! reduce their statistics over the ranks that split them, a Dropout draws its block of the
//! whole mask, a Gather from a split table looks up its own rows (a partial sum).

use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId, OpKind, ParamSpec};
use autopar_layout::Strategy;
use autopar_parallel::{plan, rank_program, ParallelContext, RankProgram};
use serde_json::json;

fn programs(g: &Graph, n: usize) -> Vec<RankProgram> {
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    ctx.set("dataset_strategy", &json!("full_batch")).unwrap();
    let p = plan(g, &ctx).unwrap();
    (0..n).map(|r| rank_program(&p, r).unwrap()).collect()
}

fn shard(g: &mut Graph, id: NodeId, s: Vec<Vec<usize>>) {
    g.node_mut(id).strategy = Some(Strategy(s));
}

fn only<'a>(prog: &'a RankProgram, kind: &str) -> &'a OpKind {
    let mut found = prog.graph.nodes().iter().filter(|n| n.op.kind() == kind);
    let node = found.next().unwrap_or_else(|| panic!("no {kind} in rank {}'s program", prog.rank));
    assert!(found.next().is_none(), "one {kind}");
    &node.op
}

#[test]
fn a_batch_norm_with_a_split_batch_synchronises_over_the_ranks_that_split_it() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[8, 4, 2, 2], DType::F32).unwrap();
    let gamma = b.parameter("bn.gamma", &[4], Initializer::Ones).unwrap();
    let beta = b.parameter("bn.beta", &[4], Initializer::Zeros).unwrap();
    let mean = b.parameter_with("bn.moving_mean", ParamSpec::new(&[4], Initializer::Zeros).frozen()).unwrap();
    let var = b.parameter_with("bn.moving_variance", ParamSpec::new(&[4], Initializer::Ones).frozen()).unwrap();
    let y = b.batch_norm("bn", [x, gamma, beta, mean, var], true, 1e-5, 0.9).unwrap();
    b.output(y).unwrap();
    let mut g = b.finish();
    // Batch split 4 ways on 8 devices: device matrix [4, 2], the batch on the left axis.
    shard(&mut g, y, vec![vec![4, 1, 1, 1], vec![1], vec![1], vec![1], vec![1]]);
    let progs = programs(&g, 8);
    for prog in &progs {
        let OpKind::BatchNorm(bn) = only(prog, "BatchNorm") else { unreachable!() };
        let want: Vec<usize> = (0..8).filter(|r| r % 2 == prog.rank % 2).collect();
        assert_eq!(bn.group, want, "rank {}", prog.rank);
        assert!(prog.partitions.contains(&vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]));
    }
    // Split on channels only: no synchronisation.
    shard(&mut g, y, vec![vec![1, 4, 1, 1], vec![4], vec![4], vec![4], vec![4]]);
    let OpKind::BatchNorm(bn) = only(&programs(&g, 4)[1], "BatchNorm").clone() else { unreachable!() };
    assert!(bn.group.is_empty());
}

#[test]
fn a_split_dropout_draws_its_block_of_the_whole_mask() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[4, 6], DType::F32).unwrap();
    let y = b.dropout("drop", x, 0.5, 3).unwrap();
    b.output(y).unwrap();
    let mut g = b.finish();
    shard(&mut g, y, vec![vec![2, 2]]);
    for prog in programs(&g, 4) {
        let OpKind::Dropout(d) = only(&prog, "Dropout") else { unreachable!() };
        let block = d.block.as_ref().expect("a split dropout has a block");
        assert_eq!(block.global_shape, vec![4, 6]);
        assert_eq!(block.begin, vec![2 * (prog.rank / 2), 3 * (prog.rank % 2)], "rank {}", prog.rank);
    }
}

#[test]
fn a_gather_from_a_split_table_looks_up_its_own_rows() {
    let mut b = GraphBuilder::new(0);
    let table = b.parameter("embedding", &[8, 4], Initializer::Normal { mean: 0.0, std: 1.0 }).unwrap();
    let idx = b.input("ids", &[2, 3], DType::I64).unwrap();
    let y = b.gather("lookup", table, idx, 0).unwrap();
    b.output(y).unwrap();
    let mut g = b.finish();
    shard(&mut g, y, vec![vec![2, 1], vec![1, 1]]);
    let progs = programs(&g, 4);
    for prog in &progs {
        let OpKind::Gather(gather) = only(prog, "Gather") else { unreachable!() };
        let shard = gather.shard.expect("a split table");
        // Device matrix [2, 2]: the vocabulary on the left axis.
        assert_eq!((shard.start, shard.total), (4 * (prog.rank / 2), 8), "rank {}", prog.rank);
        // The partial lookups are summed before the output.
        assert!(prog.graph.nodes().iter().any(|n| n.op.kind() == "AllReduce"), "rank {}", prog.rank);
        assert_eq!(prog.param("embedding").unwrap().slice[0], shard.start..shard.start + 4);
    }
}

#[test]
fn softmax_and_layer_norm_split_on_their_normalised_axes_synchronise_over_them() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[4, 8], DType::F32).unwrap();
    let gamma = b.parameter("ln.gamma", &[8], Initializer::Ones).unwrap();
    let beta = b.parameter("ln.beta", &[8], Initializer::Zeros).unwrap();
    let h = b.layer_norm("ln", x, gamma, beta, -1, 1e-5).unwrap();
    let y = b.softmax("sm", h, -1).unwrap();
    b.output(y).unwrap();
    let mut g = b.finish();
    // 8 devices: LayerNorm (2, 4) -> device matrix [2, 4], the normalised axis on the right;
    // Softmax (1, 8) -> [8].
    shard(&mut g, h, vec![vec![2, 4], vec![4], vec![4]]);
    shard(&mut g, y, vec![vec![1, 8]]);
    for prog in programs(&g, 8) {
        let OpKind::LayerNorm(ln) = only(&prog, "LayerNorm") else { unreachable!() };
        let row = prog.rank / 4;
        assert_eq!(ln.group, (4 * row..4 * row + 4).collect::<Vec<_>>(), "rank {}", prog.rank);
        let OpKind::Softmax(sm) = only(&prog, "Softmax") else { unreachable!() };
        assert_eq!(sm.group, (0..8).collect::<Vec<_>>());
    }
}
