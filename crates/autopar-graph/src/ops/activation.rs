//! Activations and normalised exponentials.

use super::GradCx;
use crate::error::Result;
use crate::ops::{same_shape_float, unary_float, Arity, InferCx, OpDef, OpKind};
use crate::sharding::{group_reduce, unary_spec, CostCx, LocalCx, OpCost, RuleCx, ShardingRule, Tie};
use crate::types::{normalize_axis, TensorType};

/// Backward ops are made by autodiff of a rank's local graph; the planner never splits them.
pub(crate) const BACKWARD_OP: &str = "backward ops are made by autodiff after sharding; give the planner the forward graph";

/// An element-wise activation: split any way, the output like the input.
fn activation_rule(cx: &RuleCx<'_>) -> ShardingRule {
    ShardingRule::Spec(unary_spec(cx.out(), &[], ""))
}

/// `max(x, 0)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Relu;

impl OpDef for Relu {
    fn kind(&self) -> &'static str {
        "ReLU"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(ReluGrad, &[g.dy(), g.y()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        activation_rule(cx)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(1.0)
    }
}

/// `dy` where the ReLU output `y` is positive, else 0. Inputs `(dy, y)`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReluGrad;

impl OpDef for ReluGrad {
    fn kind(&self) -> &'static str {
        "ReluGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        same_shape_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // Linear in dy; piecewise constant in y (zero gradient almost everywhere).
        let d = g.op(ReluGrad, &[g.dy(), g.x(1)])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Unsupported(BACKWARD_OP)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(1.0)
    }
}

/// GELU: with `approximate` the tanh form (MindSpore's default)
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, else the exact `0.5 x (1 + erf(x / sqrt 2))`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gelu {
    /// Use the tanh approximation instead of the exact erf form.
    pub approximate: bool,
}

impl OpDef for Gelu {
    fn kind(&self) -> &'static str {
        "GeLU"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(GeluGrad { approximate: self.approximate }, &[g.dy(), g.x(0)])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        activation_rule(cx)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(8.0)
    }
}

/// SiLU (swish, Llama's MLP activation): `x * sigmoid(x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Silu;

impl OpDef for Silu {
    fn kind(&self) -> &'static str {
        "SiLU"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(SiluGrad, &[g.dy(), g.x(0)])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        activation_rule(cx)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(5.0)
    }
}

/// `dy * silu'(x)`. Inputs `(dy, x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct SiluGrad;

impl OpDef for SiluGrad {
    fn kind(&self) -> &'static str {
        "SiLUGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        same_shape_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        if g.needs(1) {
            return Err(g.not_differentiable(1));
        }
        let d = g.op(SiluGrad, &[g.dy(), g.x(1)])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Unsupported(BACKWARD_OP)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(8.0)
    }
}

/// `dy * gelu'(x)`. Inputs `(dy, x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct GeluGrad {
    /// Differentiate the tanh approximation instead of the exact erf form (as the forward [`Gelu`]).
    pub approximate: bool,
}

impl OpDef for GeluGrad {
    fn kind(&self) -> &'static str {
        "GeLUGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        same_shape_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        if g.needs(1) {
            return Err(g.not_differentiable(1));
        }
        let d = g.op(GeluGrad { approximate: self.approximate }, &[g.dy(), g.x(1)])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Unsupported(BACKWARD_OP)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(10.0)
    }
}

/// Hyperbolic tangent.
#[derive(Clone, Debug, PartialEq)]
pub struct Tanh;

impl OpDef for Tanh {
    fn kind(&self) -> &'static str {
        "Tanh"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // dy (1 - y^2) = dy - dy y y
        let (dy, y) = (g.dy(), g.y());
        let a = g.mul(dy, y)?;
        let b = g.mul(a, y)?;
        let d = g.sub(dy, b)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        activation_rule(cx)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(4.0)
    }
}

/// Logistic sigmoid.
#[derive(Clone, Debug, PartialEq)]
pub struct Sigmoid;

impl OpDef for Sigmoid {
    fn kind(&self) -> &'static str {
        "Sigmoid"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // dy y (1 - y) = dy (y - y y)
        let (dy, y) = (g.dy(), g.y());
        let yy = g.mul(y, y)?;
        let s = g.sub(y, yy)?;
        let d = g.mul(dy, s)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        activation_rule(cx)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(4.0)
    }
}

