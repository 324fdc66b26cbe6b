//! Reverse-mode automatic differentiation: a forward graph becomes a forward+backward graph.
//!
//! [`differentiate`] appends, in reverse topological order, the nodes of every op's backward
//! rule ([`crate::ops::OpDef::grad`]) to the same graph, summing the contributions of a value
//! used several times. Only values that both depend on a requested leaf and feed the loss get
//! gradients, so no backward work is built for data inputs or integer labels. Gradient nodes
//! are named `grad/<forward op>/<kind><k>` and inherit the forward node's pipeline stage, so the
//! planner can place the backward pass next to its forward pass.
//!
//! A rule reads the forward values of a node marked for recomputation
//! ([`crate::Recompute::Marked`]) from a copy of the node ([`crate::Recompute::Replay`], named
//! `recompute/<forward op>`) added, with copies of its marked inputs, just before the first
//! backward node that reads it: the graph's order is the order of execution, so the forward
//! value dies after its forward users and the copy is computed when the backward pass gets
//! there.

use crate::error::{GraphError, Result};
use crate::graph::Graph;
use crate::graph::Recompute;
use crate::ops::*;
use crate::types::{NodeId, TensorType};

/// The result of [`differentiate`]: the loss and, for each requested leaf, its gradient node.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients {
    /// The loss node that was differentiated.
    pub loss: NodeId,
    /// `(leaf, gradient)` in the order requested.
    pub grads: Vec<(NodeId, NodeId)>,
}

impl Gradients {
    /// The gradient node of `leaf`, if it was requested.
    pub fn of(&self, leaf: NodeId) -> Option<NodeId> {
        self.grads.iter().find(|(l, _)| *l == leaf).map(|(_, g)| *g)
    }
}

/// Appends to `graph` the gradient of the sum of `loss`'s elements with respect to each node of
/// `wrt` (parameters or inputs). A leaf the loss does not depend on gets a zero gradient.
pub fn differentiate(graph: &mut Graph, loss: NodeId, wrt: &[NodeId]) -> Result<Gradients> {
    differentiate_with(graph, loss, wrt, &mut |_, _, g| Ok(g))
}

/// [`differentiate`], each requested gradient passed through `finish` as soon as it is whole
/// (called with the graph, the position in `wrt` and the gradient node): the nodes `finish`
/// adds run right there in the backward pass, and the node it returns is the gradient given
/// back (e.g. the rank's shard of a gradient reduce-scattered as the pass forms it).
pub fn differentiate_with(
    graph: &mut Graph,
    loss: NodeId,
    wrt: &[NodeId],
    finish: &mut dyn FnMut(&mut Graph, usize, NodeId) -> Result<NodeId>,
) -> Result<Gradients> {
    graph.check_id(loss)?;
    for &w in wrt {
        graph.check_id(w)?;
        let node = graph.node(w);
        if !node.ty.dtype.is_float() {
            return Err(GraphError::NonFloatGradient { kind: node.op.kind(), name: node.name.clone(), dtype: node.ty.dtype });
        }
    }
    let n = loss.0 + 1;
    // Values depending on a requested leaf.
    let mut from_wrt = vec![false; n];
    for i in 0..n {
        let node = &graph.nodes()[i];
        from_wrt[i] = wrt.contains(&NodeId(i)) || node.inputs.iter().any(|x| x.0 < n && from_wrt[x.0]);
    }
    // Values feeding the loss.
    let mut to_loss = vec![false; n];
    to_loss[loss.0] = true;
    for i in (0..n).rev() {
        if to_loss[i] {
            for x in graph.nodes()[i].inputs.clone() {
                to_loss[x.0] = true;
            }
        }
    }
    let needs: Vec<bool> = (0..n).map(|i| from_wrt[i] && to_loss[i] && graph.nodes()[i].ty.dtype.is_float()).collect();

    // Marked values the backward pass reads as they are: the loss and the graph's outputs.
    let mut kept = vec![false; n];
    kept[loss.0] = true;
    for o in graph.outputs.iter().filter(|o| o.0 < n) {
        kept[o.0] = true;
    }
    let mut replays: Vec<Option<NodeId>> = vec![None; n];

    let mut contributions: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    let mut grad_of: Vec<Option<NodeId>> = vec![None; n];
    let mut finished: Vec<Option<NodeId>> = vec![None; n];
    if needs[loss.0] {
        let ty = graph.node(loss).ty.clone();
        let name = graph.unique_name(&format!("grad/{}/seed", graph.node(loss).name));
        let stage = graph.node(loss).pipeline_stage;
        let seed = graph.add(&name, Fill { shape: ty.shape, dtype: ty.dtype, value: 1.0 }, &[])?;
        graph.node_mut(seed).pipeline_stage = stage;
        contributions[loss.0].push(seed);
    }
    for i in (0..n).rev() {
        if !needs[i] || contributions[i].is_empty() {
            continue;
        }
        let id = NodeId(i);
        let stage = graph.node(id).pipeline_stage;
        let parts = std::mem::take(&mut contributions[i]);
        let mut dy = parts[0];
        for (k, &p) in parts[1..].iter().enumerate() {
            let name = graph.unique_name(&format!("grad/{}/acc{k}", graph.node(id).name));
            dy = graph.add(&name, Add, &[dy, p])?;
            graph.node_mut(dy).pipeline_stage = stage;
        }
        grad_of[i] = Some(dy);
        if let Some(k) = wrt.iter().position(|&w| w == id) {
            finished[i] = Some(finish(graph, k, dy)?);
        }
        let op = graph.node(id).op.clone();
        if op.is_leaf() {
            continue;
        }
        let input_needs: Vec<bool> = graph.node(id).inputs.iter().map(|x| needs[x.0]).collect();
        let inputs = graph.node(id).inputs.clone();
        // The values the rule reads: recomputed copies of marked ones.
        let node = replayed(graph, &kept, &mut replays, id)?;
        let read = inputs.iter().map(|&x| replayed(graph, &kept, &mut replays, x)).collect::<Result<Vec<_>>>()?;
        let name = graph.node(id).name.clone();
        let mut view = RuleView { graph, node, inputs: read, name };
        let mut cx = GradCx::new(&mut view, node, dy, input_needs);
        op.def().grad(&mut cx)?;
        let grads = cx.into_grads();
        for (x, g) in inputs.into_iter().zip(grads) {
            if let Some(g) = g {
                contributions[x.0].push(g);
            }
        }
    }
    let mut grads = Vec::with_capacity(wrt.len());
    for (k, &w) in wrt.iter().enumerate() {
        let g = match finished.get(w.0).copied().flatten() {
            Some(g) => g,
            None => {
                let ty = graph.node(w).ty.clone();
                let name = graph.unique_name(&format!("grad/{}/zeros", graph.node(w).name));
                let zeros = graph.add(&name, Fill { shape: ty.shape, dtype: ty.dtype, value: 0.0 }, &[])?;
                finish(graph, k, zeros)?
            }
        };
        grads.push((w, g));
    }
    Ok(Gradients { loss, grads })
}

