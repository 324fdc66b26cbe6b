//! Element-wise arithmetic with NumPy broadcasting, and unary math.

use crate::autodiff::GradCx;
use crate::error::Result;
use crate::ops::{unary_float, Arity, InferCx, OpDef};
use crate::types::TensorType;

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
    ($ty:ident, $doc:literal, |$g:ident, $dy:ident| $body:expr) => {
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
        }
    };
}

unary_op!(Neg, "`-x`.", |g, dy| g.neg(dy)?);
unary_op!(Exp, "`e^x`.", |g, dy| {
    let y = g.y();
    g.mul(dy, y)?
});
unary_op!(Log, "Natural logarithm.", |g, dy| {
    let x = g.x(0);
    g.div(dy, x)?
});
unary_op!(Sqrt, "Square root.", |g, dy| {
    // dy / (2 sqrt(x))
    let y = g.y();
    let two_y = g.scale(y, 2.0)?;
    g.div(dy, two_y)?
});

/// `x * factor` for a constant factor (loss scaling, means, learning rates inside graphs).
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
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
}
