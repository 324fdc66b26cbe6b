//! The context of a backward rule ([`GradCx`]): the forward node, its output gradient, and a
//! way to add nodes, through the graph's [`GradGraph`] face (so that the op set does not depend
//! on the graph type that holds ops).

use super::*;
use crate::error::{GraphError, Result};
use crate::types::{DType, NodeId, Shape, TensorType};

/// The graph as a backward rule reaches it: the forward nodes' inputs, types, names and
/// stages, and new nodes. Implemented by [`crate::Graph`].
pub trait GradGraph {
    /// The inputs of node `id`.
    fn inputs_of(&self, id: NodeId) -> &[NodeId];
    /// The output type of node `id`.
    fn type_of(&self, id: NodeId) -> &TensorType;
    /// The name of node `id`.
    fn name_of(&self, id: NodeId) -> &str;
    /// The op kind of node `id`.
    fn kind_of(&self, id: NodeId) -> &'static str;
    /// The pipeline stage of node `id`.
    fn stage_of(&self, id: NodeId) -> Option<usize>;
    /// Adds node `op(inputs)` under a unique name made from `base`, on pipeline stage `stage`.
    fn add_node(&mut self, base: &str, op: OpKind, inputs: &[NodeId], stage: Option<usize>) -> Result<NodeId>;
}

/// What a backward rule sees: the forward node, its output gradient, and a way to add nodes.
pub struct GradCx<'a> {
    graph: &'a mut dyn GradGraph,
    node: NodeId,
    dy: NodeId,
    needs: Vec<bool>,
    grads: Vec<Option<NodeId>>,
    counter: usize,
}

impl<'a> GradCx<'a> {
    /// The context of the backward rule of node `node` of `graph`, whose output gradient is
    /// `dy`; `needs[i]`: whether forward input `i` needs a gradient.
    pub(crate) fn new(graph: &'a mut dyn GradGraph, node: NodeId, dy: NodeId, needs: Vec<bool>) -> Self {
        let grads = vec![None; needs.len()];
        Self { graph, node, dy, needs, grads, counter: 0 }
    }

    /// The gradients the rule recorded, per forward input (None: none).
    pub(crate) fn into_grads(self) -> Vec<Option<NodeId>> {
        self.grads
    }

    /// Forward input `i`.
    pub fn x(&self, i: usize) -> NodeId {
        self.graph.inputs_of(self.node)[i]
    }

    /// Number of forward inputs.
    pub fn num_inputs(&self) -> usize {
        self.needs.len()
    }

    /// Forward output.
    pub fn y(&self) -> NodeId {
        self.node
    }

    /// Gradient of the forward output.
    pub fn dy(&self) -> NodeId {
        self.dy
    }

    /// Shape of node `id`.
    pub fn shape(&self, id: NodeId) -> Shape {
        self.graph.type_of(id).shape.clone()
    }

    /// Element type of node `id`.
    pub fn dtype(&self, id: NodeId) -> DType {
        self.graph.type_of(id).dtype
    }

    /// Shape of forward input `i`.
    pub fn x_shape(&self, i: usize) -> Shape {
        self.shape(self.x(i))
    }

    /// Whether forward input `i` needs a gradient.
    pub fn needs(&self, i: usize) -> bool {
        self.needs[i]
    }

    /// Records the gradient of forward input `i` (ignored when it needs none).
    pub fn set(&mut self, i: usize, grad: NodeId) {
        if self.needs[i] {
            self.grads[i] = Some(grad);
        }
    }

    /// The error for a backward rule that is not defined for input `i`.
    pub fn not_differentiable(&self, i: usize) -> GraphError {
        GraphError::NotDifferentiable { kind: self.graph.kind_of(self.node), name: self.graph.name_of(self.node).to_string(), input: i }
    }

    /// Adds a backward node.
    pub fn op(&mut self, op: impl Into<OpKind>, inputs: &[NodeId]) -> Result<NodeId> {
        let op = op.into();
        let base = format!("grad/{}/{}{}", self.graph.name_of(self.node), op.kind(), self.counter);
        self.counter += 1;
        let stage = self.graph.stage_of(self.node);
        self.graph.add_node(&base, op, inputs, stage)
    }

    /// Adds a backward `Add` node: `a + b`.
    pub fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(Add, &[a, b])
    }

    /// Adds a backward `Sub` node: `a - b`.
    pub fn sub(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(Sub, &[a, b])
    }

    /// Adds a backward `Mul` node: `a * b`.
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(Mul, &[a, b])
    }

    /// Adds a backward `Div` node: `a / b`.
    pub fn div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.op(Div, &[a, b])
    }

    /// Adds a backward `Neg` node: `-a`.
    pub fn neg(&mut self, a: NodeId) -> Result<NodeId> {
        self.op(Neg, &[a])
    }

    /// Adds a backward `Scale` node: `a * factor`.
    pub fn scale(&mut self, a: NodeId, factor: f64) -> Result<NodeId> {
        self.op(Scale { factor }, &[a])
    }

    /// `a` reshaped to `shape`: `a` itself when it already has that shape, else a new `Reshape` node.
    pub fn reshape(&mut self, a: NodeId, shape: &[usize]) -> Result<NodeId> {
        if self.shape(a) == shape {
            return Ok(a);
        }
        self.op(Reshape { shape: shape.iter().map(|&d| d as i64).collect() }, &[a])
    }

    /// `a` broadcast to `shape`: `a` itself when it already has that shape, else a new `BroadcastTo` node.
    pub fn broadcast_to(&mut self, a: NodeId, shape: &[usize]) -> Result<NodeId> {
        if self.shape(a) == shape {
            return Ok(a);
        }
        self.op(BroadcastTo { shape: shape.to_vec() }, &[a])
    }

    /// Sums a broadcast gradient back to `shape` (the reverse of broadcasting).
    pub fn sum_to(&mut self, a: NodeId, shape: &[usize]) -> Result<NodeId> {
        if self.shape(a) == shape {
            return Ok(a);
        }
        self.op(SumTo { shape: shape.to_vec() }, &[a])
    }

    /// Adds a backward `ReduceSum` node over `axes` (dimensions counted from 0), keeping them as size 1 when `keep_dims`.
    pub fn reduce_sum(&mut self, a: NodeId, axes: &[usize], keep_dims: bool) -> Result<NodeId> {
        self.op(ReduceSum { axes: axes.iter().map(|&d| d as i64).collect(), keep_dims }, &[a])
    }

    /// Adds a backward `Fill` node: a tensor of `shape` and `dtype` with every element `value`.
    pub fn fill(&mut self, shape: &[usize], dtype: DType, value: f64) -> Result<NodeId> {
        self.op(Fill { shape: shape.to_vec(), dtype, value }, &[])
    }
}