/// Softmax along `axis`.
///
/// `group`: the world ranks (ascending) whose slices together form the whole `axis` when it is
/// split across ranks; the executor takes the maximum and the sum over the group, and the
/// gradient sums over it (an AllReduce in the backward graph). Empty: `axis` is whole here.
#[derive(Clone, Debug, PartialEq)]
pub struct Softmax {
    /// The axis to normalise over; negative counts from the end.
    pub axis: i64,
    /// World ranks (ascending) whose slices together form the whole `axis`; empty when it is not split.
    pub group: Vec<usize>,
}

/// Softmax and LogSoftmax split on their axis: the row maximum and sum are reduced over the
/// ranks that split it (and the backward's row sum, an AllReduce in the backward graph).
fn softmax_rule(axis: i64, cx: &RuleCx<'_>) -> ShardingRule {
    let mut spec = unary_spec(cx.out(), &[], "");
    spec.tie = Tie::Stats(vec![normalize_axis(axis, cx.out().len()).expect("graph nodes hold axes within their input's rank")]);
    ShardingRule::Spec(spec)
}

/// The maximum, exponentials, sum and division: 4 FLOPs per element; synchronised over
/// `group`, the row maxima and sums (one value per row each) are all-reduced.
fn softmax_cost(axis: i64, group: &[usize], cx: &CostCx<'_>) -> OpCost {
    let x = &cx.inputs[0];
    let axis = normalize_axis(axis, x.shape.len()).expect("graph nodes hold axes within their input's rank");
    let rows = x.numel() / x.shape[axis].max(1);
    let comm = [group_reduce(group, rows, x.dtype), group_reduce(group, rows, x.dtype)].into_iter().flatten().collect();
    cx.per_element(4.0).with_comm(comm)
}

/// The sum along a split axis is completed over the ranks that split it.
fn sum_over_group(g: &mut GradCx<'_>, s: crate::NodeId, group: &[usize]) -> Result<crate::NodeId> {
    if group.len() > 1 {
        g.op(crate::ops::AllReduce { op: crate::ReduceOp::Sum, group: group.to_vec() }, &[s])
    } else {
        Ok(s)
    }
}

impl OpDef for Softmax {
    fn kind(&self) -> &'static str {
        "Softmax"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.axis(0, "axis", self.axis)?;
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // y (dy - sum(dy y, axis))
        let (dy, y) = (g.dy(), g.y());
        let shape = g.shape(y);
        let axis = crate::types::normalize_axis(self.axis, shape.len()).expect("checked at build");
        let p = g.mul(dy, y)?;
        let s = g.reduce_sum(p, &[axis], true)?;
        let s = sum_over_group(g, s, &self.group)?;
        let diff = g.sub(dy, s)?;
        let d = g.mul(y, diff)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        softmax_rule(self.axis, cx)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Softmax { axis: self.axis, group: cx.group.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        softmax_cost(self.axis, &self.group, cx)
    }
}

/// Log of softmax along `axis`, computed stably. `group` as for [`Softmax`].
#[derive(Clone, Debug, PartialEq)]
pub struct LogSoftmax {
    /// The axis to normalise over; negative counts from the end.
    pub axis: i64,
    /// World ranks (ascending) whose slices together form the whole `axis`; empty when it is not split.
    pub group: Vec<usize>,
}

impl OpDef for LogSoftmax {
    fn kind(&self) -> &'static str {
        "LogSoftmax"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.axis(0, "axis", self.axis)?;
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // dy - exp(y) sum(dy, axis)
        let (dy, y) = (g.dy(), g.y());
        let shape = g.shape(y);
        let axis = crate::types::normalize_axis(self.axis, shape.len()).expect("checked at build");
        let s = g.reduce_sum(dy, &[axis], true)?;
        let s = sum_over_group(g, s, &self.group)?;
        let e = g.op(crate::ops::Exp, &[y])?;
        let p = g.mul(e, s)?;
        let d = g.sub(dy, p)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        softmax_rule(self.axis, cx)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        LogSoftmax { axis: self.axis, group: cx.group.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        softmax_cost(self.axis, &self.group, cx)
    }
}
