//! Ops without inputs: graph inputs, parameters and constants.

use crate::autodiff::GradCx;
use crate::error::Result;
use crate::init::Initializer;
use crate::ops::{Arity, InferCx, OpDef};
use crate::types::{DType, Shape, TensorType};

/// A value fed by the caller at every run (a batch, labels).
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub shape: Shape,
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
}

/// A persistent tensor (weights, running statistics) with a seeded initialiser.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameter {
    pub shape: Shape,
    pub dtype: DType,
    pub init: Initializer,
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
}

/// A tensor of one repeated value.
#[derive(Clone, Debug, PartialEq)]
pub struct Fill {
    pub shape: Shape,
    pub dtype: DType,
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
}
