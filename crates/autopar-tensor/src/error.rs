//! The crate's one error type. Variants carry the facts (op, shapes, dtypes, axes); `Display`
//! prints what failed, the facts and one `hint:`.

use crate::DType;

/// Result alias used by every kernel.
pub type Result<T> = std::result::Result<T, TensorError>;

/// Everything a kernel can reject. `op` is the kernel's name (`"matmul"`, `"conv2d"`, ...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    /// An input has another element type than the kernel needs (e.g. than its other inputs).
    #[error("{op}: expected dtype {expected} for {what}, got {got}\nhint: cast with Tensor::cast before calling {op}")]
    DTypeMismatch {
        /// The kernel's name.
        op: &'static str,
        /// Which input, in words.
        what: &'static str,
        /// The element type the kernel needs.
        expected: DType,
        /// The input's element type.
        got: DType,
    },

    /// The kernel does not compute in the input's element type.
    #[error("{op}: dtype {dtype} is not supported (expected {expected})\nhint: cast with Tensor::cast; f16/bf16 are storage types, compute in f32")]
    UnsupportedDType {
        /// The kernel's name.
        op: &'static str,
        /// The element type that was given.
        dtype: DType,
        /// The element types the kernel takes, in words.
        expected: &'static str,
    },

    /// Two inputs' shapes do not fit together (e.g. they do not broadcast).
    #[error("{op}: shapes {lhs:?} and {rhs:?} are incompatible: {reason}\nhint: check the shapes of the op's inputs")]
    IncompatibleShapes {
        /// The kernel's name.
        op: &'static str,
        /// The first shape.
        lhs: Vec<usize>,
        /// The second shape.
        rhs: Vec<usize>,
        /// Why they do not fit, in words.
        reason: &'static str,
    },

    /// The contracted dimensions of a matrix product's operands differ.
    #[error("{op}: inner dimensions {k_lhs} and {k_rhs} differ (lhs {lhs:?}, rhs {rhs:?}, transpose_a={transpose_a}, transpose_b={transpose_b})\nhint: the contracted dimension of both operands must match; check the transpose flags")]
    InnerDimMismatch {
        /// The kernel's name.
        op: &'static str,
        /// The left operand's shape.
        lhs: Vec<usize>,
        /// The right operand's shape.
        rhs: Vec<usize>,
        /// The left operand's contracted dimension.
        k_lhs: usize,
        /// The right operand's contracted dimension.
        k_rhs: usize,
        /// Whether the left operand is transposed.
        transpose_a: bool,
        /// Whether the right operand is transposed.
        transpose_b: bool,
    },

    /// An input has a shape the kernel does not accept.
    #[error("{op}: {what} has shape {shape:?}, expected {expected}\nhint: check the op's input shapes and attributes")]
    BadShape {
        /// The kernel's name.
        op: &'static str,
        /// Which input, in words.
        what: &'static str,
        /// The input's shape.
        shape: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },

    /// An axis is outside `[-rank, rank)`.
    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank}\nhint: axes lie in [-rank, rank)")]
    AxisOutOfRange {
        /// The kernel's name.
        op: &'static str,
        /// The axis that was given (negative counts from the end).
        axis: isize,
        /// The tensor's rank (number of dimensions).
        rank: usize,
    },

    /// An index (a label, a gather index, an argmax) is outside `[0, bound)`.
    #[error(
        "{op}: {what} value {index} at position {position} is out of range [0, {bound})\nhint: check the labels or indices fed to {op}"
    )]
    IndexOutOfRange {
        /// The kernel's name.
        op: &'static str,
        /// What the indices are (e.g. "index", "argmax").
        what: &'static str,
        /// The index value.
        index: i64,
        /// Its position in the index tensor (flat, counted from 0).
        position: usize,
        /// The exclusive upper bound.
        bound: usize,
    },

    /// An element count does not fit a shape (a reshape, building a tensor from a buffer, copying into one).
    #[error("{op}: {len} elements cannot form shape {shape:?} ({expected} elements)\nhint: the product of the dimensions must equal the element count")]
    ElementCount {
        /// The kernel's name.
        op: &'static str,
        /// The shape (in a reshape, an inferred `-1` dimension shows as 1).
        shape: Vec<usize>,
        /// The elements the shape holds (in a reshape with `-1`, the product of its known dimensions).
        expected: usize,
        /// The elements that were given.
        len: usize,
    },

    /// An argument or attribute of the kernel has an invalid value.
    #[error("{op}: argument {name} = {value} is invalid: expected {expected}\nhint: fix the op's attribute {name}")]
    InvalidArgument {
        /// The kernel's name.
        op: &'static str,
        /// The argument's name.
        name: &'static str,
        /// The value that was given, as text.
        value: String,
        /// What was expected, in words.
        expected: &'static str,
    },
}