/// The value of forward node `v` the backward pass reads: `v` itself, or for a node marked for
/// recomputation (not `kept`), its copy, added (once, with copies of its marked inputs) now.
fn replayed(graph: &mut Graph, kept: &[bool], replays: &mut [Option<NodeId>], v: NodeId) -> Result<NodeId> {
    let recomputed = |g: &Graph, u: NodeId| u.0 < kept.len() && !kept[u.0] && g.node(u).recompute == Recompute::Marked;
    if !recomputed(graph, v) {
        return Ok(v);
    }
    // Depth first without recursion: a chain of marked ops may be as long as the network.
    let mut stack = vec![v];
    while let Some(&u) = stack.last() {
        if replays[u.0].is_some() {
            stack.pop();
            continue;
        }
        let pending: Vec<NodeId> =
            graph.node(u).inputs.iter().copied().filter(|&x| recomputed(graph, x) && replays[x.0].is_none()).collect();
        if !pending.is_empty() {
            stack.extend(pending);
            continue;
        }
        let node = graph.node(u);
        let inputs: Vec<NodeId> = node.inputs.iter().map(|&x| replays[x.0].filter(|_| recomputed(graph, x)).unwrap_or(x)).collect();
        let (op, stage, name) = (node.op.clone(), node.pipeline_stage, format!("recompute/{}", node.name));
        let name = graph.unique_name(&name);
        let id = graph.add(&name, op, &inputs)?;
        let copy = graph.node_mut(id);
        copy.pipeline_stage = stage;
        copy.recompute = Recompute::Replay;
        replays[u.0] = Some(id);
        stack.pop();
    }
    Ok(replays[v.0].expect("replayed above"))
}

/// The graph as the backward rule of one forward node sees it: the node (the forward node or
/// its recomputed copy) reads `inputs` (recomputed copies of marked ones) and is named as the
/// forward node, so that gradient nodes are `grad/<forward op>/...` either way.
struct RuleView<'g> {
    graph: &'g mut Graph,
    node: NodeId,
    inputs: Vec<NodeId>,
    name: String,
}

