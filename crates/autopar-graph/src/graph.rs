//! The IR: a list of nodes in topological order, each one op with one output.

use std::collections::HashMap;
use std::fmt;

use autopar_layout::{NamedLayout, Strategy};

use crate::error::{GraphError, Result};
use crate::ops::{GradGraph, InferCx, OpKind, Parameter};
use crate::types::{NodeId, TensorType};

/// One op application. Its output is identified by the node's id.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique name: a parameter's dotted name (`l1.w`) or an op's name (`l1.matmul`).
    pub name: String,
    /// The op and its attributes.
    pub op: OpKind,
    /// The nodes whose outputs are the op's inputs, in the op's input order.
    pub inputs: Vec<NodeId>,
    /// Inferred output type.
    pub ty: TensorType,
    /// The user's `.shard(strategy)` annotation, if any.
    pub strategy: Option<Strategy>,
    /// The user's `.shard(layouts)` annotation, if any (MindSpore's `Layout`): which named
    /// device axes split each input dimension. `strategy` then holds its split counts.
    pub layout: Option<NamedLayout>,
    /// The pipeline stage the user put this op in, if any.
    pub pipeline_stage: Option<usize>,
    /// Whether the backward pass reads this value as the forward pass left it or recomputes it.
    pub recompute: Recompute,
}

/// What a job recomputes in its backward pass (the `recompute` option).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RecomputeChoice {
    /// What the network marked itself ([`Graph::recompute`], [`Graph::recompute_block`]).
    #[default]
    AsBuilt,
    /// Nothing: the network's own marks are dropped.
    Nothing,
    /// Every block of the network ([`Graph::blocks`]), each as a cell.
    Blocks,
    /// Ops by name, and cells by the prefix of their ops' names ending in `.` (`blocks.1.`).
    Named(Vec<String>),
}

/// Whether the backward pass reads a node's value as the forward pass left it or recomputes it
/// (MindSpore's `Primitive.recompute()`, PyTorch's activation checkpointing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Recompute {
    /// The value is kept while the backward pass needs it (the default).
    #[default]
    Keep,
    /// The forward value is not kept for the backward pass: every backward reader reads a copy
    /// recomputed from the node's inputs (marked inputs recomputed in turn) just before it runs.
    Marked,
    /// That copy: a marked node's op run again in the backward pass. Its side effects (a batch
    /// norm's running statistics) are not repeated; its random masks are the same.
    Replay,
}

impl Node {
    /// The bytes a run allocates for this node's value: its type's size, nothing for a
    /// parameter (whose value is the stored tensor, shared).
    pub fn value_bytes(&self) -> usize {
        match self.op {
            OpKind::Parameter(_) => 0,
            _ => self.ty.numel() * self.ty.dtype.size(),
        }
    }

    /// Whether the node belongs to every pipeline stage that uses it rather than to one: a
    /// parameter, an input or a constant.
    pub fn is_stageless(&self) -> bool {
        self.op.is_leaf() || self.inputs.is_empty()
    }
}

impl GradGraph for Graph {
    fn inputs_of(&self, id: NodeId) -> &[NodeId] {
        &self.node(id).inputs
    }
    fn type_of(&self, id: NodeId) -> &TensorType {
        &self.node(id).ty
    }
    fn name_of(&self, id: NodeId) -> &str {
        &self.node(id).name
    }
    fn kind_of(&self, id: NodeId) -> &'static str {
        self.node(id).op.kind()
    }
    fn stage_of(&self, id: NodeId) -> Option<usize> {
        self.node(id).pipeline_stage
    }
    fn add_node(&mut self, base: &str, op: OpKind, inputs: &[NodeId], stage: Option<usize>) -> Result<NodeId> {
        let name = self.unique_name(base);
        let id = self.add(&name, op, inputs)?;
        self.node_mut(id).pipeline_stage = stage;
        Ok(id)
    }
}

