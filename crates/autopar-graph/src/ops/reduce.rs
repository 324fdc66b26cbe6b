//! Reductions over a set of axes (empty = all axes, MindSpore's convention).

use super::GradCx;
use crate::error::Result;
use crate::ops::activation::BACKWARD_OP;
use crate::ops::{reduced_shape, resolve_axes, Arity, InferCx, OpDef, OpKind};
use crate::sharding::{reduce_spec, CostCx, LocalCx, OpCost, RuleCx, ShardingRule};
use crate::types::{Shape, TensorType};

fn reduce_infer(cx: &InferCx<'_>, axes: &[i64], keep_dims: bool) -> Result<TensorType> {
    let ax = cx.axes(0, "axes", axes)?;
    Ok(TensorType::new(reduced_shape(cx.shape(0), &ax, keep_dims), cx.dtype(0)))
}

/// Broadcasts a reduced gradient back over the reduced axes of `x`.
fn expand(g: &mut GradCx<'_>, dy: crate::NodeId, axes: &[i64]) -> Result<crate::NodeId> {
    let xs = g.x_shape(0);
    let ax = resolve_axes(axes, xs.len());
    let kept: Shape = reduced_shape(&xs, &ax, true);
    let r = g.reshape(dy, &kept)?;
    g.broadcast_to(r, &xs)
}

/// Sum over `axes`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceSum {
    /// The axes to reduce; negative counts from the end, empty means all axes.
    pub axes: Vec<i64>,
    /// Keep each reduced axis as a dimension of size 1 (MindSpore's `keep_dims`).
    pub keep_dims: bool,
}

impl OpDef for ReduceSum {
    fn kind(&self) -> &'static str {
        "ReduceSum"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        reduce_infer(cx, &self.axes, self.keep_dims)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = expand(g, g.dy(), &self.axes)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        ShardingRule::Spec(reduce_spec(x, &resolve_axes(&self.axes, x.len()), self.keep_dims, false, true))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 1.0)
    }
}

/// Mean over `axes`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceMean {
    /// The axes to reduce; negative counts from the end, empty means all axes.
    pub axes: Vec<i64>,
    /// Keep each reduced axis as a dimension of size 1 (MindSpore's `keep_dims`).
    pub keep_dims: bool,
}

impl OpDef for ReduceMean {
    fn kind(&self) -> &'static str {
        "ReduceMean"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.float(0)?;
        reduce_infer(cx, &self.axes, self.keep_dims)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let xs = g.x_shape(0);
        let count: usize = resolve_axes(&self.axes, xs.len()).iter().map(|&a| xs[a]).product();
        let s = g.scale(g.dy(), 1.0 / count.max(1) as f64)?;
        let d = expand(g, s, &self.axes)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        ShardingRule::Spec(reduce_spec(x, &resolve_axes(&self.axes, x.len()), self.keep_dims, true, true))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 1.0)
    }
}

/// Maximum over `axes`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceMax {
    /// The axes to reduce; negative counts from the end, empty means all axes.
    pub axes: Vec<i64>,
    /// Keep each reduced axis as a dimension of size 1 (MindSpore's `keep_dims`).
    pub keep_dims: bool,
}

impl OpDef for ReduceMax {
    fn kind(&self) -> &'static str {
        "ReduceMax"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        reduce_infer(cx, &self.axes, self.keep_dims)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(ReduceMaxGrad { axes: self.axes.clone(), keep_dims: self.keep_dims }, &[g.x(0), g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        ShardingRule::Spec(reduce_spec(x, &resolve_axes(&self.axes, x.len()), self.keep_dims, false, false))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 1.0)
    }
}

/// Routes `dy` to the position of each maximum of `x` (the first one on ties). Inputs `(x, dy)`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceMaxGrad {
    /// The forward [`ReduceMax`]'s axes.
    pub axes: Vec<i64>,
    /// The forward [`ReduceMax`]'s `keep_dims`.
    pub keep_dims: bool,
}

impl OpDef for ReduceMaxGrad {
    fn kind(&self) -> &'static str {
        "ReduceMaxGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        let ax = cx.axes(0, "axes", &self.axes)?;
        if *cx.shape(1) != reduced_shape(cx.shape(0), &ax, self.keep_dims) {
            return Err(cx.bad_shape(1, "the reduced shape of input 0"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = if g.needs(0) { 0 } else { 1 };
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Unsupported(BACKWARD_OP)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 1.0)
    }
}
