//! Element-wise kernels: binary arithmetic with NumPy broadcasting (and the reduce-to-shape its
//! backward needs), BiasAdd, and the unary activations with their derivatives.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::{float_dispatch, map, map2, map2_vec, map3, map_vec, same_dtype, same_shape};
use crate::kernels::reduce::sum_axes;
use crate::tensor::{broadcast_shapes, normalize_axis};
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// The four broadcasting arithmetic ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

fn broadcast_out(op: &'static str, a: &Tensor, b: &Tensor) -> Result<Vec<usize>> {
    broadcast_shapes(a.shape(), b.shape()).ok_or_else(|| TensorError::IncompatibleShapes {
        op,
        lhs: a.shape().to_vec(),
        rhs: b.shape().to_vec(),
        reason: "not broadcastable (sizes must be equal or 1, aligned from the right)",
    })
}

/// `a (op) b` with NumPy broadcasting. Floats (f32, f64; f16 and bf16 computed in f32 and
/// rounded once) and integers (i32, i64; division truncates toward zero and a zero divisor is an
/// error).
pub fn binary(ctx: &ExecCtx, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    same_dtype(name, "rhs", a, b)?;
    let shape = broadcast_out(name, a, b)?;
    match a.dtype() {
        half @ (crate::DType::F16 | crate::DType::BF16) => {
            Ok(binary(ctx, op, &a.cast(crate::DType::F32), &b.cast(crate::DType::F32))?.cast(half))
        }
        crate::DType::I32 => int_binary::<i32>(ctx, name, op, &shape, a, b),
        crate::DType::I64 => int_binary::<i64>(ctx, name, op, &shape, a, b),
        dt => float_dispatch!(name, dt, T => {
            let (x, y) = (a.typed::<T>(name, "lhs")?, b.typed::<T>(name, "rhs")?);
            let out = match op {
                BinaryOp::Add => map2(ctx, &shape, &x, &y, |p, q| p + q),
                BinaryOp::Sub => map2(ctx, &shape, &x, &y, |p, q| p - q),
                BinaryOp::Mul => map2(ctx, &shape, &x, &y, |p, q| p * q),
                BinaryOp::Div => map2(ctx, &shape, &x, &y, |p, q| p / q),
            };
            Ok(Tensor::from_array(out))
        }),
    }
}