/// The order in which a run computes the values some outputs need, and when each value dies:
/// the executor follows it, and memory predictions simulate it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Node indices in execution (graph) order: only the nodes the fetched values need.
    pub order: Vec<usize>,
    /// For each position in `order`, the values that are dead after it (fetched values never die).
    pub free_after: Vec<Vec<usize>>,
}

impl Schedule {
    /// The most bytes held by values at once when the schedule runs, each value taking its
    /// type's size from when it is computed until its last user has run (what the executor
    /// reports as `peak_live_bytes`). A parameter's value is the stored tensor itself, shared
    /// rather than copied, so it takes nothing here: what a rank stores is counted apart.
    pub fn peak_bytes(&self, graph: &Graph) -> usize {
        self.peak_bytes_where(graph, |_| true)
    }

    /// [`Schedule::peak_bytes`] of the values `counted` accepts (by node index) only, the
    /// others taking nothing: e.g. the activations without the gradients the run forms.
    pub fn peak_bytes_where(&self, graph: &Graph, counted: impl Fn(usize) -> bool) -> usize {
        let size = |i: usize| if counted(i) { graph.nodes[i].value_bytes() } else { 0 };
        let (mut live, mut peak) = (0usize, 0usize);
        for (pos, &i) in self.order.iter().enumerate() {
            live += size(i);
            peak = peak.max(live);
            for &dead in &self.free_after[pos] {
                live -= size(dead);
            }
        }
        peak
    }
}