impl GradGraph for RuleView<'_> {
    fn inputs_of(&self, id: NodeId) -> &[NodeId] {
        if id == self.node {
            &self.inputs
        } else {
            self.graph.inputs_of(id)
        }
    }
    fn type_of(&self, id: NodeId) -> &TensorType {
        self.graph.type_of(id)
    }
    fn name_of(&self, id: NodeId) -> &str {
        if id == self.node {
            &self.name
        } else {
            self.graph.name_of(id)
        }
    }
    fn kind_of(&self, id: NodeId) -> &'static str {
        self.graph.kind_of(id)
    }
    fn stage_of(&self, id: NodeId) -> Option<usize> {
        self.graph.stage_of(id)
    }
    fn add_node(&mut self, base: &str, op: OpKind, inputs: &[NodeId], stage: Option<usize>) -> Result<NodeId> {
        self.graph.add_node(base, op, inputs, stage)
    }
}

/// Differentiates `loss` with respect to every trainable parameter of `graph`.
pub fn backward(graph: &mut Graph, loss: NodeId) -> Result<Gradients> {
    let params = graph.trainable_parameters();
    differentiate(graph, loss, &params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Recompute;
    use crate::{DType, GraphBuilder, Initializer};

    #[test]
    fn a_value_used_twice_gets_the_sum_of_both_contributions() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[3], DType::F32).unwrap();
        let y = b.mul("square", x, x).unwrap();
        let mut g = b.finish();
        assert_eq!(g.users()[x.0], vec![y, y]);
        let grads = differentiate(&mut g, y, &[x]).unwrap();
        let dx = grads.of(x).unwrap();
        assert!(matches!(g.node(dx).op, OpKind::Add(_)), "{g}");
        assert_eq!(g.node(dx).name, "grad/x/acc0");
    }

    /// A two-layer block `blk.` whose output feeds the loss: marking the block marks its
    /// inner ops, not its output; the backward pass reads recomputed copies of them, added after
    /// the forward pass, and the forward values are read by forward users only.
    #[test]
    fn a_recomputed_block_is_read_by_the_backward_pass_through_copies_made_after_the_forward_pass() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 3], DType::F32).unwrap();
        let w1 = b.parameter("blk.w1", &[3, 5], Initializer::HeUniform).unwrap();
        let w2 = b.parameter("blk.w2", &[5, 2], Initializer::HeUniform).unwrap();
        let h = b.matmul("blk.mm1", x, w1).unwrap();
        let r = b.relu("blk.relu", h).unwrap();
        let y = b.matmul("blk.mm2", r, w2).unwrap();
        let loss = b.reduce_mean("loss", y, &[0, 1], false).unwrap();
        b.output(loss).unwrap();
        assert_eq!(b.recompute_block("blk.").unwrap(), 2, "mm1 and relu; mm2 is the block's output");
        let mut g = b.finish();
        assert_eq!(g.node(y).recompute, Recompute::Keep);
        let forward = g.len();
        let mut plain = g.clone();
        backward(&mut g, loss).unwrap();
        let copies: Vec<&str> = g.nodes()[forward..].iter().filter(|n| n.recompute == Recompute::Replay).map(|n| n.name.as_str()).collect();
        assert_eq!(copies, ["recompute/blk.mm1", "recompute/blk.relu"]);
        // mm2's weight gradient reads relu's copy; relu's forward value only its forward user.
        let users = g.users();
        assert_eq!(users[r.0], vec![y]);
        assert!(users[h.0].iter().all(|u| *u == r), "{:?}", users[h.0]);
        let relu_copy = g.find("recompute/blk.relu").unwrap();
        assert!(users[relu_copy.0].iter().any(|u| g.node(*u).name.starts_with("grad/blk.mm2/")), "{g}");
        // Without the marks: no copies, and the backward pass reads relu's forward value.
        plain.apply_recompute(&crate::RecomputeChoice::Nothing).unwrap();
        backward(&mut plain, loss).unwrap();
        assert!(plain.nodes().iter().all(|n| n.recompute == Recompute::Keep));
        assert!(plain.users()[r.0].iter().any(|u| plain.node(*u).name.starts_with("grad/blk.mm2/")));
    }

    #[test]
    fn unconnected_leaves_get_zeros_and_integer_inputs_get_nothing() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 3], DType::F32).unwrap();
        let labels = b.input("labels", &[4], DType::I32).unwrap();
        let w = b.parameter("w", &[3, 5], Initializer::Zeros).unwrap();
        let unused = b.parameter("unused", &[2], Initializer::Zeros).unwrap();
        let z = b.matmul("mm", x, w).unwrap();
        let loss = b.softmax_cross_entropy("loss", z, labels).unwrap();
        let mut g = b.finish();
        let before = g.len();
        let grads = backward(&mut g, loss).unwrap();
        assert_eq!(grads.grads.len(), 2);
        let dunused = grads.of(unused).unwrap();
        assert!(matches!(&g.node(dunused).op, OpKind::Fill(f) if f.value == 0.0 && f.shape == vec![2]));
        // No gradient of x was built: only w needs one through the MatMul.
        let built: Vec<&str> = g.nodes()[before..].iter().map(|n| n.name.as_str()).collect();
        assert!(built.iter().all(|n| !n.starts_with("grad/x")), "{built:?}");
        assert_eq!(g.node(grads.of(w).unwrap()).ty.shape, vec![3, 5]);
        let err = differentiate(&mut g, loss, &[labels]).unwrap_err();
        assert!(matches!(err, GraphError::NonFloatGradient { .. }), "{err}");
    }

    #[test]
    fn gradient_nodes_inherit_the_pipeline_stage_of_their_forward_op() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2, 2], DType::F32).unwrap();
        b.set_pipeline_stage(Some(0));
        let h = b.tanh("h", x).unwrap();
        b.set_pipeline_stage(Some(1));
        let y = b.reduce_sum("y", h, &[], false).unwrap();
        let mut g = b.finish();
        differentiate(&mut g, y, &[x]).unwrap();
        for n in g.nodes().iter().filter(|n| n.name.starts_with("grad/h/")) {
            assert_eq!(n.pipeline_stage, Some(0), "{}", n.name);
        }
        for n in g.nodes().iter().filter(|n| n.name.starts_with("grad/y/")) {
            assert_eq!(n.pipeline_stage, Some(1), "{}", n.name);
        }
    }

    #[test]
    fn collectives_differentiate_into_their_adjoints() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 6], DType::F32).unwrap();
        let ag = b.all_gather("ag", x, 0, &[0, 1]).unwrap();
        let rs = b.reduce_scatter("rs", ag, crate::ReduceOp::Sum, 1, &[0, 1, 2]).unwrap();
        let a2a = b.all_to_all("a2a", rs, 0, 1, &[0, 1]).unwrap();
        let mut g = b.finish();
        differentiate(&mut g, a2a, &[x]).unwrap();
        let kinds: Vec<String> = g.nodes().iter().filter(|n| n.name.starts_with("grad/")).map(|n| format!("{}", n.op)).collect();
        assert!(kinds.iter().any(|k| k.starts_with("AllToAll { split_dim: 1, concat_dim: 0")), "{kinds:?}");
        assert!(kinds.iter().any(|k| k.starts_with("AllGather { dim: 1, group: [0, 1, 2]")), "{kinds:?}");
        assert!(kinds.iter().any(|k| k.starts_with("ReduceScatter { op: Sum, dim: 0, group: [0, 1]")), "{kinds:?}");
    }

    #[test]
    fn a_max_all_reduce_has_no_gradient_and_says_so() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4], DType::F32).unwrap();
        let y = b.all_reduce("sync_max", x, crate::ReduceOp::Max, &[0, 1]).unwrap();
        let mut g = b.finish();
        let err = differentiate(&mut g, y, &[x]).unwrap_err();
        assert!(err.to_string().starts_with("AllReduce sync_max: no backward rule gives the gradient of input 0"), "{err}");
    }

    #[test]
    fn the_printed_graph_shows_ops_types_and_annotations() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let w = b.parameter("w", &[8, 2], Initializer::Zeros).unwrap();
        let y = b.matmul("mm", x, w).unwrap();
        b.shard(y, autopar_layout::Strategy::new(vec![vec![2, 1], vec![1, 1]])).unwrap();
        b.stage(y, 0).unwrap();
        b.output(y).unwrap();
        let text = b.finish().to_string();
        assert!(
            text.contains("%2 = MatMul { transpose_a: false, transpose_b: false } mm(%0, %1): f32[4, 2] shard ((2, 1), (1, 1)) stage 0"),
            "{text}"
        );
        assert!(text.ends_with("outputs: %2\n"), "{text}");
    }

    #[test]
    fn validate_recomputes_types_after_a_rewrite_and_catches_order_errors() {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let y = b.reshape("r", x, &[8, 4]).unwrap();
        let mut g = b.finish();
        if let OpKind::Reshape(r) = &mut g.node_mut(y).op {
            r.shape = vec![2, 16];
        }
        g.validate().unwrap();
        assert_eq!(g.node(y).ty.shape, vec![2, 16]);
        g.node_mut(x).inputs = vec![y];
        let err = g.validate().unwrap_err();
        assert!(matches!(err, GraphError::Arity { .. } | GraphError::NotTopological { .. }), "{err}");
    }
}