fn int_binary<T>(_ctx: &ExecCtx, name: &'static str, op: BinaryOp, shape: &[usize], a: &Tensor, b: &Tensor) -> Result<Tensor>
where
    T: crate::Element + num_traits::PrimInt + num_traits::WrappingAdd + num_traits::WrappingSub + num_traits::WrappingMul,
{
    let x = a.typed::<T>(name, "lhs")?;
    let y = b.typed::<T>(name, "rhs")?;
    let (xb, yb) = (x.broadcast(IxDyn(shape)).expect("checked"), y.broadcast(IxDyn(shape)).expect("checked"));
    if op == BinaryOp::Div {
        if let Some(pos) = yb.iter().position(|v| v.is_zero()) {
            return Err(TensorError::InvalidArgument {
                op: name,
                name: "rhs",
                value: format!("0 at flat position {pos}"),
                expected: "non-zero integer divisors",
            });
        }
    }
    let mut out = ArrayD::<T>::zeros(IxDyn(shape));
    ndarray::Zip::from(&mut out).and(&xb).and(&yb).for_each(|o, &p, &q| {
        *o = match op {
            BinaryOp::Add => p.wrapping_add(&q),
            BinaryOp::Sub => p.wrapping_sub(&q),
            BinaryOp::Mul => p.wrapping_mul(&q),
            BinaryOp::Div => p / q,
        }
    });
    Ok(Tensor::from_array(out))
}

/// `a + b` with broadcasting.
pub fn add(ctx: &ExecCtx, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(ctx, BinaryOp::Add, a, b)
}
/// `a - b` with broadcasting.
pub fn sub(ctx: &ExecCtx, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(ctx, BinaryOp::Sub, a, b)
}
/// `a * b` with broadcasting.
pub fn mul(ctx: &ExecCtx, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(ctx, BinaryOp::Mul, a, b)
}
/// `a / b` with broadcasting.
pub fn div(ctx: &ExecCtx, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary(ctx, BinaryOp::Div, a, b)
}

/// Gradients of `a (op) b` w.r.t. `a` and `b`, each already reduced to its input's shape
/// (the sum over broadcast dimensions). `dy` has the broadcast output shape.
pub fn binary_grads(ctx: &ExecCtx, op: BinaryOp, a: &Tensor, b: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let name = op.name();
    same_dtype(name, "rhs", a, b)?;
    same_dtype(name, "output gradient", a, dy)?;
    let shape = broadcast_out(name, a, b)?;
    same_shape(name, &shape, dy.shape(), "output gradient must have the broadcast output shape")?;
    // Add (and Sub's lhs): the gradient is dy itself where no broadcasting happened; share it.
    let pass = |shape: &[usize]| -> Result<Tensor> {
        if shape == dy.shape() {
            Ok(dy.clone())
        } else {
            reduce_to_shape(ctx, dy, shape)
        }
    };
    if op == BinaryOp::Add {
        return Ok((pass(a.shape())?, pass(b.shape())?));
    }
    if op == BinaryOp::Sub {
        let gb = reduce_to_shape(ctx, dy, b.shape())?;
        return Ok((pass(a.shape())?, neg_backward(ctx, &gb)?));
    }
    float_dispatch!(name, a.dtype(), T => {
        let (x, y, g) = (a.typed::<T>(name, "lhs")?, b.typed::<T>(name, "rhs")?, dy.typed::<T>(name, "output gradient")?);
        // Mul or Div (Add and Sub returned above).
        let (ga, gb): (ArrayD<T>, ArrayD<T>) = if op == BinaryOp::Mul {
            (map2(ctx, &shape, &g, &y, |d, q| d * q), map2(ctx, &shape, &g, &x, |d, p| d * p))
        } else {
            (map2(ctx, &shape, &g, &y, |d, q| d / q), map3(ctx, &shape, &g, &x, &y, |d, p, q| -d * p / (q * q)))
        };
        Ok((
            Tensor::from_array(reduce_to_shape_impl(ctx, ga.view(), a.shape())),
            Tensor::from_array(reduce_to_shape_impl(ctx, gb.view(), b.shape())),
        ))
    })
}

/// Sums `grad` over the dimensions that broadcasting expanded, giving a tensor of `shape`
/// (the backward of broadcasting from `shape` to `grad.shape()`).
pub fn reduce_to_shape(ctx: &ExecCtx, grad: &Tensor, shape: &[usize]) -> Result<Tensor> {
    match broadcast_shapes(grad.shape(), shape) {
        Some(s) if s == grad.shape() => {}
        _ => {
            return Err(TensorError::IncompatibleShapes {
                op: "reduce_to_shape",
                lhs: grad.shape().to_vec(),
                rhs: shape.to_vec(),
                reason: "the target shape does not broadcast to the gradient's shape",
            })
        }
    }
    float_dispatch!("reduce_to_shape", grad.dtype(), T => {
        Ok(Tensor::from_array(reduce_to_shape_impl(ctx, grad.typed::<T>("reduce_to_shape", "gradient")?, shape)))
    })
}

pub(crate) fn reduce_to_shape_impl<T: Float>(ctx: &ExecCtx, g: ArrayViewD<'_, T>, shape: &[usize]) -> ArrayD<T> {
    if g.shape() == shape {
        return g.to_owned();
    }
    let lead = g.ndim() - shape.len();
    let axes: Vec<usize> = (0..g.ndim()).filter(|&i| i < lead || (shape[i - lead] == 1 && g.shape()[i] != 1)).collect();
    let summed = sum_axes(ctx, g, &axes);
    summed.into_shape_with_order(IxDyn(shape)).expect("same element count")
}

fn bias_view<'a, T: Float>(op: &'static str, x: &Tensor, bias: &'a Tensor, axis: isize) -> Result<(usize, ArrayViewD<'a, T>)> {
    let ax = normalize_axis(op, axis, x.rank())?;
    let b = bias.typed::<T>(op, "bias")?;
    if b.ndim() != 1 || b.len() != x.shape()[ax] {
        return Err(TensorError::BadShape {
            op,
            what: "bias",
            shape: b.shape().to_vec(),
            expected: format!("[{}] (dimension {ax} of input {:?})", x.shape()[ax], x.shape()),
        });
    }
    let mut bshape = vec![1; x.rank()];
    bshape[ax] = b.len();
    Ok((ax, b.into_shape_with_order(IxDyn(&bshape)).expect("1-D to broadcastable")))
}