/// A computation graph. Nodes are kept in topological order (every input precedes its user),
/// names are unique, and every node's type was inferred when it was added.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    nodes: Vec<Node>,
    names: HashMap<String, NodeId>,
    /// Values the caller wants out of the graph (loss, logits, ...).
    pub outputs: Vec<NodeId>,
    /// The name prefixes of the network's blocks (`blocks.0.`, `layer1.0.`), in network order:
    /// the cells that recomputation by blocks recomputes ([`Graph::recompute_block`]).
    pub blocks: Vec<String>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// All nodes, in topological order; a node's index is its [`NodeId`].
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node `id`. Panics on an id from another graph; use [`Graph::get`] for untrusted ids.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0]
    }

    /// The node `id`, or [`GraphError::UnknownNode`] when the id is out of range.
    pub fn get(&self, id: NodeId) -> Result<&Node> {
        self.check_id(id)?;
        Ok(&self.nodes[id.0])
    }

    /// Mutable access for annotations (strategy, stage). Changing `op` or `inputs` through it
    /// must be followed by [`Graph::validate`].
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.0]
    }

    /// Checks that `id` names a node of this graph; otherwise [`GraphError::UnknownNode`].
    pub fn check_id(&self, id: NodeId) -> Result<()> {
        if id.0 < self.nodes.len() {
            Ok(())
        } else {
            Err(GraphError::UnknownNode { id: id.0, len: self.nodes.len() })
        }
    }

    /// The node named `name`.
    pub fn find(&self, name: &str) -> Result<NodeId> {
        self.names.get(name).copied().ok_or_else(|| GraphError::UnknownName { name: name.to_string() })
    }

    /// `base` if unused, else `base_1`, `base_2`, ...
    pub fn unique_name(&self, base: &str) -> String {
        if !self.names.contains_key(base) {
            return base.to_string();
        }
        (1..).map(|k| format!("{base}_{k}")).find(|n| !self.names.contains_key(n)).expect("an unused name exists")
    }

    /// Infers the type of `op` applied to `inputs` without adding anything.
    pub fn infer(&self, name: &str, op: &OpKind, inputs: &[NodeId]) -> Result<TensorType> {
        let def = op.def();
        if !def.arity().accepts(inputs.len()) {
            return Err(GraphError::Arity {
                kind: def.kind(),
                name: name.to_string(),
                expected: def.arity().to_string(),
                got: inputs.len(),
            });
        }
        for &x in inputs {
            self.check_id(x)?;
        }
        let types: Vec<TensorType> = inputs.iter().map(|x| self.nodes[x.0].ty.clone()).collect();
        def.infer(&InferCx { kind: def.kind(), name, inputs: &types })
    }

    /// Adds a node after checking its name, inputs and shapes.
    pub fn add(&mut self, name: &str, op: impl Into<OpKind>, inputs: &[NodeId]) -> Result<NodeId> {
        let op = op.into();
        if let Some(&existing) = self.names.get(name) {
            return Err(GraphError::DuplicateName { name: name.to_string(), existing: existing.0 });
        }
        let ty = self.infer(name, &op, inputs)?;
        // Every tensor is some node's output. None may exceed 16 TiB, far beyond any device's
        // memory: the plan's figures (bytes moved, memory) sum many tensors' sizes and must not
        // overflow.
        let bytes = ty.shape.iter().try_fold(ty.dtype.size(), |b, &d| b.checked_mul(d));
        if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
            return Err(GraphError::TooLarge { kind: op.kind(), name: name.to_string(), shape: ty.shape.clone(), dtype: ty.dtype });
        }
        let id = NodeId(self.nodes.len());
        self.names.insert(name.to_string(), id);
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs: inputs.to_vec(),
            ty,
            strategy: None,
            layout: None,
            pipeline_stage: None,
            recompute: Recompute::Keep,
        });
        Ok(id)
    }

    /// Attaches a sharding strategy to `id` after checking it against the node's inputs: one
    /// split tuple per input, one split per dimension, each dividing its dimension.
    pub fn set_strategy(&mut self, id: NodeId, strategy: Strategy) -> Result<()> {
        self.check_id(id)?;
        let node = &self.nodes[id.0];
        let kind = node.op.kind();
        let s = strategy.inputs();
        if s.len() != node.inputs.len() {
            return Err(GraphError::StrategyArity {
                kind,
                name: node.name.clone(),
                strategy: strategy.to_string(),
                got: s.len(),
                inputs: node.inputs.len(),
            });
        }
        for (i, (splits, x)) in s.iter().zip(&node.inputs).enumerate() {
            let shape = &self.nodes[x.0].ty.shape;
            if splits.len() != shape.len() {
                return Err(GraphError::StrategyRank {
                    kind,
                    name: node.name.clone(),
                    strategy: strategy.to_string(),
                    input: i,
                    got: splits.len(),
                    shape: shape.clone(),
                });
            }
            for (dim, (&split, &size)) in splits.iter().zip(shape).enumerate() {
                if split == 0 || size % split != 0 {
                    return Err(GraphError::StrategyNotDivisible {
                        kind,
                        name: node.name.clone(),
                        strategy: strategy.to_string(),
                        input: i,
                        dim,
                        size,
                        split,
                    });
                }
            }
        }
        self.nodes[id.0].strategy = Some(strategy);
        self.nodes[id.0].layout = None;
        Ok(())
    }

    /// Attaches MindSpore `Layout`s to `id` (one per input), checked as [`Graph::set_strategy`]
    /// checks their split counts; the layout's device count is checked when the job is planned.
    pub fn set_layout(&mut self, id: NodeId, layout: NamedLayout) -> Result<()> {
        self.set_strategy(id, layout.strategy())
            .map_err(|e| GraphError::LayoutDoesNotFit { layout: layout.to_string(), source: Box::new(e) })?;
        self.nodes[id.0].layout = Some(layout);
        Ok(())
    }

    /// Puts node `id` in pipeline stage `stage` (MindSpore's `cell.pipeline_stage`), counted from 0.
    pub fn set_pipeline_stage(&mut self, id: NodeId, stage: usize) -> Result<()> {
        self.check_id(id)?;
        self.nodes[id.0].pipeline_stage = Some(stage);
        Ok(())
    }

    /// Marks op `id` for recomputation (MindSpore's `Primitive.recompute()`): the backward pass
    /// recomputes its value from its inputs instead of keeping it. Parameters, inputs, constants
    /// and pipeline sends and receives cannot be recomputed.
    pub fn recompute(&mut self, id: NodeId) -> Result<()> {
        self.check_id(id)?;
        let node = &self.nodes[id.0];
        if node.inputs.is_empty() || node.op.is_leaf() || matches!(node.op, OpKind::Send(_) | OpKind::Recv(_)) {
            return Err(GraphError::NotRecomputable { kind: node.op.kind(), name: node.name.clone() });
        }
        self.nodes[id.0].recompute = Recompute::Marked;
        Ok(())
    }

    /// Marks the cell whose ops' names start with `prefix` for recomputation (MindSpore's
    /// `Cell.recompute()`): every op of the cell except its outputs (the values an op outside
    /// the cell reads, or the graph's outputs), which are kept so that the backward pass
    /// recomputes the cell from them and the cell's saved inputs. Returns the ops marked.
    pub fn recompute_block(&mut self, prefix: &str) -> Result<usize> {
        let inside = |n: &Node| n.name.starts_with(prefix);
        let mut read_outside = vec![false; self.nodes.len()];
        for n in self.nodes.iter().filter(|n| !inside(n)) {
            for x in &n.inputs {
                read_outside[x.0] = true;
            }
        }
        for o in &self.outputs {
            read_outside[o.0] = true;
        }
        let marked: Vec<NodeId> = (0..self.nodes.len())
            .filter(|&i| {
                let n = &self.nodes[i];
                inside(n)
                    && !read_outside[i]
                    && !n.inputs.is_empty()
                    && !n.op.is_leaf()
                    && !matches!(n.op, OpKind::Send(_) | OpKind::Recv(_))
            })
            .map(NodeId)
            .collect();
        if marked.is_empty() {
            return Err(GraphError::EmptyRecomputeBlock { prefix: prefix.to_string() });
        }
        for &id in &marked {
            self.nodes[id.0].recompute = Recompute::Marked;
        }
        Ok(marked.len())
    }

    /// Applies a job's recomputation choice to the graph's marks; returns the ops marked.
    pub fn apply_recompute(&mut self, choice: &RecomputeChoice) -> Result<usize> {
        match choice {
            RecomputeChoice::AsBuilt => {}
            RecomputeChoice::Nothing => {
                for n in &mut self.nodes {
                    n.recompute = Recompute::Keep;
                }
            }
            RecomputeChoice::Blocks => {
                if self.blocks.is_empty() {
                    return Err(GraphError::NoBlocks);
                }
                for prefix in self.blocks.clone() {
                    self.recompute_block(&prefix)?;
                }
            }
            RecomputeChoice::Named(names) => {
                for name in names {
                    if name.ends_with('.') {
                        self.recompute_block(name)?;
                    } else {
                        let id = self.find(name)?;
                        self.recompute(id)?;
                    }
                }
            }
        }
        Ok(self.nodes.iter().filter(|n| n.recompute == Recompute::Marked).count())
    }

    /// The schedule of a run producing `fetch`: the needed nodes in graph order and the
    /// position after which each intermediate is last used. Ids must belong to this graph.
    pub fn schedule(&self, fetch: &[NodeId]) -> Result<Schedule> {
        for &f in fetch {
            self.check_id(f)?;
        }
        let n = self.nodes.len();
        let mut needed = vec![false; n];
        for &f in fetch {
            needed[f.0] = true;
        }
        for i in (0..n).rev() {
            if needed[i] {
                for x in &self.nodes[i].inputs {
                    needed[x.0] = true;
                }
            }
        }
        let order: Vec<usize> = (0..n).filter(|&i| needed[i]).collect();
        let mut last_use = vec![usize::MAX; n];
        for (pos, &i) in order.iter().enumerate() {
            for x in &self.nodes[i].inputs {
                last_use[x.0] = pos;
            }
        }
        let mut free_after = vec![Vec::new(); order.len()];
        for &i in &order {
            if !fetch.contains(&NodeId(i)) && last_use[i] != usize::MAX {
                free_after[last_use[i]].push(i);
            }
        }
        Ok(Schedule { order, free_after })
    }

    /// For every node, the nodes using its output (in graph order; a node using a value twice
    /// appears twice).
    pub fn users(&self) -> Vec<Vec<NodeId>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for x in &n.inputs {
                users[x.0].push(NodeId(i));
            }
        }
        users
    }

    /// Every parameter node, in graph order.
    pub fn parameters(&self) -> Vec<NodeId> {
        (0..self.nodes.len()).map(NodeId).filter(|&i| matches!(self.nodes[i.0].op, OpKind::Parameter(_))).collect()
    }

    /// Parameters with `trainable` set, in graph order.
    pub fn trainable_parameters(&self) -> Vec<NodeId> {
        self.parameters()
            .into_iter()
            .filter(|&i| matches!(&self.nodes[i.0].op, OpKind::Parameter(Parameter { trainable: true, .. })))
            .collect()
    }

    /// Every input node, in graph order.
    pub fn inputs(&self) -> Vec<NodeId> {
        (0..self.nodes.len()).map(NodeId).filter(|&i| matches!(self.nodes[i.0].op, OpKind::Input(_))).collect()
    }

    /// Re-checks every invariant after a rewrite: topological order, unique names, and that
    /// every node's stored type is what inference gives now.
    pub fn validate(&mut self) -> Result<()> {
        self.names.clear();
        for i in 0..self.nodes.len() {
            let node = &self.nodes[i];
            if let Some(&existing) = self.names.get(&node.name) {
                return Err(GraphError::DuplicateName { name: node.name.clone(), existing: existing.0 });
            }
            for x in &node.inputs {
                if x.0 >= i {
                    return Err(GraphError::NotTopological { kind: node.op.kind(), name: node.name.clone(), node: i, input: x.0 });
                }
            }
            let ty = self.infer(&node.name, &node.op, &node.inputs)?;
            self.names.insert(self.nodes[i].name.clone(), NodeId(i));
            self.nodes[i].ty = ty;
        }
        Ok(())
    }
}

