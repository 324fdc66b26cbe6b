//! Random valid strategies always give consistent plans and rank programs.

use autopar_graph::{DType, Graph, GraphBuilder, Initializer};
use autopar_parallel::{assign_random_strategies, plan, rank_program, ParallelContext};
use proptest::prelude::*;
use serde_json::json;

/// A small MLP with bias adds, a transpose-b layer, layer norm, softmax cross-entropy.
fn network(batch: usize) -> Graph {
    let mut b = GraphBuilder::new(1);
    let x = b.input("x", &[batch, 16], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[32, 16], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[32], Initializer::Zeros).unwrap();
    let h = b.matmul_t("fc1.mm", x, w1, false, true).unwrap();
    let h = b.add("fc1.add", h, b1).unwrap();
    let h = b.gelu("act", h).unwrap();
    let g = b.parameter("ln.gamma", &[32], Initializer::Ones).unwrap();
    let be = b.parameter("ln.beta", &[32], Initializer::Zeros).unwrap();
    let h = b.layer_norm("ln", h, g, be, -1, 1e-5).unwrap();
    let w2 = b.parameter("fc2.weight", &[32, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc2.mm", h, w2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_strategies_give_consistent_rank_programs(seed in any::<u64>(), log_n in 0u32..4) {
        let n = 1usize << log_n;
        let mut g = network(16);
        assign_random_strategies(&mut g, n, seed);
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(n)).unwrap();
        ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
        let p = plan(&g, &ctx).unwrap();
        let programs: Vec<_> = (0..n).map(|r| rank_program(&p, r).unwrap()).collect();
        for prog in &programs {
            prop_assert_eq!(&prog.partitions, &programs[0].partitions);
            prop_assert_eq!(prog.outputs.len(), 1);
            prop_assert!(prog.graph.node(prog.outputs[0]).ty.shape.is_empty());
            prop_assert_eq!(prog.params.len(), 5);
        }
        // Every parameter's distinct slices over the ranks tile it exactly: disjoint, and
        // together as many elements as the whole (one device: one slice, the whole).
        for (k, slot) in programs[0].params.iter().enumerate() {
            let mut pieces: Vec<Vec<std::ops::Range<usize>>> = programs.iter().map(|pr| pr.params[k].slice.clone()).collect();
            pieces.sort_by_key(|s| s.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>());
            pieces.dedup();
            let numel = |s: &[std::ops::Range<usize>]| s.iter().map(|r| r.len()).product::<usize>();
            prop_assert_eq!(pieces.iter().map(|s| numel(s)).sum::<usize>(), slot.layout.shape().iter().product::<usize>(), "{}", slot.name);
            for (i, a) in pieces.iter().enumerate() {
                for b in &pieces[i + 1..] {
                    prop_assert!(a.iter().zip(b).any(|(x, y)| x.end <= y.start || y.end <= x.start), "{}: {:?} and {:?} overlap", slot.name, a, b);
                }
            }
        }
    }
}

/// A training job gathers only its loss: the logits, a second output, stay split (the step
/// never fetches them), while a forward-only plan gathers every output whole.
#[test]
fn a_training_plan_gathers_only_the_loss() {
    use autopar_parallel::{plan_network, PlanRequest, Site};
    let mut g = network(16);
    let logits = g.find("fc2.mm").unwrap();
    g.outputs.push(logits);
    let loss = g.find("loss").unwrap();
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(4)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    let training = plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &ctx, strategy_file: None, profile: None }).unwrap();
    let forward = plan_network(&PlanRequest { graph: &g, loss: None, context: &ctx, strategy_file: None, profile: None }).unwrap();
    // The logits are split by batch under the default strategies.
    assert!(forward.redistribution(Site::Output { slot: 1 }).is_some());
    assert!(training.redistribution(Site::Output { slot: 0 }).is_some());
    assert!(training.redistribution(Site::Output { slot: 1 }).is_none());
    let prog = rank_program(&training, 1).unwrap();
    assert_eq!(prog.graph.node(prog.outputs[1]).ty.shape, vec![4, 8]);
    assert!(prog.graph.node(prog.outputs[0]).ty.shape.is_empty());
}