/// BiasAdd: adds the 1-D `bias` along `axis` (1 for MindSpore's NCHW and for `[N, C]`, -1 for NHWC).
pub fn bias_add(ctx: &ExecCtx, x: &Tensor, bias: &Tensor, axis: isize) -> Result<Tensor> {
    same_dtype("bias_add", "bias", x, bias)?;
    float_dispatch!("bias_add", x.dtype(), T => {
        let (_, b) = bias_view::<T>("bias_add", x, bias, axis)?;
        let xv = x.typed::<T>("bias_add", "input")?;
        Ok(Tensor::from_array(map2(ctx, x.shape(), &xv, &b, |p, q| p + q)))
    })
}

/// Gradient of BiasAdd w.r.t. the bias: `dy` summed over every axis except `axis`.
/// (The gradient w.r.t. the input is `dy` itself.)
pub fn bias_add_grad(ctx: &ExecCtx, dy: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = normalize_axis("bias_add_grad", axis, dy.rank())?;
    float_dispatch!("bias_add_grad", dy.dtype(), T => {
        let g = dy.typed::<T>("bias_add_grad", "output gradient")?;
        let axes: Vec<usize> = (0..g.ndim()).filter(|&i| i != ax).collect();
        Ok(Tensor::from_array(sum_axes(ctx, g, &axes)))
    })
}

/// Multiplies by a constant.
pub fn scale(ctx: &ExecCtx, x: &Tensor, s: f64) -> Result<Tensor> {
    float_dispatch!("scale", x.dtype(), T => {
        let c = T::c(s);
        Ok(Tensor::from_array(map(ctx, &x.typed::<T>("scale", "input")?, move |v| v * c)))
    })
}

/// Adds a constant.
pub fn add_scalar(ctx: &ExecCtx, x: &Tensor, s: f64) -> Result<Tensor> {
    float_dispatch!("add_scalar", x.dtype(), T => {
        let c = T::c(s);
        Ok(Tensor::from_array(map(ctx, &x.typed::<T>("add_scalar", "input")?, move |v| v + c)))
    })
}

/// The unary activations and math functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `max(x, 0)`.
    Relu,
    /// GELU; `approximate` selects the tanh form (MindSpore's default) over the exact erf form.
    Gelu {
        /// Whether to use the tanh approximation.
        approximate: bool,
    },
    /// SiLU (swish): `x * sigmoid(x)`.
    Silu,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `-x`.
    Neg,
}

impl UnaryOp {
    /// Kernel name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu { .. } => "gelu",
            UnaryOp::Silu => "silu",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Neg => "neg",
        }
    }

    /// Which tensor [`unary_backward`] needs besides `dy`: the forward input or its output.
    pub fn backward_uses(self) -> Saved {
        match self {
            UnaryOp::Relu | UnaryOp::Gelu { .. } | UnaryOp::Silu | UnaryOp::Log => Saved::Input,
            UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Exp | UnaryOp::Sqrt => Saved::Output,
            UnaryOp::Neg => Saved::Nothing,
        }
    }
}

/// What a unary backward reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// The forward input.
    Input,
    /// The forward output.
    Output,
    /// Only `dy`.
    Nothing,
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

/// GeLU's tanh form, written out so that its loop compiles to vector code.
#[inline(always)]
fn gelu_tanh<T: Float>(x: T) -> T {
    let (s, c, half) = (T::c(SQRT_2_OVER_PI), T::c(GELU_C), T::c(0.5));
    half * x * (T::one() + (s * (x + c * x * x * x)).vtanh())
}

/// `dy * gelu_tanh'(x)`.
#[inline(always)]
fn gelu_tanh_grad<T: Float>(v: T, d: T) -> T {
    let (s, c, half) = (T::c(SQRT_2_OVER_PI), T::c(GELU_C), T::c(0.5));
    let t = (s * (v + c * v * v * v)).vtanh();
    d * (half * (T::one() + t) + half * v * (T::one() - t * t) * s * (T::one() + T::c(3.0) * c * v * v))
}

/// The transcendental unary functions and their gradients as [`crate::simd`] element functions
/// (the rest of the ops only move memory, where the vector width does not matter).
mod vector_fns {
    use super::{gelu_tanh, gelu_tanh_grad};
    use crate::simd::{BinaryFn, UnaryFn};
    use crate::Float;