impl fmt::Display for Graph {
    /// One line per node: `%3 = MatMul { .. } l1.matmul(%0, %1): f32[64, 512] shard ((2, 1), (1, 4)) stage 0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes.iter().enumerate() {
            write!(f, "%{i} = {} {}(", n.op, n.name)?;
            for (k, x) in n.inputs.iter().enumerate() {
                if k > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{x}")?;
            }
            write!(f, "): {}", n.ty)?;
            if let Some(s) = &n.strategy {
                write!(f, " shard {s}")?;
            }
            if let Some(s) = n.pipeline_stage {
                write!(f, " stage {s}")?;
            }
            writeln!(f)?;
        }
        if !self.outputs.is_empty() {
            write!(f, "outputs:")?;
            for o in &self.outputs {
                write!(f, " {o}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// The most bytes one tensor may take: 16 TiB.
pub const MAX_TENSOR_BYTES: usize = 1 << 44;

#[cfg(test)]
mod tests {
    use crate::{DType, GraphBuilder, GraphError, Initializer};

    #[test]
    fn a_tensor_of_more_bytes_than_addresses_is_refused_naming_its_op() {
        let mut b = GraphBuilder::new(0);
        let err = b.parameter("w", &[1 << 32, 1 << 32], Initializer::Zeros).unwrap_err();
        assert!(matches!(&err, GraphError::TooLarge { name, .. } if name == "w"), "{err}");
        // Inputs of fitting sizes whose product does not fit.
        let x = b.input("x", &[1 << 22, 1], DType::F32).unwrap();
        let y = b.input("y", &[1, 1 << 22], DType::F32).unwrap();
        let err = b.matmul("outer", x, y).unwrap_err();
        assert!(matches!(&err, GraphError::TooLarge { kind: "MatMul", name, .. } if name == "outer"), "{err}");
        assert!(err.to_string().contains("`width`"), "{err}");
        // The largest that fits still builds (16 TiB).
        b.input("big", &[1 << 21, 1 << 21], DType::F32).unwrap();
        assert!(b.input("bigger", &[1 << 21, (1 << 21) + 1], DType::F32).is_err());
    }
}
