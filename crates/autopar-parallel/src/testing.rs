//! Helpers for tests that compare random strategies against stand-alone runs.

use autopar_graph::{Graph, NodeId, OpSpec, RuleCx, ShardingRule, TensorType};
use autopar_layout::{NamedLayout, INTERLEAVED};

/// A seeded xorshift generator.
fn generator(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Each op with a sharding rule, in order, with its rule and a random pick of its valid splits
/// on `n` devices, to `annotate`.
fn for_each_random_pick(
    graph: &mut Graph,
    n: usize,
    seed: u64,
    mut annotate: impl FnMut(&mut Graph, NodeId, &OpSpec, Vec<usize>, &mut dyn FnMut() -> u64),
) {
    let mut next = generator(seed);
    for i in 0..graph.len() {
        let id = NodeId(i);
        let node = graph.node(id).clone();
        if node.op.is_leaf() {
            continue;
        }
        let ins: Vec<&TensorType> = node.inputs.iter().map(|x| &graph.node(*x).ty).collect();
        if let ShardingRule::Spec(spec) = node.op.def().sharding(&RuleCx { inputs: &ins, output: &node.ty }) {
            let options = spec.valid_splits(n);
            let pick = options[(next() % options.len() as u64) as usize].clone();
            annotate(graph, id, &spec, pick, &mut next);
        }
    }
}

/// Annotate every op that has a sharding rule with a strategy drawn from its valid ones on `n`
/// devices (seeded).
pub fn assign_random_strategies(graph: &mut Graph, n: usize, seed: u64) {
    for_each_random_pick(graph, n, seed, |graph, id, spec, pick, _| {
        graph.node_mut(id).strategy = Some(spec.strategy_of(&pick));
        graph.node_mut(id).layout = None;
    });
}

/// Annotate every op that has a sharding rule with a random MindSpore `Layout` on `n` devices
/// (seeded): split counts drawn from the op's valid ones, each split (and the replicas) spread
/// over one or two named axes, the axes in a random order in the device matrix and within each
/// dimension, now and then an axis of size 1 or a virtual `interleaved_parallel` axis.
pub fn assign_random_layouts(graph: &mut Graph, n: usize, seed: u64) {
    for_each_random_pick(graph, n, seed, |graph, id, spec, pick, next| {
        if let Some(layout) = random_layout(spec, &pick, n, next) {
            graph.set_layout(id, layout).expect("a layout of valid splits fits its op");
        }
    });
}

/// A layout giving `splits` on `n` devices with randomly arranged named axes (None where one
/// input splits two of its dimensions along one logical dimension).
fn random_layout(spec: &OpSpec, splits: &[usize], n: usize, next: &mut dyn FnMut() -> u64) -> Option<NamedLayout> {
    let used: usize = splits.iter().product();
    // (size, owner): owner = the logical dimension it splits, None for replicas.
    let mut factors: Vec<(usize, Option<usize>)> = Vec::new();
    for (owner, s) in (0..splits.len()).map(Some).chain([None]).zip(splits.iter().copied().chain([n / used])) {
        if s == 1 {
            continue;
        }
        let p = (2..=s).find(|p| s.is_multiple_of(*p)).unwrap_or(s);
        if p < s && next().is_multiple_of(2) {
            factors.extend([(p, owner), (s / p, owner)]);
        } else {
            factors.push((s, owner));
        }
    }
    if next().is_multiple_of(4) {
        factors.push((1, None));
    }
    // A random order of the device axes.
    for k in (1..factors.len()).rev() {
        factors.swap(k, (next() % (k as u64 + 1)) as usize);
    }
    let mut alias: Vec<String> = (0..factors.len()).map(|a| format!("a{a}")).collect();
    let mut dev_matrix: Vec<usize> = factors.iter().map(|f| f.0).collect();
    let interleaved = next().is_multiple_of(4);
    if interleaved {
        dev_matrix.push(2);
        alias.push(INTERLEAVED.to_string());
    }
    // Each logical dimension's axes, in a random order; the virtual axis on one of them.
    let mut axes: Vec<Vec<String>> = vec![Vec::new(); splits.len()];
    for (a, (_, owner)) in factors.iter().enumerate() {
        if let Some(l) = owner {
            if next().is_multiple_of(2) {
                axes[*l].push(alias[a].clone());
            } else {
                axes[*l].insert(0, alias[a].clone());
            }
        }
    }
    if interleaved {
        if let Some(l) = (0..splits.len()).find(|&l| !axes[l].is_empty()) {
            axes[l].push(INTERLEAVED.to_string());
        }
    }
    let inputs = spec.inputs.iter().map(|dims| dims.iter().map(|l| l.map(|l| axes[l].clone()).unwrap_or_default()).collect()).collect();
    NamedLayout::new(dev_matrix, alias, inputs).ok()
}