    macro_rules! element_fns {
        ($($name:ident: $kind:ident |$($arg:ident),*| $body:expr;)*) => {$(
            #[derive(Clone, Copy)]
            pub(super) struct $name;
            impl<T: Float> $kind<T> for $name {
                #[inline(always)]
                fn apply(self, $($arg: T),*) -> T {
                    $body
                }
            }
        )*};
    }

    element_fns! {
        GeluTanh: UnaryFn |x| gelu_tanh(x);
        GeluTanhGrad: BinaryFn |v, d| gelu_tanh_grad(v, d);
        Tanh: UnaryFn |x| x.vtanh();
        Sigmoid: UnaryFn |x| T::one() / (T::one() + (-x).vexp());
        Exp: UnaryFn |x| x.vexp();
        Silu: UnaryFn |x| x / (T::one() + (-x).vexp());
        SiluGrad: BinaryFn |v, d| {
            let s = T::one() / (T::one() + (-v).vexp());
            d * s * (T::one() + v * (T::one() - s))
        };
    }
}

fn unary_f<T: Float>(op: UnaryOp) -> impl Fn(T) -> T + Sync + Send {
    let half = T::c(0.5);
    let inv_sqrt2 = T::c(std::f64::consts::FRAC_1_SQRT_2);
    move |x: T| match op {
        UnaryOp::Relu => {
            if x > T::zero() {
                x
            } else {
                T::zero()
            }
        }
        UnaryOp::Gelu { approximate: true } => gelu_tanh(x),
        UnaryOp::Gelu { approximate: false } => half * x * (T::one() + (x * inv_sqrt2).erf()),
        UnaryOp::Silu => x / (T::one() + (-x).vexp()),
        UnaryOp::Tanh => x.vtanh(),
        UnaryOp::Sigmoid => T::one() / (T::one() + (-x).vexp()),
        UnaryOp::Exp => x.vexp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Neg => -x,
    }
}

/// `dy * f'(.)` given the saved value `v` (input or output per [`UnaryOp::backward_uses`]).
fn unary_df<T: Float>(op: UnaryOp) -> impl Fn(T, T) -> T + Sync + Send {
    let half = T::c(0.5);
    let inv_sqrt2 = T::c(std::f64::consts::FRAC_1_SQRT_2);
    let inv_sqrt_2pi = T::c(0.398_942_280_401_432_7);
    move |v: T, d: T| match op {
        UnaryOp::Relu => {
            if v > T::zero() {
                d
            } else {
                T::zero()
            }
        }
        UnaryOp::Gelu { approximate: true } => gelu_tanh_grad(v, d),
        UnaryOp::Gelu { approximate: false } => d * (half * (T::one() + (v * inv_sqrt2).erf()) + v * (-half * v * v).exp() * inv_sqrt_2pi),
        UnaryOp::Silu => {
            // d/dx x s(x) = s (1 + x (1 - s)).
            let s = T::one() / (T::one() + (-v).vexp());
            d * s * (T::one() + v * (T::one() - s))
        }
        UnaryOp::Tanh => d * (T::one() - v * v),
        UnaryOp::Sigmoid => d * v * (T::one() - v),
        UnaryOp::Exp => d * v,
        UnaryOp::Log => d / v,
        UnaryOp::Sqrt => d / (T::c(2.0) * v),
        UnaryOp::Neg => -d,
    }
}

/// Monomorphises `$f(op)` per op so that the element loop holds no branch on the op.
macro_rules! per_op {
    ($op:expr, $f:ident, $run:expr) => {
        match $op {
            UnaryOp::Relu => $run($f::<T>(UnaryOp::Relu)),
            UnaryOp::Gelu { approximate: true } => $run($f::<T>(UnaryOp::Gelu { approximate: true })),
            UnaryOp::Gelu { approximate: false } => $run($f::<T>(UnaryOp::Gelu { approximate: false })),
            UnaryOp::Silu => $run($f::<T>(UnaryOp::Silu)),
            UnaryOp::Tanh => $run($f::<T>(UnaryOp::Tanh)),
            UnaryOp::Sigmoid => $run($f::<T>(UnaryOp::Sigmoid)),
            UnaryOp::Exp => $run($f::<T>(UnaryOp::Exp)),
            UnaryOp::Log => $run($f::<T>(UnaryOp::Log)),
            UnaryOp::Sqrt => $run($f::<T>(UnaryOp::Sqrt)),
            UnaryOp::Neg => $run($f::<T>(UnaryOp::Neg)),
        }
    };
}

