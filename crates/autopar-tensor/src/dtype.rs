//! Element types: the runtime [`DType`] tag, the [`Element`] trait every stored type implements
//! and the [`Float`] trait the differentiable kernels are generic over (f32 and f64).

use std::fmt;

use half::{bf16, f16};
use ndarray::{ArcArray, IxDyn, ScalarOperand};

use crate::backend::Backend;
use crate::tensor::{Storage, Tensor};

/// Runtime element type of a [`Tensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float (MindSpore's `float32`).
    F32,
    /// 64-bit IEEE float (`float64`).
    F64,
    /// 16-bit IEEE half float (`float16`), a storage type.
    F16,
    /// 16-bit brain float (`bfloat16`), a storage type.
    BF16,
    /// 32-bit signed integer (`int32`).
    I32,
    /// 64-bit signed integer (`int64`).
    I64,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 6] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64];

    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// True for f32, f64, f16 and bf16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Whether this is a half-precision float (f16, bf16).
    pub fn is_half(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// True for i32 and i64.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Lower-case name as used in files and messages (`f32`, `bf16`, `i64`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// Parses a name as printed by [`DType::name`] (also accepts `float32`, `int64`, ...).
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// A type a [`Tensor`] can store. Sealed: f32, f64, f16, bf16, i32, i64.
pub trait Element: sealed::Sealed + Copy + Send + Sync + fmt::Debug + PartialEq + Default + 'static {
    /// The runtime tag of this type.
    const DTYPE: DType;
    #[doc(hidden)]
    fn wrap(a: ArcArray<Self, IxDyn>) -> Tensor;
    #[doc(hidden)]
    fn unwrap(t: &Tensor) -> Option<&ArcArray<Self, IxDyn>>;
    #[doc(hidden)]
    fn unwrap_mut(t: &mut Tensor) -> Option<&mut ArcArray<Self, IxDyn>>;
    /// Lossless for every value except i64 beyond 2^53.
    fn to_f64(self) -> f64;
    /// Rounds to nearest for floats, truncates toward zero (saturating) for integers.
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn wrap(a: ArcArray<Self, IxDyn>) -> Tensor {
                Tensor { s: Storage::$variant(a) }
            }
            fn unwrap(t: &Tensor) -> Option<&ArcArray<Self, IxDyn>> {
                match &t.s {
                    Storage::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn unwrap_mut(t: &mut Tensor) -> Option<&mut ArcArray<Self, IxDyn>> {
                match &mut t.s {
                    Storage::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
        }
    };
}

element!(f32, F32, |x: f32| x as f64, |v: f64| v as f32);
element!(f64, F64, |x: f64| x, |v: f64| v);
element!(f16, F16, |x: f16| x.to_f64(), f16::from_f64);
element!(bf16, BF16, |x: bf16| x.to_f64(), bf16::from_f64);
element!(i32, I32, |x: i32| x as f64, |v: f64| v as i32);
element!(i64, I64, |x: i64| x as f64, |v: f64| v as i64);

/// The compute types of the differentiable kernels: f32 (training) and f64 (gradient checks).
pub trait Float:
    Element
    + num_traits::Float
    + ScalarOperand
    + fmt::Display
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
{
    /// Converts a constant.
    fn c(v: f64) -> Self {
        <Self as Element>::from_f64(v)
    }
    /// The error function.
    fn erf(self) -> Self;
    /// `e^self`, vectorisable in f32 (within 2 ulp, [`crate::fastmath`]); libm's in f64.
    fn vexp(self) -> Self;
    /// `tanh self`, vectorisable in f32 ([`crate::fastmath`]); libm's in f64.
    fn vtanh(self) -> Self;
    /// `c := beta*c + a*b` (or `c := a*b` when `accumulate` is false) through a backend.
    #[doc(hidden)]
    fn backend_gemm(
        backend: &dyn Backend,
        parallel: bool,
        a: ndarray::ArrayView2<'_, Self>,
        b: ndarray::ArrayView2<'_, Self>,
        c: ndarray::ArrayViewMut2<'_, Self>,
        accumulate: bool,
    );
    /// `a*b` as a new row-major array through a backend.
    #[doc(hidden)]
    fn backend_gemm_new(
        backend: &dyn Backend,
        parallel: bool,
        a: ndarray::ArrayView2<'_, Self>,
        b: ndarray::ArrayView2<'_, Self>,
    ) -> ndarray::Array2<Self>;
}

impl Float for f32 {
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline(always)]
    fn vexp(self) -> Self {
        crate::fastmath::exp_f32(self)
    }
    #[inline(always)]
    fn vtanh(self) -> Self {
        crate::fastmath::tanh_f32(self)
    }
    fn backend_gemm(
        backend: &dyn Backend,
        parallel: bool,
        a: ndarray::ArrayView2<'_, f32>,
        b: ndarray::ArrayView2<'_, f32>,
        c: ndarray::ArrayViewMut2<'_, f32>,
        accumulate: bool,
    ) {
        backend.gemm_f32(parallel, a, b, c, accumulate)
    }
    fn backend_gemm_new(
        backend: &dyn Backend,
        parallel: bool,
        a: ndarray::ArrayView2<'_, f32>,
        b: ndarray::ArrayView2<'_, f32>,
    ) -> ndarray::Array2<f32> {
        backend.gemm_new_f32(parallel, a, b)
    }
}

impl Float for f64 {
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn vexp(self) -> Self {
        self.exp()
    }
    fn vtanh(self) -> Self {
        self.tanh()
    }
    fn backend_gemm(
        backend: &dyn Backend,
        parallel: bool,
        a: ndarray::ArrayView2<'_, f64>,
        b: ndarray::ArrayView2<'_, f64>,
        c: ndarray::ArrayViewMut2<'_, f64>,
        accumulate: bool,
    ) {
        backend.gemm_f64(parallel, a, b, c, accumulate)
    }
    fn backend_gemm_new(
        backend: &dyn Backend,
        parallel: bool,
        a: ndarray::ArrayView2<'_, f64>,
        b: ndarray::ArrayView2<'_, f64>,
    ) -> ndarray::Array2<f64> {
        backend.gemm_new_f64(parallel, a, b)
    }
}

/// Integer types accepted as labels and indices.
pub trait Index: Element {
    /// The value as i64.
    fn as_i64(self) -> i64;
}
impl Index for i32 {
    fn as_i64(self) -> i64 {
        self as i64
    }
}
impl Index for i64 {
    fn as_i64(self) -> i64 {
        self
    }
}
