//! Helpers for tests that compare random strategies against stand-alone runs.

use autopar_graph::{Graph, NodeId, RuleCx, ShardingRule, TensorType};

/// Annotate every op that has a sharding rule with a strategy drawn from its valid ones on `n`
/// devices (seeded).
pub fn assign_random_strategies(graph: &mut Graph, n: usize, seed: u64) {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..graph.len() {
        let id = NodeId(i);
        let node = graph.node(id).clone();
        if node.op.is_leaf() {
            continue;
        }
        let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &graph.node(*x).ty).collect();
        if let ShardingRule::Spec(spec) = node.op.def().sharding(&RuleCx { inputs: &ins, output: &node.ty }) {
            let options = spec.valid_splits(n);
            let pick = &options[(next() % options.len() as u64) as usize];
            graph.node_mut(id).strategy = Some(spec.strategy_of(pick));
        }
    }
}