/// Applies a unary op.
pub fn unary(ctx: &ExecCtx, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    float_dispatch!(op.name(), x.dtype(), T => {
        let xv = x.typed::<T>(op.name(), "input")?;
        let out = match op {
            UnaryOp::Relu => map(ctx, &xv, |v| if v > 0.0 { v } else { 0.0 }),
            UnaryOp::Neg => map(ctx, &xv, |v| -v),
            UnaryOp::Gelu { approximate: true } => map_vec(ctx, &xv, vector_fns::GeluTanh),
            UnaryOp::Tanh => map_vec(ctx, &xv, vector_fns::Tanh),
            UnaryOp::Sigmoid => map_vec(ctx, &xv, vector_fns::Sigmoid),
            UnaryOp::Exp => map_vec(ctx, &xv, vector_fns::Exp),
            UnaryOp::Silu => map_vec(ctx, &xv, vector_fns::Silu),
            _ => per_op!(op, unary_f, |f| map(ctx, &xv, f)),
        };
        Ok(Tensor::from_array(out))
    })
}

/// Gradient of a unary op. `saved` is the forward input or output as [`UnaryOp::backward_uses`]
/// says (ignored for Neg; pass `dy`).
pub fn unary_backward(ctx: &ExecCtx, op: UnaryOp, saved: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let name = op.name();
    same_dtype(name, "output gradient", saved, dy)?;
    same_shape(name, saved.shape(), dy.shape(), "saved tensor and output gradient must have the same shape")?;
    float_dispatch!(name, dy.dtype(), T => {
        let (v, d) = (saved.typed::<T>(name, "saved tensor")?, dy.typed::<T>(name, "output gradient")?);
        let out = match op {
            UnaryOp::Relu => map2(ctx, dy.shape(), &v, &d, |s, g| if s > 0.0 { g } else { 0.0 }),
            UnaryOp::Gelu { approximate: true } => map2_vec(ctx, dy.shape(), &v, &d, vector_fns::GeluTanhGrad),
            UnaryOp::Silu => map2_vec(ctx, dy.shape(), &v, &d, vector_fns::SiluGrad),
            _ => per_op!(op, unary_df, |f| map2(ctx, dy.shape(), &v, &d, f)),
        };
        Ok(Tensor::from_array(out))
    })
}

macro_rules! unary_fns {
    ($($fwd:ident, $bwd:ident, $op:expr, $saved:literal;)*) => {$(
        #[doc = concat!("Forward of ", stringify!($fwd), ".")]
        pub fn $fwd(ctx: &ExecCtx, x: &Tensor) -> Result<Tensor> {
            unary(ctx, $op, x)
        }
        #[doc = concat!("Backward of ", stringify!($fwd), ": takes the forward ", $saved, " and `dy`.")]
        pub fn $bwd(ctx: &ExecCtx, saved: &Tensor, dy: &Tensor) -> Result<Tensor> {
            unary_backward(ctx, $op, saved, dy)
        }
    )*};
}

unary_fns! {
    relu, relu_backward, UnaryOp::Relu, "input";
    silu, silu_backward, UnaryOp::Silu, "input";
    tanh, tanh_backward, UnaryOp::Tanh, "output";
    sigmoid, sigmoid_backward, UnaryOp::Sigmoid, "output";
    exp, exp_backward, UnaryOp::Exp, "output";
    log, log_backward, UnaryOp::Log, "input";
    sqrt, sqrt_backward, UnaryOp::Sqrt, "output";
}

/// Negation (floats and integers).
pub fn neg(ctx: &ExecCtx, x: &Tensor) -> Result<Tensor> {
    match x.dtype() {
        crate::DType::I32 => Ok(Tensor::from_array(x.typed::<i32>("neg", "input")?.map(|v| v.wrapping_neg()))),
        crate::DType::I64 => Ok(Tensor::from_array(x.typed::<i64>("neg", "input")?.map(|v| v.wrapping_neg()))),
        _ => unary(ctx, UnaryOp::Neg, x),
    }
}

