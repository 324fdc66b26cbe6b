//! The crate's one error type. Variants carry the facts (op, shapes, dtypes, axes); `Display`
//! prints what failed, the facts and one `hint:`.

use crate::DType;

/// Result alias used by every kernel.
pub type Result<T> = std::result::Result<T, TensorError>;

/// Everything a kernel can reject. `op` is the kernel's name (`"matmul"`, `"conv2d"`, ...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    #[error("{op}: expected dtype {expected} for {what}, got {got}\nhint: cast with Tensor::cast before calling {op}")]
    DTypeMismatch { op: &'static str, what: &'static str, expected: DType, got: DType },

    #[error("{op}: dtype {dtype} is not supported (expected {expected})\nhint: cast with Tensor::cast; f16/bf16 are storage types, compute in f32")]
    UnsupportedDType { op: &'static str, dtype: DType, expected: &'static str },

    #[error("{op}: shapes {lhs:?} and {rhs:?} are incompatible: {reason}\nhint: check the shapes of the op's inputs")]
    IncompatibleShapes { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize>, reason: &'static str },

    #[error("{op}: inner dimensions {k_lhs} and {k_rhs} differ (lhs {lhs:?}, rhs {rhs:?}, transpose_a={transpose_a}, transpose_b={transpose_b})\nhint: the contracted dimension of both operands must match; check the transpose flags")]
    InnerDimMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        k_lhs: usize,
        k_rhs: usize,
        transpose_a: bool,
        transpose_b: bool,
    },

    #[error("{op}: {what} has shape {shape:?}, expected {expected}\nhint: check the op's input shapes and attributes")]
    BadShape { op: &'static str, what: &'static str, shape: Vec<usize>, expected: String },

    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank}\nhint: axes lie in [-rank, rank)")]
    AxisOutOfRange { op: &'static str, axis: isize, rank: usize },

    #[error(
        "{op}: {what} value {index} at position {position} is out of range [0, {bound})\nhint: check the labels or indices fed to {op}"
    )]
    IndexOutOfRange { op: &'static str, what: &'static str, index: i64, position: usize, bound: usize },

    #[error("{op}: {len} elements cannot form shape {shape:?} ({expected} elements)\nhint: the product of the dimensions must equal the element count")]
    ElementCount { op: &'static str, shape: Vec<usize>, expected: usize, len: usize },

    #[error("{op}: argument {name} = {value} is invalid: expected {expected}\nhint: fix the op's attribute {name}")]
    InvalidArgument { op: &'static str, name: &'static str, value: String, expected: &'static str },
}
