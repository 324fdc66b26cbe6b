//! Ops without inputs: graph inputs, parameters and constants.

use super::GradCx;
use crate::error::Result;
use crate::init::Initializer;
use crate::ops::{Arity, InferCx, OpDef, OpKind};
use crate::sharding::{CostCx, LocalCx, OpCost, RuleCx, ShardingRule};
use crate::types::{DType, Shape, TensorType};

/// A value fed by the caller at every run (a batch, labels).
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// Shape of the value the caller feeds.
    pub shape: Shape,
    /// Element type of the value the caller feeds.
    pub dtype: DType,
}

impl OpDef for Input {
    fn kind(&self) -> &'static str {
        "Input"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(0)
    }
    fn infer(&self, _: &InferCx<'_>) -> Result<TensorType> {
        Ok(TensorType::new(self.shape.clone(), self.dtype))
    }
    fn grad(&self, _: &mut GradCx<'_>) -> Result<()> {
        Ok(()) // a leaf: its gradient is the accumulated output gradient
    }
    // Its layout is the dataset strategy's, set by the planner.
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Replicated
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Input { shape: cx.output.to_vec(), dtype: self.dtype }.into()
    }
    fn cost(&self, _: &CostCx<'_>) -> OpCost {
        OpCost::default()
    }
}

/// A persistent tensor (weights, running statistics) with a seeded initialiser.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameter {
    /// The parameter's shape.
    pub shape: Shape,
    /// The parameter's element type.
    pub dtype: DType,
    /// How its initial values are drawn.
    pub init: Initializer,
    /// Seed of the initialiser (by default derived from the graph seed and the parameter's name).
    pub seed: u64,
    /// Optimizers update trainable parameters; running statistics are not trainable.
    pub trainable: bool,
}

impl OpDef for Parameter {
    fn kind(&self) -> &'static str {
        "Parameter"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(0)
    }
    fn infer(&self, _: &InferCx<'_>) -> Result<TensorType> {
        Ok(TensorType::new(self.shape.clone(), self.dtype))
    }
    fn grad(&self, _: &mut GradCx<'_>) -> Result<()> {
        Ok(()) // a leaf
    }
    // Its layout is the one its first user needs, set by the planner.
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Replicated
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Parameter { shape: cx.output.to_vec(), ..self.clone() }.into()
    }
    fn cost(&self, _: &CostCx<'_>) -> OpCost {
        OpCost::default()
    }
}

/// A tensor of one repeated value.
#[derive(Clone, Debug, PartialEq)]
pub struct Fill {
    /// Output shape.
    pub shape: Shape,
    /// Output element type.
    pub dtype: DType,
    /// The value of every element.
    pub value: f64,
}

impl OpDef for Fill {
    fn kind(&self) -> &'static str {
        "Fill"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(0)
    }
    fn infer(&self, _: &InferCx<'_>) -> Result<TensorType> {
        Ok(TensorType::new(self.shape.clone(), self.dtype))
    }
    fn grad(&self, _: &mut GradCx<'_>) -> Result<()> {
        Ok(()) // constant: no inputs
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Replicated
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Fill { shape: cx.output.to_vec(), ..self.clone() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}