/// Backward of neg: `-dy`.
pub fn neg_backward(ctx: &ExecCtx, dy: &Tensor) -> Result<Tensor> {
    unary(ctx, UnaryOp::Neg, dy)
}

/// GELU forward (`approximate`: tanh form, MindSpore's default).
pub fn gelu(ctx: &ExecCtx, x: &Tensor, approximate: bool) -> Result<Tensor> {
    unary(ctx, UnaryOp::Gelu { approximate }, x)
}

/// GELU backward: takes the forward input and `dy`.
pub fn gelu_backward(ctx: &ExecCtx, x: &Tensor, dy: &Tensor, approximate: bool) -> Result<Tensor> {
    unary_backward(ctx, UnaryOp::Gelu { approximate }, x, dy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape, v.to_vec()).unwrap()
    }
    fn v(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }
    fn cx() -> ExecCtx {
        ExecCtx::serial()
    }

    #[test]
    fn add_broadcasts_a_row_over_a_matrix() {
        let y = add(&cx(), &t(&[2, 3], &[1., 2., 3., 4., 5., 6.]), &t(&[3], &[10., 20., 30.])).unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(v(&y), vec![11., 22., 33., 14., 25., 36.]);
    }

    #[test]
    fn a_block_repeated_along_leading_axes_broadcasts_on_either_side() {
        // Shapes whose rows straddle the parallel chunks (16384 elements), and blocks of one or
        // more trailing axes, given with and without leading 1s.
        let cases: [(&[usize], &[usize]); 5] =
            [(&[70, 300], &[300]), (&[70, 300], &[1, 300]), (&[3, 7, 5], &[7, 5]), (&[9, 41, 60], &[1, 1, 60]), (&[4, 6], &[4, 6])];
        for (big, small) in cases {
            let n: usize = big.iter().product();
            let m: usize = small.iter().product();
            let a = t(big, &(0..n).map(|i| (i % 97) as f32 + 1.0).collect::<Vec<_>>());
            let b = t(small, &(0..m).map(|i| (i % 13) as f32 + 2.0).collect::<Vec<_>>());
            let av = v(&a);
            let bv = v(&b);
            let want_ab: Vec<f32> = (0..n).map(|i| av[i] - bv[i % m]).collect();
            let want_ba: Vec<f32> = (0..n).map(|i| bv[i % m] / av[i]).collect();
            for ctx in [cx(), ExecCtx::parallel().with_min_parallel_len(0)] {
                assert_eq!(v(&sub(&ctx, &a, &b).unwrap()), want_ab, "{big:?} - {small:?}");
                assert_eq!(v(&div(&ctx, &b, &a).unwrap()), want_ba, "{small:?} / {big:?}");
            }
        }
    }

    #[test]
    fn mul_of_a_column_and_a_row_is_the_outer_product() {
        let y = mul(&cx(), &t(&[2, 1], &[2., 3.]), &t(&[1, 3], &[1., 10., 100.])).unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(v(&y), vec![2., 20., 200., 3., 30., 300.]);
    }

    #[test]
    fn sub_and_div_with_a_scalar_operand() {
        let x = t(&[3], &[2., 4., 8.]);
        let s = Tensor::scalar(2.0f32);
        assert_eq!(v(&sub(&cx(), &x, &s).unwrap()), vec![0., 2., 6.]);
        assert_eq!(v(&div(&cx(), &s, &x).unwrap()), vec![1., 0.5, 0.25]);
    }

    #[test]
    fn integer_arithmetic_truncates_and_rejects_division_by_zero() {
        let a = Tensor::from_vec(&[3], vec![7i64, -7, 9]).unwrap();
        let b = Tensor::from_vec(&[3], vec![2i64, 2, 3]).unwrap();
        assert_eq!(div(&cx(), &a, &b).unwrap().to_vec::<i64>().unwrap(), vec![3, -3, 3]);
        assert_eq!(add(&cx(), &a, &b).unwrap().to_vec::<i64>().unwrap(), vec![9, -5, 12]);
        let z = Tensor::from_vec(&[3], vec![1i64, 0, 1]).unwrap();
        assert!(matches!(div(&cx(), &a, &z), Err(TensorError::InvalidArgument { name: "rhs", .. })));
    }

    #[test]
    fn incompatible_broadcast_names_both_shapes() {
        let e = add(&cx(), &t(&[2, 3], &[0.; 6]), &t(&[2], &[0.; 2])).unwrap_err();
        assert_eq!(
            e,
            TensorError::IncompatibleShapes {
                op: "add",
                lhs: vec![2, 3],
                rhs: vec![2],
                reason: "not broadcastable (sizes must be equal or 1, aligned from the right)"
            }
        );
        assert!(e.to_string().contains("[2, 3]") && e.to_string().contains("hint:"));
    }

    #[test]
    fn mixed_dtypes_and_storage_only_dtypes_are_rejected() {
        let a = t(&[2], &[1., 2.]);
        let b = a.cast(DType::F64);
        assert!(matches!(add(&cx(), &a, &b), Err(TensorError::DTypeMismatch { expected: DType::F32, got: DType::F64, .. })));
        let h = a.cast(DType::BF16);
        assert!(matches!(relu(&cx(), &h), Err(TensorError::UnsupportedDType { dtype: DType::BF16, .. })));
    }

    #[test]
    fn reduce_to_shape_sums_broadcast_dimensions() {
        let g = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(v(&reduce_to_shape(&cx(), &g, &[3]).unwrap()), vec![5., 7., 9.]);
        let r = reduce_to_shape(&cx(), &g, &[2, 1]).unwrap();
        assert_eq!((r.shape(), v(&r)), (&[2usize, 1][..], vec![6., 15.]));
        assert_eq!(v(&reduce_to_shape(&cx(), &g, &[]).unwrap()), vec![21.]);
        assert!(reduce_to_shape(&cx(), &g, &[2]).is_err());
    }

    #[test]
    fn bias_add_adds_along_the_channel_axis_and_its_gradient_sums_the_rest() {
        let x = t(&[2, 2, 1, 2], &[0.; 8]);
        let y = bias_add(&cx(), &x, &t(&[2], &[1., 2.]), 1).unwrap();
        assert_eq!(v(&y), vec![1., 1., 2., 2., 1., 1., 2., 2.]);
        assert_eq!(v(&bias_add_grad(&cx(), &y, 1).unwrap()), vec![4., 8.]);
        let e = bias_add(&cx(), &x, &t(&[3], &[0.; 3]), 1).unwrap_err();
        assert!(matches!(e, TensorError::BadShape { what: "bias", .. }));
    }

    #[test]
    fn activations_match_known_values() {
        let x = t(&[3], &[-1., 0., 1.]);
        let close = |a: Vec<f32>, b: &[f32]| a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-5);
        assert_eq!(v(&relu(&cx(), &x).unwrap()), vec![0., 0., 1.]);
        assert!(close(v(&gelu(&cx(), &x, true).unwrap()), &[-0.158_808, 0., 0.841_192]));
        assert!(close(v(&gelu(&cx(), &x, false).unwrap()), &[-0.158_655, 0., 0.841_345]));
        assert!(close(v(&tanh(&cx(), &x).unwrap()), &[-0.761_594, 0., 0.761_594]));
        assert!(close(v(&sigmoid(&cx(), &x).unwrap()), &[0.268_941, 0.5, 0.731_059]));
        assert!(close(v(&exp(&cx(), &x).unwrap()), &[0.367_879, 1., std::f32::consts::E]));
        assert!(close(v(&log(&cx(), &t(&[2], &[1., std::f32::consts::E])).unwrap()), &[0., 1.]));
        assert!(close(v(&sqrt(&cx(), &t(&[2], &[4., 9.])).unwrap()), &[2., 3.]));
        assert_eq!(v(&neg(&cx(), &x).unwrap()), vec![1., 0., -1.]);
    }

    #[test]
    fn activation_derivatives_match_known_values() {
        let x = t(&[3], &[-1., 0.5, 2.]);
        let ones = t(&[3], &[1., 1., 1.]);
        assert_eq!(v(&relu_backward(&cx(), &x, &ones).unwrap()), vec![0., 1., 1.]);
        let y = sigmoid(&cx(), &x).unwrap();
        let d = v(&sigmoid_backward(&cx(), &y, &ones).unwrap());
        let s = |z: f32| 1. / (1. + (-z).exp());
        assert!((d[1] - s(0.5) * (1. - s(0.5))).abs() < 1e-6);
        assert_eq!(v(&neg_backward(&cx(), &ones).unwrap()), vec![-1., -1., -1.]);
    }
}
