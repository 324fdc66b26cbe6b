//! Element-wise arithmetic with NumPy broadcasting, and unary math.

use super::GradCx;
use crate::error::Result;
use crate::ops::{unary_float, Arity, InferCx, OpDef, OpKind};
use crate::sharding::{broadcast_spec, unary_spec, CostCx, LocalCx, OpCost, RuleCx, ShardingRule};
use crate::types::{DType, TensorType};

fn binary_infer(cx: &InferCx<'_>) -> Result<TensorType> {
    let dtype = cx.same_dtype(0, 1)?;
    Ok(TensorType::new(cx.broadcast(0, 1)?, dtype))
}

macro_rules! binary_op {
    ($ty:ident, $doc:literal, |$g:ident, $dy:ident| $body:block) => {
        #[doc = $doc]
        #[derive(Clone, Debug, PartialEq)]
        pub struct $ty;

        impl OpDef for $ty {
            fn kind(&self) -> &'static str {
                stringify!($ty)
            }
            fn arity(&self) -> Arity {
                Arity::Exactly(2)
            }
            fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
                binary_infer(cx)
            }
            fn grad(&self, $g: &mut GradCx<'_>) -> Result<()> {
                let $dy = $g.dy();
                $body
                Ok(())
            }
            fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
                ShardingRule::Spec(broadcast_spec(cx.out(), cx.inputs))
            }
            fn local(&self, _: &LocalCx<'_>) -> OpKind {
                $ty.into()
            }
            fn cost(&self, cx: &CostCx<'_>) -> OpCost {
                cx.per_element(1.0)
            }
        }
    };
}

binary_op!(Add, "`x0 + x1`.", |g, dy| {
    for i in 0..2 {
        if g.needs(i) {
            let d = g.sum_to(dy, &g.x_shape(i))?;
            g.set(i, d);
        }
    }
});

binary_op!(Sub, "`x0 - x1`.", |g, dy| {
    if g.needs(0) {
        let d = g.sum_to(dy, &g.x_shape(0))?;
        g.set(0, d);
    }
    if g.needs(1) {
        let n = g.neg(dy)?;
        let d = g.sum_to(n, &g.x_shape(1))?;
        g.set(1, d);
    }
});

binary_op!(Mul, "`x0 * x1`.", |g, dy| {
    for i in 0..2 {
        if g.needs(i) {
            let other = g.x(1 - i);
            let p = g.mul(dy, other)?;
            let d = g.sum_to(p, &g.x_shape(i))?;
            g.set(i, d);
        }
    }
});

binary_op!(Div, "`x0 / x1`.", |g, dy| {
    let x1 = g.x(1);
    if g.needs(0) {
        let q = g.div(dy, x1)?;
        let d = g.sum_to(q, &g.x_shape(0))?;
        g.set(0, d);
    }
    if g.needs(1) {
        // d/dx1 (x0 / x1) = -y / x1
        let y = g.y();
        let p = g.mul(dy, y)?;
        let q = g.div(p, x1)?;
        let n = g.neg(q)?;
        let d = g.sum_to(n, &g.x_shape(1))?;
        g.set(1, d);
    }
});

macro_rules! unary_op {
    ($ty:ident, $doc:literal, $flops:literal, |$g:ident, $dy:ident| $body:expr) => {
        #[doc = $doc]
        #[derive(Clone, Debug, PartialEq)]
        pub struct $ty;

        impl OpDef for $ty {
            fn kind(&self) -> &'static str {
                stringify!($ty)
            }
            fn arity(&self) -> Arity {
                Arity::Exactly(1)
            }
            fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
                unary_float(cx)
            }
            fn grad(&self, $g: &mut GradCx<'_>) -> Result<()> {
                let $dy = $g.dy();
                let d = $body;
                $g.set(0, d);
                Ok(())
            }
            fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
                ShardingRule::Spec(unary_spec(cx.out(), &[], ""))
            }
            fn local(&self, _: &LocalCx<'_>) -> OpKind {
                $ty.into()
            }
            /// FLOPs per element: 1 for arithmetic, a few for transcendental functions.
            fn cost(&self, cx: &CostCx<'_>) -> OpCost {
                cx.per_element($flops)
            }
        }
    };
}

unary_op!(Neg, "`-x`.", 1.0, |g, dy| g.neg(dy)?);
unary_op!(Exp, "`e^x`.", 4.0, |g, dy| {
    let y = g.y();
    g.mul(dy, y)?
});
unary_op!(Log, "Natural logarithm.", 4.0, |g, dy| {
    let x = g.x(0);
    g.div(dy, x)?
});
unary_op!(Sqrt, "Square root.", 2.0, |g, dy| {
    // dy / (2 sqrt(x))
    let y = g.y();
    let two_y = g.scale(y, 2.0)?;
    g.div(dy, two_y)?
});

/// `x * factor` for a constant factor (loss scaling, means, learning rates inside graphs).
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// The constant multiplier.
    pub factor: f64,
}

impl OpDef for Scale {
    fn kind(&self) -> &'static str {
        "Scale"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.scale(g.dy(), self.factor)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(unary_spec(cx.out(), &[], ""))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(1.0)
    }
}

/// `x * factor * s`, where `s` is the step's loss scale, set by the runtime before each step
/// (1 without loss scaling): the seed of a training program's backward pass. Its gradient is
/// the same product, so every gradient of the step comes out multiplied by `s` (MindSpore's
/// `scaling_sens`).
#[derive(Clone, Debug, PartialEq)]
pub struct LossScale {
    /// The constant part of the multiplier (the loss seed).
    pub factor: f64,
}

impl OpDef for LossScale {
    fn kind(&self) -> &'static str {
        "LossScale"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        unary_float(cx)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(self.clone(), &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(unary_spec(cx.out(), &[], ""))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(1.0)
    }
}

/// Conversion to another floating-point type (the planner brackets collectives with it when
/// `force_fp32_communication` asks for f32 communication of f16/bf16 values; the precision
/// policy inserts it between ops of different precision).
#[derive(Clone, Debug, PartialEq)]
pub struct Cast {
    /// The target type; must be floating-point.
    pub dtype: DType,
    /// Inserted by the precision policy ([`crate::precision`]): the cast takes its input's
    /// layout and has no strategy of its own (a parameter's cast, the layout its consumer
    /// needs). A cast written in the network is split as MindSpore splits its `Cast`.
    pub inserted: bool,
}

impl Cast {
    /// A cast to `dtype` written in the network.
    pub fn to(dtype: DType) -> Self {
        Self { dtype, inserted: false }
    }
}

impl OpDef for Cast {
    fn kind(&self) -> &'static str {
        "Cast"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.float(0)?;
        if !self.dtype.is_float() {
            return Err(cx.bad_attr("dtype", self.dtype, "a floating-point type"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), self.dtype))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let back = g.dtype(g.x(0));
        let d = g.op(Cast { dtype: back, inserted: self.inserted }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        if self.inserted {
            return ShardingRule::FollowInput;
        }
        ShardingRule::Spec(unary_spec(cx.out(), &[], ""))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}
